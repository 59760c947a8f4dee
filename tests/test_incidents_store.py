"""The diagnosis store (store/findings.py) and the JSON form of its records (serialize.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.diagnosis.model import Check, Incident, Observed, RootCause
from fabricscope.diagnosis.serialize import (
    incident_from_json,
    incident_to_json,
    observed_from_json,
    observed_to_json,
)
from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.model.records import Finding
from fabricscope.store.findings import DiagnosisStore

S = 1_000_000_000
WALL = 1_700_000_000 * S  # a wall-clock time (Unix epoch ns)


def sample_findings() -> list[Observed]:
    """Three instruments' view of one dirty connector (the issue's example)."""
    return [
        Observed("probe", Finding("probe-loss", "leaf-03:eth12->spine-01:eth4", 0.9,
                                  (10 * S, 12 * S), ("loss 4.8% on 12 flows",), "",
                                  {"flows": 12, "loss": 0.048}), reported_ns=12 * S + S // 2),
        Observed("telemetry", Finding("crc-increase", "spine-01:eth4", 0.95, (11 * S, 13 * S),
                                      ("in-fcs-errors +412/s",), "inspect the optic",
                                      {"rate": 412.0, "counter": "in-fcs-errors"}),
                 reported_ns=13 * S),
        Observed("optics", Finding("rx-power-low", "spine-01:eth4", 0.8, (9 * S, 13 * S),
                                   ("lane 2 rx -4.1 dB",)), reported_ns=13 * S + S // 5),
    ]


def sample_incidents(fs: list[Observed] | None = None) -> list[Incident]:
    """An open incident with two ranked root causes (simulated clock) and a closed one with
    none (wall clock)."""
    a, b, c = fs or sample_findings()
    rc1 = RootCause(
        "spine-01:eth4", "dirty-connector", 0.82, (a.id, b.id, c.id),
        (f"{c.id}: lane 2 rx power 4.1 dB low, other lanes normal",
         f"{b.id}: FCS errors on the same port"),
        (Check("rx-power-per-lane", "optics", "supports", "1 of 4 lanes low"),
         Check("tx-power-peer", "gnmi", "excludes", "peer tx normal")),
        "clean the connector on spine-01:eth4", "optics")
    rc2 = RootCause("spine-01:eth4", "optic-aging", 0.15, (c.id,), ("temperature normal",),
                    (Check("temperature-trend", "optics", "inconclusive"),), "replace the optic",
                    "optics")
    open_inc = Incident(
        "inc-0001", "open", 12 * S + S // 2, 13 * S + S // 5, 9 * S, 12 * S + S // 2, (rc1, rc2),
        (a.id, b.id, c.id), "critical", {"links": 1, "gpus": 16, "jobs": 1}, 14 * S, 15 * S,
        None, "packet loss and CRC errors on spine-01:eth4",
        ("15.000 s proposed: cost out leaf-03:eth12|spine-01:eth4",))
    closed_inc = Incident("inc-0002", "closed", WALL, WALL + 60 * S, WALL - 10 * S, WALL,
                          closed_ns=WALL + 90 * S, title="transient")
    return [open_inc, closed_inc]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    p = tmp_path / "incidents.duckdb"
    with DiagnosisStore(p) as s:
        s.add_findings(sample_findings())
        s.upsert_incidents(sample_incidents())
    return p


# -- serialize ---------------------------------------------------------------------------


def test_json_round_trip_is_exact_through_text() -> None:
    for o in sample_findings():
        assert observed_from_json(json.loads(json.dumps(observed_to_json(o)))) == o
    for i in sample_incidents():
        back = incident_from_json(json.loads(json.dumps(incident_to_json(i))))
        assert back == i
        assert back.root_causes == i.root_causes  # nested records, in rank order


_text = st.text(max_size=12)
_int = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_float = st.floats(allow_nan=False)
_check = st.builds(Check, _text, _text, st.sampled_from(["supports", "excludes", "x"]), _text)
_rc = st.builds(RootCause, _text, _text, _float, st.tuples(_text), st.lists(_text).map(tuple),
                st.lists(_check, max_size=3).map(tuple), _text, _text)
_incident = st.builds(
    Incident, _text, st.sampled_from(["open", "closed"]), _int, _int, _int, _int,
    st.lists(_rc, max_size=3).map(tuple), st.lists(_text, max_size=4).map(tuple), _text,
    st.dictionaries(_text, _int, max_size=3), st.none() | _int, st.none() | _int,
    st.none() | _int, _text, st.lists(_text, max_size=3).map(tuple))
_observed = st.builds(
    Observed, _text,
    st.builds(Finding, _text, _text, _float, st.tuples(_int, _int), st.lists(_text).map(tuple),
              _text, st.dictionaries(_text, _int | _float | _text, max_size=3)),
    _int, st.just("") | _text)


@settings(max_examples=60, deadline=None)
@given(_incident, _observed)
def test_json_round_trip_property(inc: Incident, obs: Observed) -> None:
    assert incident_from_json(json.loads(json.dumps(incident_to_json(inc)))) == inc
    assert observed_from_json(json.loads(json.dumps(observed_to_json(obs)))) == obs


def _bad(d: dict[str, Any], path: list[Any], value: Any = None, *, delete: bool = False) -> Any:
    d = json.loads(json.dumps(d))
    node = d
    for k in path[:-1]:
        node = node[k]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return d


@pytest.mark.parametrize(("path", "value", "delete", "must_say"), [
    (["id"], None, True, ["missing field id"]),
    (["opened_ns"], "soon", False, ["opened_ns", "'soon'", "integer"]),
    (["opened_ns"], True, False, ["opened_ns", "True"]),  # a bool is not a time
    (["status"], "resolved", False, ["status", "'resolved'", "open or closed"]),
    (["root_causes", 0, "probability"], "high", False, ["root_causes[0]", "probability", "'high'"]),
    (["root_causes", 1, "checks", 0, "result"], 3, False, ["root_causes[1].checks[0]", "result"]),
    (["root_causes", 0, "checks", 0], "ok", False, ["checks[0]", "an object", "'ok'"]),
    (["blast", "gpus"], 1.5, False, ["blast.gpus", "1.5"]),
    (["findings"], "f-1", False, ["findings", "a list"]),
    (["root_cause_ns"], [1], False, ["root_cause_ns", "[1]"]),
    (["colour"], "red", False, ["unknown field", "colour"]),
])
def test_incident_from_json_names_source_field_and_value(
        path: list[Any], value: Any, delete: bool, must_say: list[str]) -> None:
    d = _bad(incident_to_json(sample_incidents()[0]), path, value, delete=delete)
    with pytest.raises(ConfigError) as err:
        incident_from_json(d, source="export.jsonl line 3")
    msg = str(err.value)
    assert msg.startswith("export.jsonl line 3: ")
    assert "\n" not in msg
    for s in must_say:
        assert s in msg, msg
    if not delete:
        assert "inc-0001" in msg  # the record is named


@pytest.mark.parametrize(("path", "value", "must_say"), [
    (["window"], [1, 2, 3], ["window", "[1, 2, 3]"]),
    (["window"], [1, "2"], ["window"]),
    (["score"], None, ["score", "None", "number"]),
    (["evidence", 0], 7, ["evidence[0]", "7"]),
    (["details", "rate"], [1], ["details.rate", "[1]"]),
    (["reported_ns"], 1.5, ["reported_ns", "1.5"]),
])
def test_observed_from_json_names_source_field_and_value(path: list[Any], value: Any,
                                                         must_say: list[str]) -> None:
    o = sample_findings()[1]
    with pytest.raises(ConfigError) as err:
        observed_from_json(_bad(observed_to_json(o), path, value), source="findings.json")
    msg = str(err.value)
    assert msg.startswith("findings.json: ") and o.id in msg
    for s in must_say:
        assert s in msg, msg


@pytest.mark.parametrize("doc", [None, [], "inc-1", 3])
def test_from_json_of_a_non_object(doc: Any) -> None:
    with pytest.raises(ConfigError, match="expected an object"):
        incident_from_json(doc, source="x")
    with pytest.raises(ConfigError, match="expected an object"):
        observed_from_json(doc, source="x")


def test_defaulted_fields_may_be_omitted() -> None:
    d = {"id": "inc-9", "status": "open", "opened_ns": 1, "updated_ns": 2,
         "first_symptom_ns": 0, "detected_ns": 1}
    assert incident_from_json(d) == Incident("inc-9", "open", 1, 2, 0, 1)


# -- store -------------------------------------------------------------------------------


def test_store_round_trip_across_reopen(db: Path) -> None:
    with DiagnosisStore(db, read_only=True) as s:
        assert s.incident("inc-0001") == sample_incidents()[0]
        assert s.incident("inc-0002") == sample_incidents()[1]
        assert s.findings() == sorted(sample_findings(), key=lambda o: o.reported_ns)
        assert s.counts() == (2, 3)


def test_scalar_columns_mirror_the_body(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT id, status, top_resource, top_fault, top_probability, closed_ns, "
                       "json_extract_string(body, '$.title') FROM incidents ORDER BY id").fetchall()
    con.close()
    assert rows == [
        ("inc-0001", "open", "spine-01:eth4", "dirty-connector", 0.82, None,
         "packet loss and CRC errors on spine-01:eth4"),
        ("inc-0002", "closed", None, None, None, WALL + 90 * S, "transient"),
    ]


def test_add_findings_is_idempotent() -> None:
    fs = sample_findings()
    with DiagnosisStore(":memory:") as s:
        assert s.add_findings(fs[:2]) == 2
        changed = Observed(fs[0].source, replace(fs[0].finding, score=0.1), fs[0].reported_ns)
        assert changed.id == fs[0].id
        # again, a changed copy of a stored one, a repeat inside the batch, and one new
        assert s.add_findings([*fs[:2], changed, fs[2], fs[2]]) == 1
        assert s.counts() == (0, 3)
        assert s.findings(ids=[fs[0].id]) == [fs[0]]  # the first version is kept
        assert s.add_findings([]) == 0


def test_upsert_replaces_and_last_version_wins() -> None:
    v1 = sample_incidents()[0]
    v2 = replace(v1, status="closed", updated_ns=v1.updated_ns + S, closed_ns=v1.updated_ns + S,
                 root_causes=v1.root_causes[::-1])
    v3 = replace(v2, severity="info")
    with DiagnosisStore(":memory:") as s:
        assert s.upsert_incidents([v1]) == 1
        assert s.upsert_incidents([v2]) == 1
        assert s.incidents() == [v2]
        row = s.con.execute("SELECT status, top_fault FROM incidents").fetchall()
        assert row == [("closed", "optic-aging")]
        assert s.upsert_incidents([v1, v3]) == 1  # within a batch too
        assert s.incidents() == [v3]
        assert s.counts() == (1, 0)


def test_incident_filters_and_order() -> None:
    base = sample_incidents()[0]
    incs = [replace(base, id=f"inc-{k}", opened_ns=k * S, updated_ns=k * S + S // 2,
                    status="closed" if k % 2 else "open") for k in range(6)]
    with DiagnosisStore(":memory:") as s:
        s.upsert_incidents(incs)
        assert [i.id for i in s.incidents()] == [f"inc-{k}" for k in range(5, -1, -1)]
        assert [i.id for i in s.incidents(status="open")] == ["inc-4", "inc-2", "inc-0"]
        # active in [2 s, 4 s): updated at/after 2 s, opened before 4 s
        assert [i.id for i in s.incidents(since_ns=2 * S, until_ns=4 * S)] == ["inc-3", "inc-2"]
        with pytest.raises(ConfigError, match="'all'"):
            s.incidents(status="all")


def test_findings_filters() -> None:
    fs = sample_findings()
    with DiagnosisStore(":memory:") as s:
        s.add_findings(fs)
        assert s.findings(ids=[fs[2].id, fs[0].id]) == [fs[0], fs[2]]  # report order
        assert s.findings(ids=[]) == []
        assert s.findings(sources=["optics", "telemetry"]) == [fs[1], fs[2]]
        # windows: probe 10-12 s, telemetry 11-13 s, optics 9-13 s
        assert s.findings(since_ns=12 * S + 1) == [fs[1], fs[2]]
        assert s.findings(until_ns=10 * S) == [fs[2]]
        assert s.findings(ids=[fs[0].id], sources=["optics"]) == []


def test_prefix_lookup_and_ambiguity(db: Path) -> None:
    with DiagnosisStore(db) as s:
        assert s.incident("inc-0001") == sample_incidents()[0]
        assert s.incident("inc-0002") is not None
        s.upsert_incidents([replace(sample_incidents()[0], id="inc-0001b"),
                            replace(sample_incidents()[0], id="inc-0100")])
        assert s.incident("inc-0001").id == "inc-0001"  # type: ignore[union-attr]  # exact wins
        assert s.incident("inc-0001b").id == "inc-0001b"  # type: ignore[union-attr]
        assert s.incident("inc-01").id == "inc-0100"  # type: ignore[union-attr]  # unique prefix
        assert s.incident("nope") is None
        with pytest.raises(ConfigError) as err:
            s.incident("inc-000")
        assert "ambiguous" in str(err.value)
        for i in ("inc-0001", "inc-0001b", "inc-0002"):
            assert i in str(err.value)
        with pytest.raises(ConfigError, match="empty"):
            s.incident("")


def test_not_a_duckdb_file(tmp_path: Path) -> None:
    p = tmp_path / "notes.duckdb"
    p.write_text("not a database\n" * 100)
    with pytest.raises(FabricscopeError) as err:
        DiagnosisStore(p)
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_a_findings_table_of_another_schema(tmp_path: Path) -> None:
    p = tmp_path / "other.duckdb"
    con = duckdb.connect(str(p))
    con.execute("CREATE TABLE findings (id VARCHAR, what VARCHAR)")
    con.close()
    with pytest.raises(ConfigError) as err:
        DiagnosisStore(p)
    msg = str(err.value)
    assert str(p) in msg and "'findings'" in msg and "id, what" in msg


def test_read_only_needs_the_tables(tmp_path: Path) -> None:
    p = tmp_path / "probes.duckdb"
    con = duckdb.connect(str(p))
    con.execute("CREATE TABLE probes (src VARCHAR)")
    con.close()
    with pytest.raises(ConfigError, match=r"no table 'findings'.*it has probes"):
        DiagnosisStore(p, read_only=True)
    with DiagnosisStore(p) as s:  # writable: the tables are added beside the probes
        assert s.counts() == (0, 0)
    with DiagnosisStore(p, read_only=True) as s:
        assert s.incidents() == []


def test_a_corrupt_body_names_the_table(db: Path) -> None:
    con = duckdb.connect(str(db))
    con.execute("UPDATE incidents SET body = json_object('id', 'inc-0002', 'status', 'gone') "
                "WHERE id = 'inc-0002'")
    con.close()
    with DiagnosisStore(db, read_only=True) as s:
        assert s.incident("inc-0001") is not None
        with pytest.raises(ConfigError) as err:
            s.incident("inc-0002")
    assert "table incidents" in str(err.value) and "inc-0002" in str(err.value)


def test_ten_thousand_findings_in_one_batch() -> None:
    fs = [Observed("telemetry", Finding("crc-increase", f"leaf-{k:04d}:eth1", k / 1e4,
                                        (k * S, k * S + S), (f"ev {k}",), "",
                                        {"rate": k * 0.5, "n": k}), reported_ns=k * S + S)
          for k in range(10_000)]
    with DiagnosisStore(":memory:") as s:
        assert s.add_findings(fs) == 10_000
        assert s.add_findings(fs) == 0
        back = s.findings()
    assert back == fs
