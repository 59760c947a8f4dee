"""The compiled dependency-graph build and replay equal the numpy version they replaced.

``_reference_graph`` / ``_reference_replay`` are the implementation of commit 0479e7e
(packed-key searchsorted per rule, stable argsort of the edges, Kahn per replay), kept here
only as the oracle: the graph must come out array for array and the replays bit for bit.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.sim.faults import Fault
from fabricscope.straggler._dense import dense_codes
from fabricscope.straggler.instances import Instances, match_instances
from fabricscope.straggler.readers.bytedance import parse_bytedance
from fabricscope.straggler.replay import (
    Graph,
    _is_pure_send,
    _kahn,
    _lane_time_order,
    build_graph,
    ideal_durations,
    replay,
)
from fabricscope.straggler.table import COLLECTIVE, P2P, OpTable, TableBuilder
from fabricscope.twin.tracegen import TwinJob, bytedance_parquet, generate_trace
from twin_tables import to_table

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
FIELDS = ("chain_rows", "src", "dst", "it_node", "it_start", "dur_chain", "dur_inst",
          "bounds", "dst_sorted", "indeg")


def _last_before(lane_a: I64, t_a: I64, lane_b: I64, t_b: I64) -> I64:
    if lane_a.size == 0 or lane_b.size == 0:
        return np.full(lane_b.size, -1, dtype=np.int64)
    lo = min(int(t_a.min()), int(t_b.min()))
    span = max(int(t_a.max()), int(t_b.max())) - lo + 1
    pos = np.searchsorted(lane_a * span + (t_a - lo), lane_b * span + (t_b - lo), side="right") - 1
    ok = pos >= 0
    ok[ok] = lane_a[pos[ok]] == lane_b[ok]
    return np.where(ok, pos, -1).astype(np.int64)


def _first_after(lane_a: I64, t_a: I64, lane_b: I64, t_b: I64) -> I64:
    if lane_a.size == 0 or lane_b.size == 0:
        return np.full(lane_b.size, -1, dtype=np.int64)
    lo = min(int(t_a.min()), int(t_b.min()))
    span = max(int(t_a.max()), int(t_b.max())) - lo + 1
    ka = lane_a * span + (t_a - lo)
    pos = np.searchsorted(ka, lane_b * span + (t_b - lo), side="left")
    ok = pos < ka.size
    ok[ok] = lane_a[pos[ok]] == lane_b[ok]
    return np.where(ok, pos, -1).astype(np.int64)


def _reference_graph(table: OpTable, inst: Instances, eps_ns: int) -> Graph:
    _, r_idx = dense_codes(table.rank)
    its, i_idx = dense_codes(table.iteration)
    lane = r_idx * max(its.size, 1) + i_idx
    it_start = np.full(its.size, np.iinfo(np.int64).max)
    np.minimum.at(it_start, i_idx, table.start)
    chain = np.flatnonzero((table.kind != COLLECTIVE) & (table.kind != P2P))
    chain = chain[_lane_time_order(lane[chain], table.start[chain])]
    n_c = chain.size
    c_lane = lane[chain]
    k = np.flatnonzero(c_lane[1:] == c_lane[:-1])
    src, dst = [k], [k + 1]
    rows = inst.rows
    node_of_row = n_c + inst.inst
    if rows.size and n_c:
        c_end = table.end[chain]
        oe = _lane_time_order(c_lane, c_end)
        pos = _last_before(c_lane[oe], c_end[oe], lane[rows], table.start[rows] + eps_ns)
        ok = pos >= 0
        src.append(oe[pos[ok]])
        dst.append(node_of_row[ok])
    if rows.size:
        m_lane, m_end = lane[rows], table.end[rows]
        oe = _lane_time_order(m_lane, m_end)
        coll = np.flatnonzero(table.kind[rows] == COLLECTIVE)
        pos = _last_before(m_lane[oe], m_end[oe], m_lane[coll], table.start[rows[coll]] + eps_ns)
        ok = pos >= 0
        prev, me = node_of_row[oe[pos[ok]]], node_of_row[coll[ok]]
        src.append(prev[prev != me])
        dst.append(me[prev != me])
    if rows.size and n_c:
        send = _is_pure_send(table.op_names)[table.op[rows]] & (table.kind[rows] == P2P)
        blk = np.flatnonzero(~send)
        pos = _first_after(c_lane, table.start[chain], lane[rows[blk]], table.end[rows[blk]] - eps_ns)
        ok = pos >= 0
        src.append(node_of_row[blk[ok]])
        dst.append(pos[ok])
    s, d = np.concatenate(src), np.concatenate(dst)
    n_nodes = n_c + inst.n
    o = np.argsort(s, kind="stable")
    return Graph(chain, inst.n, s, d,
                 np.concatenate([i_idx[chain], np.searchsorted(its, inst.iteration)]),
                 it_start.astype(np.float64), (table.end[chain] - table.start[chain]).astype(np.float64),
                 inst.transfer.astype(np.float64), np.searchsorted(s[o], np.arange(n_nodes + 1)),
                 d[o], np.bincount(d, minlength=n_nodes))


def _reference_replay(g: Graph, dc: F64 | None, di: F64 | None) -> tuple[F64, int]:
    assert g.bounds is not None and g.dst_sorted is not None and g.indeg is not None
    dur = np.concatenate([g.dur_chain if dc is None else dc, g.dur_inst if di is None else di])
    ready = g.it_start[g.it_node].astype(np.float64)
    end = np.zeros(g.n_nodes)
    broken = _kahn(g.bounds, g.dst_sorted, g.indeg.copy(), ready, dur, end)  # plain Python
    it_end = np.full(g.it_start.size, -np.inf)
    np.maximum.at(it_end, g.it_node, end)
    out = np.where(np.isfinite(it_end), it_end - g.it_start, 0.0)
    return np.maximum(out, 0.0), broken


_to_table = to_table


def _assert_same(table: OpTable, eps_ns: int = 2_000, *, acyclic: bool = True) -> None:
    inst = match_instances(table)
    new = build_graph(table, inst, eps_ns=eps_ns)
    ref = _reference_graph(table, inst, eps_ns)
    for f in FIELDS:
        assert np.array_equal(getattr(new, f), getattr(ref, f)), f
    assert (new.order is not None) == acyclic
    dc, di = ideal_durations(table, new, inst)
    rng = np.random.default_rng(7)
    noisy = new.dur_chain * rng.uniform(0.5, 1.5, new.dur_chain.size)
    for args in ((None, None), (dc, di), (dc, None), (None, di), (noisy, None)):
        got = replay(new, *args)
        want, broken = _reference_replay(ref, *args)
        assert got.cycles_broken == broken
        assert np.array_equal(got.iteration_ns, want)


@pytest.mark.parametrize(("dp", "tp", "pp", "schedule", "seed"),
                         [(4, 2, 2, "gpipe", 3), (2, 1, 4, "1f1b", 5)])
def test_graph_and_replay_equal_the_numpy_version_on_twin_jobs(
        dp: int, tp: int, pp: int, schedule: str, seed: int) -> None:
    fab = rail_optimized_fabric(8, gpus_per_server=4, radix=16)
    job = TwinJob(dp=dp, tp=tp, pp=pp, microbatches=4, iterations=4, schedule=schedule)
    tr = generate_trace(fab, job, faults=[Fault("slow-gpu", "host0001/gpu1", params={"factor": 1.6})],
                        comm="alpha-beta", seed=seed)
    _assert_same(_to_table(tr))
    # the ByteDance schema (fused send/recv calls, wait-inclusive recv), no inventory
    _assert_same(parse_bytedance(bytedance_parquet(tr, tp), source="twin.parquet").table)


def test_a_cycle_from_coinciding_timestamps_is_replayed_by_kahn_as_before() -> None:
    # With a 10 ns tolerance the all-reduce both follows and precedes the compute rows.
    b = TableBuilder("cycle")
    for r in (0, 1):
        b.add(rank=r, iteration=0, op="forward-compute", group=(), seq=0, start=0, end=10)
        b.add(rank=r, iteration=0, op="allreduce", group=(0, 1), seq=0, start=5, end=8)
        b.add(rank=r, iteration=0, op="optimizer", group=(), seq=0, start=12, end=20)
    t = b.build()
    _assert_same(t, eps_ns=10, acyclic=False)
    assert replay(build_graph(t, match_instances(t), eps_ns=10)).cycles_broken > 0


def test_sparse_rank_iteration_pairs_are_renumbered_lanes() -> None:
    # 80 ranks in pairs, each pair alone in its step: 3,200 (rank, step) lanes for 400 rows.
    b = TableBuilder("sparse")
    for p in range(40):
        t0 = 10_000_000 * p
        for r in (2 * p, 2 * p + 1):
            b.add(rank=r, iteration=p, op="forward-compute", group=(), seq=0, start=t0,
                  end=t0 + 500_000 + 100_000 * (r % 2))
            b.add(rank=r, iteration=p, op="backward-compute", group=(), seq=0,
                  start=t0 + 700_000 + 100_000 * (r % 2), end=t0 + 900_000)
        b.add(rank=2 * p, iteration=p, op="forward-send", group=(2 * p, 2 * p + 1), seq=0,
              start=t0 + 500_000, end=t0 + 680_000)
        b.add(rank=2 * p + 1, iteration=p, op="forward-recv", group=(2 * p, 2 * p + 1), seq=0,
              start=t0 + 450_000, end=t0 + 680_000)
        for r in (2 * p, 2 * p + 1):
            b.add(rank=r, iteration=p, op="allreduce", group=(2 * p, 2 * p + 1), seq=0,
                  start=t0 + 900_000, end=t0 + 990_000)
    t = b.build()
    inst = match_instances(t)
    assert inst.n == 80 and int(t.ranks.size) * 40 > 4 * len(t) + 1024
    _assert_same(t)
