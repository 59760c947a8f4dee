"""``fabricscope straggler``: localize the slow GPU / NIC / switch behind irregular iterations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

_ANALYZE_HELP = """Find what slows a training job, from per-rank operator traces.

PATH: trace files or folders of any supported format, mixed freely: PyTorch profiler (Kineto) JSON/.json.gz, one file per rank (NCCL or gloo); the ByteDance per-op Parquet table (trace-*.parquet); the compact fabricscope format (.jsonl[.gz] / .parquet, docs/straggler.md). An unreadable file is reported and skipped; the rest is analyzed.

Prints a ranked table: device culprits (slow-gpu, slow-nic, slow-switch) with a posterior probability and the evidence, then workload imbalance (a heavier pipeline stage, sequence lengths) which is never reported as a faulty device; and the estimated slowdown (actual / ideal iteration time).

Examples:

  fabricscope straggler analyze traces/   # a folder of rank*.json.gz

  fabricscope straggler analyze trace-AR.parquet --json

  fabricscope straggler twin run --fault slow-nic   # traces with a known culprit, then:

  fabricscope straggler analyze run/ --inventory run/inventory.json --plot culprit.png

  fabricscope straggler analyze run/kineto --inventory run/inventory.json --placement run/truth.json
"""

_TWIN_HELP = """Generate twin traces of a DP x TP x PP job with an injected fault, with the truth.

Writes OUTDIR/kineto/rank<N>.json.gz, OUTDIR/trace.jsonl, OUTDIR/truth.json and OUTDIR/inventory.json (a rail-optimized cluster); then try `straggler analyze` on it. A folder that already holds a run is refused unless --force, which replaces it (rank files of a larger earlier run are removed, so `analyze` never mixes two runs).

Examples:

  fabricscope straggler twin /tmp/run --fault slow-nic

  fabricscope straggler twin /tmp/run --fault slow-gpu --dp 4 --pp 4 --seed 7 --force   # replaces /tmp/run

  fabricscope straggler twin /tmp/imbalance --fault stage-imbalance --comm alpha-beta

  fabricscope straggler twin /tmp/deep --fault none --schedule 1f1b --pp 8 --dp 1 --tp 1   # also writes OUTDIR/bytedance/trace-twin.parquet (ByteDance's schema)
