"""Slow-node search planning / analysis (pure) and its CLI, on seeded synthetic oracles."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fabricscope.cli import collective_slownode
from fabricscope.collective import slownode as sn
from fabricscope.model.errors import ConfigError, TraceFormatError

DATA = Path(__file__).parent / "data" / "collective_slownode"
Oracle = Callable[[Sequence[str], int], float]  # (test nodes, call number) -> busbw GB/s


def node_oracle(slow: dict[str, float], *, base: float = 180.0, noise: float = 0.015,
                seed: int = 0) -> Oracle:
    """A ring test runs at its slowest member; interference only slows a run (|N(0, noise)|)."""
    rng = random.Random(seed)

    def f(nodes: Sequence[str], _: int) -> float:
        return base * min(slow.get(x, 1.0) for x in nodes) / (1 + abs(rng.gauss(0, noise)))
    return f


def drive(state: sn.SearchState, oracle: Oracle, *, max_rounds: int = 30) -> sn.SearchState:
    calls = 0
    for _ in range(max_rounds):
        rnd = sn.plan(state)
        if rnd is None:
            return state
        seen: set[str] = set()
        res = {}
        for t in rnd.tests:
            assert not seen.intersection(t.nodes), f"round {rnd.index} reuses a node"
            seen.update(t.nodes)
            assert set(t.unit) <= set(t.nodes)
            res[t.test_id] = oracle(t.nodes, calls)
            calls += 1
        state = sn.record(state, rnd, res)
    raise AssertionError(f"no end after {max_rounds} rounds")


@pytest.mark.parametrize("scheme", ["pair", "group"])
@pytest.mark.parametrize("seed", range(8))
def test_one_slow_node_among_64_is_localized_within_the_round_bound(scheme: str, seed: int) -> None:
    rng = random.Random(seed)
    nodes = [f"gpu-{i:03d}" for i in range(64)]
    bad = rng.choice(nodes)
    factor = rng.uniform(0.5, 0.85)
    st = drive(sn.new_search(nodes, scheme=scheme), node_oracle({bad: factor}, seed=seed))
    v = sn.analyze(st)
    assert v.done
    assert v.localized == (bad,)
    assert not v.slow_pairs and not v.ambiguous
    g = st.config.group_size
    # screen + halvings down to single nodes + confirm (module docstring)
    assert v.rounds <= 1 + int(math.log2(g)) + 1
    assert v.slow_nodes[0].ratio == pytest.approx(factor, abs=0.06)
    assert v.slow_nodes[0].score > 0.99


@pytest.mark.parametrize("scheme", ["pair", "group"])
@pytest.mark.parametrize("seed", range(6))
def test_two_slow_nodes_cost_at_most_twice_the_rounds(scheme: str, seed: int) -> None:
    rng = random.Random(100 + seed)
    nodes = [f"n{i}" for i in range(64)]
    a, b = rng.sample(nodes, 2)
    one = drive(sn.new_search(nodes, scheme=scheme), node_oracle({a: 0.7}, seed=seed))
    two = drive(sn.new_search(nodes, scheme=scheme),
                node_oracle({a: 0.7, b: rng.uniform(0.5, 0.85)}, seed=seed))
    v = sn.analyze(two)
    assert sorted(v.localized) == sorted((a, b))
    assert v.rounds <= 2 * sn.analyze(one).rounds


def test_two_slow_nodes_in_one_pair_are_both_blamed() -> None:
    nodes = [f"n{i:02d}" for i in range(16)]
    st = drive(sn.new_search(nodes), node_oracle({"n04": 0.6, "n05": 0.8}))
    assert sorted(sn.analyze(st).localized) == ["n04", "n05"]


def test_a_pair_specific_deficit_is_a_link_not_a_node() -> None:
    nodes = [f"n{i:02d}" for i in range(16)]
    base = node_oracle({})

    def oracle(t: Sequence[str], k: int) -> float:
        return base(t, k) * (0.6 if {"n06", "n07"} <= set(t) else 1.0)

    v = sn.analyze(drive(sn.new_search(nodes), oracle))
    assert v.slow_nodes == ()
    assert [(p.a, p.b) for p in v.slow_pairs] == [("n06", "n07")]
    assert v.rounds == 3  # screen, partners (both fine), retest of the pair
    assert all(f.kind == "slow-node-pair" for f in v.findings())


def test_slow_with_one_partner_and_fine_with_another_is_pair_specific() -> None:
    nodes = [f"n{i:02d}" for i in range(16)]
    base = node_oracle({})

    def oracle(t: Sequence[str], k: int) -> float:
        # n03 is slow with n02 (its screen partner) and n04 (its nearest good partner, then
        # its first confirmation), fine with n01 (the third partner): each deficit is the pair's
        slow = "n03" in t and any(x in t for x in ("n02", "n04"))
        return base(t, k) * (0.6 if slow else 1.0)

    st = drive(sn.new_search(nodes, confirmations=3), oracle)
    v = sn.analyze(st)
    assert v.slow_nodes == ()
    assert sorted((p.a, p.b) for p in v.slow_pairs) == [("n03", "n02"), ("n03", "n04")]
    partners = [t.nodes for r in st.rounds[1:] for t in r.tests if t.unit == ("n03",)]
    assert ("n03", "n01") in partners  # the fine partner
    assert partners.count(("n03", "n04")) == 2  # the deficit, retested


def test_group_slow_only_when_both_halves_together_is_ambiguous() -> None:
    nodes = [f"n{i:02d}" for i in range(64)]
    base = node_oracle({})

    def oracle(t: Sequence[str], k: int) -> float:
        return base(t, k) * (0.6 if {"n03", "n06"} <= set(t) else 1.0)

    st = sn.new_search(nodes, scheme="group")
    assert st.config.group_size == 8
    v = sn.analyze(drive(st, oracle))
    assert v.slow_nodes == () and v.slow_pairs == ()
    assert v.ambiguous == (tuple(nodes[:8]),)


def test_slow_once_then_fine_is_transient() -> None:
    nodes = [f"n{i:02d}" for i in range(16)]
    base = node_oracle({})

    def oracle(t: Sequence[str], k: int) -> float:
        return base(t, k) * (0.5 if k == 3 else 1.0)  # the 4th screen test, once

    v = sn.analyze(drive(sn.new_search(nodes), oracle))
    assert v.transient == (("n06", "n07"),)
    assert v.slow_nodes == () and v.slow_pairs == () and v.done


def test_threshold_follows_the_noise() -> None:
    nodes = [f"n{i:03d}" for i in range(128)]
    quiet = sn.analyze(drive(sn.new_search(nodes), node_oracle({"n010": 0.6}, noise=0.005)))
    loud = sn.analyze(drive(sn.new_search(nodes), node_oracle({"n010": 0.6}, noise=0.05)))
    assert quiet.margin == pytest.approx(0.07)  # min_drop floor
    # |N(0, s)| has MAD about 0.36 s here: the margin grows with the noise
    assert loud.margin > 0.1
    assert loud.localized == quiet.localized == ("n010",)


def test_hwang_group_size() -> None:
    assert sn.new_search(512, scheme="group").config.group_size == 64  # capped at max_group
    st = sn.new_search(512, scheme="group", expected_slow=8, max_group=512)
    assert st.config.group_size == 2 ** math.floor(math.log2((512 - 8 + 1) / 8))  # 32
    assert sn.new_search(40, scheme="group").config.group_size == 5  # >= 8 screen tests


def test_bad_inputs_raise_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="at least 3"):
        sn.new_search(["a", "b"])
    with pytest.raises(ConfigError, match="listed twice"):
        sn.new_search(["a", "b", "a"])
    with pytest.raises(ConfigError, match="scheme"):
        sn.new_search(8, scheme="ternary")
    st = sn.new_search(8)
    with pytest.raises(ConfigError, match="no round has results"):
        sn.analyze(st)
    rnd = sn.plan(st)
    assert rnd is not None
    with pytest.raises(ConfigError, match="no result for test r00-t001"):
        sn.record(st, rnd, {"r00-t000": 10.0})
    with pytest.raises(ConfigError, match="not a number"):
        sn.record(st, rnd, {t.test_id: math.nan for t in rnd.tests})


def test_round_script_lines() -> None:
    st = sn.new_search([f"h{i}" for i in range(6)], kind="sendrecv_perf")
    rnd = sn.plan(st)
    assert rnd is not None
    mp = sn.round_script(rnd, gpus_per_node=8, bin_dir="/opt/nccl-tests/build", out_dir="o")
    assert ("mpirun -np 2 -H h0:1,h1:1 /opt/nccl-tests/build/sendrecv_perf -b 256M -e 1G "
            "-f 2 -g 8 > o/r00-t000.txt 2>&1 &") in mp
    assert mp.rstrip().endswith("wait")
    sr = sn.round_script(rnd, launcher="srun", out_dir="o")
    assert "srun -N2 -w h4,h5 --ntasks-per-node=1 sendrecv_perf" in sr
    with pytest.raises(ConfigError, match="launcher"):
        sn.round_script(rnd, launcher="pdsh")


def test_parse_real_nccl_tests_output() -> None:
    text = (DATA / "a3mega_2node_all_reduce.txt").read_text()
    assert sn.parse_avg_busbw(text, source="a3mega") == pytest.approx(70.742)
    tagged = "\n".join(f"[1,0]<stdout>:{ln}" for ln in text.splitlines())  # mpirun --tag-output
    assert sn.parse_avg_busbw(tagged, source="tagged") == pytest.approx(70.742)
    cut = text.split("# Out of bounds")[0]
    with pytest.raises(TraceFormatError, match=r"^cut\.txt: the output ends before .*truncated"):
        sn.parse_avg_busbw(cut, source="cut.txt")
    with pytest.raises(TraceFormatError, match=r"^bad\.txt: no nccl-tests output"):
        sn.parse_avg_busbw("# Avg bus bandwidth    : oops", source="bad.txt")
    wrong = text.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    assert wrong != text
    with pytest.raises(TraceFormatError, match=r"^wrong\.txt: 3 out-of-bounds values"):
        sn.parse_avg_busbw(wrong, source="wrong.txt")
    # an output of only the summary line (what `slow-node twin` writes) is read as well
    assert sn.parse_avg_busbw("# Avg bus bandwidth    : 41.5 \n", source="s.txt") == 41.5


def test_read_round_results_and_state_roundtrip(tmp_path: Path) -> None:
    st = sn.new_search([f"h{i}" for i in range(8)])
    rnd = sn.plan(st)
    assert rnd is not None
    for i, t in enumerate(rnd.tests):
        (tmp_path / f"{t.test_id}.txt").write_text(f"# Avg bus bandwidth    : {40 + i} \n")
    res = sn.read_round_results(rnd, tmp_path)
    assert res == {t.test_id: 40.0 + i for i, t in enumerate(rnd.tests)}
    st2 = sn.record(st, rnd, res)
    nxt = sn.plan(st2)
    back, pending = sn.state_from_json(json.loads(json.dumps(sn.state_to_json(st2, pending=nxt))),
                                       source="s.json")
    assert back == st2 and pending == nxt
    (tmp_path / f"{rnd.tests[0].test_id}.txt").unlink()
    with pytest.raises(TraceFormatError, match=r"r00-t000\.txt: missing"):
        sn.read_round_results(rnd, tmp_path)
    with pytest.raises(TraceFormatError, match=r"^s\.json: config: "):
        sn.state_from_json({"nodes": []}, source="s.json")


# ------------------------------------------------------------------ CLI
def _app() -> typer.Typer:
    root = typer.Typer()
    coll = typer.Typer()
    collective_slownode.register(coll)
    root.add_typer(coll, name="collective")
    return root


def _examples(help_text: str) -> list[str]:
    return [ln.strip() for ln in help_text.splitlines() if ln.strip().startswith("fabricscope ")]


@contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _invoke(example: str) -> str:
    result = CliRunner().invoke(_app(), shlex.split(example)[1:])
    assert result.exit_code == 0, (example, result.output, result.exception)
    return result.output


def _write_outputs(state_file: Path, out: Path, slow: dict[str, float]) -> dict[str, float]:
    data = json.loads(state_file.read_text())
    pending = data["rounds"][-1]
    assert pending["results"] is None
    out.mkdir(exist_ok=True)
    oracle = node_oracle(slow, seed=3)
    got = {}
    for t in pending["tests"]:
        got[t["id"]] = oracle(t["nodes"], 0)
        (out / f"{t['id']}.txt").write_text(f"# Avg bus bandwidth    : {got[t['id']]:g} \n")
    return got


def _session(tmp_path: Path, name: str, help_text: str) -> list[str]:
    """Run a help's examples in order in a fresh folder (as tests/test_docs_examples does)."""
    work = tmp_path / name
    work.mkdir()
    with _cwd(work):
        return [_invoke(ex) for ex in _examples(help_text)]


