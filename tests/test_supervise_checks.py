"""`fabricscope supervise` with and without active checks: a NIC's access link running at a
quarter of its rate is a slow NIC to every passive instrument; the port-speed check tells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_inprocess import run_main

TWIN = "rail-optimized:servers=8"
CABLE = "host0001/nic2:p0|leaf-p0-r2-00:eth2"
DEGRADED = f"link-degraded:{CABLE}@30s,factor=0.25"


@pytest.mark.parametrize("checks", [True, False])
def test_link_degraded_needs_the_port_speed_check(checks: bool, tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                  monkeypatch) -> None:
    out = tmp_path / "run.json"
    code, _, err = run_main(capsys, monkeypatch, "supervise", "--twin", TWIN, "--duration",
                            "2m", "--seed", "3", "--fault", DEGRADED, "--json", str(out),
                               *(() if checks else ("--no-checks",)))
    assert code == 0, err
    doc = json.loads(out.read_text())
    found = doc["score"]["faults"][0]["found"]
    pairs = {(rc["resource"], rc["fault"]) for i in doc["incidents"] for rc in i["root_causes"]}
    if checks:
        assert found and (CABLE, "link-degraded") in pairs, pairs
        assert any(c["kind"] == "port-speed" and c["resource"] == CABLE for c in doc["checks"])
        assert all(round(c["end_s"] - c["start_s"], 3) in (0.05, 0.5, 1.1) for c in doc["checks"])
        lines = [a for i in doc["incidents"] for a in i["actions"] if a.startswith("checked: ")]
        assert any("port-speed on " + CABLE in a and "speed-degraded" in a for a in lines)
    else:
        assert not found and doc["checks"] == []
        assert pairs, "the slow link is still seen, as something else"


GRAY = "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@30s,loss=0.03"
GRAY_CABLE = "host0002/nic1:p0|leaf-p0-r1-00:eth3"


def test_a_saved_case_is_cited_by_the_next_run(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from fabricscope.diagnosis.cases import Case, save_case

    folder = tmp_path / "cases"
    sig = ((("probe", "gray-link", "self"), 0.9),)  # loss toward a NIC: no switch counters
    save_case(Case("case-site-gray", "gray link last week", "gray-link", "cable", sig,
                   "reseated the cable", "2026-11"), folder)
    out = tmp_path / "run.json"
    code, _, err = run_main(capsys, monkeypatch, "supervise", "--twin", TWIN, "--duration", "90s",
                            "--seed", "3", "--fault", GRAY, "--cases", str(folder), "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    rc = [rc for i in doc["incidents"] for rc in i["root_causes"] if rc["resource"] == GRAY_CABLE]
    assert rc and rc[0]["fault"] == "gray-link"
    assert any("similar past case case-site-gray" in e for e in rc[0]["evidence"])
    # the dom checks read both modules' light: no optic is left "not excluded yet"
    assert not any("optic-aging on" in e and "not excluded yet" in e for e in rc[0]["evidence"])
    code, _, err = run_main(capsys, monkeypatch, "supervise", "--twin", TWIN, "--duration", "30s",
                            "--cases", str(tmp_path / "nowhere"))
    assert code == 2 and "nowhere: not a folder of cases" in err and "Traceback" not in err