"""


def register(app: typer.Typer) -> None:
    """Add the ``straggler`` command group (``analyze``, ``twin``)."""
    grp = typer.Typer(
        help="Localize training stragglers (slow GPU, NIC, link) from per-rank traces.\n\n"
        "Examples:\n\n  fabricscope straggler analyze traces/\n\n"
        "  fabricscope straggler twin /tmp/run --fault slow-nic",
        no_args_is_help=True,
    )
    app.add_typer(grp, name="straggler")

    @grp.command("analyze", help=_ANALYZE_HELP)
    def analyze_cmd(
        paths: list[Path] = typer.Argument(..., help="trace files or folders"),
        inventory: Path | None = typer.Option(None, "--inventory", "-i",
                                              help="fabric inventory (.yaml/.json): name GPUs, NICs, links"),
        placement: Path | None = typer.Option(None, "--placement",
                                              help='rank placement JSON {"ranks": \\[\\["host0000", 0], ...]} (rank i on host, GPU index)'),
        plot: Path | None = typer.Option(None, "--plot", help="write a timeline plot (.png/.svg)"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
        top: int | None = typer.Option(None, "--top",
                                       help="rows of candidates to show (default 5; with "
                                            "--json all, unless given)"),
    ) -> None:
        from rich.console import Console

        from fabricscope.straggler.pipeline import analyze_paths

        _check_analyze_args(inventory=inventory, placement=placement, plot=plot, top=top)

        console = Console(stderr=as_json)
        if not console.is_terminal:
            # Piped or redirected: no terminal width to respect, so lines are not wrapped
            # (a grep or a log file wants one line per item, not Rich's default 80).
            console = Console(stderr=as_json, width=_PIPE_WIDTH, soft_wrap=True)
        with console.status("reading traces and localizing ..."):
            res, report = analyze_paths(paths, inventory=inventory, placement=placement)
        if plot is not None:
            from fabricscope.straggler.plot import plot_report

            plot_report(report, plot)
        if as_json:
            doc = report.to_json()
            doc["unused_inputs"] = res.unused
            if top is not None:
                doc["candidates"] = list(report.candidates[:top])
            typer.echo(json.dumps(doc, indent=1))
            return
        _print_report(console, report, top=5 if top is None else top, n_rows=len(res.table))
        if plot is not None:
            console.print(f"plot: {plot}")

    @grp.command("twin", help=_TWIN_HELP)
    def twin_cmd(
        outdir: Path = typer.Argument(..., help="output folder"),
        fault: str = typer.Option("slow-nic", "--fault",
                                  help="none | slow-gpu | slow-nic | link-degraded | congestion | "
                                       "switch-fault | stage-imbalance | sequence-imbalance"),
        dp: int = typer.Option(4, "--dp", help="data-parallel size"),
        tp: int = typer.Option(2, "--tp", help="tensor-parallel size (GPUs of one server)"),
        pp: int = typer.Option(2, "--pp", help="pipeline-parallel size (stages)"),
        iterations: int = typer.Option(12, "--iterations", help="training iterations traced"),
        comm: str = typer.Option("engine", "--comm", help="engine (flow engine) | alpha-beta"),
        seed: int = typer.Option(0, "--seed", help="noise and fault-start seed"),
        schedule: str = typer.Option("gpipe", "--schedule",
                                     help="gpipe | 1f1b (Megatron 1F1B: fused p2p calls, "
                                          "wait-inclusive recv, as in ByteDance's traces)"),
        force: bool = typer.Option(False, "--force",
                                   help="replace a run already in OUTDIR (its stale rank files "
                                        "are removed)"),
    ) -> None:
        from fabricscope.cli._run_folder import prepare_twin_folder, remove_stale_ranks
        from fabricscope.service.demo_straggler import write_twin_scenario

        _check_twin_args(fault=fault, dp=dp, tp=tp, pp=pp, iterations=iterations, comm=comm,
                         seed=seed)
        if schedule not in ("gpipe", "1f1b"):
            from fabricscope.model.errors import ConfigError

            raise ConfigError(f"--schedule: unknown {schedule!r}; choose gpipe or 1f1b")
        prepare_twin_folder(outdir, force=force)
        info = write_twin_scenario(outdir, fault=fault, dp=dp, tp=tp, pp=pp,
                                   iterations=iterations, comm=comm, seed=seed,
                                   schedule=schedule)
        stale = remove_stale_ranks(outdir, dp * tp * pp)
        if stale:
            typer.echo(f"removed {len(stale)} rank file(s) of the earlier, larger run "
                       f"({stale[0].name} ...)")
        typer.echo(f"wrote {outdir}: {info['ranks']} ranks, injected {info['injected']}")
        typer.echo(f"try: fabricscope straggler analyze {outdir}/kineto "
                   f"--inventory {outdir}/inventory.json")


_PIPE_WIDTH = 4096
# A twin larger than this is not a CLI experiment (32k GPUs is the scale the twin targets).
_MAX_TWIN_RANKS = 32768
_MAX_TWIN_ITERATIONS = 10_000


def _check_analyze_args(*, inventory: Path | None, placement: Path | None, plot: Path | None,
                        top: int | None) -> None:
    """Reject flags that would be ignored or fail late, before any trace is read."""
    from fabricscope.cli._outputs import check_output_file
    from fabricscope.model.errors import ConfigError

    if top is not None and top < 1:
        raise ConfigError(f"--top {top}: give the number of candidate rows to show (>= 1)")
    if placement is not None and inventory is None:
        raise ConfigError(f"--placement {placement}: needs --inventory (the placement names "
                          f"the inventory's hosts and GPUs; without one it would be ignored)")
    for flag, path in (("--inventory", inventory), ("--placement", placement)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{flag} {path}: no such file")
    if plot is not None:
        check_output_file(plot, flag="--plot", suffixes=(".png", ".svg"))


def _check_twin_args(*, fault: str, dp: int, tp: int, pp: int, iterations: int, comm: str,
                     seed: int) -> None:
    """Reject impossible twin shapes and unknown names before the folder is touched."""
    from fabricscope.model.errors import ConfigError
    from fabricscope.service.demo_straggler import _FAULTS as FAULT_KINDS

    for flag, value in (("--dp", dp), ("--tp", tp), ("--pp", pp), ("--iterations", iterations)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: must be >= 1")
    if dp * tp * pp > _MAX_TWIN_RANKS:
        raise ConfigError(f"--dp {dp} x --tp {tp} x --pp {pp} = {dp * tp * pp} ranks; the twin "
                          f"takes at most {_MAX_TWIN_RANKS}")
    if iterations > _MAX_TWIN_ITERATIONS:
        raise ConfigError(f"--iterations {iterations}: at most {_MAX_TWIN_ITERATIONS}")
    if seed < 0:
        raise ConfigError(f"--seed {seed}: must be >= 0")
    if fault not in FAULT_KINDS:
        raise ConfigError(f"--fault {fault!r}: unknown; choose one of {', '.join(FAULT_KINDS)}")
    if comm not in ("engine", "alpha-beta"):
        raise ConfigError(f"--comm {comm!r}: unknown; choose engine or alpha-beta")


def _print_findings(console: object, findings: list[Any]) -> None:
    """Findings as indented blocks, not table cells: at 80 columns a six-column table folds
    one finding's evidence into ~40 lines; a block keeps it within a screen (~12 lines)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    assert isinstance(console, Console)
    console.print("[bold]findings (ranked)[/]")
    for k, f in enumerate(findings, 1):
        color = "yellow" if f.kind == "imbalance" else "red"
        head = Text(f"{k:>2}. ")
        head.append(f.kind, style=color)
        head.append(f"  {f.subject}  probability {f.score:.3f}", style="bold")
        console.print(head)
        body = Table.grid(padding=(0, 1))
        body.add_column(justify="right", width=4)
        body.add_column(overflow="fold")
        for line in f.evidence:
            body.add_row("-", Text(line))
        if f.action:
            body.add_row(">", Text(f"action: {f.action}"))
        console.print(body)


