"""The gNMI collector: many targets over grpc.aio -> bounded buffer -> processors/detectors -> sinks.

* one Subscribe RPC per (device name, subscription), each reconnecting with exponential
  backoff and full jitter (AWS architecture blog, "Exponential Backoff And Jitter") after the
  target goes away; the backoff resets once a stream delivers data again;
* a bounded buffer between receivers and the writer: when it is full, receivers stop reading
  (gRPC flow control pushes back on the target) instead of dropping;
* the writer takes batches, runs the pure pipeline and detectors once, and retries sinks
  that fail (store outage) with the same backoff, holding the batch — nothing buffered is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from gnmi_pb import gnmi_pb2

from fabricscope.model.errors import ConfigError, FabricscopeError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.codec import WireFlattener, to_proto_path
from fabricscope.telemetry.config import CollectorConfig, SubscriptionConfig, TargetConfig
from fabricscope.telemetry.detectors import DetectorSet, build_detector
from fabricscope.telemetry.paths import parse_path
from fabricscope.telemetry.processors import Pipeline, ProcessorSpec, build_processor, group_labels
from fabricscope.telemetry.sinks import Sink, build_sink

log = logging.getLogger(__name__)

_MODES = {"once": gnmi_pb2.SubscriptionList.ONCE, "poll": gnmi_pb2.SubscriptionList.POLL,
          "stream": gnmi_pb2.SubscriptionList.STREAM}
_SMODES = {"sample": gnmi_pb2.SAMPLE, "on-change": gnmi_pb2.ON_CHANGE, "target-defined": gnmi_pb2.TARGET_DEFINED}
_ENC = {"proto": gnmi_pb2.PROTO, "json_ietf": gnmi_pb2.JSON_IETF}
# Status codes that a retry cannot fix (bad request, bad credentials, unknown target/path).
_PERMANENT = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                        grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.UNIMPLEMENTED})


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


@dataclass
class TargetStats:
    name: str
    connects: int = 0
    errors: int = 0
    updates: int = 0
    syncs: int = 0
    last_error: str = ""


@dataclass
class CollectorStats:
    received: int = 0
    written: int = 0
    findings: int = 0
    sink_retries: int = 0
    targets: dict[str, TargetStats] = field(default_factory=dict)


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path!r}: {exc.strerror}") from exc


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
    return (("username", t.username), ("password", pw or ""))


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


class Collector:
    """Run a :class:`CollectorConfig`. ``sinks``/``pipeline``/``detectors`` default to the config's.

    A long-running collector retries every failed stream (a switch being upgraded answers
    NOT_FOUND or UNAUTHENTICATED for a while); ``fail_fast=True`` (the one-shot CLI) instead
    stops on the first error that a retry cannot fix and raises it from :meth:`run`.
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
    ) -> None:
        self.cfg = config
        self.fail_fast = fail_fast
        for t in config.targets:
            self._metadata(t)  # a missing password-env fails before any sink opens a file or port
        self.sinks = list(sinks) if sinks is not None else [build_sink(s.type, s.options) for s in config.sinks]
        self.pipeline = pipeline or Pipeline([build_processor(p) for p in _with_groups(config)])
        self.detectors = detectors if detectors is not None else DetectorSet(
            [build_detector(k, v) for k, v in config.detectors.items()])
        self.on_findings = on_findings
        self.stats = CollectorStats()
        self._rng = random.Random(seed)
        self._flat = WireFlattener()
        self.buffer: EventBuffer | None = None
        self._stop = asyncio.Event()
        self._done_once = 0

    # ------------------------------------------------------------------ connection
    def _metadata(self, t: TargetConfig) -> tuple[tuple[str, str], ...]:
        return auth_metadata(self.cfg, t)

    def _channel(self, t: TargetConfig) -> grpc.aio.Channel:
        # gRPC's own subchannel reconnect backoff (1 s initial, 120 s max) would hide a target
        # that came back; align it with ours so a reconnect attempt really dials.
        bo_ms = max(1, self.cfg.backoff_initial_ns // 1_000_000)
        opts: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.initial_reconnect_backoff_ms", bo_ms),
            ("grpc.min_reconnect_backoff_ms", bo_ms),
            ("grpc.max_reconnect_backoff_ms", max(bo_ms, self.cfg.backoff_max_ns // 1_000_000)),
        ]
        if t.tls is None:
            return grpc.aio.insecure_channel(t.address, options=opts)
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(t.tls.ca_file, f"targets.{t.name}.tls.ca-file"),
            private_key=_read(t.tls.key_file, f"targets.{t.name}.tls.key-file"),
            certificate_chain=_read(t.tls.cert_file, f"targets.{t.name}.tls.cert-file"),
        )
        if t.tls.server_name:
            opts.append(("grpc.ssl_target_name_override", t.tls.server_name))
        return grpc.aio.secure_channel(t.address, creds, options=opts)

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

    async def _subscription(self, t: TargetConfig, ch: grpc.aio.Channel, name: str, s: SubscriptionConfig) -> None:
        key = f"{t.name}/{name}/{s.name}"
        st = self.stats.targets.setdefault(key, TargetStats(key))
        md = self._metadata(t)
        # Responses stay bytes: WireFlattener parses them without building protobuf objects.
        subscribe = ch.stream_stream(
            "/gnmi.gNMI/Subscribe",
            request_serializer=gnmi_pb2.SubscribeRequest.SerializeToString,
            response_deserializer=None,
        )
        delay = self.cfg.backoff_initial_ns / 1e9
        assert self.buffer is not None
        buf = self.buffer
        flatten = self._flat.flatten
        while not self._stop.is_set():
            st.connects += 1
            try:
                call = subscribe(self._requests(self._request(name, s), s), metadata=md)
                async for resp in call:
                    try:
                        evs, sync = flatten(resp, default_target=name)
                    except (ValueError, IndexError, UnicodeDecodeError, FabricscopeError) as exc:
                        # one malformed notification (or a target-side error message) is
                        # counted and skipped; the stream and every other stream go on
                        st.errors += 1
                        st.last_error = f"bad notification skipped: {exc}"
                        log.warning("gnmi %s: %s", key, st.last_error)
                        continue
                    if evs:
                        st.updates += len(evs)
                        self.stats.received += len(evs)
                        await buf.put(evs)
                        delay = self.cfg.backoff_initial_ns / 1e9  # healthy again
                    if sync:
                        st.syncs += 1
                if s.mode == "once":
                    return
            except grpc.aio.AioRpcError as exc:
                st.errors += 1
                st.last_error = f"{exc.code().name}: {exc.details()}"
                if self.fail_fast and exc.code() in _PERMANENT:
                    raise TransportError(st.last_error) from None
                log.warning("gnmi %s: %s; retrying in %.1fs", key, st.last_error, delay)
            except asyncio.CancelledError:
                raise
            if self._stop.is_set():
                return
            # full jitter, exponential growth, capped
            await self._sleep(self._rng.uniform(0.5, 1.0) * delay)
            delay = min(delay * 2, self.cfg.backoff_max_ns / 1e9)

    async def _sleep(self, s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), s)

    # ------------------------------------------------------------------ writing
    def _write(self, events: list[TelemetryEvent], findings: list[Finding]) -> None:
        for sink in self.sinks:
            sink.write(events, findings)

    async def _writer(self) -> None:
        assert self.buffer is not None
        buf = self.buffer
        flush = self.cfg.flush_interval_ns / 1e9
        while True:
            if buf.size < self.cfg.batch_max:
                await buf.wait(flush)
            raw = buf.take(self.cfg.batch_max)
            if not raw:
                if self._stop.is_set():
                    return
                continue
            events = self.pipeline(raw)
            findings = self.detectors(raw)
            if findings:
                self.stats.findings += len(findings)
                if self.on_findings is not None:
                    self.on_findings(findings)
            delay = self.cfg.backoff_initial_ns / 1e9
            while True:
                try:
                    await asyncio.to_thread(self._write, events, findings)
                    break
                except TransportError as exc:
                    # keep the batch; the buffer keeps filling (then pushes back)
                    self.stats.sink_retries += 1
                    log.warning("sink write failed (%s); retrying in %.1fs", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.cfg.backoff_max_ns / 1e9)
            self.stats.written += len(raw)

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
        self._stop = asyncio.Event()
        channels: list[grpc.aio.Channel] = []
        tasks: list[asyncio.Task[None]] = []
        for t in self.cfg.targets:
            self._metadata(t)  # fail fast on a missing password-env
            ch = self._channel(t)
            channels.append(ch)
            for name in t.names:
                for s in self.cfg.subscriptions_of(t):
                    tasks.append(asyncio.create_task(self._subscription(t, ch, name, s)))
        writer = asyncio.create_task(self._writer())
        t_end = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self._stop.is_set():
                if all(tk.done() for tk in tasks):
                    break
                left = None if t_end is None else t_end - time.monotonic()
                if left is not None and left <= 0:
                    break
                if writer.done():
                    break  # the writer failed: stop and report below
                if self.fail_fast and any(tk.done() and not tk.cancelled() and tk.exception() is not None
                                          for tk in tasks):
                    break
                await asyncio.wait([*tasks, writer, asyncio.ensure_future(self._stop.wait())],
                                   timeout=min(left, 0.5) if left is not None else 0.5,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._stop.set()
            for tk in tasks:
                tk.cancel()
            for tk in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await tk
            try:
                await writer  # drains the buffer: everything received is written (or raises)
            finally:
                for ch in channels:
                    await ch.close()
        for tk in tasks:
            if tk.done() and not tk.cancelled() and tk.exception() is not None:
                raise TransportError(f"collector: {tk.exception()}")
        return self.stats

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        for s in self.sinks:
            s.close()


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

    cfg = parse_config({
        "targets": {"cli": {"address": address, "names": [target]}},
        "subscriptions": {"cli": {
            "paths": list(paths), "mode": mode, "stream-mode": stream_mode,
            "sample-interval": interval_ns / 1e9, "heartbeat-interval": heartbeat_ns / 1e9,
            "updates-only": updates_only, "suppress-redundant": suppress_redundant, "encoding": encoding,
            "poll-interval": interval_ns / 1e9}},
        "buffer": {"flush-interval": "50ms"},
    }, source="gnmi subscribe")
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