def test_plan_help_examples_run(tmp_path: Path) -> None:
    outs = _session(tmp_path, "plan", collective_slownode._PLAN_HELP)
    assert len(outs) == 4
    assert "round 0: 8 tests -> round0.sh" in outs[0]
    assert "round 0: 8 outputs -> slownode-out/" in outs[1]
    # node005 is slow: its pair (node004, node005) is split, each with a good partner
    assert "round 1: 2 tests -> round1.sh" in outs[2]
    round1 = (tmp_path / "plan" / "round1.sh").read_text()
    # each with the nearest free good node in the list
    assert "-H node004:1,node003:1" in round1 and "-H node005:1,node006:1" in round1
    assert re.search(r"srun -N8 -w node000,.*node007 --ntasks-per-node=1 all_reduce_perf",
                     outs[3])


def test_analyze_help_examples_run(tmp_path: Path) -> None:
    outs = _session(tmp_path, "analyze", collective_slownode._ANALYZE_HELP)
    assert len(outs) == 4
    assert "not final: 2 suspects still to test" in outs[2]
    v = json.loads(outs[3])
    assert v["rounds"] == 1 and not v["done"] and v["slow_nodes"] == []
    assert sorted(u[0] for u in v["pending"]) == ["node004", "node005"]


def test_twin_help_examples_run(tmp_path: Path) -> None:
    outs = _session(tmp_path, "twin", collective_slownode._TWIN_HELP)
    assert len(outs) == 4
    assert "SLOW NODE  host0005" in outs[0] and "localized exactly" in outs[0]
    two = json.loads(outs[1])
    assert two["correct"] and sorted(two["truth"]) == ["host0100", "host0301"]
    assert "round 0: 16 outputs -> out0/" in outs[3]
    bw = {p.name: sn.parse_avg_busbw(p.read_text(), source=p.name)
          for p in (tmp_path / "twin" / "out0").iterdir()}
    slow = [k for k, v in bw.items() if v < 0.6 * max(bw.values())]
    assert slow == ["r00-t003.txt"]  # node006 + node007


