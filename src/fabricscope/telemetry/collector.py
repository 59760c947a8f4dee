"""The gNMI collector: many targets over grpc.aio -> bounded buffer -> processors/detectors -> sinks.

* one Subscribe RPC per (device name, subscription), each reconnecting with exponential
  backoff and full jitter (AWS architecture blog, "Exponential Backoff And Jitter") after the
  target goes away; the backoff resets once a stream delivers data again;
* a malformed notification is counted, logged at most once per stream per minute and skipped;
  the stream goes on;
* a stream with no update for ``stale-after`` x its sample interval is *stale* (a frozen or
  wedged target keeps its TCP connection open): logged, marked in the store
  (``/fabricscope/collector/stale`` = 1, then 0 when data flows again), exported as a metric,
  and resubscribed; gRPC keepalive pings catch a silent connection whose peer is gone;
* a bounded buffer between receivers and the writer: when it is full, receivers stop reading
  (gRPC flow control pushes back on the target) instead of dropping;
* the writer takes batches, runs the pure pipeline and detectors once, and retries each sink
  that fails (store outage) with the same backoff, holding the batch and never rewriting a sink
  that already took it: nothing that fits the buffer is lost;
* shutdown is bounded: after :meth:`Collector.stop` the writer drains into the sinks until
  ``shutdown.deadline``; what is still unwritten then goes to the spill file (JSON lines,
  :mod:`fabricscope.telemetry.spill`), which the next start replays into the sinks.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
from gnmi_pb import gnmi_pb2

from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry import selfmetrics
from fabricscope.telemetry.codec import TelemetryDecodeError, WireFlattener, to_proto_path
from fabricscope.telemetry.config import CollectorConfig, SubscriptionConfig, TargetConfig
from fabricscope.telemetry.detectors import DetectorSet, build_detector
from fabricscope.telemetry.paths import parse_path
from fabricscope.telemetry.processors import Pipeline, ProcessorSpec, build_processor, group_labels
from fabricscope.telemetry.selfmetrics import (
    CONNECTED,
    CONNECTING,
    RETRYING,
    STALE,
    STOPPED,
    StreamState,
    write_sinks,
)
from fabricscope.telemetry.sinks import Sink, build_sink
from fabricscope.telemetry.spill import SpillBatch, append_spill, read_spill, rewrite_spill

log = logging.getLogger(__name__)

_MODES = {"once": gnmi_pb2.SubscriptionList.ONCE, "poll": gnmi_pb2.SubscriptionList.POLL,
          "stream": gnmi_pb2.SubscriptionList.STREAM}
_SMODES = {"sample": gnmi_pb2.SAMPLE, "on-change": gnmi_pb2.ON_CHANGE, "target-defined": gnmi_pb2.TARGET_DEFINED}
_ENC = {"proto": gnmi_pb2.PROTO, "json_ietf": gnmi_pb2.JSON_IETF}
# Status codes that a retry cannot fix (bad request, bad credentials, unknown target/path).
_PERMANENT = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                        grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.UNIMPLEMENTED})
#: Name of the marker event written when a stream goes stale (value 1) and recovers (value 0).
STALE_MARK = "/fabricscope/collector/stale"
# A stream is never called stale sooner than this, whatever k x interval says: a reconnect
# throws away what is in flight, so a scheduler hiccup must not trigger one.
_MIN_STALE_S = 1.0
_LOG_INTERVAL_S = 60.0  # one log line per stream per condition per minute
# Before a call's first message the limit is at least this: the initial sync of a large
# target can take a while, and cancelling it would only start it over.
_FIRST_MESSAGE_S = 10.0

T = TypeVar("T")


class EventBuffer:
    """A bounded FIFO of events; ``put`` waits while full (backpressure, never drops)."""

    def __init__(self, max_events: int) -> None:
        self.max_events = max_events
        self._q: deque[list[TelemetryEvent]] = deque()
        self.size = 0
        self.high_water = 0
        self._not_full = asyncio.Event()
        self._not_full.set()
        self._not_empty = asyncio.Event()

    async def put(self, events: list[TelemetryEvent]) -> None:
        while self.size >= self.max_events:
            self._not_full.clear()
            await self._not_full.wait()
        self._q.append(events)
        self.size += len(events)
        self.high_water = max(self.high_water, self.size)
        self._not_empty.set()

    def take(self, max_events: int) -> list[TelemetryEvent]:
        out: list[TelemetryEvent] = []
        while self._q and len(out) < max_events:
            chunk = self._q.popleft()
            room = max_events - len(out)
            if len(chunk) > room:
                self._q.appendleft(chunk[room:])
                chunk = chunk[:room]
            out += chunk
        self.size -= len(out)
        if not self._q:
            self._not_empty.clear()
        if self.size < self.max_events:
            self._not_full.set()
        return out

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._not_empty.wait(), timeout)

    def wake(self) -> None:
        """End a :meth:`wait` now (the receivers are done: nothing more will arrive)."""
        self._not_empty.set()


@dataclass
class TargetStats(StreamState):
    """One stream's counters (picklable: worker processes send them to the parent)."""

    connects: int = 0
    syncs: int = 0


