"""The straggler analysis as an instrument of the closed loop: twin training traces -> localizer.

A DP x TP x PP training job runs on the first GPUs of the fabric (the twin's trace generator,
:func:`~fabricscope.twin.tracegen.generate_trace`); every ``every_iterations`` completed
iterations the production straggler analysis (:func:`~fabricscope.straggler.analysis.analyze`,
Holmes-style MAP ranking with a what-if replay) runs on the last ``window_iterations`` of them.
The twin may not import the straggler capability, so the trace -> operator table conversion
is here. Design, causality and costs: ``docs/design/diagnosis-instruments-probe-straggler.md``.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from fabricscope.diagnosis.model import Observed, finding_id
from fabricscope.diagnosis.suspicions import suspicion
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.sim.faults import Fault
from fabricscope.sim.workload.placement import Placement, place_ranks
from fabricscope.straggler.analysis import Options, analyze
from fabricscope.straggler.devices import DeviceMap, rank_devices
from fabricscope.straggler.table import COLLECTIVE, COMPUTE, OpTable, from_columns
from fabricscope.twin.tracegen import (
    TRACE_T0_NS,
    TwinJob,
    TwinTrace,
    generate_trace,
    nominal_iteration_ns,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: Fault kinds the trace generator turns into slower operators (others are ignored).
STRAGGLER_FAULT_KINDS = ("slow-gpu", "slow-nic", "link-degraded", "congestion", "switch-fault")
_STAGE = re.compile(r"pipeline stage (\d+)$")


def trace_table(tr: TwinTrace) -> OpTable:
    """The operator table of a twin trace, column for column (what a reader would build)."""
    return from_columns(job=tr.job, rank=tr.rank, iteration=tr.iteration, op=tr.op,
                        group=tr.group, seq=tr.seq, start=tr.start, end=tr.end,
                        nbytes=tr.nbytes, stage=tr.stage, mb=tr.mb, op_names=tr.op_names,
                        groups=tr.groups)


def default_job(fabric: Fabric, duration_s: float) -> TwinJob:
    """A DP x TP2 x PP4 job on up to 128 GPUs (half the fabric at most), ~1.2 s iterations.

    Costs are set so the network matters: 32 GiB of gradients per iteration (a 16B-parameter
    model in bf16) ring-all-reduced over the DP groups without overlap (~13 % of an iteration
    on stage 0), 32 MiB activations per micro-batch, 50 / 100 ms forward / backward per
    micro-batch. In a GPipe iteration stage ``s`` finishes its backward ``s`` backward slots
    before stage 0, so a slow NIC on a later stage is material only when its slower
    all-reduce outgrows that slack; with these costs a NIC at 0.4x its rate is on every
    stage but the last.
    """
    gpus = sum(h.gpus for h in fabric.hosts)
    per_server = fabric.hosts[0].gpus if fabric.hosts else 0
    if gpus < 1:
        raise ConfigError(f"straggler instrument: inventory {fabric.name} has no GPUs")
    tp = 2 if per_server % 2 == 0 else 1
    world = max(tp, min(128, gpus // 2))
    pp = 4
    while pp > 1 and tp * pp * 2 > world:
        pp //= 2
    dp = max(1, world // (tp * pp))
    job = TwinJob(dp=dp, tp=tp, pp=pp, microbatches=4, iterations=1, fwd_ns=50_000_000,
                  bwd_ns=100_000_000, optimizer_ns=12_500_000, grad_bytes=float(32 << 30))
    return covering(job, duration_s)


def covering(job: TwinJob, duration_s: float) -> TwinJob:
    """``job`` with enough iterations to run past ``duration_s`` when fault-free."""
    return replace(job, iterations=math.ceil(duration_s * 1e9 / nominal_iteration_ns(job)) + 2)


def _to_trace_time(f: Fault) -> Fault:
    return replace(f, start_ns=TRACE_T0_NS + f.start_ns,
                   end_ns=None if f.end_ns is None else TRACE_T0_NS + f.end_ns)


def rank_slowdown(tr: TwinTrace, rows: npt.NDArray[np.bool_], world: int, *,
                  compute: npt.NDArray[np.bool_] | None = None) -> F64:
    """Each rank's compute time over the operators ``rows`` against its pipeline stage.

    ``rows`` selects operators of the trace; only those of the ``compute`` kind (forward,
    backward, optimizer: :func:`~fabricscope.straggler.table.op_kind`) count. The result is
    the ratio of each rank's compute time to the median of the ranks of
    its stage, so the last stage's heavier workload is not a slow GPU (the reference the
    straggler analysis uses, docs/design/straggler-localization.md). 1.0 is on par; NaN
    for a rank without compute in ``rows``. Communication is left out: in a synchronous
    collective the waiting ranks' operators last as long as the slow one's. ``compute``:
    the trace's compute mask, when the caller has it already.
    """
    comp = rows & (tr.kind == COMPUTE if compute is None else compute)
    busy = np.bincount(tr.rank[comp], weights=(tr.end[comp] - tr.start[comp]).astype(np.float64),
                       minlength=world)[:world]
    stage = np.full(world, -1, dtype=np.int64)
    stage[tr.rank[comp]] = tr.stage[comp]
    ref = np.full(world, np.nan)
    for s in np.unique(stage[stage >= 0]).tolist():
        m = stage == s
        ref[m] = np.median(busy[m])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((stage >= 0) & (ref > 0), busy / ref, np.nan)


def _rank_sets(devices: DeviceMap, world: int) -> dict[str, int]:
    """How many of the job's ranks each device name touches (GPU, NIC, access link, host,
    leaf, spine above a leaf)."""
    sets: dict[str, set[int]] = {}
    for r in range(world):
        names = [devices.gpu.get(r), devices.nic.get(r), devices.host.get(r),
                 devices.nic_link.get(r), devices.leaf.get(r)]
        leaf = devices.leaf.get(r)
        if leaf:
            names.extend(devices.spines_of_leaf.get(leaf, ()))
        for n in names:
            if n:
                sets.setdefault(n, set()).add(r)
    return {k: len(v) for k, v in sets.items()}


def iteration_slowdown(tr: TwinTrace, world: int) -> F64:
    """:func:`rank_slowdown` of every iteration at once: ``[iteration, rank]`` compute time
    over the median of the rank's pipeline stage in that iteration (NaN without compute)."""
    comp = tr.kind == COMPUTE
    n_it = int(tr.iteration.max()) + 1 if len(tr) else 0
    busy = np.bincount(tr.iteration[comp] * world + tr.rank[comp],
                       weights=(tr.end[comp] - tr.start[comp]).astype(np.float64),
                       minlength=n_it * world)[: n_it * world].reshape(n_it, world)
    stage = np.full(world, -1, dtype=np.int64)
    stage[tr.rank[comp]] = tr.stage[comp]
    out = np.full((n_it, world), np.nan)
    for s in np.unique(stage[stage >= 0]).tolist():
        cols = stage == s
        ref = np.median(busy[:, cols], axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, cols] = np.where(ref > 0, busy[:, cols] / ref, np.nan)
    return out


