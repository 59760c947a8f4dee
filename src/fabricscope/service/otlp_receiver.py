"""OTLP trace receiver: gRPC ``TraceService/Export`` and OTLP/HTTP ``POST /v1/traces``, bounded.

Follows the OTLP specification (https://opentelemetry.io/docs/specs/otlp/): gRPC on the official
``opentelemetry.proto.collector.trace.v1`` service; HTTP with ``application/x-protobuf`` or
``application/json`` bodies (optionally gzip), an ``ExportTraceServiceResponse`` back, and the
throttling answers of the spec: ``RESOURCE_EXHAUSTED`` (gRPC) / ``429`` with ``Retry-After`` (HTTP)
when the buffer of spans not yet flushed would pass ``max_buffered_spans``. Received requests become
OTLP JSON dicts (hex ids) at this edge, handed in batches to a sink (a callback or a JSON-lines
file in the Collector's file-exporter layout). Listens on 127.0.0.1 unless told otherwise; TLS, a
bearer token or basic credentials; failed logins are logged (user and peer, never the secret) and
throttled per host (``LoginThrottle``); ``stop(deadline_s)`` stops accepting and flushes.

A ``validate`` hook decodes each request before it is accepted, so a span the analysis cannot read
(end before start, a bad id) is the client's error (``INVALID_ARGUMENT`` / ``400``, as the OTLP spec
answers a request it cannot process) instead of a failure in the sink after the client was told OK.
TLS handshakes on the HTTP port run in the connection's own thread with ``io_timeout_s``, so a client
that connects and says nothing holds only its own connection, never the accept loop.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import ssl
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from fabricscope.model.errors import ConfigError, FabricscopeError, TransportError
from fabricscope.telemetry.auth import LoginThrottle
from fabricscope.telemetry.target import TLSFiles, is_loopback, peer_host

__all__ = ["JsonlSink", "OtlpReceiver", "ReceiverAuth", "ReceiverStats", "request_to_json"]

log = logging.getLogger(__name__)
Sink = Callable[[list[dict[str, Any]]], None]
Validator = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class ReceiverAuth:
    """A bearer token, or a user name and password for HTTP basic (both may be given)."""

    token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.token == "":
            raise ConfigError("otlp receiver: token: must not be empty")
        if (self.username is None) != (self.password is None) or self.password == "" or self.username == "":
            raise ConfigError("otlp receiver: basic credentials need a non-empty user name and password")

    def check(self, authorization: str) -> tuple[bool, str]:
        """(accepted, user name for the log) for an ``Authorization`` header value."""
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return hmac.compare_digest(value.strip().encode(), self.token.encode()), "<bearer>"
        if scheme.lower() == "basic" and self.username is not None and self.password is not None:
            try:
                user, _, pw = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False, "<malformed>"
            ok_u = hmac.compare_digest(user.encode(), self.username.encode())
            ok_p = hmac.compare_digest(pw.encode(), self.password.encode())
            return ok_u and ok_p, user[:64]
        return False, "<none>"


@dataclass
class ReceiverStats:
    """Self-metrics: requests, spans accepted / refused / flushed, auth failures, buffer fill."""

    requests: int = 0
    spans_accepted: int = 0
    spans_refused: int = 0
    spans_flushed: int = 0
    bad_requests: int = 0
    auth_failures: int = 0
    auth_throttled: int = 0
    buffered: int = 0


def _b64_to_hex(v: Any) -> Any:
    return base64.b64decode(v).hex() if isinstance(v, str) and v else v


def request_to_json(req: trace_service_pb2.ExportTraceServiceRequest) -> dict[str, Any]:
    """An export request as OTLP JSON (lowerCamelCase, enums as ints, int64 as strings, hex ids)."""
    d: dict[str, Any] = json_format.MessageToDict(req, use_integers_for_enums=True)
    for rs in d.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for sp in ss.get("spans", ()):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = _b64_to_hex(sp[k])
                for ln in sp.get("links", ()):
                    for k in ("traceId", "spanId"):
                        if k in ln:
                            ln[k] = _b64_to_hex(ln[k])
    return d


def _count_spans(doc: Mapping[str, Any]) -> int:
    return sum(len(ss.get("spans") or ()) for rs in doc.get("resourceSpans") or ()
               for ss in rs.get("scopeSpans") or ())


class JsonlSink:
    """Appends each batch as JSON lines (one export request a line), flushed to disk per call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def __call__(self, batches: list[dict[str, Any]]) -> None:
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            for b in batches:
                fh.write(json.dumps(b, separators=(",", ":")) + "\n")


