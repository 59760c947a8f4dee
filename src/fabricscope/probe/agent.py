"""The probe agent (edge): an asyncio UDP responder and prober that emit ProbeSample records.

* :class:`Responder` answers probe requests on one address (default port 47910), stamping
  the receive time (a kernel timestamp via ``SO_TIMESTAMPNS`` where the OS gives one, else
  user space) and the send time, plus the per-flow ``rx_count`` (see
  :mod:`fabricscope.probe.wire`). Foreign and malformed packets are dropped and counted by
  reason.
* :class:`Prober` sends the flows of a :class:`~fabricscope.probe.plan.ProbePlan` round-robin
  at its budget rate from one socket per source port, matches replies by (session, seq),
  declares a probe lost after ``timeout_s`` and later classifies the loss as request-path or
  reply-path from the responder's ``rx_count`` (TWAMP-style).

Sockets are drained with ``recvmsg`` from ``loop.add_reader`` callbacks (one syscall per
packet, no per-packet Task), which is what makes >10k probes/s on one core possible.
Both bind to explicit addresses; nothing here chooses a destination outside the plan.

Sockets are bound *without* ``SO_REUSEADDR``: on Linux two UDP sockets that both set it share
a port and the kernel hands each datagram to only one of them, so a second agent on the same
host would silently steal half the probes. Without it the second bind fails, loudly.
Datagrams larger than :data:`~fabricscope.probe.wire.MAX_SIZE` are rejected (``oversize``),
never truncated and answered. Kernel receive-buffer drops are counted per socket from
``SO_RXQ_OVFL`` ancillary data and ``/proc/self/net/udp`` (``Counters.kernel_drops``): a
drop there is the host's, not the network's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabricscope.model.errors import TransportError
from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.probe import wire
from fabricscope.probe.analysis import ANSWERED, LOST_UNKNOWN, REPLY_LOST, REQUEST_LOST
from fabricscope.probe.plan import PROBE_PORT

_LINUX = os.uname().sysname == "Linux"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if _LINUX else None)
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40 if _LINUX else None)
_TS = struct.Struct("@ll")
_U32 = struct.Struct("@I")
_RECV_BUF = wire.MAX_SIZE + 1  # one byte more than the largest probe: longer ones show as oversize
_ANC_BUF = socket.CMSG_SPACE(_TS.size) + socket.CMSG_SPACE(_U32.size)
RCVBUF_BYTES = 4 << 20
SampleSink = Callable[[ProbeSample, int], None]  # (sample, status: ANSWERED/REQUEST_LOST/...)


def _udp_socket(addr: str, port: int, *, rcvbuf: int = RCVBUF_BYTES) -> tuple[socket.socket, bool]:
    """A non-blocking UDP socket bound to (addr, port); True when kernel RX timestamps are on.

    No ``SO_REUSEADDR`` (see the module docstring): a port another agent holds is an error.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    ts = False
    if SO_TIMESTAMPNS is not None:
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            ts = True
        except OSError:
            ts = False
    if SO_RXQ_OVFL is not None:
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    try:
        s.bind((addr, port))
    except OSError as exc:
        s.close()
        why = (" (another probe agent, or another program, already holds it)"
               if exc.errno == errno.EADDRINUSE else "")
        raise TransportError(f"probe agent: cannot bind UDP {addr}:{port}: {exc.strerror}{why}") from exc
    s.setblocking(False)
    return s, ts


def _ancillary(anc: list[tuple[int, int, bytes]]) -> tuple[int | None, int | None]:
    """(kernel receive time in ns, the socket's cumulative kernel drop count), each None if absent."""
    t_rx = drops = None
    for level, typ, data in anc:
        if level != socket.SOL_SOCKET:
            continue
        if typ == SO_TIMESTAMPNS and len(data) >= _TS.size:
            sec, nsec = _TS.unpack_from(data)
            t_rx = int(sec) * 1_000_000_000 + int(nsec)
        elif typ == SO_RXQ_OVFL and len(data) >= _U32.size:
            drops = int(_U32.unpack_from(data)[0])
    return t_rx, drops


def proc_udp_drops() -> dict[int, int] | None:
    """Kernel receive drops per socket inode from ``/proc/self/net/udp`` (None where unreadable).

    The ``drops`` column counts datagrams the kernel discarded because the socket's receive
    buffer was full; unlike ``SO_RXQ_OVFL`` it is readable without receiving another packet.
    """
    try:
        with open("/proc/self/net/udp", encoding="ascii") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return None
    out: dict[int, int] = {}
    for line in lines:
        cols = line.split()
        if len(cols) >= 13 and cols[9].isdigit() and cols[-1].isdigit():
            out[int(cols[9])] = int(cols[-1])
    return out


