"""``fabricscope supervise``: the closed loop (instruments -> incidents -> root cause + action)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_HELP = """Run the closed loop: instruments -> findings -> incidents -> root cause + action.

On the twin (the only mode in this release): builds a digital twin of FABRIC, injects the faults given, runs the instruments on it on a simulated clock (switch telemetry through the production detectors, the mesh prober and its localizer, a training job's traces through the straggler analysis, transceiver DOM through the optics detector), joins their findings into incidents over the inventory graph and time, and diagnoses each with the specialists, the coordinator and the verifier over the knowledge base. Nothing is guessed from the injected truth: it is used only to score the result at the end.

FABRIC: an inventory file (.yaml/.json) or a builder spec such as rail-optimized:servers=32.

--fault KIND:SUBJECT[@START[-END]][,KEY=VALUE...]: KIND one of the twin's fault kinds (gray-loss, link-flap, link-down, link-degraded, congestion, micro-burst, pfc-storm, optic-degrading, switch-fault, nic-fault, slow-nic, slow-gpu, cpu-starved), SUBJECT an inventory id (a direction a->b or a cable a|b for link faults, a port, a switch, a NIC, host/gpuN, a host), START/END times from the start (30s, 2m), parameters optional with defaults (gray-loss loss=0.02, slow-nic factor=0.2, ...); optic-degrading takes mode=aging-laser|dirty-connector|bent-fiber|hot-module (each with its own DOM signature, CRC errors and probe loss from the RS(544,514) FEC cliff) or the default generic drift.

While it diagnoses, the coordinator runs active checks against the twin for its competing hypotheses, all at once, each with its modelled cost on the simulated clock (a gNMI Get of the suspect's port counters twice a second apart, its negotiated speed, an on-demand transceiver read); their results are evidence like any finding and are listed in the incident (--no-checks: passive evidence only).

Prints each incident (root cause, probability, time from the first symptom to the root cause, proposed action) and, with faults given, the injected truth against what was concluded. Actions are proposed, not executed here: the console (fabricscope serve) executes an approved action from the allow-list when an executor is configured.

Examples:

  fabricscope supervise --twin rail-optimized:servers=8 --duration 2m --fault "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@30s,loss=0.03"

  fabricscope supervise --twin rail-optimized:servers=8 --duration 2m --fault "pfc-storm:leaf-p0-r0-00:eth9@20s" --json loop.json --db incidents.duckdb

  fabricscope incidents list --db incidents.duckdb
"""


def register(app: typer.Typer) -> None:
    """Add the ``supervise`` command."""

    @app.command("supervise", help=_HELP)
    def supervise_cmd(
        twin: str = typer.Option("rail-optimized:servers=8", "--twin",
                                 help="inventory file or builder spec of the twin"),
        fault: list[str] = typer.Option([], "--fault",
                                        help="KIND:SUBJECT[@START[-END]][,KEY=VALUE...] (repeat)"),
        transport: list[str] = typer.Option([], "--transport",
                                            help='"incast|stuck-nic [start=..] [every=..] [end=..] '
                                                 '[k=v ...]" (repeat): a transport engine run the '
                                                 "twin plays into its counters (docs/telemetry.md)"),
        duration: str = typer.Option("3m", "--duration", help="simulated time to run (30s, 3m, 1h)"),
        tick: str = typer.Option("5s", "--tick", help="correlation interval (simulated)"),
        instruments: str = typer.Option("telemetry,probe,straggler,optics", "--instruments",
                                        help="comma-separated instruments to run"),
        kb: list[Path] = typer.Option([], "--kb", help="extra knowledge-base folder (repeat)"),
        seed: int = typer.Option(0, "--seed", help="twin noise seed"),
        json_out: Path | None = typer.Option(None, "--json", help="write incidents + score as JSON"),
        db: Path | None = typer.Option(None, "--db",
                                       help="DuckDB file to store findings and incidents in"),
        webhook: str | None = typer.Option(None, "--webhook",
                                           help="POST each new or changed incident (JSON) here"),
        cases: list[Path] = typer.Option([], "--cases",
                                         help="case-base folder (repeat): the coordinator "
                                              "consults its cases and the packaged seeds"),
        checks: bool = typer.Option(True, "--checks/--no-checks",
                                    help="run active checks against the twin for competing "
                                         "hypotheses"),
    ) -> None:
        from fabricscope.cli._outputs import check_output_file
        from fabricscope.service.supervise_loop import print_run, run_supervise

        if json_out is not None:
            check_output_file(json_out, flag="--json")
        if db is not None:
            check_output_file(db, flag="--db")
        doc = run_supervise(twin=twin, faults=fault, transport=transport, duration=duration, tick=tick,
                            instruments=instruments, kb_dirs=kb, seed=seed, db=db,
                            webhook=webhook, checks=checks, case_dirs=cases,
                            progress=lambda m: typer.echo(m, err=True))
        print_run(doc, echo=typer.echo)
        if json_out is not None:
            json_out.write_text(json.dumps(doc, indent=1))
            typer.echo(f"wrote {json_out}")
