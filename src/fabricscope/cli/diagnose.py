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

  fabricscope diagnose --twin rail-optimized:servers=8 --findings incidents.duckdb --llm http://127.0.0.1:9 --llm-model none   # no server there: the deterministic answer stands, with a note

With --llm, an OpenAI-compatible endpoint writes the explanation from the answer (docs/diagnosis-llm.md); a reply that names a resource the answer does not, cites evidence it does not have, or makes an uncited claim about a resource is rejected, and the deterministic answer stands.
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
        llm: str | None = typer.Option(
            None, "--llm", help="OpenAI-compatible endpoint (llama.cpp server, vLLM, Ollama) to "
            "write the explanation; off by default; the deterministic answer stands if it fails"),
        llm_model: str | None = typer.Option(None, "--llm-model", help="model name for --llm"),
        llm_key_env: str | None = typer.Option(
            None, "--llm-key-env", help="environment variable holding the endpoint's API key"),
    ) -> None:
        from fabricscope.diagnosis.knowledge import load_kb
        from fabricscope.model.errors import ConfigError
        from fabricscope.service.advisor import Inputs, advise, print_answer
        from fabricscope.service.supervise_twin import load_twin_fabric

        if (inventory is None) == (twin is None):
            raise ConfigError("diagnose: give the inventory: --inventory FILE or --twin SPEC")
        if llm is not None and not llm_model:
            raise ConfigError("--llm: give the model name with --llm-model")
        fabric = load_twin_fabric(str(inventory) if inventory is not None else str(twin))
        ans = advise(fabric, Inputs(findings, telemetry, probes, traces), symptom=symptom,
                     subject=subject, since=_time(since, "--since"),
                     until=_time(until, "--until"), kb=load_kb(kb),
                     progress=lambda m: typer.echo(m, err=True))
        exp = None
        if llm is not None and llm_model:
            from fabricscope.diagnosis.graph import ResourceMap
            from fabricscope.service.llm import LlmClient, explain

            client = LlmClient(llm, llm_model, api_key_env=llm_key_env)
            exp = explain(ans, symptom, client, ResourceMap(fabric).known, note=ans.notes.append)
        if as_json:
            doc = ans.to_json()
            if exp is not None and llm_model:
                from fabricscope.service.llm import explanation_to_json

                doc["explanation"] = explanation_to_json(exp, llm_model)
            typer.echo(json.dumps(doc, indent=1))
        else:
            print_answer(ans, echo=typer.echo)
            if exp is not None and llm_model:
                from fabricscope.service.llm import print_explanation

                print_explanation(exp, llm_model, echo=typer.echo)


def _time(text: str | None, flag: str) -> int | None:
    """ns: a plain integer, or a duration like 30s / 2m from the clock's zero."""
    if text is None:
        return None
    from fabricscope.service.supervise_twin import parse_time_s

    if text.strip().isdigit() and len(text.strip()) > 6:
        return int(text)
    return int(parse_time_s(text, source=flag) * 1e9)
