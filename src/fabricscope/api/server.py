"""Running the console app under uvicorn: in a background thread (tests, benchmarks) or in
the foreground with a shutdown deadline (``fabricscope serve``).

TLS: ``TlsFiles(cert, key, client_ca)``; with ``client_ca`` every client must present a
certificate it signed (mTLS, ``ssl.CERT_REQUIRED``). The listening socket is bound here
(port 0 picks a free one) so the caller knows the real address before the first request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from fabricscope.model.errors import ConfigError, TransportError

#: Seconds a client has to send a request's headers, from its connection or the end of its
#: last response; past that the connection is closed (a slow-loris client cannot pin one).
HEADER_TIMEOUT_S = 10.0


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's headers.

    uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` but sets no
    timer on a fresh connection and none while headers trickle in, so a client that connects
    and sends nothing (or half a request) holds a connection forever (measured: > 70 s).
    """

    header_timeout_s = HEADER_TIMEOUT_S
    _hdr_task: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._hdr_task = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._hdr_task is not None:
            self._hdr_task.cancel()
            self._hdr_task = None

    def _expired(self) -> None:
        self._hdr_task = None
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the headers are in: the request is the app's now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None
                                                or self.cycle.response_complete):
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of the server's TLS (``client_ca`` turns on mTLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def check(self) -> None:
        """Fail with one line naming the flag when a file is missing or the pair is bad."""
        for flag, p in (("--tls-cert", self.cert), ("--tls-key", self.key),
                        ("--tls-client-ca", self.client_ca)):
            if p is not None and not Path(p).is_file():
                raise ConfigError(f"{flag} {p}: no such file")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(str(self.cert), str(self.key))
            if self.client_ca is not None:
                ctx.load_verify_locations(str(self.client_ca))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"--tls-cert {self.cert} / --tls-key {self.key}"
                              + (f" / --tls-client-ca {self.client_ca}" if self.client_ca else "")
                              + f": not a usable certificate / key: {exc}") from None


def _config(app: Any, tls: TlsFiles | None, graceful_s: float,
            header_timeout_s: float = HEADER_TIMEOUT_S) -> uvicorn.Config:
    kw: dict[str, Any] = {}
    proto: type[DeadlineH11Protocol] = DeadlineH11Protocol
    if header_timeout_s != HEADER_TIMEOUT_S:
        class Custom(DeadlineH11Protocol):
            pass

        Custom.header_timeout_s = header_timeout_s
        proto = Custom
    if tls is not None:
        kw = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
        if tls.client_ca is not None:
            kw.update(ssl_ca_certs=str(tls.client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                          http=proto, h11_max_incomplete_event_size=16 * 1024,
                          timeout_graceful_shutdown=max(1, int(graceful_s)),
                          limit_concurrency=2000, timeout_keep_alive=30, **kw)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); TransportError naming the address on failure."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when the proto says
    # TCP (with proto 0, Nagle + delayed ACK add ~40 ms to every response)
    sock = socket.socket(fam, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise TransportError(f"--host {host} --port {port}: cannot listen: {exc.strerror}") from None
    sock.listen(512)
    sock.set_inheritable(True)
    return sock


class ServerHandle:
    """A server running in a background thread: ``url``, ``stop()``."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, url: str) -> None:
        self.server = server
        self.thread = thread
        self.url = url

    def stop(self, timeout_s: float = 10.0) -> bool:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


def start_server(app: Any, host: str = "127.0.0.1", port: int = 0,
                 tls: TlsFiles | None = None, *, graceful_s: float = 3.0,
                 header_timeout_s: float = HEADER_TIMEOUT_S) -> ServerHandle:
    """Serve ``app`` from a background thread; returns once it accepts connections."""
    sock = bind(host, port)
    real_port = sock.getsockname()[1]
    server = uvicorn.Server(_config(app, tls, graceful_s, header_timeout_s))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="console-http",
                         daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not t.is_alive() or time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                sock.close()
            raise TransportError(f"console server on {host}:{real_port} did not start")
        time.sleep(0.02)
    scheme = "https" if tls is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    return ServerHandle(server, t, f"{scheme}://{shown}:{real_port}")


def serve_forever(app: Any, sock: socket.socket, tls: TlsFiles | None = None, *,
                  graceful_s: float = 5.0) -> None:
    """Serve in the foreground until SIGINT / SIGTERM (uvicorn's handlers), then shut down
    within ``graceful_s`` (open SSE streams are cancelled at the deadline)."""
    server = uvicorn.Server(_config(app, tls, graceful_s))
    server.run(sockets=[sock])
