"""Advisor mode: an operator's symptom + whatever stores exist -> ranked root causes and a plan.

Reads findings from every input given (a diagnosis store written by ``supervise``, a telemetry
store's detector findings, a probe store analysed over the window, training traces through
the straggler analysis), keeps the window ``[since, until]``, joins them into incidents with the
same :class:`~fabricscope.diagnosis.incidents.Correlator` the supervisor uses, and answers for
the operator's focus (a subject, or the resources named in the symptom text; everything when
neither is given): the ranked root causes with probability, their evidence, the checks run,
and a troubleshooting plan (the knowledge base's checks for the leading types, in order, with
what each result would mean). No data, or inputs that name nothing in the inventory, exit 2.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator, CorrelatorParams
from fabricscope.diagnosis.knowledge import KnowledgeBase, load_kb
from fabricscope.diagnosis.model import Incident, Observed, RootCause
from fabricscope.diagnosis.serialize import incident_to_json
from fabricscope.diagnosis.specialists import Coverage
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding

NS = 1_000_000_000


@dataclass
class Inputs:
    """Where the advisor reads from (any subset; at least one)."""

    findings_db: Sequence[Path] = ()
    telemetry_db: Sequence[Path] = ()
    probes_db: Sequence[Path] = ()
    traces: Sequence[Path] = ()


@dataclass
class Answer:
    """The advisor's answer (JSON via :meth:`to_json`)."""

    focus: list[str]
    incidents: list[Incident]
    ranked: list[tuple[str, RootCause]]  # (incident id, root cause), best first
    plan: list[dict[str, str]]
    sources: dict[str, int]
    window: tuple[int | None, int | None]
    seconds: float
    notes: list[str] = field(default_factory=list)
    unexplained: list[Observed] = field(default_factory=list)  # findings no incident holds

    def to_json(self) -> dict[str, Any]:
        return {
            "focus": self.focus, "window_ns": list(self.window), "sources": self.sources,
            "root_causes": [{"incident": i, "resource": rc.resource, "fault": rc.fault,
                             "probability": rc.probability, "specialist": rc.specialist,
                             "evidence": list(rc.evidence), "action": rc.action,
                             "checks": [{"name": c.name, "source": c.source, "result": c.result,
                                         "detail": c.detail} for c in rc.checks]}
                            for i, rc in self.ranked],
            "plan": self.plan, "incidents": [incident_to_json(i) for i in self.incidents],
            "unexplained_findings": [{"id": o.id, "source": o.source, "kind": o.kind,
                                      "subject": o.subject, "score": o.finding.score,
                                      "evidence": list(o.finding.evidence)}
                                     for o in self.unexplained],
            "notes": self.notes, "seconds": round(self.seconds, 3),
        }


def _in_window(f: Finding, since: int | None, until: int | None) -> bool:
    return (since is None or f.window[1] >= since) and (until is None or f.window[0] <= until)


def gather(fabric: Fabric, inputs: Inputs, *, since: int | None, until: int | None,
           progress: Callable[[str], None] | None = None) -> tuple[list[Observed], dict[str, int]]:
    """Every finding of the inputs in the window, as Observed records, and counts per source."""
    out: list[Observed] = []
    counts: dict[str, int] = {}

    def add(source: str, fs: Sequence[Finding]) -> None:
        kept = [f for f in fs if _in_window(f, since, until)]
        counts[source] = counts.get(source, 0) + len(kept)
        out.extend(Observed(source, f, int(f.window[1])) for f in kept)

    for p in inputs.findings_db:
        from fabricscope.store.findings import DiagnosisStore

        _exists(p, "--findings")
        with DiagnosisStore(p) as st:
            obs = [o for o in st.findings(since_ns=since, until_ns=until)]
        counts["findings-db"] = counts.get("findings-db", 0) + len(obs)
        out.extend(obs)
    for p in inputs.telemetry_db:
        from fabricscope.store.telemetry import findings_of, open_readonly

        _exists(p, "--telemetry")
        _require_tables(p, ("telemetry", "findings"), "--telemetry", "a telemetry store "
                        "written by `gnmi collect`")
        con = open_readonly(p)
        try:
            row = con.execute("SELECT count(*) FROM telemetry").fetchone()
            if not row or not row[0]:
                # no updates at all: no data, not a healthy fabric
                raise ConfigError(f"--telemetry {p}: the store holds no telemetry updates: "
                                  "nothing to diagnose from")
            add("telemetry", findings_of(con))
        finally:
            con.close()
    for p in inputs.probes_db:
        from fabricscope.store.probes import ProbeStore

        _exists(p, "--probes")
        _require_tables(p, ("probes",), "--probes", "a probe store written by `probe agent` "
                        "or `probe twin`")
        if progress is not None:
            progress(f"analysing the probes in {p}")
        ps = ProbeStore(p)
        try:
            totals = ps.window_totals(t0_ns=since, t1_ns=until)
            if not totals.n_probes:
                raise ConfigError(f"--probes {p}: no probes in the window "
                                  f"[{since if since is not None else 'start'}, "
                                  f"{until if until is not None else 'end'}]: nothing to analyse")
            found = _analyze_probes(fabric, ps, totals, since, until)
        finally:
            ps.close()
        w = totals.window
        add("probe", [Finding(f.kind, f.subject, f.score, w, f.evidence, f.action, f.details)
                      for f in found])
    if inputs.traces:
        from fabricscope.straggler.pipeline import analyze_paths

        for p in inputs.traces:
            _exists(p, "--traces")
        if progress is not None:
            progress("analysing the training traces")
        _, report = analyze_paths(list(inputs.traces))
        add("straggler", list(report.findings))
    return out, counts


