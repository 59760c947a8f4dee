"""Probe samples in a real DuckDB file and in JSON lines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pytest

from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.probe.analysis import (
    ANSWERED,
    REPLY_LOST,
    REQUEST_LOST,
    Observations,
    flow_stats,
)
from fabricscope.store.probes import ProbeStore, read_jsonl, write_jsonl

if TYPE_CHECKING:
    from fabricscope.service.probe_twin import TwinRun

FT = FiveTuple("198.18.0.1", "198.18.0.2", 40000, 47910)


def _samples() -> list[ProbeSample]:
    return [
        ProbeSample("a/nic0", "b/nic0", FT, 1, 100, 5000, 5100, 400),
        ProbeSample("a/nic0", "b/nic0", FT, 2, 200, None, None, None),
        ProbeSample("a/nic0", "b/nic0", FT._replace(src_port=40001), 3, 300, 7000, 7300, 800),
    ]


def test_duckdb_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    st = ProbeStore(db)
    assert st.insert(_samples(), [ANSWERED, REQUEST_LOST, ANSWERED]) == 3
    st.close()
    st = ProbeStore(db)
    assert st.count() == 3
    assert st.samples() == _samples()
    obs = st.observations()
    assert len(obs.flows) == 2 and len(obs) == 3
    s = flow_stats(obs)
    j = obs.flows.index(("a/nic0", "b/nic0", FT))
    assert (s.sent[j], s.lost[j], s.lost_req[j]) == (2, 1, 1)
    assert s.rtt_ns[j] == (400 - 100) - (5100 - 5000)
    assert len(st.observations(t0_ns=150, t1_ns=250)) == 1
    st.close()


def test_jsonl_skips_malformed_lines(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    with open(p, "w") as fh:
        write_jsonl([(s, ANSWERED) for s in _samples()], fh)
        fh.write("{not json\n")
        fh.write('{"src": "x"}\n')
    errors: list[str] = []
    rows = list(read_jsonl(p, errors=errors))
    assert [s for s, _ in rows] == _samples()
    assert len(errors) == 2 and ":4:" in errors[0] and ":5:" in errors[1]


def test_merged_reads_one_file_per_agent_read_only(tmp_path: Path) -> None:
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    s = _samples()
    for path, part in ((a, s[:2]), (b, s[2:])):
        st = ProbeStore(path)
        st.insert(part)
        st.close()
    before = (a.stat().st_mtime_ns, b.stat().st_mtime_ns)
    merged = ProbeStore.merged([a, b])
    assert merged.count() == 3 and merged.samples() == s  # ordered by send time
    merged.close()
    assert (a.stat().st_mtime_ns, b.stat().st_mtime_ns) == before  # inputs untouched


def test_unreadable_inputs_are_one_line_errors(tmp_path: Path) -> None:
    from fabricscope.model.errors import TraceFormatError, TransportError

    with pytest.raises(TraceFormatError, match=r"missing\.jsonl"):
        list(read_jsonl(tmp_path / "missing.jsonl", errors=[]))
    junk = tmp_path / "junk.duckdb"
    junk.write_text("not a database")
    with pytest.raises(TransportError, match=r"junk\.duckdb"):
        ProbeStore.merged([junk])


def test_columnar_insert_round_trips_twin_probes(tmp_path: Path) -> None:
    from fabricscope.fabric import leaf_spine_fabric
    from fabricscope.service.probe_twin import TwinMesh
    from fabricscope.sim.faults import Fault, FaultSchedule

    m = TwinMesh(leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2), seed=1)
    link = m.fabric.index.edge_id(5)
    obs = m.probe(m.transport_for(FaultSchedule.of([Fault("gray-loss", link, params={"loss": 0.2})]), 2),
                  start_ns=0, duration_ns=5 * 10**9, seed=3)
    st = ProbeStore(tmp_path / "t.duckdb")
    assert st.insert_observations(obs) == len(obs)
    back = st.observations()
    st.close()
    a, b = flow_stats(obs, medians=False), flow_stats(back, medians=False)
    key = {k: i for i, k in enumerate(back.flows)}
    order = [key[k] for k in obs.flows]
    assert (b.sent[order] == a.sent).all() and (b.lost[order] == a.lost).all()
    assert (b.lost_req[order] == a.lost_req).all() and a.lost.sum() > 0


# --- observations() of a window against a reference computed from the stored rows ---------

S = 1_000_000_000
_ROW = ("src, dst, src_ip, dst_ip, src_port, dst_port, proto, seq, t_send_ns, t_resp_rx_ns, "
        "t_resp_tx_ns, t_recv_ns, status")


@pytest.fixture(scope="module")
def twin_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProbeStore, TwinRun]]:
    """A seeded twin run (gray loss: both kinds of lost probe) written with ``run_twin(db=)``,
    plus hand-made probes: flows seen only before / after the cut window, and probes sharing
    a send time (inserted in the reverse of their (flow, seq) order, so that table order
    alone would put them wrong)."""
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.service.probe_twin import run_twin
    from fabricscope.sim.faults import Fault

    fabric = rail_optimized_fabric(4)
    db = tmp_path_factory.mktemp("probes") / "twin.duckdb"
    run = run_twin(fabric, [Fault("gray-loss", fabric.index.edge_id(3), 2 * S,
                                  params={"loss": 0.3})],
                   duration_s=6, seed=3, db=str(db))
    st = ProbeStore(db)
    tie = int(np.sort(run.obs.t_send_ns)[len(run.obs) // 3])  # a real send time: the cut's t0
    a, b = "host0000/nic0", "host0001/nic0"
    early = FiveTuple("10.9.0.1", "10.9.0.2", 1, 4791)
    late = FiveTuple("10.9.0.1", "10.9.0.2", 2, 4791)
    tied = [FiveTuple("10.9.0.3", "10.9.0.4", p, 4791) for p in (7, 5)]
    extra = [
        (ProbeSample(a, b, early, 0, 5, 100, 110, 300), ANSWERED),
        (ProbeSample(a, b, early, 1, 10, None, None, None), REQUEST_LOST),
        (ProbeSample(a, b, late, 0, 7 * S, 7 * S + 9, 7 * S + 19, 7 * S + 50), ANSWERED),
        (ProbeSample(a, b, late, 1, 8 * S, 8 * S + 9, 8 * S + 19, None), REPLY_LOST),
        (ProbeSample(b, a, tied[0], 3, tie, tie + 4, tie + 6, tie + 20), ANSWERED),
        (ProbeSample(b, a, tied[1], 9, tie, tie + 4, tie + 6, None), REPLY_LOST),
        (ProbeSample(b, a, tied[1], 8, tie, tie + 3, tie + 5, tie + 30), ANSWERED),
    ]
    st.insert([s for s, _ in extra], [x for _, x in extra])
    yield st, run
    st.close()


def _reference(rows: list[tuple[Any, ...]], t0: int | None, t1: int | None) -> Observations:
    """The window's Observations built directly from the table's rows: flows sorted by key,
    probes by (send time, flow, seq), lost times -1."""
    kept = [r for r in rows if (t0 is None or r[8] >= t0) and (t1 is None or r[8] < t1)]
    keys = sorted({r[:7] for r in kept})
    fid = {k: i for i, k in enumerate(keys)}
    kept.sort(key=lambda r: (r[8], fid[r[:7]], r[7]))

    def col(vals: list[Any]) -> npt.NDArray[np.int64]:
        return np.asarray(vals, dtype=np.int64).reshape(-1)

    def times(c: int) -> npt.NDArray[np.int64]:
        return col([-1 if r[c] is None else r[c] for r in kept])

    return Observations([(k[0], k[1], FiveTuple(*k[2:])) for k in keys],
                        col([fid[r[:7]] for r in kept]), col([r[8] for r in kept]),
                        times(9), times(10), times(11), col([r[12] for r in kept]))


def _assert_same(got: Observations, want: Observations) -> None:
    assert list(got.flows) == list(want.flows)
    for c in ("flow", "t_send_ns", "t_resp_rx_ns", "t_resp_tx_ns", "t_recv_ns", "status"):
        g, w = getattr(got, c), getattr(want, c)
        assert g.dtype == np.int64 and g.shape == w.shape, c
        assert np.array_equal(g, w), c


@pytest.mark.parametrize("window", ["all", "cut", "from", "until", "empty", "past"])
def test_observations_of_a_window_equal_the_reference(
        twin_store: tuple[ProbeStore, TwinRun], window: str) -> None:
    st, run = twin_store
    ts = np.sort(run.obs.t_send_ns)
    t0, t1 = int(ts[len(ts) // 3]), int(ts[2 * len(ts) // 3])  # real send times: both edges hit
    bounds: dict[str, tuple[int | None, int | None]] = {
        "all": (None, None), "cut": (t0, t1), "from": (t0, None), "until": (None, t1),
        "empty": (t1, t1), "past": (10 * S, 11 * S)}
    lo, hi = bounds[window]
    rows = st.con.execute(f"SELECT {_ROW} FROM probes").fetchall()
    want = _reference(rows, lo, hi)
    got = st.observations(t0_ns=lo, t1_ns=hi)
    _assert_same(got, want)
    names = {ft.src_port for a, _, ft in got.flows if a.startswith("host0000") and
             ft.src_ip == "10.9.0.1"}
    if window == "all":
        assert len(got) == len(run.obs) + 7 and names == {1, 2}
        assert got.status is not None
        assert set(np.unique(got.status).tolist()) == {ANSWERED, REQUEST_LOST, REPLY_LOST}
    if window == "cut":
        assert 0 < len(got) < len(run.obs) and names == set()  # only outside the window
        assert got.t_send_ns[0] == t0 and (got.t_send_ns < t1).all()
        assert int((got.t_send_ns == t0).sum()) >= 4  # the ties, in (flow, seq) order
        assert sorted(set(got.flow.tolist())) == list(range(len(got.flows)))
    if window in ("empty", "past"):
        assert len(got) == 0 and list(got.flows) == []


def test_insert_observations_writes_one_row_per_probe(
        twin_store: tuple[ProbeStore, TwinRun]) -> None:
    """The twin's probes as rows: the flow's key, seq counting each flow's probes in order,
    NULL times when lost, the status kept (the reference is built probe by probe)."""
    st, run = twin_store
    obs = run.obs
    seen: dict[int, int] = {}
    want = []
    for i in range(len(obs)):
        j = int(obs.flow[i])
        a, b, ft = obs.flows[j]
        seq = seen[j] = seen.get(j, -1) + 1
        lost = obs.t_recv_ns[i] < 0
        times = [None if lost else int(getattr(obs, c)[i])
                 for c in ("t_resp_rx_ns", "t_resp_tx_ns", "t_recv_ns")]
        assert obs.status is not None
        want.append((a, b, *ft, seq, int(obs.t_send_ns[i]), *times, int(obs.status[i])))
    got = st.con.execute(f"SELECT {_ROW} FROM probes WHERE NOT src_ip LIKE '10.9.%'").fetchall()
    assert sorted(got) == sorted(want) and len(got) == len(obs)


def test_send_order_breaks_ties_by_flow_then_seq() -> None:
    from fabricscope.store.probes import _send_order

    rng = np.random.default_rng(11)
    n = 2000
    t = rng.integers(0, 300, n).astype(np.int64)  # many ties
    fid = rng.integers(0, 40, n).astype(np.int64)
    seq = rng.permutation(n).astype(np.int64)
    assert np.array_equal(_send_order(t, fid, seq), np.lexsort((seq, fid, t)))
    t = np.sort(rng.integers(0, 10**9, n)).astype(np.int64)  # the join's usual: sorted, no ties
    assert np.array_equal(_send_order(t, fid, seq), np.argsort(t, kind="stable"))
