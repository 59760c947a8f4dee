"""Probe samples in a real DuckDB file and in JSON lines."""

from __future__ import annotations

from pathlib import Path

from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.probe.analysis import ANSWERED, REQUEST_LOST, flow_stats
from fabricscope.store.probes import ProbeStore, read_jsonl, write_jsonl

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
    import pytest

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
