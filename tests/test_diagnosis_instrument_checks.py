"""Active checks that read the prober and the trace store: a probe burst toward a suspect host
decides CPU starvation, the straggler analysis run on demand decides a slow GPU, and the
instruments' early suspicions get them checked before the alarms."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.diagnosis.checks import (
    CHECK_KINDS,
    CHECKABLE,
    TRACE_WINDOW_NS,
    CheckOutcome,
    kinds_for,
)
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import CorrelatorParams
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.suspicions import SuspicionGate, is_suspicion, suspicion
from fabricscope.fabric.builders import fat_tree_fabric, leaf_spine_fabric, rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.service.instruments import Instrument, ScenarioSpec
from fabricscope.service.instruments.checks import BURST_PROBES, TwinChecks
from fabricscope.service.instruments.probe import ProbeInstrument
from fabricscope.service.instruments.straggler import (
    StragglerInstrument,
    iteration_slowdown,
    rank_slowdown,
    transfer_slowdown,
)
from fabricscope.service.supervise_twin import LoopResult, run_loop
from fabricscope.sim.faults import Fault
from fabricscope.straggler.analysis import Options
from fabricscope.twin.tracegen import TRACE_T0_NS, TwinJob
from test_diagnosis_checks import _run

NS = 1_000_000_000


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return rail_optimized_fabric(8)


def _starved(host: str, onset_s: float, delay_ns: float = 1e6) -> Fault:
    return Fault("cpu-starved", host, int(onset_s * NS), None, {"delay_ns": delay_ns})


def test_the_burst_check_reads_hosts_and_decides_cpu_starvation() -> None:
    kb = load_kb()
    assert {"host", "nic", "gpu"} <= CHECKABLE
    assert CHECK_KINDS["probe-burst"].resources == frozenset({"host", "nic", "cable", "switch"})
    assert kinds_for(kb.types["cpu-starved-host"]) == ("probe-burst",)
    assert kinds_for(kb.types["nic-fault"]) == ("probe-burst", "trace-window")
    assert kinds_for(kb.types["slow-gpu"]) == ("trace-window",)
    # the straggler analysis run now decides a slow NIC too
    assert kinds_for(kb.types["slow-nic"]) == ("trace-window",)


@pytest.mark.parametrize("delay_ns", [3e5, 2e6])
def test_a_burst_sees_a_starved_host_and_clears_a_healthy_one(fabric: Fabric,
                                                              delay_ns: float) -> None:
    spec = ScenarioSpec(fabric, [_starved("host0001", 10, delay_ns)], 60, 3)
    runner = TwinChecks(spec)
    before = _run(runner, "probe-burst", "host0001", 5)  # before the onset
    assert before.present == () and before.decided == (("probe", "cpu-starved"),)
    after = _run(runner, "probe-burst", "host0001", 20)
    assert [(o.source, o.kind, o.subject) for o in after.present] == [
        ("probe", "cpu-starved", "host0001")]
    f = after.present[0].finding
    assert f.window == (20 * NS, after.done_ns) and f.details["active"] == 1
    assert f.details["samples"] >= BURST_PROBES * 0.9  # replies of the burst, not the mesh
    healthy = _run(runner, "probe-burst", "host0002", 25)  # same scenario, another host
    assert healthy.present == () and healthy.decided == (("probe", "cpu-starved"),)
    assert [e[0] for e in runner.log] == ["probe-burst"] * 3


def test_a_burst_toward_a_host_with_a_faulty_nic_does_not_call_it_starved(fabric: Fabric) -> None:
    nic = fabric.nic_of_gpu("host0001", 2).id
    spec = ScenarioSpec(fabric, [Fault("nic-fault", nic, 10 * NS, None, {"loss": 0.1})], 60, 3)
    out = _run(TwinChecks(spec), "probe-burst", "host0001", 20)
    assert out.present == () and out.decided == (("probe", "cpu-starved"),)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_nic_burst_with_leaf_controls_tells_the_nic_from_its_link_and_leaf(
        fabric: Fabric, seed: int) -> None:
    nic = fabric.nic_of_gpu("host0001", 2).id
    cable = next(lk for lk in fabric.links if lk.a.startswith(nic + ":") or lk.b.startswith(nic + ":"))
    leaf = next(p for p in (cable.a, cable.b) if not p.startswith(nic + ":")).rsplit(":", 1)[0]

    def burst(fault: Fault | None) -> CheckOutcome:
        spec = ScenarioSpec(fabric, [fault] if fault else [], 60, seed)
        return _run(TwinChecks(spec), "probe-burst", nic, 20)

    bad = burst(Fault("nic-fault", nic, 10 * NS, None, {"loss": 0.05}))
    assert [(o.kind, o.subject) for o in bad.present] == [("nic-fault", nic)]
    assert bad.decided == (("probe", "nic-fault"),)
    for other in (Fault("gray-loss", f"{cable.a}->{cable.b}", 10 * NS, None, {"loss": 0.03}),
                  Fault("switch-fault", leaf, 10 * NS, None, {"loss": 0.03}), None):
        out = burst(other)  # the NIC's own link one way, its leaf, nothing: not the NIC
        assert out.present == (), other
        # a one-way loss on the NIC's own (only) link may leave the analysis ambiguous
        # between the two: then undecided, never decided absent on the NIC's paths' loss
        one_way = other is not None and other.kind == "gray-loss"
        assert out.decided in ((("probe", "nic-fault"),), ()) if one_way else \
            out.decided == (("probe", "nic-fault"),), other
    faint = burst(Fault("nic-fault", nic, 10 * NS, None, {"loss": 0.01}))
    assert faint.present == () and faint.decided == ()  # ambiguous: left undecided


def test_the_gate_answers_a_host_suspicion_with_a_burst(fabric: Fabric) -> None:
    gate = SuspicionGate(load_kb(), ResourceMap(fabric))
    s = suspicion("probe", "cpu-starved", "host0003", 30 * NS, (24 * NS, 29 * NS),
                  statistic="newest step's responder times", value=0.9, early=0.0, alarm=0.99,
                  evidence="test")
    assert gate.targets(s) == {"host0003": ("probe-burst",)}
    gate.offer(s)
    due = gate.due(30 * NS)
    assert [(r.kind, r.resource) for r in due] == [("probe-burst", "host0003")]


def test_the_instrument_suspects_a_starved_host_before_its_window_alarms(fabric: Fabric) -> None:
    spec = ScenarioSpec(fabric, [_starved("host0002", 31.0)], 90.0, 4)
    out = ProbeInstrument(suspicions=True).run(spec)
    sus = [o for o in out if is_suspicion(o) and o.subject == "host0002"]
    alarm = [o for o in out if not is_suspicion(o) and o.kind == "cpu-starved"]
    assert sus and alarm and all(o.subject == "host0002" for o in alarm)
    first = min(o.reported_ns for o in sus)
    assert sus[0].finding.details["anticipates"] == "cpu-starved"
    assert first < alarm[0].reported_ns - 10 * NS  # the window's median moves ~15 s later
    assert first > 31 * NS  # causal: not before the onset
    healthy = ProbeInstrument(suspicions=True).run(ScenarioSpec(fabric, [], 90.0, 4))
    assert not any(is_suspicion(o) or o.kind == "cpu-starved" for o in healthy)


def _on_off(spec: ScenarioSpec, ins: list[Instrument], pair: tuple[str, str],
            straggler: StragglerInstrument | None = None) -> tuple[LoopResult, LoopResult, int, int]:
    """The loop with the suspicion channel and again without it (the same findings); both
    name ``pair`` alone; (on, off, first named on, first named off)."""
    on = run_loop(spec, ins, checks=TwinChecks(spec, straggler=straggler))
    off = run_loop(spec, ins, checks=TwinChecks(spec, straggler=straggler),
                   findings=on.findings + on.suspicions, params=CorrelatorParams(suspicions=None))
    assert on.predicted() == [pair] and off.predicted() == [pair]
    t_on, t_off = on.first_named(pair), off.first_named(pair)
    assert t_on is not None and t_off is not None
    return on, off, t_on, t_off


@pytest.mark.parametrize(("host", "onset_s", "seed"), [("host0001", 33.3, 1), ("host0003", 47.9, 2)])
def test_the_loop_names_a_starved_host_from_the_burst_earlier(fabric: Fabric, host: str,
                                                              onset_s: float, seed: int) -> None:
    spec = ScenarioSpec(fabric, [_starved(host, onset_s)], 120.0, seed)
    pair = (host, "cpu-starved-host")
    on, _off, t_on, t_off = _on_off(spec, [ProbeInstrument(suspicions=True)], pair)
    assert t_on < t_off - 10 * NS
    assert on.suspicion_stats["confirmed"] == 1 and on.suspicion_stats["limited"] == 0
    inc = next(i for i in on.incidents if pair in [rc.key for rc in i.root_causes])
    assert not {o.id for o in on.suspicions} & set(inc.findings)
    assert any(a.startswith(f"checked: probe-burst on {host} (for a suspicion)") for a in inc.actions)


# -- the straggler analysis on demand (trace-window) ------------------------------------------

def _job_gpus(fabric: Fabric) -> list[str]:
    return StragglerInstrument().job_gpus(ScenarioSpec(fabric, [], 60, 1))


def test_iteration_slowdown_is_rank_slowdown_per_iteration(fabric: Fabric) -> None:
    g = _job_gpus(fabric)[7]
    spec = ScenarioSpec(fabric, [Fault("slow-gpu", g, 10 * NS, None, {"factor": 1.5})], 30, 2)
    jt = StragglerInstrument().job_trace(spec)
    world = jt.job.world_size
    got = iteration_slowdown(jt.trace, world)
    for it in (0, 5, len(got) - 1):
        want = rank_slowdown(jt.trace, jt.trace.iteration == it, world)
        assert got[it] == pytest.approx(want, nan_ok=True)
    assert np.nanmax(got[-1]) == pytest.approx(got[-1][_job_gpus(fabric).index(g)])


def test_the_straggler_instrument_suspects_a_slow_gpu_before_its_analysis(fabric: Fabric) -> None:
    g = _job_gpus(fabric)[-5]
    spec = ScenarioSpec(fabric, [Fault("slow-gpu", g, int(47.9 * NS), None, {"factor": 1.8})],
                        120.0, 2)
    out = StragglerInstrument(suspicions=True).run(spec)
    sus = [o for o in out if is_suspicion(o)]
    named = min(o.reported_ns for o in out if o.kind == "slow-gpu" and o.subject == g)
    assert sus and {o.subject for o in sus} == {g}
    assert sus[0].finding.details["anticipates"] == "slow-gpu"
    assert 47.9 * NS < sus[0].reported_ns < named - 3 * NS  # two slow iterations, not eight
    assert all(o.reported_ns < named for o in sus)  # none once the analysis has named it
    healthy = StragglerInstrument(suspicions=True).run(ScenarioSpec(fabric, [], 120.0, 2))
    assert not any(is_suspicion(o) for o in healthy)


def test_the_trace_window_check_runs_the_analysis_now(fabric: Fabric) -> None:
    gpus = _job_gpus(fabric)
    g = gpus[-5]
    spec = ScenarioSpec(fabric, [Fault("slow-gpu", g, int(47.9 * NS), None, {"factor": 1.8})],
                        120.0, 2)
    runner = TwinChecks(spec)
    before = _run(runner, "trace-window", g, 40)
    assert before.present == () and before.decided == (("straggler", "slow-gpu"),)
    after = _run(runner, "trace-window", g, 52)  # ~3 slow iterations done
    assert [(o.source, o.kind, o.subject) for o in after.present] == [("straggler", "slow-gpu", g)]
    other = next(x for x in ("host0007/gpu7", "host0006/gpu0") if x not in gpus)
    outside = _run(runner, "trace-window", other, 53)  # a GPU the job does not use
    assert outside.present == () and outside.decided == ()


def test_the_loop_names_a_slow_gpu_at_its_suspicion_not_at_the_next_analysis(
        fabric: Fabric) -> None:
    g = _job_gpus(fabric)[-5]
    spec = ScenarioSpec(fabric, [Fault("slow-gpu", g, int(47.9 * NS), None, {"factor": 1.8})],
                        120.0, 2)
    ins = [StragglerInstrument(suspicions=True)]
    runner = TwinChecks(spec)
    on = run_loop(spec, ins, checks=runner)
    off = run_loop(spec, ins, checks=TwinChecks(spec), findings=on.findings + on.suspicions,
                   params=CorrelatorParams(suspicions=None))
    pair = (g, "slow-gpu")
    t_on, t_off = on.first_named(pair), off.first_named(pair)
    assert on.predicted() == [pair] and t_on is not None and t_off is not None
    assert t_on < t_off - 3 * NS
    # the suspicion came between two 5 s ticks and its check started at once, not at a tick
    first = on.suspicions[0].reported_ns
    assert first % (5 * NS) and ("trace-window", g, first, first + TRACE_WINDOW_NS) in runner.log


@pytest.mark.parametrize("shape", ["leaf-spine", "fat-tree"])
def test_bursts_decide_on_other_fabric_shapes(shape: str) -> None:
    """The host and NIC bursts on shapes other than the rail-optimized benchmark fabric: a
    starved host and a faulty NIC are named, a one-way gray access link is never a NIC
    fault (named a gray link, or left undecided when the burst is ambiguous)."""
    fab = (leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=2) if shape == "leaf-spine"
           else fat_tree_fabric(k=4))
    host = fab.hosts[3].id
    nic = fab.nics_of_host[host][0].id
    cable = next(lk for lk in fab.links if lk.a.startswith(nic + ":") or lk.b.startswith(nic + ":"))
    for seed in (1, 2):
        def burst(fault: Fault | None, resource: str, seed: int = seed) -> CheckOutcome:
            spec = ScenarioSpec(fab, [fault] if fault else [], 60, seed)
            return _run(TwinChecks(spec), "probe-burst", resource, 20)

        starved = burst(_starved(host, 10, 5e5), host)
        assert [(o.kind, o.subject) for o in starved.present] == [("cpu-starved", host)]
        assert burst(None, host).present == ()
        bad = burst(Fault("nic-fault", nic, 10 * NS, None, {"loss": 0.05}), nic)
        assert [(o.kind, o.subject) for o in bad.present] == [("nic-fault", nic)]
        gray = burst(Fault("gray-loss", f"{cable.a}->{cable.b}", 10 * NS, None, {"loss": 0.03}), nic)
        assert gray.present == () and gray.decided in ((("probe", "nic-fault"),), ())
        clean = burst(None, nic)
        assert clean.present == () and clean.decided == (("probe", "nic-fault"),)


# -- probe bursts through a cable or a switch ---------------------------------------------------

def _spine_link(fabric: Fabric) -> tuple[str, str, str]:
    """(cable id, leaf end port, spine end port) of the first leaf-spine cable."""
    for lk in fabric.links:
        a, b = (fabric.devices[p.rsplit(":", 1)[0]] for p in (lk.a, lk.b))
        if a.is_switch and b.is_switch:
            return (lk.id, lk.a, lk.b) if a.tier < b.tier else (lk.id, lk.b, lk.a)
    raise AssertionError("no switch-to-switch cable")


def test_the_burst_now_reads_cables_and_switches() -> None:
    kb = load_kb()
    assert {"cable", "switch"} <= CHECK_KINDS["probe-burst"].resources
    assert "probe-burst" in kinds_for(kb.types["gray-link"])
    assert kinds_for(kb.types["switch-fault"]) == ("probe-burst",)
    # on a cable or switch the burst decides presence only; a tree can walk without it
    assert CHECK_KINDS["probe-burst"].presence_only == frozenset({"cable", "switch"})
    assert kinds_for(kb.types["switch-fault"], presence_only=False) == ()
    assert "probe-burst" not in kinds_for(kb.types["gray-link"], presence_only=False)
    assert kinds_for(kb.types["nic-fault"], presence_only=False) == ("probe-burst", "trace-window")


def test_a_cable_burst_with_end_switch_controls_names_a_gray_link_not_its_switches(
        fabric: Fabric) -> None:
    cable, leaf_end, spine_end = _spine_link(fabric)
    leaf, spine = (p.rsplit(":", 1)[0] for p in (leaf_end, spine_end))

    def burst(fault: Fault | None, seed: int) -> CheckOutcome:
        spec = ScenarioSpec(fabric, [fault] if fault else [], 60, seed)
        return _run(TwinChecks(spec), "probe-burst", cable, 20)

    named = 0
    for seed in (1, 2, 3, 4):
        for edge in (f"{leaf_end}->{spine_end}", f"{spine_end}->{leaf_end}"):
            bad = burst(Fault("gray-loss", edge, 10 * NS, None, {"loss": 0.02}), seed)
            # ~10 of the ~500 probes through the cable are lost: named, or (a few losses
            # only) ambiguous and so nothing; never another subject
            assert [(o.kind, o.subject) for o in bad.present] in ([("gray-link", edge)], []), edge
            assert bad.decided == ()  # present only: a faint loss can hide in one burst
            named += len(bad.present)
            assert all(o.finding.details["active"] == 1 for o in bad.present)
        for other in (Fault("switch-fault", spine, 10 * NS, None, {"loss": 0.02}),
                      Fault("switch-fault", leaf, 10 * NS, None, {"loss": 0.02}), None):
            out = burst(other, seed)  # one of its end switches, or nothing: not the cable
            assert out.present == () and out.decided == (), other
    assert named >= 6  # of 8


@pytest.mark.parametrize("seed", [1, 2])
def test_a_switch_burst_with_neighbour_controls_names_the_switch_not_one_of_its_links(
        fabric: Fabric, seed: int) -> None:
    _cable, leaf_end, spine_end = _spine_link(fabric)
    spine = spine_end.rsplit(":", 1)[0]

    def burst(fault: Fault | None) -> CheckOutcome:
        spec = ScenarioSpec(fabric, [fault] if fault else [], 60, seed)
        return _run(TwinChecks(spec), "probe-burst", spine, 20)

    bad = burst(Fault("switch-fault", spine, 10 * NS, None, {"loss": 0.02}))
    assert [(o.kind, o.subject) for o in bad.present] == [("switch-fault", spine)]
    assert "probes for " + spine in bad.detail
    for other in (Fault("gray-loss", f"{leaf_end}->{spine_end}", 10 * NS, None, {"loss": 0.03}),
                  None):
        out = burst(other)
        assert out.present == () and out.decided == (), other


@pytest.mark.parametrize(("loss", "onset_s", "seed"), [(0.02, 33.3, 1), (0.04, 41.9, 2)])
def test_the_loop_names_a_gray_link_from_the_burst_before_the_tracker_opens(
        fabric: Fabric, loss: float, onset_s: float, seed: int) -> None:
    cable, leaf_end, spine_end = _spine_link(fabric)
    edge = f"{spine_end}->{leaf_end}"
    spec = ScenarioSpec(fabric, [Fault("gray-loss", edge, int(onset_s * NS), None,
                                       {"loss": loss})], 120.0, seed)
    on, _off, t_on, t_off = _on_off(spec, [ProbeInstrument(suspicions=True)], (cable, "gray-link"))
    assert t_on <= t_off - 3 * NS  # one probe step (5 s) less the burst's 1.5 s
    assert on.suspicion_stats["confirmed"] >= 1


# -- a slow NIC: its ring's transfer, then the analysis on demand ------------------------------

@pytest.fixture(scope="module")
def fabric32() -> Fabric:
    """The benchmark's shape: its 128-GPU job's data-parallel rings cross hosts (on 8
    servers every ring stays inside one host and only NVLink carries it)."""
    return rail_optimized_fabric(32)


def _job_nics(fabric: Fabric, ins: StragglerInstrument) -> list[str]:
    jt = ins.job_trace(ScenarioSpec(fabric, [], 60.0, 1))
    return sorted(set(jt.devices.nic.values()))


def test_a_slow_nic_slows_its_rings_transfer_and_only_that(fabric32: Fabric) -> None:
    fabric = fabric32
    ins = StragglerInstrument()
    nic = _job_nics(fabric, ins)[3]
    rel = 1.0 + Options().comm_rel
    healthy, _ = transfer_slowdown(ins.job_trace(ScenarioSpec(fabric, [], 60.0, 2)).trace)
    assert healthy.size and np.nanmax(healthy) < rel
    spec = ScenarioSpec(fabric, [Fault("slow-nic", nic, 20 * NS, None, {"factor": 0.4})], 60.0, 2)
    jt = ins.job_trace(spec)
    ratio, groups = transfer_slowdown(jt.trace)
    after = jt.it_end - TRACE_T0_NS > 22 * NS
    slow_cols = np.flatnonzero(np.nanmin(ratio[after], axis=0) > rel)
    assert slow_cols.size >= 1  # the rings through the NIC, every iteration after the onset
    for c in slow_cols:
        ranks = jt.trace.groups[groups[c]]
        assert nic in {jt.devices.nic[r] for r in ranks}
    others = np.setdiff1d(np.arange(ratio.shape[1]), slow_cols)
    assert np.nanmax(ratio[:, others]) < rel


@pytest.mark.parametrize(("factor", "seed"), [(0.4, 1), (0.15, 2)])
def test_the_loop_names_a_slow_nic_from_its_ring_before_the_next_analysis(
        fabric32: Fabric, factor: float, seed: int) -> None:
    fabric = fabric32
    ins = StragglerInstrument(suspicions=True)
    nic = _job_nics(fabric, ins)[5]
    spec = ScenarioSpec(fabric, [Fault("slow-nic", nic, 31 * NS, None, {"factor": factor})],
                        90.0, seed)
    on, _off, t_on, t_off = _on_off(spec, [ins], (nic, "slow-nic"), straggler=ins)
    assert t_on < t_off - 5 * NS
    sus = on.suspicions
    assert sus and all(o.finding.details["anticipates"] == "slow-nic" for o in sus)
    assert all(nic in o.subject.split(" | ") for o in sus)  # the NIC's ring, never another
    assert min(o.reported_ns for o in sus) > 31 * NS
    healthy = ins.run(ScenarioSpec(fabric, [], 90.0, seed))
    assert not any(is_suspicion(o) for o in healthy)


@pytest.mark.parametrize("shape", ["leaf-spine", "fat-tree"])
def test_path_bursts_decide_on_other_fabric_shapes(shape: str) -> None:
    """Cable and switch bursts beyond the rail-optimized benchmark fabric: a lossy upper
    switch is named; a one-way gray uplink is named, or (fat-tree: the sampled flows through
    a ToR-aggregation link may all go on over one aggregation-core link) left as the tie the
    analysis reports, never named on another link; the uplink's end switch is not the
    uplink; nothing is named on a healthy fabric."""
    fab = (leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=2) if shape == "leaf-spine"
           else fat_tree_fabric(k=4))
    cable, low_end, top_end = _spine_link(fab)
    top = top_end.rsplit(":", 1)[0]
    named = 0
    for seed in (1, 2, 3):
        def burst(fault: Fault | None, resource: str, seed: int = seed) -> CheckOutcome:
            spec = ScenarioSpec(fab, [fault] if fault else [], 60, seed)
            return _run(TwinChecks(spec), "probe-burst", resource, 20)

        bad = burst(Fault("switch-fault", top, 10 * NS, None, {"loss": 0.03}), top)
        assert [(o.kind, o.subject) for o in bad.present] == [("switch-fault", top)]
        for edge in (f"{low_end}->{top_end}", f"{top_end}->{low_end}"):
            gray = burst(Fault("gray-loss", edge, 10 * NS, None, {"loss": 0.03}), cable)
            assert [(o.kind, o.subject) for o in gray.present] in ([("gray-link", edge)], [])
            assert edge in gray.detail  # named alone, or in the analysis' tie
            named += len(gray.present)
        not_cable = burst(Fault("switch-fault", top, 10 * NS, None, {"loss": 0.03}), cable)
        assert not_cable.present == () and not_cable.decided == ()
        for r in (top, cable):
            clean = burst(None, r)
            assert clean.present == () and clean.decided == ()
    assert named >= (6 if shape == "leaf-spine" else 4)  # of 6


def test_a_slow_nic_ring_is_suspected_on_another_fabric_and_job_shape() -> None:
    """A leaf-spine fabric with one GPU per host and a DP8 x PP2 job (no tensor
    parallelism, 2 rings of 8 NICs): the ring of a NIC at 0.3x is suspected within a few
    iterations, long before the scheduled analysis names the NIC; a healthy run, nothing."""
    fab = leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=2)
    job = TwinJob(dp=8, tp=1, pp=2, microbatches=4, iterations=1, fwd_ns=50_000_000,
                  bwd_ns=100_000_000, optimizer_ns=12_500_000, grad_bytes=float(8 << 30))
    ins = StragglerInstrument(job=job, suspicions=True)
    nic = _job_nics(fab, ins)[3]
    out = ins.run(ScenarioSpec(fab, [Fault("slow-nic", nic, 20 * NS, None, {"factor": 0.3})],
                               60.0, 2))
    sus = [o for o in out if is_suspicion(o)]
    named = [o.reported_ns for o in out if not is_suspicion(o) and (o.kind, o.subject) == (
        "slow-nic", nic)]
    assert sus and named
    assert all(nic in o.subject.split(" | ") for o in sus)
    assert 20 * NS < sus[0].reported_ns < named[0] - 10 * NS
    assert not any(is_suspicion(o) for o in ins.run(ScenarioSpec(fab, [], 60.0, 2)))
