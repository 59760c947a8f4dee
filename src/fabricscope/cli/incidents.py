"""``fabricscope incidents``: read the diagnosis store (list, show one, export)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from fabricscope.diagnosis.model import Incident, Observed
    from fabricscope.store.findings import DiagnosisStore

_TIMES = (
    "Times: the store holds nanoseconds. A value above 1e17 ns is a wall clock (live mode) "
    "and is printed as ISO 8601 UTC (2025-03-01T10:02:03.250Z); a smaller one is a simulated "
    "clock (the twin) and is printed as seconds from its 0 (12.500 s)."
)

_LIST_HELP = f"""List the incidents in a diagnosis store, newest first.

One row per incident:

  ID          the incident id (`incidents show` takes it, or any unique prefix of it)

  STATUS      open (symptoms present) or closed (symptoms cleared)

  SEVERITY    info | warning | critical

  ROOT CAUSE  the top-ranked root cause: resource (an inventory id) and fault type

  P           that root cause's probability

  OPENED      when the incident was opened

  TTRC        time to root cause (s): first symptom -> current top root cause named

  FINDINGS    how many findings (from every instrument) the incident groups

{_TIMES}

Examples:

  fabricscope incidents list --db incidents.duckdb

  fabricscope incidents list --db incidents.duckdb --status open --json
"""

_SHOW_HELP = f"""Show one incident: what happened, when, why, and what was done.

ID is an incident id, a unique prefix of one, or `latest` (the newest incident). Prints the title; the timeline (first symptom, detected, root cause, action, closed, each with its offset from the first symptom); the ranked root causes, each with its probability, the findings it explains (kind, subject, source instrument), its evidence lines, the checks run with their results (supports / excludes / inconclusive / not-run) and its action; the blast radius (links, GPUs, jobs, hosts affected); every finding of the incident; and the actions proposed or taken, in order. --json prints the incident with its findings inlined (one record of `incidents export`).

{_TIMES}

Examples:

  fabricscope incidents show latest --db incidents.duckdb

  fabricscope incidents show latest --db incidents.duckdb --json
"""

_EXPORT_HELP = """Write every incident with its findings inlined to a file, oldest first.

Each record is {"incident": {...}, "findings": [{...}, ...]}: the incident as the store holds it (ranked root causes with their checks, timeline in ns, blast radius, actions) and the findings it groups. --format json writes one document {"format": "fabricscope-incidents", "version": 1, "incidents": [record, ...]}; jsonl writes one record per line. Without --format it follows the --out suffix (.jsonl: jsonl, otherwise json).

Examples:

  fabricscope incidents export --db incidents.duckdb --out incidents.json

  fabricscope incidents export --db incidents.duckdb --out incidents.jsonl --format jsonl
