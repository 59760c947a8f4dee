"""Twin training traces: a DP x TP x PP job's per-rank operator timings, with faults and truth.

The generator plays a synchronous training job on a fabric, iteration by iteration:
GPipe-style forward then backward over ``microbatches`` (blocking send/recv between stages,
a TP all-reduce after every micro-batch's compute inside a server), then a ring all-reduce
of gradients per data-parallel group and an optimizer step. Compute times get per-op
lognormal noise; communication times come from a :class:`CommModel`:

* :class:`EngineComm` runs each transfer / ring on the flow engine
  (:func:`fabricscope.sim.engine.simulate`, max-min fair, real ECMP paths, link faults), cached
  per (group, size, active faults); collectives of different groups are simulated apart
  (concurrent groups do not share links in this model);
* :class:`AlphaBetaComm` uses the alpha-beta model with each rank's NIC bandwidth (cheap; for
  large benchmarks).

Faults (:mod:`fabricscope.sim.faults`): ``slow-gpu`` (subject ``host/gpuN``, compute x factor),
``slow-nic`` (NIC bandwidth x factor), ``link-degraded`` / ``congestion`` on a NIC's access
cable (capacity x factor / x (1 - load)), ``stage-imbalance`` (subject ``stage:S``, compute of
stage S x factor) and ``sequence-imbalance`` (subject ``job``, micro-batch cost lognormal with
``cv``). Fault windows are in trace nanoseconds; an op sees the faults active when its
iteration starts.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.sim.workload.placement import Placement, place_ranks

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

OP_NAMES = ("forward-compute", "backward-compute", "forward-send", "forward-recv",
            "backward-send", "backward-recv", "tp-allreduce", "dp-allreduce", "optimizer")
(FWD, BWD, FSEND, FRECV, BSEND, BRECV, TPAR, DPAR, OPTIM) = range(9)
KIND_OF_OP = (0, 0, 2, 2, 2, 2, 1, 1, 0)  # compute / collective / p2p (straggler.table codes)
NVLINK_BPS = 2.4e12  # intra-server bandwidth for TP and same-host pipeline hops
TRACE_T0_NS = 1_000_000_000  # the trace clock's first iteration start


@dataclass(frozen=True, slots=True)
class TwinJob:
    """Shape and costs of the simulated job (Megatron rank layout r = t + tp*(d + dp*p))."""

    dp: int
    tp: int = 1
    pp: int = 1
    microbatches: int = 4
    iterations: int = 20
    fwd_ns: int = 20_000_000
    bwd_ns: int = 40_000_000
    optimizer_ns: int = 5_000_000
    activation_bytes: float = 32 << 20
    grad_bytes: float = 1 << 30
    tp_bytes: float = 8 << 20
    compute_cv: float = 0.02
    comm_cv: float = 0.02
    #: "gpipe" (all forwards, then all backwards) or "1f1b" (Megatron's one-forward-one-backward
    #: with fused send_forward_recv_backward / send_backward_recv_forward calls).
    schedule: str = "gpipe"
    #: mean host-side idle gap (ns, exponential) before each compute op: kernel-launch and
    #: data-loader hiccups that real traces show and no device causes.
    launch_gap_ns: float = 0.0

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def rank(self, d: int, t: int, p: int) -> int:
        return t + self.tp * (d + self.dp * p)


def nominal_iteration_ns(job: TwinJob) -> int:
    """Rough fault-free iteration time ((m + pp - 1) slots of forward + backward, GPipe or 1F1B).

    Used to place fault windows at iteration boundaries: ``TRACE_T0_NS + k * nominal``.
    """
    slots = job.microbatches + job.pp - 1
    return int(slots * (job.fwd_ns + job.bwd_ns) + job.optimizer_ns)


class CommModel(Protocol):
    """Where communication times come from: arrays of durations (ns)."""

    def p2p_ns(self, src: I64, dst: I64, nbytes: float, faults: tuple[Fault, ...]) -> F64: ...

    def ring_ns(self, groups: Sequence[I64], nbytes: float, faults: tuple[Fault, ...]) -> F64: ...


def _nic_factor(fabric: Fabric, placement: Placement, faults: tuple[Fault, ...]) -> dict[str, float]:
    """Bandwidth factor per NIC from NIC faults and faults on its access cable."""
    out: dict[str, float] = {}
    nic_of_port = {p: n.id for n in fabric.nics for p in fabric.ports_of.get(n.id, ())}
    leaves = fabric.leaves_of_nic
    for f in faults:
        if f.kind == "switch-fault":
            # A sick switch (buffer / forwarding trouble): every NIC cabled to it slows.
            for nic_id, lv in leaves.items():
                if f.subject in lv:
                    out[nic_id] = out.get(nic_id, 1.0) * f.param("factor", 0.5)
        elif f.kind in ("slow-nic", "nic-fault"):
            out[f.subject] = out.get(f.subject, 1.0) * f.param("factor", 0.5)
        elif f.kind in ("link-degraded", "congestion"):
            factor = f.param("factor", 0.5) if f.kind == "link-degraded" else 1 - f.param("load", 0.5)
            ends = f.subject.replace("->", "|").split("|")
            for port in ends:
                nic = nic_of_port.get(port)
                if nic is not None:
                    out[nic] = out.get(nic, 1.0) * max(factor, 1e-3)
    _ = placement
    return out


class AlphaBetaComm:
    """Alpha-beta communication times from each rank's NIC rate (faults scale it)."""

    def __init__(self, fabric: Fabric, placement: Placement, *, alpha_ns: float = 5_000.0) -> None:
        self.fabric = fabric
        self.placement = placement
        self.alpha = alpha_ns
        cap = {n.id: 0.0 for n in fabric.nics}
        for n in fabric.nics:
            for p in fabric.ports_of.get(n.id, ()):
                ln = fabric.link_of_port.get(p)
                if ln is not None:
                    cap[n.id] += ln.capacity_gbps * 1e9
        self.nic_bps: F64 = np.array([cap[placement.nic(r)] for r in range(placement.n_ranks)],
                                     dtype=np.float64)
        self.host = np.array([hash(placement.host(r)) for r in range(placement.n_ranks)])
        self._nic_names = [placement.nic(r) for r in range(placement.n_ranks)]

    def _bw(self, faults: tuple[Fault, ...]) -> F64:
        fac = _nic_factor(self.fabric, self.placement, faults)
        if not fac:
            return self.nic_bps
        scale = np.array([fac.get(n, 1.0) for n in self._nic_names], dtype=np.float64)
        return np.asarray(self.nic_bps * scale, dtype=np.float64)

    def p2p_ns(self, src: I64, dst: I64, nbytes: float, faults: tuple[Fault, ...]) -> F64:
        bw = self._bw(faults)
        rate = np.where(self.host[src] == self.host[dst], NVLINK_BPS, np.minimum(bw[src], bw[dst]))
        return np.asarray(self.alpha + nbytes * 8.0 / rate * 1e9, dtype=np.float64)

    def ring_ns(self, groups: Sequence[I64], nbytes: float, faults: tuple[Fault, ...]) -> F64:
        bw = self._bw(faults)
        out = np.zeros(len(groups))
        for i, g in enumerate(groups):
            n = g.size
            if n < 2:
                continue
            same = np.all(self.host[g] == self.host[g[0]])
            rate = NVLINK_BPS if same else float(bw[g].min())
            out[i] = 2 * (n - 1) * self.alpha + 2 * (n - 1) / n * nbytes * 8.0 / rate * 1e9
        return out


