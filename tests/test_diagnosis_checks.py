"""Active checks: the twin serves what they read, they decide symptoms, and the coordinator
(concurrently) and the knowledge tree (one after another) use them at the same costs."""

from __future__ import annotations

import pytest

from fabricscope.diagnosis.baseline import TreeWalker
from fabricscope.diagnosis.checks import CHECK_KINDS, CheckOutcome, CheckRequest, kinds_for
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator, CorrelatorParams
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.model import Observed
from fabricscope.diagnosis.specialists import FindingIndex, Hypothesis, specialists
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.checks import TwinChecks
from fabricscope.service.supervise_twin import TreeSide, _CoordinatorSide, replay
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.twin.state import Twin, speed_identity
from test_diagnosis_core import COV

NS = 1_000_000_000


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return rail_optimized_fabric(8)


def _uplink(fabric: Fabric) -> str:
    return [lk for lk in fabric.links if "spine" in lk.b][3].id


def _access(fabric: Fabric, nic: str) -> str:
    return next(lk.id for lk in fabric.links if lk.a.startswith(nic + ":") or lk.b.startswith(nic + ":"))


def _leaf_port(cable: str) -> str:
    return next(p for p in cable.split("|") if p.startswith("leaf"))


def _run(runner: TwinChecks, kind: str, resource: str, t_s: float) -> CheckOutcome:
    req = CheckRequest(kind, resource, int(t_s * NS))
    done = runner.start(req)
    assert done == req.requested_ns + CHECK_KINDS[kind].latency_ns
    return runner.finish(req)


def test_the_twin_serves_the_negotiated_speed_of_a_degraded_link(fabric: Fabric) -> None:
    nic = fabric.nic_of_gpu("host0001", 2).id
    cable = _access(fabric, nic)
    twin = Twin(fabric, clock=SimClock(0),
                faults=FaultSchedule.of([Fault("link-degraded", cable, 10 * NS, None, {"factor": 0.25})]))
    port, other = _leaf_port(cable), _leaf_port(_uplink(fabric))
    twin.advance_to(20 * NS)
    for p, want in ((port, speed_identity(100e9)), (other, speed_identity(400e9))):
        leaves = {lf.path.rsplit("/", 1)[1]: lf for lf in twin.leaves(p.split(":")[0])
                  if f"[name={p.split(':')[1]}]" in lf.path and "speed" in lf.path}
        neg, cfg = twin.read([leaves["negotiated-port-speed"], leaves["port-speed"]])
        assert (neg, cfg) == (want, "SPEED_400GB")
    assert speed_identity(400e9 * 0.27) == "SPEED_100GB" and speed_identity(5e8) == "SPEED_UNKNOWN"


def test_port_counters_see_a_gray_link_and_decide_a_healthy_one(fabric: Fabric) -> None:
    up = _uplink(fabric)
    a, b = up.split("|")
    spec = ScenarioSpec(fabric, [Fault("gray-loss", f"{a}->{b}", 10 * NS, None, {"loss": 0.01})], 60, 3)
    runner = TwinChecks(spec)
    out = _run(runner, "port-counters", up, 20)
    assert [(o.source, o.kind, o.subject) for o in out.present] == [
        ("telemetry", "error-counter-increase", b)]  # the receiver of a->b counts the FCS errors
    assert out.present[0].finding.window == (20 * NS, out.done_ns)
    assert set(out.decided) == {("telemetry", f) for f in CHECK_KINDS["port-counters"].decides}
    clean = TwinChecks(ScenarioSpec(fabric, [], 60, 3))  # the same cable without the fault
    assert _run(clean, "port-counters", up, 20).present == ()
    with pytest.raises(ConfigError, match="time went back"):
        _run(runner, "port-counters", up, 5)


def test_port_counters_see_a_flap_and_leave_link_down_undecided(fabric: Fabric) -> None:
    """A flapping link (down half of every second): the check counts its carrier
    transitions (a flap, present) and, the link having changed state while it read, does
    not decide link-down absent; a link that stays down is link-down, no flap."""
    up = _uplink(fabric)
    flap = _run(TwinChecks(ScenarioSpec(fabric, [Fault("link-flap", up, 10 * NS, None, {})], 60, 3)),
                "port-counters", up, 20.2)
    assert {(o.kind, o.subject) for o in flap.present if o.kind == "link-flap"} == {
        ("link-flap", p) for p in up.split("|")}
    assert ("telemetry", "link-down") not in flap.decided
    assert ("telemetry", "link-flap") not in flap.decided  # present only: never decided absent
    down = _run(TwinChecks(ScenarioSpec(fabric, [Fault("link-down", up, 10 * NS, None, {})], 60, 3)),
                "port-counters", up, 20.2)
    assert {o.kind for o in down.present} == {"link-down"}
    assert ("telemetry", "link-down") in down.decided


