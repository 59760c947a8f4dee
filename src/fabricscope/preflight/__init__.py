"""Host preflight: check a training / inference host's kernel, CPU and NIC tuning.

``read_host`` (probe.py) reads /proc and /sys under a root path; ``evaluate`` (checks.py)
judges the facts against a profile (profiles.py); ``plan_fixes`` / ``apply_fixes`` (fix.py)
apply the reversible fixes after writing an undo script; ``summarize_fleet`` (fleet.py)
compares many hosts' JSON reports. See docs/preflight.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fabricscope.model.records import Finding
from fabricscope.preflight.checks import CheckResult, FixAction, evaluate, exit_code, summarize
from fabricscope.preflight.fix import FixPlan, apply_fixes, plan_fixes, undo_script
from fabricscope.preflight.fleet import read_reports, summarize_fleet
from fabricscope.preflight.probe import EthtoolRunner, HostFacts, read_host, run_ethtool
from fabricscope.preflight.profiles import CheckSpec, Profile, load_profile

__all__ = [
    "CheckResult", "CheckSpec", "FixAction", "FixPlan", "HostFacts", "Profile", "apply_fixes",
    "evaluate", "exit_code", "findings", "load_profile", "plan_fixes", "read_host",
    "read_reports", "report_json", "run_preflight", "summarize", "summarize_fleet",
    "undo_script",
]


def run_preflight(profile: Profile, *, root: str | Path = "/", nics: Sequence[str] = (),
                  ethtool: EthtoolRunner | None = run_ethtool
                  ) -> tuple[HostFacts, list[CheckResult], float]:
    """Probe the host at ``root`` and judge it: (facts, results, seconds taken)."""
    t0 = time.perf_counter()
    paths = [c.path for c in profile.checks if c.kind == "sysctl"]
    facts = read_host(root, sysctl_paths=paths, nics=nics, ethtool=ethtool)
    results = evaluate(facts, profile)
    return facts, results, time.perf_counter() - t0


def report_json(facts: HostFacts, results: Sequence[CheckResult], *, profile: str,
                elapsed_s: float) -> dict[str, Any]:
    """The ``--json`` report of one host (what ``preflight fleet`` reads)."""
    return {"host": facts.hostname, "root": facts.root, "profile": profile,
            "elapsed_s": round(elapsed_s, 4), "summary": summarize(list(results)),
            "exit_code": exit_code(list(results)),
            "results": [r.to_json() for r in results]}


def findings(results: Sequence[CheckResult], *, hostname: str, now_ns: int) -> list[Finding]:
    """One ``host-misconfig`` Finding per failed check, subject the host, check in details."""
    out = []
    for r in results:
        if r.status != "fail":
            continue
        out.append(Finding(
            kind="host-misconfig", subject=hostname, score=1.0, window=(now_ns, now_ns),
            evidence=(f"{r.check} on {r.subject}: current {r.current!r}, recommended "
                      f"{r.recommended!r}",),
            action=r.fix or "see fabricscope preflight",
            details={"check": r.check, "target": r.subject, "current": r.current,
                     "recommended": r.recommended, "why": r.why, "source": r.source}))
    return out