class EngineComm:
    """Communication times from the flow engine, cached per (group, size, active faults)."""

    def __init__(self, fabric: Fabric, placement: Placement) -> None:
        self.fabric = fabric
        self.placement = placement
        self._cache: dict[tuple[object, ...], float] = {}
        self.simulations = 0
        nic_port = {}
        for n in fabric.nics:
            ports = fabric.ports_of.get(n.id, ())
            if ports:
                nic_port[n.id] = ports[0]
        self._nic_port = nic_port

    def _engine_faults(self, faults: tuple[Fault, ...]) -> list[Fault]:
        """NIC faults become degraded access cables (the engine knows links only)."""
        out: list[Fault] = []
        for f in faults:
            if f.kind == "slow-nic":
                port = self._nic_port.get(f.subject)
                peer = self.fabric.peer_port.get(port or "")
                if port and peer:
                    out.append(Fault("link-degraded", f"{port}|{peer}",
                                     params={"factor": f.param("factor", 0.5)}))
            elif f.kind == "link-degraded":
                out.append(Fault("link-degraded", f.subject, params=dict(f.params)))
            elif f.kind == "switch-fault":
                # A sick switch slows every cable through it.
                for port in self.fabric.ports_of.get(f.subject, ()):
                    ln = self.fabric.link_of_port.get(port)
                    if ln is not None:
                        out.append(Fault("link-degraded", ln.id,
                                         params={"factor": f.param("factor", 0.5)}))
            elif f.kind == "congestion":
                out.append(Fault("link-degraded", f.subject,
                                 params={"factor": max(1 - f.param("load", 0.5), 1e-3)}))
        return out

    def _run(self, key: tuple[object, ...], build: object, faults: tuple[Fault, ...]) -> float:
        from fabricscope.sim.engine import simulate
        from fabricscope.sim.flows import Workload

        fk = tuple(sorted((f.kind, f.subject, tuple(sorted(f.params.items()))) for f in faults))
        full = (*key, fk)
        hit = self._cache.get(full)
        if hit is not None:
            return hit
        assert isinstance(build, Workload)
        res = simulate(self.fabric, build, faults=self._engine_faults(faults),
                       record_utilization=False)
        self.simulations += 1
        t = float(res.completion_ns)
        self._cache[full] = t
        return t

    def p2p_ns(self, src: I64, dst: I64, nbytes: float, faults: tuple[Fault, ...]) -> F64:
        from fabricscope.sim.flows import FlowSpec, Workload

        out = np.zeros(src.size)
        for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            na, nb = self.placement.nic(a), self.placement.nic(b)
            if self.placement.host(a) == self.placement.host(b):
                out[i] = nbytes * 8.0 / NVLINK_BPS * 1e9
                continue
            wl = Workload(f"p2p-{a}-{b}", (FlowSpec(0, na, nb, nbytes, tag="p2p"),))
            out[i] = self._run(("p2p", na, nb, nbytes), wl, faults)
        return out

    def ring_ns(self, groups: Sequence[I64], nbytes: float, faults: tuple[Fault, ...]) -> F64:
        from fabricscope.sim.workload.collectives import ring_collective

        out = np.zeros(len(groups))
        for i, g in enumerate(groups):
            members = [int(x) for x in g.tolist()]
            if len({self.placement.host(r) for r in members}) == 1 or len(members) < 2:
                n = max(len(members), 2)
                out[i] = 2 * (n - 1) / n * nbytes * 8.0 / NVLINK_BPS * 1e9 if len(members) > 1 else 0.0
                continue
            try:
                # NCCL on rail-optimized clusters runs one ring channel per rail (NIC).
                wl = ring_collective(self.placement.subset(members), nbytes, rail_aligned=True)
            except WorkloadError:
                out[i] = 0.0
                continue
            out[i] = self._run(("ring", tuple(members), nbytes), wl, faults)
        return out


