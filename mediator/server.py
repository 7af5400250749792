"""The mediator as a process: ``evamed serve`` (docs/operations.md, Run).

:func:`start` opens the store, connects the configured services and builds the brokers' sources
(links, all of them), starts the pipeline (which restores every stored subscription), then the
sources (their events go through Publish's accept path) and sinks, and serves
``eva.mediator.v1.MediatorService``, the standard ``grpc.health.v1.Health`` and server
reflection on one ``grpc.aio`` server — with TLS (and client certificates) when configured —
and the Prometheus metrics on their own HTTP port when one is configured.

Every call but health and reflection needs ``authorization: Bearer <token>``
(:class:`Authenticator`): refused with UNAUTHENTICATED otherwise, the client's name is put in
:data:`mediator.service.CLIENT` for the handler. The token is never logged. A request whose
bytes do not decode is INVALID_ARGUMENT, logged once per client a minute
(:mod:`adapters.undecodable`).

Shutdown (SIGTERM, SIGINT, SIGHUP, :meth:`Served.stop`): health goes NOT_SERVING (watchers are told at
once), the Subscribe streams end with UNAVAILABLE (clients resume elsewhere or later with their
tokens), the sources stop taking events in (what they took is in the event log, the rest waits
at their brokers), the server stops taking calls and gives those in flight ``drain`` to finish, the
pipeline evaluates what was accepted within what is left of the same bound and stops — a batch
still waiting on a service then (one out of reach) is cut short by closing the links, and the
event log keeps it for the next start (:meth:`mediator.pipeline.Pipeline.stop`); the links are
closed, then the sinks, the store last. All of it within about ``drain`` + 4 s whatever the services do. A
second signal exits at once (status 128 + the signal's number): what was accepted is in the
event log already, the next start evaluates it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from adapters.backends.service import MAX_MESSAGE_BYTES
from adapters.backends.service import _bind_error as bind_error
from adapters.links import Link
from adapters.remote_link import connect
from adapters.service_link import AutonomousLink
from adapters.undecodable import RefuseUndecodable, Throttle, peer_host
from mediator.brokers import Accept, Brokers, mediator_id
from mediator.config import Config, ServiceConfig
from mediator.dead_letters import DeadLetterLog
from mediator.delivery import Dispatcher
from mediator.metrics import Metrics
from mediator.pipeline import CUT, close_links
from mediator.security import authenticate
from mediator.service import CLIENT, MediatorService, store_unavailable
from mediator.store import Store, StoreError, open_store
from mediator.store.base import Waiting
from mediator.wire import SERVICE_NAME, mediator_pb2_grpc
from transforms.federated import ServiceInfo

if TYPE_CHECKING:
    from mediator.pipeline import Pipeline

log = logging.getLogger("evamed.server")

HEALTH_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
OPEN_METHODS = (f"/{HEALTH_NAME}/", f"/{reflection.SERVICE_NAME}/",
                "/grpc.reflection.v1.ServerReflection/")
"""Method prefixes anyone may call: health checks and reflection (they disclose nothing a
client's profiles or notifications hold)."""
WATCH_SECONDS = 1.0
"""How often the server looks whether the pipeline thread is still running."""
PIPELINE_MIN = 0.5
"""Seconds the pipeline gets to finish its batch at shutdown when the calls in flight took the
whole drain."""


# ------------------------------------------------------------------ authentication


class Authenticator(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks every call's bearer token against the store's clients (hashed tokens) before
    its handler runs, and runs the handler with the client's name in ``CLIENT``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # A client retrying with a bad token would otherwise write a line per call.
        self._refused = Throttle()

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHODS):
            return handler
        return _guarded(handler, self._enter)

    async def _enter(self, context: grpc.aio.ServicerContext) -> None:
        """Authenticate the call (UNAUTHENTICATED if not) and set ``CLIENT``."""
        given = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        scheme, _, token = (given[0] if given else "").partition(" ")
        if not given or scheme.lower() != "bearer" or not token.strip():
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "expected the metadata 'authorization: Bearer <token>' (a token "
                                "from `evamed clients add NAME`)")
        try:
            record = await asyncio.to_thread(authenticate, self.store, token.strip())
        except StoreError as exc:  # not UNKNOWN: a status the client can act on (retry)
            await context.abort_with_status(store_unavailable(exc))
        if record is None:
            host = peer_host(context)
            quiet = self._refused.due(host)
            if quiet is not None:
                log.info("refused a call from %s: unknown or revoked token%s", host,
                         f" ({quiet} more since the last line)" if quiet else "")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "the bearer token is not valid: unknown or revoked (ask the "
                                "operator for a token: `evamed clients add NAME`)")
        else:
            CLIENT.set(record.name)


