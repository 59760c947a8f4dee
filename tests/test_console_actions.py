"""Actions executed by the console on its twin (``serve --actions``): an approved cost-out
ends the symptoms that need traffic and the incident closes; the same run without the action
keeps it open; refusals are recorded; the CLI rejects what it cannot do (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.api.serve import ServeOptions, build
from fabricscope.diagnosis.incidents import CorrelatorParams
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.fabric.catalog import build_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.console.twin_executor import ConsoleTwinExecutor
from fabricscope.service.console.twin_source import TwinSupervisor

NS = 1_000_000_000
GRAY = "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0,loss=0.03"
LINK = "host0002/nic1:p0|leaf-p0-r1-00:eth3"
OPTIC = "optic-degrading:leaf-p0-r1-00:eth3,mode=dirty-connector"


@pytest.fixture(scope="module")
def fabric():  # type: ignore[no-untyped-def]
    return build_fabric("rail-optimized", {"servers": 8}, source="test")


def _console(fabric, mode: str) -> tuple[ConsoleState, TwinSupervisor, ConsoleTwinExecutor]:  # type: ignore[no-untyped-def]
    state = ConsoleState(fabric, mode="twin")
    # incidents close after 200 s without a symptom (600 s by default) so the test stays short
    sup = TwinSupervisor(state, fabric, params=CorrelatorParams(close_after_ns=200 * NS))
    ex = ConsoleTwinExecutor(sup)
    state.configure_actions(ex, load_kb(), mode=mode)
    return state, sup, ex


def _later_reports(state: ConsoleState, after_ns: int) -> list[float]:
    """Report times (s) of the gray link's findings after ``after_ns``."""
    return sorted(o.reported_ns / NS for o in state.findings(kind="gray-link")
                  if o.reported_ns > after_ns and LINK in _cables(o.finding.subject))


def _cables(subject: str) -> str:
    a, _, b = subject.partition("->")
    return "|".join(sorted((a, b)))


def _gray_link_at_120s(state: ConsoleState, sup: TwinSupervisor):  # type: ignore[no-untyped-def]
    """The gray link injected at 30 s, its incident open at 120 s."""
    sup.advance_to(30 * NS)
    sup.inject(GRAY)
    sup.advance_to(120 * NS)
    return _gray_incident(state)


def _gray_incident(state: ConsoleState):  # type: ignore[no-untyped-def]
    open_ = state.incidents(status="open")[1]
    hits = [i for i in open_ if any(rc.fault == "gray-link" for rc in i.root_causes)]
    assert hits, [(i.id, [(rc.resource, rc.fault) for rc in i.root_causes]) for i in open_]
    return hits[0]


def test_approved_cost_out_ends_the_gray_link_and_its_incident_closes(fabric) -> None:  # type: ignore[no-untyped-def]
    state, sup, ex = _console(fabric, "approve")
    inc = _gray_link_at_120s(state, sup)
    rc = next(rc for rc in inc.root_causes if rc.fault == "gray-link")
    assert rc.resource in (LINK, "leaf-p0-r1-00:eth3->host0002/nic1:p0"), rc.resource
    ack = state.approve(inc.id, rc.action, "operator")
    assert ack is not None and ack.executed, ack
    assert LINK in ack.result and "gray-loss" in ack.result, ack.result
    assert [r.resource for r in ex.done] == [LINK]
    (f,) = sup.faults()
    assert f.mitigated and f.fault.end_ns == 120 * NS
    sup.advance_to(360 * NS)
    # a probe window that ended by the action may still report it; nothing later does
    assert _later_reports(state, 130 * NS) == []
    after = {i.id: i for i in state.incidents()[1]}
    assert after[inc.id].status == "closed", after[inc.id]
    hist = " ".join(text for _, text in state.history(inc.id))
    assert "approved by operator" in hist and "executed" in hist