@dataclass
class CollectorStats:
    received: int = 0
    written: int = 0
    findings: int = 0
    sink_retries: int = 0
    spilled: int = 0
    replayed: int = 0
    lost: int = 0
    spill_file: str = ""
    targets: dict[str, TargetStats] = field(default_factory=dict)


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path!r}: {exc.strerror}") from exc


def tls_credentials(t: TargetConfig) -> tuple[grpc.ChannelCredentials, list[tuple[str, str | int]]] | None:
    """gRPC channel credentials and options for ``t``'s TLS (None: plaintext); a file that
    cannot be read is a ConfigError naming its config field."""
    if t.tls is None:
        return None
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(t.tls.ca_file, f"targets.{t.name}.tls.ca-file"),
        private_key=_read(t.tls.key_file, f"targets.{t.name}.tls.key-file"),
        certificate_chain=_read(t.tls.cert_file, f"targets.{t.name}.tls.cert-file"),
    )
    opts: list[tuple[str, str | int]] = (
        [("grpc.ssl_target_name_override", t.tls.server_name)] if t.tls.server_name else [])
    return creds, opts


def auth_metadata(cfg: CollectorConfig, t: TargetConfig) -> tuple[tuple[str, str], ...]:
    """gNMI ``username``/``password`` metadata for ``t`` (password from the config or its env variable)."""
    if t.username is None:
        return ()
    pw = t.password
    if t.password_env is not None:
        pw = os.environ.get(t.password_env)
        if pw is None:
            raise ConfigError(f"{cfg.source}: targets.{t.name}.password-env: "
                              f"environment variable {t.password_env!r} is not set")
    if not pw:
        # The target refuses an empty password; sending "" would only fail at connect.
        src = f"environment variable {t.password_env!r}" if t.password_env else "password"
        raise ConfigError(f"{cfg.source}: targets.{t.name}: {src} is empty (user {t.username!r})")
    return (("username", t.username), ("password", pw))


def spill_path(cfg: CollectorConfig) -> Path | None:
    """``shutdown.spill-file``, else ``<config stem>.spill.jsonl`` beside a config file; None
    for configs not read from a file (library use without a spill file)."""
    if cfg.spill_file:
        return Path(cfg.spill_file)
    src = Path(cfg.source)
    if cfg.source.startswith("<") or not src.is_file():
        return None
    return src.with_name(src.stem + ".spill.jsonl")


def stale_after_s(cfg: CollectorConfig, s: SubscriptionConfig) -> float | None:
    """Seconds without an update after which a stream of ``s`` is stale (None: no rule).

    k x the interval at which the target promised to send: the sample interval, the
    heartbeat of on-change streams, or the poll interval; never less than 1 s.
    """
    if cfg.stale_after <= 0 or s.mode == "once":
        return None
    if s.mode == "poll":
        every = s.poll_interval_ns
    elif s.stream_mode == "sample":
        every = s.sample_interval_ns
    else:
        every = s.heartbeat_interval_ns
    if every <= 0:
        return None
    return max(_MIN_STALE_S, cfg.stale_after * every / 1e9)


def _with_groups(cfg: CollectorConfig) -> list[ProcessorSpec]:
    """Processor specs with aggregate groups derived from the config's inventory where needed."""
    out: list[ProcessorSpec] = []
    fabric = None
    for p in cfg.processors:
        if p.type == "aggregate" and "groups" not in p.options:
            if fabric is None:
                from fabricscope.fabric.io import read_fabric

                if cfg.inventory is None:
                    raise ConfigError(f"{cfg.source}: processors: aggregate needs groups or an inventory")
                fabric = read_fabric(cfg.inventory)
            by = str(p.options.get("by", "rail"))
            p = ProcessorSpec(p.type, {**p.options, "by": by, "groups": group_labels(fabric.devices.values(), by)})
        out.append(p)
    return out


