"""Executing actions: the allow-list, the modes, the twin executor, and the console's approve
endpoint executing through the real HTTP API (the console fixtures of test_console_api)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import test_console_api as _api
from fabricscope.diagnosis.actions import (
    ALLOW_LIST,
    ActionResult,
    PlannedAction,
    check_mode,
    plan_action,
    refusal,
)
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.instruments.executor import TwinExecutor
from fabricscope.service.supervise_twin import parse_twin_fault
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import FaultSchedule
from fabricscope.twin.state import Twin

NS = 1_000_000_000
FAULT, LINK, _client = _api.FAULT, _api.LINK, _api._client
# the console fixtures (a real uvicorn server with the twin supervisor): reused, not copied
fabric, console, with_incident = _api.fabric, _api.console, _api.with_incident


def _gray_twin(fabric) -> tuple[Twin, int]:  # type: ignore[no-untyped-def]
    f = replace(parse_twin_fault(FAULT, fabric), start_ns=30 * NS)
    twin = Twin(fabric, clock=SimClock(0), faults=FaultSchedule.of([f]),
                load_bps=np.full(fabric.index.n_edges, 10e9), rng=1)
    return twin, fabric.edge_index(f.subject)


def _errors(twin: Twin, edge: int, t0_s: int, t1_s: int) -> float:
    twin.advance_to(t0_s * NS)
    a = float(twin.field("in_fcs")[edge])
    twin.advance_to(t1_s * NS)
    return float(twin.field("in_fcs")[edge]) - a


def test_cost_out_stops_a_gray_links_errors_on_the_twin(fabric) -> None:  # type: ignore[no-untyped-def]
    twin, e = _gray_twin(fabric)
    ex = TwinExecutor(twin)
    assert _errors(twin, e, 40, 50) > 1000
    r = ex.execute("cost-out-link", LINK)
    assert r.ok and r.resource == LINK and "undo" not in r.detail and r.undo
    assert _errors(twin, e, 50, 60) == 0.0
    twin.drain(LINK, 0.0)  # the undo
    full = _errors(twin, e, 60, 70)
    assert full > 1000
    assert ex.execute("shift-lb-weight", LINK).ok
    assert 0.4 * full < _errors(twin, e, 70, 80) < 0.6 * full  # half the traffic, half the loss
    assert not ex.supports("restart-agent")
    assert not ex.execute("cost-out-link", "host0002").ok  # a host names no single cable


def test_modes_and_the_allow_list() -> None:
    kb = load_kb()
    assert check_mode("approve") == "approve"
    with pytest.raises(ConfigError, match="--actions: expected one of off, approve, auto"):
        check_mode("yes")
    manual = next(a for t in kb for a in t.actions if a.automation not in ALLOW_LIST)
    assert "allow-list" in refusal(PlannedAction(None, manual), _Always(), "approve")  # type: ignore[arg-type]
    assert refusal(None, _Always(), "off").startswith("actions are off")
    assert refusal(None, None, "approve") == "no action executor is configured"


class _Always:
    def supports(self, automation: str) -> bool:
        return True

    def execute(self, automation: str, resource: str) -> ActionResult:
        return ActionResult(automation, resource, True, "done")


def test_approve_through_the_api_executes_on_the_twin(with_incident) -> None:  # type: ignore[no-untyped-def]
    state, _, h = with_incident
    fab = state.fabric
    inc = next(i for i in state.incidents(status="open")[1]
               if i.root_causes and i.root_causes[0].resource == LINK)
    action = inc.root_causes[0].action
    kb = load_kb()
    planned = plan_action(kb, inc, action)
    assert planned is not None and planned.automation == "cost-out-link"
    twin, e = _gray_twin(fab)
    ex = TwinExecutor(twin)
    assert _errors(twin, e, 40, 50) > 1000
    try:
        with _client(h) as c:
            # off (the default): recorded, not executed, and the answer says why
            r = c.post(f"/api/v1/incidents/{inc.id}/approve", json={"action": action})
            assert r.status_code == 200, r.text
            assert r.json()["approval"]["executed"] is False
            assert "actions are off" in r.json()["approval"]["result"]
            assert ex.done == []
            state.configure_actions(ex, kb, mode="approve")
            r = c.post(f"/api/v1/incidents/{inc.id}/approve", json={"action": action,
                                                                    "note": "drain it"})
            assert r.status_code == 200, r.text
            ap = r.json()["approval"]
            assert ap["executed"] is True and ap["result"].startswith("executed: cost-out-link")
            d = c.get(f"/api/v1/incidents/{inc.id}").json()
            assert d["approvals"][-1]["executed"] is True
            assert any("executed: cost-out-link" in x["what"] and LINK in x["what"]
                       for x in d["history"])
    finally:
        state.configure_actions(None, kb, mode="off")
    assert [r.automation for r in ex.done] == ["cost-out-link"]
    assert _errors(twin, e, 50, 60) == 0.0  # the symptom stopped


def test_auto_executes_once_per_incident(with_incident) -> None:  # type: ignore[no-untyped-def]
    state, _, _ = with_incident
    inc = next(i for i in state.incidents(status="open")[1]
               if i.root_causes and i.root_causes[0].resource == LINK)
    fresh = ConsoleState(state.fabric)
    twin, _ = _gray_twin(state.fabric)
    ex = TwinExecutor(twin)
    fresh.configure_actions(ex, load_kb(), mode="auto")
    fresh.upsert_incident(inc)
    fresh.upsert_incident(replace(inc, updated_ns=inc.updated_ns + NS))
    assert [(r.automation, r.resource) for r in ex.done] == [("cost-out-link", LINK)]
    ap = fresh.approvals_of(inc.id)
    assert len(ap) == 1 and ap[0].executed and ap[0].by.startswith("supervisor")
