"""Composition for live probing: plan -> agent (responder + prober) -> store, and
store -> analysis -> findings.

Paths on live hosts come from a traceroute cache (``--paths``, JSON written by
:mod:`fabricscope.probe.traceroute` tools) when available; otherwise each flow's candidate
path set from the inventory's ECMP next hops (weights = even split per hop), which the
localizer accepts (it then blames the links shared by the lossy flows' candidate sets).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, FiveTuple, ProbeSample
from fabricscope.probe.agent import Counters, Prober, Responder
from fabricscope.probe.analysis import Baseline, Observations, analyze
from fabricscope.probe.localize import PathModel
from fabricscope.probe.plan import plan_mesh, plan_probes
from fabricscope.probe.traceroute import (
    HopMap,
    TraceResult,
    local_ipv4_addresses,
    path_cache_entries,
    trace_paths,
)
from fabricscope.store.probes import ProbeStore, write_jsonl

if TYPE_CHECKING:  # nats-py is imported only by an agent that publishes to the bus
    from fabricscope.cluster.bus import BusConfig, BusPublisher


def self_nics(fabric: Fabric, self_id: str) -> list[str]:
    """NIC ids for ``--self``: a NIC id, or a host id (all its NICs)."""
    d = fabric.devices.get(self_id)
    if d is None:
        raise ConfigError(f"--self {self_id!r}: no such host or NIC in inventory {fabric.name!r}")
    if d.role == "nic":
        return [d.id]
    if d.role == "host":
        return [n.id for n in fabric.nics_of_host[d.id]]
    raise ConfigError(f"--self {self_id!r}: is a {d.role}, expected a host or a NIC")


@dataclass(frozen=True)
class AgentSnapshot:
    """Self-metrics of a running probe agent (all NICs, all epochs so far), cheap to take.

    ``probes_sent`` = ``probes_answered + probes_lost + probes_pending``, and every answered or
    lost probe is a stored (or buffered) sample: ``samples_stored + samples_buffered`` equals
    ``probes_answered + probes_lost``. ``rejected`` is keyed ``responder/<reason>`` and
    ``prober/<reason>`` (reasons of :mod:`fabricscope.probe.wire`, plus ``foreign-session``
    and ``late``). ``kernel_drops``: datagrams the kernel discarded for a full receive buffer.
    """

    nics: tuple[str, ...]
    flows: int
    probes_sent: int
    probes_answered: int
    probes_lost: int
    probes_pending: int
    send_errors: int
    samples_stored: int
    samples_buffered: int
    responder_received: int
    responder_answered: int
    rejected: Mapping[str, int]
    kernel_drops: int
    stopped_by: str | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready counters (the agent's final summary line)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["nics"] = list(self.nics)
        d["rejected"] = dict(sorted(self.rejected.items()))
        return d

    def line(self) -> str:
        """One log line: what the agent did so far."""
        rej = " ".join(f"{k}={v}" for k, v in sorted(self.rejected.items())) or "none"
        return (f"probe agent: sent {self.probes_sent} answered {self.probes_answered} "
                f"lost {self.probes_lost} pending {self.probes_pending} stored {self.samples_stored} "
                f"send_errors {self.send_errors} kernel_drops {self.kernel_drops} rejected {rej}")

    def prometheus(self) -> list[tuple[str, dict[str, str], float]]:
        """(metric name, labels, value) for a Prometheus exporter (all counters, one gauge)."""
        out: list[tuple[str, dict[str, str], float]] = [
            ("fabricscope_probe_sent_total", {}, self.probes_sent),
            ("fabricscope_probe_answered_total", {}, self.probes_answered),
            ("fabricscope_probe_lost_total", {}, self.probes_lost),
            ("fabricscope_probe_pending", {}, self.probes_pending),
            ("fabricscope_probe_send_errors_total", {}, self.send_errors),
            ("fabricscope_probe_samples_stored_total", {}, self.samples_stored),
            ("fabricscope_probe_responder_received_total", {}, self.responder_received),
            ("fabricscope_probe_responder_answered_total", {}, self.responder_answered),
            ("fabricscope_probe_kernel_drops_total", {}, self.kernel_drops),
        ]
        for key, n in sorted(self.rejected.items()):
            role, _, reason = key.partition("/")
            out.append(("fabricscope_probe_rejected_total", {"role": role, "reason": reason}, n))
        return out


class ProbeAgent:
    """Responders and probers for ``self_id``'s NICs, the plan re-drawn every epoch, samples
    to DuckDB and/or JSON lines; :meth:`snapshot` while it runs, a bounded shutdown.

    :meth:`stop` (SIGINT / SIGTERM when ``handle_signals``) ends sending, waits for the
    replies in flight until ``shutdown_timeout_s`` (a second stop cuts the wait short), reports
    the rest as lost, flushes every sample and closes the outputs.
    """

    def __init__(self, fabric: Fabric, self_id: str, *, seed: int = 0, rate_pps: float = 100.0,
                 duration_s: float = 0.0, epoch_s: float = 30.0, db: Path | None = None,
                 jsonl: Path | None = None, echo: Callable[[str], None] = print,
                 log: Callable[[str], None] | None = None, flush_every: int = 2000,
                 stats_every_s: float = 10.0, shutdown_timeout_s: float = 5.0,
                 drain_s: float = 1.0, bus: BusConfig | None = None) -> None:
        self.fabric = fabric
        self.nics = self_nics(fabric, self_id)
        for n in self.nics:
            if fabric.devices[n].address is None:
                raise ConfigError(f"inventory {fabric.name}: NIC {n} has no address")
        self.seed, self.rate_pps, self.duration_s, self.epoch_s = seed, rate_pps, duration_s, epoch_s
        self.db, self.jsonl, self.bus = db, jsonl, bus
        self.echo = echo
        self.log = log or echo
        self.flush_every = flush_every
        self.stats_every_s = stats_every_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.drain_s = drain_s
        self.stopped_by: str | None = None
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._responders: list[Responder] = []
        self._probers: list[Prober] = []
        self._done = Counters()  # probers of finished epochs
        self._done_answered = self._done_lost = 0
        self._stored = 0
        self._flows = 0  # flows of the current (or last) epoch's plan
        self._buf: list[tuple[ProbeSample, int]] = []
        self._store: ProbeStore | None = None
        self._fh: IO[str] | None = None
        self._pub: BusPublisher | None = None

    # -- outputs -------------------------------------------------------------------------
    def _open_outputs(self) -> None:
        """Open --db / --jsonl before any socket or probe: a bad path is one line, not lost work."""
        for opt, path in (("--db", self.db), ("--jsonl", self.jsonl)):
            if path is not None and not path.parent.is_dir():
                raise ConfigError(f"probe agent: {opt} {path}: folder {path.parent} does not exist")
        if self.jsonl is not None:
            try:
                self._fh = open(self.jsonl, "a", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                raise ConfigError(f"probe agent: --jsonl {self.jsonl}: cannot open for appending: "
                                  f"{exc.strerror}") from None
        if self.bus is not None:  # publishes to fs.probes.<NIC>; buffers while NATS is away
            from fabricscope.cluster.bus import BusPublisher

            self._pub = BusPublisher(self.bus)
        if self.db is not None:
            try:
                self._store = ProbeStore(self.db)
            except Exception as exc:  # duckdb raises its own types: name the file, not the driver
                self._close_outputs()
                raise ConfigError(f"probe agent: --db {self.db}: cannot open: {exc}") from None

    def _close_outputs(self) -> None:
        if self._pub is not None:
            self._pub.close(deadline_s=max(1.0, self.shutdown_timeout_s))
            ps = self._pub.stats()
            self.log(f"probe agent: bus {self.bus.url if self.bus else ''}: published {ps.published_events} samples"
                     f", dropped {ps.dropped_events}, lost {ps.lost_events}")
            self._pub = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _flush(self) -> None:
        if not self._buf:
            return
        if self._store is not None:
            self._store.insert([s for s, _ in self._buf], [st for _, st in self._buf])
        if self._fh is not None:
            write_jsonl(self._buf, self._fh)
            self._fh.flush()
        if self._pub is not None:
            self._pub.write_probes([s for s, _ in self._buf], [st for _, st in self._buf])
        self._stored += len(self._buf)
        self._buf.clear()

    def _sink(self, s: ProbeSample, status: int) -> None:
        self._buf.append((s, status))
        if len(self._buf) >= self.flush_every:
            self._flush()

    # -- control -------------------------------------------------------------------------
    def stop(self, reason: str | None = None) -> None:
        """Begin the graceful shutdown (idempotent; a second call skips the wait for replies)."""
        if self._stop.is_set():
            self._hurry.set()
            return
        if reason is not None:
            self.stopped_by = reason
        self._stop.set()

    def snapshot(self) -> AgentSnapshot:
        """The counters now (cheap: no syscall except the /proc drop read at stats time)."""
        rejected: dict[str, int] = {}
        for role, counters in (("prober", [self._done, *(p.counters for p in self._probers)]),
                               ("responder", [r.counters for r in self._responders])):
            for c in counters:
                for reason, n in c.rejected.items():
                    rejected[f"{role}/{reason}"] = rejected.get(f"{role}/{reason}", 0) + n
        probers = self._probers
        return AgentSnapshot(
            nics=tuple(self.nics), flows=self._flows,
            probes_sent=self._done.sent + sum(p.counters.sent for p in probers),
            probes_answered=self._done_answered + sum(p.answered for p in probers),
            probes_lost=self._done_lost + sum(p.lost for p in probers),
            probes_pending=sum(p.pending for p in probers),
            send_errors=self._done.send_errors + sum(p.counters.send_errors for p in probers),
            samples_stored=self._stored, samples_buffered=len(self._buf),
            responder_received=sum(r.counters.received for r in self._responders),
            responder_answered=sum(r.counters.sent for r in self._responders),
            rejected=rejected,
            kernel_drops=(self._done.kernel_drops + sum(p.counters.kernel_drops for p in probers)
                          + sum(r.counters.kernel_drops for r in self._responders)),
            stopped_by=self.stopped_by)

    def _refresh_drops(self) -> None:
        for ep in (*self._probers, *self._responders):
            ep.refresh_kernel_drops()

    async def _end_epoch(self, deadline: float) -> None:
        """Stop sending, wait for replies in flight (until ``deadline`` or a second stop), report."""
        for p in self._probers:
            await p.halt()
        while (any(p.pending_replies for p in self._probers) and time.monotonic() < deadline
               and not self._hurry.is_set()):
            await asyncio.sleep(0.02)
        await self._retire_probers()
        self._flush()

    async def _retire_probers(self) -> None:
        """Stop the probers (their unanswered probes become lost samples) and keep their counts."""
        for p in self._probers:
            await p.stop()
            self._done.sent += p.counters.sent
            self._done.send_errors += p.counters.send_errors
            self._done.kernel_drops += p.counters.kernel_drops
            for reason, n in p.counters.rejected.items():
                self._done.rejected[reason] = self._done.rejected.get(reason, 0) + n
            self._done_answered += p.answered
            self._done_lost += p.lost
        self._probers = []

    async def run(self, *, handle_signals: bool = False) -> AgentSnapshot:
        """Probe until ``duration_s`` passes or :meth:`stop`; returns the final snapshot."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self.stop, signal.Signals(sig).name)
                    installed.append(sig)
        self._open_outputs()
        t_end = time.monotonic() + self.duration_s if self.duration_s > 0 else None
        epoch = int(time.time() // self.epoch_s)
        try:
            for n in self.nics:
                addr = self.fabric.devices[n].address
                assert addr is not None
                self._responders.append(await Responder(addr).start())
            next_stats = time.monotonic() + self.stats_every_s
            while not self._stop.is_set():
                for n in self.nics:
                    plan = plan_probes(self.fabric, n, seed=self.seed, epoch=epoch,
                                       budget_pps=self.rate_pps, epoch_s=self.epoch_s)
                    self._probers.append(await Prober(n, plan.flows(self.fabric), self._sink,
                                                      rate_pps=self.rate_pps).start())
                self._flows = sum(p.flow_count for p in self._probers)
                self.log(f"epoch {epoch}: probing {self._flows} flows "
                         f"from {', '.join(self.nics)} at {self.rate_pps:g} probes/s per NIC")
                next_epoch = (epoch + 1) * self.epoch_s
                while not self._stop.is_set() and time.time() < next_epoch:
                    if t_end is not None and time.monotonic() >= t_end:
                        self._stop.set()
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), 0.2)
                    self._flush()
                    if self.stats_every_s > 0 and time.monotonic() >= next_stats:
                        self._refresh_drops()
                        self.log(self.snapshot().line())
                        next_stats += self.stats_every_s * max(1, int((time.monotonic() - next_stats)
                                                                     // self.stats_every_s) + 1)
                if self._stop.is_set():
                    if self.stopped_by is not None:
                        self.log(f"probe agent: {self.stopped_by}: stopping; waiting up to "
                                 f"{min(self.drain_s, self.shutdown_timeout_s):g} s for replies in flight")
                    await self._end_epoch(time.monotonic() + min(self.drain_s, self.shutdown_timeout_s))
                else:
                    await self._end_epoch(time.monotonic() + self.drain_s)
                epoch += 1
        finally:
            await self._retire_probers()  # start-up failed half way, or cancelled: still report all
            for r in self._responders:
                await r.stop()
            try:
                self._flush()
            finally:
                self._close_outputs()
                for sig in installed:
                    loop.remove_signal_handler(sig)
        snap = self.snapshot()
        self.log(snap.line())
        return snap


async def run_agent(
    fabric: Fabric,
    self_id: str,
    *,
    handle_signals: bool = False,
    **kw: Any,
) -> AgentSnapshot:
    """Run a :class:`ProbeAgent` (keyword arguments as its constructor) until it stops."""
    return await ProbeAgent(fabric, self_id, **kw).run(handle_signals=handle_signals)


def trace_flows(fabric: Fabric, nics: Sequence[str], *, seed: int = 0, epoch_s: float = 30.0,
                rate_pps: float = 100.0, now_s: float | None = None) -> list[FiveTuple]:
    """The 5-tuples to trace for ``nics``: their probe flows of this epoch and the next, and
    the reply direction of every flow that probes them (it starts at this host)."""
    mine = set(nics)
    ep = int((time.time() if now_s is None else now_s) // epoch_s)
    flows: list[FiveTuple] = []
    for e in (ep, ep + 1):
        for src, plan in plan_mesh(fabric, seed=seed, epoch=e, budget_pps=rate_pps, epoch_s=epoch_s).items():
            for dst, ft in plan.flows(fabric):
                if src in mine:
                    flows.append(ft)
                if dst in mine:
                    flows.append(FiveTuple(ft.dst_ip, ft.src_ip, ft.dst_port, ft.src_port, ft.proto))
    return list(dict.fromkeys(flows))


def local_nics(fabric: Fabric, addresses: Iterable[str]) -> list[str]:
    """The inventory NICs whose address is one of ``addresses`` (this host's interfaces)."""
    by_addr = fabric.nic_by_address
    return sorted({by_addr[a].id for a in addresses if a in by_addr})


def read_port_addresses(path: Path) -> dict[str, str]:
    """Router port addresses: JSON ``{port id: address}``, or a lab's ``ports.json``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read port addresses: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("port_addr"), dict):
        data = data["port_addr"]
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ConfigError(f"{path}: expected a JSON object {{port id: address}} (or a lab ports.json)")
    return dict(data)


def trace_host(fabric: Fabric, nics: Sequence[str] | None, *, port_addr: Mapping[str, str] | None = None,
               seed: int = 0, epoch_s: float = 30.0, rate_pps: float = 100.0, now_s: float | None = None,
               **trace_kw: Any) -> tuple[list[FiveTuple], TraceResult]:
    """Paris-trace the probe flows of ``nics`` (None: the inventory NICs on this host's
    interfaces) in both directions, those of the epoch holding ``now_s`` (None: now) and the
    next; returns the flows and the :class:`TraceResult`."""
    if nics is None:
        nics = local_nics(fabric, local_ipv4_addresses())
        if not nics:
            raise ConfigError(f"lab trace: no NIC of inventory {fabric.name!r} has an address on this "
                              "host's interfaces; give --self (or run inside the host's namespace)")
    flows = trace_flows(fabric, nics, seed=seed, epoch_s=epoch_s, rate_pps=rate_pps, now_s=now_s)
    return flows, trace_paths(fabric, flows, HopMap.build(fabric, port_addr), **trace_kw)


def write_path_cache(result: TraceResult, out: Path) -> None:
    """Write the traced paths (atomically: a reader never sees half a file)."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(path_cache_entries(result), fh)
    os.replace(tmp, out)


def read_paths(path: Path, fabric: Fabric) -> dict[tuple[str, str, int, int], tuple[int, ...]]:
    """A traceroute path cache: JSON list of {src_ip, dst_ip, src_port, dst_port, links: [directed link ids]}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read path cache: {exc}") from None
    out: dict[tuple[str, str, int, int], tuple[int, ...]] = {}
    for i, row in enumerate(data):
        try:
            key = (str(row["src_ip"]), str(row["dst_ip"]), int(row["src_port"]), int(row["dst_port"]))
            out[key] = tuple(fabric.edge_index(x) for x in row["links"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: entry {i}: {exc}") from None
    return out


def live_path_model(fabric: Fabric, paths: Mapping[tuple[str, str, int, int], tuple[int, ...]] | None = None) -> PathModel:
    """Known paths where traced, else the candidate set (even split per hop)."""
    routing = Routing(fabric)
    known = paths or {}

    def resolve(src: str, dst: str, ft: FiveTuple) -> Sequence[int] | Mapping[int, float]:
        hit = known.get((ft.src_ip, ft.dst_ip, ft.src_port, ft.dst_port))
        if hit is not None:
            return hit
        return routing.spray_weights(src, dst)

    return PathModel(fabric, resolve)


def analyze_observations(fabric: Fabric, obs: Observations, *, method: str = "map",
                         paths: Mapping[tuple[str, str, int, int], tuple[int, ...]] | None = None,
                         baseline: Baseline | None = None) -> list[Finding]:
    """Findings of one window of stored live probes. Without a baseline, one is learned
    from the same window (robustly: the background loss rate trims implausible flows and
    the responder time is the fleet median)."""
    if baseline is None:
        baseline = Baseline()
        baseline.learn(obs, track_rtt=False)
    return analyze(fabric, live_path_model(fabric, paths), obs, baseline, method=method)