def _guarded(handler: Any, enter: Callable[[Any], Awaitable[None]]) -> Any:
    """The same method handler, its behaviour preceded by ``enter(context)`` (in the call's
    own task, so what ``enter`` sets in a context variable the behaviour sees)."""
    if handler.unary_unary is not None or handler.stream_unary is not None:
        field = "unary_unary" if handler.unary_unary is not None else "stream_unary"
        behaviour = getattr(handler, field)

        async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await enter(context)
            return await behaviour(request, context)
        return handler._replace(**{field: answer})
    field = "unary_stream" if handler.unary_stream is not None else "stream_stream"
    streaming = getattr(handler, field)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await enter(context)
        async for message in streaming(request, context):
            yield message
    return handler._replace(**{field: stream})


def _client(context: grpc.aio.ServicerContext) -> str:
    """The client a log line names: the authenticated one, else (health, reflection) its
    address."""
    name = CLIENT.get(None)
    return f"client {name}" if name is not None else peer_host(context)


# ------------------------------------------------------------------ serving


@dataclass
class Served:
    """A mediator running on the current event loop."""

    config: Config
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service: MediatorService
    dispatcher: Dispatcher
    pipeline: Pipeline
    store: Store
    links: dict[str, Link]
    metrics: Metrics
    metrics_port: int
    brokers: Brokers
    own_store: bool = True  # opened by start(): closed by stop()
    watch: asyncio.Task[None] | None = None
    waiting: Waiting | None = None  # the pipeline's view of the store: waits out an outage

    async def stop(self, drain: float | None = None) -> None:
        """Shut down gracefully (see the module docstring); ``drain``: seconds for calls in
        flight and the pipeline (default: the configuration's)."""
        seconds = self.config.drain / 1e6 if drain is None else drain
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        log.info("shutting down: NOT_SERVING, %.1f s for calls in flight", seconds)
        if self.watch is not None:
            self.watch.cancel()
        await self.health.enter_graceful_shutdown()
        self.dispatcher.close()
        # The brokers first: what they took is in the event log (or left at the broker),
        # and the pipeline drains a log that no longer grows.
        await asyncio.to_thread(self.brokers.stop)
        if self.waiting is not None:  # a pipeline waiting for a store that is down stops too
            self.waiting.abandon()
        await self.server.stop(seconds)
        await self.service.readers.close()  # no call reads a document now
        # What is left of the drain (a moment at least): the pipeline cuts short a batch that
        # waits on a service longer.
        await asyncio.to_thread(self.pipeline.stop, max(deadline - loop.time(), PIPELINE_MIN))
        await asyncio.to_thread(close_links, self.links.values(), CUT)
        await asyncio.to_thread(self.brokers.close)
        self.metrics.close()
        if self.own_store:
            await asyncio.to_thread(self.store.close)
        log.info("stopped")


def service_info(service: ServiceConfig) -> ServiceInfo:
    return service.info()


def service_link(service: ServiceConfig, config: Config, mediator: str) -> Link:
    """The link to a configured service: an autonomous one through the mediator's durable
    session there (named after this mediator and the service, so a restart finds it); a fed
    one published to (adapters.remote_link.connect)."""
    info = service_info(service)
    if info.autonomous:
        return AutonomousLink(info, service.address, f"{mediator}/{service.name}",
                              heartbeat=service.heartbeat / 1e6)
    return connect(info, service.address, tick=config.tick)


