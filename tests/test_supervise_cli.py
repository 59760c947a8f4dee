"""`fabricscope supervise` (the closed loop on the twin) and `fabricscope diagnose` (advisor)
end to end: injected faults -> instruments -> incidents -> store / webhook -> advisor."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from cli_inprocess import run_main

TWIN = "rail-optimized:servers=8"
GRAY = "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@30s,loss=0.03"
STORM = "pfc-storm:leaf-p0-r5-00:eth2@40s"
CABLE = "host0002/nic1:p0|leaf-p0-r1-00:eth3"


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """One supervise run with two faults, stored (shared by the tests below)."""
    from fabricscope.service.supervise_loop import run_supervise

    d = tmp_path_factory.mktemp("loop")
    doc = run_supervise(twin=TWIN, faults=[GRAY, STORM], duration="2m", tick="5s",
                        instruments="telemetry,probe,straggler,optics", seed=3,
                        db=d / "incidents.duckdb")
    return d / "incidents.duckdb", doc


def test_both_faults_found_with_their_root_cause(loop_run) -> None:  # type: ignore[no-untyped-def]
    _, doc = loop_run
    scores = doc["score"]["faults"]  # type: ignore[index]
    assert [s["found"] for s in scores] == [True, True], scores
    assert doc["score"]["false_positives"] == []  # type: ignore[index]
    for s in scores:
        assert 0 <= s["time_to_root_cause_s"] <= 60
    keys = {(rc["resource"], rc["fault"]) for i in doc["incidents"] for rc in i["root_causes"]}  # type: ignore[union-attr,index]
    assert (CABLE, "gray-link") in keys and ("leaf-p0-r5-00:eth2", "pfc-storm") in keys
    assert doc["cores"] < 1.0  # type: ignore[operator]


def test_store_is_read_by_incidents_and_diagnose(loop_run, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db, _ = loop_run
    code, out, _ = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(db), "--json")
    assert code == 0
    listed = json.loads(out)
    rows = listed if isinstance(listed, list) else listed["incidents"]
    assert len(rows) >= 2
    code, out, err = run_main(capsys, monkeypatch, "diagnose", "--twin", TWIN, "--findings",
                              str(db), "--subject", "leaf-p0-r1-00", "--json")
    assert code == 0, err
    ans = json.loads(out)
    top = ans["root_causes"][0]
    assert (top["resource"], top["fault"]) == (CABLE, "gray-link")
    assert ans["plan"] and all(p["run"] for p in ans["plan"])
    # the focus keeps the storm (on another leaf) out
    assert all(rc["fault"] != "pfc-storm" for rc in ans["root_causes"])


def test_diagnose_text_names_the_plan(loop_run, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db, _ = loop_run
    code, out, _ = run_main(capsys, monkeypatch, "diagnose", "--twin", TWIN, "--findings",
                            str(db), "--symptom", "job slow, host0002 retransmits")
    assert code == 0
    assert "ranked root causes:" in out and "troubleshooting plan" in out
    assert "gray-link on host0002/nic1:p0|leaf-p0-r1-00:eth3" in out


def test_diagnose_refuses_missing_and_mismatched_inputs(loop_run, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db, _ = loop_run
    code, _, err = run_main(capsys, monkeypatch, "diagnose", "--twin", TWIN)
    assert code == 2 and "no input given" in err and "Traceback" not in err
    code, _, err = run_main(capsys, monkeypatch, "diagnose", "--twin", TWIN, "--findings",
                            "/nonexistent/x.duckdb")
    assert code == 2 and "no such file" in err
    # another inventory: the stored findings name nothing of it
    code, _, err = run_main(capsys, monkeypatch, "diagnose", "--twin",
                            "leaf-spine:leaves=2,hosts_per_leaf=2,spines=1", "--findings", str(db))
    assert code == 2 and "wrong --inventory" in err


@pytest.mark.parametrize("fault,msg", [
    ("gray-loss:nowhere:eth1->x:eth2", "not in the inventory"),
    ("melt:leaf-p0-r1-00", "unknown fault kind"),
    ("gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@soon", "expected a time"),
    ("gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0,loss=lots", "expected a number"),
    ("gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@10m", "after the end of the run"),
])
def test_bad_fault_is_one_line_exit_2(fault: str, msg: str, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_main(capsys, monkeypatch, "supervise", "--twin", TWIN, "--duration",
                            "1m", "--fault", fault)
    assert code == 2, err
    assert msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_fault_free_run_opens_no_incident(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "clean.json"
    code, text, err = run_main(capsys, monkeypatch, "supervise", "--twin", TWIN, "--duration",
                               "5m", "--seed", "5", "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["incidents"] == [], doc["incidents"]
    assert "0 incident(s)" in text


class _Hook(BaseHTTPRequestHandler):
    got: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        _Hook.got.append(json.loads(self.rfile.read(n)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_webhook_receives_each_incident(tmp_path: Path) -> None:
    from fabricscope.service.supervise_loop import run_supervise

    srv = HTTPServer(("127.0.0.1", 0), _Hook)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        _Hook.got.clear()
        doc = run_supervise(twin=TWIN, faults=[STORM], duration="90s", tick="5s",
                            instruments="telemetry", seed=1,
                            webhook=f"http://127.0.0.1:{srv.server_address[1]}/hook")
    finally:
        srv.shutdown()
    assert doc["webhook"]["failed"] == 0 and doc["webhook"]["sent"] >= 1  # type: ignore[index]
    ids = {g["incident"]["id"] for g in _Hook.got}  # type: ignore[index]
    assert ids == {i["id"] for i in doc["incidents"]}  # type: ignore[union-attr,index]
    assert any(rc["fault"] == "pfc-storm" for g in _Hook.got
               for rc in g["incident"]["root_causes"])  # type: ignore[index,union-attr]


def test_webhook_down_is_counted_not_fatal() -> None:
    from fabricscope.service.supervise_loop import run_supervise

    doc = run_supervise(twin=TWIN, faults=[STORM], duration="90s", tick="5s",
                        instruments="telemetry", seed=1, webhook="http://127.0.0.1:9/hook")
    assert doc["webhook"]["sent"] == 0 and doc["webhook"]["failed"] >= 1  # type: ignore[index]
    assert doc["score"]["faults"][0]["found"]  # type: ignore[index]


def test_diagnose_refuses_the_wrong_kind_of_store_without_changing_it(
        loop_run, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import duckdb

    db, _ = loop_run

    def tables() -> set[str]:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return {r[0] for r in con.execute(
                "SELECT table_name FROM information_schema.tables").fetchall()}
        finally:
            con.close()

    before = tables()
    for flag, what in (("--telemetry", "not a telemetry store"), ("--probes", "not a probe store")):
        code, _, err = run_main(capsys, monkeypatch, "diagnose", "--twin", TWIN, flag, str(db))
        assert code == 2 and what in err and "Traceback" not in err, err
    assert tables() == before


def test_diagnose_on_an_empty_telemetry_store_is_no_data(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from fabricscope.store.telemetry import TelemetryStore

    db = tmp_path / "empty.duckdb"
    TelemetryStore(db).close()
    code, _, err = run_main(capsys, monkeypatch, "diagnose", "--twin", TWIN, "--telemetry", str(db))
    assert code == 2 and "no telemetry updates" in err and "Traceback" not in err