@dataclass
class Counters:
    """What an endpoint saw; ``rejected`` is keyed by :class:`~fabricscope.probe.wire.MalformedPacket`
    reason (plus the prober's ``foreign-session`` and ``late``).

    ``sent``: datagrams the kernel accepted; ``send_errors``: sends it refused (a local firewall,
    no route), which are not probes and never become samples; ``kernel_drops``: datagrams the
    kernel discarded because one of the endpoint's receive buffers was full.
    """

    received: int = 0
    sent: int = 0
    send_errors: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    kernel_drops: int = 0

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class _Endpoint:
    """What a responder and a prober share: counters and kernel drops per socket."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.kernel_ts = False
        self._drops: dict[int, int] = {}  # fd -> the kernel's cumulative drop count

    def _note_drops(self, fd: int, cumulative: int | None) -> None:
        if cumulative is not None and cumulative > self._drops.get(fd, 0):
            self._drops[fd] = cumulative
            self.counters.kernel_drops = sum(self._drops.values())

    def _sockets(self) -> list[socket.socket]:
        raise NotImplementedError

    def _recv(self, sock: socket.socket) -> tuple[bytes, int, tuple[str, int]] | None:
        """One datagram (data, receive time, peer), or None when the socket is drained."""
        try:
            data, anc, _flags, peer = sock.recvmsg(_RECV_BUF, _ANC_BUF)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return None
        t_rx, drops = _ancillary(anc)
        self._note_drops(sock.fileno(), drops)
        self.counters.received += 1
        # A datagram longer than the buffer arrives cut to MAX_SIZE + 1 bytes (MSG_TRUNC), which
        # wire.decode rejects as oversize: a truncated probe is never answered.
        return data, (t_rx if t_rx is not None and self.kernel_ts else time.time_ns()), peer

    def refresh_kernel_drops(self) -> int:
        """Re-read the kernel's per-socket drop counters (``/proc``); returns ``counters.kernel_drops``."""
        table = proc_udp_drops()
        if table is not None:
            for sk in self._sockets():
                if sk.fileno() >= 0:
                    self._note_drops(sk.fileno(), table.get(os.fstat(sk.fileno()).st_ino))
        return self.counters.kernel_drops


class Responder(_Endpoint):
    """Answers probe requests arriving at ``addr:port``."""

    def __init__(self, addr: str = "127.0.0.1", port: int = PROBE_PORT,
                 *, max_flows: int = 200_000, rcvbuf: int = RCVBUF_BYTES) -> None:
        super().__init__()
        self.addr, self.port = addr, port
        self._rcvbuf = rcvbuf
        self._rx: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._max_flows = max_flows
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _sockets(self) -> list[socket.socket]:
        return [self._sock] if self._sock is not None else []

    async def start(self) -> Responder:
        self._sock, self.kernel_ts = _udp_socket(self.addr, self.port, rcvbuf=self._rcvbuf)
        self.port = self._sock.getsockname()[1]
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._drain)
        return self

    def _drain(self) -> None:
        sock = self._sock
        assert sock is not None
        for _ in range(256):
            got = self._recv(sock)
            if got is None:
                return
            data, t_rx, peer = got
            try:
                p = wire.decode(data)
                if not p.is_request:
                    raise wire.MalformedPacket("type", "a reply sent to a responder")
            except wire.MalformedPacket as exc:
                self.counters.reject(exc.reason)
                continue
            key = (peer[0], peer[1], p.session)
            n = self._rx.get(key, 0) + 1
            self._rx[key] = n
            if n == 1 and len(self._rx) > self._max_flows:
                self._rx.popitem(last=False)
            out = wire.reply_in_place(data, t_rx, time.time_ns(), n)
            try:
                sock.sendto(out, peer)
                self.counters.sent += 1
            except OSError:
                self.counters.send_errors += 1

    async def stop(self) -> None:
        if self._sock is not None and self._loop is not None:
            self.refresh_kernel_drops()
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None


@dataclass
class _Flow:
    dst: str
    ft: FiveTuple
    sock: socket.socket
    sent: int = 0
    lost_waiting: deque[tuple[int, int, int]] = field(default_factory=deque)  # (index, seq, t_send)
    req_lost_classified: int = 0


