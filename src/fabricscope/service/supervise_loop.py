"""``supervise`` on the twin: parse the command line, run the loop, push incidents to sinks,
score against the injected faults, and print.

Sinks: the log (stdout), a DuckDB findings/incidents store (``--db``, read by
``fabricscope incidents``), a webhook (``--webhook URL``: one POST of the incident as JSON per
new or changed incident; a failing endpoint is counted and reported, never fatal).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fabricscope.diagnosis.cases import load_case_base
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.model import Incident
from fabricscope.diagnosis.serialize import incident_to_json, observed_to_json
from fabricscope.model.errors import ConfigError
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.checks import TwinChecks
from fabricscope.service.supervise_twin import (
    INSTRUMENTS,
    NS,
    Injected,
    default_instruments,
    load_twin_fabric,
    parse_time_s,
    parse_twin_fault,
    run_loop,
    score_run,
    truth_pairs,
)

log = logging.getLogger("fabricscope.supervise")


class Webhook:
    """POST incidents as JSON to one URL (3 s timeout, one retry; failures counted)."""

    def __init__(self, url: str) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--webhook: expected an http:// or https:// URL, got {url!r}")
        self.url = url
        self.sent = 0
        self.failed = 0
        self.last_error = ""

    def __call__(self, inc: Incident) -> None:
        body = json.dumps({"event": "incident", "incident": incident_to_json(inc)}).encode()
        for _attempt in range(2):
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=3.0) as resp:
                    resp.read()
                self.sent += 1
                return
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.last_error = str(getattr(exc, "reason", exc))
        self.failed += 1
        log.warning("webhook %s: incident %s not delivered: %s", self.url, inc.id, self.last_error)


def incident_line(inc: Incident) -> str:
    """One log line for a new or changed incident (the log sink)."""
    t = inc.updated_ns / NS
    verb = "closed" if inc.status == "closed" else (
        "opened" if inc.opened_ns == inc.updated_ns else "updated")
    top = inc.root_causes[0] if inc.root_causes else None
    what = (f"{top.fault} on {top.resource} (p={top.probability:.2f}); action: {top.action}"
            if top is not None else inc.title)
    return f"t={t:.0f}s incident {inc.id} {verb}: {what}"


def run_supervise(*, twin: str, faults: Sequence[str], duration: str, tick: str,
                  transport: Sequence[str] = (),
                  instruments: str, kb_dirs: Sequence[Path] = (), seed: int = 0,
                  db: Path | None = None, webhook: str | None = None,
                  progress: Callable[[str], None] | None = None,
                  checks: bool = True, case_dirs: Sequence[Path] = ()) -> dict[str, Any]:
    """Run ``supervise --twin`` and return its JSON document (incidents, findings, score).

    ``checks``: let the coordinator run active checks on the twin (``TwinChecks``);
    ``case_dirs``: case-base folders the coordinator consults, with the packaged seed cases
    (none given: no case base)."""
    duration_s = parse_time_s(duration, source="--duration")
    tick_s = parse_time_s(tick, source="--tick")
    if duration_s <= 0 or tick_s <= 0:
        raise ConfigError("--duration / --tick: must be > 0")
    names = [n.strip() for n in instruments.split(",") if n.strip()]
    for n in names:
        if n not in INSTRUMENTS:
            raise ConfigError(f"--instruments: unknown {n!r}; choose from {', '.join(INSTRUMENTS)}")
    if not names:
        raise ConfigError("--instruments: name at least one")
    fabric = load_twin_fabric(twin)
    fault_list = [parse_twin_fault(f, fabric, source=f"--fault {i + 1}")
                  for i, f in enumerate(faults)]
    for f in fault_list:
        if f.start_ns >= duration_s * NS:
            raise ConfigError(f"--fault {f.kind}:{f.subject}: starts at {f.start_ns / NS:.0f} s, "
                              f"after the end of the run ({duration_s:.0f} s)")
    episodes, transport_truths = [], []
    if transport:
        from fabricscope.service.twin_transport import describe, parse_transport, transport_truth

        for i, line in enumerate(transport, 1):
            if progress is not None:
                progress(f"transport {i}/{len(transport)}: simulating {line!r} ...")
            ep = parse_transport(line, fabric, source=f"--transport {i}")
            if ep.start_ns >= duration_s * NS:
                raise ConfigError(f"--transport {i}: {line!r}: starts at {ep.start_ns / NS:.0f} s, after the "
                                  f"end of the run ({duration_s:.0f} s)")
            episodes.append(ep)
            transport_truths.append((line, transport_truth(line, fabric, ep), describe(ep)))
            if progress is not None:
                progress(f"transport {i}/{len(transport)}: {describe(ep)}")
    kb = load_kb(kb_dirs)
    case_base = load_case_base(case_dirs) if case_dirs else None
    hook = Webhook(webhook) if webhook else None
    store = None
    if db is not None:
        from fabricscope.store.findings import DiagnosisStore

        store = DiagnosisStore(db)
    try:
        spec = ScenarioSpec(fabric, fault_list, duration_s, seed, transport=tuple(episodes))

        def on_change(inc: Incident) -> None:
            line = incident_line(inc)
            log.info("%s", line)
            if progress is not None:
                progress(line)
            if hook is not None:
                hook(inc)

        runner = TwinChecks(spec) if checks else None
        res = run_loop(spec, default_instruments(names), kb=kb, tick_s=tick_s,
                       on_change=on_change, progress=progress, checks=runner, cases=case_base)
        if store is not None:
            store.add_findings(res.findings)
            store.upsert_incidents(res.incidents)
    finally:
        if store is not None:
            store.close()
    truth: list[tuple[Injected, tuple[str, str]]] = list(truth_pairs(fabric, kb, fault_list))
    truth += [(t, (t.subject, t.fault_type)) for _, t, _ in transport_truths if t.fault_type in kb.types]
    scores, false_pos = score_run(res, truth)
    cpu = sum(res.seconds.values())
    doc: dict[str, Any] = {
        "twin": twin, "duration_s": duration_s, "tick_s": tick_s, "seed": seed,
        "instruments": names,
        "faults": [{"kind": f.kind, "subject": f.subject, "start_s": f.start_ns / NS,
                    "end_s": None if f.end_ns is None else f.end_ns / NS, "params": dict(f.params)}
                   for f in fault_list],
        "transport": [{"line": line, "kind": t.kind, "subject": t.subject, "start_s": t.start_ns / NS,
                       "end_s": None if t.end_ns is None else t.end_ns / NS, "run": what}
                      for line, t, what in transport_truths],
        "incidents": [incident_to_json(i) for i in res.incidents],
        "findings": [observed_to_json(o) for o in res.findings],
        "score": {
            "faults": [{"kind": s.fault.kind, "subject": s.fault.subject,
                        "expected": {"resource": s.pair[0], "fault": s.pair[1]},
                        "found": s.found, "time_to_root_cause_s": s.time_to_root_cause_s}
                       for s in scores],
            "not_nameable": [f"{f.kind} {f.subject}" for f in fault_list
                             if not any(f is t[0] for t in truth)],
            "false_positives": [{"resource": r, "fault": t} for r, t in false_pos],
        },
        "checks": [{"kind": k, "resource": r, "start_s": a / NS, "end_s": b / NS}
                   for k, r, a, b in (runner.log if runner is not None else [])],
        "suspicions": {"count": len(res.suspicions), "gate": res.suspicion_stats},
        "cpu_seconds": res.seconds,
        "cores": round(cpu / duration_s, 4),
    }
    if hook is not None:
        doc["webhook"] = {"url": webhook, "sent": hook.sent, "failed": hook.failed,
                          "last_error": hook.last_error}
    if db is not None:
        doc["db"] = str(db)
    return doc


def print_run(doc: dict[str, Any], *, echo: Callable[[str], None] = print) -> None:
    """The human summary of a ``supervise`` document."""
    echo(f"twin {doc['twin']}: {doc['duration_s']:.0f} s simulated, instruments "
         f"{', '.join(doc['instruments'])}; {len(doc['findings'])} finding(s), "
         f"{len(doc['incidents'])} incident(s); {doc['cores']:.3f} core(s) "
         "(CPU seconds per simulated second)")
    for inc in doc["incidents"]:
        echo("")
        echo(f"{inc['id']}  [{inc['status']}, {inc['severity']}]  {inc['title']}")
        t_rc = inc.get("root_cause_ns")
        first = inc["first_symptom_ns"]
        echo(f"  first symptom {first / NS:.0f} s, detected {inc['detected_ns'] / NS:.0f} s"
             + (f", root cause at {t_rc / NS:.0f} s ({(t_rc - first) / NS:.0f} s after the "
                "first symptom)" if t_rc is not None else ", no root cause yet"))
        for rc in inc["root_causes"]:
            echo(f"  root cause: {rc['fault']} on {rc['resource']}  p={rc['probability']:.2f}  "
                 f"({rc['specialist']} specialist, explains {len(rc['explains'])} finding(s))")
            for ev in rc["evidence"][:3]:
                echo(f"    evidence {ev}")
            if rc.get("action"):
                echo(f"    action: {rc['action']}")
        b = inc.get("blast", {})
        if b:
            echo("  blast radius: " + ", ".join(f"{v} {k}" for k, v in b.items()))
    sc = doc["score"]
    if sc["faults"]:
        echo("")
        echo("injected truth vs conclusion:")
        for s in sc["faults"]:
            t = s["time_to_root_cause_s"]
            echo(f"  {s['kind']:16} {s['subject']:44} -> {s['expected']['fault']} on "
                 f"{s['expected']['resource']}: " + ("FOUND" if s["found"] else "MISSED")
                 + (f" ({t:.0f} s after onset)" if t is not None else ""))
        for fp in sc["false_positives"]:
            echo(f"  false positive: {fp['fault']} on {fp['resource']}")
        for n in sc["not_nameable"]:
            echo(f"  not scored (no knowledge-base type for it): {n}")
    if "webhook" in doc:
        w = doc["webhook"]
        echo(f"webhook {w['url']}: {w['sent']} sent, {w['failed']} failed"
             + (f" (last error: {w['last_error']})" if w["failed"] else ""))
