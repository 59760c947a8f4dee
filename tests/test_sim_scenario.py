"""Scenarios (YAML and flags), the sim CLI, the report files and the demo part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fabricscope.cli import app
from fabricscope.model.errors import ConfigError, FabricscopeError, UnroutableError
from fabricscope.service.sim_report import format_table
from fabricscope.sim.scenario import (
    parse_scenario,
    prepare,
    read_scenario,
    run_scenario,
    scenario_from_flags,
    scenario_to_dict,
    with_overrides,
)

SCENARIO = """
name: small what-if
topology: {kind: leaf-spine, params: {leaves: 4, hosts_per_leaf: 4, spines: 2}}
workload: {kind: permutation, size: 1MB}
lb: [ecmp, spray]
faults:
  - {kind: link-degraded, link: "leaf-000~spine-00", factor: 25%}
seeds: [0, 1]
"""


def test_yaml_scenario_runs_every_case(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO)
    sc = read_scenario(p)
    assert sc.schemes == ("ecmp", "spray") and sc.seeds == (0, 1) and sc.compare_healthy
    assert sc.faults[0].factor == 0.25
    res = run_scenario(sc, record_utilization=False)
    labels = [r["scheme"] for r in res.table()]
    assert labels == ["ecmp", "spray", "ecmp (faults)", "spray (faults)"]
    assert len(res.runs) == 8
    # Round trip through the mapping form.
    assert parse_scenario(scenario_to_dict(sc), source=str(p)) == sc
    sc2 = with_overrides(sc, lb="dlb", seeds=[3], fail=["leaf-001~spine-01"])
    assert sc2.schemes == ("dlb",) and sc2.seeds == (3,) and len(sc2.faults) == 2


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"lb": ["ecmp", "warp"]}, "warp"),
        ({"topology": {"kind": "leaf-spine", "params": {"leaves": 2, "spins": 2}}}, "spins"),
        ({"faults": [{"kind": "link-melted", "link": "x"}]}, "faults[0].kind"),
        ({"faults": [{"kind": "link-degraded", "link": "leaf-000~spine-00", "factor": 2}]}, "faults[0].factor"),
        ({"seeds": "zero"}, "seeds"),
        ({"colour": "blue"}, "colour"),
        ({"workload": {"kind": "permutation"}}, "workload.size"),
        ({"workload": {"kind": "permutation", "size": "0"}}, "workload.size"),
        ({"faults": [{"kind": "link-down", "link": "leaf-000~spine-99"}]}, "spine-99"),
        ({"faults": [{"kind": "gray-loss", "link": "leaf-000~spine-00"}]}, "faults[0].loss: missing"),
        ({"faults": [{"kind": "gray-loss", "link": "leaf-000~spine-00", "loss": 1.5}]}, "faults[0].loss"),
    ],
)
def test_corrupt_scenarios_are_rejected_before_running(patch: dict[str, object], needle: str) -> None:
    import yaml

    data = yaml.safe_load(SCENARIO)
    data.update(patch)
    with pytest.raises(FabricscopeError) as exc:
        prepare(parse_scenario(data, source="s.yaml"))
    msg = str(exc.value)
    assert needle in msg and "s.yaml" in msg, msg


def test_flags_scenario_and_link_names() -> None:
    sc = scenario_from_flags(
        topo="leaf-spine:leaves=2,hosts_per_leaf=2,spines=2",
        workload="permutation:size=1MB", lb="ecmp,dlb",
        fail=["leaf-000:eth3"], degrade=["leaf-001~spine-01=0.5"], seeds=[4],
    )
    prep = prepare(sc)
    assert [f.kind for f in prep.faults] == ["link-down", "link-degraded"]
    assert all("|" in f.subject for f in prep.faults)
    with pytest.raises(ConfigError, match="--degrade"):
        scenario_from_flags(topo="leaf-spine:leaves=2", workload="permutation:size=1MB", degrade=["0.5"])


def test_gray_loss_faults_from_flags_and_files_round_trip() -> None:
    sc = scenario_from_flags(topo="leaf-spine:leaves=2,hosts_per_leaf=2,spines=2", workload="permutation:size=1MB",
                             corrupt=["leaf-001~spine-01=2%"])
    prep = prepare(sc)
    assert [(f.kind, dict(f.params)) for f in prep.faults] == [("gray-loss", {"loss": 0.02})]
    assert parse_scenario(scenario_to_dict(sc), source="<flags>") == sc
    with pytest.raises(ConfigError, match="--corrupt"):
        scenario_from_flags(topo="leaf-spine:leaves=2", workload="permutation:size=1MB", corrupt=["0.5"])


def test_cli_runs_writes_report_and_reports_partition(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "out"
    r = runner.invoke(app, ["sim", "--topo", "fat-tree:k=4", "--workload", "permutation:size=1MB",
                            "--lb", "ecmp,spray", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "spray" in r.output and "p99" in r.output and "last byte" in r.output
    data = json.loads((out / "sim.json").read_text())
    assert [row["scheme"] for row in data["table"]] == ["ecmp", "spray"]
    assert (out / "fct_cdf.png").stat().st_size > 1000 and (out / "link_util.png").stat().st_size > 1000
    # Cutting a leaf's only spine cable partitions it: flows are listed as unroutable, the
    # table is still printed, and the command ends with an UnroutableError (exit 2 in main()).
    r = runner.invoke(app, ["sim", "--topo", "leaf-spine:leaves=2,hosts_per_leaf=2,spines=1",
                            "--workload", "permutation:size=1MB", "--fail", "leaf-000~spine-00"])
    assert isinstance(r.exception, UnroutableError), r.output
    assert "partitioned" in str(r.exception) and "ecmp (faults)" in str(r.exception)
    assert "unroutable" in r.output and "warning" in r.output and "last byte" in r.output


@pytest.mark.slow
def test_cli_bad_input_is_one_error_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: {kind: fat-tree\nworkload: [")
    cases = [
        ["sim", str(bad)],
        ["sim", "--topo", "fat-tree:k=4,colour=red", "--workload", "permutation:size=1MB"],
        ["sim", "--topo", "rail-optimized:servers=8,radix=4", "--workload", "permutation:size=1MB"],
        ["sim", "--topo", "fat-tree:k=4", "--workload", "flows:flows=[]"],
        ["sim", "--topo", "fat-tree:k=4"],
        ["sim", "--topo", "leaf-spine:leaves=2,hosts_per_leaf=2,spines=1", "--workload",
         "permutation:size=1MB", "--fail", "leaf-000~spine-00"],  # a partitioning failure
    ]
    for args in cases:
        p = subprocess.run([sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, p.stderr)


def test_demo_part_quick(tmp_path: Path) -> None:
    from fabricscope.service.demo_sim import run

    lines: list[str] = []
    out = run(seed=1, outdir=tmp_path, echo=lines.append, quick=True)
    assert out["best_under_failure"] in ("ecmp", "spray", "dlb")
    table = out["table"]
    assert isinstance(table, list) and len(table) == 6
    assert any("link-down" in ln for ln in lines)
    assert (tmp_path / "fct_cdf.png").exists()
    json.dumps(out)


def test_scenario_with_an_inventory_file(tmp_path: Path) -> None:
    from fabricscope.fabric import leaf_spine_fabric
    from fabricscope.fabric.io import write_fabric

    write_fabric(leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2), tmp_path / "inv.yaml")
    p = tmp_path / "s.yaml"
    p.write_text("topology: {file: inv.yaml}\nworkload: {kind: permutation, size: 1MB}\nlb: spray\n")
    res = run_scenario(read_scenario(p), record_utilization=False)
    assert res.fabric.name == "leafspine-2x2-s2"
    assert res.table()[0]["unroutable"] == 0
    with pytest.raises(FabricscopeError, match=r"missing\.yaml"):
        prepare(parse_scenario({"topology": {"file": "missing.yaml"}, "workload": {"kind": "permutation", "size": 1}},
                               source=str(p)))


def test_the_scenario_file_in_docs_sim_md_is_valid(tmp_path: Path) -> None:
    """The documented example must load and prepare as printed (regression: PyYAML reads
    `batch_rtol: 1e-9` as a string, which the reader rejected)."""
    doc = Path(__file__).resolve().parents[1] / "docs" / "sim.md"
    if not doc.exists():
        pytest.skip(f"{doc} not found (installed without the docs)")
    text = doc.read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    p = tmp_path / "scenario.yaml"
    p.write_text(block)
    sc = read_scenario(p)
    assert sc.batch_rtol == pytest.approx(1e-9)
    assert sc.schemes == ("ecmp", "spray", "dlb") and sc.seeds == (0, 1)
    prep = prepare(sc)
    assert [f.kind for f in prep.faults] == ["link-down", "link-degraded"]


def test_command_line_hash_overrides_a_scenario_file(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("topology: {kind: fat-tree, params: {k: 4}}\nworkload: {kind: permutation, size: 1MB}\n"
                 "hash: {function: crc32, seed: 3}\n")
    sc = read_scenario(p)
    assert sc.hash.per_switch_seed
    got = with_overrides(sc, hash_function="xor", polarized=True)
    assert (got.hash.function, got.hash.seed, got.hash.per_switch_seed) == ("xor", 3, False)
    assert with_overrides(sc, lb="spray").hash == sc.hash


def test_ring_steady_state_scenario_reports_the_collective_time() -> None:
    """`steady_state: true` simulates one ring step; the table adds the whole collective's
    time and busbw from that step's t = 0 rates, exactly as the Python API computes them."""
    from fabricscope.sim.engine import steady_state_rates
    from fabricscope.sim.workload import (
        path_latency_s,
        ring_busbw_from_rates,
        ring_time_from_rates,
    )

    sc = scenario_from_flags(topo="rail-optimized:servers=8,servers_per_leaf=2",
                             workload="allreduce:size=64MiB,steady_state=true,placement=random",
                             lb="ecmp,spray", seeds=[3])
    prep = prepare(sc)
    res = run_scenario(prep, record_utilization=False)
    w = prep.workloads[3]
    rows = {r["scheme"]: r for r in res.table()}
    for scheme in ("ecmp", "spray"):
        st = steady_state_rates(prep.fabric, w, lb=scheme, hash_config=sc.hash, seed=3)
        lat = path_latency_s(prep.fabric, w, hash_config=sc.hash)
        assert rows[scheme]["ring_ms"] == pytest.approx(ring_time_from_rates(w, st.rates_bps, latency_s=lat) * 1e3, abs=1e-3)
        assert rows[scheme]["busbw_GBps"] == pytest.approx(ring_busbw_from_rates(w, st.rates_bps, latency_s=lat) / 1e9, abs=1e-3)
    # Spraying never makes the ring slower than per-flow ECMP on the same placement.
    assert float(str(rows["spray"]["ring_ms"])) <= float(str(rows["ecmp"]["ring_ms"])) + 1e-9
    assert "ring ms" in format_table(res)
