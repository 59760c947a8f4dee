"""Design files, fat-tree sizing and the simulated training step (issue 13)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from fabricscope.design.scaling import (
    JobShape,
    analytical_step,
    device_down,
    dp_rings,
    job_from_mapping,
    simulated_step,
    speedups,
)
from fabricscope.design.spec import DesignSpec, build_design, design_from_mapping, load_design
from fabricscope.fabric.builders import leaf_spine_fabric, rail_optimized_fabric
from fabricscope.model.errors import ConfigError


def _switch_ports_per_gpu(spec: DesignSpec, gpus: int) -> float:
    f = build_design(spec, gpus)
    nic_ports = sum(1 for p in f.ports.values() if f.devices[p.device].role == "nic")
    return (2 * len(f.links) - nic_ports) / gpus


@pytest.mark.parametrize(
    ("radix", "gpus", "tiers", "ports"),
    [(64, 1024, 2, 3.0), (64, 8192, 3, 5.0), (128, 8192, 2, 3.0), (32, 2048, 3, 5.0)],
)
def test_fat_tree_sizing_is_a_non_blocking_clos(radix: int, gpus: int, tiers: int, ports: float) -> None:
    spec = DesignSpec("ft", "fat-tree", {"radix": radix})
    f = build_design(spec, gpus)
    assert f.gpu_count == gpus
    assert f.meta["tiers"] == tiers
    # Non-blocking: every switch uses as many ports up as down (cores: all down), so the
    # switch ports per GPU are 2 per tier below the top plus 1: 3 (two tiers), 5 (three).
    assert _switch_ports_per_gpu(spec, gpus) == ports
    # No switch needs more ports than its radix, and every server's NICs share one ToR.
    for sw in f.switches:
        assert len(f.ports_of[sw.id]) <= radix
    for host, nics in f.nics_of_host.items():
        assert len({f.leaves_of_nic[n.id] for n in nics}) == 1, host


def test_rail_per_rail_stays_two_tier_where_the_fat_tree_needs_three() -> None:
    rail = DesignSpec("r", "rail-optimized", {"radix": 64, "spine_mode": "per-rail"})
    ft = DesignSpec("f", "fat-tree", {"radix": 64})
    assert build_design(rail, 8192).meta["tiers"] == 2
    assert build_design(ft, 8192).meta["tiers"] == 3
    assert 1 - _switch_ports_per_gpu(rail, 8192) / _switch_ports_per_gpu(ft, 8192) == pytest.approx(0.4)


def test_sizes_that_do_not_fit_are_one_line_errors() -> None:
    spec = DesignSpec("ft", "fat-tree", {"radix": 64})
    with pytest.raises(ConfigError, match="whole number of 8-GPU servers"):
        build_design(spec, 1001)
    with pytest.raises(ConfigError, match="multiple of"):
        build_design(spec, 1032)  # 129 servers: not whole ToRs of 4
    with pytest.raises(ConfigError, match="exceed"):
        build_design(DesignSpec("ft", "fat-tree", {"radix": 16}), 16 * 8 * 2 * 17)


def test_design_file_errors_name_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "d.yaml"
    bad.write_text("name: x\nkind: torus\n")
    with pytest.raises(ConfigError, match=r"d\.yaml: kind: unknown 'torus'"):
        load_design(bad)
    bad.write_text("name: x\nkind: fat-tree\nparams: {spine_mode: per-rail}\n")
    with pytest.raises(ConfigError, match=r"params\.spine_mode: not a fat-tree parameter"):
        load_design(bad)
    bad.write_text("name: x\nkind: [\n")
    with pytest.raises(ConfigError, match=r"d\.yaml:\d+:\d+: malformed YAML"):
        load_design(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_design(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="colour: unknown key"):
        design_from_mapping({"name": "x", "kind": "fat-tree", "colour": 1}, source="s")


def test_builtin_examples_load_and_build() -> None:
    folder = Path(__file__).resolve().parents[1] / "src/fabricscope/design/examples"
    names = set()
    for p in sorted(folder.glob("*.yaml")):
        if p.name.startswith("job-"):
            import yaml

            job_from_mapping(yaml.safe_load(p.read_text()), source=str(p))
            continue
        spec = load_design(p)
        names.add(spec.name)
        assert build_design(spec, 1024).gpu_count == 1024
    assert names == {"rail-2tier", "fattree", "dual-plane", "dual-tor"}


def test_job_fields_are_validated() -> None:
    with pytest.raises(ConfigError, match="overlap: must be in"):
        JobShape(overlap=1.5)
    with pytest.raises(ConfigError, match="tp: must be an integer"):
        job_from_mapping({"tp": 0}, source="job.yaml")
    with pytest.raises(ConfigError, match=r"job\.yaml: bogus: unknown job field"):
        job_from_mapping({"bogus": 1}, source="job.yaml")
    with pytest.raises(ConfigError, match="lb: 'dlb'"):
        job_from_mapping({"lb": "ecmp,dlb"}, source="job.yaml")
    with pytest.raises(ConfigError, match="does not divide"):
        JobShape(tp=8, pp=3).dp_for(1024)


def _alpha_beta_sync(job: JobShape, dp: int, nic_bps: float, path_s: float) -> float:
    s = job.grad_bytes / (job.tp * job.pp)
    return 2 * (dp - 1) * (job.alpha_us * 1e-6 + path_s + s / dp * 8 / nic_bps)


def test_simulated_step_equals_alpha_beta_on_a_fabric_without_collisions() -> None:
    # Non-blocking 2-tier, in-order ranks, spraying: every ring hop gets the full NIC rate,
    # so the engine's ring must reproduce the alpha-beta formula (computed here by hand).
    f = rail_optimized_fabric(16, servers_per_leaf=2)  # 128 GPUs, 400G, 2 tiers, 64 leaves
    assert f.meta["tiers"] == 2
    job = JobShape(params_billion=1.0, compute_s=0.1, lb=("spray",))
    st = simulated_step(f, job, lb="spray")
    dp = 16
    # The slowest hop crosses leaves: 4 links, 3 switch store-and-forwards of a 4 KB MTU.
    path = 4 * 1e-6 + 3 * 4096 * 8 / 400e9
    assert st.dp == dp
    assert st.slowest_hop_gbps == pytest.approx(400.0)
    assert st.dp_sync_s == pytest.approx(_alpha_beta_sync(job, dp, 400e9, path), rel=1e-9)
    an = analytical_step(job, 128, nic_gbps=400.0, tiers=2)
    assert an.dp_sync_s == pytest.approx(st.dp_sync_s, rel=1e-9)
    assert not an.simulated and st.simulated


def test_ecmp_collisions_slow_the_ring_that_spraying_does_not() -> None:
    # 4:1 oversubscribed leaf-spine, random placement: ECMP stacks ring hops on uplinks.
    f = leaf_spine_fabric(leaves=8, hosts_per_leaf=8, spines=2, nics_per_host=1, host_gbps=100)
    job = JobShape(tp=1, params_billion=0.5, compute_s=0.05, placement="random", seed=3, qps=1)
    ecmp = simulated_step(f, job, lb="ecmp")
    spray = simulated_step(f, job, lb="spray")
    assert ecmp.slowest_hop_gbps < spray.slowest_hop_gbps
    assert ecmp.step_s > spray.step_s
    assert ecmp.efficiency < spray.efficiency <= 1.0


def test_dual_homed_nic_under_ecmp_with_one_qp_runs_at_one_port() -> None:
    from fabricscope.fabric.builders import dual_tor_fabric

    f = dual_tor_fabric(8)  # 400G NICs as 2 x 200G
    job = JobShape(params_billion=1.0, compute_s=0.1, qps=1)
    ecmp = simulated_step(f, job, lb="ecmp")
    spray = simulated_step(f, job, lb="spray")
    assert ecmp.slowest_hop_gbps == pytest.approx(200.0)
    assert spray.slowest_hop_gbps == pytest.approx(400.0)
    # Bandwidth term doubles; the latency term is the same.
    lat = spray.dp_sync_s - 2 * 7 * (1.0e9 * 2 / 8 / 8) * 8 / 400e9
    assert ecmp.dp_sync_s - lat == pytest.approx(2 * (spray.dp_sync_s - lat), rel=1e-6)


def test_a_failed_spine_never_speeds_the_step_and_rings_cover_every_server() -> None:
    f = leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=2, nics_per_host=1, host_gbps=100)
    job = JobShape(tp=1, params_billion=0.5, compute_s=0.05, qps=1, placement="random", seed=5)
    rings = dp_rings(f, job, f.gpu_count)
    assert len(rings.workload.flows) == 16  # random ranks: one host per rank, every hop a flow
    healthy = simulated_step(f, job, lb="ecmp")
    down = simulated_step(f, job, lb="ecmp", faults=device_down(f, "spine-00"), fault_label="x")
    assert down.step_s >= healthy.step_s
    # With one spine left each leaf has one 100G uplink: the slowest ring hop gets 100G over
    # the most flows that share a leaf's uplink or downlink (counted here from the rings).
    up: dict[str, int] = {}
    dn: dict[str, int] = {}
    for fl in rings.workload.flows:
        a, b = f.leaves_of_nic[fl.src][0], f.leaves_of_nic[fl.dst][0]
        if a != b:
            up[a] = up.get(a, 0) + 1
            dn[b] = dn.get(b, 0) + 1
    k = max([*up.values(), *dn.values()])
    assert k >= 2
    assert down.slowest_hop_gbps == pytest.approx(100.0 / k)
    assert down.fault == "x"


def test_weak_scaling_efficiency_falls_with_the_latency_term() -> None:
    job = JobShape(params_billion=0.01, compute_s=0.01, alpha_us=50.0)
    effs = [analytical_step(job, g, nic_gbps=400, tiers=2).efficiency for g in (1024, 4096, 16384)]
    assert effs[0] > effs[1] > effs[2]
    steps = {g: analytical_step(job, g, nic_gbps=400, tiers=2) for g in (1024, 4096)}
    sp = speedups(steps)
    assert sp[1024] == 1.0 and 1.0 < sp[4096] < 4.0
    assert dataclasses.replace(job, overlap=1.0).overlap == 1.0
    assert math.isfinite(analytical_step(job, 8, nic_gbps=400, tiers=1).step_s)