def transfer_slowdown(tr: TwinTrace) -> tuple[F64, list[int]]:
    """Each collective group's transfer time per iteration over its class median:
    ``([iteration, group], group ids)``.

    A group's transfer in an iteration is its last end minus its last start (the ring moves
    data only once every member has joined, so the wait for a late rank is left out); its
    class is the groups of the same operator and size, and the reference the class median
    in the same iteration (the analysis' own ``comm_rel`` reference,
    docs/design/straggler-localization.md). Only groups spanning two or more hosts are
    kept: they are the ones that cross NICs. NaN where a group has no such operator.
    """
    coll = tr.kind == COLLECTIVE
    hosts = [h for h, _g in tr.placement]
    keep = [g for g in np.unique(tr.group[coll]).tolist()
            if len({hosts[r] for r in tr.groups[g]}) > 1] if hosts else []
    n_it = int(tr.iteration.max()) + 1 if len(tr) else 0
    out = np.full((n_it, len(keep)), np.nan)
    if not keep or n_it == 0:
        return out, keep
    col = np.full(len(tr.groups), -1, dtype=np.int64)
    col[keep] = np.arange(len(keep))
    m = coll & (col[tr.group] >= 0)
    it, c = tr.iteration[m], col[tr.group[m]]
    lo = np.iinfo(np.int64).min
    last_start = np.full((n_it, len(keep)), lo, dtype=np.int64)
    last_end = np.full((n_it, len(keep)), lo, dtype=np.int64)
    np.maximum.at(last_start, (it, c), tr.start[m])
    np.maximum.at(last_end, (it, c), tr.end[m])
    seen = last_end > lo
    xfer = np.where(seen, (last_end - last_start).astype(np.float64), np.nan)
    # each group's class from its first operator (np.unique: first index per group)
    rows = np.flatnonzero(m)
    _gs, first = np.unique(tr.group[rows], return_index=True)  # sorted like ``keep``
    key: dict[tuple[int, int], int] = {}
    cls = np.array([key.setdefault((int(tr.op[i]), int(tr.nbytes[i])), len(key))
                    for i in rows[first].tolist()], dtype=np.int64)
    for k in range(len(key)):
        cols = cls == k
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an iteration without the class
            ref = np.nanmedian(xfer[:, cols], axis=1, keepdims=True)
            out[:, cols] = np.where(ref > 0, xfer[:, cols] / ref, np.nan)
    return out, keep


