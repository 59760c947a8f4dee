"""workload_from_spec vocabulary and the DP x TP x PP job generator."""

from __future__ import annotations

import pytest
import yaml

from fabricscope.fabric.builders import fat_tree_fabric, rail_optimized_fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.workload import JobSpec, job_iteration, workload_from_spec


@pytest.fixture(scope="module")
def rail():
    return rail_optimized_fabric(8)


@pytest.fixture(scope="module")
def ft():
    return fat_tree_fabric(k=4)


def test_yaml_spec_ring(rail):
    spec = yaml.safe_load("kind: allreduce\nsize: 32MiB\nranks: 32\nplacement: random\nchannels: 2\n")
    w = workload_from_spec(rail, spec, seed=1)
    assert w.collective == "allreduce" and w.n_ranks == 32 and w.size_bytes == 32 * 2**20
    assert w.meta["channels"] == 2 and w.meta["placement"] == "random"
    again = workload_from_spec(rail, spec, seed=1)
    assert again.flows == w.flows


@pytest.mark.parametrize(
    ("spec", "n_flows"),
    [({"kind": "allreduce", "size": "8MB", "algorithm": "tree", "chunks": 2, "channels": 1}, 2 * 2 * 2 * 7),
     ({"kind": "allgather", "size": "8MB", "channels": 1}, 63 * 8),
     ({"kind": "allreduce", "size": "8MB", "steady_state": True}, 64),
     ({"kind": "alltoall", "size": "8MB", "ranks": 16}, 16 * 8),
     ({"kind": "permutation", "size": "2MB"}, 64),
     ({"kind": "incast", "size": "2MB", "senders": 5}, 5),
     ({"kind": "nic-all-to-all", "size": 100}, 64 * 63),
     ({"kind": "flows", "flows": [{"src": "host0000/nic0", "dst": "host0001/nic0", "size": "1MB"}]}, 1),
     ({"kind": "job", "dp": 2, "tp": 8, "pp": 4, "microbatches": 2}, None)],
)
def test_every_kind(rail, spec, n_flows):
    w = workload_from_spec(rail, spec, seed=0)
    if n_flows is not None:
        assert len(w.flows) == n_flows


@pytest.mark.parametrize(
    ("spec", "needle"),
    [({"size": "1MB"}, r"workload\.kind: missing"),
     ({"kind": "allgatter", "size": "1MB"}, r"workload\.kind: unknown 'allgatter'"),
     ({"kind": "allreduce", "size": "1MB", "colour": "red"}, r"workload\.colour: unknown key.*'red'"),
     ({"kind": "allreduce"}, r"workload\.size: missing"),
     ({"kind": "allreduce", "size": "lots"}, r"workload\.size.*'lots'"),
     ({"kind": "allreduce", "size": "1MB", "placement": "scattered"}, r"workload\.placement: unknown 'scattered'"),
     ({"kind": "allreduce", "size": "1MB", "channels": 0}, r"workload\.channels: expected an integer >= 1, got 0"),
     ({"kind": "allreduce", "size": "1MB", "rail_aligned": "yes"}, r"workload\.rail_aligned: expected true or false"),
     ({"kind": "allreduce", "size": "1MB", "chunks": 4}, r"workload\.chunks: only applies"),
     ({"kind": "allreduce", "size": "1MB", "algorithm": "tree", "steady_state": True}, r"steady_state: only applies"),
     ({"kind": "incast", "size": "1MB"}, r"workload\.senders: missing"),
     ({"kind": "flows"}, r"workload\.file: give exactly one"),
     ({"kind": "job", "dp": 2, "tp": 3}, r"job: tp: 3 does not divide"),
     ({"kind": "job", "dp": 2, "fwd_compute": "soon"}, r"workload\.fwd_compute.*'soon'"),
     ({"kind": "permutation", "size": "1MB", "ranks": 4}, r"workload\.ranks: unknown key for kind 'permutation'")],
)
def test_spec_errors_name_field_and_value(rail, spec, needle):
    with pytest.raises(ConfigError, match=needle):
        workload_from_spec(rail, spec, source="scenario.yaml")


def test_spec_error_names_source(rail):
    with pytest.raises(ConfigError, match=r"^scenario\.yaml: workload\.kind"):
        workload_from_spec(rail, {"kind": 3}, source="scenario.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        workload_from_spec(rail, ["kind"], source="scenario.yaml")  # type: ignore[arg-type]


def test_job_layout_is_megatron(rail):
    job = JobSpec(dp=2, tp=8, pp=4, microbatches=3, grad_bytes=8 * 2**30, activation_bytes=2**24,
                  fwd_compute_ns=1000, bwd_compute_ns=2000)
    assert job.rank(d=1, t=3, p=2) == 3 + 8 * (1 + 2 * 2)
    w = job_iteration(rail, job)
    fwd = [f for f in w.flows if f.tag.startswith("pp-fwd")]
    bwd = [f for f in w.flows if f.tag.startswith("pp-bwd")]
    dpf = [f for f in w.flows if f.tag.startswith("dp-")]
    # PP: (pp-1) hops x microbatches x (dp*tp) pairs each way, each activation/tp bytes
    assert len(fwd) == len(bwd) == 3 * 3 * 16
    assert all(f.size_bytes == 2**24 / 8 for f in fwd + bwd)
    # TP is inside a server: PP and DP flows are rail-aligned (same GPU index both ends)
    for f in w.flows:
        s, d = rail.devices[f.src], rail.devices[f.dst]
        assert s.host != d.host and s.gpu == d.gpu
    # DP: per (stage, tp) a 2-rank ring: 2 steps x 2 hops, chunk grad/(pp*tp*dp)
    assert len(dpf) == 4 * 8 * 2 * 2
    assert all(f.size_bytes == 8 * 2**30 / (4 * 8 * 2) for f in dpf)
    # DP rings start after the stage's backward: every first-step DP flow has deps
    assert all(f.deps for f in dpf)
    # compute appears as gaps: the first forward of stage 0 waits one forward compute
    first = fwd[0]
    assert not first.deps and first.start_ns == 0 and first.gap_ns == 1000


def test_job_without_pipeline_waits_for_compute(ft):
    job = JobSpec(dp=16, microbatches=2, fwd_compute_ns=10, bwd_compute_ns=20)
    w = job_iteration(ft, job)
    first = [f for f in w.flows if not f.deps]
    assert first and all(f.gap_ns == 2 * 30 for f in first)


def test_job_errors(rail):
    with pytest.raises(WorkloadError, match="do not fit"):
        job_iteration(rail, JobSpec(dp=64, tp=8, pp=2))
    with pytest.raises(WorkloadError, match="inside a server"):
        job_iteration(rail, JobSpec(dp=1, tp=8, pp=1))
