"""The event-driven flow-level engine: max-min fair rates between arrivals and completions.

Between two events every rate is constant and max-min fair (:mod:`fabricscope.sim.maxmin`).
Events are flow arrivals (start time reached and every dependency arrived, plus the flow's
gap), completions (batched: every flow finishing within ``batch_rtol`` of the earliest one
completes in the same event; a permutation finishes hundreds of flows at once), flowlet
boundaries (``flowlet``/``dlb`` re-route every ``flowlet_bytes``) and the edges of link-fault
windows (capacities change; a link going down or up re-routes the active flows).

Latency model (see :mod:`fabricscope.sim.results`): a flow's bytes leave the sender in its
fluid transfer time; the last byte reaches the receiver one path propagation delay plus one
MTU of store-and-forward per switch later; the sender learns it one more propagation delay
later. Dependents start when the data has *arrived*.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix

from fabricscope.fabric.hashing import HashConfig
from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import ConfigError, InventoryError, WorkloadError
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.loadbalance import (
    DYNAMIC_SCHEMES,
    PathFinder,
    PathTable,
    Scheme,
    check_scheme,
    is_transport_only,
    route_flows,
)
from fabricscope.sim.maxmin import IncidenceSolver, max_min_rates
from fabricscope.sim.results import SimResult, Utilization

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

Progress = Callable[[int, int], None]  # (flows finished, total)

_BASE_SPORT = 49152
LINK_FAULTS = frozenset({"link-down", "link-degraded"})
FLOWLET_SLACK = 0.25
COMPACT_MIN_ROWS = 4096  # below this, re-solving the whole matrix is cheaper than compacting


@dataclass(frozen=True, slots=True)
class SteadyState:
    """Max-min fair rates of the flows active at t = 0 (no dependencies, start 0)."""

    flow_ids: IntArray
    rates_bps: FloatArray  # 0 for unroutable flows
    ideal_bps: FloatArray  # per flow: the slower of its two NIC links
    link_load_bps: FloatArray
    capacity_bps: FloatArray
    unroutable: tuple[int, ...]

    @property
    def throughput_ratio(self) -> float:
        """Aggregate throughput / ideal (every flow at its NIC rate), SIMULATION.md §1."""
        ideal = float(self.ideal_bps.sum())
        return float(self.rates_bps.sum()) / ideal if ideal > 0 else float("nan")


# ---------------------------------------------------------------------- link state
def _edge_ids_of(fabric: Fabric, subject: str, source: str) -> list[int]:
    """Directed edges a link-fault subject names: ``a|b`` (both directions) or ``a->b``."""
    try:
        if "->" in subject:
            return [fabric.edge_index(subject)]
        if "|" in subject:
            e = fabric.edge_index(subject.replace("|", "->"))
            return [e, e ^ 1]
    except InventoryError:
        pass
    raise ConfigError(
        f"{source}: subject {subject!r} is not a link of fabric {fabric.name!r} "
        "(use 'a:ethX|b:ethY' for a cable or 'a:ethX->b:ethY' for one direction)"
    )


@dataclass(frozen=True, slots=True)
class _LinkState:
    failed: frozenset[str]
    capacity: FloatArray


def _link_state(fabric: Fabric, faults: Sequence[Fault], t_ns: float) -> _LinkState:
    ix = fabric.index
    cap = ix.capacity_bps.copy()
    failed: set[str] = set()
    for f in faults:
        if not (f.start_ns <= t_ns and (f.end_ns is None or t_ns < f.end_ns)):
            continue
        edges = _edge_ids_of(fabric, f.subject, f"fault {f.kind}")
        if f.kind == "link-down":
            failed.add(fabric.links[edges[0] // 2].id)
        elif f.kind == "link-degraded":
            factor = f.param("factor", 1.0)
            if not 0 < factor <= 1:
                raise ConfigError(
                    f"fault link-degraded on {f.subject}: params.factor must be in (0, 1], got {factor}"
                )
            cap[edges] *= factor
    return _LinkState(frozenset(failed), cap)


_FINDERS: list[tuple[Fabric, HashConfig | None, frozenset[str], PathFinder]] = []
_FINDERS_MAX = 6


def _finder(fabric: Fabric, hash_config: HashConfig | None, failed: frozenset[str]) -> PathFinder:
    """A PathFinder per (fabric, hash, failed links), kept for the next runs: comparing
    schemes or seeds on one fabric reuses the next-hop caches instead of rebuilding them."""
    for fab, hc, fl, pf in _FINDERS:
        if fab is fabric and hc == hash_config and fl == failed:
            return pf
    pf = PathFinder(Routing(fabric, hash_config=hash_config, failed_links=failed))
    _FINDERS.append((fabric, hash_config, failed, pf))
    if len(_FINDERS) > _FINDERS_MAX:
        _FINDERS.pop(0)
    return pf


def edge_tiers(fabric: Fabric) -> tuple[str, ...]:
    """A readable tier name per directed edge: ``nic-leaf``, ``leaf-spine``, ``spine-core``
    (and the reverse direction ``leaf-nic``...)."""
    ix = fabric.index
    names = {0: "nic", 1: "leaf", 2: "spine", 3: "core"}
    return tuple(
        f"{names[int(ix.tier[int(ix.src[e])])]}-{names[int(ix.tier[int(ix.dst[e])])]}"
        for e in range(ix.n_edges)
    )


# ---------------------------------------------------------------------- the engine
class _Engine:
    def __init__(
        self,
        fabric: Fabric,
        flows: Sequence[FlowSpec],
        *,
        scheme: Scheme,
        hash_config: HashConfig | None,
        faults: Sequence[Fault],
        seed: int,
        flowlet_bytes: float,
        mtu_bytes: int,
        batch_rtol: float,
    ) -> None:
        self.fabric = fabric
        self.ix = fabric.index
        self.scheme = scheme
        self.hash_config = hash_config
        self.faults = [f for f in faults if f.kind in LINK_FAULTS]
        self.rng = np.random.default_rng(seed)
        self.flowlet_bytes = float(flowlet_bytes)
        self.mtu_bits = 8.0 * mtu_bytes
        self.rtol = batch_rtol
        ix = self.ix
        n = len(flows)
        self.n = n
        self.flows = flows
        # Columns of the flow table, built in one pass each (a million flows in seconds).
        ids = np.fromiter((f.id for f in flows), dtype=np.int64, count=n)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
        if dup.shape[0]:
            raise WorkloadError(f"flows: duplicate flow id {int(sorted_ids[dup[0]])}")
        node_of = ix.node_of
        nic_of = {k: v for k, v in node_of.items() if not ix.is_switch[v]}
        try:
            self.src = np.fromiter((nic_of[f.src] for f in flows), dtype=np.int64, count=n)
            self.dst = np.fromiter((nic_of[f.dst] for f in flows), dtype=np.int64, count=n)
        except KeyError as exc:
            bad = next(f for f in flows if f.src not in nic_of or f.dst not in nic_of)
            raise WorkloadError(
                f"flow {bad.id}: endpoint {exc.args[0]!r} is not a NIC of fabric {fabric.name!r}"
            ) from None
        self.size = np.fromiter((f.size_bytes for f in flows), dtype=np.float64, count=n)
        if not (self.size > 0).all():
            j = int(np.flatnonzero(~(self.size > 0))[0])
            raise WorkloadError(f"flow {flows[j].id}: size_bytes must be > 0, got {flows[j].size_bytes!r}")
        self.start_at = np.fromiter((f.start_ns for f in flows), dtype=np.float64, count=n)
        self.gap = np.fromiter((f.gap_ns for f in flows), dtype=np.float64, count=n)
        # Default source port: a multiplicative hash of the flow id (distinct ids, spread ports).
        derived = _BASE_SPORT + ((ids.astype(np.uint64) * np.uint64(2654435761)) >> np.uint64(7)).astype(np.int64) % 16384
        given = np.fromiter((-1 if f.src_port is None else f.src_port for f in flows), dtype=np.int64, count=n)
        self.sport: IntArray = np.where(given >= 0, given, derived).astype(np.int64)
        # Dependencies: children CSR (parent -> children) and pending counts.
        n_deps = np.fromiter((len(f.deps) for f in flows), dtype=np.int64, count=n)
        self.ndeps = n_deps.copy()
        if n_deps.sum():
            dep_ids = np.fromiter((d for f in flows for d in f.deps), dtype=np.int64, count=int(n_deps.sum()))
            child = np.repeat(np.arange(n, dtype=np.int64), n_deps)
            at = np.searchsorted(sorted_ids, dep_ids)
            at_c = np.minimum(at, n - 1)
            missing = sorted_ids[at_c] != dep_ids
            if missing.any():
                k = int(np.flatnonzero(missing)[0])
                raise WorkloadError(f"flow {flows[int(child[k])].id}: depends on unknown flow id {int(dep_ids[k])}")
            parent = order[at_c]
            o = np.argsort(parent, kind="stable")
            self.kid_idx = child[o]
            self.kid_ptr = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(parent, minlength=n), out=self.kid_ptr[1:])
        else:
            self.kid_idx = np.zeros(0, np.int64)
            self.kid_ptr = np.zeros(n + 1, np.int64)
        self.dep_ready = self.start_at.copy()  # max(start, dep arrivals) before the gap
        # Per-flow state.
        self.remaining = self.size * 8.0  # bits
        self.rate = np.zeros(n)
        self.state = np.zeros(n, np.int8)  # 0 waiting, 1 active, 2 done, 3 unroutable, 4 blocked
        self.t_start = np.full(n, np.nan)
        self.t_fluid_end = np.full(n, np.nan)
        self.t_arrive = np.full(n, np.nan)  # last byte at the receiver
        self.t_ack = np.full(n, np.nan)  # the sender sees the last acknowledgement
        self.lat_ns = np.zeros(n)  # one-way propagation of the current route
        self.sf_ns = np.zeros(n)  # store-and-forward term of the current route
        self.flowlet = np.zeros(n, np.int64)
        self.boundary = np.zeros(n)  # remaining bits at which the next flowlet starts
        self.dynamic = scheme in DYNAMIC_SCHEMES
        # Link state and routes.
        self.epochs = sorted({float(t) for f in self.faults for t in (f.start_ns, f.end_ns) if t is not None and t > 0})
        self._set_links(0.0)
        self.events = 0
        self.solves = 0

    # .............................................................. routing
    def _set_links(self, t: float) -> None:
        ls = _link_state(self.fabric, self.faults, t)
        self.capacity = ls.capacity
        self.finder = _finder(self.fabric, self.hash_config, ls.failed)
        self.routing = self.finder.routing
        self.table: PathTable | None = None
        self.routes: dict[int, tuple[IntArray, FloatArray]] = {}
        self.edge_load = np.zeros(self.ix.n_edges)  # DLB metric: active flows per 100G

    def _route(self, idx: IntArray) -> npt.NDArray[np.bool_]:
        """(Re-)route flows ``idx``; returns the unroutable mask."""
        if idx.shape[0] == 0:
            return np.zeros(0, dtype=bool)
        sport = self.sport[idx] + (self.flowlet[idx] if self.dynamic else 0)
        if self.dynamic:
            cap_units = self.capacity / 1e11
            for j in idx.tolist():  # remove the flow's previous flowlet from the load metric
                old = self.routes.pop(j, None)
                if old is not None:
                    self.edge_load[old[0]] -= old[1] / cap_units[old[0]]
        tab = route_flows(
            self.finder, self.scheme, self.src[idx], self.dst[idx], sport,
            rng=self.rng, load=self.edge_load, capacity_bps=self.capacity,
        )
        if self.scheme == "flowlet":  # DLB updates the metric itself while placing
            cap_units = self.capacity / 1e11
            np.add.at(self.edge_load, tab.edges, tab.weights / cap_units[tab.edges])
        lat = self.ix.latency_ns.astype(np.float64)
        rows = np.repeat(np.arange(idx.shape[0]), np.diff(tab.indptr))
        self.lat_ns[idx] = np.bincount(rows, weights=tab.weights * lat[tab.edges], minlength=idx.shape[0])
        # Store-and-forward: one MTU serialized again at every switch (every hop but the first).
        ser = self.mtu_bits / self.capacity[tab.edges] * 1e9
        tot = np.bincount(rows, weights=tab.weights * ser, minlength=idx.shape[0])
        first = np.zeros(idx.shape[0])
        nz = np.diff(tab.indptr) > 0
        # The first hop's serialization is already in the fluid time: subtract it (weighted).
        hops_w = np.bincount(rows, weights=tab.weights, minlength=idx.shape[0])
        first[nz] = tot[nz] / np.maximum(hops_w[nz], 1e-12)
        self.sf_ns[idx] = np.where(nz, tot - first, 0.0)
        if self.dynamic:
            for r, j in enumerate(idx.tolist()):
                if not tab.unroutable[r]:
                    self.routes[j] = tab.row(r)
        return tab.unroutable

    def _route_all_static(self) -> None:
        idx = np.arange(self.n)
        self.table = route_flows(
            self.finder, self.scheme, self.src, self.dst, self.sport, rng=self.rng
        )
        self._unroutable_static = self.table.unroutable.copy()
        # Latency terms for every flow at once.
        tab = self.table
        lat = self.ix.latency_ns.astype(np.float64)
        rows = np.repeat(idx, np.diff(tab.indptr))
        self.lat_ns[:] = np.bincount(rows, weights=tab.weights * lat[tab.edges], minlength=self.n)
        ser = self.mtu_bits / self.capacity[tab.edges] * 1e9
        tot = np.bincount(rows, weights=tab.weights * ser, minlength=self.n)
        hops_w = np.bincount(rows, weights=tab.weights, minlength=self.n)
        self.sf_ns[:] = np.where(hops_w > 0, tot - tot / np.maximum(hops_w, 1e-12), 0.0)
        self.solver = IncidenceSolver(csr_matrix(
            (tab.weights, tab.edges, tab.indptr), shape=(self.n, self.ix.n_edges)
        ))
        # Rows of the solver (global flow indices) and the inverse map; compacted as flows end.
        self.solver_rows = np.arange(self.n, dtype=np.int64)
        self.local = np.arange(self.n, dtype=np.int64)

    # .............................................................. rates
    def _solve(self, active: IntArray) -> None:
        self.solves += 1
        if active.shape[0] == 0:
            return
        if self.table is not None:
            if active.shape[0] * 2 < self.solver_rows.shape[0] > COMPACT_MIN_ROWS:
                # Most rows may be finished: solve on a compacted matrix from now on. Keep every
                # flow that can still need a rate: the active ones AND those still waiting on a
                # start time or a dependency (keeping only ``active`` gave later DAG steps the
                # wrong rows: the 128-rank random ring with ECMP came out 3x too fast).
                # (Counting first: a DAG has few active flows at every one of its many solves.)
                live = self.state[self.solver_rows] <= 1
                keep = None
                if np.count_nonzero(live) * 2 < self.solver_rows.shape[0]:
                    keep = np.union1d(self.solver_rows[live], active)
            else:
                keep = None
            if keep is not None:
                self.solver = self.solver.subset(self.local[keep])
                self.solver_rows = keep
                self.local = np.full(self.n, -1, dtype=np.int64)
                self.local[keep] = np.arange(keep.shape[0])
            mask = np.zeros(self.solver_rows.shape[0], dtype=bool)
            loc = self.local[active]
            mask[loc] = True
            self.rate[active] = self.solver.solve(mask, self.capacity)[loc]
            self._active_mask = mask
            return
        rows = [self.routes[int(j)] for j in active]
        lens = np.array([r[0].shape[0] for r in rows], dtype=np.int64)
        ptr = np.zeros(active.shape[0] + 1, np.int64)
        np.cumsum(lens, out=ptr[1:])
        a = csr_matrix(
            (np.concatenate([r[1] for r in rows]), np.concatenate([r[0] for r in rows]), ptr),
            shape=(active.shape[0], self.ix.n_edges),
        )
        self._a = a
        self.rate[active] = max_min_rates(a, self.capacity)

    def _loads(self, active: IntArray) -> FloatArray:
        """Load per directed link (bits/s) of the active flows at their current rates."""
        if self.table is not None:
            return self.solver.loads(np.where(self._active_mask, self.rate[self.solver_rows], 0.0))
        return np.asarray(self._a.T @ self.rate[active], dtype=np.float64)

    # .............................................................. run
    def run(self, *, record: bool, progress: Progress | None) -> tuple[Utilization | None, float]:
        n = self.n
        static = not self.dynamic
        if static:
            self._route_all_static()
        t = 0.0
        # Arrival queue: flows without deps sorted by start; dependents go to a heap.
        nodep = np.flatnonzero(self.ndeps == 0)
        order = nodep[np.argsort(self.start_at[nodep] + self.gap[nodep], kind="stable")]
        ready_t = self.start_at[order] + self.gap[order]
        ptr = 0
        heap: list[tuple[float, int]] = []
        active = np.zeros(0, np.int64)
        u_t0: list[float] = []
        u_t1: list[float] = []
        u_e: list[IntArray] = []
        u_l: list[npt.NDArray[np.float32]] = []
        epochs = list(self.epochs)
        finished = 0
        last_report = 0
        dirty = True
        t_end = 0.0

        def next_arrival() -> float:
            a = float(ready_t[ptr]) if ptr < order.shape[0] else np.inf
            b = heap[0][0] if heap else np.inf
            return min(a, b)

        eps = 1e-9
        while True:
            ta = next_arrival()
            te = epochs[0] if epochs else np.inf
            if active.shape[0] == 0:
                if ta == np.inf:
                    break
                t = max(t, min(ta, te))
            if te <= t:  # a link fault starts or ends: capacities and routes change
                epochs.pop(0)
                self._set_links(t)
                if static:
                    self._route_all_static()
                    lost = active[self._unroutable_static[active]]
                else:
                    lost = active[self._route(active)]
                if lost.shape[0]:
                    finished += self._fail(lost, heap)
                    active = active[self.state[active] == 1]
                dirty = True
                continue
            if ta <= t + eps:  # activate everything that is due
                new: list[int] = []
                while ptr < order.shape[0] and ready_t[ptr] <= t + eps:
                    new.append(int(order[ptr]))
                    ptr += 1
                while heap and heap[0][0] <= t + eps:
                    new.append(heapq.heappop(heap)[1])
                nidx = np.array(new, dtype=np.int64)
                local = self.src[nidx] == self.dst[nidx]
                if local.any():  # a NIC sending to itself: nothing crosses the fabric
                    loc = nidx[local]
                    self.state[loc] = 2
                    self.t_start[loc] = t
                    self.t_fluid_end[loc] = t
                    self.t_arrive[loc] = t
                    self.t_ack[loc] = t
                    self.lat_ns[loc] = 0.0
                    self.sf_ns[loc] = 0.0
                    finished += loc.shape[0]
                    self._release(loc, np.full(loc.shape[0], t), heap)
                    nidx = nidx[~local]
                if nidx.shape[0]:
                    bad = self._unroutable_static[nidx] if static else self._route(nidx)
                    if bad.any():
                        finished += self._fail(nidx[bad], heap)
                    good = nidx[~bad]
                    self.state[good] = 1
                    self.t_start[good] = t
                    self.flowlet[good] = 0
                    self.boundary[good] = np.maximum(self.remaining[good] - self.flowlet_bytes * 8, 0.0)
                    active = np.concatenate([active, good])
                    dirty = True
                continue
            if dirty:
                self._solve(active)
                dirty = False
                self.events += 1
            r = self.rate[active]
            target = self.boundary[active] if self.dynamic else np.zeros(active.shape[0])
            with np.errstate(divide="ignore"):
                dt = np.where(r > 0, (self.remaining[active] - target) / r * 1e9, np.inf)
            dmin = float(dt.min()) if dt.shape[0] else np.inf
            tn = min(t + dmin, ta, te)
            if not np.isfinite(tn):
                raise WorkloadError("simulation stalled: active flows have zero rate (no capacity)")
            step = tn - t
            if record and step > 0:
                load = self._loads(active)
                nz = np.flatnonzero(load)
                u_t0.append(t)
                u_t1.append(tn)
                u_e.append(nz.astype(np.int64))
                u_l.append(load[nz].astype(np.float32))
            self.remaining[active] -= r * step / 1e9
            t = tn
            # Flows reaching their target within the batching tolerance.
            if t - step + dmin <= min(ta, te):  # the step ended at a completion: batch
                hit = dt <= dmin + self.rtol * max(t, 1.0)
            else:
                hit = dt <= step + eps
            if self.dynamic:
                # A flowlet boundary is an idle gap in reality, not an exact byte count: flows
                # whose boundary falls within FLOWLET_SLACK of a flowlet's duration re-route
                # together (the exact remaining bytes are kept), which bounds the event count.
                slack = FLOWLET_SLACK * self.flowlet_bytes * 8 / np.maximum(r, 1e-300) * 1e9
                hit |= (target > 0) & (dt <= step + slack)
            if not hit.any():
                continue
            hidx = active[hit]
            hdt = dt[hit]
            if self.dynamic:
                more = (self.boundary[hidx] > 0) & (self.remaining[hidx] > self.rtol * self.size[hidx] * 8)
                nxt = hidx[more]
                fin = hidx[~more]
                fin_dt = hdt[~more]
                if nxt.shape[0]:
                    self.flowlet[nxt] += 1
                    self.boundary[nxt] = np.maximum(self.remaining[nxt] - self.flowlet_bytes * 8, 0.0)
                    bad = self._route(nxt)
                    if bad.any():
                        finished += self._fail(nxt[bad], heap)
            else:
                fin, fin_dt = hidx, hdt
            if fin.shape[0]:
                t_fin = t - step + fin_dt
                self.remaining[fin] = 0.0
                self.state[fin] = 2
                self.t_fluid_end[fin] = t_fin
                t_end = max(t_end, float(t_fin.max()))
                finished += fin.shape[0]
                arrive = t_fin + self.lat_ns[fin] + self.sf_ns[fin]
                self.t_arrive[fin] = arrive
                self.t_ack[fin] = arrive + self.lat_ns[fin]
                self._release(fin, arrive, heap)
                if self.dynamic:
                    cap_units = self.capacity / 1e11
                    for j in fin.tolist():
                        old = self.routes.pop(j, None)
                        if old is not None:
                            self.edge_load[old[0]] -= old[1] / cap_units[old[0]]
            active = active[self.state[active] == 1]
            dirty = True
            if progress is not None and finished - last_report >= max(1, n // 200):
                progress(finished, n)
                last_report = finished
        if progress is not None:
            progress(n, n)
        util = None
        if record:
            ptr_u = np.zeros(len(u_e) + 1, np.int64)
            np.cumsum([x.shape[0] for x in u_e], out=ptr_u[1:])
            util = Utilization(
                np.array(u_t0), np.array(u_t1), ptr_u,
                np.concatenate(u_e) if u_e else np.zeros(0, np.int64),
                np.concatenate(u_l) if u_l else np.zeros(0, np.float32),
                self.capacity.copy(),
            )
        return util, t_end

    def _release(self, fin: IntArray, arrive: FloatArray, heap: list[tuple[float, int]]) -> None:
        """Dependencies of finished flows: children whose last dep arrived become ready."""
        lens = self.kid_ptr[fin + 1] - self.kid_ptr[fin]
        if lens.sum() == 0:
            return
        starts = self.kid_ptr[fin]
        idx = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        kids = self.kid_idx[idx]
        when = np.repeat(arrive, lens)
        np.maximum.at(self.dep_ready, kids, when)
        np.subtract.at(self.ndeps, kids, 1)
        for c in np.unique(kids[self.ndeps[kids] == 0]).tolist():
            if self.state[c] == 0:
                heapq.heappush(heap, (float(self.dep_ready[c] + self.gap[c]), c))

    def _fail(self, idx: IntArray, heap: list[tuple[float, int]]) -> int:
        """Mark flows unroutable and every transitive dependent blocked; returns how many."""
        self.state[idx] = 3
        count = int(idx.shape[0])
        stack = idx.tolist()
        while stack:
            j = stack.pop()
            for c in self.kid_idx[self.kid_ptr[j]:self.kid_ptr[j + 1]].tolist():
                if self.state[c] in (0, 1):
                    self.state[c] = 4
                    count += 1
                    stack.append(c)
        return count


# ---------------------------------------------------------------------- public API
def _as_faults(faults: FaultSchedule | Iterable[Fault]) -> tuple[Fault, ...]:
    return faults.faults if isinstance(faults, FaultSchedule) else tuple(faults)


def _ideal_scheme(scheme: str) -> None:
    if is_transport_only(scheme):
        what = "splits by switch queues" if scheme == "ar" else "recycles entropies on ECN marks"
        raise ConfigError(f"lb {scheme}: {what}, which only the transport engine has "
                          "(give a --cc: nscc, eqds, dcqcn or hpcc)")


def simulate(
    fabric: Fabric,
    workload: Workload,
    *,
    lb: str = "ecmp",
    hash_config: HashConfig | None = None,
    faults: FaultSchedule | Iterable[Fault] = (),
    seed: int = 0,
    flowlet_bytes: float = 256 * 1024,
    mtu_bytes: int = 4096,
    batch_rtol: float = 1e-9,
    record_utilization: bool = True,
    progress: Progress | None = None,
) -> SimResult:
    """Run ``workload`` on ``fabric`` to completion and return per-flow times and link loads.

    Parameters
    ----------
    lb:
        Load-balancing scheme, one of :data:`fabricscope.sim.loadbalance.SCHEMES`.
    hash_config:
        ECMP hash (function, seed, per-switch seeds). Default: crc32 with per-switch seeds.
    faults:
        ``link-down`` and ``link-degraded`` (``params={"factor": 0.25}``) faults on cables
        ``a|b`` or directions ``a->b``, each active in its own ``[start_ns, end_ns)`` window;
        other fault kinds are ignored by the flow engine.
    seed:
        Randomness for ``lb="random"``.
    flowlet_bytes:
        Flowlet size for ``flowlet`` / ``dlb``.
    mtu_bytes:
        For the store-and-forward term of the latency model.
    batch_rtol:
        Completions within ``batch_rtol x now`` of the earliest one are processed together;
        raise it (1e-3) on million-flow runs to trade exactness for fewer re-solves.
    record_utilization:
        Keep the per-link load timeline (memory ~ events x busy links).
    progress:
        Called as ``progress(finished, total)``.
    """
    scheme = check_scheme(lb)
    _ideal_scheme(scheme)
    t0 = time.perf_counter()
    eng = _Engine(
        fabric, workload.flows, scheme=scheme, hash_config=hash_config,
        faults=_as_faults(faults), seed=seed, flowlet_bytes=flowlet_bytes,
        mtu_bytes=mtu_bytes, batch_rtol=batch_rtol,
    )
    util, _ = eng.run(record=record_utilization, progress=progress)
    st = eng.state
    fluid = eng.t_fluid_end - eng.t_start
    end = eng.t_arrive
    fct = eng.t_ack - eng.t_start
    done = st == 2
    end = np.where(done, end, np.nan)
    fct = np.where(done, fct, np.nan)
    ids = np.array([f.id for f in workload.flows], dtype=np.int64)
    return SimResult(
        scheme=scheme,
        fabric_name=fabric.name,
        workload_name=workload.name,
        flow_ids=ids,
        src=tuple(f.src for f in workload.flows),
        dst=tuple(f.dst for f in workload.flows),
        tags=tuple(f.tag for f in workload.flows),
        size_bytes=eng.size.copy(),
        start_ns=eng.t_start.copy(),
        fluid_ns=np.where(done, fluid, np.nan),
        end_ns=end,
        fct_ns=fct,
        unroutable=tuple(int(i) for i in ids[st == 3]),
        blocked=tuple(int(i) for i in ids[st == 4]),
        edge_ids=tuple(fabric.index.edge_id(e) for e in range(fabric.index.n_edges)),
        edge_tier=edge_tiers(fabric),
        utilization=util,
        collective=workload.collective,
        n_ranks=workload.n_ranks,
        collective_bytes=workload.size_bytes,
        events=eng.events,
        solves=eng.solves,
        wall_s=time.perf_counter() - t0,
        meta={"lb": scheme},
    )


def steady_state_rates(
    fabric: Fabric,
    flows: Workload | Sequence[FlowSpec],
    *,
    lb: str = "ecmp",
    hash_config: HashConfig | None = None,
    faults: FaultSchedule | Iterable[Fault] = (),
    seed: int = 0,
) -> SteadyState:
    """Max-min fair rates at t = 0 of the flows with no dependencies and ``start_ns == 0``.

    This is the "throughput / ideal at t = 0" quantity of SIMULATION.md §1 and the steady
    state of one step of a collective. Dynamic schemes (``flowlet``, ``dlb``) are evaluated
    on their first flowlet.
    """
    scheme = check_scheme(lb)
    _ideal_scheme(scheme)
    specs = flows.flows if isinstance(flows, Workload) else tuple(flows)
    specs = tuple(f for f in specs if not f.deps and f.start_ns == 0)
    if not specs:
        raise WorkloadError("steady_state_rates: no flow starts at t = 0 (empty workload)")
    eng = _Engine(
        fabric, specs, scheme=scheme, hash_config=hash_config, faults=_as_faults(faults),
        seed=seed, flowlet_bytes=float("inf"), mtu_bytes=4096, batch_rtol=1e-9,
    )
    idx = np.arange(eng.n)
    if eng.dynamic:
        bad = eng._route(idx)
        good = idx[~bad]
    else:
        eng._route_all_static()
        bad = eng._unroutable_static
        good = idx[~bad]
    eng._solve(good)
    rates = np.where(bad, 0.0, eng.rate)
    ix = fabric.index
    # Ideal per flow: the slower of the sender's total uplink and the receiver's total downlink.
    up = ~ix.is_switch[ix.src]
    down = ~ix.is_switch[ix.dst]
    nic_out = np.bincount(ix.src[up], weights=eng.capacity[up], minlength=ix.n_nodes)
    nic_in = np.bincount(ix.dst[down], weights=eng.capacity[down], minlength=ix.n_nodes)
    ideal = np.minimum(nic_out[eng.src], nic_in[eng.dst])
    load = eng._loads(good) if good.shape[0] else np.zeros(ix.n_edges)
    return SteadyState(
        flow_ids=np.array([f.id for f in specs], dtype=np.int64),
        rates_bps=rates,
        ideal_bps=ideal,
        link_load_bps=load,
        capacity_bps=eng.capacity.copy(),
        unroutable=tuple(specs[int(j)].id for j in np.flatnonzero(bad)),
    )