def test_a_cable_with_a_host_end_decides_only_what_the_switch_sees(fabric: Fabric) -> None:
    cable = _access(fabric, fabric.nic_of_gpu("host0002", 0).id)
    out = _run(TwinChecks(ScenarioSpec(fabric, [], 60, 3)), "port-counters", cable, 10)
    assert out.decided == (("telemetry", "link-down"),) and out.present == ()


def test_dom_check_tells_a_fading_optic_from_a_healthy_one(fabric: Fabric) -> None:
    port = _leaf_port(_uplink(fabric))
    f = Fault("optic-degrading", port, 0, None, {"rate": 1.0, "accel": 6000.0})
    runner = TwinChecks(ScenarioSpec(fabric, [f], 120, 3))
    out = _run(runner, "dom", port, 60)  # 6000 x 60 s ~ 4 dB/day-equivalents: several dB
    assert [o.kind for o in out.present if o.subject == port][:1] == ["optic-degrading"]
    assert ("optics", "optic-degrading") in out.decided
    other = _leaf_port([lk for lk in fabric.links if "spine" in lk.b][5].id)
    assert _run(runner, "dom", other, 70).present == ()


def test_a_checked_absence_is_evidence_against_a_hypothesis(fabric: Fabric) -> None:
    kb = load_kb()
    rmap = ResourceMap(fabric)
    team = specialists(kb, rmap)
    up = _uplink(fabric)
    a, b = up.split("|")
    obs = Observed("probe", Finding("gray-link", f"{a}->{b}", 0.9, (30 * NS, 35 * NS)), 35 * NS)
    idx = FindingIndex(rmap)
    idx.add(obs)
    h = Hypothesis(up, "gray-link", "link")
    before = team["link"].assess(h, idx, COV, onset_ns=30 * NS, now_ns=36 * NS)
    assert team["link"].checks_for(h, idx, 36 * NS) == ("port-counters",)
    req = CheckRequest("port-counters", up, 36 * NS)
    idx.record(CheckOutcome(req, 37 * NS, (), (("telemetry", "error-counter-increase"),), (up,)))
    after = team["link"].assess(h, idx, COV, onset_ns=30 * NS, now_ns=38 * NS)
    assert after.log_odds < before.log_odds - 1.0  # likelihood 0.8: (1 - 0.8) / (1 - q)
    assert any(c.result == "excludes" and "active check port-counters" in c.detail
               for c in after.checks)
    assert team["link"].checks_for(h, idx, 38 * NS) == ()
    # an answer older than the TTL no longer stands
    assert not idx.checked_absent("telemetry", "error-counter-increase", up, 400 * NS)


def _slow_nic_alarm(nic: str, t_s: int) -> Observed:
    return Observed("straggler", Finding("slow-nic", nic, 0.9, (t_s * NS, t_s * NS)), t_s * NS)


