"""A gNMI target (server) over grpc.aio serving every device of a telemetry source by prefix.target.

RPCs: Capabilities, Get, Subscribe (ONCE, POLL, STREAM with SAMPLE on a fixed schedule,
ON_CHANGE with heartbeat, TARGET_DEFINED, suppress_redundant, updates_only, sync_response).
Errors follow the gNMI spec's status codes: INVALID_ARGUMENT for malformed requests/paths,
NOT_FOUND for unknown targets or paths that match nothing, UNAUTHENTICATED for missing or
wrong ``username``/``password`` metadata. Binds 127.0.0.1 by default; TLS optional.
Passwords are compared in constant time and never logged.

The source is anything with ``targets() / leaves(target) / read(leaves) / sync()`` — the twin
(:class:`fabricscope.twin.state.Twin`) in practice; this module never imports the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from gnmi_pb import gnmi_pb2

from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.telemetry.codec import (
    ValueEncoding,
    encode_notification,
    encode_sync_response,
    from_proto_path,
    path_bytes,
    prefix_bytes,
    to_proto_path,
    typed_value,
)
from fabricscope.telemetry.paths import GPath, join, match, parse_path

log = logging.getLogger(__name__)

Value = int | float | str | bool
SUPPORTED_MODELS = (
    ("openconfig-interfaces", "OpenConfig working group", "3.0.0"),
    ("openconfig-if-ethernet", "OpenConfig working group", "2.13.0"),
    ("openconfig-qos", "OpenConfig working group", "0.11.0"),
    ("openconfig-platform", "OpenConfig working group", "0.24.0"),
    ("openconfig-platform-transceiver", "OpenConfig working group", "0.14.0"),
    ("fabricscope-native", "fabricscope", "0.1.0"),
)
DEFAULT_SAMPLE_NS = 1_000_000_000
MIN_SAMPLE_NS = 1_000_000
# TARGET_DEFINED: state that changes rarely goes ON_CHANGE, counters are sampled.
_ON_CHANGE_HINTS = ("oper-status", "watermark", "/components/")


class Leaf(Protocol):
    @property
    def path(self) -> str: ...


class TelemetrySource(Protocol):
    """What the target serves: the twin satisfies this structurally."""

    def targets(self) -> Sequence[str]: ...
    def leaves(self, target: str) -> Sequence[Leaf]: ...
    def read(self, leaves: Sequence[Any]) -> Sequence[Value]: ...
    def sync(self) -> int: ...


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)  # never printed

    def check(self, md: dict[str, str]) -> bool:
        return hmac.compare_digest(md.get("username", ""), self.username) and hmac.compare_digest(
            md.get("password", ""), self.password
        )


@dataclass(frozen=True)
class TLSFiles:
    cert_pem: bytes
    key_pem: bytes = field(repr=False)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, msg: str) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg


@dataclass
class _Leaves:
    """Leaves of one target, with their parsed paths and serialized path bytes."""

    leaves: list[Leaf]
    paths: list[GPath]
    wire: list[bytes]
    match_cache: dict[str, list[int]] = field(default_factory=dict)


class GnmiTarget:
    """Serve ``source`` over gNMI on ``address`` (``host:port``; port 0 picks a free one).

    ``encoding``: ``"request"`` honours the request (PROTO -> typed values, JSON/JSON_IETF ->
    JSON_IETF), ``"typed"`` or ``"json_ietf"`` force one (JSON_IETF is the fallback for clients
    such as pygnmi 0.8.15 that drop ``double_val``).
    """

    def __init__(
        self,
        source: TelemetrySource,
        *,
        address: str = "127.0.0.1:0",
        credentials: Credentials | None = None,
        tls: TLSFiles | None = None,
        encoding: str = "request",
        on_change_check_ns: int = 100_000_000,
    ) -> None:
        if encoding not in ("request", "typed", "json_ietf"):
            raise ConfigError(f"gnmi target: encoding: expected request|typed|json_ietf, got {encoding!r}")
        self.source = source
        self.address = address
        self.credentials = credentials
        self.tls = tls
        self.encoding = encoding
        self.on_change_check_ns = on_change_check_ns
        self._targets = set(source.targets())
        self._leaves: dict[str, _Leaves] = {}
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self.bytes_sent = 0
        self.updates_sent = 0
        self._last_sync = -1.0
        self._ts = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_send_message_length", 64 << 20)]
        )
        handlers = {
            "Capabilities": grpc.unary_unary_rpc_method_handler(
                self._capabilities,
                request_deserializer=gnmi_pb2.CapabilityRequest.FromString,
                response_serializer=gnmi_pb2.CapabilityResponse.SerializeToString,
            ),
            "Get": grpc.unary_unary_rpc_method_handler(
                self._get,
                request_deserializer=gnmi_pb2.GetRequest.FromString,
                response_serializer=gnmi_pb2.GetResponse.SerializeToString,
            ),
            "Set": grpc.unary_unary_rpc_method_handler(
                self._set,
                request_deserializer=gnmi_pb2.SetRequest.FromString,
                response_serializer=gnmi_pb2.SetResponse.SerializeToString,
            ),
            # responses are pre-serialized bytes (codec.encode_notification)
            "Subscribe": grpc.stream_stream_rpc_method_handler(
                self._subscribe,
                request_deserializer=gnmi_pb2.SubscribeRequest.FromString,
                response_serializer=None,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("gnmi.gNMI", handlers),))
        host = self.address.rsplit(":", 1)[0]
        try:
            if self.tls is not None:
                creds = grpc.ssl_server_credentials([(self.tls.key_pem, self.tls.cert_pem)])
                self.port = server.add_secure_port(self.address, creds)
            else:
                self.port = server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise FabricscopeError(f"gnmi target: cannot bind {self.address}: {exc}") from exc
        if self.port == 0:
            raise FabricscopeError(f"gnmi target: cannot bind {self.address}")
        self.bound = f"{host}:{self.port}"
        await server.start()
        self._server = server
        log.info("gNMI target serving %d devices on %s (tls=%s)", len(self._targets), self.bound, self.tls is not None)
        return self.port

    async def stop(self, grace: float | None = 0.2) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    # ------------------------------------------------------------------ helpers
    def _auth(self, context: grpc.aio.ServicerContext) -> None:
        if self.credentials is None:
            return
        md = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        if not self.credentials.check(md):
            # the user name is safe to echo back; the password never is
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED,
                         f"authentication failed for user {md.get('username', '')!r}")

    def _target_leaves(self, target: str) -> _Leaves:
        if not target:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         "prefix.target: required (this target serves many devices)")
        if target not in self._targets:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"prefix.target: unknown target {target!r}")
        tl = self._leaves.get(target)
        if tl is None:
            leaves = list(self.source.leaves(target))
            paths = [parse_path(lf.path) for lf in leaves]
            tl = _Leaves(leaves, paths, [path_bytes(p) for p in paths])
            self._leaves[target] = tl
        return tl

    def _resolve(self, target: str, prefix: GPath, path: gnmi_pb2.Path, what: str) -> tuple[_Leaves, list[int]]:
        tl = self._target_leaves(target)
        try:
            full = join(prefix, from_proto_path(path, source=what))
        except FabricscopeError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        key = str(full)
        idx = tl.match_cache.get(key)
        if idx is None:
            idx = [i for i, p in enumerate(tl.paths) if match(full, p)]
            tl.match_cache[key] = idx
        if not idx:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"{what}: no data at {key} on target {target!r}")
        return tl, idx

    def _encoding(self, requested: int) -> ValueEncoding:
        if self.encoding == "typed":
            return "typed"
        if self.encoding == "json_ietf":
            return "json_ietf"
        if requested == gnmi_pb2.PROTO:
            return "typed"
        if requested in (gnmi_pb2.JSON, gnmi_pb2.JSON_IETF):
            return "json_ietf"
        raise _Abort(grpc.StatusCode.UNIMPLEMENTED,
                     f"encoding: {gnmi_pb2.Encoding.Name(requested)} not supported; use PROTO or JSON_IETF")

    def _sync(self) -> int:
        # One source step per millisecond of wall time is plenty; many subscriptions
        # falling due together share it.
        now = time.monotonic()
        if now - self._last_sync >= 0.001:
            self._ts = self.source.sync()
            self._last_sync = now
        return self._ts

    # ------------------------------------------------------------------ RPCs
    async def _capabilities(self, request: gnmi_pb2.CapabilityRequest, context: grpc.aio.ServicerContext) -> gnmi_pb2.CapabilityResponse:
        try:
            self._auth(context)
        except _Abort as a:
            await context.abort(a.code, a.msg)
        return gnmi_pb2.CapabilityResponse(
            supported_models=[gnmi_pb2.ModelData(name=n, organization=o, version=v) for n, o, v in SUPPORTED_MODELS],
            supported_encodings=[gnmi_pb2.JSON, gnmi_pb2.JSON_IETF, gnmi_pb2.PROTO],
            gNMI_version="0.10.0",
        )

    async def _set(self, request: gnmi_pb2.SetRequest, context: grpc.aio.ServicerContext) -> gnmi_pb2.SetResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Set: the twin is read-only")
        raise AssertionError("unreachable")

    async def _get(self, request: gnmi_pb2.GetRequest, context: grpc.aio.ServicerContext) -> gnmi_pb2.GetResponse:
        try:
            self._auth(context)
            enc = self._encoding(request.encoding)
            prefix = from_proto_path(request.prefix, source="prefix")
            target = request.prefix.target
            if not request.path:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "path: at least one path is required")
            if request.type == gnmi_pb2.GetRequest.CONFIG:
                # every leaf served is operational state (counters, readings, oper-status):
                # ALL, STATE and OPERATIONAL return it, CONFIG has nothing to return
                raise _Abort(grpc.StatusCode.NOT_FOUND,
                             "type: CONFIG: this target serves operational state only (no config leaves)")
            ts = self._sync()
            notes = []
            for i, p in enumerate(request.path):
                tl, idx = self._resolve(target, prefix, p, f"path[{i}]")
                values = self.source.read([tl.leaves[j] for j in idx])
                notes.append(gnmi_pb2.Notification(
                    timestamp=ts,
                    prefix=gnmi_pb2.Path(target=target),
                    update=[gnmi_pb2.Update(path=to_proto_path(tl.paths[j]), val=typed_value(v, enc))
                            for j, v in zip(idx, values, strict=True)],
                ))
            return gnmi_pb2.GetResponse(notification=notes)
        except _Abort as a:
            await context.abort(a.code, a.msg)
            raise AssertionError("unreachable") from None
        except FabricscopeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from None

    async def _subscribe(self, requests: AsyncIterator[gnmi_pb2.SubscribeRequest], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        try:
            self._auth(context)
            try:
                first = await anext(aiter(requests))
            except StopAsyncIteration:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "Subscribe: empty request stream") from None
            if not first.HasField("subscribe"):
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "Subscribe: first request must carry 'subscribe'")
            sess = _Session(self, first.subscribe)
        except _Abort as a:
            await context.abort(a.code, a.msg)
            return
        except FabricscopeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        try:
            async for msg in sess.run(requests):
                self.bytes_sent += len(msg)
                yield msg
        except _Abort as a:
            await context.abort(a.code, a.msg)


@dataclass
class _Sub:
    """One resolved subscription: leaves, mode and schedule."""

    leaves: list[Leaf]
    wire: list[bytes]
    mode: int  # SAMPLE / ON_CHANGE
    interval_ns: int
    heartbeat_ns: int
    suppress: bool
    next_due: float = 0.0
    next_heartbeat: float = 0.0
    last: Sequence[Value | None] = ()


class _Session:
    """State of one Subscribe RPC."""

    def __init__(self, tgt: GnmiTarget, sl: gnmi_pb2.SubscriptionList) -> None:
        self.tgt = tgt
        self.sl = sl
        self.enc = tgt._encoding(sl.encoding)
        self.target = sl.prefix.target
        self.prefix_wire = prefix_bytes(self.target)
        prefix = from_proto_path(sl.prefix, source="subscribe.prefix")
        if not sl.subscription:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "subscribe.subscription: at least one is required")
        self.subs: list[_Sub] = []
        for i, s in enumerate(sl.subscription):
            tl, idx = tgt._resolve(self.target, prefix, s.path, f"subscribe.subscription[{i}].path")
            interval = int(s.sample_interval) or DEFAULT_SAMPLE_NS
            if interval < MIN_SAMPLE_NS:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                             f"subscription[{i}].sample_interval: {s.sample_interval} ns is below the minimum {MIN_SAMPLE_NS} ns")
            if s.mode == gnmi_pb2.TARGET_DEFINED:
                on = [j for j in idx if any(h in str(tl.paths[j]) for h in _ON_CHANGE_HINTS)]
                smp = [j for j in idx if j not in set(on)]
                groups = [(gnmi_pb2.ON_CHANGE, on), (gnmi_pb2.SAMPLE, smp)]
            else:
                groups = [(s.mode, idx)]
            for mode, ids in groups:
                if ids:
                    self.subs.append(_Sub(
                        [tl.leaves[j] for j in ids], [tl.wire[j] for j in ids], mode,
                        tgt.on_change_check_ns if mode == gnmi_pb2.ON_CHANGE else interval,
                        int(s.heartbeat_interval), s.suppress_redundant,
                    ))

    def _encode(self, ts: int, pairs: list[tuple[bytes, Value]]) -> list[bytes]:
        # Bound message size: ~2k updates per notification keeps every message far below
        # gRPC's 4 MiB default receive limit.
        out = []
        for k in range(0, len(pairs), 2000):
            out.append(encode_notification(ts, self.prefix_wire, pairs[k : k + 2000], self.enc))
        self.tgt.updates_sent += len(pairs)
        return out

    def _full(self, ts: int) -> list[bytes]:
        out: list[bytes] = []
        for s in self.subs:
            vals = list(self.tgt.source.read(s.leaves))
            s.last = list(vals)
            out += self._encode(ts, list(zip(s.wire, vals, strict=True)))
        return out

    async def run(self, requests: AsyncIterator[gnmi_pb2.SubscribeRequest]) -> AsyncIterator[bytes]:
        mode = self.sl.mode
        updates_only = self.sl.updates_only
        ts = self.tgt._sync()
        if mode == gnmi_pb2.SubscriptionList.ONCE:
            if not updates_only:
                for m in self._full(ts):
                    yield m
            yield encode_sync_response()
            return
        if mode == gnmi_pb2.SubscriptionList.POLL:
            if not updates_only:
                for m in self._full(ts):
                    yield m
            yield encode_sync_response()
            async for req in requests:
                if not req.HasField("poll"):
                    raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "POLL mode: only 'poll' requests may follow")
                for m in self._full(self.tgt._sync()):
                    yield m
                yield encode_sync_response()
            return
        # STREAM
        if updates_only:
            for s in self.subs:
                s.last = list(self.tgt.source.read(s.leaves))
        else:
            for m in self._full(ts):
                yield m
        yield encode_sync_response()
        loop = asyncio.get_running_loop()
        start = loop.time()
        for s in self.subs:
            s.next_due = start + s.interval_ns / 1e9
            s.next_heartbeat = start + s.heartbeat_ns / 1e9 if s.heartbeat_ns else float("inf")
        # Drain the request stream in the background so a client half-close is noticed.
        drain = asyncio.ensure_future(_drain(requests))
        try:
            while True:
                due = min(s.next_due for s in self.subs)
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                now = loop.time()
                ts = self.tgt._sync()
                for s in self.subs:
                    if s.next_due > now:
                        continue
                    # fixed schedule: the k-th sample is due at start + k*interval (no drift)
                    missed = int((now - s.next_due) * 1e9 // s.interval_ns)
                    s.next_due += (missed + 1) * s.interval_ns / 1e9
                    heartbeat = now >= s.next_heartbeat
                    if heartbeat:
                        s.next_heartbeat = now + s.heartbeat_ns / 1e9
                    vals: list[Value] = list(self.tgt.source.read(s.leaves))
                    if s.mode == gnmi_pb2.ON_CHANGE or (s.suppress and not heartbeat):
                        pairs = [(w, v) for w, v, o in zip(s.wire, vals, s.last, strict=True) if v != o]
                        if heartbeat:
                            pairs = list(zip(s.wire, vals, strict=True))
                    else:
                        pairs = list(zip(s.wire, vals, strict=True))
                    s.last = vals
                    if pairs:
                        for m in self._encode(ts, pairs):
                            yield m
        finally:
            drain.cancel()
            with contextlib.suppress(BaseException):
                await drain


async def _drain(requests: AsyncIterator[gnmi_pb2.SubscribeRequest]) -> None:
    async for _ in requests:
        pass
