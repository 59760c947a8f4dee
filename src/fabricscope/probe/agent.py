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
"""

from __future__ import annotations

import asyncio
import contextlib
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

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if os.uname().sysname == "Linux" else None)
_TS = struct.Struct("@ll")
SampleSink = Callable[[ProbeSample, int], None]  # (sample, status: ANSWERED/REQUEST_LOST/...)


def _udp_socket(addr: str, port: int) -> tuple[socket.socket, bool]:
    """A non-blocking UDP socket bound to (addr, port); True when kernel RX timestamps are on."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    ts = False
    if SO_TIMESTAMPNS is not None:
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            ts = True
        except OSError:
            ts = False
    try:
        s.bind((addr, port))
    except OSError as exc:
        s.close()
        raise TransportError(f"probe agent: cannot bind UDP {addr}:{port}: {exc.strerror}") from exc
    s.setblocking(False)
    return s, ts


def _rx_time(anc: list[tuple[int, int, bytes]]) -> int:
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(data) >= _TS.size:
            sec, nsec = _TS.unpack_from(data)
            return int(sec) * 1_000_000_000 + int(nsec)
    return time.time_ns()


@dataclass
class Counters:
    """What an endpoint saw; ``rejected`` is keyed by :class:`~fabricscope.probe.wire.MalformedPacket` reason."""

    received: int = 0
    sent: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Responder:
    """Answers probe requests arriving at ``addr:port``."""

    def __init__(self, addr: str = "127.0.0.1", port: int = PROBE_PORT,
                 *, max_flows: int = 200_000) -> None:
        self.addr, self.port = addr, port
        self.counters = Counters()
        self.kernel_ts = False
        self._rx: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._max_flows = max_flows
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> Responder:
        self._sock, self.kernel_ts = _udp_socket(self.addr, self.port)
        self.port = self._sock.getsockname()[1]
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._drain)
        return self

    def _drain(self) -> None:
        sock = self._sock
        assert sock is not None
        for _ in range(256):
            try:
                data, anc, _flags, peer = sock.recvmsg(2048, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            t_rx = _rx_time(anc) if self.kernel_ts else time.time_ns()
            self.counters.received += 1
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
                self.counters.reject("send")

    async def stop(self) -> None:
        if self._sock is not None and self._loop is not None:
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


class Prober:
    """Sends a plan's flows round-robin at ``rate_pps`` and reports every probe's fate.

    ``flows`` are (dst NIC id, 5-tuple) pairs; ``src`` is this NIC's id (for the records).
    """

    def __init__(self, src: str, flows: list[tuple[str, FiveTuple]], sink: SampleSink, *,
                 rate_pps: float = 100.0, timeout_s: float = 1.0, classify_after_s: float = 120.0,
                 size: int = wire.SIZE) -> None:
        if not flows:
            raise TransportError(f"probe agent {src}: the plan has no flows to probe")
        self.src = src
        self.sink = sink
        self.rate = float(rate_pps)
        self.timeout_ns = int(timeout_s * 1e9)
        self.classify_after_ns = int(classify_after_s * 1e9)
        self.size = size
        self.session = int.from_bytes(os.urandom(4), "big")
        self.counters = Counters()
        self.kernel_ts = False
        self._flow_specs = flows
        self._flows: list[_Flow] = []
        self._socks: dict[int, socket.socket] = {}
        self._pending: dict[int, tuple[int, int, int]] = {}  # seq -> (flow, index, t_send)
        self._timeouts: deque[tuple[int, int]] = deque()  # (t_send, seq), in send order
        self._seq = 0
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Prober:
        self._loop = asyncio.get_running_loop()
        for dst, ft in self._flow_specs:
            sock = self._socks.get(ft.src_port)
            if sock is None:
                sock, self.kernel_ts = _udp_socket(ft.src_ip, ft.src_port)
                self._socks[ft.src_port] = sock
                self._loop.add_reader(sock.fileno(), self._drain, sock)
            real = FiveTuple(ft.src_ip, ft.dst_ip, sock.getsockname()[1], ft.dst_port, ft.proto)
            self._flows.append(_Flow(dst, real, sock))
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
        f.sent += 1
        t = time.time_ns()
        data = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, self.session, seq, t), size=self.size)
        try:
            f.sock.sendto(data, (f.ft.dst_ip, f.ft.dst_port))
            self.counters.sent += 1
        except OSError:
            self.counters.reject("send")
        self._pending[seq] = (i, f.sent, t)
        self._timeouts.append((t, seq))

    def _drain(self, sock: socket.socket) -> None:
        for _ in range(256):
            try:
                data, anc, _flags, _peer = sock.recvmsg(2048, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            t_recv = _rx_time(anc) if self.kernel_ts else time.time_ns()
            self.counters.received += 1
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
            self.sink(ProbeSample(self.src, f.dst, f.ft, p.seq, t_send, p.t_resp_rx_ns,
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
            self.sink(ProbeSample(self.src, f.dst, f.ft, seq, t_send, None, None, None), status)

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
                self.sink(ProbeSample(self.src, f.dst, f.ft, seq, t_send, None, None, None), LOST_UNKNOWN)

    async def stop(self, *, drain_s: float = 0.0) -> None:
        """Stop sending; wait ``drain_s`` for late replies; report the rest as lost (unknown
        direction)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if drain_s > 0:
            await asyncio.sleep(drain_s)
        self._expire(time.time_ns() + self.timeout_ns + 1)
        for f in self._flows:
            while f.lost_waiting:
                _idx, seq, t_send = f.lost_waiting.popleft()
                self.sink(ProbeSample(self.src, f.dst, f.ft, seq, t_send, None, None, None), LOST_UNKNOWN)
        if self._loop is not None:
            for s in self._socks.values():
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