def _runs(ratio: F64, above: float, need: int) -> npt.NDArray[np.bool_]:
    """``[iteration, column]``: above ``above`` in this iteration and the ``need - 1``
    before it (NaN counts as not above)."""
    slow = np.nan_to_num(ratio, nan=0.0) > above
    run = slow.copy()
    for j in range(1, need):
        run[j:] &= slow[:-j]
        run[:j] = False
    return run


@dataclass(frozen=True, slots=True)
class JobTrace:
    """A scenario's job trace as the trace store holds it: the table the analysis reads,
    the ranks' devices, each iteration's end (trace time)."""

    job: TwinJob
    trace: TwinTrace
    table: OpTable
    devices: DeviceMap
    it_end: I64


# The last job trace built, keyed by the scenario's identity and the job's settings: the
# instrument's run and the active checks of the same scenario read one trace.
_LAST: list[tuple[ScenarioSpec, tuple[object, ...], JobTrace]] = []


class StragglerInstrument:
    """A training job on the twin, its traces analysed causally as iterations complete.

    Parameters
    ----------
    job:
        The job's shape and costs (default :func:`default_job`); its ``iterations`` are
        replaced by enough to cover the scenario. Ranks take the fabric's first GPUs.
    every_iterations:
        The analysis runs each time this many more iterations have completed.
    window_iterations:
        Sliding window: each analysis sees the last ``window_iterations`` completed
        iterations (a growing window costs O(t) per analysis).
    comm:
        ``"alpha-beta"`` (default; NIC-rate model: slow NICs, their access cables, leaf
        switches) or ``"engine"`` (flow engine, real ECMP paths, ~10x the cost).
    job_name, options:
        The job's name in findings; the analysis thresholds.
    observer:
        Optional ``observer(kind, payload)`` (also settable as the attribute): at every
        analysis, ``("stragglers", payload)`` with each rank's compute slowdown over the
        iterations completed since the previous analysis (see :func:`rank_slowdown`).
        None (the default) costs nothing.
    suspicions:
        Also publish a suspicion (:mod:`fabricscope.diagnosis.suspicions`) at the end of
        every iteration that ends a run of the analysis' ``min_iterations`` in which a GPU's
        compute time is above its stage's median by more than the analysis' ``compute_rel``
        and no analysis has named it yet, anticipating ``slow-gpu`` (the analysis itself
        runs only every ``every_iterations`` and also wants a robust-sigma excess and a
        material replay gain); and for a collective group spanning hosts whose transfer
        is above its class median by more than ``comm_rel`` in ``min_iterations`` in a row,
        anticipating ``slow-nic`` on the group's NICs (:func:`transfer_slowdown`; healthy
        twin groups stay within 7 % of their class, a NIC at 0.4x its rate makes its ring
        2.5x). Default off.
    """

    name = "straggler"

    def __init__(self, job: TwinJob | None = None, every_iterations: int = 8,
                 window_iterations: int = 32, *, comm: str = "alpha-beta",
                 job_name: str = "twin-train", options: Options | None = None,
                 refresh_s: float = 30.0, suspicions: bool = False,
                 observer: Callable[[str, object], None] | None = None) -> None:
        if every_iterations < 1 or window_iterations < 2:
            raise ConfigError(f"straggler instrument: every_iterations must be >= 1 and "
                              f"window_iterations >= 2, got {every_iterations}, "
                              f"{window_iterations}")
        if comm not in ("alpha-beta", "engine"):
            raise ConfigError(f"straggler instrument: comm must be 'alpha-beta' or 'engine', "
                              f"got {comm!r}")
        self.job = job
        self.every = int(every_iterations)
        self.window = int(window_iterations)
        self.comm = comm
        self.job_name = job_name
        self.options = options
        self.refresh_s = float(refresh_s)
        self.suspicions = suspicions
        self.observer = observer

    def job_for(self, spec: ScenarioSpec) -> TwinJob:
        """The job this instrument runs on ``spec`` (iterations covering the scenario)."""
        if self.job is None:
            return default_job(spec.fabric, spec.duration_s)
        return covering(self.job, spec.duration_s)

    def placement(self, spec: ScenarioSpec) -> Placement:
        return place_ranks(spec.fabric, self.job_for(spec).world_size, policy="in-order")

    def job_gpus(self, spec: ScenarioSpec) -> list[str]:
        """The GPUs (``host/gpuN``) the job uses, rank order (its blast radius)."""
        p = self.placement(spec)
        return [f"{p.host(r)}/gpu{p.gpu(r)}" for r in range(p.n_ranks)]

    def job_faults(self, spec: ScenarioSpec) -> list[Fault]:
        """The scenario's faults the trace generator models, in trace time.

        Slow GPUs and NICs count only when the job uses them; link and switch faults pass
        (the communication model decides whether they are on the job's paths).
        """
        p = self.placement(spec)
        gpus = set(self.job_gpus(spec))
        nics = {p.nic(r) for r in range(p.n_ranks)}
        out = []
        for f in spec.faults:
            if f.kind not in STRAGGLER_FAULT_KINDS:
                continue
            if (f.kind == "slow-gpu" and f.subject not in gpus) or \
                    (f.kind == "slow-nic" and f.subject not in nics):
                continue
            out.append(_to_trace_time(f))
        return out

    def run(self, spec: ScenarioSpec) -> list[Observed]:
        """Play the job for the scenario; every finding of the causal analyses, once.

        The analysis at iteration ``k`` sees iterations ``[k - window, k)`` only and is
        reported at the end of iteration ``k - 1`` (scenario time); a (kind, subject) is
        reported the first time an analysis names it, its window start kept from then, and
        refreshed under that id every ``refresh_s`` while later analyses still name it.
        Iterations that end after the scenario are never analysed.
        """
        jt = self.job_trace(spec)
        job, tr, table, devices, it_end = jt.job, jt.trace, jt.table, jt.devices, jt.it_end
        affected = _rank_sets(devices, job.world_size)
        done = int(np.searchsorted(it_end - TRACE_T0_NS, round(spec.duration_s * 1e9),
                                   side="right"))
        reported: dict[tuple[str, str], Finding] = {}
        refreshed: dict[tuple[str, str], int] = {}
        out: list[Observed] = []
        observer = self.observer
        gpus = [f"{h}/gpu{g}" for h, g in tr.placement] if observer is not None else []
        compute = tr.kind == COMPUTE if observer is not None else None
        for k in range(self.every, done + 1, self.every):
            lo = max(0, k - self.window)
            mask = (table.iteration >= lo) & (table.iteration < k)
            rep = analyze(table.take(mask), devices=devices, options=self.options)
            t_ns = int(it_end[k - 1]) - TRACE_T0_NS
            if observer is not None:
                new = (tr.iteration >= k - self.every) & (tr.iteration < k)
                observer("stragglers", {
                    "t_ns": t_ns, "iterations": (k - self.every, k), "gpus": gpus,
                    "slowdown": rank_slowdown(tr, new, job.world_size, compute=compute)})
            for f in rep.findings:
                key = (f.kind, f.subject)
                first = reported.get(key)
                if first is not None:
                    # named again: refresh it under its first id every refresh_s (the incident
                    # then knows the straggler persists)
                    if t_ns - refreshed[key] >= self.refresh_s * 1e9:
                        refreshed[key] = t_ns
                        out.append(Observed("straggler", replace(first, window=(
                            first.window[0], t_ns)), t_ns, id=finding_id("straggler", first)))
                    continue
                reported[key] = self._scenario_finding(f, affected, job)
                refreshed[key] = t_ns
                out.append(Observed("straggler", reported[key], t_ns))
        if self.suspicions:
            named: dict[str, int] = {}
            for o in out:
                if o.kind == "slow-gpu":
                    named.setdefault(o.subject, o.reported_ns)
            out.extend(self._suspicions(tr, it_end[:done], job.world_size, named))
            out.extend(self._transfer_suspicions(tr, it_end[:done], devices, out))
        return out

    def job_trace(self, spec: ScenarioSpec) -> JobTrace:
        """The job's trace for ``spec`` (built once per scenario and job settings: the
        instrument's run and the active checks share it)."""
        key = (self.job, self.comm, self.job_name)
        if _LAST and _LAST[0][0] is spec and _LAST[0][1] == key:
            return _LAST[0][2]
        job = self.job_for(spec)
        tr = generate_trace(spec.fabric, job, faults=self.job_faults(spec), comm=self.comm,
                            seed=spec.seed, name=self.job_name)
        n_it = int(tr.iteration.max()) + 1 if len(tr) else 0
        it_end = np.full(n_it, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(it_end, tr.iteration, tr.end)
        jt = JobTrace(job, tr, trace_table(tr), rank_devices(spec.fabric, tr.placement), it_end)
        _LAST[:] = [(spec, key, jt)]
        return jt

    def analysis_at(self, spec: ScenarioSpec, t_ns: int) -> tuple[int, list[Finding]]:
        """The analysis run now, at scenario time ``t_ns``, on the last ``window_iterations``
        iterations completed by then: (iterations completed, its findings in scenario time).
        What the scheduled analysis would report, without waiting for its cadence."""
        jt = self.job_trace(spec)
        k = int(np.searchsorted(jt.it_end - TRACE_T0_NS, int(t_ns), side="right"))
        if k < 2:
            return k, []
        lo = max(0, k - self.window)
        mask = (jt.table.iteration >= lo) & (jt.table.iteration < k)
        rep = analyze(jt.table.take(mask), devices=jt.devices, options=self.options)
        affected = _rank_sets(jt.devices, jt.job.world_size)
        return k, [self._scenario_finding(f, affected, jt.job) for f in rep.findings]

    def _suspicions(self, tr: TwinTrace, it_end: I64, world: int,
                    named: dict[str, int]) -> list[Observed]:
        """One suspicion per GPU and completed iteration ending a run of ``min_iterations``
        whose compute is above its stage's median by more than ``compute_rel``, until an
        analysis names the GPU slow."""
        opt = self.options or Options()
        rel, need = opt.compute_rel, max(1, opt.min_iterations)
        ratio = iteration_slowdown(tr, world)[: it_end.size]
        gpus = [f"{h}/gpu{g}" for h, g in tr.placement]
        out: list[Observed] = []
        it, rank = np.nonzero(_runs(ratio, 1.0 + rel, need))
        for i, r in zip(it.tolist(), rank.tolist(), strict=True):
            t = int(it_end[i]) - TRACE_T0_NS
            gpu = gpus[r]
            if named.get(gpu, t + 1) <= t:
                continue
            v = float(ratio[i, r])
            out.append(suspicion(
                "straggler", "slow-gpu", gpu, t, (t, t), statistic="one iteration's compute "
                "time over its stage's median", value=v, early=1.0 + rel, alarm=1.0 + rel,
                evidence=f"{gpu}: compute {v:.2f}x its stage's median in iterations "
                f"{i - need + 1}-{i} (not yet a finding: the analysis runs every {self.every} "
                f"iterations and also wants a robust-sigma excess and a material replay gain)"))
        return out

    def _transfer_suspicions(self, tr: TwinTrace, it_end: I64, devices: DeviceMap,
                             out: list[Observed]) -> list[Observed]:
        """One suspicion per collective group and completed iteration ending a run of
        ``min_iterations`` whose transfer is above its class median by more than the
        analysis' ``comm_rel`` (:func:`transfer_slowdown`), anticipating ``slow-nic`` on the
        group's NICs, until an analysis names a slow NIC or switch of the job: a slow NIC or
        a degraded access link slows its whole ring, so which NIC is for the analysis (run
        now by the ``trace-window`` check) to say."""
        opt = self.options or Options()
        rel, need = opt.comm_rel, max(1, opt.min_iterations)
        ratio, groups = transfer_slowdown(tr)
        ratio = ratio[: it_end.size]
        named = min((o.reported_ns for o in out if o.source == "straggler"
                     and o.kind in ("slow-nic", "slow-switch")), default=None)
        sus: list[Observed] = []
        it, col = np.nonzero(_runs(ratio, 1.0 + rel, need))
        for i, c in zip(it.tolist(), col.tolist(), strict=True):
            t = int(it_end[i]) - TRACE_T0_NS
            if named is not None and named <= t:
                continue
            nics = list(dict.fromkeys(devices.nic[r] for r in tr.groups[groups[c]]
                                      if r in devices.nic))
            if not nics:
                continue
            v = float(ratio[i, c])
            sus.append(suspicion(
                "straggler", "slow-nic", " | ".join(nics), t, (t, t),
                statistic="one iteration's collective transfer over its class median",
                value=v, early=1.0 + rel, alarm=1.0 + rel,
                evidence=f"a collective of {len(nics)} NICs ({nics[0]}, ...): transfer {v:.2f}x its class median in "
                f"iterations {i - need + 1}-{i} (not yet a finding: the analysis runs every "
                f"{self.every} iterations)"))
        return sus

    def _scenario_finding(self, f: Finding, affected: dict[str, int], job: TwinJob) -> Finding:
        details: dict[str, float | int | str] = {**f.details, "job": self.job_name}
        if "ranks" in details:
            details["rank_ids"] = details.pop("ranks")
        n = affected.get(f.subject)
        stage = _STAGE.match(f.subject)
        if n is None and stage is not None:
            n = job.dp * job.tp
        elif n is None and f.kind == "imbalance":
            n = job.world_size
        if n is not None:
            details["ranks"] = n
        window = (f.window[0] - TRACE_T0_NS, f.window[1] - TRACE_T0_NS)
        return replace(f, window=window, details=details)