class OtlpReceiver:
    """The receiver; ``start()`` binds (port 0: any free port, see ``grpc_port`` / ``http_port``)."""

    def __init__(self, sink: Sink, *, grpc_address: str | None = "127.0.0.1:4317",
                 http_address: str | None = "127.0.0.1:4318", max_buffered_spans: int = 200_000,
                 max_body_bytes: int = 16 << 20, auth: ReceiverAuth | None = None, tls: TLSFiles | None = None,
                 throttle: LoginThrottle | None = None, flush_interval_s: float = 1.0, workers: int = 4,
                 validate: Validator | None = None, io_timeout_s: float = 30.0) -> None:
        if max_buffered_spans <= 0:
            raise ConfigError(f"otlp receiver: max_buffered_spans {max_buffered_spans} must be > 0")
        self.sink, self.grpc_address, self.http_address = sink, grpc_address, http_address
        self.max_buffered_spans, self.max_body_bytes = max_buffered_spans, max_body_bytes
        self.auth, self.tls = auth, tls
        self.throttle = throttle if throttle is not None else LoginThrottle()  # an empty one is falsy
        self.flush_interval_s, self.workers = flush_interval_s, workers
        self.validate, self.io_timeout_s = validate, io_timeout_s
        self.stats = ReceiverStats()
        self.grpc_port = 0
        self.http_port = 0
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._buf: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    # -- admission ---------------------------------------------------------------------------
    def authorize(self, authorization: str, peer: str) -> tuple[bool, str]:
        """(allowed, reason) for one request; failures logged once each and throttled per host."""
        if self.auth is None:
            return True, ""
        now = time.monotonic()
        wait = self.throttle.locked(peer, now)
        if wait > 0:
            with self._lock:
                self.stats.auth_throttled += 1
            return False, f"too many failed logins from {peer}; retry in {wait:.0f} s"
        ok, user = self.auth.check(authorization)
        if ok:
            self.throttle.success(peer)
            return True, ""
        with self._lock:
            self.stats.auth_failures += 1
        n, lock = self.throttle.failure(peer, now)
        if lock > 0:
            log.warning("OTLP login failed for user %r from %s (%d consecutive failures); refusing this host "
                        "for %.0f s", user, peer, n, lock)
        else:
            log.warning("OTLP login failed for user %r from %s", user, peer)
        return False, "authentication failed"

    def check(self, doc: dict[str, Any]) -> str:
        """``""`` when the ``validate`` hook accepts the request, else the reason (counted as a bad request)."""
        if self.validate is None:
            return ""
        try:
            self.validate(doc)
        except FabricscopeError as exc:
            with self._lock:
                self.stats.bad_requests += 1
            return str(exc)[:300]
        return ""

    def offer(self, doc: dict[str, Any]) -> bool:
        """Buffer one export request; False (refused whole) when it would pass the span cap."""
        n = _count_spans(doc)
        with self._lock:
            self.stats.requests += 1
            if self.stats.buffered + n > self.max_buffered_spans:
                self.stats.spans_refused += n
                return False
            self._buf.append(doc)
            self.stats.buffered += n
            self.stats.spans_accepted += n
        return True

    def flush(self) -> int:
        """Hand everything buffered to the sink; returns spans flushed."""
        with self._lock:
            batch, self._buf = self._buf, []
            n = self.stats.buffered
            self.stats.buffered = 0
        if batch:
            self.sink(batch)
            with self._lock:
                self.stats.spans_flushed += n
        return n

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> None:
        for addr in (self.grpc_address, self.http_address):
            if addr is not None:
                self._security_warnings(addr.rsplit(":", 1)[0])
        if self.grpc_address is not None:
            self._start_grpc(self.grpc_address)
        if self.http_address is not None:
            self._start_http(self.http_address)
        t = threading.Thread(target=self._flusher, name="otlp-flush", daemon=True)
        t.start()
        self._threads.append(t)

    def _security_warnings(self, host: str) -> None:
        if is_loopback(host):
            return
        if self.auth is None:
            self.warnings.append(f"serving {host} without authentication: anyone who reaches it can send spans")
        if self.tls is None:
            self.warnings.append(f"serving {host} without TLS: spans and credentials cross the network in clear")
        for w in self.warnings:
            log.warning("OTLP receiver: %s", w)

    def _start_grpc(self, address: str) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.workers),
                             options=[("grpc.max_receive_message_length", self.max_body_bytes)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        try:
            if self.tls is not None:
                creds = grpc.ssl_server_credentials([(self.tls.key_pem, self.tls.cert_pem)],
                                                    root_certificates=self.tls.client_ca_pem,
                                                    require_client_auth=self.tls.client_ca_pem is not None)
                self.grpc_port = server.add_secure_port(address, creds)
            else:
                self.grpc_port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise TransportError(f"otlp receiver: cannot bind gRPC {address}: {exc}") from exc
        if self.grpc_port == 0:
            raise TransportError(f"otlp receiver: cannot bind gRPC {address}")
        server.start()
        self._grpc = server

    def _start_http(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        receiver = self

        class Handler(_HttpHandler):
            rx = receiver

        try:
            httpd = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
        except (OSError, ValueError) as exc:
            raise TransportError(f"otlp receiver: cannot bind HTTP {address}: {exc}") from exc
        httpd.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            with tempfile.TemporaryDirectory() as d:
                cert, key = Path(d, "c.pem"), Path(d, "k.pem")
                cert.write_bytes(self.tls.cert_pem)
                key.write_bytes(self.tls.key_pem)
                ctx.load_cert_chain(cert, key)
            if self.tls.client_ca_pem is not None:
                ctx.load_verify_locations(cadata=self.tls.client_ca_pem.decode())
                ctx.verify_mode = ssl.CERT_REQUIRED
            # no handshake in accept(): it would run in the serve_forever thread, unbounded
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.http_port = int(httpd.server_address[1])
        t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="otlp-http",
                             daemon=True)
        t.start()
        self._threads.append(t)
        self._http = httpd

    def _flusher(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
            except Exception:  # a failing sink must not kill the receiver; log once per interval
                log.exception("OTLP receiver: sink failed; spans kept for the next flush were dropped")

    def stop(self, deadline_s: float = 5.0) -> ReceiverStats:
        """Stop accepting, wait for in-flight requests up to ``deadline_s``, flush everything buffered."""
        end = time.monotonic() + deadline_s
        if self._grpc is not None:
            self._grpc.stop(grace=max(0.0, deadline_s / 2)).wait(max(0.0, end - time.monotonic()))
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self._stop.set()
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        self.flush()
        log.info("OTLP receiver stopped: %s", self.stats)
        return self.stats


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, rx: OtlpReceiver) -> None:
        self.rx = rx

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        md = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        ok, why = self.rx.authorize(md.get("authorization", ""), peer_host(context.peer() or ""))
        if not ok:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        doc = request_to_json(request)
        bad = self.rx.check(doc)
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot process the request: {bad}")
        if not self.rx.offer(doc):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"span buffer full ({self.rx.max_buffered_spans} spans); retry later")
        return trace_service_pb2.ExportTraceServiceResponse()


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing one that inflates past ``limit`` bytes (a gzip bomb)."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = d.decompress(body, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise ValueError(f"gzip body inflates past {limit} bytes")
    return out