def _print_report(console: object, report: object, *, top: int, n_rows: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from fabricscope.straggler.analysis import Report

    assert isinstance(console, Console) and isinstance(report, Report)
    its = report.iterations
    console.print(f"[bold]{report.job}[/]: {n_rows:,} operators, {len(its.iterations)} iterations; "
                  f"mean iteration {report.actual_ns / 1e6:.1f} ms (dependency replay "
                  f"{report.replayed_ns / 1e6:.1f} ms), ideal {report.ideal_ns / 1e6:.1f} ms "
                  f"-> slowdown [bold]{report.slowdown:.2f}x[/]")
    console.print(f"slowdown estimates: {report.slowdown:.2f}x what the findings cost "
                  f"(dependency replay with their operators idealized), "
                  f"{report.slowdown_all:.2f}x with every operator idealized (OSDI'25 ideal), "
                  f"{report.slowdown_excess:.2f}x by removing the findings' measured excess")
    if its.irregular:
        console.print(f"irregular iterations (step ids): {', '.join(map(str, its.irregular[:12]))}"
                      + (" ..." if len(its.irregular) > 12 else ""))
    if its.change_points:
        at = ", ".join(f"{sid} (#{pos} of {len(its.iterations)})"
                       for sid, pos in zip(its.change_points, its.change_point_index, strict=False))
        console.print(f"change points at step ids: {at}")
    if report.findings:
        _print_findings(console, report.findings)
    else:
        console.print("[green]no culprit: no device or imbalance explains the timings[/]")
    if report.candidates:
        # The table must agree with the verdict: each row says whether it was reported and,
        # if not, why (its posterior alone is evidence, not a verdict).
        title = ("top candidates (MAP ranking)" if report.device_findings() else
                 "candidates considered (none reported as a device fault)")
        cand = Table(title=title)
        for col in ("subject", "kind", "LLR", "posterior", "verdict"):
            cand.add_column(col, overflow="fold")
        for c in report.candidates[:top]:
            cand.add_row(str(c["subject"]), str(c["kind"]), str(c["llr"]), str(c["posterior"]),
                         str(c.get("verdict", "")))
        console.print(cand)
    for w in report.warnings[:20]:
        console.print(f"[yellow]warning:[/] {w}")
    if len(report.warnings) > 20:
        console.print(f"[yellow]... {len(report.warnings) - 20} more warnings (--json shows all)[/]")
