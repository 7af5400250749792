"""Transformation mediator (EVA §5.2–5.3): plan an EVA profile for a service that speaks less.

``capability`` describes what a service supports, ``rules`` holds one function per
transformation rule, ``planner`` builds a plan, ``evaluate`` runs a plan (services simulated by
the EVA evaluator restricted to their capability) and ``explain`` shows it.
"""