class _HttpHandler(BaseHTTPRequestHandler):
    rx: OtlpReceiver
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("OTLP HTTP %s", format % args)

    def setup(self) -> None:
        self.request.settimeout(self.rx.io_timeout_s)  # a silent or slow client times out, alone
        self.tls_failed = False
        if isinstance(self.request, ssl.SSLSocket):
            try:
                self.request.do_handshake()
            except (OSError, ssl.SSLError) as exc:  # plaintext, wrong CA, silence: that client's problem
                log.debug("OTLP HTTP: TLS handshake with %s failed: %s", self.client_address[0], exc)
                self.tls_failed = True
        super().setup()

    def handle(self) -> None:
        if not self.tls_failed:
            try:
                super().handle()
            except (TimeoutError, ConnectionError, ssl.SSLError) as exc:
                log.debug("OTLP HTTP: connection from %s dropped: %s", self.client_address[0], exc)
                self.close_connection = True

    def _reply(self, code: int, body: bytes, ctype: str, extra: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, msg: str, extra: Mapping[str, str] | None = None) -> None:
        self._reply(code, json.dumps({"code": code, "message": msg}).encode(), "application/json", extra)

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/v1/traces":
            self._error(404, "only POST /v1/traces is served")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self._error(400, "Content-Length is not a non-negative integer")
            self.close_connection = True
            return
        if length > self.rx.max_body_bytes:
            self._error(413, f"body over {self.rx.max_body_bytes} bytes")
            self.close_connection = True
            return
        body = self.rfile.read(length)
        ok, why = self.rx.authorize(self.headers.get("Authorization", ""), self.client_address[0])
        if not ok:
            self._error(401, why, {"WWW-Authenticate": "Bearer"})
            return
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                body = _gunzip(body, self.rx.max_body_bytes)
            if ctype == "application/x-protobuf":
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                doc = request_to_json(req)
            elif ctype == "application/json":
                doc = json.loads(body)
                if not isinstance(doc, dict):
                    raise ValueError("not an object")
            else:
                self._error(415, f"content type {ctype!r}: use application/x-protobuf or application/json")
                return
        except Exception as exc:  # any undecodable body is the client's error, answered 400
            with self.rx._lock:
                self.rx.stats.bad_requests += 1
            self._error(400, f"cannot decode the body: {type(exc).__name__}")
            return
        bad = self.rx.check(doc)
        if bad:
            self._error(400, f"cannot process the request: {bad}")
            return
        if not self.rx.offer(doc):
            self._error(429, f"span buffer full ({self.rx.max_buffered_spans} spans)", {"Retry-After": "1"})
            return
        if ctype == "application/x-protobuf":
            self._reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(), ctype)
        else:
            self._reply(200, b"{}", "application/json")
