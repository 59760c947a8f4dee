"""A gNMI target (server) over grpc.aio serving every device of a telemetry source by prefix.target.

RPCs: Capabilities, Get, Subscribe (ONCE, POLL, STREAM with SAMPLE on a fixed schedule,
ON_CHANGE with heartbeat, TARGET_DEFINED, suppress_redundant, updates_only, sync_response).
Errors follow the gNMI spec's status codes: INVALID_ARGUMENT for malformed requests/paths,
NOT_FOUND for unknown targets or paths that match nothing, UNAUTHENTICATED for missing or
wrong ``username``/``password`` metadata, RESOURCE_EXHAUSTED when a client exceeds its
session limit. Binds 127.0.0.1 by default; TLS optional, client certificates (mTLS) on request.
Passwords are compared in constant time and never logged; failed logins are logged (user,
peer) and throttled per client host (:mod:`fabricscope.telemetry.auth`). Every request and
cache is bounded (:class:`~fabricscope.telemetry.limits.TargetLimits`): a hostile client gets
an error, the other subscribers keep their schedule.

The source is anything with ``targets() / leaves(target) / read(leaves) / sync()`` — the twin
(:class:`fabricscope.twin.state.Twin`) in practice; this module never imports the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from gnmi_pb import gnmi_pb2

from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.telemetry.auth import LoginThrottle
from fabricscope.telemetry.codec import (
    ValueEncoding,
    decode_value,
    encode_notification,
    encode_sync_response,
    from_proto_path,
    path_bytes,
    prefix_bytes,
    to_proto_path,
    typed_value,
)
from fabricscope.telemetry.limits import BoundedCache, TargetLimits
from fabricscope.telemetry.paths import GPath, format_path, join, match, parse_path

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
# gNMI: an empty origin means "openconfig"; the twin serves nothing under any other origin,
# so a path naming another origin is refused instead of (wrongly) matching every leaf.
SERVED_ORIGINS = ("", "openconfig")


class Leaf(Protocol):
    @property
    def path(self) -> str: ...


class Configurable(Protocol):
    """A source that accepts configuration through gNMI Set (optional: the twin does)."""

    def set_config(self, target: str, path: str, value: Value, *, apply: bool = True) -> str:
        """Validate (``apply`` False) or apply one leaf; returns what changed; raises
        :class:`~fabricscope.model.errors.ConfigError` naming the path when it cannot."""
        ...


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

    def __post_init__(self) -> None:
        # an empty password would admit anyone who sends the user name: refuse, don't serve
        if not self.username:
            raise ConfigError("gnmi target: credentials: username: must not be empty")
        if not self.password:
            raise ConfigError(f"gnmi target: credentials: password for user {self.username!r}: must not be empty")

    def check(self, md: dict[str, str]) -> bool:
        # Bytes, not str: compare_digest refuses non-ASCII str (a UTF-8 password would fail
        # every RPC); both compared always, so the time says nothing about which was wrong.
        user_ok = hmac.compare_digest(md.get("username", "").encode(), self.username.encode())
        pw_ok = hmac.compare_digest(md.get("password", "").encode(), self.password.encode())
        return user_ok and pw_ok


@dataclass(frozen=True)
class TLSFiles:
    """Server certificate and key (PEM); ``client_ca_pem`` set: clients must present a
    certificate signed by it (mutual TLS)."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    client_ca_pem: bytes | None = None

    def check(self, where: str = "gnmi target: tls") -> None:
        """Parse the PEMs with the ``ssl`` module; raise ConfigError saying which one is bad.

        gRPC only says "cannot bind" for a bad certificate or key, which sends people
        looking for a port conflict.
        """
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_verify_locations(cadata=self.cert_pem.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"{where}: certificate: not a PEM certificate ({_ssl_reason(exc)})") from None
        with tempfile.TemporaryDirectory() as d:
            cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            for path, data in ((cert, self.cert_pem), (key, self.key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            try:
                ctx.load_cert_chain(cert, key, password=lambda: b"")
            except (ssl.SSLError, ValueError) as exc:
                raise ConfigError(f"{where}: key: not a usable private key for the certificate "
                                  f"({_ssl_reason(exc)})") from None
        if self.client_ca_pem is not None:
            try:
                ssl.create_default_context().load_verify_locations(
                    cadata=self.client_ca_pem.decode("ascii", "replace"))
            except (ssl.SSLError, ValueError) as exc:
                raise ConfigError(f"{where}: client CA: not a PEM certificate ({_ssl_reason(exc)})") from None


def _ssl_reason(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or exc).split("] ")[-1][:120]


def is_loopback(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``; anything else (names included) is not."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def peer_host(peer: str) -> str:
    """The client host of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, ``unix:...``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")]
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


@dataclass
class TargetStats:
    """Counters for the shutdown summary and the tests."""

    rpcs: int = 0
    refused: int = 0  # requests over a limit
    auth_failures: int = 0
    auth_throttled: int = 0  # attempts refused unchecked while the host was locked out
    sessions_peak: int = 0
    max_message_bytes: int = 0  # largest notification sent


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


def _cache_size(key: tuple[str, GPath], idx: tuple[int, ...]) -> int:
    # a cheap over-estimate of the entry's footprint (objects, strings, the index tuple)
    p = key[1]
    n = 200 + len(key[0]) + len(p.origin) + 8 * len(idx)
    for e in p.elems:
        n += 80 + len(e.name) + sum(120 + len(k) + len(v) for k, v in e.keys)
    return n


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
        limits: TargetLimits | None = None,
        throttle: LoginThrottle | None = None,
        allow_set: bool = False,
    ) -> None:
        if encoding not in ("request", "typed", "json_ietf"):
            raise ConfigError(f"gnmi target: encoding: expected request|typed|json_ietf, got {encoding!r}")
        self.source = source
        self.address = address
        self.credentials = credentials
        # Set changes the fabric: off unless asked, and only for an authenticated client
        self.allow_set = allow_set
        self.tls = tls
        self.encoding = encoding
        self.on_change_check_ns = on_change_check_ns
        self._targets = set(source.targets())
        self._leaves: dict[str, _Leaves] = {}
        self.limits = limits or TargetLimits()
        self.throttle = throttle or LoginThrottle()
        self.match_cache: BoundedCache[tuple[str, GPath], tuple[int, ...]] = BoundedCache(
            self.limits.match_cache_entries, self.limits.match_cache_bytes, _cache_size)
        self.stats = TargetStats()
        self.sessions: dict[tuple[str, str], int] = {}  # (client host, device) -> open Subscribes
        self.sessions_open = 0
        self.warnings: list[str] = []
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self.bytes_sent = 0
        self.updates_sent = 0
        self._last_sync = -1.0
        self._ts = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        host = self.address.rsplit(":", 1)[0]
        if self.tls is not None:
            self.tls.check()
        self._security_warnings(host)
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_send_message_length", 64 << 20),
                     ("grpc.max_receive_message_length", self.limits.receive_message_bytes)]
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
        try:
            if self.tls is not None:
                creds = grpc.ssl_server_credentials(
                    [(self.tls.key_pem, self.tls.cert_pem)], root_certificates=self.tls.client_ca_pem,
                    require_client_auth=self.tls.client_ca_pem is not None)
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
        log.info("gNMI target serving %d devices on %s (tls=%s, mtls=%s, auth=%s)", len(self._targets), self.bound,
                 self.tls is not None, self.tls is not None and self.tls.client_ca_pem is not None,
                 self.credentials is not None)
        return self.port

    def _security_warnings(self, host: str) -> None:
        if is_loopback(host):
            return
        if self.credentials is None and (self.tls is None or self.tls.client_ca_pem is None):
            self.warnings.append(f"serving {host} without authentication: any client that reaches it can read "
                                 "all telemetry (give credentials or client certificates)")
        if self.tls is None:
            self.warnings.append(f"serving {host} without TLS: telemetry"
                                 + (" and passwords cross" if self.credentials else " crosses")
                                 + " the network in clear text")
        for w in self.warnings:
            log.warning("gNMI target: %s", w)

    async def stop(self, grace: float | None = 0.2) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    # ------------------------------------------------------------------ helpers
    def _auth(self, context: grpc.aio.ServicerContext) -> None:
        self.stats.rpcs += 1
        if self.credentials is None:
            return
        host = peer_host(context.peer() or "")
        now = time.monotonic()
        wait = self.throttle.locked(host, now)
        if wait > 0:
            # refused unchecked: a guesser gets a few tries per lockout, not thousands a second
            self.stats.auth_throttled += 1
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED,
                         f"too many failed logins from {host}; retry in {wait:.0f} s")
        md = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        if self.credentials.check(md):
            self.throttle.success(host)
            return
        user = _clip(md.get("username", ""), 64)
        self.stats.auth_failures += 1
        n, lock = self.throttle.failure(host, now)
        # the user name and peer are logged (repr: no log injection); the password never is
        if lock > 0:
            log.warning("gNMI login failed for user %r from %s (%d consecutive failures); "
                        "refusing this host for %.0f s", user, host, n, lock)
        else:
            log.warning("gNMI login failed for user %r from %s", user, host)
        raise _Abort(grpc.StatusCode.UNAUTHENTICATED, f"authentication failed for user {user!r}")

    def _target_leaves(self, target: str) -> _Leaves:
        if not target:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         "prefix.target: required (this target serves many devices)")
        if target not in self._targets:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"prefix.target: unknown target {_clip(target, 64)!r}")
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
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, _clip(str(exc), 400)) from exc
        if full.origin not in SERVED_ORIGINS:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         f"{what}: origin {_clip(full.origin, 64)!r} not served (only '' and 'openconfig')")
        if len(full.elems) > self.limits.path_elems:
            self.stats.refused += 1
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         f"{what}: {len(full.elems)} elements, more than the limit {self.limits.path_elems}")
        key = (target, GPath(full.elems, full.origin or "openconfig"))
        idx = self.match_cache.get(key)
        if idx is None:
            idx = tuple(i for i, p in enumerate(tl.paths) if match(full, p))
            if idx:  # a miss is not cached: it would only make room for a hostile client's junk
                self.match_cache.put(key, idx)
        if not idx:
            raise _Abort(grpc.StatusCode.NOT_FOUND,
                         f"{what}: no data at {_clip(str(full))} on target {_clip(target, 64)!r}")
        return tl, list(idx)

    def _leaf_budget(self, used: int, what: str) -> None:
        if used > self.limits.leaves_per_request:
            self.stats.refused += 1
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"{what}: request resolves to more than {self.limits.leaves_per_request} leaves; "
                         "subscribe to narrower paths")

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
        """gNMI Set (gNMI spec 3.4): ``update`` / ``replace`` of the leaves the source accepts
        (:class:`Configurable`), all validated before any is applied (a Set is one
        transaction); ``delete`` is refused. Only with ``allow_set`` and credentials."""
        try:
            self._auth(context)
            set_config = getattr(self.source, "set_config", None)
            if not self.allow_set or set_config is None:
                raise _Abort(grpc.StatusCode.UNIMPLEMENTED, "Set: this target is read-only "
                             "(serve-twin --allow-set accepts interfaces/interface/config/enabled)")
            if self.credentials is None:
                raise _Abort(grpc.StatusCode.PERMISSION_DENIED,
                             "Set: refused without credentials (start the target with "
                             "--username/--password-env)")
            if request.delete:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                             "delete: not supported (set the leaf's value instead)")
            ops = [(u, gnmi_pb2.UpdateResult.UPDATE) for u in request.update] + [
                (u, gnmi_pb2.UpdateResult.REPLACE) for u in request.replace]
            if not ops:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "update/replace: nothing to set")
            if len(ops) > self.limits.paths_per_request:
                self.stats.refused += 1
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                             f"update: {len(ops)} paths, more than the limit {self.limits.paths_per_request}")
            prefix = from_proto_path(request.prefix, source="prefix")
            target = request.prefix.target
            if target not in self._targets:
                raise _Abort(grpc.StatusCode.NOT_FOUND,
                             f"prefix.target: no such device {_clip(target, 64)!r}")
            todo = []
            for i, (u, op) in enumerate(ops):
                path = format_path(join(prefix, from_proto_path(u.path, source=f"update[{i}].path")))
                value = decode_value(u.val)
                set_config(target, path, value, apply=False)
                todo.append((u, op, path, value))
            self._sync()
            results = []
            for u, op, path, value in todo:
                what = set_config(target, path, value, apply=True)
                log.warning("gNMI Set on %s by %s: %s", _clip(target, 64),
                            peer_host(context.peer() or ""), what)
                results.append(gnmi_pb2.UpdateResult(path=u.path, op=op))
            return gnmi_pb2.SetResponse(prefix=request.prefix, response=results,
                                        timestamp=time.time_ns())
        except _Abort as a:
            await context.abort(a.code, a.msg)
            raise AssertionError("unreachable") from None
        except FabricscopeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from None

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
            if len(request.path) > self.limits.paths_per_request:
                self.stats.refused += 1
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                             f"path: {len(request.path)} paths, more than the limit {self.limits.paths_per_request}")
            ts = self._sync()
            notes = []
            used = 0
            for i, p in enumerate(request.path):
                tl, idx = self._resolve(target, prefix, p, f"path[{i}]")
                used += len(idx)
                self._leaf_budget(used, "Get")
                await asyncio.sleep(0)  # one path at a time: other RPCs run in between
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

    def _open_session(self, host: str, device: str) -> tuple[str, str]:
        key = (host, device)
        if self.sessions.get(key, 0) >= self.limits.sessions_per_client:
            self.stats.refused += 1
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"Subscribe: client {host} already holds {self.limits.sessions_per_client} sessions "
                         f"on target {_clip(device, 64)!r} (the per-client limit)")
        if self.sessions_open >= self.limits.sessions:
            self.stats.refused += 1
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"Subscribe: {self.limits.sessions} sessions open, the target's limit")
        self.sessions[key] = self.sessions.get(key, 0) + 1
        self.sessions_open += 1
        self.stats.sessions_peak = max(self.stats.sessions_peak, self.sessions_open)
        return key

    def _close_session(self, key: tuple[str, str]) -> None:
        self.sessions_open -= 1
        left = self.sessions[key] - 1
        if left:
            self.sessions[key] = left
        else:
            del self.sessions[key]

    async def _subscribe(self, requests: AsyncIterator[gnmi_pb2.SubscribeRequest], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        key: tuple[str, str] | None = None
        try:
            try:
                self._auth(context)
                try:
                    first = await anext(aiter(requests))
                except StopAsyncIteration:
                    raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "Subscribe: empty request stream") from None
                if not first.HasField("subscribe"):
                    raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "Subscribe: first request must carry 'subscribe'")
                key = self._open_session(peer_host(context.peer() or ""), first.subscribe.prefix.target)
                sess = _Session(self, first.subscribe)
                await sess.resolve()
            except _Abort as a:
                await context.abort(a.code, a.msg)
                return
            except FabricscopeError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _clip(str(exc), 400))
                return
            try:
                async for msg in sess.run(requests):
                    self.bytes_sent += len(msg)
                    yield msg
            except _Abort as a:
                await context.abort(a.code, a.msg)
        finally:
            if key is not None:
                self._close_session(key)


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
        self.subs: list[_Sub] = []

    async def resolve(self) -> None:
        """Resolve every subscription, yielding to the loop between them (bounded per request)."""
        tgt, sl = self.tgt, self.sl
        prefix = from_proto_path(sl.prefix, source="subscribe.prefix")
        if not sl.subscription:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "subscribe.subscription: at least one is required")
        if len(sl.subscription) > tgt.limits.subscriptions_per_session:
            tgt.stats.refused += 1
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         f"subscribe.subscription: {len(sl.subscription)} subscriptions, more than the limit "
                         f"{tgt.limits.subscriptions_per_session}")
        used = 0
        for i, s in enumerate(sl.subscription):
            if i:
                await asyncio.sleep(0)
            tl, idx = tgt._resolve(self.target, prefix, s.path, f"subscribe.subscription[{i}].path")
            used += len(idx)
            tgt._leaf_budget(used, "Subscribe")
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
        step = self.tgt.limits.updates_per_message
        for k in range(0, len(pairs), step):
            out.append(encode_notification(ts, self.prefix_wire, pairs[k : k + step], self.enc))
        self.tgt.updates_sent += len(pairs)
        if out:
            self.tgt.stats.max_message_bytes = max(self.tgt.stats.max_message_bytes, *map(len, out))
        return out

    def _full(self, ts: int) -> Iterator[bytes]:
        # one subscription at a time, so a big ONCE request interleaves with other streams
        for s in self.subs:
            vals = list(self.tgt.source.read(s.leaves))
            s.last = list(vals)
            yield from self._encode(ts, list(zip(s.wire, vals, strict=True)))

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
