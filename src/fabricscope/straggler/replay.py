"""What-if replay of a job's operator dependency graph (after Lin et al., OSDI'25).

Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis"
(OSDI'25) estimate a straggler's cost by replaying the job's dependency graph with some
operator durations replaced by idealized ones: slowdown = replayed actual / replayed ideal.
This module builds that graph from timestamps alone, for any trace the readers produce:

* per rank and iteration, the non-communication rows (compute, optimizer, bookkeeping) form
  one chain in start order;
* a communication instance (the rows of one collective / send-recv call matched across ranks,
  :mod:`fabricscope.straggler.instances`) is one node: it starts when its last member is ready
  and lasts its transfer time (first completion minus last arrival), so waiting is never part
  of a duration;
* a member row is ready after the last chain row of its rank that had ended when it started
  (its issuing point); a collective also waits for the rank's previous communication;
* a chain row waits for every blocking communication row of its rank that had ended when it
  started and after the previous chain row started (it consumed that data). A pure send does
  not block (its sender goes on; the OSDI'25 model makes the same choice).

Each iteration is replayed from its actual start (iterations are separated by the gradient
synchronisation); host-side gaps between operators are not replayed (the artifact's
"no launch delay" baseline). The graph is built once (three sorts, then numba-compiled
linear passes: edges by per-lane binary search, a counting-sort CSR, a topological order, the
CSR renumbered in that order) and each replay is one front-to-back pass over it. A cycle,
possible only when timestamps of a few operators coincide within the tolerance, leaves no
topological order: the replay then runs Kahn's algorithm, releasing the earliest stuck node,
and counts the releases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fabricscope.straggler._dense import dense_codes
from fabricscope.straggler.instances import Instances
from fabricscope.straggler.table import COLLECTIVE, P2P, OpTable

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

#: timestamps closer than this are "at the same time" when dependencies are read off them
EPS_NS = 2_000


@dataclass(frozen=True, slots=True)
class Graph:
    """Dependency graph of one table: nodes are chain rows, then communication instances.

    ``chain_rows``: table row of each chain node; ``n_inst``: instances (node ``n_chain + k``
    is instance k); ``src``/``dst``: edges; ``it_node``: iteration position of each node;
    ``it_start``: actual start of each iteration (ns); ``dur_chain``/``dur_inst``: actual
    durations (ns) the replay uses unless told otherwise.
    """

    chain_rows: I64
    n_inst: int
    src: I64
    dst: I64
    it_node: I64
    it_start: F64
    dur_chain: F64
    dur_inst: F64
    #: CSR of the out-edges (``dst_sorted[bounds[v]:bounds[v + 1]]``) and in-degrees
    bounds: I64 | None = None
    dst_sorted: I64 | None = None
    indeg: I64 | None = None
    #: a topological order of the nodes (None: the graph has a cycle, replay runs Kahn)
    order: I64 | None = None
    #: the out-edge CSR renumbered in that order (node i is ``order[i]``) and each
    #: position's iteration: the replay then walks its arrays front to back
    topo_bounds: I64 | None = None
    topo_dst: I64 | None = None
    topo_it: I64 | None = None

    @property
    def n_chain(self) -> int:
        return int(self.chain_rows.size)

    @property
    def n_nodes(self) -> int:
        return self.n_chain + self.n_inst


def _is_pure_send(names: list[str]) -> npt.NDArray[np.bool_]:
    low = [n.lower() for n in names]
    return np.array([("send" in n and "recv" not in n) for n in low] or [False], dtype=bool)


def _lane_time_order(lane: I64, t: I64) -> I64:
    """Order by (lane, time): one packed int64 argsort (several times faster than lexsort)."""
    if lane.size == 0:
        return np.zeros(0, dtype=np.int64)
    lo = int(t.min())
    span = int(t.max()) - lo + 1
    if (int(lane.max()) + 1) * span < (1 << 62):
        return np.argsort(lane.astype(np.int64) * span + (t - lo), kind="stable").astype(np.int64)
    return np.lexsort((t, lane)).astype(np.int64)


def _edges(c_lane: I64, cb: I64, c_start: I64, oe_c: I64, c_end_sorted: I64, q_lane: I64,
           q_start: I64, q_end: I64, node_of_row: I64, is_coll: npt.NDArray[np.bool_],
           is_blk: npt.NDArray[np.bool_], oe_m: I64, m_end_sorted: I64, mb: I64, eps: int,
           src: I64, dst: I64) -> int:
    """Write the edges of the four rules (module docstring) into ``src``/``dst``; their count.

    Chain rows are sorted by (lane, start), ``oe_c`` orders them by (lane, end) and ``oe_m``
    the communication rows by (lane, end); ``cb``/``mb`` are the lane bounds of those sorted
    arrays. Each query is a binary search inside its own lane (tens of rows), so the pass is
    linear in rows. Edges come out rule by rule, each in query order (the order the numpy
    version concatenated them in). Numba-compatible subset, like :func:`_kahn`.
    """
    k = 0
    n_c = c_lane.shape[0]
    nq = q_lane.shape[0]
    # 1. the chain
    for i in range(n_c - 1):
        if c_lane[i + 1] == c_lane[i]:
            src[k] = i
            dst[k] = i + 1
            k += 1
    if n_c:
        # 2. issuing point: the last chain row (by end) ended by the row's start
        for j in range(nq):
            lane = q_lane[j]
            lo = cb[lane]
            a = lo
            b = cb[lane + 1]
            t = q_start[j] + eps
            while a < b:
                mid = (a + b) >> 1
                if c_end_sorted[mid] <= t:
                    a = mid + 1
                else:
                    b = mid
            if a > lo:
                src[k] = oe_c[a - 1]
                dst[k] = node_of_row[j]
                k += 1
    # 3. a collective waits for the rank's previous communication (by end)
    for j in range(nq):
        if not is_coll[j]:
            continue
        lane = q_lane[j]
        lo = mb[lane]
        a = lo
        b = mb[lane + 1]
        t = q_start[j] + eps
        while a < b:
            mid = (a + b) >> 1
            if m_end_sorted[mid] <= t:
                a = mid + 1
            else:
                b = mid
        if a > lo:
            prev = node_of_row[oe_m[a - 1]]
            me = node_of_row[j]
            if prev != me:
                src[k] = prev
                dst[k] = me
                k += 1
    if n_c:
        # 4. the first chain row (by start) that started after a blocking row ended
        for j in range(nq):
            if not is_blk[j]:
                continue
            lane = q_lane[j]
            a = cb[lane]
            hi = cb[lane + 1]
            b = hi
            t = q_end[j] - eps
            while a < b:
                mid = (a + b) >> 1
                if c_start[mid] < t:
                    a = mid + 1
                else:
                    b = mid
            if a < hi:
                src[k] = node_of_row[j]
                dst[k] = a
                k += 1
    return k


def _csr(src: I64, dst: I64, bounds: I64, dst_sorted: I64, indeg: I64) -> None:
    """Out-edge CSR by a stable counting sort on ``src`` (``bounds``/``indeg`` start zeroed)."""
    m = src.shape[0]
    for e in range(m):
        bounds[src[e] + 1] += 1
        indeg[dst[e]] += 1
    for v in range(bounds.shape[0] - 1):
        bounds[v + 1] += bounds[v]
    fill = bounds[:-1].copy()
    for e in range(m):
        v = src[e]
        dst_sorted[fill[v]] = dst[e]
        fill[v] += 1


def _topo_order(bounds: I64, dst_sorted: I64, indeg: I64, order: I64) -> int:
    """Kahn's order of the graph into ``order`` (``indeg`` is consumed); how many nodes it
    placed: fewer than all when the graph has a cycle."""
    n = indeg.shape[0]
    tail = 0
    for v in range(n):
        if indeg[v] == 0:
            order[tail] = v
            tail += 1
    head = 0
    while head < tail:
        v = order[head]
        head += 1
        for k in range(bounds[v], bounds[v + 1]):
            w = dst_sorted[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                order[tail] = w
                tail += 1
    return tail


def _permute_csr(order: I64, bounds: I64, dst_sorted: I64, tb: I64, td: I64) -> None:
    """The CSR renumbered so that node ``i`` is ``order[i]`` (into ``tb``/``td``)."""
    n = order.shape[0]
    pos = np.empty(n, dtype=np.int64)
    for i in range(n):
        pos[order[i]] = i
    tb[0] = 0
    for i in range(n):
        v = order[i]
        k0 = tb[i]
        for k in range(bounds[v], bounds[v + 1]):
            td[k0] = pos[dst_sorted[k]]
            k0 += 1
        tb[i + 1] = k0


def _group_min(code: I64, values: I64, n: int) -> I64:
    """Per code ``0 .. n - 1``: the minimum of ``values`` (int64 max where none)."""
    out = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    for i in range(code.shape[0]):
        c = code[i]
        if values[i] < out[c]:
            out[c] = values[i]
    return out


def build_graph(table: OpTable, inst: Instances, *, eps_ns: int = EPS_NS) -> Graph:
    """The dependency graph of ``table`` (rows of kind compute/other chain, instances join).

    O(rows log rows): three packed-key sorts, then compiled linear passes (the edges,
    :func:`_edges`; a counting-sort CSR; the topological order), built once and shared by
    every :func:`replay` of the graph.
    """
    _, r_idx = dense_codes(table.rank)
    its, i_idx = dense_codes(table.iteration)
    n_i = its.size
    n_lanes = (int(r_idx.max()) + 1 if r_idx.size else 0) * max(n_i, 1)
    lane = r_idx * max(n_i, 1) + i_idx
    if n_lanes > 4 * lane.size + 1024:
        # few of the (rank, iteration) pairs occur: renumber them (order-preserving) so the
        # lane bounds stay as long as the table
        uniq, lane = dense_codes(lane)
        n_lanes = int(uniq.size)
    start = table.start.astype(np.int64, copy=False)
    end = table.end.astype(np.int64, copy=False)
    it_start = _jit(_group_min)(i_idx, start, n_i)
    is_comm = (table.kind == COLLECTIVE) | (table.kind == P2P)
    chain = np.flatnonzero(~is_comm)
    chain = chain[_lane_time_order(lane[chain], start[chain])]
    n_c = chain.size
    c_lane = lane[chain]
    c_start = start[chain]
    c_end = end[chain]
    cb = np.zeros(n_lanes + 1, dtype=np.int64)
    np.cumsum(np.bincount(c_lane, minlength=n_lanes), out=cb[1:])
    oe_c = _lane_time_order(c_lane, c_end)
    rows = inst.rows.astype(np.int64, copy=False)
    node_of_row = (n_c + inst.inst).astype(np.int64, copy=False)
    m_lane = lane[rows]
    m_end = end[rows]
    m_kind = table.kind[rows]
    mb = np.zeros(n_lanes + 1, dtype=np.int64)
    np.cumsum(np.bincount(m_lane, minlength=n_lanes), out=mb[1:])
    oe_m = _lane_time_order(m_lane, m_end)
    is_coll = m_kind == COLLECTIVE
    # a pure send does not block its sender
    is_blk = ~(_is_pure_send(table.op_names)[table.op[rows]] & (m_kind == P2P))
    cap = max(n_c - 1, 0) + rows.size + int(is_coll.sum()) + int(is_blk.sum())
    s = np.empty(cap, dtype=np.int64)
    d = np.empty(cap, dtype=np.int64)
    # Duplicate edges are harmless (in-degree counts them and each release removes one).
    m = int(_jit(_edges)(c_lane, cb, c_start, oe_c, c_end[oe_c], m_lane, start[rows], m_end,
                         node_of_row, is_coll, is_blk, oe_m, m_end[oe_m], mb, int(eps_ns), s, d))
    s, d = s[:m], d[:m]
    n_nodes = n_c + inst.n
    it_node = np.empty(n_nodes, dtype=np.int64)
    it_node[:n_c] = i_idx[chain]
    it_node[n_c:] = np.searchsorted(its, inst.iteration)
    bounds = np.zeros(n_nodes + 1, dtype=np.int64)
    dst_sorted = np.empty(m, dtype=np.int64)
    indeg = np.zeros(n_nodes, dtype=np.int64)
    _jit(_csr)(s, d, bounds, dst_sorted, indeg)
    order = np.empty(n_nodes, dtype=np.int64)
    placed = int(_jit(_topo_order)(bounds, dst_sorted, indeg.copy(), order))
    topo: tuple[I64 | None, I64 | None, I64 | None, I64 | None] = (None, None, None, None)
    if placed == n_nodes:
        tb = np.empty(n_nodes + 1, dtype=np.int64)
        td = np.empty(m, dtype=np.int64)
        _jit(_permute_csr)(order, bounds, dst_sorted, tb, td)
        topo = (order, tb, td, it_node[order])
    return Graph(chain.astype(np.int64, copy=False), inst.n, s, d, it_node,
                 it_start.astype(np.float64), (c_end - c_start).astype(np.float64),
                 inst.transfer.astype(np.float64), bounds, dst_sorted, indeg, *topo)


def _kahn(bounds: I64, dst_sorted: I64, indeg: I64, ready: F64, dur: F64, end: F64) -> int:
    """Longest-path replay in topological order (Kahn); returns the cycle releases.

    Written in the numba-compatible subset: compiled when numba is installed (as
    :mod:`fabricscope.sim.maxmin` does), plain Python otherwise.
    """
    n = indeg.shape[0]
    queue = np.empty(n, dtype=np.int64)
    done = np.zeros(n, dtype=np.bool_)
    head = 0
    tail = 0
    for v in range(n):
        if indeg[v] == 0:
            queue[tail] = v
            tail += 1
    processed = 0
    broken = 0
    while processed < n:
        if head == tail:
            # A cycle from coinciding timestamps: release the earliest stuck node.
            best = -1
            for v in range(n):
                if not done[v] and (best < 0 or ready[v] < ready[best]):
                    best = v
            queue[tail] = best
            tail += 1
            indeg[best] = 0
            broken += 1
        v = queue[head]
        head += 1
        if done[v]:
            continue
        done[v] = True
        processed += 1
        e = ready[v] + dur[v]
        end[v] = e
        for k in range(bounds[v], bounds[v + 1]):
            w = dst_sorted[k]
            if e > ready[w]:
                ready[w] = e
            indeg[w] -= 1
            if indeg[w] == 0 and not done[w]:
                queue[tail] = w
                tail += 1
    return broken


def _sweep(bounds: I64, dst: I64, ready: F64, dur: F64, it_node: I64, it_end: F64) -> None:
    """Longest-path replay of a graph numbered in topological order; ``it_end`` gets each
    iteration's last end (NaN-propagating, as ``np.maximum`` is).

    In an acyclic graph a node's end is ``max(its start, predecessors' ends) + dur`` in any
    topological order (max is exact), so this equals :func:`_kahn` bit for bit.
    """
    for v in range(ready.shape[0]):
        e = ready[v] + dur[v]
        it = it_node[v]
        cur = it_end[it]
        if cur == cur and not (e <= cur):
            it_end[it] = e
        for k in range(bounds[v], bounds[v + 1]):
            w = dst[k]
            if e > ready[w]:
                ready[w] = e


_KERNELS: dict[str, Callable[..., Any]] = {}


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba (cached on disk), or ``fn`` itself without numba."""
    k = _KERNELS.get(fn.__name__)
    if k is None:
        try:
            import numba

            k = numba.njit(cache=True, nogil=True)(fn)
        except ImportError:  # pragma: no cover - numba is a declared dependency
            k = fn
        _KERNELS[fn.__name__] = k
    return k


