"""The straggler instrument on a small twin: the right device after onset, only the job's."""

from __future__ import annotations

import itertools

import pytest

from fabricscope.diagnosis.model import Observed
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.instruments import Instrument, ScenarioSpec
from fabricscope.service.instruments.straggler import StragglerInstrument
from fabricscope.sim.faults import Fault
from fabricscope.twin.tracegen import TwinJob, nominal_iteration_ns

S = 1_000_000_000
ONSET = 60 * S
DURATION_S = 180.0


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    # 16 servers x 4 GPUs; the default job takes half: DP4 x TP2 x PP4 on host0000-host0007.
    return rail_optimized_fabric(16, gpus_per_server=4, radix=16)


@pytest.fixture(scope="module")
def inst() -> StragglerInstrument:
    return StragglerInstrument()


def run(inst: StragglerInstrument, fabric: Fabric, faults: list[Fault], *,
        seed: int = 2) -> list[Observed]:
    return inst.run(ScenarioSpec(fabric, faults, DURATION_S, seed=seed))


def keys(obs: list[Observed]) -> list[tuple[str, str]]:
    """(kind, subject) of each distinct finding (refreshes reuse their finding's id)."""
    seen: dict[str, tuple[str, str]] = {}
    for o in obs:
        seen.setdefault(o.id, (o.kind, o.subject))
    return list(seen.values())


def test_is_an_instrument_and_names_its_gpus(inst: StragglerInstrument, fabric: Fabric) -> None:
    i: Instrument = inst
    assert i.name == "straggler"
    spec = ScenarioSpec(fabric, [], DURATION_S)
    job = inst.job_for(spec)
    gpus = inst.job_gpus(spec)
    assert (job.dp, job.tp, job.pp) == (4, 2, 4)
    assert len(gpus) == len(set(gpus)) == job.world_size == 32
    assert gpus[:5] == ["host0000/gpu0", "host0000/gpu1", "host0000/gpu2", "host0000/gpu3",
                        "host0001/gpu0"]
    assert gpus[-1] == "host0007/gpu3"


def test_slow_nic_of_the_job_is_that_nic_after_onset(inst: StragglerInstrument,
                                                     fabric: Fabric) -> None:
    # host0001 holds pipeline stage 0, whose all-reduce is on the critical path of a GPipe
    # iteration (a later stage's has the slack of stage 0's remaining backwards).
    obs = run(inst, fabric, [Fault("slow-nic", "host0001/nic2", ONSET, params={"factor": 0.5})])
    assert keys(obs) == [("slow-nic", "host0001/nic2")]
    o = obs[0]
    assert ONSET < o.reported_ns <= ONSET + 30 * S
    # Evidence starts at the onset (within an iteration) and ends by the report.
    assert ONSET - 2 * S <= o.finding.window[0] < o.finding.window[1] <= o.reported_ns
    assert o.finding.details["job"] == "twin-train"
    assert o.finding.details["ranks"] == 1
    # the slow NIC persists to the end: refreshed under its id, at least refresh_s apart
    ts = [x.reported_ns for x in obs if x.id == o.id]
    assert len(ts) >= 2 and all(b - a >= inst.refresh_s * S for a, b in itertools.pairwise(ts))


def test_slow_gpu_is_found(inst: StragglerInstrument, fabric: Fabric) -> None:
    obs = run(inst, fabric, [Fault("slow-gpu", "host0003/gpu2", ONSET, params={"factor": 1.3})])
    assert keys(obs) == [("slow-gpu", "host0003/gpu2")]
    assert ONSET < obs[0].reported_ns <= ONSET + 30 * S
    assert obs[0].finding.details["ranks"] == 1


def test_faults_outside_the_job_give_nothing(inst: StragglerInstrument, fabric: Fabric) -> None:
    outside = [Fault("slow-nic", "host0012/nic1", ONSET, params={"factor": 0.25}),
               Fault("slow-gpu", "host0013/gpu0", ONSET, params={"factor": 2.0}),
               Fault("gray-loss", "host0000/nic0:p0->leaf-p0-r0-00:eth1", 0,
                     params={"loss": 0.05})]  # not a kind the trace generator models
    assert run(inst, fabric, outside) == []


def test_fault_free_gives_nothing(inst: StragglerInstrument, fabric: Fabric) -> None:
    assert run(inst, fabric, [], seed=5) == []


def test_a_given_job_is_stretched_to_cover_the_scenario(fabric: Fabric) -> None:
    inst = StragglerInstrument(TwinJob(dp=2, tp=2, pp=2, iterations=3))
    job = inst.job_for(ScenarioSpec(fabric, [], 30.0))
    assert job.iterations > 3 and job.iterations * nominal_iteration_ns(job) > 30 * S
    assert StragglerInstrument().job_gpus(ScenarioSpec(fabric, [], 30.0)) != \
        inst.job_gpus(ScenarioSpec(fabric, [], 30.0))


@pytest.mark.parametrize("kw", [{"every_iterations": 0}, {"window_iterations": 1},
                                {"comm": "nccl"}])
def test_bad_options_are_one_config_error(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="straggler instrument"):
        StragglerInstrument(**kw)  # type: ignore[arg-type]
