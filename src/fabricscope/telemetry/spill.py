"""The collector's spill file: what the sinks could not take by the shutdown deadline.

JSON lines. Each batch starts with a header ``{"spill": 1, "sinks": [i, ...], "events": N,
"findings": M}`` naming the (config-order) sinks that still need it, followed by N event lines
``{"ts_ns", "target", "name", "tags", "value"}`` and M finding lines. ``collect`` replays the
file into the sinks on its next start and removes it once every batch is written; a batch cut
short (the process died while spilling) is reported and skipped, never half-replayed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent

__all__ = ["SpillBatch", "append_spill", "read_spill", "rewrite_spill"]


@dataclass
class SpillBatch:
    """Events and findings that the sinks at ``sinks`` (config order) did not accept."""

    sinks: tuple[int, ...]
    events: list[TelemetryEvent]
    findings: list[Finding]


def _event_line(e: TelemetryEvent) -> str:
    return json.dumps({"ts_ns": e.ts_ns, "target": e.target, "name": e.name, "tags": dict(e.tags), "value": e.value})


def _finding_line(f: Finding) -> str:
    return json.dumps({"kind": f.kind, "subject": f.subject, "score": f.score, "window": list(f.window),
                       "evidence": list(f.evidence), "action": f.action, "details": dict(f.details)})


def _lines(batches: Iterable[SpillBatch]) -> Iterable[str]:
    for b in batches:
        yield json.dumps({"spill": 1, "sinks": list(b.sinks), "events": len(b.events), "findings": len(b.findings)})
        yield from map(_event_line, b.events)
        yield from map(_finding_line, b.findings)


def append_spill(path: Path, batches: Sequence[SpillBatch]) -> int:
    """Append ``batches`` to ``path`` (fsynced); the number of events written. TransportError if it fails."""
    if not batches:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            for line in _lines(batches):
                fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise TransportError(f"spill file {path}: write failed: {exc.strerror or exc}") from exc
    return sum(len(b.events) for b in batches)


def rewrite_spill(path: Path, batches: Sequence[SpillBatch]) -> None:
    """Replace ``path`` with ``batches`` (atomically), or remove it when there are none."""
    if not batches:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    append_spill(tmp, batches)
    os.replace(tmp, path)


def read_spill(path: Path) -> tuple[list[SpillBatch], int]:
    """(complete batches, number of lines skipped as damaged) of a spill file; none if absent."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], 0
    except OSError as exc:
        raise TransportError(f"spill file {path}: cannot read: {exc.strerror}") from exc
    out: list[SpillBatch] = []
    lines = text.splitlines()
    i = skipped = 0
    while i < len(lines):
        try:
            head = json.loads(lines[i])
            n_ev, n_f = int(head["events"]), int(head["findings"])
            sinks = tuple(int(s) for s in head["sinks"])
            body = [json.loads(x) for x in lines[i + 1 : i + 1 + n_ev + n_f]]
            if len(body) < n_ev + n_f:
                raise ValueError("batch cut short")
            events = [TelemetryEvent(d["name"], int(d["ts_ns"]), d["target"], d["tags"], d["value"])
                      for d in body[:n_ev]]
            findings = [Finding(d["kind"], d["subject"], float(d["score"]), (int(d["window"][0]), int(d["window"][1])),
                                tuple(d["evidence"]), d["action"], d["details"]) for d in body[n_ev:]]
        except (ValueError, KeyError, TypeError, IndexError):
            skipped += 1
            i += 1
            continue
        out.append(SpillBatch(sinks, events, findings))
        i += 1 + n_ev + n_f
    return out, skipped