@dataclass(frozen=True, slots=True)
class _Iter:
    """Per-iteration state the op emitters read (iteration, fault factors, TP times)."""

    it: int
    stage_factor: F64
    seq_factor: F64
    gpu_factor: F64
    tp_t: list[F64]


@dataclass(slots=True)
class TwinTrace:
    """Columns of the generated operator timings (the layout of ``straggler.table.OpTable``)."""

    job: str
    rank: I64
    iteration: I64
    op: I64
    group: I64
    seq: I64
    start: I64
    end: I64
    nbytes: I64
    stage: I64
    mb: I64
    groups: list[tuple[int, ...]]
    op_names: tuple[str, ...] = OP_NAMES
    placement: list[tuple[str, int]] = field(default_factory=list)
    truth: dict[str, object] = field(default_factory=dict)

    @property
    def kind(self) -> I64:
        return np.asarray(KIND_OF_OP, dtype=np.int64)[self.op]

    def __len__(self) -> int:
        return int(self.rank.size)


def _truth(fabric: Fabric, placement: Placement, job: TwinJob, faults: Sequence[Fault]) -> dict[str, object]:
    """What a correct localizer should say about each fault (subjects as inventory ids)."""
    expected: list[dict[str, object]] = []
    nic_of_port = {p: n.id for n in fabric.nics for p in fabric.ports_of.get(n.id, ())}
    for f in faults:
        if f.kind == "slow-gpu":
            host, gpu = f.subject.split("/gpu")
            ranks = [r for r in range(placement.n_ranks)
                     if placement.host(r) == host and placement.gpu(r) == int(gpu)]
            expected.append({"kind": "slow-gpu", "subject": f.subject, "ranks": ranks})
        elif f.kind == "slow-nic":
            expected.append({"kind": "slow-nic", "subject": f.subject,
                             "accept": [f.subject]})
        elif f.kind in ("link-degraded", "congestion"):
            nics = sorted({nic_of_port[p] for p in f.subject.replace("->", "|").split("|")
                           if p in nic_of_port})
            # From end-host timings an access cable looks like its NIC (docs/straggler.md).
            expected.append({"kind": "slow-nic", "subject": f.subject, "accept": [f.subject, *nics]})
        elif f.kind == "switch-fault":
            expected.append({"kind": "slow-switch", "subject": f.subject, "accept": [f.subject]})
        elif f.kind == "stage-imbalance":
            expected.append({"kind": "imbalance", "subject": f"pipeline stage {int(f.param('stage', job.pp - 1))}"})
        elif f.kind == "sequence-imbalance":
            expected.append({"kind": "imbalance", "subject": "sequence lengths (micro-batches)"})
    return {"faults": [{"kind": f.kind, "subject": f.subject, "start_ns": f.start_ns,
                        "end_ns": f.end_ns, "params": dict(f.params)} for f in faults],
            "expected": expected}