def idle_timeouts(config: Config) -> dict[str, float]:
    """Each autonomous service's idle timeout, in seconds."""
    return {s.name: (s.idle_timeout or config.idle_timeout) / 1e6 for s in config.services
            if s.autonomous}


def real_pipeline() -> Any:
    from mediator.pipeline import Pipeline

    return Pipeline


def link_infos(config: Config) -> list[ServiceInfo]:
    """What the planner is given, in the order of the links: the services. (A broker source
    is the mediator's own feed: its events are in the event log.)"""
    return [service_info(s) for s in config.services]


def credentials(config: Config) -> grpc.ServerCredentials | None:
    """The server's TLS credentials (None: plaintext). OSError naming the file that cannot be
    read."""
    tls = config.tls
    if not tls.enabled:
        return None
    files = {}
    for key in ("cert", "key", "client_ca"):
        path = getattr(tls, key)
        if path:
            try:
                files[key] = Path(path).read_bytes()
            except OSError as exc:
                raise OSError(f"tls.{key}: cannot read {path}: {exc.strerror}") from None
    return grpc.ssl_server_credentials(
        [(files["key"], files["cert"])], root_certificates=files.get("client_ca"),
        require_client_auth="client_ca" in files)


Progress = Callable[[str], None]
"""Told what the start waits for, in words (``evamed serve`` prints it on standard error)."""


async def start(config: Config, *, store: Store | None = None,
                pipeline: Callable[..., Pipeline] | None = None,
                progress: Progress = lambda step: None) -> Served:
    """Start a mediator on the running loop (``config.listen`` may use port 0: any free
    port). ``store``: one already open, left open at stop (default: ``open_store(
    config.store)``); ``pipeline``: its constructor (tests pass a double); ``progress``: told
    each step that may take a while. OSError when the address or a TLS file cannot be used,
    ValueError for a store URL that is not one, or a composer whose extra is not installed."""
    if pipeline is None:
        pipeline = real_pipeline()
    if config.composer == "spark":
        from mediator.extras import missing

        needed = missing("spark", 'composer = "spark"')
        if needed is not None:
            raise ValueError(needed)
    creds = credentials(config)
    own_store = store is None
    progress(f"opening the store {config.store}")
    opened = store if store is not None else await asyncio.to_thread(open_store, config.store)
    metrics = Metrics()
    letters = DeadLetterLog(opened, metrics, config.dead_letters)
    dispatcher = Dispatcher(opened, metrics, config.retention, config.limits.rate)
    dispatcher.attach(asyncio.get_running_loop())
    links: dict[str, Link] = {}
    running: Pipeline | None = None
    brokers: Brokers | None = None
    loop = asyncio.get_running_loop()
    try:
        if config.composer == "spark" and pipeline is real_pipeline():
            # The JVM first: forked once gRPC channels exist, its launcher can crash in gRPC's
            # fork handlers (mediator.placement.spark_session).
            from mediator.placement import spark_dir, spark_session

            progress("starting Spark for the Spark composer (a JVM in local mode: seconds, "
                     "tens of seconds on a loaded machine)")
            began = loop.time()
            await asyncio.to_thread(spark_session, os.path.realpath(spark_dir(opened)))
            progress(f"Spark started in {loop.time() - began:.1f} s")
        mediator = await asyncio.to_thread(mediator_id, opened)
        for s in config.services:
            links[s.name] = service_link(s, config, mediator)
        brokers = await asyncio.to_thread(Brokers, config, opened, metrics, letters)
        if (stored := len(opened.subscriptions())) or config.services:
            progress(f"restoring {stored} subscription{'s' if stored != 1 else ''}"
                     + (f" at {len(config.services)} service{'s' if len(config.services) != 1 else ''}"
                        " (waits until each service it uses answers)" if config.services else ""))
        # The pipeline waits out a store outage inside the store's calls (health goes
        # NOT_SERVING meanwhile: _watch_store), rather than dying half-way through a round.
        waiting = Waiting(opened)
        running = pipeline(cast(Store, waiting), links, tick=config.tick, composer=config.composer,
                           metrics=metrics, on_append=_appended(dispatcher, brokers),
                           idle=idle_timeouts(config), idle_default=config.idle_timeout / 1e6,
                           checkpoint_interval=config.checkpoint_interval / 1e6,
                           checkpoint_events=config.checkpoint_events,
                           lateness=config.admission().longest, reorder=config.reorder_buffer,
                           letters=letters, composites=config.limits.composites or None)
        await asyncio.to_thread(running.start)
        if config.composer == "spark" and pipeline is real_pipeline():
            progress("planning the Spark composer's job: its first micro-batch (seconds, tens "
                     "of seconds on a loaded machine), so that a first composite does not wait")
            began = loop.time()
            if (why := await asyncio.to_thread(running.warm)) is not None:
                log.warning("serving before the Spark composer is warm: %s", why)
            else:
                progress(f"the Spark composer's job is ready ({loop.time() - began:.1f} s)")
        service = MediatorService(opened, running, config, metrics, dispatcher, brokers,
                                  letters)
        await service.restore()
        # Events come in from the brokers once the duplicate memory is seeded.
        await asyncio.to_thread(brokers.start, _accepting(service, asyncio.get_running_loop()),
                                opened.subscriptions())
        server, health_servicer, port = _server(config, opened, service, creds)
        metrics_port = (metrics.serve(config.metrics_port, config.metrics_host,
                                      config.metrics_token) if config.metrics_port else 0)
        await server.start()
    except BaseException:
        if brokers is not None:
            await asyncio.to_thread(brokers.stop)
        if running is not None:
            await asyncio.to_thread(running.stop, 0.1)
        await asyncio.to_thread(close_links, links.values(), CUT)
        if brokers is not None:
            await asyncio.to_thread(brokers.close)
        metrics.close()
        if own_store:
            opened.close()
        raise
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    served = Served(config, server, port, health_servicer, service, dispatcher, running, opened,
                    links, metrics, metrics_port, brokers, own_store, waiting=waiting)
    served.watch = asyncio.create_task(_watch(served))
    log.info("serving %s on port %d (%s, %d services, composer %s)%s", SERVICE_NAME, port,
             "TLS" + (" with client certificates" if config.tls.client_ca else "")
             if creds is not None else "plaintext", len(links), config.composer,
             f"; metrics on port {metrics_port}" if metrics_port else "")
    return served


