"""Localize the slow GPU, NIC or switch behind irregular training iterations (pure).

Pipeline (docs/design/straggler-localization.md):

1. per-iteration durations -> robust baseline (median/MAD), irregular iterations, change points;
2. compute: each rank's compute per iteration against its pipeline-stage peers (lower median),
   so the heavier last stage (workload) is not a slow GPU; whole-stage excess is *stage
   imbalance*, micro-batch dispersion on every rank is *sequence imbalance*;
3. communication: instances matched across ranks; arrival skew vs transfer slowness
   (:mod:`fabricscope.straggler.instances`);
4. dependency-aware back-tracing: the last rank to reach a collective is followed upstream
   along the pipeline recv it waited on, so a slow stage-0 rank is not blamed on the
   downstream ranks that waited for it;
5. a cross-iteration MAP ranking over devices (:mod:`fabricscope.straggler.posterior`,
   after Holmes, NSDI'25), greedy over multiple faults (each pick explains its evidence away);
6. a what-if estimate of the slowdown (after Lin et al., "Understanding Stragglers in Large
   Model Training Using What-if Analysis", OSDI'25): the job's dependency graph is replayed
   with the culprits' operators at their idealized durations
   (:mod:`fabricscope.straggler.replay`); replayed actual / replayed ideal is the slowdown.
   A device candidate whose replay gain is within the iteration noise explains nothing and
   is not reported.

The analysis sees operator timings and (optionally) the inventory, never a simulator.
"""

from __future__ import annotations

import warnings as _pywarnings
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fabricscope.model.records import Finding
from fabricscope.straggler._dense import dense_codes, group_sort
from fabricscope.straggler.devices import DeviceMap
from fabricscope.straggler.instances import Instances, clock_offsets, match_instances
from fabricscope.straggler.iterations import (
    IterationStats,
    iteration_stats,
    noise_scale,
    robust_scale,
)
from fabricscope.straggler.posterior import interval_llr, posteriors
from fabricscope.straggler.replay import Graph, build_graph, ideal_durations, replay
from fabricscope.straggler.table import COMPUTE, P2P, OpTable

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: prior weight of one device of each type (relative); a switch is a priori less likely than
#: an end device per unit, but not forbidden (Holmes' prior over device types).
TYPE_PRIOR = {"slow-gpu": 1.0, "slow-nic": 1.0, "slow-switch": 0.3}
P_NULL = 0.5


@dataclass(frozen=True, slots=True)
class Options:
    """Thresholds of the analysis (defaults fit the twin and the real traces; see docs)."""

    compute_k: float = 6.0        # compute excess > k robust sigmas ...
    compute_rel: float = 0.10     # ... and > 10 % of the stage reference
    comm_k: float = 6.0
    comm_rel: float = 0.25        # transfer > 125 % of its class median
    stage_rel: float = 0.15       # a stage heavier by > 15 % is imbalance
    seq_cv: float = 0.10          # micro-batch compute dispersion above this: sequence imbalance
    min_candidates: int = 64      # prior spread over at least this many devices
    max_findings: int = 5
    min_iterations: int = 2       # a device fault must show in >= 2 consecutive iterations
    rank_test_min_wins: int = 4   # the slowest-of-peers view needs >= 4 wins in its window
    correct_clocks: bool = True
    material_k: float = 3.0       # a device finding's mean replay gain over its window of w
    material_rel: float = 0.005   # iterations must exceed max(k sigma / sqrt(w), rel x iteration)


@dataclass(slots=True)
class Report:
    """Everything the analysis found, ready for a table, JSON or a plot."""

    job: str
    findings: list[Finding]
    iterations: IterationStats
    actual_ns: float
    ideal_ns: float
    warnings: list[str] = field(default_factory=list)
    candidates: list[dict[str, object]] = field(default_factory=list)
    naive_vote: dict[str, int] = field(default_factory=dict)
    traced_vote: dict[str, int] = field(default_factory=dict)
    clock_offsets_ns: dict[int, int] = field(default_factory=dict)
    explained_ns: dict[str, list[float]] = field(default_factory=dict)
    #: mean iteration replayed with the actual durations (the what-if baseline)
    replayed_ns: float = 0.0
    #: mean iteration replayed with every operator idealized (OSDI'25's job-level ideal)
    ideal_all_ns: float = 0.0
    #: the earlier first-order estimate: actual minus the findings' measured excess
    ideal_excess_ns: float = 0.0
    #: the noise floor a device finding had to clear (ns per iteration)
    material_ns: float = 0.0

    @property
    def slowdown(self) -> float:
        """What the findings cost: replayed actual / replayed with the findings idealized."""
        base = self.replayed_ns or self.actual_ns
        return base / self.ideal_ns if self.ideal_ns > 0 else 1.0

    @property
    def slowdown_all(self) -> float:
        """Replayed actual / every operator idealized (includes unexplained variation)."""
        base = self.replayed_ns or self.actual_ns
        return base / self.ideal_all_ns if self.ideal_all_ns > 0 else 1.0

    @property
    def slowdown_excess(self) -> float:
        """Actual / (actual minus the findings' excess): the first-order estimate."""
        return self.actual_ns / self.ideal_excess_ns if self.ideal_excess_ns > 0 else 1.0

    def device_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.kind != "imbalance"]

    def to_json(self) -> dict[str, object]:
        return {
            "job": self.job,
            "findings": [
                {"kind": f.kind, "subject": f.subject, "score": round(f.score, 4),
                 "window_ns": list(f.window), "evidence": list(f.evidence), "action": f.action,
                 "details": dict(f.details)}
                for f in self.findings
            ],
            "iterations": {"ids": list(self.iterations.iterations),
                           "duration_ns": list(self.iterations.duration_ns),
                           "irregular": list(self.iterations.irregular),
                           "change_points": list(self.iterations.change_points),
                           "change_point_indexes": list(self.iterations.change_point_index)},
            "actual_iteration_ns": round(self.actual_ns),
            "replayed_iteration_ns": round(self.replayed_ns),
            "ideal_iteration_ns": round(self.ideal_ns),
            "estimated_slowdown": round(self.slowdown, 4),
            "slowdown_estimates": {
                "replay_findings_idealized": round(self.slowdown, 4),
                "replay_all_operators_idealized": round(self.slowdown_all, 4),
                "excess_removal": round(self.slowdown_excess, 4)},
            "material_ns_per_iteration": round(self.material_ns),
            "candidates": self.candidates,
            "naive_last_arriver_vote": self.naive_vote,
            "backtraced_vote": self.traced_vote,
            "clock_offsets_ns": {str(k): v for k, v in self.clock_offsets_ns.items()},
            "warnings": self.warnings,
        }