def generate_trace(
    fabric: Fabric,
    job: TwinJob,
    *,
    faults: Sequence[Fault] = (),
    comm: str | CommModel = "engine",
    seed: int | np.random.Generator = 0,
    name: str | None = None,
) -> TwinTrace:
    """Play ``job`` on ``fabric`` for ``job.iterations`` iterations and record every op.

    ``comm``: ``"engine"`` (flow engine, :class:`EngineComm`), ``"alpha-beta"``
    (:class:`AlphaBetaComm`) or any :class:`CommModel`. Deterministic for a given ``seed``.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    dp, tp, pp, mbs = job.dp, job.tp, job.pp, job.microbatches
    if min(dp, tp, pp, mbs, job.iterations) < 1:
        raise WorkloadError(f"twin job: dp/tp/pp/microbatches/iterations must be >= 1: {job}")
    if job.schedule not in ("gpipe", "1f1b"):
        raise ConfigError(f"twin job: schedule: unknown {job.schedule!r} (gpipe or 1f1b)")
    placement = place_ranks(fabric, job.world_size, policy="in-order")
    gpus = len(placement.rail_nics[placement.host(0)])
    if gpus % tp:
        raise WorkloadError(f"twin job: tp {tp} does not divide the {gpus} GPUs of a server")
    model: CommModel
    if comm == "engine":
        model = EngineComm(fabric, placement)
    elif comm == "alpha-beta":
        model = AlphaBetaComm(fabric, placement)
    elif isinstance(comm, str):
        raise ConfigError(f"twin: comm: unknown {comm!r} (engine or alpha-beta)")
    else:
        model = comm
    sched = FaultSchedule.of(faults)
    world = job.world_size
    lanes = dp * tp
    lane = np.arange(lanes, dtype=np.int64)
    d_of_lane = lane // tp
    stage_ranks = [p * lanes + lane for p in range(pp)]

    # Groups: 0 = compute; then fwd pairs, bwd pairs, TP groups, DP groups.
    groups: list[tuple[int, ...]] = [()]
    fwd_gid = np.zeros((pp, lanes), dtype=np.int64)
    bwd_gid = np.zeros((pp, lanes), dtype=np.int64)
    for p in range(pp - 1):
        for i in range(lanes):
            fwd_gid[p, i] = len(groups)
            groups.append((int(stage_ranks[p][i]), int(stage_ranks[p + 1][i])))
    for p in range(pp - 1):
        for i in range(lanes):
            bwd_gid[p + 1, i] = len(groups)
            groups.append((int(stage_ranks[p + 1][i]), int(stage_ranks[p][i])))
    tp_gid = np.zeros((pp, lanes), dtype=np.int64)
    tp_groups: list[list[I64]] = []
    for p in range(pp):
        gl = []
        for d in range(dp):
            members = stage_ranks[p][d * tp:(d + 1) * tp]
            gid = len(groups)
            groups.append(tuple(int(x) for x in members))
            tp_gid[p, d * tp:(d + 1) * tp] = gid
            gl.append(members)
        tp_groups.append(gl)
    dp_gid = np.zeros((pp, lanes), dtype=np.int64)
    dp_groups: list[list[I64]] = []
    for p in range(pp):
        gl = []
        for t in range(tp):
            members = stage_ranks[p][t::tp]
            gid = len(groups)
            groups.append(tuple(int(x) for x in members))
            dp_gid[p, t::tp] = gid
            gl.append(members)
        dp_groups.append(gl)

    gpu_name = [f"{placement.host(r)}/gpu{placement.gpu(r)}" for r in range(world)]
    gpu_index = {g: r for r, g in enumerate(gpu_name)}
    for f in faults:
        if f.kind == "slow-gpu" and f.subject not in gpu_index:
            raise ConfigError(f"fault slow-gpu: subject {f.subject!r} is not a GPU of the job")

    cols: dict[str, list[I64]] = {k: [] for k in ("rank", "iteration", "op", "group", "seq",
                                                   "start", "end", "nbytes", "stage", "mb")}

    def emit(ranks: I64, it: int, op: int, gid: I64 | int, seq: int, start: F64, end: F64,
             nbytes: float, stage: int, mb: int) -> None:
        n = ranks.size
        cols["rank"].append(ranks.astype(np.int64))
        cols["iteration"].append(np.full(n, it, dtype=np.int64))
        cols["op"].append(np.full(n, op, dtype=np.int64))
        cols["group"].append(np.broadcast_to(np.asarray(gid, dtype=np.int64), (n,)).copy())
        cols["seq"].append(np.full(n, seq, dtype=np.int64))
        cols["start"].append(np.round(start).astype(np.int64))
        cols["end"].append(np.round(end).astype(np.int64))
        cols["nbytes"].append(np.full(n, int(nbytes), dtype=np.int64))
        cols["stage"].append(np.full(n, stage, dtype=np.int64))
        cols["mb"].append(np.full(n, mb, dtype=np.int64))

    def jitter(cv: float, n: int) -> F64:
        if cv <= 0:
            return np.ones(n)
        s = np.sqrt(np.log1p(cv * cv))
        return np.asarray(rng.lognormal(-s * s / 2, s, n), dtype=np.float64)

    def compute(cur: _Iter, p: int, m: int, base: int, op: int) -> None:
        rk = stage_ranks[p]
        dur = base * cur.stage_factor[p] * cur.seq_factor[d_of_lane, m] * cur.gpu_factor[rk] \
            * jitter(job.compute_cv, lanes)
        s = free[rk].copy()
        if job.launch_gap_ns > 0:
            s += rng.exponential(job.launch_gap_ns, lanes)
        e = s + dur
        emit(rk, cur.it, op, 0, m, s, e, 0, p, m)
        free[rk] = e
        if tp > 1:
            # TP all-reduce inside the server: every TP rank waits for its slowest peer.
            ready = e.reshape(dp, tp).max(axis=1).repeat(tp)
            end = ready + cur.tp_t[p] * jitter(job.comm_cv, lanes)
            emit(rk, cur.it, TPAR, tp_gid[p], 2 * m + (op == BWD), e, end, job.tp_bytes, p, m)
            free[rk] = end

    def p2p(cur: _Iter, p_from: int, p_to: int, m: int, dur: F64, gid: I64, send_op: int,
            recv_op: int) -> None:
        a, b = stage_ranks[p_from], stage_ranks[p_to]
        s_send, s_recv = free[a].copy(), free[b].copy()
        end = np.maximum(s_send, s_recv) + dur * jitter(job.comm_cv, lanes)
        nb = job.activation_bytes / tp
        emit(a, cur.it, send_op, gid, m, s_send, end, nb, p_from, -1)
        emit(b, cur.it, recv_op, gid, m, s_recv, end, nb, p_to, -1)
        free[a] = end
        free[b] = end

    programs = [_one_f_one_b_program(p, pp, mbs) for p in range(pp)]

    def one_f_one_b(cur: _Iter, fwd_t: list[F64], bwd_t: list[F64]) -> None:
        """Play Megatron's 1F1B schedule: stages advance until a p2p call waits for its peer.

        A call (one or two transfers, fused like Megatron's send_forward_recv_backward)
        starts when its stage is idle. A send is eager (its part ends ``duration`` after it
        posted); the receive ends when the data has arrived, or a few microseconds after it
        posted if the data was already there.
        The call ends with its last part, and every row of the call spans the whole call:
        a lone send is short, a recv's duration includes the wait for its peer, and a send
        fused with a recv waits with it, as in ByteDance's traces.
        """
        pc = [0] * pp
        started: dict[tuple[int, int], F64] = {}
        side: dict[tuple[str, int, int], dict[str, F64]] = {}
        done: dict[tuple[str, int, int], F64] = {}
        dur_of: dict[tuple[str, int, int], F64] = {}
        while any(pc[p] < len(programs[p]) for p in range(pp)):
            progressed = False
            for p in range(pp):
                while pc[p] < len(programs[p]):
                    step = programs[p][pc[p]]
                    rk = stage_ranks[p]
                    if step[0] in ("F", "B"):
                        compute(cur, p, int(step[1]), job.fwd_ns if step[0] == "F" else job.bwd_ns,
                                FWD if step[0] == "F" else BWD)
                        pc[p] += 1
                        progressed = True
                        continue
                    calls = step[2]
                    if (p, pc[p]) not in started:
                        started[(p, pc[p])] = free[rk].copy()
                        for d, src, m, role in calls:
                            side.setdefault((d, src, m), {})[role] = free[rk].copy()
                        progressed = True
                    ends = []
                    for d, src, m, role in calls:
                        key = (d, src, m)
                        if key not in dur_of:
                            base = fwd_t[src] if d == "f" else bwd_t[src - 1]
                            dur_of[key] = base * jitter(job.comm_cv, lanes)
                        if role == "send":
                            # Eager send: the sender's part ends once its data is out,
                            # whether or not the receiver has posted yet.
                            ends.append(side[key]["send"] + dur_of[key])
                            continue
                        if key not in done:
                            sides = side[key]
                            if len(sides) < 2:
                                break
                            # The data was sent eagerly: a receiver that posts after it
                            # arrived finds it there (a few microseconds to complete).
                            done[key] = np.maximum(sides["send"] + dur_of[key],
                                                   sides["recv"] + np.minimum(dur_of[key], 5_000.0))
                        ends.append(done[key])
                    else:
                        s0 = started[(p, pc[p])]
                        end = np.max(np.stack(ends), axis=0)
                        nb = job.activation_bytes / tp
                        for d, src, m, role in calls:
                            op = {("f", "send"): FSEND, ("f", "recv"): FRECV,
                                  ("b", "send"): BSEND, ("b", "recv"): BRECV}[(d, role)]
                            gid = fwd_gid[src] if d == "f" else bwd_gid[src]
                            emit(rk, cur.it, op, gid, m, s0, end, nb, p, -1)
                        free[rk] = end
                        pc[p] += 1
                        progressed = True
                        continue
                    break
            if not progressed:  # pragma: no cover - the schedule is deadlock-free by construction
                raise WorkloadError(f"twin 1F1B: schedule deadlocked at {pc}")

    free = np.zeros(world)  # when each rank is next idle (ns)
    free[:] = TRACE_T0_NS
    for it in range(job.iterations):
        t_it = int(free.min())
        active = sched.active(t_it)
        gpu_factor = np.ones(world)
        stage_factor = np.ones(pp)
        seq_cv = 0.0
        for f in active:
            if f.kind == "slow-gpu":
                gpu_factor[gpu_index[f.subject]] *= f.param("factor", 2.0)
            elif f.kind == "stage-imbalance":
                stage_factor[int(f.param("stage", pp - 1))] *= f.param("factor", 1.5)
            elif f.kind == "sequence-imbalance":
                seq_cv = f.param("cv", 0.3)
        # Micro-batch cost factor per (data-parallel replica, micro-batch): the same sequence
        # flows through every stage and TP rank of its replica.
        seq_factor = jitter(seq_cv, dp * mbs).reshape(dp, mbs) if seq_cv > 0 else np.ones((dp, mbs))
        comm_faults = tuple(f for f in active if f.kind in ("slow-nic", "link-degraded",
                                                             "congestion", "nic-fault",
                                                             "switch-fault"))
        # Communication durations for this iteration's fault state (before jitter).
        fwd_t = [model.p2p_ns(stage_ranks[p], stage_ranks[p + 1], job.activation_bytes / tp,
                              comm_faults) for p in range(pp - 1)]
        bwd_t = [model.p2p_ns(stage_ranks[p + 1], stage_ranks[p], job.activation_bytes / tp,
                              comm_faults) for p in range(pp - 1)]
        tp_t = [np.repeat(model.ring_ns(tp_groups[p], job.tp_bytes, comm_faults), tp)
                if tp > 1 else np.zeros(lanes) for p in range(pp)]
        dp_t = []
        for p in range(pp):
            per_group = model.ring_ns(dp_groups[p], job.grad_bytes / (pp * tp), comm_faults) \
                if dp > 1 else np.zeros(tp)
            lane_t = np.zeros(lanes)
            for t in range(tp):
                lane_t[t::tp] = per_group[t]
            dp_t.append(lane_t)

        cur = _Iter(it, stage_factor, seq_factor, gpu_factor, tp_t)
        if job.schedule == "1f1b":
            one_f_one_b(cur, fwd_t, bwd_t)
        else:
            for m in range(mbs):
                for p in range(pp):
                    compute(cur, p, m, job.fwd_ns, FWD)
                    if p < pp - 1:
                        p2p(cur, p, p + 1, m, fwd_t[p], fwd_gid[p], FSEND, FRECV)
            for m in range(mbs):
                for p in range(pp - 1, -1, -1):
                    compute(cur, p, m, job.bwd_ns, BWD)
                    if p > 0:
                        p2p(cur, p, p - 1, m, bwd_t[p - 1], bwd_gid[p], BSEND, BRECV)
        for p in range(pp):
            rk = stage_ranks[p]
            if dp > 1:
                s = free[rk].copy()
                ready = np.zeros(lanes)
                for t in range(tp):
                    ready[t::tp] = s[t::tp].max()
                end = ready + dp_t[p] * jitter(job.comm_cv, 1)[0]
                emit(rk, it, DPAR, dp_gid[p], 0, s, end, job.grad_bytes / (pp * tp), p, -1)
                free[rk] = end
            dur = job.optimizer_ns * gpu_factor[rk] * jitter(job.compute_cv, lanes)
            s = free[rk].copy()
            emit(rk, it, OPTIM, 0, 0, s, s + dur, 0, p, -1)
            free[rk] = s + dur
        # The next iteration starts after the slowest rank (gradients are global).
        free[:] = free.max()

    cat = {k: np.concatenate(v) for k, v in cols.items()}
    return TwinTrace(
        name or f"twin-dp{dp}-tp{tp}-pp{pp}", cat["rank"], cat["iteration"], cat["op"],
        cat["group"], cat["seq"], cat["start"], cat["end"], cat["nbytes"], cat["stage"],
        cat["mb"], groups,
        placement=[(placement.host(r), placement.gpu(r)) for r in range(world)],
        truth=_truth(fabric, placement, job, faults) | {
            "job": {"dp": dp, "tp": tp, "pp": pp, "microbatches": mbs,
                    "iterations": job.iterations},
            "comm": comm if isinstance(comm, str) else type(comm).__name__,
        },
    )


_Call = tuple[tuple[str, int, int, str], ...]
_Step = tuple[str, int, _Call]


def _one_f_one_b_program(p: int, pp: int, mbs: int) -> list[_Step]:
    """Stage ``p``'s 1F1B program (Megatron's forward_backward_pipelining_without_interleaving).

    Steps: ``("F", m, ())`` / ``("B", m, ())`` compute, ``("C", -1, ((dir, src, m, role), ...))`` a
    blocking p2p call of one or two transfers (``dir`` "f": activations ``src -> src + 1``,
    "b": gradients ``src -> src - 1``).
    """
    warm = min(pp - p - 1, mbs)
    rem = mbs - warm
    prog: list[_Step] = []
    fi = bi = 0
    for _ in range(warm):
        if p > 0:
            prog.append(("C", -1, (("f", p - 1, fi, "recv"),)))
        prog.append(("F", fi, ()))
        if p < pp - 1:
            prog.append(("C", -1, (("f", p, fi, "send"),)))
        fi += 1
    if rem > 0 and p > 0:
        prog.append(("C", -1, (("f", p - 1, fi, "recv"),)))
    for i in range(rem):
        prog.append(("F", fi, ()))
        if p < pp - 1:  # send_forward_recv_backward
            prog.append(("C", -1, (("f", p, fi, "send"), ("b", p + 1, bi, "recv"))))
        fi += 1
        prog.append(("B", bi, ()))
        if p > 0:
            if i == rem - 1:  # send_backward
                prog.append(("C", -1, (("b", p, bi, "send"),)))
            else:  # send_backward_recv_forward
                prog.append(("C", -1, (("b", p, bi, "send"), ("f", p - 1, fi, "recv"))))
        bi += 1
    for _ in range(warm):
        if p < pp - 1:
            prog.append(("C", -1, (("b", p + 1, bi, "recv"),)))
        prog.append(("B", bi, ()))
        if p > 0:
            prog.append(("C", -1, (("b", p, bi, "send"),)))
        bi += 1
    return prog


# ---------------------------------------------------------------------- writers
def _kernel_name(op: int) -> str:
    return {FSEND: "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            BSEND: "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            FRECV: "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            BRECV: "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            TPAR: "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            DPAR: "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            }[op]


def kineto_traces(trace: TwinTrace) -> dict[int, dict[str, object]]:
    """One Kineto (PyTorch profiler) Chrome-trace object per rank, NCCL flavour.

    Compute ops are ``user_annotation`` events (as ``record_function`` writes them),
    communication ops NCCL kernels with the args of PyTorch's ``record_param_comms``,
    iterations ``ProfilerStep#N``. Times are microseconds relative to ``baseTimeNanoseconds``.
    """
    world = int(trace.rank.max()) + 1 if len(trace) else 0
    base = int(trace.start.min()) if len(trace) else 0
    out: dict[int, dict[str, object]] = {}
    order = np.lexsort((trace.start, trace.rank))
    bounds = np.searchsorted(trace.rank[order], np.arange(world + 1))
    pp = int(trace.stage.max()) + 1 if len(trace) else 1
    for r in range(world):
        idx = order[bounds[r]:bounds[r + 1]]
        events: list[dict[str, object]] = []
        its = trace.iteration[idx]
        for it in np.unique(its).tolist():
            sel = idx[its == it]
            t0, t1 = int(trace.start[sel].min()), int(trace.end[sel].max())
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{it}",
                           "pid": r, "tid": 1, "ts": (t0 - base) / 1000, "dur": (t1 - t0) / 1000,
                           "args": {}})
        for k in idx.tolist():
            op = int(trace.op[k])
            ts = (int(trace.start[k]) - base) / 1000
            dur = (int(trace.end[k]) - int(trace.start[k])) / 1000
            if KIND_OF_OP[op] == 0:
                events.append({"ph": "X", "cat": "user_annotation", "name": OP_NAMES[op],
                               "pid": r, "tid": 1, "ts": ts, "dur": dur, "args": {}})
                continue
            g = trace.groups[int(trace.group[k])]
            coll = {FSEND: "send", BSEND: "send", FRECV: "recv", BRECV: "recv"}.get(op, "allreduce")
            args: dict[str, object] = {
                "Collective name": coll, "In msg nelems": int(trace.nbytes[k]) // 2,
                "Out msg nelems": int(trace.nbytes[k]) // 2, "dtype": "BFloat16",
                "Group size": len(g), "Process Group Ranks": json.dumps(list(g)),
                "Process Group Name": str(int(trace.group[k])),
                "Process Group Description": OP_NAMES[op],
            }
            events.append({"ph": "X", "cat": "kernel", "name": _kernel_name(op), "pid": 0,
                           "tid": 7, "ts": ts, "dur": dur, "args": args})
        stage = int(trace.stage[idx[0]]) if idx.size else -1
        out[r] = {"schemaVersion": 1, "baseTimeNanoseconds": base,
                  "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world,
                                      "pp_rank": stage, "pp_size": pp},
                  "traceEvents": events, "traceName": f"{trace.job}-rank{r}"}
    return out


def compact_lines(trace: TwinTrace) -> str:
    """The trace in the compact fabricscope format (docs/straggler.md), JSON lines."""
    lines = [json.dumps({"format": "fabricscope-optiming", "version": 1, "job": trace.job})]
    for r, i, o, g, s, a, e, n, st, mb in zip(
        trace.rank.tolist(), trace.iteration.tolist(), trace.op.tolist(), trace.group.tolist(),
        trace.seq.tolist(), trace.start.tolist(), trace.end.tolist(), trace.nbytes.tolist(),
        trace.stage.tolist(), trace.mb.tolist(), strict=True,
    ):
        row: dict[str, object] = {"rank": r, "iteration": i, "op": OP_NAMES[o],
                                  "group": list(trace.groups[g]), "seq": s, "t_start_ns": a,
                                  "t_end_ns": e, "bytes": n, "stage": st}
        if mb >= 0:
            row["mb"] = mb
        lines.append(json.dumps(row, separators=(",", ":")))
    return "\n".join(lines) + "\n"


_BYTEDANCE_OPTYPE = {FWD: "forward-compute", BWD: "backward-compute", FSEND: "forward-send",
                     FRECV: "forward-recv", BSEND: "backward-send", BRECV: "backward-recv",
                     DPAR: "grads-reduce-scatter", OPTIM: "optimizer"}


def bytedance_parquet(trace: TwinTrace, tp: int = 1) -> bytes:
    """The trace in ByteDance's per-op Parquet schema (OSDI'25 artifact), as file bytes.

    One worker per (data-parallel rank, stage), the first rank of each TP group, as the
    artifact traces them; TP all-reduces are not part of that schema and are left out. Times
    are seconds; ``*-recv`` rows span the whole blocking call (wait for the peer included).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    keep = np.isin(trace.op, list(_BYTEDANCE_OPTYPE)) & (trace.rank % max(tp, 1) == 0)
    idx = np.flatnonzero(keep)
    idx = idx[np.lexsort((trace.start[idx], trace.rank[idx]))]
    stage = trace.stage[idx]
    lanes = int((trace.rank.max() + 1) // max(int(trace.stage.max()) + 1, 1)) if len(trace) else 1
    dp_rank = (trace.rank[idx] % lanes) // max(tp, 1)
    ops = trace.op[idx]
    names = np.array([_BYTEDANCE_OPTYPE.get(int(o), "") for o in range(len(OP_NAMES))])
    mb = np.where(np.isin(ops, [FWD, BWD]), trace.mb[idx], -1)
    tb = pa.table({
        "dp_rank": pa.array(dp_rank, pa.int64()), "stage": pa.array(stage, pa.int64()),
        "rank": pa.array(trace.rank[idx], pa.int64()),
        "step": pa.array(trace.iteration[idx], pa.int64()),
        "optype": pa.array(names[ops].tolist(), pa.string()),
        "start_ts": pa.array(trace.start[idx] / 1e9, pa.float64()),
        "duration": pa.array((trace.end[idx] - trace.start[idx]) / 1e9, pa.float64()),
        "seq_id": pa.array(trace.seq[idx], pa.int64()), "mc": pa.array(np.zeros(idx.size, np.int64)),
        "mb_id": pa.array(mb, pa.int64()), "gmc": pa.array(stage, pa.int64()),
    })
    sink = pa.BufferOutputStream()
    pq.write_table(tb, sink)
    return bytes(sink.getvalue().to_pybytes())


def write_twin_traces(
    trace: TwinTrace, outdir: str | Path, *, kineto: bool = True, compact: bool = True,
    fabric_doc: Mapping[str, object] | None = None,
) -> dict[str, Path]:
    """Write ``kineto/rank<N>.json.gz``, ``trace.jsonl``, ``truth.json`` (and the inventory)."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if kineto:
        kdir = out / "kineto"
        kdir.mkdir(exist_ok=True)
        for r, obj in kineto_traces(trace).items():
            (kdir / f"rank{r}.json.gz").write_bytes(
                gzip.compress(json.dumps(obj, separators=(",", ":")).encode(), mtime=0))
        written["kineto"] = kdir
    if compact:
        (out / "trace.jsonl").write_text(compact_lines(trace))
        written["compact"] = out / "trace.jsonl"
    truth = dict(trace.truth)
    truth["placement"] = [list(p) for p in trace.placement]
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    written["truth"] = out / "truth.json"
    if fabric_doc is not None:
        (out / "inventory.json").write_text(json.dumps(fabric_doc))
        written["inventory"] = out / "inventory.json"
    return written
