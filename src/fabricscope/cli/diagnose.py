"""``fabricscope diagnose``: advisor mode (an operator's symptom -> root causes and a plan)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_HELP = """Advisor: ranked root causes, their evidence and a troubleshooting plan for a symptom.

Reads every input given and keeps the window [--since, --until] (ns on the data's clock, or times like 30s / 2m from its start for twin data): findings a `supervise` run stored (--findings), the detector findings of a telemetry store written by `gnmi collect` (--telemetry), probes stored by `probe agent` / `probe twin` analysed over the window (--probes), and training traces through the straggler analysis (--traces). It joins the findings into incidents over the inventory graph and diagnoses each with the seven specialists, the coordinator and the verifier over the knowledge base (--kb adds your own entries).

The focus is --subject or the inventory ids named in --symptom; without either, every incident is answered. Output: root causes ranked by probability, each with the findings it explains, the checks the specialists ran (supports / excludes / not run) and the action; then the plan: the knowledge base's checks for the leading causes, in order, with what each result would mean. No input, or findings that name nothing in the inventory, exit 2.

Examples:

  fabricscope supervise --twin rail-optimized:servers=8 --duration 2m --fault "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@30s,loss=0.03" --db incidents.duckdb

  fabricscope diagnose --twin rail-optimized:servers=8 --findings incidents.duckdb --symptom "job slow, host0002 retransmits"

  fabricscope diagnose --twin rail-optimized:servers=8 --findings incidents.duckdb --subject leaf-p0-r1-00 --json
"""


def register(app: typer.Typer) -> None:
    """Add the ``diagnose`` command."""

    @app.command("diagnose", help=_HELP)
    def diagnose_cmd(
        inventory: Path | None = typer.Option(None, "--inventory", "-i",
                                              help="fabric inventory (.yaml/.json)"),
        twin: str | None = typer.Option(None, "--twin",
                                        help="or a builder spec of the inventory (the twin's)"),
        findings: list[Path] = typer.Option([], "--findings",
                                            help="diagnosis store (DuckDB) from `supervise --db`"),
        telemetry: list[Path] = typer.Option([], "--telemetry",
                                             help="telemetry store (DuckDB) from `gnmi collect`"),
        probes: list[Path] = typer.Option([], "--probes", help="probe store (DuckDB)"),
        traces: list[Path] = typer.Option([], "--traces", help="trace files or folders"),
        symptom: str | None = typer.Option(None, "--symptom", help="what the operator sees"),
        subject: str | None = typer.Option(None, "--subject", help="an inventory id to focus on"),
        since: str | None = typer.Option(None, "--since", help="window start"),
        until: str | None = typer.Option(None, "--until", help="window end"),
        kb: list[Path] = typer.Option([], "--kb", help="extra knowledge-base folder (repeat)"),
        as_json: bool = typer.Option(False, "--json", help="print the answer as JSON"),
    ) -> None:
        from fabricscope.diagnosis.knowledge import load_kb
        from fabricscope.model.errors import ConfigError
        from fabricscope.service.advisor import Inputs, advise, print_answer
        from fabricscope.service.supervise_twin import load_twin_fabric

        if (inventory is None) == (twin is None):
            raise ConfigError("diagnose: give the inventory: --inventory FILE or --twin SPEC")
        fabric = load_twin_fabric(str(inventory) if inventory is not None else str(twin))
        ans = advise(fabric, Inputs(findings, telemetry, probes, traces), symptom=symptom,
                     subject=subject, since=_time(since, "--since"),
                     until=_time(until, "--until"), kb=load_kb(kb),
                     progress=lambda m: typer.echo(m, err=True))
        if as_json:
            typer.echo(json.dumps(ans.to_json(), indent=1))
        else:
            print_answer(ans, echo=typer.echo)


def _time(text: str | None, flag: str) -> int | None:
    """ns: a plain integer, or a duration like 30s / 2m from the clock's zero."""
    if text is None:
        return None
    from fabricscope.service.supervise_twin import parse_time_s

    if text.strip().isdigit() and len(text.strip()) > 6:
        return int(text)
    return int(parse_time_s(text, source=flag) * 1e9)