"""

_WALL_NS = 10**17  # above: Unix-epoch nanoseconds (1973+); below: a simulated clock
EXPORT_FORMAT = "fabricscope-incidents"
EXPORT_VERSION = 1


def register(app: typer.Typer) -> None:
    """Add the ``incidents`` command group (``list``, ``show``, ``export``)."""
    grp = typer.Typer(
        help="Read the incidents the diagnosis opened: root causes, timelines, evidence.\n\n"
        "Examples:\n\n"
        "  fabricscope incidents list --db incidents.duckdb\n\n"
        "  fabricscope incidents show latest --db incidents.duckdb\n\n"
        "  fabricscope incidents export --db incidents.duckdb --out incidents.json",
        no_args_is_help=True,
    )
    app.add_typer(grp, name="incidents")

    @grp.command("list", help=_LIST_HELP)
    def list_cmd(
        db: Path = typer.Option(..., "--db", help="diagnosis store (DuckDB file)"),
        status: str = typer.Option("all", "--status", help="open | closed | all"),
        as_json: bool = typer.Option(False, "--json", help="print the rows as JSON"),
    ) -> None:
        from fabricscope.model.errors import ConfigError

        if status not in ("open", "closed", "all"):
            raise ConfigError(f"incidents list: --status {status!r}: choose open, closed or all")
        with _open(db, "incidents list") as store:
            incs = store.incidents(status=None if status == "all" else status)
        if as_json:
            typer.echo(json.dumps({"db": str(db), "incidents": [_summary(i) for i in incs]},
                                  indent=1))
            return
        if not incs:
            typer.echo("no incidents" + ("" if status == "all" else f" ({status})")
                       + f" in {db}")
            return
        typer.echo(_table(incs))

    @grp.command("show", help=_SHOW_HELP)
    def show_cmd(
        incident_id: str = typer.Argument(..., metavar="ID",
                                          help="incident id, unique prefix, or latest"),
        db: Path = typer.Option(..., "--db", help="diagnosis store (DuckDB file)"),
        as_json: bool = typer.Option(False, "--json",
                                     help="print the incident with its findings as JSON"),
    ) -> None:
        with _open(db, "incidents show") as store:
            inc = _lookup(store, incident_id, db)
            found = store.findings(ids=inc.findings)
        if as_json:
            typer.echo(json.dumps(_record(inc, found), indent=1))
            return
        typer.echo(_show(inc, {o.id: o for o in found}))

    @grp.command("export", help=_EXPORT_HELP)
    def export_cmd(
        db: Path = typer.Option(..., "--db", help="diagnosis store (DuckDB file)"),
        out: Path = typer.Option(..., "--out", "-o", help="file to write (.json / .jsonl)"),
        fmt: str | None = typer.Option(None, "--format",
                                       help="json | jsonl (default: from the --out suffix)"),
    ) -> None:
        from fabricscope.cli._outputs import check_output_file
        from fabricscope.model.errors import ConfigError

        if fmt is None:
            fmt = "jsonl" if out.suffix.lower() == ".jsonl" else "json"
        if fmt not in ("json", "jsonl"):
            raise ConfigError(f"incidents export: --format {fmt!r}: choose json or jsonl")
        check_output_file(out, flag="--out")
        with _open(db, "incidents export") as store:
            incs = list(reversed(store.incidents()))
            found = {o.id: o for o in store.findings(ids=sorted({f for i in incs
                                                                 for f in i.findings}))}
        records = [_record(i, [found[f] for f in i.findings if f in found]) for i in incs]
        if fmt == "json":
            text = json.dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                               "db": str(db), "incidents": records}, indent=1) + "\n"
        else:
            text = "".join(json.dumps(r) + "\n" for r in records)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(out)  # a reader never sees half a file
        n_f = sum(len(r["findings"]) for r in records)
        typer.echo(f"wrote {out}: {len(records)} incident(s), {n_f} finding(s) ({fmt})")


def _open(db: Path, cmd: str) -> DiagnosisStore:
    from fabricscope.model.errors import ConfigError
    from fabricscope.store.findings import DiagnosisStore

    if not db.exists():
        raise ConfigError(f"{cmd}: --db {db}: no such file (a diagnosis store is written by "
                          "`fabricscope supervise --db FILE`)")
    if db.is_dir():
        raise ConfigError(f"{cmd}: --db {db}: is a folder (give the DuckDB file)")
    return DiagnosisStore(db, read_only=True)


def _lookup(store: DiagnosisStore, incident_id: str, db: Path) -> Incident:
    from fabricscope.model.errors import ConfigError

    if incident_id == "latest":
        newest = store.incidents()
        if not newest:
            raise ConfigError(f"incidents show: no incidents in {db}")
        return newest[0]
    inc = store.incident(incident_id)
    if inc is None:
        raise ConfigError(f"incidents show: no incident {incident_id!r} in {db} "
                          "(`fabricscope incidents list --db FILE` shows the ids)")
    return inc


def fmt_time(ns: int | None) -> str:
    """ISO 8601 UTC for a wall-clock time (> 1e17 ns), else seconds of a simulated clock."""
    if ns is None:
        return "-"
    if ns > _WALL_NS:
        t = datetime.fromtimestamp(ns // 1_000_000 / 1000, tz=UTC)
        return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{ns / 1e9:.3f} s"


def _seconds(a_ns: int | None, b_ns: int | None) -> float | None:
    return None if a_ns is None or b_ns is None else (b_ns - a_ns) / 1e9


def _summary(i: Incident) -> dict[str, Any]:
    top = i.root_causes[0] if i.root_causes else None
    return {
        "id": i.id, "status": i.status, "severity": i.severity, "title": i.title,
        "root_cause": None if top is None else {
            "resource": top.resource, "fault": top.fault, "probability": top.probability},
        "opened_ns": i.opened_ns, "first_symptom_ns": i.first_symptom_ns,
        "root_cause_ns": i.root_cause_ns,
        "time_to_root_cause_s": _seconds(i.first_symptom_ns, i.root_cause_ns),
        "findings": len(i.findings),
    }


def _record(i: Incident, found: Sequence[Observed]) -> dict[str, Any]:
    from fabricscope.diagnosis.serialize import incident_to_json, observed_to_json

    return {"incident": incident_to_json(i), "findings": [observed_to_json(o) for o in found]}


def _table(incs: Sequence[Incident]) -> str:
    head = ("ID", "STATUS", "SEVERITY", "ROOT CAUSE", "P", "OPENED", "TTRC", "FINDINGS")
    rows = []
    for i in incs:
        top = i.root_causes[0] if i.root_causes else None
        ttrc = _seconds(i.first_symptom_ns, i.root_cause_ns)
        rows.append((i.id, i.status, i.severity,
                     f"{top.resource} {top.fault}" if top else "(not yet)",
                     f"{top.probability:.2f}" if top else "-", fmt_time(i.opened_ns),
                     "-" if ttrc is None else f"{ttrc:.1f} s", str(len(i.findings))))
    widths = [max(len(r[k]) for r in (head, *rows)) for k in range(len(head))]
    right = {4, 6, 7}

    def line(r: Sequence[str]) -> str:
        cells = [c.rjust(w) if k in right else c.ljust(w)
                 for k, (c, w) in enumerate(zip(r, widths, strict=True))]
        return "  ".join(cells).rstrip()

    return "\n".join([line(head), *(line(r) for r in rows)])


def _describe(fid: str, found: Mapping[str, Observed]) -> str:
    o = found.get(fid)
    return f"{fid} (not in the store)" if o is None else f"{fid} {o.kind} on {o.subject} ({o.source})"


def _show(i: Incident, found: Mapping[str, Observed]) -> str:
    out = [f"incident {i.id}  {i.status}  {i.severity}"]
    if i.title:
        out.append(f"  {i.title}")
    out.append("timeline")
    for name, ns in (("first symptom", i.first_symptom_ns), ("detected", i.detected_ns),
                     ("root cause", i.root_cause_ns), ("action", i.action_ns),
                     ("closed", i.closed_ns)):
        d = _seconds(i.first_symptom_ns, ns)
        off = "" if d is None or name == "first symptom" else f"   (+{d:.3f} s)"
        out.append(f"  {name:<15}{fmt_time(ns)}{off}")
    out.append("root causes (ranked)" if i.root_causes else "root causes: none named yet")
    for k, r in enumerate(i.root_causes, 1):
        by = f"  [{r.specialist}]" if r.specialist else ""
        out.append(f"  {k}. {r.resource}  {r.fault}  probability {r.probability:.3f}{by}")
        if r.explains:
            out.append("     explains:")
            out.extend(f"       {_describe(f, found)}" for f in r.explains)
        if r.evidence:
            out.append("     evidence:")
            out.extend(f"       - {e}" for e in r.evidence)
        if r.checks:
            out.append("     checks:")
            for c in r.checks:
                detail = f": {c.detail}" if c.detail else ""
                out.append(f"       {c.result:<13} {c.name} ({c.source}){detail}")
        if r.action:
            out.append(f"     action: {r.action}")
    blast = ", ".join(f"{k} {v}" for k, v in i.blast.items())
    out.append(f"blast radius: {blast or 'not assessed'}")
    out.append(f"findings ({len(i.findings)})")
    rows = [(fid, "(not in the store)", "", "", "", "") if (o := found.get(fid)) is None else
            (fid, o.source, o.kind, o.subject, f"score {o.finding.score:.2f}",
             f"window {fmt_time(o.finding.window[0])} .. {fmt_time(o.finding.window[1])}")
            for fid in i.findings]
    if rows:
        widths = [max(len(r[k]) for r in rows) for k in range(6)]
        out.extend("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                   for r in rows)
    out.append("actions taken" if i.actions else "actions taken: none")
    out.extend(f"  - {a}" for a in i.actions)
    return "\n".join(out)