def _dense(values: npt.NDArray[np.integer], ) -> tuple[I64, I64]:
    return dense_codes(values)


def _ms(ns: float) -> str:
    if abs(ns) < 1e5:
        return f"{ns / 1e3:.0f} us"
    return f"{ns / 1e6:.1f} ms" if abs(ns) < 1e10 else f"{ns / 1e9:.2f} s"


def _iter_span(its: I64, a: int, b: int) -> str:
    """Steps as the trace numbers them (not positions: real traces start anywhere)."""
    return f"steps {its[a]}-{its[b - 1]}" if b - a > 1 else f"step {its[a]}"


def _shift_clocks(table: OpTable, offsets: dict[int, int]) -> OpTable:
    if not offsets:
        return table
    shift = np.zeros(len(table), dtype=np.int64)
    for r, off in offsets.items():
        shift[table.rank == r] = off
    t = table.take(np.ones(len(table), dtype=bool))
    t.start = t.start - shift
    t.end = t.end - shift
    return t


def analyze(
    table: OpTable,
    *,
    devices: DeviceMap | None = None,
    options: Options | None = None,
    warnings: list[str] | None = None,
) -> Report:
    """Localize what slows the job whose operator timings are ``table``.

    Returns a :class:`Report` whose ``findings`` are ranked: device faults
    (``slow-gpu``/``slow-nic``/``slow-switch``) with a posterior probability, then
    ``imbalance`` findings (a heavier pipeline stage, sequence-length skew) that are workload
    properties, never device faults. Complexity: O(rows log rows) for sorting the
    communication rows plus O(candidates x iterations).
    """
    opt = options or Options()
    warns = list(warnings or [])
    if len(table) == 0:
        empty = iteration_stats(np.zeros(0, dtype=np.int64), np.zeros(0))
        return Report(table.job, [], empty, 0.0, 0.0, [*warns, "no operators to analyze"])

    inst = match_instances(table, k_sigma=opt.comm_k, rel=opt.comm_rel)
    offsets: dict[int, int] = {}
    if opt.correct_clocks:
        offsets = clock_offsets(table, inst)
        if offsets:
            for r, off in sorted(offsets.items()):
                src = table.files.get(r, "?")
                warns.append(f"rank {r} ({src}): clock offset {_ms(off)} against its groups' "
                             f"collective completions; corrected")
            table = _shift_clocks(table, offsets)
            inst = match_instances(table, k_sigma=opt.comm_k, rel=opt.comm_rel)

    ranks, r_idx = _dense(table.rank)
    its, i_idx = _dense(table.iteration)
    n_r, n_i = ranks.size, its.size

    # 1. iteration durations
    flat = r_idx * 0 + i_idx
    it_start = np.full(n_i, np.iinfo(np.int64).max)
    it_end = np.full(n_i, np.iinfo(np.int64).min)
    np.minimum.at(it_start, flat, table.start)
    np.maximum.at(it_end, flat, table.end)
    it_dur = (it_end - it_start).astype(np.float64)
    stats = iteration_stats(its, it_dur)
    # What-if baseline: the dependency graph replayed with the actual durations (OSDI'25).
    graph = build_graph(table, inst)
    base_run = replay(graph)
    r0 = base_run.iteration_ns
    if base_run.cycles_broken:
        warns.append(f"replay: {base_run.cycles_broken} operators with coinciding timestamps "
                     f"formed dependency cycles; released in time order")
    chain_r = r_idx[graph.chain_rows]
    chain_i = i_idx[graph.chain_rows]
    chain_compute = table.kind[graph.chain_rows] == COMPUTE
    # A device finding must explain a material share of the iteration: the mean replay gain
    # over its window of w iterations must exceed k standard errors of the iteration noise
    # (k sigma / sqrt(w): a smaller shift would not be visible in those iterations) and a
    # floor of rel x the iteration (a symptom nobody could notice is no finding).
    sigma_it = noise_scale(it_dur)
    floor_ns = opt.material_rel * float(np.median(r0)) if n_i else 0.0

    def material_for(w: int) -> float:
        return max(opt.material_k * sigma_it / float(np.sqrt(max(w, 1))), floor_ns)

    material = material_for(n_i)
    dc_found = graph.dur_chain.copy()
    di_found = graph.dur_inst.copy()

    # 2. compute per rank and iteration, against stage peers
    cm = table.kind == COMPUTE
    cell = r_idx * n_i + i_idx
    comp: F64 = np.bincount(cell[cm], weights=(table.end - table.start)[cm].astype(np.float64),
                            minlength=n_r * n_i).reshape(n_r, n_i).astype(np.float64)
    present = np.bincount(cell[cm], minlength=n_r * n_i).reshape(n_r, n_i) > 0
    stage_of = np.full(n_r, -1, dtype=np.int64)
    np.maximum.at(stage_of, r_idx, table.stage.astype(np.int64))
    stages = np.unique(stage_of)
    ref = np.zeros((n_r, n_i))
    stage_ref = np.zeros((stages.size, n_i))
    compm = np.where(present, comp, np.nan)
    for j, s in enumerate(stages.tolist()):
        rows = stage_of == s
        # A stage with no trace in some iteration (missing rank, cut file) is an all-NaN
        # column: numpy warns on stderr; the column is left at 0 (no reference) on purpose.
        with np.errstate(all="ignore"), _pywarnings.catch_warnings():
            _pywarnings.simplefilter("ignore", RuntimeWarning)
            if np.all(np.isnan(compm[rows])):
                continue
            lm = np.nanquantile(compm[rows], 0.5, axis=0, method="lower")
        lm = np.nan_to_num(lm)
        stage_ref[j] = lm
        ref[rows] = lm
    excess = np.where(present, comp - ref, 0.0)
    vals = excess[present & (ref > 0)]
    sigma_c = robust_scale(vals[vals != 0]) if vals.size else 0.0
    limit_c = np.maximum(opt.compute_k * sigma_c, opt.compute_rel * ref)
    slow_c = present & (ref > 0) & (excess > limit_c)
    # Rank evidence, robust to noisy hosts: is r the slowest of its stage peers (by a margin)?
    # Under "no fault" that happens with probability 1/peers per iteration.
    peer_n = np.zeros(n_r)
    top_c = np.zeros((n_r, n_i), dtype=bool)
    for s in stages.tolist():
        rows_s = np.flatnonzero(stage_of == s)
        peer_n[rows_s] = rows_s.size
        if rows_s.size < 2:
            continue
        sub = np.where(present[rows_s], comp[rows_s], -np.inf)
        arg = np.argmax(sub, axis=0)
        top_c[rows_s[arg], np.arange(n_i)] = True
    top_c &= present & (ref > 0) & (excess > opt.compute_rel * ref)

    # 3. communication evidence per NIC / leaf candidate
    host_of = np.arange(n_r, dtype=np.int64)
    nic_names: list[str] = []
    leaf_names: list[str] = []
    if devices is not None:
        hmap: dict[str, int] = {}
        host_of = np.array([hmap.setdefault(devices.host_of(int(r)), len(hmap))
                            for r in ranks.tolist()], dtype=np.int64)
        nmap: dict[str, int] = {}
        nic_of = np.array([nmap.setdefault(devices.nic_of(int(r)), len(nmap))
                           for r in ranks.tolist()], dtype=np.int64)
        nic_names = list(nmap)
        lmap: dict[str, int] = {}
        leaf_of = np.array([lmap.setdefault(devices.leaf.get(int(r)) or "", len(lmap))
                            for r in ranks.tolist()], dtype=np.int64)
        leaf_names = list(lmap)
    else:
        nic_of = np.arange(n_r, dtype=np.int64)
        nic_names = [f"rank {r} network" for r in ranks.tolist()]
        leaf_of = np.zeros(n_r, dtype=np.int64)
    row_r = r_idx[inst.rows]
    multi = inst.observed if inst.observed is not None else inst.count >= 2
    if inst.rows.size:
        h_min = np.minimum.reduceat(host_of[row_r], inst.first) if inst.n else np.zeros(0)
        h_max = np.maximum.reduceat(host_of[row_r], inst.first) if inst.n else np.zeros(0)
        network = multi & (h_min != h_max)
    else:
        network = np.zeros(0, dtype=bool)
    it_of_inst = np.searchsorted(its, inst.iteration)
    explained_inst = np.zeros(inst.n, dtype=bool)
    if inst.rows.size:
        # A transfer touching a rank whose compute was slow in that iteration is not network
        # evidence: fused send/recv pairs (Megatron's send_forward_recv_backward) and late
        # arrivals stretch it, whatever the wire did.
        touched = slow_c[row_r, it_of_inst[inst.inst]].astype(np.int8)
        explained_inst |= np.maximum.reduceat(touched, inst.first).astype(bool)
    explained_gpu = np.zeros((n_r, n_i), dtype=bool)

    pair_cache: dict[str, tuple[I64, I64, F64]] = {}

    def comm_counts(name: str, owner: I64, n_owner: int, dedupe: bool) -> tuple[F64, F64]:
        """Slow (not yet explained) and fast network observations per owner and iteration."""
        if name not in pair_cache:
            use = network[inst.inst]
            o = owner[row_r][use]
            k = inst.inst[use]
            if dedupe and o.size:
                # Sort-based dedupe: numpy's hash-based unique is slow on millions of keys.
                pair = np.sort(k * max(n_owner, 1) + o)
                pair = pair[np.r_[True, pair[1:] != pair[:-1]]]
                k, o = pair // max(n_owner, 1), pair % max(n_owner, 1)
            idx = o * n_i + it_of_inst[k]
            fast = np.bincount(idx[~inst.slow[k]], minlength=n_owner * n_i)
            pair_cache[name] = (k, idx, fast.reshape(n_owner, n_i).astype(np.float64))
        k, idx, f = pair_cache[name]
        slow = inst.slow[k] & ~explained_inst[k]
        h = np.bincount(idx[slow], minlength=n_owner * n_i).reshape(n_owner, n_i)
        return h.astype(np.float64), f

    n_nic, n_leaf = len(nic_names), len(leaf_names)
    use_leaf = devices is not None and n_leaf > 1
    # Spines: a transfer between two leaves crosses one spine above them; which one (ECMP)
    # is not in the traces, so every spine above a transfer's leaves observes it. A slow
    # spine shows as slow transfers across many leaf pairs while same-leaf ones stay fast.
    spine_names: list[str] = []
    sp_idx = np.zeros(0, dtype=np.int64)    # cross-leaf network instances
    sp_bits = np.zeros((0, 0), dtype=bool)  # [instance of sp_idx, spine]: spine above it
    if use_leaf and devices is not None and inst.n:
        spine_names = sorted({sp for lf in leaf_names for sp in devices.spines_of_leaf.get(lf, ())})
        if 0 < len(spine_names) <= 63:
            bit = {sp: 1 << k for k, sp in enumerate(spine_names)}
            leaf_mask = np.array([sum(bit[sp] for sp in devices.spines_of_leaf.get(lf, ()))
                                  for lf in leaf_names], dtype=np.int64)
            lrow = leaf_of[row_r]
            cross = (np.minimum.reduceat(lrow, inst.first) != np.maximum.reduceat(lrow, inst.first))
            above = np.bitwise_or.reduceat(leaf_mask[lrow], inst.first)
            sp_idx = np.flatnonzero(cross & network)
            sp_bits = ((above[sp_idx, None] >> np.arange(len(spine_names))) & 1).astype(bool)
        else:
            if spine_names:  # said, not silent: the fabric has more spines than the mask holds
                warns.append(f"{len(spine_names)} spine switches above the job's leaves: more than "
                             "63, so spines are not considered as candidates in this analysis")
            spine_names = []
    n_spine = len(spine_names)
    sp_fast = np.zeros((n_spine, n_i))
    if n_spine:
        fast_rows = ~inst.slow[sp_idx]
        for k in range(n_spine):
            sp_fast[k] = np.bincount(it_of_inst[sp_idx[fast_rows & sp_bits[:, k]]], minlength=n_i)

    def spine_obs(k: int) -> npt.NDArray[np.bool_]:
        """Instances spine ``k`` observes (cross-leaf network instances under it)."""
        m = np.zeros(inst.n, dtype=bool)
        m[sp_idx[sp_bits[:, k]]] = True
        return m

    def spine_counts() -> tuple[F64, F64]:
        h = np.zeros((n_spine, n_i))
        live = inst.slow[sp_idx] & ~explained_inst[sp_idx]
        for k in range(n_spine):
            h[k] = np.bincount(it_of_inst[sp_idx[live & sp_bits[:, k]]], minlength=n_i)
        return h, sp_fast

    kinds = (["slow-gpu"] * n_r + ["slow-nic"] * n_nic
             + (["slow-switch"] * n_leaf if use_leaf else []) + ["slow-switch"] * n_spine)
    type_w = np.array([TYPE_PRIOR[k] for k in kinds])
    log_prior = np.log((1 - P_NULL) * type_w / max(type_w.sum(), opt.min_candidates))
    log_null = float(np.log(P_NULL))

    def names(c: int) -> str:
        if c < n_r:
            return devices.gpu_of(int(ranks[c])) if devices else f"rank {ranks[c]}"
        if c < n_r + n_nic:
            return nic_names[c - n_r]
        if c < n_r + n_nic + (n_leaf if use_leaf else 0):
            return leaf_names[c - n_r - n_nic]
        return spine_names[c - n_r - n_nic - (n_leaf if use_leaf else 0)]

    absent = {x for g in table.groups for x in g} - set(ranks.tolist())

    def peer_missing(c: int) -> bool:
        """Whether candidate NIC ``c``'s ranks share a group with a rank that has no trace."""
        if not absent:
            return False
        mine = set(ranks[nic_of == c - n_r].tolist())
        return any(mine.intersection(g) and absent.intersection(g) for g in table.groups)

    def nic_groups(c: int) -> int:
        """Distinct memberships among candidate NIC ``c``'s unexplained slow transfers."""
        a_, b_ = int(win.start[c]), int(win.end[c])
        member = np.zeros(inst.n, dtype=bool)
        member[inst.inst[nic_of[row_r] == c - n_r]] = True
        in_win = (it_of_inst >= a_) & (it_of_inst < b_)
        s_ = member & network & inst.slow & in_win & ~explained_inst
        gids = np.unique(table.group[inst.rows[inst.first[s_]]]).tolist()
        return len({frozenset(table.groups[g]) for g in gids})

    findings: list[Finding] = []
    explained_series: dict[str, list[float]] = {}
    candidates_out: list[dict[str, object]] = []
    verdicts: dict[str, str] = {}
    explained_total = np.zeros(n_i)
    for round_no in range(opt.max_findings + 8):
        if len(findings) >= opt.max_findings:
            break
        gh = (slow_c & ~explained_gpu).astype(np.float64)
        gf = (present & ~slow_c).astype(np.float64)
        nh, nf = comm_counts("nic", nic_of, n_nic, dedupe=n_nic < n_r)
        parts_h, parts_f = [gh, nh], [gf, nf]
        if use_leaf:
            lh, lf = comm_counts("leaf", leaf_of, n_leaf, dedupe=True)
            parts_h.append(lh)
            parts_f.append(lf)
        if n_spine:
            sh, sf = spine_counts()
            parts_h.append(sh)
            parts_f.append(sf)
        hits = np.concatenate(parts_h)
        fasts = np.concatenate(parts_f)
        # False-alarm rates from the data: the share of slow observations of each type,
        # floored at 1 % and capped at 30 % (noisy hosts raise it, so noise needs more
        # agreement before it names a device).
        n_net = int(network.sum())
        pf_net = float(np.clip((inst.slow & network).sum() / max(n_net, 1), 0.01, 0.3))
        n_obs = int((present & (ref > 0)).sum())
        pf_gpu = float(np.clip(slow_c.sum() / max(n_obs, 1), 0.01, 0.3))
        p_false = np.concatenate([np.full(n_r, pf_gpu), np.full(hits.shape[0] - n_r, pf_net)])
        win = interval_llr(hits, fasts, p_false=p_false)
        # The rank test, with its own false-alarm rate 1/peers; the better of the two views
        # is kept (they are two readings of one hypothesis, not independent evidence).
        th = (top_c & ~explained_gpu).astype(np.float64)
        tf = (present & ~top_c).astype(np.float64)
        ok = peer_n >= 3
        if ok.any():
            p0 = 1.0 / np.maximum(peer_n[ok], 1.0)
            w2 = interval_llr(th[ok], tf[ok], p_false=p0)
            idx_ok = np.flatnonzero(ok)
            # Being the slowest of n peers by chance is common (1/n per iteration, times
            # many ranks and windows): the rank view needs several wins to count.
            csum = np.concatenate([np.zeros((idx_ok.size, 1)), np.cumsum(th[ok], axis=1)], axis=1)
            wins = csum[np.arange(idx_ok.size), w2.end] - csum[np.arange(idx_ok.size), w2.start]
            w2.llr[wins < opt.rank_test_min_wins] = 0.0
            # ... and pays for the windows it searched (multiple testing).
            w2.llr[:] = np.maximum(w2.llr - np.log(n_i * (n_i + 1) / 2), 0.0)
            better = w2.llr > win.llr[idx_ok]
            sel = idx_ok[better]
            win.llr[sel] = w2.llr[better]
            win.start[sel] = w2.start[better]
            win.end[sel] = w2.end[better]
        share, indiv, _p_null = posteriors(win.llr, log_prior, log_prior_null=log_null)
        order = np.argsort(-(win.llr + log_prior))
        # A fault is a state that lasts: a single-iteration blip is not localized.
        lasting = (win.end - win.start) >= opt.min_iterations
        if round_no == 0:
            for c in order[:10].tolist():
                why = ("posterior against no fault below 0.9" if indiv[c] < 0.9 else
                       "a single iteration" if not lasting[c] else "")
                candidates_out.append({"subject": names(c), "kind": kinds[c],
                                       "llr": round(float(win.llr[c]), 2),
                                       "posterior": round(float(share[c]), 4),
                                       "verdict": f"not reported: {why}" if why else ""})
        order = order[lasting[order]]
        if order.size == 0:
            break
        # A missing peer rank removes the transfers that would have cleared a NIC elsewhere:
        # such a NIC is singled out only when its slow transfers span two or more groups of
        # different membership (docs/straggler.md, Identifiability).
        for pos, c in enumerate(order[:32].tolist()):
            if not (n_r <= c < n_r + n_nic) or not peer_missing(c) or nic_groups(c) >= 2:
                order = order[pos:]
                break
        else:
            break
        best = int(order[0])
        if indiv[best] < 0.9:
            break
        a, b = int(win.start[best]), int(win.end[best])
        kind = kinds[best]
        subject = names(best)
        series = np.zeros(n_i)
        evidence: list[str] = []
        details: dict[str, float | int | str] = {}
        dc = graph.dur_chain.copy()
        di = graph.dur_inst.copy()
        if kind == "slow-gpu":
            r = best
            flag = slow_c[r, a:b] | top_c[r, a:b]
            series[a:b] = np.where(flag, excess[r, a:b], 0.0)
            explained_gpu[r, a:b] |= flag
            # What-if: this GPU computes like its stage peers in the window.
            fac = np.where((ref[r] > 0) & (comp[r] > ref[r]), ref[r] / np.maximum(comp[r], 1.0), 1.0)
            mine = (chain_r == r) & chain_compute & (chain_i >= a) & (chain_i < b)
            dc[mine] *= fac[chain_i[mine]]
            n_slow = int(flag.sum())
            ratio = float(np.median(comp[r, a:b][flag] / ref[r, a:b][flag])) if n_slow else 1.0
            ops = sorted({table.op_names[o] for o in
                          np.unique(table.op[cm & (r_idx == r)]).tolist()})
            evidence.append(f"{_iter_span(its, a, b)}: compute slower than its stage peers in "
                            f"{n_slow} of {b - a} (x{ratio:.2f}, +{_ms(float(series[a:b].sum()) / max(n_slow, 1))}"
                            f" per iteration)")
            evidence.append(f"ops: {', '.join(ops[:6])}")
            details.update(rank=int(ranks[r]), stage=int(stage_of[r]), ratio=round(ratio, 3))
            if devices is not None:
                details["host"] = devices.host_of(int(ranks[r]))
            action = "drain the GPU/host and run GPU diagnostics (clocks, thermals, ECC, PCIe)"
        else:
            spine_k = best - n_r - n_nic - (n_leaf if use_leaf else 0)
            member = np.zeros(inst.n, dtype=bool)
            if spine_k >= 0:
                member = spine_obs(spine_k)
            else:
                owner = nic_of if kind == "slow-nic" else leaf_of
                own_idx = best - n_r if kind == "slow-nic" else best - n_r - n_nic
                rows_here = owner[row_r] == own_idx
                member[inst.inst[rows_here]] = True
            in_win = (it_of_inst >= a) & (it_of_inst < b)
            sel = member & network & inst.slow & in_win & ~explained_inst
            explained_inst |= sel
            if spine_k >= 0:
                # A slow spine slows transfers across many leaf pairs; slow transfers
                # between one pair of leaves look the same as a NIC or cable there.
                lo_l = np.minimum.reduceat(leaf_of[row_r], inst.first)[sel]
                hi_l = np.maximum.reduceat(leaf_of[row_r], inst.first)[sel]
                n_pairs = len(set(zip(lo_l.tolist(), hi_l.tolist(), strict=True)))
                if n_pairs < 2:
                    verdicts.setdefault(subject, "not reported: slow transfers between one "
                                                 "leaf pair only (an end device there looks "
                                                 "the same)")
                    continue
            np.add.at(series, it_of_inst[sel], inst.excess[sel])
            # What-if: its transfers in the window take their class's baseline time (all of
            # them above it, not only those past the slow threshold: a sick device slows
            # every transfer through it, some by less than the threshold).
            ideal_sel = member & network & in_win & (inst.excess > 0)
            di[ideal_sel] = np.maximum(inst.transfer[ideal_sel] - inst.excess[ideal_sel], 0.0)
            tot = int((member & network & in_win).sum())
            n_sel = int(sel.sum())
            cls_names = sorted({inst.class_names[c] for c in np.unique(inst.cls[sel]).tolist()})
            med_ratio = float(np.median(inst.transfer[sel] / np.maximum(
                inst.transfer[sel] - inst.excess[sel], 1.0))) if n_sel else 1.0
            evidence.append(f"{_iter_span(its, a, b)}: {n_sel} of {tot} transfers through it "
                            f"slow (x{med_ratio:.2f}), while the same groups' other members "
                            f"were fast elsewhere")
            evidence.append(f"ops: {', '.join(cls_names[:4])}")
            if kind == "slow-nic":
                rk = ranks[nic_of == own_idx]
                details.update(ranks=",".join(map(str, rk[:8].tolist())), ratio=round(med_ratio, 3))
                if devices is not None:
                    link = devices.nic_link.get(int(rk[0]))
                    if link:
                        details["access_link"] = link
                        evidence.append(f"or its access link {link} (indistinguishable from "
                                        f"end-host timings; check port counters)")
                action = ("check the NIC and its cable: link speed/FEC errors, PFC pauses, "
                          "firmware; swap the optic if counters show errors")
            else:
                action = "check the switch: buffer/PFC counters, ECMP hashing, port errors"
                if spine_k >= 0:
                    # Spines over the same leaves observe the same transfers: the traces
                    # cannot tell them apart (ECMP paths are not traced).
                    twins = [spine_names[j] for j in range(n_spine) if j != spine_k
                             and np.array_equal(sp_bits[:, j], sp_bits[:, spine_k])]
                    evidence.append(f"slow transfers span {n_pairs} leaf pair(s); transfers "
                                    f"within a leaf were fast")
                    if twins:
                        evidence.append(f"ambiguous: {', '.join(twins[:6])} carried the same "
                                        f"transfers (ECMP paths are not in the traces); "
                                        f"probability is shared among them")
                        details["ambiguous_with"] = ",".join(twins)
                        for tw in twins:
                            verdicts[tw] = f"not reported apart: indistinguishable from {subject}"
                    action = ("check the spine (and its peers listed): port errors, "
                              "buffer/PFC counters, ECMP hashing; compare their counters")
        gain = r0 - replay(graph, dc, di).iteration_ns
        g_mean = float(gain[a:b].mean()) if b > a else 0.0
        need = material_for(b - a)
        if g_mean < need:
            # Slow operators off the critical path (or noise): they explain no symptom.
            verdicts[subject] = (f"not reported: idealizing it saves {_ms(g_mean)} per step "
                                 f"over {b - a} step(s), below the noise floor {_ms(need)}")
            warns.append(f"{subject}: {evidence[0] if evidence else 'slow operators'}; but they "
                         f"are off the critical path (replay without them saves "
                         f"{_ms(g_mean)} per step, noise floor {_ms(need)}): not a finding")
            continue
        dc_found = np.minimum(dc_found, dc)
        di_found = np.minimum(di_found, di)
        series = np.minimum(series, it_dur)
        explained_total += series
        explained_series[subject] = series.tolist()
        window = (int(it_start[a]), int(it_end[b - 1]))
        x = _slowdown_of(r0, gain)
        evidence.append(f"explains {_ms(float(series.sum()))} over {b - a} iteration(s); "
                        f"replay without it saves {_ms(g_mean)} per step")
        evidence.append(f"estimated slowdown it causes: x{x:.2f} (dependency replay: mean "
                        f"iteration {_ms(float(r0.mean()))}, {_ms(float((r0 - gain).mean()))} "
                        f"without it)")
        details.update(llr=round(float(win.llr[best]), 2),
                       explained_ns=round(float(series.sum())), first_iteration=int(its[a]),
                       last_iteration=int(its[b - 1]), replay_gain_ns=round(g_mean),
                       slowdown=round(x, 3))
        verdicts[subject] = "reported"
        findings.append(Finding(kind, subject, float(share[best]), window, tuple(evidence),
                                action, details))

    # 4. workload imbalance (never a device fault)
    imb = _imbalance(table, opt, stages, stage_ref, comp, present, stage_of, cm, r_idx, i_idx,
                     n_r, n_i, it_start, it_end, its, findings)
    for f, series in imb:
        dc = _imbalance_ideal(f, graph, table, chain_r, chain_i, chain_compute, stages,
                              stage_of, stage_ref)
        gain = r0 - replay(graph, dc, None).iteration_ns
        x = _slowdown_of(r0, gain)
        dc_found = np.minimum(dc_found, dc)
        findings.append(Finding(
            f.kind, f.subject, f.score, f.window,
            (*f.evidence, f"estimated slowdown it causes: x{x:.2f} (dependency replay: mean "
                          f"iteration {_ms(float(r0.mean()))}, {_ms(float((r0 - gain).mean()))} "
                          f"without it)"),
            f.action, {**f.details, "slowdown": round(x, 3), "replay_gain_ns": round(float(gain.mean()))}))
        explained_series[f.subject] = series.tolist()
        explained_total += series

    # 5. votes: naive last arriver vs back-traced root
    naive, traced = _votes(table, inst, r_idx, i_idx, ranks, n_r, n_i, excess, limit_c,
                           it_of_inst)
    if findings and findings[0].kind == "slow-gpu" and naive:
        top_naive = max(naive.items(), key=lambda kv: kv[1])[0]
        f0 = findings[0]
        findings[0] = Finding(f0.kind, f0.subject, f0.score, f0.window,
                              (*f0.evidence, f"naive last-arriver vote: rank {top_naive}; "
                               f"back-traced along pipeline recv waits: rank "
                               f"{max(traced.items(), key=lambda kv: kv[1])[0] if traced else '-'}"),
                              f0.action, f0.details)

    actual = float(it_dur.mean()) if n_i else 0.0
    ideal_excess = float(np.maximum(it_dur - explained_total, 0.3 * it_dur).mean()) if n_i else 0.0
    replayed = float(r0.mean()) if n_i else 0.0
    ideal = float(replay(graph, dc_found, di_found).iteration_ns.mean()) if n_i else 0.0
    dc_all, di_all = ideal_durations(table, graph, inst)
    ideal_all = float(replay(graph, dc_all, di_all).iteration_ns.mean()) if n_i else 0.0
    if n_i and replayed > 0 and abs(replayed - actual) > 0.1 * actual:
        warns.append(f"replay: the dependency graph replays the mean iteration in "
                     f"{_ms(replayed)} against {_ms(actual)} measured; slowdown estimates "
                     f"are approximate")
    for c in candidates_out:
        v = verdicts.get(str(c["subject"]))
        if v is not None:
            c["verdict"] = v
        elif not c["verdict"]:
            c["verdict"] = ("not reported: explained by the findings above" if findings else
                            "not reported: its evidence was explained by another candidate")
    return Report(table.job, findings, stats, actual, ideal, warns, candidates_out,
                  {str(k): v for k, v in naive.items()}, {str(k): v for k, v in traced.items()},
                  offsets, explained_series, replayed, ideal_all, ideal_excess, material)


