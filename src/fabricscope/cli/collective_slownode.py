"""``fabricscope collective slow-node``: plan, analyze and simulate the search for slow nodes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

_PLAN_HELP = """Plan the next round of nccl-tests runs that localize slow nodes or links.

The first call (with --nodes: a file of hostnames, one a line, in rack order, or a count) starts a search and writes the screen round: disjoint pairs (--scheme pair, sendrecv_perf or all_reduce_perf on 2 nodes) or groups (--scheme group, all_reduce_perf on k nodes, Hwang's binary splitting). Run the script it writes (every test of a round in parallel, one output file per test under --out-dir), then call it again with --results pointing at that folder (or at a JSON file {test id: busbw GB/s}): it reads each output with the nccl-tests reader (its `# Avg bus bandwidth`; a failed, truncated or out-of-bounds run is an error naming the file), records the round in --state and writes the next round, until the search is complete. A round's tests never share a node. Here `slow-node twin --state` plays the cluster.

Examples:

  fabricscope collective slow-node plan --nodes 16 --state search.json --script round0.sh

  fabricscope collective slow-node twin --state search.json --slow node005=0.6 --out-dir slownode-out

  fabricscope collective slow-node plan --state search.json --results slownode-out --script round1.sh

  fabricscope collective slow-node plan --nodes 64 --scheme group --launcher srun --state search64.json
"""

_ANALYZE_HELP = """Say which nodes are slow (slow with every partner), which pairs have a path deficit (slow together, each fine with others), and what stays ambiguous.

Reads the search --state; with --results (an output folder of the pending round, or a JSON file {test id: busbw GB/s}) it first records that round. The verdict is final when nothing is pending. --db adds slow-node / slow-node-pair findings to a diagnosis store.

Examples:

  fabricscope collective slow-node plan --nodes 16 --state search.json

  fabricscope collective slow-node twin --state search.json --slow node005=0.6 --out-dir slownode-out

  fabricscope collective slow-node analyze --state search.json --results slownode-out

  fabricscope collective slow-node analyze --state search.json --json
"""

_TWIN_HELP = """Run the search on the twin: a leaf-spine of single-NIC hosts with slow NICs injected (--slow NODE=FACTOR, FACTOR the rate left, e.g. 0.6), each round's tests as concurrent flows on the flow engine (one steady-state solve per round), with seeded noise.

Without --state: the whole search on --nodes hosts (host0000...), printing the verdict and whether it matches the truth. With --state: only the pending round of that search (its node i on twin host i; --slow names the search's nodes), writing one output per test to --out-dir for `slow-node plan --results` (a minimal output: the `# Avg bus bandwidth` line of the steady-state estimate, not a full table).

Examples:

  fabricscope collective slow-node twin --nodes 64 --slow host0005=0.7 --seed 1

  fabricscope collective slow-node twin --nodes 512 --slow host0100=0.8 --slow host0301=0.6 --scheme pair --json

  fabricscope collective slow-node plan --nodes 32 --state s.json

  fabricscope collective slow-node twin --state s.json --slow node007=0.5 --out-dir out0
"""


def _nodes(text: str) -> list[str] | int:
    from fabricscope.model.errors import ConfigError, TraceFormatError

    if text.isdigit():
        return int(text)
    p = Path(text)
    if not p.is_file():
        raise ConfigError(f"--nodes: {text!r} is neither a count nor a file of hostnames")
    names = [ln.split("#")[0].strip() for ln in p.read_text().splitlines()]
    names = [n for n in names if n]
    if not names:
        raise TraceFormatError(f"{p}: no hostnames (one a line expected)")
    return names


def _load(state_path: Path) -> tuple[Any, Any]:
    from fabricscope.collective.slownode import state_from_json
    from fabricscope.model.errors import TraceFormatError

    try:
        data = json.loads(state_path.read_text())
    except FileNotFoundError:
        raise TraceFormatError(f"{state_path}: no such search state (start one with --nodes)") from None
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{state_path}:{exc.lineno}: not JSON ({exc.msg})") from None
    return state_from_json(data, source=str(state_path))


def _results(rnd: Any, path: Path) -> dict[str, float]:
    from fabricscope.collective.slownode import read_round_results
    from fabricscope.model.errors import TraceFormatError

    if path.is_dir():
        return read_round_results(rnd, path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such results folder or file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a JSON mapping of test id to busbw ({exc})") from None
    if not isinstance(data, dict):
        raise TraceFormatError(f"{path}: expected a JSON object {{test id: busbw GB/s}}")
    out: dict[str, float] = {}
    for k, v in data.items():
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise TraceFormatError(f"{path}: {k}: busbw {v!r} is not a number")
        out[str(k)] = float(v)
    return out


def _print_verdict(v: Any) -> None:
    typer.echo(f"rounds {v.rounds}, tests {v.tests}, reference {v.reference_gbs:.2f} GB/s, "
               f"noise {v.sigma:.1%}, positive below {1 - v.margin:.0%} of the reference")
    for n in v.slow_nodes:
        typer.echo(f"SLOW NODE  {n.node}  at {n.ratio:.0%}  score {n.score:.2f}  "
                   f"({'; '.join(n.evidence)})")
    for p in v.slow_pairs:
        typer.echo(f"SLOW PAIR  {p.a} <-> {p.b}  at {p.ratio:.0%}  score {p.score:.2f}  "
                   "(each fine with other partners: a link / path)")
    for u in v.ambiguous:
        typer.echo(f"AMBIGUOUS  {' '.join(u)}  (slow together twice, every half fine)")
    for u in v.transient:
        typer.echo(f"TRANSIENT  {' '.join(u)}  (slow once, fine on retest)")
    for note in v.notes:
        typer.echo(f"note: {note}")
    if v.pending:
        typer.echo(f"not final: {len(v.pending)} suspects still to test")
    elif not (v.slow_nodes or v.slow_pairs or v.ambiguous):
        typer.echo("no slow node or link found")


def register(group: typer.Typer) -> None:
    """Add ``slow-node plan | analyze | twin`` to the ``collective`` command group."""
    sn = typer.Typer(help="Localize slow nodes / links with rounds of disjoint nccl-tests runs.",
                     no_args_is_help=True)
    group.add_typer(sn, name="slow-node")

    @sn.command("plan", help=_PLAN_HELP)
    def plan_cmd(
        state_path: Path = typer.Option(..., "--state", help="Search state JSON (created on the first call)."),
        nodes: str | None = typer.Option(None, "--nodes", help="Start a search: a hostnames file or a count."),
        results: Path | None = typer.Option(None, "--results", help="Output folder (or JSON {test id: busbw}) of the pending round."),
        scheme: str = typer.Option("pair", "--scheme", help="pair or group."),
        kind: str = typer.Option("all_reduce_perf", "--kind", help="all_reduce_perf or sendrecv_perf (pair tests)."),
        group_size: int | None = typer.Option(None, "--group-size", help="Screen group size (group scheme; default from Hwang)."),
        expected_busbw: float | None = typer.Option(None, "--expected-busbw", help="Healthy busbw GB/s (default: the screen median)."),
        launcher: str = typer.Option("mpirun", "--launcher", help="mpirun or srun."),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per node (-g)."),
        bin_dir: str = typer.Option("", "--bin-dir", help="Folder of the nccl-tests binaries."),
        test_args: str = typer.Option("-b 256M -e 1G -f 2", "--test-args", help="nccl-tests size arguments."),
        out_dir: str = typer.Option("slownode-out", "--out-dir", help="Where the round writes its outputs."),
        script: Path | None = typer.Option(None, "--script", help="Write the round's script here (default: print it)."),
        as_json: bool = typer.Option(False, "--json", help="Print the round as JSON."),
    ) -> None:
        from fabricscope.collective import slownode as sl
        from fabricscope.model.errors import ConfigError

        if nodes is not None:
            if state_path.exists():
                raise ConfigError(f"--state: {state_path} exists; drop --nodes to continue it "
                                  "or give another --state")
            state = sl.new_search(_nodes(nodes), scheme=scheme, kind=kind, group_size=group_size,
                                  expected_busbw_gbs=expected_busbw)
            pending = None
        else:
            state, pending = _load(state_path)
        if pending is not None:
            if results is None:
                raise ConfigError(f"--results: round {pending.index} of {state_path} is planned "
                                  "but has no results; give its output folder")
            state = sl.record(state, pending, _results(pending, results))
        elif results is not None:
            raise ConfigError(f"--results: {state_path} has no pending round to read results for")
        nxt = sl.plan(state)
        state_path.write_text(json.dumps(sl.state_to_json(state, pending=nxt), indent=1))
        if nxt is None:
            typer.echo("search complete: nothing left to test")
            _print_verdict(sl.analyze(state))
            return
        text = sl.round_script(nxt, launcher=launcher, gpus_per_node=gpus_per_node,
                               bin_dir=bin_dir, test_args=test_args, out_dir=out_dir)
        if as_json:
            typer.echo(json.dumps({"round": nxt.index, "tests": [
                {"id": t.test_id, "nodes": list(t.nodes), "purpose": t.purpose, "kind": t.kind}
                for t in nxt.tests]}, indent=1))
        elif script is not None:
            script.write_text(text)
            typer.echo(f"round {nxt.index}: {len(nxt.tests)} tests -> {script}; outputs in "
                       f"{out_dir}/; then: slow-node plan --state {state_path} --results {out_dir}")
        else:
            typer.echo(text, nl=False)

    @sn.command("analyze", help=_ANALYZE_HELP)
    def analyze_cmd(
        state_path: Path = typer.Option(..., "--state", help="Search state JSON from `slow-node plan`."),
        results: Path | None = typer.Option(None, "--results", help="Output folder (or JSON {test id: busbw}) of the pending round."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
        db: Path | None = typer.Option(None, "--db", help="Add the findings to this diagnosis store (DuckDB)."),
    ) -> None:
        from fabricscope.collective import slownode as sl

        state, pending = _load(state_path)
        if pending is not None and results is not None:
            state = sl.record(state, pending, _results(pending, results))
            nxt = sl.plan(state)
            state_path.write_text(json.dumps(sl.state_to_json(state, pending=nxt), indent=1))
        v = sl.analyze(state)
        if db is not None:
            from fabricscope.diagnosis.model import Observed
            from fabricscope.store.findings import DiagnosisStore

            now = time.time_ns()
            with DiagnosisStore(db) as store:
                store.add_findings(Observed("collective", f, now)
                                   for f in v.findings(window=(now, now)))
        if as_json:
            typer.echo(json.dumps(v.to_json(), indent=1))
        else:
            _print_verdict(v)

    @sn.command("twin", help=_TWIN_HELP)
    def twin_cmd(
        nodes: int = typer.Option(64, "--nodes", help="Hosts in the twin (whole-search mode)."),
        slow: list[str] = typer.Option([], "--slow", help="NODE=FACTOR (rate left, in (0, 1]); repeat."),
        scheme: str = typer.Option("group", "--scheme", help="pair or group."),
        seed: int = typer.Option(0, "--seed", help="Noise seed."),
        noise: float = typer.Option(0.015, "--noise", help="Run-to-run noise (relative sd)."),
        state_path: Path | None = typer.Option(None, "--state", help="Run only the pending round of this search."),
        out_dir: Path = typer.Option(Path("slownode-out"), "--out-dir", help="Where --state mode writes the outputs."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        from fabricscope.model.errors import ConfigError
        from fabricscope.twin.collective_twin import run_plan_on_twin

        faults: dict[str, float] = {}
        for item in slow:
            host, sep, val = item.partition("=")
            try:
                faults[host.strip()] = float(val)
            except ValueError:
                sep = ""
            if not sep or not host.strip():
                raise ConfigError(f"--slow: {item!r}: expected NODE=FACTOR (host0005=0.7)")
        if state_path is not None:
            _twin_round(state_path, faults, out_dir, seed=seed, noise=noise)
            return
        r = run_plan_on_twin(nodes, faults, seed, scheme=scheme, noise_rel=noise)
        if as_json:
            typer.echo(json.dumps({"truth": list(r.truth), "correct": r.correct,
                                   "verdict": r.verdict.to_json()}, indent=1))
            return
        typer.echo(f"twin: {nodes} nodes, slow {faults or 'none'}, scheme {scheme}, seed {seed}")
        _print_verdict(r.verdict)
        typer.echo(f"truth {', '.join(r.truth) or 'none'}: "
                   f"{'localized exactly' if r.correct else 'NOT localized exactly'}")


def _twin_round(state_path: Path, slow: dict[str, float], out_dir: Path, *, seed: int,
                noise: float) -> None:
    """Run the pending round of a search on the twin; write one output per test."""
    import numpy as np

    from fabricscope.model.errors import ConfigError
    from fabricscope.twin.collective_twin import round_busbw, search_fabric, slow_faults

    state, pending = _load(state_path)
    if pending is None:
        raise ConfigError(f"--state: {state_path} has no pending round (plan one first)")
    fabric = search_fabric(len(state.nodes))
    hosts = {n: fabric.hosts[i].id for i, n in enumerate(state.nodes)}
    for n in slow:
        if n not in hosts:
            raise ConfigError(f"--slow: {n!r} is not a node of the search in {state_path}")
    faults = slow_faults(fabric, {hosts[n]: f for n, f in slow.items()})
    rng = np.random.default_rng([seed, pending.index])
    bws = round_busbw(fabric, [[hosts[x] for x in t.nodes] for t in pending.tests],
                      faults=faults, rng=rng, noise_rel=noise)
    out_dir.mkdir(parents=True, exist_ok=True)
    for t, bw in zip(pending.tests, bws, strict=True):
        (out_dir / f"{t.test_id}.txt").write_text(
            f"# fabricscope slow-node twin: {t.kind} on {' '.join(t.nodes)} (steady-state "
            f"estimate, not a full nccl-tests table)\n# Avg bus bandwidth    : {bw:g} \n")
    typer.echo(f"round {pending.index}: {len(pending.tests)} outputs -> {out_dir}/")
