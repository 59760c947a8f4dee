"""The NATS JetStream edge: connection settings, stream set-up and the buffering publisher.

:class:`BusPublisher` is a collector :class:`~fabricscope.telemetry.sinks.Sink`: the collector
thread calls ``write(events, findings)``; events are batched per target, encoded with
:mod:`fabricscope.cluster.encoding` and published by an asyncio loop in a background thread to
``fs.telemetry.<target>`` with a content-hash ``Nats-Msg-Id`` (JetStream drops a resent
batch inside the stream's duplicate window). While NATS is unreachable the batches wait in a
bounded buffer (oldest dropped and counted when full) and go out in order on reconnect.
De-duplication follows the JetStream documentation ("Message Deduplication": the
``Nats-Msg-Id`` header within the stream's ``duplicate_window``).
Design and semantics: ``docs/design/cluster-bus.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from fabricscope.cluster.encoding import (
    batch_id,
    encode_events,
    encode_findings,
    encode_probes,
    subject_token,
)
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, ProbeSample, TelemetryEvent
from fabricscope.telemetry.selfmetrics import RateLimitedLog

__all__ = [
    "BusConfig",
    "BusPublisher",
    "PublisherStats",
    "connect",
    "ensure_streams",
    "findings_subject",
    "incidents_subject",
    "probes_subject",
    "telemetry_subject",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BusConfig:
    """Where the bus is and how its streams look. Loopback by default; secrets never in ``repr``.

    Authentication: ``user``/``password`` (or ``password_env``), ``token``, or a ``creds_file``
    (NATS decentralized JWT + nkey). TLS: ``tls_ca`` verifies the server, ``tls_cert`` +
    ``tls_key`` present a client certificate (``tls://`` URLs require TLS).
    Limits: each stream keeps at most ``max_bytes`` and ``max_age_s``; the telemetry stream
    refuses new messages when full (``telemetry_discard="new"``, so the loss is counted at
    the publisher instead of silently aging out unread data).
    """

    url: str = "nats://127.0.0.1:4222"
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    password_env: str | None = None
    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    client_name: str = "fabricscope"
    connect_timeout_s: float = 2.0
    reconnect_wait_s: float = 0.25
    telemetry_stream: str = "FS_TELEMETRY"
    telemetry_prefix: str = "fs.telemetry"
    findings_stream: str = "FS_FINDINGS"
    findings_prefix: str = "fs.findings"
    probes_stream: str = "FS_PROBES"
    probes_prefix: str = "fs.probes"
    incidents_stream: str = "FS_INCIDENTS"
    incidents_prefix: str = "fs.incidents"
    max_bytes: int = 1 << 30
    max_age_s: float = 24 * 3600.0
    duplicate_window_s: float = 120.0
    storage: Literal["file", "memory"] = "file"
    telemetry_discard: Literal["new", "old"] = "new"

    def __post_init__(self) -> None:
        scheme = self.url.partition("://")[0] if "://" in self.url else ""
        if scheme not in ("nats", "tls"):
            raise ConfigError(f"bus: url: expected nats://host:port or tls://host:port, got {self.url!r}")
        if (self.password or self.password_env) and not self.user:
            raise ConfigError("bus: password: given without a user")
        if sum(bool(x) for x in (self.user, self.token, self.creds_file)) > 1:
            raise ConfigError("bus: user, token and creds_file: choose one authentication method")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("bus: tls_cert and tls_key: give both for a client certificate, or neither")
        for name in ("creds_file", "tls_ca", "tls_cert", "tls_key"):
            p = getattr(self, name)
            if p and not Path(p).is_file():
                raise ConfigError(f"bus: {name}: no such file {p!r}")
        if self.password_env and self.password_env not in os.environ:
            raise ConfigError(f"bus: password_env: environment variable {self.password_env!r} is not set")
        for name in ("max_bytes", "max_age_s", "duplicate_window_s", "connect_timeout_s", "reconnect_wait_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ConfigError(f"bus: {name}: expected a positive number, got {v!r}")
        if self.duplicate_window_s > self.max_age_s:
            raise ConfigError(f"bus: duplicate_window_s: {self.duplicate_window_s} exceeds max_age_s {self.max_age_s}")
        if self.storage not in ("file", "memory"):
            raise ConfigError(f"bus: storage: expected 'file' or 'memory', got {self.storage!r}")
        if self.telemetry_discard not in ("new", "old"):
            raise ConfigError(f"bus: telemetry_discard: expected 'new' or 'old', got {self.telemetry_discard!r}")

    def tls_context(self) -> ssl.SSLContext | None:
        """The client TLS context, or None when no TLS setting is given."""
        if not (self.tls_ca or self.tls_cert or self.url.startswith("tls://")):
            return None
        ctx = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert and self.tls_key:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx


def telemetry_subject(cfg: BusConfig, target: str) -> str:
    """``fs.telemetry.<target>`` with the target as one subject token."""
    return f"{cfg.telemetry_prefix}.{subject_token(target)}"


def findings_subject(cfg: BusConfig, kind: str) -> str:
    """``fs.findings.<kind>``."""
    return f"{cfg.findings_prefix}.{subject_token(kind)}"


def incidents_subject(cfg: BusConfig, incident_id: str) -> str:
    """``fs.incidents.<incident id>``."""
    return f"{cfg.incidents_prefix}.{subject_token(incident_id)}"


def probes_subject(cfg: BusConfig, src: str) -> str:
    """``fs.probes.<src host>``."""
    return f"{cfg.probes_prefix}.{subject_token(src)}"


Callback = Callable[[], Awaitable[None]]


async def connect(cfg: BusConfig, *, disconnected_cb: Callback | None = None,
                  reconnected_cb: Callback | None = None, wait_s: float | None = None) -> NatsClient:
    """Connect to ``cfg.url``; once connected the client reconnects forever by itself.

    The first connection is retried for ``wait_s`` (default ``2 * connect_timeout_s``), then
    :class:`TransportError` names the URL and the last error (an authorization violation, a
    refused connection, a TLS failure). Credentials go to the client only, never into a message.
    """
    kw: dict[str, Any] = {}
    if cfg.user:
        kw["user"] = cfg.user
        pw = cfg.password if cfg.password is not None else os.environ.get(cfg.password_env or "", None)
        if pw is not None:
            kw["password"] = pw
    if cfg.token:
        kw["token"] = cfg.token
    if cfg.creds_file:
        kw["user_credentials"] = cfg.creds_file
    tls = cfg.tls_context()
    if tls is not None:
        kw["tls"] = tls
        if cfg.tls_hostname:
            kw["tls_hostname"] = cfg.tls_hostname
    last: list[BaseException] = []

    async def _error(exc: Exception) -> None:
        last[:] = [exc]
        log.debug("bus: nats client error: %s", exc)

    wait = wait_s if wait_s is not None else 2 * cfg.connect_timeout_s
    try:
        return await asyncio.wait_for(nats.connect(
            servers=[cfg.url], name=cfg.client_name, connect_timeout=cfg.connect_timeout_s,
            reconnect_time_wait=cfg.reconnect_wait_s, max_reconnect_attempts=-1,
            allow_reconnect=True, disconnected_cb=disconnected_cb, reconnected_cb=reconnected_cb,
            error_cb=_error, **kw), timeout=wait)
    except TimeoutError as exc:
        why = f"{type(last[0]).__name__}: {last[0]}" if last else "no answer"
        raise TransportError(f"bus: cannot connect to {cfg.url} within {wait:.1f} s ({why})") from exc
    except Exception as exc:  # nats raises its own errors, OSError, ssl errors
        raise TransportError(f"bus: cannot connect to {cfg.url}: {type(exc).__name__}: {exc}") from exc


async def ensure_streams(js: JetStreamContext, cfg: BusConfig) -> None:
    """Create (or update to ``cfg``'s limits) the telemetry, findings, probe and incident streams."""
    storage = StorageType.FILE if cfg.storage == "file" else StorageType.MEMORY
    for name, prefix, discard in (
            (cfg.telemetry_stream, cfg.telemetry_prefix,
             DiscardPolicy.NEW if cfg.telemetry_discard == "new" else DiscardPolicy.OLD),
            (cfg.findings_stream, cfg.findings_prefix, DiscardPolicy.OLD),
            (cfg.probes_stream, cfg.probes_prefix, DiscardPolicy.OLD),
            (cfg.incidents_stream, cfg.incidents_prefix, DiscardPolicy.OLD)):
        sc = StreamConfig(name=name, subjects=[f"{prefix}.>"], max_bytes=cfg.max_bytes, max_age=cfg.max_age_s,
                          duplicate_window=cfg.duplicate_window_s, storage=storage, discard=discard)
        try:
            await js.add_stream(sc)
        except nats.js.errors.BadRequestError:
            # exists with other limits: take the configured ones
            await js.update_stream(sc)


# --------------------------------------------------------------------------- publisher


@dataclass
class PublisherStats:
    """A snapshot of a :class:`BusPublisher` (all counts since start)."""

    published_events: int = 0
    published_batches: int = 0
    duplicate_batches: int = 0
    buffered_events: int = 0
    buffered_bytes: int = 0
    dropped_events: int = 0
    publish_errors: int = 0
    reconnects: int = 0
    disconnects: int = 0
    connected: bool = False
    spilled_events: int = 0
    lost_events: int = 0
    replayed_events: int = 0

    def metric_samples(self, prefix: str = "fabricscope_bus_publisher") -> list[tuple[str, str, dict[str, str], float]]:
        """As Prometheus samples ``(name, "counter" | "gauge", labels, value)``."""
        gauges = {"buffered_events", "buffered_bytes", "connected"}
        return [(f"{prefix}_{k}" + ("" if k in gauges else "_total"), "gauge" if k in gauges else "counter", {},
                 float(v)) for k, v in asdict(self).items()]


@dataclass(eq=False)
class _Out:
    subject: str
    payload: bytes
    msg_id: str
    n_events: int
    inflight: bool = False
    evicted: bool = False


_SPILL_HEAD = struct.Struct("<HIIQ")  # subject length, payload length, events, reserved
_SPILL_MAGIC = b"FSBSPILL1\n"


class BusPublisher:
    """A collector sink that publishes batches to JetStream (at-least-once, de-duplicated).

    ``batch_events``: events per message (per target); ``linger_s``: the longest a partial
    batch waits; ``max_buffer_bytes``: encoded bytes held while NATS is slow or away (the
    oldest batches go first when it is full, counted in ``dropped_events``);
    ``max_in_flight``: publishes awaiting their JetStream ack at once. ``spill_path``: what is
    still buffered at the close deadline is written there and published on the next start.
    """

    def __init__(self, config: BusConfig | None = None, *, batch_events: int = 1000, linger_s: float = 0.05,
                 max_buffer_bytes: int = 64 << 20, max_in_flight: int = 64, compress: bool = True,
                 publish_timeout_s: float = 2.0, spill_path: str | Path | None = None,
                 create_streams: bool = True) -> None:
        if batch_events < 1 or max_in_flight < 1 or max_buffer_bytes < 1 or linger_s <= 0:
            raise ConfigError(f"bus publisher: batch_events={batch_events}, max_in_flight={max_in_flight}, "
                              f"max_buffer_bytes={max_buffer_bytes} and linger_s={linger_s} must be positive")
        self.config = config or BusConfig()
        self.batch_events = batch_events
        self.linger_s = linger_s
        self.max_buffer_bytes = max_buffer_bytes
        self.max_in_flight = max_in_flight
        self.compress = compress
        self.publish_timeout_s = publish_timeout_s
        self.spill_path = Path(spill_path) if spill_path is not None else None
        self.create_streams = create_streams
        self._lock = threading.Lock()
        self._acc: dict[str, list[TelemetryEvent]] = {}
        self._acc_since: dict[str, float] = {}
        self._queue: deque[_Out] = deque()
        self._qbytes = 0
        self._stats = PublisherStats()
        self._closing = False
        self._deadline = float("inf")
        self._ratelog = RateLimitedLog(log, 30.0)
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._done = threading.Event()
        self._load_spill()
        self._thread = threading.Thread(target=self._run, name="bus-publisher", daemon=True)
        self._thread.start()

    # ---- called from the collector thread

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        """Queue events (batched per target) and findings; never blocks on the network."""
        if self._closing:
            raise TransportError("bus publisher: write after close")
        now = time.monotonic()
        with self._lock:
            acc = self._acc
            for e in events:
                lst = acc.get(e.target)
                if lst is None:
                    lst = acc[e.target] = []
                    self._acc_since[e.target] = now
                lst.append(e)
                if len(lst) >= self.batch_events:
                    self._cut(e.target)
            if findings:
                by_kind: dict[str, list[Finding]] = {}
                for f in findings:
                    by_kind.setdefault(f.kind, []).append(f)
                for kind, fs in by_kind.items():
                    self._enqueue(findings_subject(self.config, kind), encode_findings(fs, compress=self.compress), 0)
        if self._queue:
            self._notify()

    def write_probes(self, samples: Sequence[ProbeSample], statuses: Sequence[int] | None = None) -> None:
        """Publish probe samples (with the prober's statuses, 0-3, when given), one batch per
        source NIC, to ``fs.probes.<src>``."""
        if self._closing:
            raise TransportError("bus publisher: write after close")
        by_src: dict[str, list[int]] = {}
        for k, s in enumerate(samples):
            by_src.setdefault(s.src, []).append(k)
        with self._lock:
            for src, ks in by_src.items():
                for i in range(0, len(ks), self.batch_events):
                    part = ks[i:i + self.batch_events]
                    self._enqueue(probes_subject(self.config, src),
                                  encode_probes([samples[k] for k in part],
                                                statuses=None if statuses is None else [statuses[k] for k in part],
                                                compress=self.compress), len(part))
        self._notify()

    def stats(self) -> PublisherStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            s = replace(self._stats)
            s.buffered_events = sum(o.n_events for o in self._queue) + sum(map(len, self._acc.values()))
            s.buffered_bytes = self._qbytes
        return s

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Publish everything written so far; True when all of it was acked within ``timeout_s``."""
        with self._lock:
            for t in list(self._acc):
                self._cut(t)
        self._notify()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if not self._queue and not self._acc:
                    return True
            time.sleep(0.005)
        return False

    def close(self, deadline_s: float = 10.0) -> None:
        """Flush within ``deadline_s`` and disconnect. What is left goes to ``spill_path`` if set
        (``stats().spilled_events``), else it is logged and counted in ``stats().lost_events``."""
        if self._closing:
            return
        self._closing = True
        self._deadline = time.monotonic() + deadline_s
        with self._lock:
            for t in list(self._acc):
                self._cut(t)
        self._notify()
        self._done.wait(deadline_s + max(self.config.connect_timeout_s, self.publish_timeout_s) + 1.0)
        with self._lock:
            left = list(self._queue)
            self._queue.clear()
            self._qbytes = 0
        n = sum(o.n_events for o in left)
        if left and self.spill_path is not None:
            self._write_spill(left)
            self._stats.spilled_events += n
        elif n:
            self._stats.lost_events += n
            log.error("bus publisher: %d events not published by the close deadline (%.1f s); set spill_path "
                      "to keep them", n, deadline_s)

    # ---- internals (the lock is held by the caller of _cut/_enqueue)

    def _cut(self, target: str) -> None:
        events = self._acc.pop(target, None)
        self._acc_since.pop(target, None)
        if not events:
            return
        subj = telemetry_subject(self.config, target)
        for i in range(0, len(events), self.batch_events):
            chunk = events[i:i + self.batch_events]
            self._enqueue(subj, encode_events(chunk, compress=self.compress), len(chunk))

    def _enqueue(self, subject: str, payload: bytes, n_events: int) -> None:
        self._queue.append(_Out(subject, payload, batch_id(payload), n_events))
        self._qbytes += len(payload)
        while self._qbytes > self.max_buffer_bytes and len(self._queue) > 1:
            old = self._queue.popleft()
            self._qbytes -= len(old.payload)
            if old.inflight:
                old.evicted = True  # counted as dropped only if its publish fails
            else:
                self._stats.dropped_events += old.n_events

    def _notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(self._wake.set)

    # ---- the asyncio side

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except Exception as exc:  # pragma: no cover - a bug, not a network condition
            log.exception("bus publisher: loop failed: %s", exc)
        finally:
            self._done.set()
            with contextlib.suppress(Exception):
                self._loop.close()

    def _past_deadline(self) -> bool:
        return self._closing and time.monotonic() >= self._deadline

    async def _main(self) -> None:
        nc: NatsClient | None = None
        while nc is None:
            try:
                nc = await connect(self.config, disconnected_cb=self._on_disconnect,
                                   reconnected_cb=self._on_reconnect, wait_s=min(1.0, 2 * self.config.connect_timeout_s))
            except TransportError as exc:
                self._ratelog.log(logging.WARNING, self.config.url, "connect",
                                  f"{exc}; buffering (retrying every {self.config.reconnect_wait_s} s)",
                                  time.monotonic())
                if self._past_deadline() or (self._closing and not self._queue):
                    return
                await asyncio.sleep(self.config.reconnect_wait_s)  # an error that fails at once
        self._stats.connected = True
        js = nc.jetstream(timeout=self.publish_timeout_s)
        try:
            if self.create_streams:
                while not self._past_deadline():
                    try:
                        await ensure_streams(js, self.config)
                        break
                    except Exception as exc:
                        self._ratelog.log(logging.WARNING, self.config.url, "streams",
                                          f"bus publisher: cannot set up streams: {exc}", time.monotonic())
                        await asyncio.sleep(self.config.reconnect_wait_s)
            await self._send_loop(js)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=1.0)
            self._stats.connected = False

    async def _on_disconnect(self) -> None:
        self._stats.disconnects += 1
        self._stats.connected = False

    async def _on_reconnect(self) -> None:
        self._stats.reconnects += 1
        self._stats.connected = True
        self._ratelog.reset(self.config.url, "publish")
        self._wake.set()

    async def _send_loop(self, js: JetStreamContext) -> None:
        backoff = 0.0
        while True:
            if self._past_deadline():
                return
            with self._lock:
                now = time.monotonic()
                for t, since in list(self._acc_since.items()):
                    if now - since >= self.linger_s:
                        self._cut(t)
                window = list(itertools.islice(self._queue, self.max_in_flight))
                for o in window:
                    o.inflight = True
                if not window and self._closing and not self._acc:
                    return
            if not window:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.linger_s)
                continue
            if backoff:
                await asyncio.sleep(backoff)
            results = await asyncio.gather(
                *(js.publish(o.subject, o.payload, headers={"Nats-Msg-Id": o.msg_id}) for o in window),
                return_exceptions=True)
            done: set[int] = set()
            err: BaseException | None = None
            with self._lock:
                for o, res in zip(window, results, strict=True):
                    o.inflight = False
                    if isinstance(res, BaseException):
                        err = res
                        if o.evicted:
                            self._stats.dropped_events += o.n_events
                        continue
                    done.add(id(o))
                    self._stats.published_batches += 1
                    self._stats.published_events += o.n_events
                    if getattr(res, "duplicate", False):
                        self._stats.duplicate_batches += 1
                if done:
                    keep: deque[_Out] = deque()
                    for o in self._queue:
                        if id(o) in done:
                            self._qbytes -= len(o.payload)
                        else:
                            keep.append(o)
                    self._queue = keep
            if err is not None:
                self._stats.publish_errors += 1
                self._ratelog.log(logging.WARNING, self.config.url, "publish",
                                  f"bus publisher: publish failed ({type(err).__name__}: {err}); holding "
                                  f"{len(self._queue)} batches and retrying", time.monotonic())
                backoff = min(max(backoff * 2, 0.05), 1.0)
            else:
                backoff = 0.0

    # ---- spill file (what the close deadline left)

    def _write_spill(self, items: Sequence[_Out]) -> None:
        assert self.spill_path is not None
        tmp = self.spill_path.with_suffix(self.spill_path.suffix + ".tmp")
        old = self.spill_path.read_bytes() if self.spill_path.exists() else _SPILL_MAGIC
        parts = [old]
        for o in items:
            s = o.subject.encode()
            parts += [_SPILL_HEAD.pack(len(s), len(o.payload), o.n_events, 0), s, o.payload]
        tmp.write_bytes(b"".join(parts))
        os.replace(tmp, self.spill_path)

    def _load_spill(self) -> None:
        p = self.spill_path
        if p is None or not p.exists():
            return
        data = p.read_bytes()
        if not data.startswith(_SPILL_MAGIC):
            raise ConfigError(f"bus publisher: spill_path: {p} is not a bus spill file")
        off = len(_SPILL_MAGIC)
        n = 0
        while off + _SPILL_HEAD.size <= len(data):
            ls, lp, ne, _ = _SPILL_HEAD.unpack_from(data, off)
            off += _SPILL_HEAD.size
            if off + ls + lp > len(data):
                log.error("bus publisher: spill file %s is cut short at byte %d; the rest is skipped", p, off)
                break
            subj = data[off:off + ls].decode()
            payload = data[off + ls:off + ls + lp]
            off += ls + lp
            self._queue.append(_Out(subj, payload, batch_id(payload), ne))
            self._qbytes += len(payload)
            n += ne
        self._stats.replayed_events = n
        p.unlink()