def _slowdown_of(r0: F64, gain: F64) -> float:
    """Replayed actual over replayed-without-it (mean iterations)."""
    base = float(r0.mean()) if r0.size else 0.0
    without = float((r0 - gain).mean()) if r0.size else 0.0
    return base / without if without > 0 else 1.0


def _imbalance_ideal(
    f: Finding, graph: Graph, table: OpTable, chain_r: I64, chain_i: I64,
    chain_compute: npt.NDArray[np.bool_], stages: I64, stage_of: I64, stage_ref: F64,
) -> F64:
    """Chain durations with an imbalance removed, for the what-if replay.

    Stage imbalance: the heavy stage computes the mean of all stages (the OSDI'25 stage
    what-if: its operators at the job's typical duration). Sequence imbalance: every
    micro-batch of a rank and iteration costs their mean (token-balanced batches move work
    between micro-batches; they do not remove it).
    """
    dc = graph.dur_chain.copy()
    if f.details.get("kind") == "stage-imbalance":
        s = int(f.details["stage"])
        j = int(np.searchsorted(stages, s))
        known = stages >= 0
        target = stage_ref[known].mean(axis=0)
        fac = np.where(stage_ref[j] > target, target / np.maximum(stage_ref[j], 1.0), 1.0)
        mine = chain_compute & (stage_of[chain_r] == s)
        dc[mine] *= fac[chain_i[mine]]
    else:
        n_i = int(chain_i.max()) + 1 if chain_i.size else 1
        key = ((chain_r.astype(np.int64) * n_i + chain_i) * (len(table.op_names) + 1)
               + table.op[graph.chain_rows])
        _, code = dense_codes(key)
        mean = (np.bincount(code, weights=dc) / np.maximum(np.bincount(code), 1))[code]
        dc = np.where(chain_compute, mean, dc)
    return dc


