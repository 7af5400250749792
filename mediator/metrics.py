"""The mediator's Prometheus metrics (docs/operations.md, Monitor).

One :class:`Metrics` object per mediator, each with its own registry: two mediators in one
process (the tests) never share a counter, and the HTTP endpoint serves exactly one mediator's.
The stages update the metric objects directly (``metrics.events_in.labels(source).inc()``):
Publish counts events in and dead letters, the pipeline notifications in, post-filter drops,
composites out, the composer's batch latency and the state size, delivery the lag.
"""

from __future__ import annotations

import contextlib
import hmac
import threading
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler, start_http_server

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)
"""Seconds: the in-process composer's batches take about a millisecond, the Spark composer's
up to seconds (docs/performance.md)."""


STATE_PARTS = ("held", "visible", "known", "readings", "checks", "partitions", "engines",
               "origins")
"""The ``part`` label of ``evamed_state_size`` (docs/operations.md, Monitor): the fields of
transforms.runner.RunnerStats summed over the runners, and the pipeline's index of origins."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_in = Counter(
            "evamed_events_in", "Events accepted into the event log (durably), by where they "
            "came in: publish, or a configured source's name (never a label from the events: "
            "a bounded set).", ["source"], registry=r)
        self.dead_letters = Counter(
            "evamed_dead_letters", "Inputs refused (each kept in the dead-letter log), by where "
            "they came in (publish, a configured source, mediator: the event log's reader, a "
            "service: its reports) and reason (eva.admission.Reason: malformed, too_large, "
            "duplicate, late, future, misrouted; a source's mapping: payload, time, id, topic, "
            "attribute, deleted).", ["source", "reason"], registry=r)
        self.sink_position = Gauge(
            "evamed_sink_position", "Per sink and subscription: the notification-log position "
            "the sink's broker has acknowledged (everything up to it is published).",
            ["sink", "owner", "subscription"], registry=r)
        self.notifications_in = Counter(
            "evamed_notifications_in", "Native notifications (detections) received from the "
            "services, by service.", ["service"], registry=r)
        self.post_filter_drops = Counter(
            "evamed_post_filter_drops", "Answers of a relaxed query (a positive rule's target) "
            "the mediator's post-filter dropped: the re-run of the original put their events "
            "in no composite of their own. By service.", ["service"], registry=r)
        self.composites_out = Counter(
            "evamed_composites_out", "Composites appended to the subscriptions' notification "
            "logs (each once: a composite reported again is skipped by its id).", registry=r)
        self.delivered = Counter(
            "evamed_notifications_delivered", "Notifications sent to subscribers (a resumed "
            "stream sends again what its client had not confirmed).", registry=r)
        self.lag = Gauge(
            "evamed_subscription_lag", "Per subscription: its log's head minus the newest "
            "position delivered to a subscriber (notifications waiting).",
            ["owner", "subscription"], registry=r)
        self.composer_latency = Histogram(
            "evamed_composer_batch_seconds", "Time the composer took for one batch of events "
            "(every subscription's federation, the services' answers included).",
            buckets=LATENCY_BUCKETS, registry=r)
        self.state_size = Gauge(
            "evamed_state_size", "The in-process evaluation state over all subscriptions, by "
            "part (STATE_PARTS), as the pipeline measured it after its last batch.", ["part"],
            registry=r)
        self.sinks: set[str] = set()
        """The configured sinks' names (their position series go with a subscription)."""
        for part in STATE_PARTS:  # scraped as 0 before the first batch
            self.state_size.labels(part)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def render(self) -> bytes:
        """The metrics in Prometheus' text format (what the endpoint serves)."""
        return generate_latest(self.registry)

    def forget(self, owner: str, subscription: str) -> None:
        """A subscription went away: its series go with it."""
        with contextlib.suppress(KeyError):
            self.lag.remove(owner, subscription)
        for sink in self.sinks:
            with contextlib.suppress(KeyError):
                self.sink_position.remove(sink, owner, subscription)

    def serve(self, port: int, host: str = "127.0.0.1", token: str = "") -> int:
        """Serve ``/metrics`` over HTTP (``port`` 0: any free port); returns the port.
        ``token``: every request must carry ``Authorization: Bearer <token>`` (401 without:
        the series name clients and subscriptions)."""
        if not token:
            server, thread = start_http_server(port, host, registry=self.registry)
        else:
            app = _guarded(make_wsgi_app(self.registry), token)
            server = make_server(host, port, app, ThreadingWSGIServer,
                                 handler_class=_SilentHandler)
            thread = threading.Thread(target=server.serve_forever, name="evamed-metrics",
                                      daemon=True)
            thread.start()
        self._server, self._thread = server, thread
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _guarded(app: Any, token: str) -> Any:
    """``app`` behind a bearer token (compared in constant time)."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                                ("WWW-Authenticate", "Bearer")])
            return [b"the metrics need 'Authorization: Bearer <metrics_token>'\n"]
        return app(environ, start_response)
    return guarded


__all__ = ["LATENCY_BUCKETS", "STATE_PARTS", "Metrics"]