def test_coordinator_checks_concurrently_the_tree_one_after_another(fabric: Fabric) -> None:
    """A slow NIC that is really its access link at a quarter of its rate (issue 15, gap e):
    both procedures find it only through the port-speed check; the coordinator runs its
    checks at once and answers after the cheapest decisive one, the tree walks them in order."""
    kb = load_kb()
    rmap = ResourceMap(fabric)
    nic = fabric.nic_of_gpu("host0003", 1).id
    cable = _access(fabric, nic)
    spec = ScenarioSpec(fabric, [Fault("link-degraded", cable, 20 * NS, None, {"factor": 0.25})], 120, 5)
    found = [_slow_nic_alarm(nic, 40)]
    end = 120 * NS

    passive = Correlator(rmap, kb, COV)
    replay(found, _CoordinatorSide(passive, None), None, tick_ns=5 * NS, end_ns=end)
    assert [rc.key for i in passive.incidents() for rc in i.root_causes][:1] == [(nic, "slow-nic")]

    corr = Correlator(rmap, kb, COV, params=CorrelatorParams(active_checks=True))
    ours = TwinChecks(spec)
    tl, _ = replay(found, _CoordinatorSide(corr, None), ours, tick_ns=5 * NS, end_ns=end)
    pair = (cable, "link-degraded")
    t_ours = next(t for t, ps in tl if pair in ps)
    assert t_ours == 40 * NS + CHECK_KINDS["port-speed"].latency_ns
    assert {k for k, r, *_ in ours.log if r == cable} >= {"port-speed"}
    assert all(s == 40 * NS for *_, s, _ in ours.log)  # every check started at once
    inc = corr.incidents()[0]
    assert inc.root_causes[0].key == pair
    assert any(a.startswith("checked: port-speed on " + cable) and "speed-degraded" in a
               for a in inc.actions)

    tree = TwinChecks(spec)
    walker = TreeWalker(kb, lambda s, k: rmap.resources(s, k))
    tl_b, _ = replay(found, TreeSide(walker), tree, tick_ns=5 * NS, end_ns=end)
    t_tree = next(t for t, ps in tl_b if pair in ps)
    # slow-nic has nothing to check; link-degraded's checks in the tree's order, one after
    # another until one confirms it (port-counters: the leaf's egress into the slower link
    # queues and drops)
    order = list(kinds_for(kb.types["link-degraded"]))
    ran = [k for k, *_ in tree.log]
    assert ran == order[:len(ran)] and ran
    assert all(tree.log[i + 1][2] == tree.log[i][3] for i in range(len(ran) - 1))
    assert t_tree == 40 * NS + sum(CHECK_KINDS[k].latency_ns for k in ran)
    assert t_ours < t_tree
    assert f"confirmed by check {ran[-1]}" in walker.root_causes()[0].evidence[0]


def test_without_checks_the_tree_is_the_alarm_by_alarm_tree(fabric: Fabric) -> None:
    kb = load_kb()
    rmap = ResourceMap(fabric)
    nic = fabric.nic_of_gpu("host0003", 1).id
    walker = TreeWalker(kb, lambda s, k: rmap.resources(s, k), checks=False)
    tl, _ = replay([_slow_nic_alarm(nic, 40)], TreeSide(walker), None, tick_ns=5 * NS,
                   end_ns=60 * NS)
    assert tl[-1] == (40 * NS, [(nic, "slow-nic")])


def test_a_similar_past_case_raises_its_type_and_is_cited(fabric: Fabric) -> None:
    from fabricscope.diagnosis.cases import Case, CaseBase, signature_of
    from fabricscope.diagnosis.coordinator import diagnose

    kb = load_kb()
    rmap = ResourceMap(fabric)
    team = specialists(kb, rmap)
    up = _uplink(fabric)
    a, b = up.split("|")
    # probe loss alone: a gray link, not yet certain (its counters are not in yet)
    obs = [Observed("probe", Finding("gray-link", f"{a}->{b}", 0.9, (30 * NS, 35 * NS)), 35 * NS)]

    def run(cases: CaseBase | None) -> tuple[float, tuple[str, ...]]:
        idx = FindingIndex(rmap)
        for o in obs:
            idx.add(o)
        d = diagnose(obs, team, idx, COV, now_ns=36 * NS, cases=cases)
        top = d.root_causes[0]
        assert top.key == (up, "gray-link")
        return top.probability, top.evidence

    p0, ev0 = run(None)
    sig = signature_of(obs, up)
    past = Case("case-past-gray", "gray link", "gray-link", "cable", tuple(sorted(sig.items())),
                "reseated the cable", "2026-11")
    other = Case("case-other", "aging optic", "optic-aging", "port", tuple(sorted(sig.items())),
                 "replaced the optic", "2026-10")
    p1, ev1 = run(CaseBase([past, other]))
    assert p0 < 0.99 and p1 > p0 and not any("past case" in e for e in ev0)
    assert any("similar past case case-past-gray (similarity 1.00" in e for e in ev1)
    # a case of another type, or one too unlike, changes nothing
    far = Case("case-far", "gray", "gray-link", "cable",
               ((("straggler", "slow-gpu", "near"), 1.0),), "x", "")
    assert run(CaseBase([other, far]))[0] == p0
