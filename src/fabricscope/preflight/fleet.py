"""Summarize many hosts' ``preflight --json`` reports: per check, who passes, who is odd.

A check is keyed by its id and the host-local part of its subject (``nic.mtu`` on ``eth0``),
so the same NIC name on every host is compared. For each key: how many hosts are in each
status, the fleet's majority current value, and the hosts whose value differs from it (the
outliers: a firmware version, a governor, a ring size that one host does not share). With no
strict majority (a tie) the key is reported as ambiguous, not given an arbitrary majority.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricscope.model.errors import ConfigError, TraceFormatError


@dataclass
class CheckSummary:
    """One (check, local subject) across the fleet."""

    check: str
    subject: str  # host-local: "" for the host itself, "eth0" for a NIC
    hosts: int
    status_counts: dict[str, int]
    failing: list[str]
    majority: str | None  # None: no strict majority (ambiguous)
    majority_hosts: int
    outliers: dict[str, str] = field(default_factory=dict)  # host -> its differing value

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return dict(self.__dict__)


def read_reports(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Load ``preflight --json`` files (one host each, or a list of hosts per file)."""
    if not paths:
        raise ConfigError("preflight fleet: no HOSTS_JSON given")
    reports: list[dict[str, Any]] = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{p}: line {exc.lineno}: not JSON ({exc.msg})") from None
        for i, rep in enumerate(data if isinstance(data, list) else [data]):
            if not isinstance(rep, dict) or not isinstance(rep.get("host"), str) \
                    or not isinstance(rep.get("results"), list):
                raise TraceFormatError(f"{p}: report {i}: expected an object with host and "
                                       "results (the output of preflight --json)")
            reports.append(rep)
    return reports


def summarize_fleet(reports: Sequence[dict[str, Any]]) -> list[CheckSummary]:
    """Per (check, local subject): status counts, failing hosts, majority value, outliers."""
    if not reports:
        raise ConfigError("preflight fleet: the inputs hold no host report")
    seen: set[str] = set()
    for rep in reports:
        if rep["host"] in seen:
            raise ConfigError(f"preflight fleet: host {rep['host']!r} appears twice")
        seen.add(rep["host"])
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for rep in reports:
        host = rep["host"]
        for r in rep["results"]:
            subject = str(r.get("subject", ""))
            local = subject[len(host) + 1:] if subject.startswith(host + "/") else (
                "" if subject == host else subject)
            by_key.setdefault((str(r.get("check")), local), {})[host] = r
    out: list[CheckSummary] = []
    for (check, local), per_host in by_key.items():
        statuses = Counter(str(r.get("status")) for r in per_host.values())
        values = {h: str(r.get("current", "")) for h, r in per_host.items()
                  if r.get("status") not in ("skip", "unknown")}
        counts = Counter(values.values()).most_common()
        majority: str | None = None
        n_major = 0
        if counts and (len(counts) == 1 or counts[0][1] > counts[1][1]):
            majority, n_major = counts[0]
        outliers = {h: v for h, v in sorted(values.items())
                    if majority is not None and v != majority}
        out.append(CheckSummary(
            check=check, subject=local, hosts=len(per_host),
            status_counts=dict(sorted(statuses.items())),
            failing=sorted(h for h, r in per_host.items() if r.get("status") == "fail"),
            majority=majority, majority_hosts=n_major, outliers=outliers))
    out.sort(key=lambda s: (-len(s.failing), -len(s.outliers), s.check, s.subject))
    return out


def differing_hosts(summary: Sequence[CheckSummary]) -> dict[str, list[str]]:
    """host -> the checks where it differs from the fleet majority."""
    out: dict[str, list[str]] = {}
    for s in summary:
        for h in s.outliers:
            out.setdefault(h, []).append(s.check + (f"@{s.subject}" if s.subject else ""))
    return dict(sorted(out.items()))
