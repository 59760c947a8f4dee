"""The probe instrument on a small twin: the right finding after onset, causal, quiet when clean."""

from __future__ import annotations

import itertools

import pytest

from fabricscope.diagnosis.model import Observed, finding_id
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.instruments import Instrument, ScenarioSpec
from fabricscope.service.instruments.probe import ProbeInstrument
from fabricscope.sim.faults import Fault

S = 1_000_000_000
ONSET = 60 * S
# Spine -> leaf, one direction: only the plans' rail and cross-leaf flows cross it.
SPINE_DOWN = "spine-p0-01:eth2->leaf-p0-r0-00:eth12"


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    # 64 NICs; at 20 probes/s every plan keeps its rail and cross-leaf peers (spine coverage).
    return rail_optimized_fabric(16, gpus_per_server=4, radix=16)


@pytest.fixture(scope="module")
def inst() -> ProbeInstrument:
    return ProbeInstrument()


def run(inst: ProbeInstrument, fabric: Fabric, faults: list[Fault], *, duration_s: float = 180.0,
        seed: int = 1) -> list[Observed]:
    return inst.run(ScenarioSpec(fabric, faults, duration_s, seed=seed))


def keys(obs: list[Observed]) -> list[tuple[str, str]]:
    """(kind, subject) of each distinct finding, in first-report order (refreshes of a
    finding still open carry its id and are not new findings)."""
    seen: dict[str, tuple[str, str]] = {}
    for o in obs:
        seen.setdefault(o.id, (o.kind, o.subject))
    return list(seen.values())


def test_is_an_instrument(inst: ProbeInstrument) -> None:
    i: Instrument = inst
    assert i.name == "probe"


def test_gray_loss_on_a_direction_is_that_gray_link_after_onset(
        inst: ProbeInstrument, fabric: Fabric) -> None:
    obs = run(inst, fabric, [Fault("gray-loss", SPINE_DOWN, ONSET, params={"loss": 0.02})])
    hit = [o for o in obs if (o.kind, o.subject) == ("gray-link", SPINE_DOWN)]
    assert hit, keys(obs)
    assert ONSET < hit[0].reported_ns <= ONSET + 30 * S
    # The reverse direction and everything else stay quiet; nothing before the fault.
    assert keys(obs) == [("gray-link", SPINE_DOWN)]
    assert hit[0].source == "probe" and hit[0].id == finding_id("probe", hit[0].finding)
    assert hit[0].finding.window[1] < hit[0].reported_ns


def test_cpu_starved_host_is_found(inst: ProbeInstrument, fabric: Fabric) -> None:
    obs = run(inst, fabric, [Fault("cpu-starved", "host0005", ONSET,
                                   params={"delay_ns": 2_000_000.0})])
    assert keys(obs) == [("cpu-starved", "host0005")]
    assert ONSET < obs[0].reported_ns <= ONSET + 40 * S


def test_fault_free_180_s_gives_no_finding(inst: ProbeInstrument, fabric: Fabric) -> None:
    assert run(inst, fabric, [], seed=7) == []


def test_faults_probes_do_not_see_are_ignored(inst: ProbeInstrument, fabric: Fabric) -> None:
    unseen = [Fault("slow-gpu", "host0001/gpu2", ONSET, params={"factor": 2.0}),
              Fault("optic-degrading", "leaf-p0-r0-00:eth12", 0, params={"rate": 1.0})]
    assert run(inst, fabric, unseen, seed=7) == run(inst, fabric, [], seed=7)


def test_a_later_fault_does_not_change_what_was_reported_before_it(
        inst: ProbeInstrument, fabric: Fabric) -> None:
    # Causal: a finding at t uses probes answered by t, so a switch fault from 100 s cannot
    # change anything reported before 100 s, and a shorter run is a prefix of a longer one.
    early = Fault("nic-fault", "host0002/nic1", 30 * S, params={"loss": 0.05})
    late = Fault("switch-fault", "leaf-p0-r1-01", 100 * S, params={"loss": 0.03})
    both = run(inst, fabric, [early, late], seed=3)
    only = run(inst, fabric, [early], seed=3)
    before = [o for o in both if o.reported_ns < late.start_ns]
    assert before == [o for o in only if o.reported_ns < late.start_ns]
    assert ("nic-fault", "host0002/nic1") in keys(before)
    assert ("switch-fault", "leaf-p0-r1-01") in keys(both)
    assert ("switch-fault", "leaf-p0-r1-01") not in keys(before)
    assert run(inst, fabric, [early, late], seed=3, duration_s=90.0) == \
        [o for o in both if o.reported_ns <= 90 * S]


def test_each_finding_is_reported_once_with_a_stable_id(
        inst: ProbeInstrument, fabric: Fabric) -> None:
    obs = run(inst, fabric, [Fault("switch-fault", "leaf-p0-r2-00", 20 * S,
                                   params={"loss": 0.02})])
    assert len(keys(obs)) == len(set(keys(obs))) >= 1
    again = run(inst, fabric, [Fault("switch-fault", "leaf-p0-r2-00", 20 * S,
                                     params={"loss": 0.02})])
    assert [o.id for o in again] == [o.id for o in obs]
    assert [o.reported_ns for o in obs] == sorted(o.reported_ns for o in obs)
    # a persisting fault: the finding is refreshed under its id every refresh_s, its window
    # grown to the refresh time, never as a new finding
    first = {o.id: o for o in reversed(obs)}
    refreshes = [o for o in obs if o is not first[o.id]]
    assert refreshes, "a fault lasting to the end was never refreshed"
    for o in refreshes:
        f0 = first[o.id].finding
        assert (o.kind, o.subject, o.finding.window[0]) == (f0.kind, f0.subject, f0.window[0])
        assert o.finding.window[1] == o.reported_ns
    times: dict[str, list[int]] = {}
    for o in obs:
        times.setdefault(o.id, []).append(o.reported_ns)
    gaps = [b - a for ts in times.values() for a, b in itertools.pairwise(ts)]
    assert gaps and all(g >= inst.refresh_s * S for g in gaps)


def test_mesh_and_baseline_are_built_once_per_fabric(fabric: Fabric) -> None:
    a, b = ProbeInstrument(), ProbeInstrument()
    assert a.prepared(fabric)[0] is b.prepared(fabric)[0]
    assert ProbeInstrument(rate_pps=40.0).prepared(fabric)[0] is not a.prepared(fabric)[0]


@pytest.mark.parametrize("kw", [{"rate_pps": 0.0}, {"step_s": -1.0}, {"background_loss": 1.0},
                                {"method": "vote"}])
def test_bad_options_are_one_config_error(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="probe instrument"):
        ProbeInstrument(**kw)  # type: ignore[arg-type]
