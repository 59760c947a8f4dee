"""Records of the diagnosis layer: observed findings, root causes and incidents.

A :class:`Observed` is one :class:`~fabricscope.model.records.Finding` as it reached the
diagnosis, tagged with the instrument that produced it and the (simulated or wall) time it
was reported, under a stable id that evidence references cite. A :class:`RootCause` names a
resource (an inventory id) and a fault type of the knowledge base (``diagnosis/kb``) with a
probability, the findings it explains and the checks that support it. An :class:`Incident`
groups the findings of one problem with its ranked root causes and the times that make time
to root cause a measurement, not an estimate.

Resource ids (what a root cause names):

* a cable: its two port ids sorted and joined by ``|`` (``leaf-01:eth3|spine-02:eth1``);
* a port: ``device:port`` (optics, PFC storms, ...);
* a device: ``leaf-01``, ``host0042``, ``host0042/nic3``; a GPU ``host0042/gpu3``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from fabricscope.model.records import Finding

Source = Literal["telemetry", "probe", "straggler", "optics", "collective", "host", "config",
                 "operator"]
SOURCES: tuple[str, ...] = Source.__args__  # type: ignore[attr-defined]


def finding_id(source: str, f: Finding) -> str:
    """A stable short id for finding ``f`` of ``source`` (same finding, same id).

    The key is (source, kind, subject, window start), plus ``details["check"]`` and
    ``details["target"]`` where a check-based instrument (RoCE, preflight) sets them: two
    checks failing on one NIC at one instant are two findings, not one.
    """
    key = f"{source}|{f.kind}|{f.subject}|{f.window[0]}"
    for k in ("check", "target"):
        v = f.details.get(k) if f.details else None
        if v not in (None, ""):
            key += f"|{v}"
    return "f-" + hashlib.blake2s(key.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True, slots=True)
class Observed:
    """One finding as the diagnosis saw it: who reported it, when, under which id."""

    source: str
    finding: Finding
    reported_ns: int
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", finding_id(self.source, self.finding))

    @property
    def kind(self) -> str:
        return self.finding.kind

    @property
    def subject(self) -> str:
        return self.finding.subject


@dataclass(frozen=True, slots=True)
class Check:
    """One check a specialist ran (or proposes): what, against which source, what it said."""

    name: str
    source: str
    result: str  # "supports" | "excludes" | "inconclusive" | "not-run"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RootCause:
    """A (resource, fault type) that explains some of an incident's findings."""

    resource: str
    fault: str
    probability: float
    explains: tuple[str, ...] = ()  # ids of the findings it explains
    evidence: tuple[str, ...] = ()  # human-readable, each citing finding ids
    checks: tuple[Check, ...] = ()
    action: str = ""
    specialist: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.resource, self.fault)


IncidentStatus = Literal["open", "closed"]


@dataclass(frozen=True, slots=True)
class Incident:
    """A problem: its findings, ranked root causes, blast radius and timeline (ns).

    ``first_symptom_ns`` the earliest evidence window start, ``detected_ns`` when the first
    finding was reported, ``root_cause_ns`` when the current top root cause was first named,
    ``action_ns`` when an action was proposed or taken, ``closed_ns`` when its symptoms
    cleared (None while open).
    """

    id: str
    status: IncidentStatus
    opened_ns: int
    updated_ns: int
    first_symptom_ns: int
    detected_ns: int
    root_causes: tuple[RootCause, ...] = ()
    findings: tuple[str, ...] = ()
    severity: str = "warning"  # "info" | "warning" | "critical"
    blast: Mapping[str, int] = field(default_factory=dict)  # links, gpus, jobs, hosts
    root_cause_ns: int | None = None
    action_ns: int | None = None
    closed_ns: int | None = None
    title: str = ""
    actions: tuple[str, ...] = ()  # what was proposed / done, in order, with times