def _analyze_probes(fabric: Fabric, store: Any, totals: Any, since: int | None,
                    until: int | None) -> list[Finding]:
    """:func:`~fabricscope.service.probe_live.analyze_observations` without traced paths,
    from the window's per-flow totals (one GROUP BY in the store) and the candidate-set path
    model bound in bulk.

    Stored probes carry no paths, so every flow's row is the even ECMP split of its NIC pair
    (``Routing.spray_many``), one shared row per pair
    (:meth:`~fabricscope.probe.localize.PathModel.bind_candidates`); responder times are
    read only per responder NIC and for the suspect hosts
    (:func:`~fabricscope.probe.analysis.analyze_totals`). The findings are those of the
    per-probe analysis (docs/benchmarks/diagnosis-advisor.md). Flows naming a device
    outside the inventory take the per-probe path, which reports them as before.
    """
    from fabricscope.fabric.routing import Routing
    from fabricscope.probe.analysis import Baseline, analyze_totals
    from fabricscope.probe.localize import PathModel
    from fabricscope.service.probe_live import analyze_observations

    flows = totals.flows
    try:
        src, dst = flows.bind_nodes(fabric.index.node_of)
    except KeyError:
        return analyze_observations(fabric, store.observations(t0_ns=since, t1_ns=until))
    baseline = Baseline()  # learned from the same window, as analyze_observations does
    baseline.learn_totals(totals)
    model = PathModel(fabric)
    model.bind_candidates(flows, src, dst, spray=Routing(fabric).spray_many)
    return analyze_totals(fabric, model, totals,
                          store.responder_times(t0_ns=since, t1_ns=until), baseline)


def _exists(p: Path, flag: str) -> None:
    if not Path(p).exists():
        raise ConfigError(f"{flag} {p}: no such file or folder")


def _require_tables(p: Path, tables: Sequence[str], flag: str, what: str) -> None:
    """One clear line when ``p`` is not the kind of store ``flag`` takes (opened read-only, so a
    wrong file is never changed)."""
    import duckdb

    try:
        con = duckdb.connect(str(p), read_only=True)
    except duckdb.Error as exc:
        raise ConfigError(f"{flag} {p}: not a readable DuckDB file: {str(exc).splitlines()[0]}"
                          ) from None
    try:
        have = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()
    missing = [t for t in tables if t not in have]
    if missing:
        raise ConfigError(f"{flag} {p}: not {what} (no table {', '.join(missing)}; it has "
                          f"{', '.join(sorted(have)) or 'no tables'})")


_TOKEN = re.compile(r"[A-Za-z0-9_./:\-|>]+")


def focus_of(rmap: ResourceMap, subject: str | None, symptom: str | None) -> list[str]:
    """The inventory ids the operator points at (``--subject`` and ids in the symptom text)."""
    out: list[str] = []
    if subject:
        if not rmap.known(subject):
            raise ConfigError(f"--subject {subject!r}: not an id of the inventory")
        out.append(subject)
    for tok in _TOKEN.findall(symptom or ""):
        tok = tok.strip(".,;:")
        if tok and rmap.known(tok) and not tok.startswith("job"):
            out.append(tok)
    return list(dict.fromkeys(out))


def _near_focus(rmap: ResourceMap, focus: Sequence[str]) -> set[str]:
    area: set[str] = set()
    for s in focus:
        area.add(s)
        for kind in ("cable", "port", "switch", "nic", "host", "gpu"):
            area.update(rmap.resources(s, kind, near=True))
    return area


def plan_for(kb: KnowledgeBase, ranked: Sequence[tuple[str, RootCause]], limit: int = 3
             ) -> list[dict[str, str]]:
    """The knowledge base's checks for the leading root causes, in order, with their meaning."""
    plan: list[dict[str, str]] = []
    seen: set[str] = set()
    for _, rc in ranked[:limit]:
        t = kb.types.get(rc.fault)
        if t is None:
            continue
        for c in t.checks:
            key = f"{rc.resource}|{c.id}"
            if key in seen:
                continue
            seen.add(key)
            how = c.how.replace("{resource}", rc.resource)
            plan.append({"for": f"{rc.fault} on {rc.resource}", "check": c.id,
                         "source": c.source, "run": how, "if_true": c.if_true,
                         "if_false": c.if_false})
    return plan


