"""An MQTT broker connection (paho-mqtt 2), shared by the MQTT source and sink (docs/sources.md).

:class:`BrokerSettings` is what the configuration says of a broker: address, protocol (MQTT 5
or 3.1.1), credentials, TLS, keep-alive and the session's expiry. :class:`Connection` keeps a
paho client connected from a thread of its own: paho's loop thread runs each connection, and when
the connection is lost (or refused, or never made) it reconnects with exponential back-off and full
jitter (tenacity's ``wait_random_exponential``: a random wait up to a doubling bound) — not
paho's own ``reconnect_delay_set``, which doubles a whole-second delay without jitter, so every
mediator of a fleet would knock on a restarted broker in the same instant; tenacity's waits also
end at once on :meth:`Connection.stop` (they sleep on its event). Each successful connection
has a new **generation** number: an acknowledgement owed to a message of an earlier connection
is not sent on a later one (the broker redelivers the message instead).

A persistent session (the source's) is ``clean_start`` off with a session expiry (MQTT 5), or
``clean_session`` off (3.1.1, where the broker decides how long it keeps the session), under a
client id that stays the same for the same mediator and broker (:func:`stable_client_id`).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_random_exponential

log = logging.getLogger("evamed.mqtt")

PROTOCOLS = {"5": MQTTProtocolVersion.MQTTv5, "3.1.1": MQTTProtocolVersion.MQTTv311}


@dataclass(frozen=True)
class Tls:
    """TLS to the broker: the CA file (None: the system's), a client certificate and key (mutual
    TLS), and ``insecure`` to skip the host-name check (a test broker's certificate)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        context.check_hostname = not self.insecure
        return context


@dataclass(frozen=True)
class BrokerSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    protocol: str = "5"              # "5" or "3.1.1"
    client_id: str = ""              # "": stable_client_id(mediator, source name)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: Tls | None = None
    keepalive: int = 30              # seconds between pings when nothing else is sent
    session_expiry: int = 7 * 86_400  # seconds the broker keeps a persistent session (MQTT 5)
    backoff_initial: float = 0.2     # the first reconnect waits up to this, doubling to backoff_max
    backoff_max: float = 30.0
    connect_timeout: float = 10.0    # for the broker's CONNACK

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"found MQTT protocol {self.protocol!r}, expected one of "
                             f"{', '.join(repr(p) for p in PROTOCOLS)}")
        if not 0 < self.port < 65536:
            raise ValueError(f"found port {self.port}, expected 1 to 65535")

    @property
    def address(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def stable_client_id(mediator: str, name: str) -> str:
    """The client id of ``mediator``'s connection to the broker of source ``name``: the same on
    every start (the broker finds the persistent session under it), distinct per mediator and
    source, and 23 characters of [0-9a-z-] — what every MQTT 3.1.1 broker must accept."""
    digest = hashlib.blake2b(f"{mediator}\0{name}".encode(), digest_size=8).hexdigest()
    return f"evamed-{digest}"


class ConnectError(ConnectionError):
    """The broker refused the connection (its reason) or did not answer in time."""


class _Stopped(Exception):
    pass


class Connection:
    """A paho client kept connected by a supervising thread (see the module's docstring).

    While connected, paho's own loop thread runs the connection: ``on_connect(session_present)``
    and ``on_message(message)`` run there (keep them short), and calls from other threads
    (subscribe, publish, ack) only queue packets for it — paho's threaded mode; a client whose
    ``loop()`` is driven by hand lets such a call write the socket from its own thread, racing
    the loop's writes."""

    def __init__(self, settings: BrokerSettings, client_id: str, *, persistent: bool,
                 manual_ack: bool = False,
                 on_connect: Callable[[bool], None] = lambda present: None,
                 on_message: Callable[[mqtt.MQTTMessage], None] | None = None,
                 on_publish: Callable[[int], None] | None = None) -> None:
        self.settings = settings
        self.client_id = client_id
        protocol = PROTOCOLS[settings.protocol]
        v5 = protocol is MQTTProtocolVersion.MQTTv5
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=None if v5 else not persistent,
                                  protocol=protocol, reconnect_on_failure=False,
                                  manual_ack=manual_ack)
        if settings.username is not None:
            self.client.username_pw_set(settings.username, settings.password)
        if settings.tls is not None:
            self.client.tls_set_context(settings.tls.context())
        properties: Properties | None = None
        if v5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = settings.session_expiry if persistent else 0
        self.client.connect_async(settings.host, settings.port, settings.keepalive,
                                  clean_start=not persistent if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                                  properties=properties)
        self.client.on_connect = self._connected
        self.client.on_disconnect = self._disconnected
        if on_message is not None:
            self.client.on_message = lambda client, userdata, message: on_message(message)
        if on_publish is not None:
            self.client.on_publish = (lambda client, userdata, mid, reason, properties:
                                      on_publish(mid))
        self._on_connect = on_connect
        self.generation = 0
        """Counts the successful connections; read it to tell them apart."""
        self.connects = 0
        self._up = threading.Event()    # connected (CONNACK accepted)
        self._down = threading.Event()  # the connection attempt or the connection ended
        self._stop = threading.Event()
        self._reason = ""
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"mqtt-{self.client_id}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Disconnect (cleanly: the session stays for its expiry) and end the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._up.wait(timeout)

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        """The supervisor: connect (with back-off), wait for the connection to end, again."""
        try:
            while not self._stop.is_set():
                try:
                    self._connect()
                except _Stopped:
                    break
                while not self._stop.is_set() and not self._down.wait(0.2):
                    pass
                if self._stop.is_set():
                    break
                self.client.loop_stop()  # its loop ended with the connection
                log.warning("%s: connection to %s lost (%s); reconnecting", self.client_id,
                            self.settings.address, self._reason or "no reason given")
        finally:
            if self._up.is_set():
                # Clean (the broker keeps a persistent session); the loop sends it and ends.
                self.client.disconnect()
            self.client.loop_stop()
            self._up.clear()
            sock = self.client.socket()  # a refused or half-open connection's
            if sock is not None:
                sock.close()

    def _connect(self) -> None:
        retrying = Retrying(
            wait=wait_random_exponential(multiplier=self.settings.backoff_initial,
                                         max=self.settings.backoff_max),
            retry=retry_if_exception_type((OSError, ConnectError)),
            sleep=self._pause, reraise=True, before_sleep=self._waiting)
        retrying(self._attempt)

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _waiting(self, state: RetryCallState) -> None:
        if self._stop.is_set():
            raise _Stopped
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("%s: cannot connect to %s (%s); attempt %d, next in %.1f s", self.client_id,
                    self.settings.address, exc, state.attempt_number, wait)

    def _attempt(self) -> None:
        if self._stop.is_set():
            raise _Stopped
        self._reason = ""
        self._down.clear()
        self.client.reconnect()  # OSError: nothing listens, DNS, TLS handshake
        # paho's own loop thread from here (its threaded mode: other threads' calls only queue
        # packets and wake it; it alone writes the socket). It ends with the connection, as
        # paho reconnects by itself only when told to (reconnect_on_failure=False).
        self.client.loop_start()
        deadline = time.monotonic() + self.settings.connect_timeout
        while not self._up.is_set():
            if self._stop.is_set():
                raise _Stopped
            if self._down.wait(0.05) or time.monotonic() > deadline:
                self.client.disconnect()
                self.client.loop_stop()
                raise ConnectError(self._reason or "no answer (CONNACK) within "
                                   f"{self.settings.connect_timeout} s")

    def _connected(self, client: mqtt.Client, userdata: Any, flags: mqtt.ConnectFlags,
                   reason: Any, properties: Properties | None) -> None:
        if reason.is_failure:
            self._reason = f"refused: {reason}"
            self._down.set()
            return
        self.generation += 1
        self.connects += 1
        log.info("%s: connected to %s (session %s)", self.client_id, self.settings.address,
                 "resumed" if flags.session_present else "new")
        # Up before the callback: a subscription another thread adds meanwhile is sent on
        # this connection (the source serializes the two; subscribing twice is harmless).
        self._up.set()
        self._on_connect(bool(flags.session_present))

    def _disconnected(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                      properties: Properties | None) -> None:
        self._up.clear()
        self._reason = self._reason or str(reason)
        self._down.set()