class Prober(_Endpoint):
    """Sends a plan's flows round-robin at ``rate_pps`` and reports every probe's fate.

    ``flows`` are (dst NIC id, 5-tuple) pairs; ``src`` is this NIC's id (for the records).
    Every probe the kernel accepted reaches ``sink`` exactly once (answered, or lost when
    its timeout passes or at :meth:`stop`); ``answered`` / ``lost`` count them.
    """

    def __init__(self, src: str, flows: list[tuple[str, FiveTuple]], sink: SampleSink, *,
                 rate_pps: float = 100.0, timeout_s: float = 1.0, classify_after_s: float = 120.0,
                 size: int = wire.SIZE, rcvbuf: int = RCVBUF_BYTES) -> None:
        super().__init__()
        if not flows:
            raise TransportError(f"probe agent {src}: the plan has no flows to probe")
        if not wire.SIZE <= size <= wire.MAX_SIZE:
            raise TransportError(f"probe agent {src}: probe size must be {wire.SIZE}..{wire.MAX_SIZE} bytes, got {size}")
        self.src = src
        self.sink = sink
        self.rate = float(rate_pps)
        self.timeout_ns = int(timeout_s * 1e9)
        self.classify_after_ns = int(classify_after_s * 1e9)
        self.size = size
        self.session = int.from_bytes(os.urandom(4), "big")
        self.answered = 0
        self.lost = 0
        self._rcvbuf = rcvbuf
        self._flow_specs = flows
        self._flows: list[_Flow] = []
        self._socks: dict[int, socket.socket] = {}
        self._pending: dict[int, tuple[int, int, int]] = {}  # seq -> (flow, index, t_send)
        self._timeouts: deque[tuple[int, int]] = deque()  # (t_send, seq), in send order
        self._seq = 0
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def flow_count(self) -> int:
        return len(self._flow_specs)

    @property
    def pending(self) -> int:
        """Probes sent whose fate is not reported yet (awaiting a reply or a loss direction)."""
        return len(self._pending) + sum(len(f.lost_waiting) for f in self._flows)

    @property
    def pending_replies(self) -> int:
        """Probes sent that are still waiting for their reply (not yet timed out)."""
        return len(self._pending)

    def _sockets(self) -> list[socket.socket]:
        return list(self._socks.values())

    async def start(self) -> Prober:
        self._loop = asyncio.get_running_loop()
        try:
            for dst, ft in self._flow_specs:
                sock = self._socks.get(ft.src_port)
                if sock is None:
                    sock, self.kernel_ts = _udp_socket(ft.src_ip, ft.src_port, rcvbuf=self._rcvbuf)
                    self._socks[ft.src_port] = sock
                    self._loop.add_reader(sock.fileno(), self._drain, sock)
                real = FiveTuple(ft.src_ip, ft.dst_ip, sock.getsockname()[1], ft.dst_port, ft.proto)
                self._flows.append(_Flow(dst, real, sock))
        except BaseException:
            self._close()
            raise
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        gap = 1e9 / self.rate
        t_next = time.monotonic_ns()
        tick = max(0.0005, min(0.05, 1.0 / self.rate))
        while True:
            now = time.monotonic_ns()
            while t_next <= now:
                self._send_one()
                t_next += int(gap)
            self._expire(time.time_ns())
            await asyncio.sleep(tick)

    def _send_one(self) -> None:
        i = self._next
        self._next = (i + 1) % len(self._flows)
        f = self._flows[i]
        self._seq += 1
        seq = self._seq
        t = time.time_ns()
        data = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, self.session, seq, t), size=self.size)
        try:
            f.sock.sendto(data, (f.ft.dst_ip, f.ft.dst_port))
        except OSError:
            # Refused locally: nothing left the host, so it is no probe and no loss.
            self.counters.send_errors += 1
            return
        self.counters.sent += 1
        f.sent += 1
        self._pending[seq] = (i, f.sent, t)
        self._timeouts.append((t, seq))

    def _emit(self, sample: ProbeSample, status: int) -> None:
        if status == ANSWERED:
            self.answered += 1
        else:
            self.lost += 1
        self.sink(sample, status)

    def _drain(self, sock: socket.socket) -> None:
        for _ in range(256):
            got = self._recv(sock)
            if got is None:
                return
            data, t_recv, _peer = got
            try:
                p = wire.decode(data)
            except wire.MalformedPacket as exc:
                self.counters.reject(exc.reason)
                continue
            if p.is_request or p.session != self.session:
                self.counters.reject("foreign-session" if not p.is_request else "type")
                continue
            hit = self._pending.pop(p.seq, None)
            if hit is None:
                self.counters.reject("late")
                continue
            i, index, t_send = hit
            f = self._flows[i]
            self._emit(ProbeSample(self.src, f.dst, f.ft, p.seq, t_send, p.t_resp_rx_ns,
                                   p.t_resp_tx_ns, t_recv), ANSWERED)
            self._classify(f, index, p.rx_count)

    def _classify(self, f: _Flow, index: int, rx_count: int) -> None:
        """Requests sent up to ``index`` minus requests the responder got = request losses."""
        req_lost = max(0, index - rx_count)
        while f.lost_waiting and f.lost_waiting[0][0] < index:
            _idx, seq, t_send = f.lost_waiting.popleft()
            if f.req_lost_classified < req_lost:
                f.req_lost_classified += 1
                status = REQUEST_LOST
            else:
                status = REPLY_LOST
            self._emit(ProbeSample(self.src, f.dst, f.ft, seq, t_send, None, None, None), status)

    def _expire(self, now: int) -> None:
        while self._timeouts and now - self._timeouts[0][0] > self.timeout_ns:
            _t, seq = self._timeouts.popleft()
            hit = self._pending.pop(seq, None)
            if hit is not None:
                i, index, t_send = hit
                self._flows[i].lost_waiting.append((index, seq, t_send))
        for f in self._flows:
            while f.lost_waiting and now - f.lost_waiting[0][2] > self.classify_after_ns:
                _idx, seq, t_send = f.lost_waiting.popleft()
                self._emit(ProbeSample(self.src, f.dst, f.ft, seq, t_send, None, None, None), LOST_UNKNOWN)

    async def halt(self) -> None:
        """Stop sending; replies keep being received (and matched) until :meth:`stop`."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def stop(self, *, drain_s: float = 0.0) -> None:
        """Stop sending; wait up to ``drain_s`` for the replies still in flight (less when they
        are all in); report the rest as lost (unknown direction). Every probe sent is reported."""
        await self.halt()
        t_end = time.monotonic() + drain_s
        while self._pending and time.monotonic() < t_end:
            await asyncio.sleep(min(0.02, max(0.0, t_end - time.monotonic())))
        self._expire(time.time_ns() + self.timeout_ns + 1)
        for f in self._flows:
            while f.lost_waiting:
                _idx, seq, t_send = f.lost_waiting.popleft()
                self._emit(ProbeSample(self.src, f.dst, f.ft, seq, t_send, None, None, None), LOST_UNKNOWN)
        self.refresh_kernel_drops()
        self._close()

    def _close(self) -> None:
        for s in self._socks.values():
            if self._loop is not None:
                with contextlib.suppress(ValueError, OSError):
                    self._loop.remove_reader(s.fileno())
            s.close()
        self._socks.clear()


def loopback_benchmark(*, seconds: float = 3.0, rate_pps: float = 12_000.0,
                       flows: int = 64) -> dict[str, Any]:
    """Probes/s one agent (prober + responder in one process, one core) sustains on
    loopback, and the CPU it uses at 100 probes/s."""
    out: dict[str, Any] = {}
    for label, rate, dur in (("max", rate_pps, seconds), ("at_100pps", 100.0, max(seconds, 5.0))):
        answered = [0]

        def sink(_s: ProbeSample, status: int, answered: list[int] = answered) -> None:
            if status == ANSWERED:
                answered[0] += 1

        async def run(rate: float = rate, dur: float = dur, sink: SampleSink = sink) -> dict[str, Any]:
            resp = await Responder("127.0.0.1", 0).start()
            fl = [("lo", FiveTuple("127.0.0.1", "127.0.0.1", 0, resp.port)) for _ in range(flows)]
            pr = Prober("lo", fl, sink, rate_pps=rate, timeout_s=1.0)
            await pr.start()
            c0, t0 = time.process_time(), time.perf_counter()
            await asyncio.sleep(dur)
            c1, t1 = time.process_time(), time.perf_counter()
            sent = pr.counters.sent
            await pr.stop(drain_s=0.2)
            await resp.stop()
            return {"target_pps": rate, "seconds": t1 - t0, "sent": sent,
                    "probes_per_s": sent / (t1 - t0), "cpu_fraction": (c1 - c0) / (t1 - t0),
                    "kernel_timestamps": resp.kernel_ts}

        r = asyncio.run(run())
        r["answered"] = answered[0]
        r["answered_per_s"] = answered[0] / r["seconds"]
        # On a shared machine the wall-clock rate is capped by the CPU share we get; probes
        # answered per CPU-second of this process is what one dedicated core would sustain.
        cpu_s = r["cpu_fraction"] * r["seconds"]
        r["answered_per_cpu_s"] = answered[0] / cpu_s if cpu_s > 0 else None
        out[label] = r
    return out
