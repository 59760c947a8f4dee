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
"no launch delay" baseline). The graph is evaluated in one topological pass (Kahn's algorithm,
numba-compiled); a cycle, possible only when timestamps of a few operators coincide within
the tolerance, is broken by releasing the earliest stuck node, and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _last_before(lane_a: I64, t_a: I64, lane_b: I64, t_b: I64) -> I64:
    """For each query (lane_b, t_b): index into a of the last row of the same lane with
    ``t_a <= t_b`` (-1 if none). ``a`` must be sorted by (lane, t)."""
    if lane_a.size == 0 or lane_b.size == 0:
        return np.full(lane_b.size, -1, dtype=np.int64)
    lo = min(int(t_a.min()), int(t_b.min()))
    span = max(int(t_a.max()), int(t_b.max())) - lo + 1
    ka = lane_a.astype(np.int64) * span + (t_a - lo)
    kb = lane_b.astype(np.int64) * span + (t_b - lo)
    pos = np.searchsorted(ka, kb, side="right") - 1
    ok = pos >= 0
    ok[ok] = lane_a[pos[ok]] == lane_b[ok]
    return np.where(ok, pos, -1).astype(np.int64)


def _first_after(lane_a: I64, t_a: I64, lane_b: I64, t_b: I64) -> I64:
    """For each query: index into a of the first row of the same lane with ``t_a >= t_b``."""
    if lane_a.size == 0 or lane_b.size == 0:
        return np.full(lane_b.size, -1, dtype=np.int64)
    lo = min(int(t_a.min()), int(t_b.min()))
    span = max(int(t_a.max()), int(t_b.max())) - lo + 1
    ka = lane_a.astype(np.int64) * span + (t_a - lo)
    kb = lane_b.astype(np.int64) * span + (t_b - lo)
    pos = np.searchsorted(ka, kb, side="left")
    ok = pos < ka.size
    ok[ok] = lane_a[pos[ok]] == lane_b[ok]
    return np.where(ok, pos, -1).astype(np.int64)


def build_graph(table: OpTable, inst: Instances, *, eps_ns: int = EPS_NS) -> Graph:
    """The dependency graph of ``table`` (rows of kind compute/other chain, instances join)."""
    _, r_idx = dense_codes(table.rank)
    its, i_idx = dense_codes(table.iteration)
    n_i = its.size
    lane = r_idx * max(n_i, 1) + i_idx
    it_start = np.full(n_i, np.iinfo(np.int64).max)
    np.minimum.at(it_start, i_idx, table.start)
    is_comm = (table.kind == COLLECTIVE) | (table.kind == P2P)
    chain = np.flatnonzero(~is_comm)
    chain = chain[_lane_time_order(lane[chain], table.start[chain])]
    n_c = chain.size
    c_lane = lane[chain]
    src: list[I64] = []
    dst: list[I64] = []
    # 1. the chain
    if n_c > 1:
        same = c_lane[1:] == c_lane[:-1]
        k = np.flatnonzero(same)
        src.append(k)
        dst.append(k + 1)
    # 2. issuing point of each communication row: last chain row ended by its start
    rows = inst.rows
    node_of_row = n_c + inst.inst
    if rows.size and n_c:
        c_end = table.end[chain]
        oe = _lane_time_order(c_lane, c_end)
        pos = _last_before(c_lane[oe], c_end[oe], lane[rows], table.start[rows] + eps_ns)
        ok = pos >= 0
        src.append(oe[pos[ok]])
        dst.append(node_of_row[ok])
    # 3. a collective waits for the rank's previous communication
    if rows.size:
        m_lane = lane[rows]
        m_end = table.end[rows]
        oe = _lane_time_order(m_lane, m_end)
        coll = np.flatnonzero(table.kind[rows] == COLLECTIVE)
        pos = _last_before(m_lane[oe], m_end[oe], m_lane[coll], table.start[rows[coll]] + eps_ns)
        ok = pos >= 0
        prev = node_of_row[oe[pos[ok]]]
        me = node_of_row[coll[ok]]
        keep = prev != me
        src.append(prev[keep])
        dst.append(me[keep])
    # 4. the chain row that consumed a blocking communication row
    if rows.size and n_c:
        send = _is_pure_send(table.op_names)[table.op[rows]] & (table.kind[rows] == P2P)
        blk = np.flatnonzero(~send)
        c_start = table.start[chain]
        pos = _first_after(c_lane, c_start, lane[rows[blk]], table.end[rows[blk]] - eps_ns)
        ok = pos >= 0
        src.append(node_of_row[blk[ok]])
        dst.append(pos[ok])
    # Duplicate edges are harmless (in-degree counts them and each release removes one).
    s = np.concatenate(src) if src else np.zeros(0, dtype=np.int64)
    d = np.concatenate(dst) if dst else np.zeros(0, dtype=np.int64)
    it_node = np.concatenate([i_idx[chain], np.searchsorted(its, inst.iteration)]).astype(np.int64)
    n_nodes = n_c + inst.n
    o = np.argsort(s, kind="stable")
    bounds = np.searchsorted(s[o], np.arange(n_nodes + 1)).astype(np.int64)
    indeg = np.bincount(d, minlength=n_nodes).astype(np.int64)
    return Graph(chain.astype(np.int64), inst.n, s.astype(np.int64), d.astype(np.int64), it_node,
                 it_start.astype(np.float64),
                 (table.end[chain] - table.start[chain]).astype(np.float64),
                 inst.transfer.astype(np.float64), bounds, d[o].astype(np.int64), indeg)


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


_KERNEL: list[object] = []


def _kernel() -> object:
    """The compiled :func:`_kahn` (numba, cached on disk), or the Python one."""
    if not _KERNEL:
        try:
            import numba

            _KERNEL.append(numba.njit(cache=True, nogil=True)(_kahn))
        except ImportError:  # pragma: no cover - numba is a declared dependency
            _KERNEL.append(_kahn)
    return _KERNEL[0]


@dataclass(frozen=True, slots=True)
class Replay:
    """Replayed per-iteration durations (ns) and how many cycles had to be broken."""

    iteration_ns: F64
    cycles_broken: int


def replay(graph: Graph, dur_chain: F64 | None = None, dur_inst: F64 | None = None) -> Replay:
    """Replay ``graph`` with the given durations (default: the actual ones).

    Linear in nodes + edges (one topological pass); each iteration starts at its actual start.
    """
    n = graph.n_nodes
    dur = np.concatenate([graph.dur_chain if dur_chain is None else dur_chain,
                          graph.dur_inst if dur_inst is None else dur_inst]).astype(np.float64)
    ready = graph.it_start[graph.it_node].astype(np.float64) if n else np.zeros(0)
    end = np.zeros(n)
    if graph.bounds is None or graph.dst_sorted is None or graph.indeg is None:
        o = np.argsort(graph.src, kind="stable")
        bounds = np.searchsorted(graph.src[o], np.arange(n + 1)).astype(np.int64)
        dst_sorted = graph.dst[o].astype(np.int64)
        indeg = np.bincount(graph.dst, minlength=n).astype(np.int64)
    else:
        bounds, dst_sorted, indeg = graph.bounds, graph.dst_sorted, graph.indeg.copy()
    kernel = _kernel()
    broken = int(kernel(bounds, dst_sorted, indeg, ready, dur, end))  # type: ignore[operator]
    n_i = graph.it_start.size
    it_end = np.full(n_i, -np.inf)
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