def test_cli_full_search_then_db(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    app = _app()
    runner = CliRunner()
    state = tmp_path / "s.json"
    nodes = tmp_path / "hosts.txt"
    nodes.write_text("".join(f"h{i:02d}\n" for i in range(12)))
    base = ["collective", "slow-node"]
    r = runner.invoke(app, [*base, "plan", "--nodes", str(nodes), "--state", str(state),
                            "--script", str(tmp_path / "r.sh")])
    assert r.exit_code == 0, r.output
    for i in range(6):
        out = tmp_path / f"out{i}"
        r = runner.invoke(app, [*base, "twin", "--state", str(state), "--slow", "h07=0.5",
                                "--out-dir", str(out), "--seed", "3"])
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, [*base, "plan", "--state", str(state), "--results", str(out),
                                "--script", str(tmp_path / "r.sh")])
        assert r.exit_code == 0, r.output
        if "search complete" in r.output:
            break
    assert "SLOW NODE  h07" in r.output
    # the same round's results as a JSON mapping give the same verdict
    db = tmp_path / "f.duckdb"
    r = runner.invoke(app, [*base, "analyze", "--state", str(state), "--db", str(db)])
    assert r.exit_code == 0, r.output
    from fabricscope.store.findings import DiagnosisStore
    with DiagnosisStore(db, read_only=True) as store:
        rows = store.con.execute("SELECT kind, subject FROM findings").fetchall()
    assert rows == [("slow-node", "h07")]