def advise(fabric: Fabric, inputs: Inputs, *, symptom: str | None = None,
           subject: str | None = None, since: int | None = None, until: int | None = None,
           kb: KnowledgeBase | None = None, progress: Callable[[str], None] | None = None
           ) -> Answer:
    """Answer one operator question (see the module docstring)."""
    t0 = time.perf_counter()
    found, counts = gather(fabric, inputs, since=since, until=until, progress=progress)
    if not counts:
        raise ConfigError("diagnose: no input given; pass --findings, --telemetry, --probes "
                          "or --traces")
    return advise_findings(fabric, found, counts, symptom=symptom, subject=subject,
                           since=since, until=until, kb=kb, t0=t0)


def advise_findings(fabric: Fabric, found: list[Observed], counts: dict[str, int], *,
                    symptom: str | None = None, subject: str | None = None,
                    since: int | None = None, until: int | None = None,
                    kb: KnowledgeBase | None = None, t0: float | None = None) -> Answer:
    """:func:`advise` over findings already gathered (the console's, a test's)."""
    t0 = time.perf_counter() if t0 is None else t0
    kb = kb or load_kb()
    rmap = ResourceMap(fabric)
    focus = focus_of(rmap, subject, symptom)
    notes: list[str] = []
    unknown = [o for o in found if not any(rmap.known(m.split("->")[0].split("|")[0])
                                           for m in rmap.members(o.subject))
               and not o.subject.startswith("job")]
    if found and len(unknown) == len(found):
        raise ConfigError(f"diagnose: none of the {len(found)} finding(s) names a resource of "
                          f"the inventory (e.g. {unknown[0].subject!r}): wrong --inventory?")
    if unknown:
        notes.append(f"{len(unknown)} finding(s) name resources not in the inventory; ignored")
        found = [o for o in found if o not in unknown]
    found.sort(key=lambda o: (o.reported_ns, o.source, o.id))
    latency = {s: 0 for s in counts}
    corr = Correlator(rmap, kb, Coverage(latency), params=CorrelatorParams(unexplained_after_ns=0))
    corr.add(found)
    now = max((o.reported_ns for o in found), default=0)
    corr.tick(now)
    incidents = corr.incidents()
    if focus:
        area = _near_focus(rmap, focus)
        incidents = [i for i in incidents if any(
            rc.resource in area for rc in i.root_causes) or any(
            r in area for fid in i.findings for r in _resources_of_finding(rmap, corr, fid))]
    ranked = sorted(((i.id, rc) for i in incidents for rc in i.root_causes),
                    key=lambda x: -x[1].probability)
    held = {fid for i in corr.incidents() for fid in i.findings}
    focus_area = _near_focus(rmap, focus) if focus else None
    unexplained = [o for o in corr.index.items.values() if o.id not in held and (
        focus_area is None or _resources_of_finding(rmap, corr, o.id) & focus_area)]
    if not found:
        notes.append("no finding in the inputs for this window: nothing to explain")
    elif not ranked:
        notes.append("findings exist but no root cause is supported by them (ambiguous or "
                     "too little evidence): see the unexplained findings")
    return Answer(focus, incidents, ranked, plan_for(kb, ranked), counts, (since, until),
                  time.perf_counter() - t0, notes, unexplained)


def _resources_of_finding(rmap: ResourceMap, corr: Correlator, fid: str) -> set[str]:
    o = corr.index.items.get(fid)
    if o is None:
        return set()
    out: set[str] = set()
    for kind in ("cable", "port", "switch", "nic", "host", "gpu"):
        out.update(rmap.resources(o.subject, kind))
    return out


def print_answer(ans: Answer, *, echo: Callable[[str], None] = print) -> None:
    """The human form of an answer."""
    src = ", ".join(f"{k} {v}" for k, v in ans.sources.items())
    echo(f"read: {src} finding(s); focus: {', '.join(ans.focus) or 'everything'}; "
         f"{len(ans.incidents)} incident(s); {ans.seconds:.2f} s")
    for n in ans.notes:
        echo(f"note: {n}")
    if ans.ranked:
        echo("")
        echo("ranked root causes:")
    for k, (inc, rc) in enumerate(ans.ranked, 1):
        echo(f"{k}. {rc.fault} on {rc.resource}  p={rc.probability:.2f}  ({rc.specialist} "
             f"specialist; incident {inc})")
        for ev in rc.evidence[:4]:
            echo(f"     evidence {ev}")
        for c in rc.checks:
            if c.result != "not-run":
                echo(f"     checked {c.name}: {c.result} ({c.detail})")
        if rc.action:
            echo(f"     action: {rc.action}")
    if ans.unexplained:
        echo("")
        echo("findings no root cause explains (ambiguous or too little evidence):")
        for o in ans.unexplained[:10]:
            echo(f"  {o.source}: {o.kind} on {o.subject} (score {o.finding.score:.2f})"
                 + (f": {o.finding.evidence[0]}" if o.finding.evidence else ""))
    if ans.plan:
        echo("")
        echo("troubleshooting plan (in order):")
        for k, p in enumerate(ans.plan, 1):
            echo(f"{k}. [{p['for']}] {p['check']} ({p['source']}): {p['run']}")
            echo(f"     if it shows the problem: {p['if_true']}")
            echo(f"     if not: {p['if_false']}")