def _imbalance(
    table: OpTable, opt: Options, stages: I64, stage_ref: F64, comp: F64,
    present: npt.NDArray[np.bool_], stage_of: I64, cm: npt.NDArray[np.bool_], r_idx: I64,
    i_idx: I64, n_r: int, n_i: int, it_start: I64, it_end: I64, its: I64,
    device_findings: list[Finding],
) -> list[tuple[Finding, F64]]:
    """Stage imbalance (one stage's peers all heavier) and sequence imbalance (micro-batch skew)."""
    out: list[tuple[Finding, F64]] = []
    window = (int(it_start.min()), int(it_end.max())) if n_i else (0, 0)
    known = stages[stages >= 0]
    if known.size >= 2:
        per_stage = np.median(stage_ref, axis=1)
        ok = stages >= 0
        base = float(np.quantile(per_stage[ok], 0.5, method="lower"))
        for j, s in enumerate(stages.tolist()):
            if s < 0 or base <= 0:
                continue
            ratio = float(per_stage[j] / base)
            heavier = stage_ref[j] > (1 + opt.stage_rel) * base
            if ratio > 1 + opt.stage_rel:
                series = np.maximum(stage_ref[j] - base, 0.0)
                frac = float(heavier.mean())
                out.append((Finding(
                    "imbalance", f"pipeline stage {s}", round(frac, 4), window,
                    (f"every rank of stage {s} computes x{ratio:.2f} the lightest-half stage "
                     f"({_ms(float(per_stage[j]))} vs {_ms(base)} per iteration) in "
                     f"{int(heavier.sum())} of {n_i} iterations",
                     "all data-parallel peers of the stage agree: workload partitioning, "
                     "not a faulty device"),
                    "rebalance layers across pipeline stages (e.g. fewer layers on the last "
                    "stage, which also holds the loss/embedding)",
                    {"stage": int(s), "ratio": round(ratio, 3), "kind": "stage-imbalance",
                     "explained_ns": round(float(series.sum()))}), series))
    # Sequence imbalance: micro-batch compute durations disperse on every rank.
    rows = np.flatnonzero(cm)
    if rows.size:
        # Only ops that repeat inside an iteration are micro-batches.
        key3 = (r_idx[rows] * n_i + i_idx[rows]) * (len(table.op_names) + 1) + table.op[rows]
        _, inv3 = dense_codes(key3)
        cnt3 = np.bincount(inv3)
        rows = rows[(cnt3[inv3] >= 2) | (table.mb[rows] >= 0)]
    if rows.size:
        dur = (table.end[rows] - table.start[rows]).astype(np.float64)
        key = r_idx[rows] * (len(table.op_names) + 1) + table.op[rows]
        _, inv = dense_codes(key)
        counts = np.bincount(inv)
        o = group_sort(inv, dur)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        med = dur[o][starts + (counts - 1) // 2]
        good = counts[inv] >= 4
        if good.sum() >= 8:
            rel = dur[good] / np.maximum(med[inv[good]], 1.0)
            cv = _tail_cv(rel)
            # Dispersion per rank: if one rank alone disperses, it is a device, not the data.
            rr = r_idx[rows][good]
            o2 = group_sort(rr, rel)
            rs = rr[o2]
            st2 = np.flatnonzero(np.r_[True, rs[1:] != rs[:-1]])
            cn2 = np.diff(np.r_[st2, rs.size])
            vals_sorted = rel[o2]
            p50 = vals_sorted[st2 + (cn2 - 1) // 2]
            p95 = vals_sorted[st2 + ((cn2 - 1) * 95) // 100]
            per_rank = np.where(cn2 >= 4, (p95 - p50) / 1.645, 0.0)
            spread_ranks = int((per_rank > opt.seq_cv).sum())
            n_seen = int(st2.size)
            if cv > opt.seq_cv and spread_ranks >= max(2, n_seen // 2):
                spread = np.zeros(n_i)
                for s in stages.tolist():
                    sel = stage_of == s
                    cs = np.where(present[sel], comp[sel], np.nan)
                    with np.errstate(all="ignore"), _pywarnings.catch_warnings():
                        _pywarnings.simplefilter("ignore", RuntimeWarning)
                        gap = np.nanmax(cs, axis=0) - np.nanmedian(cs, axis=0)
                    spread = np.maximum(spread, np.nan_to_num(gap))
                out.append((Finding(
                    "imbalance", "sequence lengths (micro-batches)",
                    round(min(1.0, spread_ranks / max(n_seen, 1)), 4), window,
                    (f"micro-batch compute time varies by {cv:.0%} (tail CV, (p95-p50)/1.645) on "
                     f"{spread_ranks} of {n_seen} ranks, with no rank consistently slower",
                     "the waits move between ranks from iteration to iteration: data, not "
                     "hardware"),
                    "pack/sort sequences into micro-batches of similar cost "
                    "(token-balanced batching)",
                    {"kind": "sequence-imbalance", "cv": round(cv, 4),
                     "explained_ns": round(float(spread.sum()))}), spread))
    _ = device_findings
    return out


def _tail_cv(rel: F64) -> float:
    """Dispersion of durations relative to their median, sensitive to a heavy right tail.

    ``(p95 - p50) / 1.645`` equals the CV for normal noise; long sequences make the right
    tail of micro-batch compute times heavy, which a MAD would not see.
    """
    if rel.size < 4:
        return 0.0
    p50, p95 = np.percentile(rel, [50, 95])
    return float((p95 - p50) / 1.645)


def _votes(
    table: OpTable, inst: Instances, r_idx: I64, i_idx: I64, ranks: I64, n_r: int, n_i: int,
    excess: F64, limit_c: F64, it_of_inst: I64,
) -> tuple[dict[int, int], dict[int, int]]:
    """Who arrived last at each data-parallel collective, naively and after back-tracing.

    Back-tracing: if the last arriver spent longer waiting in a pipeline recv than its own
    compute excess, the blame moves to the sender it waited on, repeatedly.
    """
    coll = (inst.count >= 2) & ~inst.is_p2p
    if not coll.any():
        return {}, {}
    last = np.searchsorted(ranks, inst.last_rank[coll]).astype(np.int64)
    it = it_of_inst[coll]
    # Largest recv wait per (rank, iteration) and the sender it waited for.
    prow = table.kind[inst.rows] == P2P
    recv_rows = inst.rows[prow]
    wait = inst.wait[prow].astype(np.float64)
    g = table.group[recv_rows]
    g_first = np.array([x[0] if x else -1 for x in table.groups] or [-1], dtype=np.int64)
    g_last = np.array([x[-1] if x else -1 for x in table.groups] or [-1], dtype=np.int64)
    sender = g_first[g]
    receiver_is_me = g_last[g] == table.rank[recv_rows]
    # Pipelines wait by design (fill/drain bubbles): only the wait beyond what the other
    # data-parallel replicas' receivers waited at the same hop (same class, iteration and
    # micro-batch) is blame.
    if receiver_is_me.any():
        sel = np.flatnonzero(receiver_is_me)
        inst_of = inst.inst[prow][sel]
        seqs = table.seq[recv_rows[sel]]
        _, seq_code = dense_codes(seqs)
        _, key = dense_codes((inst.cls[inst_of] * max(n_i, 1) + it_of_inst[inst_of])
                             * (int(seq_code.max()) + 1) + seq_code)
        w_sel = wait[sel]
        o = group_sort(key, w_sel)
        ks = key[o]
        starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        counts = np.diff(np.r_[starts, ks.size])
        base = w_sel[o][starts + (counts - 1) // 4]
        base_row = np.empty_like(w_sel)
        base_row[o] = np.repeat(base, counts)
        wait[sel] = np.maximum(w_sel - base_row, 0.0)
    best_wait = np.zeros((n_r, n_i))
    best_sender = np.tile(np.arange(n_r, dtype=np.int64)[:, None], (1, n_i))
    if receiver_is_me.any():
        rr = r_idx[recv_rows][receiver_is_me]
        ii = i_idx[recv_rows][receiver_is_me]
        pos_of = np.full(int(max(ranks.max(), sender.max(initial=0))) + 2, -1, dtype=np.int64)
        pos_of[ranks] = np.arange(n_r)
        snd_r = sender[receiver_is_me]
        ss = np.where(snd_r >= 0, pos_of[np.clip(snd_r, 0, pos_of.size - 1)], -1)
        ww = wait[receiver_is_me]
        keep = ss >= 0
        rr, ii, ss, ww = rr[keep], ii[keep], ss[keep], ww[keep]
        key = (rr * n_i + ii) * n_r + ss
        uk, inv = dense_codes(key)
        tot = np.bincount(inv, weights=ww)
        cell = uk // n_r
        snd = uk % n_r
        o = group_sort(cell, tot)
        last_of_cell = np.ones(o.size, dtype=bool)
        last_of_cell[:-1] = cell[o][1:] != cell[o][:-1]
        pick = o[last_of_cell]
        best_wait.reshape(-1)[cell[pick]] = tot[pick]
        best_sender.reshape(-1)[cell[pick]] = snd[pick]
    cur = last.copy()
    for _ in range(64):
        w = best_wait[cur, it]
        own = np.maximum(excess[cur, it], 0.0)
        move = (w > own) & (w > 0.5 * limit_c[cur, it]) & (best_sender[cur, it] != cur)
        if not move.any():
            break
        cur = np.where(move, best_sender[cur, it], cur)
    naive = np.bincount(last, minlength=n_r)
    traced = np.bincount(cur, minlength=n_r)
    def top(v: I64) -> dict[int, int]:
        return {int(ranks[i]): int(v[i]) for i in np.argsort(-v)[:5].tolist() if v[i] > 0}

    return top(naive.astype(np.int64)), top(traced.astype(np.int64))