def test_cli_results_as_json_mapping(tmp_path: Path) -> None:
    app = _app()
    runner = CliRunner()
    state = tmp_path / "s.json"
    base = ["collective", "slow-node"]
    assert runner.invoke(app, [*base, "plan", "--nodes", "8", "--state", str(state)]).exit_code == 0
    got = _write_outputs(state, tmp_path / "unused", {"node002": 0.5})
    (tmp_path / "busbw.json").write_text(json.dumps(got))
    r = runner.invoke(app, [*base, "analyze", "--state", str(state), "--results",
                            str(tmp_path / "busbw.json"), "--json"])
    assert r.exit_code == 0, r.output
    assert sorted(u[0] for u in json.loads(r.output)["pending"]) == ["node002", "node003"]
    (tmp_path / "bad.json").write_text(json.dumps({"r00-t000": "fast"}))
    r = runner.invoke(app, [*base, "plan", "--state", str(state), "--results",
                            str(tmp_path / "bad.json")])
    assert isinstance(r.exception, TraceFormatError)
    assert str(r.exception).endswith("bad.json: r00-t000: busbw 'fast' is not a number")


def test_cli_errors_name_the_input(tmp_path: Path) -> None:
    app = _app()
    runner = CliRunner()
    r = runner.invoke(app, ["collective", "slow-node", "plan", "--state", str(tmp_path / "x.json")])
    assert isinstance(r.exception, TraceFormatError) and "x.json: no such search state" in str(r.exception)
    r = runner.invoke(app, ["collective", "slow-node", "twin", "--slow", "host0001"])
    assert isinstance(r.exception, ConfigError) and "--slow: 'host0001'" in str(r.exception)
    r = runner.invoke(app, ["collective", "slow-node", "plan", "--nodes", "nofile",
                            "--state", str(tmp_path / "y.json")])
    assert isinstance(r.exception, ConfigError) and "'nofile'" in str(r.exception)


def test_design_page_examples_run(tmp_path: Path) -> None:
    page = Path(__file__).parents[1] / "docs" / "design" / "collective-slownode.md"
    blocks = re.findall(r"```[a-zA-Z]*\n(.*?)```", page.read_text(), re.S)
    cmds = [ln.strip() for b in blocks for ln in b.splitlines()
            if ln.strip().startswith("fabricscope ")]
    assert len(cmds) == 6
    with _cwd(tmp_path):
        outs = [_invoke(c) for c in cmds]
    assert "not final" in outs[4] and "SLOW NODE" not in outs[4]
    assert "SLOW NODE  host0100" in outs[5] and "localized exactly" in outs[5]