def in_daemon_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run ``fn(*args)`` in a daemon thread; a sink write that hangs past the shutdown
    deadline must not keep the process from exiting (executor threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def body() -> None:
        try:
            r = fn(*args)
        except BaseException as exc:  # handed to the awaiting task
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(settle, False, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, True, r)

    threading.Thread(target=body, daemon=True, name="collector-sink-write").start()
    return fut


class _Conn:
    """One gRPC connection (a ``targets:`` entry); replaced whole when all its streams are stale."""

    def __init__(self, col: Collector, t: TargetConfig) -> None:
        self.col, self.t = col, t
        self.channel = col._channel(t)
        self.keys: list[str] = []
        self.old: list[grpc.aio.Channel] = []
        self._closing: set[asyncio.Task[None]] = set()

    def reset(self) -> None:
        # the old channel's calls are the stale ones, already cancelled; closing it now could
        # cancel a call another stream just opened on it, so it is closed at the end (or
        # once it is one of more than 8 replaced channels, long idle by then)
        self.old.append(self.channel)
        self.channel = self.col._channel(self.t)
        if len(self.old) > 8:
            task = asyncio.ensure_future(self.old.pop(0).close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


class Collector:
    """Run a :class:`CollectorConfig`. ``sinks``/``pipeline``/``detectors`` default to the config's.

    A long-running collector retries every failed stream (a switch being upgraded answers
    NOT_FOUND or UNAUTHENTICATED for a while); ``fail_fast=True`` (the one-shot CLI) instead
    stops on the first error that a retry cannot fix and raises it from :meth:`run`.
    ``spill`` overrides :func:`spill_path` (False: never spill, e.g. in worker processes).
    """

    def __init__(
        self,
        config: CollectorConfig,
        *,
        sinks: Sequence[Sink] | None = None,
        pipeline: Pipeline | None = None,
        detectors: DetectorSet | None = None,
        on_findings: Callable[[list[Finding]], None] | None = None,
        seed: int = 0,
        fail_fast: bool = False,
        spill: Path | bool | None = None,
        dynamic: bool = False,
    ) -> None:
        self.cfg = config
        self.fail_fast = fail_fast
        # dynamic: devices come and go while it runs (add_device / remove_device: a cluster
        # member's owned devices); it runs until stopped, even with none
        self.dynamic = dynamic
        self._stale: dict[str, float] = {}
        self._conn_of: dict[str, _Conn] = {}
        self._devices: dict[str, tuple[_Conn, list[asyncio.Task[None]]]] = {}
        self._started = asyncio.Event()
        for t in config.targets:
            self._metadata(t)  # a missing password-env fails before any sink opens a file or port
        self.stats = CollectorStats()
        self.buffer: EventBuffer | None = None
        self._rate: deque[tuple[float, int]] = deque(maxlen=64)
        self._sink_timing = selfmetrics.SinkTiming()
        self.sinks = list(sinks) if sinks is not None else [
            build_sink(s.type, s.options, self_metrics=self.metric_samples) for s in config.sinks]
        self.pipeline = pipeline or Pipeline([build_processor(p) for p in _with_groups(config)])
        if detectors is None:
            detectors = DetectorSet([build_detector(k, v) for k, v in config.detectors.items()])
            sampled = [sc for sc in config.subscriptions.values()
                       if sc.mode == "stream" and sc.stream_mode == "sample"]
            if sampled and all(sc.suppress_redundant for sc in sampled):
                # an unchanged counter is not sent: judge increases over the sample interval
                detectors.suppressed_sampling(max(sc.sample_interval_ns for sc in sampled))
        self.detectors = detectors
        self.on_findings = on_findings
        self.spill_file = spill_path(config) if spill is None or spill is True else (spill or None)
        self.stats.spill_file = str(self.spill_file or "")
        self._rng = random.Random(seed)
        self._flat = WireFlattener()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._deadline: float | None = None
        self._ratelog = selfmetrics.RateLimitedLog(log, _LOG_INTERVAL_S)
        self._marks: list[TelemetryEvent] = []
        self._calls: dict[str, grpc.aio.StreamStreamCall] = {}
        self._stale_cancel: set[str] = set()
        self._last_rx: dict[str, float] = {}
        self._waiting_first: set[str] = set()
        self._conns: list[_Conn] = []

    # ------------------------------------------------------------------ health
    def self_metrics(self) -> dict[str, Any]:
        """A plain snapshot of the collector's health (shape: :func:`selfmetrics.snapshot`)."""
        now = time.monotonic()
        self._rate.append((now, self.stats.received))
        t0, n0 = self._rate[0]
        rate = (self.stats.received - n0) / (now - t0) if now - t0 > 0.05 else 0.0
        buf = self.buffer
        return selfmetrics.snapshot(
            self.stats.targets, received=self.stats.received, written=self.stats.written,
            spilled=self.stats.spilled, buffer_events=buf.size if buf else 0,
            buffer_max=self.cfg.buffer_max_events, buffer_high_water=buf.high_water if buf else 0,
            sink=self._sink_timing, updates_per_s=rate)

    def metric_samples(self) -> list[tuple[str, str, Any, float]]:
        """:meth:`self_metrics` as Prometheus samples (for the Prometheus sink)."""
        return selfmetrics.metric_samples(self.self_metrics())

    def _mark(self, key: str, stale: bool) -> None:
        t, device, sub = key.split("/", 2)
        self._marks.append(TelemetryEvent(STALE_MARK, time.time_ns(), device,
                                          {"connection": t, "subscription": sub}, 1 if stale else 0))
        self._wake.set()

    async def _watchdog(self) -> None:
        """Stale streams -> logged, marked, reconnected; the periodic self-metrics line."""
        stale, conn_of = self._stale, self._conn_of  # devices added later join these dicts
        limits = [stale_after_s(self.cfg, s) for s in self.cfg.subscriptions.values()]
        tick = min([0.25, *(v / 4 for v in limits if v is not None)])
        every = self.cfg.stats_interval_ns / 1e9
        next_stats = time.monotonic() + every if every > 0 else None
        while not self._stop.is_set():
            await self._sleep(tick)
            now = time.monotonic()
            for key, thr in stale.items():
                st = self.stats.targets[key]
                call = self._calls.get(key)
                if call is None or st.state not in (CONNECTING, CONNECTED, STALE):
                    continue
                age = now - self._last_rx.get(key, now)  # since the last update or the call's start
                if age <= (max(thr, _FIRST_MESSAGE_S) if key in self._waiting_first else thr):
                    continue
                if st.state != STALE:
                    st.state = STALE
                    st.stale += 1
                    self._mark(key, True)
                self._ratelog.log(logging.WARNING, key, "stale",
                                  f"gnmi {key}: stale: no update for {age:.1f}s (limit {thr:.1f}s = "
                                  f"{self.cfg.stale_after:g} x interval); reconnecting", now)
                conn = conn_of[key]
                if all(self.stats.targets[k].state in (STALE, RETRYING) for k in conn.keys):
                    conn.reset()  # the whole connection is wedged (frozen target): dial again
                self._stale_cancel.add(key)
                call.cancel()
            if next_stats is not None and now >= next_stats:
                next_stats = now + every
                log.info("%s", selfmetrics.summary_line(self.self_metrics()))

    # ------------------------------------------------------------------ connection
    def _metadata(self, t: TargetConfig) -> tuple[tuple[str, str], ...]:
        return auth_metadata(self.cfg, t)

    def _channel(self, t: TargetConfig) -> grpc.aio.Channel:
        # gRPC's own subchannel reconnect backoff (1 s initial, 120 s max) would hide a target
        # that came back; align it with ours so a reconnect attempt really dials. The minimum
        # backoff is also gRPC's connect timeout, so a frozen target fails the dial quickly.
        bo_ms = max(1, self.cfg.backoff_initial_ns // 1_000_000)
        opts: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.initial_reconnect_backoff_ms", bo_ms),
            ("grpc.min_reconnect_backoff_ms", max(bo_ms, 1000)),
            ("grpc.max_reconnect_backoff_ms", max(bo_ms, self.cfg.backoff_max_ns // 1_000_000)),
        ]
        if self.cfg.keepalive_ns > 0:
            # ping a connection that has been silent this long; no answer within the timeout
            # closes it (the stream then fails UNAVAILABLE and reconnects)
            ka = self.cfg.keepalive_ns // 1_000_000
            opts += [("grpc.keepalive_time_ms", ka), ("grpc.keepalive_timeout_ms", max(1000, min(20_000, ka // 2))),
                     ("grpc.http2.max_pings_without_data", 0)]
        tls = tls_credentials(t)
        if tls is None:
            return grpc.aio.insecure_channel(t.address, options=opts)
        return grpc.aio.secure_channel(t.address, tls[0], options=opts + tls[1])

    def _request(self, name: str, s: SubscriptionConfig) -> gnmi_pb2.SubscribeRequest:
        prefix = to_proto_path(parse_path(s.prefix) if s.prefix else parse_path("/"), target=name)
        subs = [gnmi_pb2.Subscription(
            path=to_proto_path(parse_path(p)), mode=_SMODES[s.stream_mode],
            sample_interval=s.sample_interval_ns, suppress_redundant=s.suppress_redundant,
            heartbeat_interval=s.heartbeat_interval_ns) for p in s.paths]
        return gnmi_pb2.SubscribeRequest(subscribe=gnmi_pb2.SubscriptionList(
            prefix=prefix, subscription=subs, mode=_MODES[s.mode], encoding=_ENC[s.encoding],
            updates_only=s.updates_only))

    async def _requests(self, req: gnmi_pb2.SubscribeRequest, s: SubscriptionConfig) -> AsyncIterator[gnmi_pb2.SubscribeRequest]:
        yield req
        if s.mode == "poll":
            while True:
                await asyncio.sleep(s.poll_interval_ns / 1e9)
                yield gnmi_pb2.SubscribeRequest(poll=gnmi_pb2.Poll())
        else:
            await self._stop.wait()

    def _recovered(self, key: str, st: TargetStats) -> None:
        if st.state == STALE:
            self._mark(key, False)
        if st.state in (STALE, RETRYING):
            log.info("gnmi %s: receiving again", key)
        self._ratelog.reset(key, "stale")
        self._ratelog.reset(key, "rpc")
        st.state = CONNECTED

    async def _subscription(self, conn: _Conn, name: str, s: SubscriptionConfig) -> None:
        t = conn.t
        key = f"{t.name}/{name}/{s.name}"
        st = self.stats.targets[key]
        md = self._metadata(t)
        delay = self.cfg.backoff_initial_ns / 1e9
        assert self.buffer is not None
        buf = self.buffer
        flatten = self._flat.flatten
        last_rx = self._last_rx
        clock = time.monotonic
        while not self._stop.is_set():
            st.connects += 1
            if st.connects > 1:
                st.reconnects += 1
            # Responses stay bytes: WireFlattener parses them without building protobuf objects.
            subscribe = conn.channel.stream_stream(
                "/gnmi.gNMI/Subscribe",
                request_serializer=gnmi_pb2.SubscribeRequest.SerializeToString,
                response_deserializer=None,
            )
            try:
                call = subscribe(self._requests(self._request(name, s), s), metadata=md)
                self._calls[key] = call
                last_rx[key] = clock()
                self._waiting_first.add(key)
                async for resp in call:
                    last_rx[key] = clock()
                    if st.state != CONNECTED:
                        self._waiting_first.discard(key)
                        self._recovered(key, st)
                    try:
                        evs, sync = flatten(resp, default_target=name)
                    except TelemetryDecodeError as exc:
                        # counted and skipped; the stream and every other stream go on
                        st.decode_errors += 1
                        st.errors += 1
                        st.last_error = f"bad notification skipped: {exc}"
                        self._ratelog.log(logging.WARNING, key, "decode",
                                          f"gnmi {key} (paths {', '.join(s.paths)}): {st.last_error}", clock())
                        continue
                    if evs:
                        st.updates += len(evs)
                        self.stats.received += len(evs)
                        await buf.put(evs)
                        delay = self.cfg.backoff_initial_ns / 1e9  # healthy again
                    if sync:
                        st.syncs += 1
                if s.mode == "once":
                    st.state = STOPPED
                    return
                if self._stop.is_set():
                    break  # our own half-close at shutdown ended it
                st.state = RETRYING
                st.last_error = "stream ended by the target"
                self._ratelog.log(logging.WARNING, key, "rpc", f"gnmi {key}: {st.last_error}; retrying", clock())
            except grpc.aio.AioRpcError as exc:
                st.errors += 1
                st.last_error = f"{exc.code().name}: {exc.details()}"
                if self.fail_fast and exc.code() in _PERMANENT:
                    st.state = STOPPED
                    raise TransportError(st.last_error) from None
                if st.state != STALE:
                    st.state = RETRYING
                self._ratelog.log(logging.WARNING, key, "rpc",
                                  f"gnmi {key} ({t.address}): {st.last_error}; retrying with backoff up to "
                                  f"{self.cfg.backoff_max_ns / 1e9:g}s", clock())
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if key not in self._stale_cancel or (task is not None and task.cancelling()):
                    raise
                # our watchdog cancelled this call: the stream is stale; dial again below
            finally:
                self._calls.pop(key, None)
                self._stale_cancel.discard(key)
            if self._stop.is_set():
                break
            # full jitter, exponential growth, capped
            await self._sleep(self._rng.uniform(0.5, 1.0) * delay)
            delay = min(delay * 2, self.cfg.backoff_max_ns / 1e9)
        st.state = STOPPED

    async def _sleep(self, s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), s)

    # ------------------------------------------------------------------ writing
    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _write_some(self, pending: list[int], events: list[TelemetryEvent],
                    findings: list[Finding]) -> tuple[list[int], str]:
        """Write to the sinks at ``pending``; (those that failed, the first error)."""
        return write_sinks(pending, lambda i: self.sinks[i].write(events, findings), self._sink_timing)

    def _spill(self, batches: list[SpillBatch]) -> None:
        n = sum(len(b.events) for b in batches)
        if not n and not any(b.findings for b in batches):
            return
        if self.spill_file is None:
            self.stats.lost += n
            log.error("collector: shutdown deadline passed with %d events unwritten and no spill file "
                      "configured (shutdown.spill-file): they are lost", n)
            return
        try:
            append_spill(self.spill_file, batches)
        except TransportError as exc:
            self.stats.lost += n
            log.error("collector: %d events could not be written or spilled: %s", n, exc)
            return
        self.stats.spilled += n
        log.warning("collector: sinks did not take %d events by the shutdown deadline; spilled to %s "
                    "(replayed into the sinks on the next start)", n, self.spill_file)

    async def _deliver(self, events: list[TelemetryEvent], findings: list[Finding],
                       pending: list[int] | None = None) -> bool:
        """Write one batch to every sink that has not taken it, retrying with backoff; past the
        shutdown deadline, spill what is left. True when every sink took it."""
        todo = list(range(len(self.sinks))) if pending is None else [i for i in pending if i < len(self.sinks)]
        delay = self.cfg.backoff_initial_ns / 1e9
        while todo:
            if self._past_deadline():
                self._spill([SpillBatch(tuple(todo), events, findings)])
                return False
            if all(getattr(self.sinks[i], "never_blocks", False) for i in todo):
                # a sink that only queues in memory (the cluster's bus publisher): no thread per
                # write (a cluster member's hundreds of devices share one such sink)
                fut: asyncio.Future[tuple[list[int], str]] = asyncio.get_running_loop().create_future()
                fut.set_result(self._write_some(todo, events, findings))
            else:
                fut = in_daemon_thread(self._write_some, todo, events, findings)
            while not fut.done():
                # a stop() may arrive while the write runs: watch its deadline too
                if self._past_deadline():
                    log.error("collector: a sink write is still running at the shutdown deadline; its batch "
                              "is spilled and may be replayed twice if that write completes")
                    self._spill([SpillBatch(tuple(todo), events, findings)])
                    return False
                left = 0.5 if self._deadline is None else min(0.5, max(0.0, self._deadline - time.monotonic()))
                await asyncio.wait({fut}, timeout=left)
            failed, err = fut.result()
            if not failed:
                return True
            todo = failed
            self.stats.sink_retries += 1
            self._ratelog.log(logging.WARNING, "sink", "write", f"sink write failed ({err}); holding "
                              f"{len(events)} events, retrying with backoff up to {self.cfg.backoff_max_ns / 1e9:g}s",
                              time.monotonic())
            self._wake.clear()
            wait = delay if self._deadline is None else min(delay, max(0.0, self._deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            delay = min(delay * 2, self.cfg.backoff_max_ns / 1e9)
        self._ratelog.reset("sink", "write")
        return True

    async def _writer(self, receivers_done: asyncio.Event) -> None:
        assert self.buffer is not None
        buf = self.buffer
        flush = self.cfg.flush_interval_ns / 1e9
        while True:
            if buf.size < self.cfg.batch_max and not receivers_done.is_set():
                await buf.wait(flush)
            if self._past_deadline():
                self._spill_rest()
                return
            raw = buf.take(self.cfg.batch_max)
            marks, self._marks = self._marks, []
            if not raw and not marks:
                if receivers_done.is_set():
                    return
                continue
            events = self.pipeline(raw) if raw else []
            findings = self.detectors(raw) if raw else []
            if marks:
                events = [*events, *marks]
            if findings:
                self.stats.findings += len(findings)
                if self.on_findings is not None:
                    self.on_findings(findings)
            if await self._deliver(events, findings):
                self.stats.written += len(raw)

    def _spill_rest(self) -> None:
        """Past the deadline: everything still buffered goes to the spill file in one batch."""
        assert self.buffer is not None
        raw = self.buffer.take(self.buffer.size)
        marks, self._marks = self._marks, []
        events = [*(self.pipeline(raw) if raw else []), *marks]
        findings = self.detectors(raw) if raw else []
        self.stats.findings += len(findings)
        self._spill([SpillBatch(tuple(range(len(self.sinks))), events, findings)])

    async def replay_spill(self) -> int:
        """Write a previous run's spill file into the sinks; the number of events replayed.

        The file is moved aside first; batches not delivered (stopped again) go back to it.
        """
        path = self.spill_file
        if path is None:
            return 0
        work = path.with_name(path.name + ".replay")
        if path.exists():
            if work.exists():  # an earlier replay was cut short: finish it first
                prev, _ = read_spill(work)
                cur, _ = read_spill(path)
                rewrite_spill(work, prev + cur)
                path.unlink()
            else:
                os.replace(path, work)
        batches, bad = read_spill(work)
        if bad:
            log.warning("collector: spill file %s: %d damaged line(s) skipped", path, bad)
        if not batches:
            work.unlink(missing_ok=True)
            return 0
        n_all = sum(len(b.events) for b in batches)
        log.info("collector: replaying %d events from spill file %s", n_all, path)
        done = 0
        while batches:
            b = batches[0]
            if not await self._deliver(b.events, b.findings, list(b.sinks)):
                batches.pop(0)  # _deliver spilled it back to ``path``
                self._spill([SpillBatch(x.sinks, x.events, x.findings) for x in batches])
                batches = []
                break
            done += len(b.events)
            batches.pop(0)
            rewrite_spill(work, batches)
        work.unlink(missing_ok=True)
        self.stats.replayed += done
        return done

    # ------------------------------------------------------------------ run
    async def run(self, *, duration_s: float | None = None) -> CollectorStats:
        """Collect until :meth:`stop` (or ``duration_s``; ONCE-only configs end by themselves)."""
        # Up to buffer.max-events GC-tracked events are alive at once; CPython's default
        # young-generation threshold (700 allocations) then runs collections that traverse
        # them every few milliseconds: 20-25 % of the decode+detect CPU, measured with 10^6
        # events in flight. Collect the young generation every 100k allocations while the
        # collector runs (the events form no cycles), and restore the threshold after.
        old = gc.get_threshold()
        gc.set_threshold(max(old[0], 100_000), *old[1:])
        try:
            return await self._run(duration_s)
        finally:
            gc.set_threshold(*old)

    async def _run(self, duration_s: float | None) -> CollectorStats:
        self.buffer = EventBuffer(self.cfg.buffer_max_events)
        t_end = None if duration_s is None else time.monotonic() + duration_s
        await self.replay_spill()
        tasks: list[asyncio.Task[None]] = []
        for t in self.cfg.targets:
            self._metadata(t)  # fail fast on a missing password-env
            conn = _Conn(self, t)
            self._conns.append(conn)
            for name in t.names:
                tasks.extend(self._start_streams(conn, name))
        receivers_done = asyncio.Event()
        writer = asyncio.create_task(self._writer(receivers_done))
        watchdog = asyncio.create_task(self._watchdog())
        stop_wait = asyncio.ensure_future(self._stop.wait())
        self._started.set()
        try:
            while not self._stop.is_set():
                if not self.dynamic and all(tk.done() for tk in tasks):
                    break
                left = None if t_end is None else t_end - time.monotonic()
                if left is not None and left <= 0:
                    break
                if writer.done():
                    break  # the writer failed: stop and report below
                if self.fail_fast and any(tk.done() and not tk.cancelled() and tk.exception() is not None
                                          for tk in tasks):
                    break
                # every exit condition but the duration is a task ending, which wakes the wait:
                # no periodic wake-up (a cluster member runs hundreds of streams in one loop)
                await asyncio.wait([*tasks, writer, stop_wait], timeout=left,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not self._stop.is_set():
                self.stop()
            stop_wait.cancel()
            for _conn, dtasks in self._devices.values():
                tasks.extend(dtasks)
            self._devices.clear()
            for tk in (*tasks, watchdog):
                tk.cancel()
            for tk in (*tasks, watchdog):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await tk
            receivers_done.set()
            self._wake.set()
            self.buffer.wake()  # a writer waiting out flush-interval would delay the stop by it
            try:
                await writer  # drains the buffer into the sinks, or spills at the deadline
            finally:
                for conn in self._conns:
                    for ch in (conn.channel, *conn.old):
                        with contextlib.suppress(Exception):
                            await ch.close()
                self._conns = []
        for tk in tasks:
            if tk.done() and not tk.cancelled() and tk.exception() is not None:
                raise TransportError(f"collector: {tk.exception()}")
        return self.stats

    def _start_streams(self, conn: _Conn, name: str) -> list[asyncio.Task[None]]:
        """One stream task per subscription of device ``name`` on ``conn`` (registered for
        the watchdog)."""
        out = []
        for s in self.cfg.subscriptions_of(conn.t):
            key = f"{conn.t.name}/{name}/{s.name}"
            self.stats.targets.setdefault(key, TargetStats(key))
            conn.keys.append(key)
            self._conn_of[key] = conn
            thr = stale_after_s(self.cfg, s)
            if thr is not None:
                self._stale[key] = thr
            out.append(asyncio.create_task(self._subscription(conn, name, s)))
        return out

    async def add_device(self, t: TargetConfig, name: str) -> None:
        """Start streaming device ``name`` of target entry ``t`` (a ``dynamic`` collector, on
        its own loop, while :meth:`run` runs); its own connection. A no-op once stopping."""
        if not self.dynamic:
            raise ConfigError("collector: add_device needs a dynamic collector")
        await self._started.wait()
        if self._stop.is_set() or name in self._devices:
            return
        self._metadata(t)
        conn = _Conn(self, replace(t, names=(name,)))
        self._conns.append(conn)
        self._devices[name] = (conn, self._start_streams(conn, name))

    async def remove_device(self, name: str) -> None:
        """Stop streaming ``name``: its streams are cancelled and awaited, its connection
        closed. What it delivered stays in the buffer for the writer (nothing is dropped)."""
        item = self._devices.pop(name, None)
        if item is None:
            return
        conn, dtasks = item
        for tk in dtasks:
            tk.cancel()
        for tk in dtasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await tk
        for key in conn.keys:
            self._stale.pop(key, None)
            self._conn_of.pop(key, None)
            self._calls.pop(key, None)
            self._last_rx.pop(key, None)
            self._waiting_first.discard(key)
            self.stats.targets.pop(key, None)
        with contextlib.suppress(ValueError):
            self._conns.remove(conn)
        for ch in (conn.channel, *conn.old):
            with contextlib.suppress(Exception):
                await ch.close()
        if self.buffer is not None:
            self.buffer.wake()  # hand what it delivered to the sinks now, not at the next flush

    def devices(self) -> list[str]:
        """The devices a dynamic collector streams now."""
        return list(self._devices)

    def stop(self, *, now: bool = False) -> None:
        """Stop: receivers end, the writer drains until the shutdown deadline, then spills.

        A second call (a second SIGTERM / Ctrl-C), or ``now=True``, makes the deadline now.
        """
        t = time.monotonic()
        if self._deadline is None and not now:
            self._deadline = t + self.cfg.shutdown_deadline_ns / 1e9
        elif self._stop.is_set() or now:
            self._deadline = t
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception as exc:  # a sink that cannot flush on close (disk full) is reported, not raised
                log.error("collector: closing sink %s failed: %s", type(s).__name__, exc)


# ---------------------------------------------------------------- one-shot client (CLI)
async def gnmi_get(
    address: str,
    target: str,
    paths: Sequence[str],
    *,
    username: str | None = None,
    password: str | None = None,
    tls_ca: str | None = None,
    server_name: str | None = None,
    encoding: str = "proto",
    timeout_s: float = 10.0,
) -> list[TelemetryEvent]:
    """One Get against ``address`` for ``prefix.target = target``; gRPC errors -> TransportError."""
    from fabricscope.telemetry.codec import Flattener
    from fabricscope.telemetry.config import TLSConfig

    tcfg = TargetConfig("cli", address, (target,), username, password,
                        tls=TLSConfig(ca_file=tls_ca, server_name=server_name) if tls_ca else None)
    col = Collector(CollectorConfig((tcfg,), {}), sinks=[], detectors=DetectorSet([]))
    req = gnmi_pb2.GetRequest(prefix=gnmi_pb2.Path(target=target),
                              path=[to_proto_path(parse_path(p, source="path")) for p in paths],
                              encoding=_ENC.get(encoding, gnmi_pb2.PROTO))
    ch = col._channel(tcfg)
    try:
        stub = ch.unary_unary("/gnmi.gNMI/Get", request_serializer=gnmi_pb2.GetRequest.SerializeToString,
                              response_deserializer=gnmi_pb2.GetResponse.FromString)
        resp = await stub(req, metadata=col._metadata(tcfg), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        raise TransportError(f"gnmi get {address} target {target!r}: {exc.code().name}: {exc.details()}") from exc
    finally:
        await ch.close()
    fl = Flattener()
    out: list[TelemetryEvent] = []
    for n in resp.notification:
        out += fl.flatten(n, default_target=target)
    return out


_SUBSCRIBE_FLAGS = {
    "targets.cli.address": "ADDRESS", "targets.cli.names": "--target",
    "subscriptions.cli.paths": "PATH", "subscriptions.cli.mode": "--mode",
    "subscriptions.cli.stream-mode": "--stream-mode",
    "subscriptions.cli.sample-interval": "--interval",
    "subscriptions.cli.poll-interval": "--interval",
    "subscriptions.cli.heartbeat-interval": "--heartbeat",
    "subscriptions.cli.encoding": "--encoding",
}


async def gnmi_subscribe(
    address: str,
    target: str,
    paths: Sequence[str],
    *,
    on_events: Callable[[list[TelemetryEvent]], None],
    mode: str = "stream",
    stream_mode: str = "sample",
    interval_ns: int = 1_000_000_000,
    heartbeat_ns: int = 0,
    updates_only: bool = False,
    suppress_redundant: bool = False,
    encoding: str = "proto",
    username: str | None = None,
    password: str | None = None,
    tls_ca: str | None = None,
    server_name: str | None = None,
    duration_s: float | None = None,
) -> CollectorStats:
    """Subscribe and hand every batch of events to ``on_events`` (used by ``gnmi subscribe``)."""
    from fabricscope.telemetry.config import TLSConfig, parse_config

    # Errors name the flag the user typed, not the internal config built from the flags.

    cfg = parse_config({
        "targets": {"cli": {"address": address, "names": [target]}},
        "subscriptions": {"cli": {
            "paths": list(paths), "mode": mode, "stream-mode": stream_mode,
            "sample-interval": interval_ns / 1e9, "heartbeat-interval": heartbeat_ns / 1e9,
            "updates-only": updates_only, "suppress-redundant": suppress_redundant, "encoding": encoding,
            "poll-interval": interval_ns / 1e9}},
        "buffer": {"flush-interval": "50ms"},
    }, source="gnmi subscribe", labels=_SUBSCRIBE_FLAGS)
    t = cfg.targets[0]
    tls = TLSConfig(ca_file=tls_ca, server_name=server_name) if tls_ca else None
    cfg = CollectorConfig((TargetConfig(t.name, t.address, t.names, username, password, tls=tls),),
                          cfg.subscriptions, flush_interval_ns=cfg.flush_interval_ns)

    class _Cb:
        def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
            on_events(list(events))

        def close(self) -> None:
            pass

    col = Collector(cfg, sinks=[_Cb()], detectors=DetectorSet([]), fail_fast=True)
    try:
        stats = await col.run(duration_s=duration_s)
    except TransportError as exc:
        raise TransportError(f"gnmi subscribe {address} target {target!r}: "
                             f"{str(exc).removeprefix('collector: ')}") from None
    errs = [s.last_error for s in stats.targets.values() if s.errors and not s.updates]
    if errs:
        raise TransportError(f"gnmi subscribe {address} target {target!r}: {errs[0]}")
    return stats