def _appended(dispatcher: Dispatcher, brokers: Brokers) -> Callable[[str, str, int], None]:
    """The pipeline's ``on_append``: the streams woken, and the sinks."""
    if not brokers.sinks:
        return dispatcher.on_append

    def appended(owner: str, name: str, head: int) -> None:
        dispatcher.on_append(owner, name, head)
        brokers.on_append(owner, name, head)
    return appended


def _accepting(service: MediatorService, loop: asyncio.AbstractEventLoop) -> Accept:
    """The sources' way into Publish's accept path: run on the server's loop (its order lock,
    its duplicate memory), waited for in the source's thread."""
    def accept(source: str, lines: list[str]) -> None:
        asyncio.run_coroutine_threadsafe(service.ingest(source, lines), loop).result()
    return accept


def _server(config: Config, store: Store, service: MediatorService,
            creds: grpc.ServerCredentials | None
            ) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The gRPC server with the three services, bound (OSError if the address cannot be)."""
    # Authentication first: a request that does not decode is then refused (and logged) with
    # the name of the client that sent it.
    server = grpc.aio.server(interceptors=[Authenticator(store), RefuseUndecodable(_client)], options=[
        ("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    mediator_pb2_grpc.add_MediatorServiceServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, HEALTH_NAME, reflection.SERVICE_NAME),
                                        server)
    try:
        port = (server.add_secure_port(config.listen, creds) if creds is not None
                else server.add_insecure_port(config.listen))
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}: {bind_error(config.listen)}")
    return server, health_servicer, port


async def _watch(served: Served) -> None:
    """Health is NOT_SERVING while the store does not answer (the calls answer UNAVAILABLE,
    the pipeline waits for it), SERVING again once it does; and NOT_SERVING for good if the
    pipeline thread stops by itself (a bug): the log keeps what was accepted, a restart
    evaluates it."""
    serving = True
    while served.pipeline.error is None:
        await asyncio.sleep(WATCH_SECONDS)
        down = await _store_down(served)
        if down and serving:
            log.error("the store does not answer (%s): health NOT_SERVING until it does", down)
        elif not down and not serving:
            log.warning("the store answers again: health SERVING")
        if serving != (not down):
            serving = not down
            status = (health_pb2.HealthCheckResponse.SERVING if serving
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            for name in ("", SERVICE_NAME):
                await served.health.set(name, status)
    log.error("the pipeline stopped: %s; health NOT_SERVING", served.pipeline.error)
    for name in ("", SERVICE_NAME):
        await served.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)


async def _store_down(served: Served) -> str:
    """Why the store does not answer ("": it does): the pipeline's waiting view says so, or a
    cheap read (a mediator at rest has no round to notice)."""
    if served.waiting is not None and served.waiting.down is not None:
        return str(served.waiting.down)
    try:
        await asyncio.to_thread(served.store.event_head)
    except StoreError as exc:
        return str(exc)
    return ""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops ``evamed serve`` gracefully: Ctrl-C, a service manager's stop, and the terminal
closing (a mediator started in a shell that is closed does not stay behind)."""