@dataclass(frozen=True, slots=True)
class Replay:
    """Replayed per-iteration durations (ns) and how many cycles had to be broken."""

    iteration_ns: F64
    cycles_broken: int


def replay(graph: Graph, dur_chain: F64 | None = None, dur_inst: F64 | None = None) -> Replay:
    """Replay ``graph`` with the given durations (default: the actual ones).

    Linear in nodes + edges: one pass along the graph's topological order (or one Kahn pass
    when the graph has a cycle); each iteration starts at its actual start.
    """
    n = graph.n_nodes
    dur = np.concatenate([graph.dur_chain if dur_chain is None else dur_chain,
                          graph.dur_inst if dur_inst is None else dur_inst]).astype(np.float64)
    n_i = graph.it_start.size
    it_end = np.full(n_i, -np.inf)
    broken = 0
    if (graph.order is not None and graph.topo_bounds is not None
            and graph.topo_dst is not None and graph.topo_it is not None):
        _jit(_sweep)(graph.topo_bounds, graph.topo_dst, graph.it_start[graph.topo_it],
                     dur[graph.order], graph.topo_it, it_end)
    else:
        ready = graph.it_start[graph.it_node].astype(np.float64) if n else np.zeros(0)
        if graph.bounds is None or graph.dst_sorted is None or graph.indeg is None:
            o = np.argsort(graph.src, kind="stable")
            bounds = np.searchsorted(graph.src[o], np.arange(n + 1)).astype(np.int64)
            dst_sorted = graph.dst[o].astype(np.int64)
            indeg = np.bincount(graph.dst, minlength=n).astype(np.int64)
        else:
            bounds, dst_sorted, indeg = graph.bounds, graph.dst_sorted, graph.indeg.copy()
        end = np.zeros(n)
        broken = int(_jit(_kahn)(bounds, dst_sorted, indeg, ready, dur, end))
        if n:
            np.maximum.at(it_end, graph.it_node, end)
    out = np.where(np.isfinite(it_end), it_end - graph.it_start, 0.0)
    return Replay(np.maximum(out, 0.0), broken)


def group_median(key: I64, values: F64) -> F64:
    """Each element's group median (lower median) of ``values`` grouped by ``key``."""
    if key.size == 0:
        return np.zeros(0)
    _, code = dense_codes(key)
    o = np.lexsort((values, code))
    cs = code[o]
    starts = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
    counts = np.diff(np.r_[starts, cs.size])
    med = values[o][starts + (counts - 1) // 2]
    return np.asarray(med[code], dtype=np.float64)


def ideal_durations(table: OpTable, graph: Graph, inst: Instances) -> tuple[F64, F64]:
    """Durations with every straggler removed: each operator at its type's typical duration.

    The OSDI'25 artifact's "no variation" ideal: a compute row takes the mean duration of its
    op name over all ranks, stages and iterations; a communication instance the median
    transfer of its class (op, group size, bytes, stage pair).
    """
    key = table.op[graph.chain_rows].astype(np.int64)
    if key.size:
        tot = np.bincount(key, weights=graph.dur_chain)
        cnt = np.bincount(key)
        dc = (tot / np.maximum(cnt, 1))[key]
    else:
        dc = np.zeros(0)
    di = group_median(inst.cls.astype(np.int64), graph.dur_inst)
    return np.asarray(dc, dtype=np.float64), di
