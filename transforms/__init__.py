"""Transformation mediator (EVA §5.2–5.3): plan an EVA profile for a service that speaks less.

    p = transforms.plan(profile, doc, capability)    # rules chosen bottom-up (planner)
    p = transforms.plan_federated(profile, doc, services)  # over many services, by coverage
    transforms.explain(p)                            # the plan as a tree (rich), for people
    runner = transforms.Runner(...)                  # a plan's mediator-side part, incremental

``capability`` describes what a service supports, ``rules`` holds one function per
transformation rule, ``planner`` builds a plan of the nodes in ``plans`` (``federated``: over
the services that cover each subtree), ``dialects`` renders
it in each group's language and reads notifications back, ``runner`` runs it incrementally on
the engine, ``evaluate`` runs it over a finite trace (the test oracle) and ``explanation`` shows
it. The names load on first use.
"""

from __future__ import annotations

from eva.lazy import exports

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "plan": ("transforms.planner", "plan"),
    "plan_federated": ("transforms.federated", "plan_federated"),
    "explain": ("transforms.explanation", "explain"),
    "Runner": ("transforms.runner", "Runner"),
    "Capability": ("transforms.capability", "Capability"),
}


__getattr__ = exports("transforms", _EXPORTS, globals())


__all__ = ["Capability", "Runner", "explain", "plan", "plan_federated"]