def test_undo_brings_the_link_back_with_its_unrepaired_fault(fabric) -> None:  # type: ignore[no-untyped-def]
    state, sup, _ = _console(fabric, "approve")
    inc = _gray_link_at_120s(state, sup)
    assert state.undo(inc.id, "operator") is None  # nothing executed yet
    rc = next(rc for rc in inc.root_causes if rc.fault == "gray-link")
    assert state.approve(inc.id, rc.action, "operator").executed  # type: ignore[union-attr]
    sup.advance_to(180 * NS)
    assert _later_reports(state, 130 * NS) == [] and state.costed_out() == {LINK: 120 * NS}
    ok, detail = state.undo(inc.id, "operator", "optic replaced? no") or (False, "")
    assert ok and "cost-in-link" in detail and "gray-loss on it shows again" in detail, detail
    assert not sup.faults()[0].mitigated and sup.faults()[0].fault.end_ns is None
    assert state.costed_out() == {}
    sup.advance_to(360 * NS)
    assert _later_reports(state, 185 * NS), "the unrepaired gray link is reported again"
    hist = " ".join(text for _, text in state.history(inc.id))
    assert "undo by operator of cost-out-link" in hist
    assert state.undo(inc.id, "operator") is None  # undone once


def test_without_the_action_the_incident_stays_open(fabric) -> None:  # type: ignore[no-untyped-def]
    state, sup, ex = _console(fabric, "off")
    inc = _gray_link_at_120s(state, sup)
    rc = next(rc for rc in inc.root_causes if rc.fault == "gray-link")
    ack = state.approve(inc.id, rc.action, "operator")
    assert ack is not None and not ack.executed and "actions are off" in ack.result
    assert ex.done == [] and not sup.faults()[0].mitigated
    sup.advance_to(360 * NS)
    assert _later_reports(state, 130 * NS), "the gray link goes on being reported"
    assert {i.id: i for i in state.incidents()[1]}[inc.id].status == "open"


def test_auto_mode_executes_once_without_an_approval(fabric) -> None:  # type: ignore[no-untyped-def]
    state, sup, ex = _console(fabric, "auto")
    sup.advance_to(30 * NS)
    sup.inject(GRAY)
    sup.advance_to(150 * NS)
    assert [r.resource for r in ex.done] == [LINK], ex.done
    assert sup.faults()[0].mitigated
    sup.advance_to(400 * NS)
    assert not [i for i in state.incidents(status="open")[1]
                if any(rc.fault == "gray-link" for rc in i.root_causes)]
    assert len(ex.done) == 1  # once per incident and action


def test_cost_out_leaves_symptoms_that_need_no_traffic(fabric) -> None:  # type: ignore[no-untyped-def]
    _, sup, ex = _console(fabric, "approve")
    sup.advance_to(10 * NS)
    sup.inject(GRAY)
    sup.inject(OPTIC)
    r = ex.execute("cost-out-link", "leaf-p0-r1-00:eth3")
    assert r.ok and r.resource == LINK
    assert "gray-loss" in r.detail and "optic-degrading on it goes on" in r.detail
    gray, optic = sup.faults()
    assert gray.mitigated and not optic.mitigated and optic.fault.end_ns is None


def test_refusals_name_the_reason(fabric) -> None:  # type: ignore[no-untyped-def]
    _, _, ex = _console(fabric, "approve")
    assert not ex.supports("shift-lb-weight") and not ex.supports("restart-agent")
    r = ex.execute("shift-lb-weight", LINK)
    assert not r.ok and "not supported" in r.detail
    r = ex.execute("cost-out-link", "leaf-p0-r1-00")  # a switch names many cables
    assert not r.ok and "names no cable" in r.detail
    r = ex.execute("cost-out-link", "nowhere:eth9")
    assert not r.ok


def test_serve_options_reject_actions_they_cannot_carry_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--actions: expected one of off, approve, auto"):
        build(ServeOptions(actions="yes", token_file=tmp_path / "t"), echo=lambda m: None)
    cfg = tmp_path / "console.yaml"
    root = Path(__file__).resolve().parents[1]
    cfg.write_text(f"inventory: {root / 'examples' / 'fabric.yaml'}\nsources: {{telemetry: t.duckdb}}\n")
    with pytest.raises(ConfigError, match=r"--actions approve: --config .* has no actions\.gnmi"):
        build(ServeOptions(actions="approve", config=cfg, token_file=tmp_path / "t"),
              echo=lambda m: None)


def test_serve_cli_bad_actions_is_one_line_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", "from fabricscope.cli import main; main()",
                        "serve", "--actions", "maybe",
                        "--token-file", str(tmp_path / "t"), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    assert "--actions: expected one of off, approve, auto, got 'maybe'" in r.stderr
    assert "Traceback" not in r.stderr