async def run(config: Config, ready: Callable[[Served], None] = lambda served: None,
              progress: Progress = lambda step: None) -> None:
    """Serve until SIGINT, SIGTERM or SIGHUP, then shut down gracefully; a second signal ends
    the process at once (:func:`exit_now`). ``ready(served)`` is called once the mediator
    answers; ``progress`` is told what the start waits for. A signal during the start (Spark
    starting, a service its subscriptions use out of reach) ends the process within
    ``START_CANCEL`` seconds, status 128 + the signal's number: nothing was accepted yet."""
    signals: asyncio.Queue[int] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    starting = asyncio.create_task(start(config, progress=progress))
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    early = asyncio.create_task(signals.get())
    await asyncio.wait({starting, early}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        # start() closes what it opened when cancelled (its except BaseException); a thread it
        # waits on (Spark's JVM starting, a service out of reach) is not waited for.
        starting.cancel()
        await asyncio.wait({starting}, timeout=START_CANCEL)
        exit_now(early.result(), "stopped while starting")
    early.cancel()
    served = starting.result()
    ready(served)
    await signals.get()
    stopping = asyncio.create_task(served.stop())
    second = asyncio.create_task(signals.get())
    await asyncio.wait({stopping, second}, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        exit_now(second.result())
    second.cancel()
    await stopping


START_CANCEL = 3.0
"""Seconds a signal during the start gives it to close what it opened."""


def exit_now(sig: int, why: str = "second signal: exiting at once; the next start evaluates "
             "what was accepted") -> None:
    """End the process at once, with status 128 + ``sig``: no thread is waited for (one may
    wait on a service, or on the pipeline), nothing more is evaluated — what was accepted is in
    the event log, and every acknowledged append is durable, so the next start evaluates it."""
    log.warning("%s", why)
    logging.shutdown()  # the handlers flushed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + sig)


class Running:
    """A mediator on its own event loop in a background thread, for synchronous callers
    (tests, benchmarks, embedding): ``port``, ``metrics_port``, ``served``, ``stop()``."""

    def __init__(self, config: Config, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="evamed-mediator")
        self._thread.start()
        try:
            self.served: Served = self.call(start(config, **options))
        except BaseException:
            self._close_loop()
            raise
        self.port = self.served.port
        self.metrics_port = self.served.metrics_port

    def call(self, coroutine: Any) -> Any:
        """Run a coroutine on the mediator's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self, drain: float | None = None) -> None:
        if self._thread.is_alive():
            try:
                self.call(self.served.stop(drain))
            finally:
                self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def serve(config: Config, **options: Any) -> Running:
    """Start a mediator in a background thread (``config.listen`` may use port 0)."""
    return Running(config, **options)


__all__ = ["Authenticator", "Running", "Served", "credentials", "exit_now", "run", "serve",
           "start"]
