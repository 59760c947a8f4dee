"""Incidents: findings from every instrument joined over the inventory graph and time.

A :class:`Correlator` takes findings as they are reported (:meth:`Correlator.add`) and, on
every :meth:`Correlator.tick`, joins them into incidents and diagnoses each changed one:

* **joining**: two findings belong to one incident when a specialist would blame a common
  resource for both (their *footprints* intersect, :func:`~fabricscope.diagnosis.specialists.footprint`)
  and the second arrives within ``join_window_ns`` of the incident's last finding; union-find
  keeps incidents stable as they grow and merge (the older id survives);
* **diagnosis**: the coordinator explains the incident's findings with the fewest root causes
  (:func:`~fabricscope.diagnosis.coordinator.diagnose`), the verifier keeps only supported ones;
* **lifecycle**: an incident *opens* once it has a verified root cause, or has stayed
  unexplained for ``unexplained_after_ns`` with at least two findings (reported as
  unexplained: ambiguity is an answer); it *updates* with new evidence and root causes; it
  *closes* when no finding of it has been reported or refreshed for ``close_after_ns``.

It records the time of the first symptom (earliest evidence window), of detection (first
report), of the first naming of the current top root cause, and of the proposed action, so
time to root cause is measured on the same clock as the findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from fabricscope.diagnosis.cases import CaseBase
from fabricscope.diagnosis.checks import CheckOutcome, CheckRequest
from fabricscope.diagnosis.coordinator import CoordinatorParams, Diagnosis, diagnose
from fabricscope.diagnosis.graph import ResourceMap, resource_kind
from fabricscope.diagnosis.knowledge import KnowledgeBase
from fabricscope.diagnosis.model import Incident, Observed, RootCause
from fabricscope.diagnosis.normalize import normalize
from fabricscope.diagnosis.specialists import (
    CHECK_TTL_NS,
    Coverage,
    FindingIndex,
    Specialist,
    footprint,
    specialists,
)
from fabricscope.diagnosis.suspicions import SuspicionGate, SuspicionParams, is_suspicion

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class CorrelatorParams:
    """Joining and lifecycle windows (ns) and the coordinator's thresholds."""

    join_window_ns: int = 300 * NS
    close_after_ns: int = 600 * NS
    unexplained_after_ns: int = 120 * NS
    coordinator: CoordinatorParams = field(default_factory=CoordinatorParams)
    #: Propose active checks (:mod:`fabricscope.diagnosis.checks`) for the competing
    #: hypotheses of each changed incident, ``max_checks`` at a time; take them with
    #: :meth:`Correlator.take_checks`, return what they found with :meth:`Correlator.add_outcome`.
    active_checks: bool = False
    max_checks: int = 8
    #: The suspicion channel (:mod:`fabricscope.diagnosis.suspicions`): with active checks
    #: on, suspicions are answered by rate-bounded checks; None: suspicions are dropped.
    #: A suspicion is never evidence either way.
    suspicions: SuspicionParams | None = field(default_factory=SuspicionParams)


@dataclass
class _Group:
    id: str
    members: list[str]
    created_ns: int
    last_ns: int
    dirty: bool = True
    incident: Incident | None = None
    named: dict[tuple[str, str], int] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    checked: list[str] = field(default_factory=list)  # what active checks found, in order


class Correlator:
    """Findings in, incidents out (see the module docstring)."""

    def __init__(self, rmap: ResourceMap, kb: KnowledgeBase, coverage: Coverage, *,
                 params: CorrelatorParams | None = None, cases: CaseBase | None = None) -> None:
        self.rmap = rmap
        self.cases = cases
        self.kb = kb
        self.coverage = coverage
        self.params = params or CorrelatorParams()
        self.team: dict[str, Specialist] = specialists(kb, rmap)
        self.index = FindingIndex(rmap)
        self._parent: dict[str, str] = {}
        self._groups: dict[str, _Group] = {}
        self._owner: dict[str, str] = {}  # resource -> group root id (recent)
        self._seen: dict[str, Observed] = {}
        self._by_symptom: dict[tuple[str, str, str], str] = {}
        self._settle_ns = max(coverage.latency_ns.values(), default=0) + 1
        self._coord = self.params.coordinator
        if self.params.active_checks and self._coord.max_checks == 0:
            self._coord = replace(self._coord, max_checks=self.params.max_checks)
        # (kind, resource) -> (group id, when requested)
        self._requested: dict[tuple[str, str], tuple[str, int]] = {}
        self._pending: list[CheckRequest] = []
        self.gate: SuspicionGate | None = (
            SuspicionGate(kb, rmap, self.params.suspicions, explained=self._explained)
            if self.params.active_checks and self.params.suspicions is not None else None)
        self.suspicions_dropped = 0

    # -- union-find ----------------------------------------------------------------------
    def _find(self, g: str) -> str:
        while self._parent[g] != g:
            self._parent[g] = self._parent[self._parent[g]]
            g = self._parent[g]
        return g

    def _union(self, a: str, b: str) -> str:
        ra, rb = self._find(a), self._find(b)
        if ra == rb:
            return ra
        ga, gb = self._groups[ra], self._groups[rb]
        # The older incident survives (an opened one before one not yet opened).
        def age(g: _Group) -> tuple[int, int, str]:
            return (0 if g.incident is not None else 1,
                    g.incident.opened_ns if g.incident is not None else g.created_ns, g.id)
        old, new = (ga, gb) if age(ga) <= age(gb) else (gb, ga)
        self._parent[new.id] = old.id
        old.members.extend(new.members)
        old.last_ns = max(old.last_ns, new.last_ns)
        old.dirty = True
        for k, t in new.named.items():
            old.named[k] = min(t, old.named.get(k, t))
        old.checked.extend(new.checked)
        del self._groups[new.id]
        return old.id

    # -- input -----------------------------------------------------------------------------
    def add(self, findings: Sequence[Observed]) -> None:
        """Take newly reported findings (a refresh of a known id updates its time)."""
        for o in findings:
            if is_suspicion(o):  # never evidence: at most a reason to check
                if self.gate is not None:
                    self.gate.offer(o)
                else:
                    self.suspicions_dropped += 1
                continue
            o = normalize(o, self.rmap.fabric)
            # The same symptom reported again (a new episode of one kind on one subject from
            # one source) refreshes the first report: one symptom, one piece of evidence.
            key = (o.source, o.kind, o.subject)
            first = self._by_symptom.setdefault(key, o.id)
            if first != o.id:
                g = self._groups[self._find(first)]
                if g.incident is None or g.incident.status == "open":
                    g.last_ns = max(g.last_ns, o.reported_ns)
                    continue
                # the symptom is back after its incident closed: a new report, a new incident
                self._by_symptom[key] = o.id
            prev = self._seen.get(o.id)
            self._seen[o.id] = o
            if prev is not None:
                g = self._groups[self._find(o.id)]
                g.last_ns = max(g.last_ns, o.reported_ns)
                continue
            self.index.add(o)
            self._parent[o.id] = o.id
            self._groups[o.id] = _Group(o.id, [o.id], o.reported_ns, o.reported_ns)
            root = o.id
            for r in footprint(self.team, o):
                other = self._owner.get(r)
                if other is not None:
                    grp = self._groups.get(self._find(other))
                    if grp is not None:
                        recent = o.reported_ns - grp.last_ns <= self.params.join_window_ns
                        closed = grp.incident is not None and grp.incident.status == "closed"
                        if recent and not closed:
                            root = self._union(root, grp.id)
                self._owner[r] = root
            self._groups[self._find(root)].dirty = True

    # -- active checks -----------------------------------------------------------------------
    def _request(self, g: _Group, d: Diagnosis, now_ns: int) -> None:
        for kind, res, for_ in d.wanted:
            prev = self._requested.get((kind, res))
            if prev is not None and now_ns - prev[1] <= CHECK_TTL_NS:
                continue
            self._requested[(kind, res)] = (g.id, now_ns)
            self._pending.append(CheckRequest(kind, res, now_ns, for_))

    def take_checks(self) -> list[CheckRequest]:
        """The active checks proposed since the last call (each (kind, resource) once)."""
        out, self._pending = self._pending, []
        return out

    def add_outcome(self, outcome: CheckOutcome) -> None:
        """Take what an active check found: its findings join like any other, what it
        decided becomes evidence of absence, and the incident that asked re-diagnoses.
        A check the suspicion gate started is handed back to it; only what it measured
        (present symptoms) enters the diagnosis."""
        self.index.record(outcome)
        if outcome.present:
            self.add(outcome.present)
        if self.gate is not None and self.gate.owns(outcome.request):
            self.gate.outcome(outcome)
            self._note_suspicion_check(outcome)
            return
        gid = self._requested.get(outcome.request.key, ("", 0))[0]
        if gid in self._parent:
            g = self._groups.get(self._find(gid))
            if g is not None:
                g.dirty = True
                got = ", ".join(sorted({f"{o.kind} on {o.subject}" for o in outcome.present}))
                g.checked.append(
                    f"checked: {outcome.request.kind} on {outcome.request.resource} "
                    f"(for {outcome.request.for_[1]}) at {outcome.request.requested_ns / NS:.2f}"
                    f"-{outcome.done_ns / NS:.2f} s: {got or 'nothing it decides is present'}"
                    + (f" [{outcome.detail}]" if outcome.detail else ""))

    def _explained(self, resource: str) -> bool:
        """Whether an open incident's root cause names ``resource`` or its cable."""
        named = {rc.resource for g in self._groups.values() if g.incident is not None
                 and g.incident.status == "open" for rc in g.incident.root_causes}
        return bool(named) and (resource in named
                                or any(c in named for c in self.rmap.resources(resource, "cable")))

    def _note_suspicion_check(self, outcome: CheckOutcome) -> None:
        """Write a confirming suspicion check into the history of the incident its
        findings joined (an unconfirmed one is in no incident)."""
        req = outcome.request
        got = ", ".join(sorted({f"{o.kind} on {o.subject}" for o in outcome.present}))
        note = (f"checked: {req.kind} on {req.resource} (for a suspicion) at "
                f"{req.requested_ns / NS:.2f}-{outcome.done_ns / NS:.2f} s: {got}"
                + (f" [{outcome.detail}]" if outcome.detail else ""))
        for o in outcome.present:
            first = self._by_symptom.get((o.source, o.kind, o.subject))
            if first is None or first not in self._parent:
                continue
            g = self._groups.get(self._find(first))
            if g is not None and note not in g.checked:
                g.checked.append(note)
                g.dirty = True

    # -- output ----------------------------------------------------------------------------
    def tick(self, now_ns: int) -> list[Incident]:
        """Diagnose the incidents that changed, open / close by the lifecycle rules; return
        the incidents whose state changed at this tick."""
        changed: list[Incident] = []
        p = self.params
        for g in list(self._groups.values()):
            inc = g.incident
            if inc is not None and inc.status == "closed":
                continue
            if now_ns - g.created_ns <= self._settle_ns:
                # Silence becomes evidence as each source's latency passes: re-diagnose.
                g.dirty = True
            if g.dirty:
                g.dirty = False
                obs = [self._seen[i] for i in g.members]
                d = diagnose(obs, self.team, self.index, self.coverage, now_ns=now_ns,
                             params=self._coord, cases=self.cases)
                g.diagnosis = d
                self._request(g, d, now_ns)
                for rc in d.root_causes:
                    g.named.setdefault(rc.key, now_ns)
                new = self._incident(g, obs, d, now_ns)
                if new is not None and (inc is None or _differs(inc, new)):
                    g.incident = new
                    changed.append(new)
                    continue
            elif inc is None and g.diagnosis is not None and not g.diagnosis.root_causes:
                obs = [self._seen[i] for i in g.members]
                new = self._incident(g, obs, g.diagnosis, now_ns)
                if new is not None:
                    g.incident = new
                    changed.append(new)
                    continue
            inc = g.incident
            if inc is not None and inc.status == "open" and now_ns - g.last_ns >= p.close_after_ns:
                g.incident = replace(inc, status="closed", closed_ns=now_ns, updated_ns=now_ns)
                changed.append(g.incident)
        self.answer_suspicions(now_ns)
        return changed

    def answer_suspicions(self, now_ns: int) -> None:
        """Start the suspicion gate's due checks now (a suspicion reported between ticks
        need not wait for the next one); :meth:`take_checks` returns them."""
        if self.gate is not None:
            self._pending.extend(self.gate.due(now_ns))

    def suspicion_stats(self) -> dict[str, int]:
        """The suspicion gate's counters (:class:`SuspicionGate`), plus suspicions dropped
        because the channel is off."""
        out = dict(self.gate.stats) if self.gate is not None else {}
        if self.suspicions_dropped:
            out["dropped"] = self.suspicions_dropped
        return out

    def _incident(self, g: _Group, obs: Sequence[Observed], d: Diagnosis,
                  now_ns: int) -> Incident | None:
        first_symptom = min(max(0, o.finding.window[0]) for o in obs)
        detected = min(o.reported_ns for o in obs)
        prev = g.incident
        if prev is None and not d.root_causes and (
                len(obs) < 2 or now_ns - detected < self.params.unexplained_after_ns):
            return None
        top: RootCause | None = d.root_causes[0] if d.root_causes else None
        rc_ns = g.named.get(top.key) if top is not None else None
        blast = self._blast(obs, d)
        sev = "critical" if any(rc.probability >= 0.9 for rc in d.root_causes) and \
            blast.get("gpus", 0) + blast.get("links", 0) > 0 else "warning"
        title = (f"{top.fault} on {top.resource}" if top is not None
                 else f"unexplained: {len(obs)} finding(s), e.g. {obs[0].kind} on {obs[0].subject}")
        actions = prev.actions if prev is not None else ()
        actions = (*actions, *(c for c in g.checked if c not in actions))
        if top is not None and top.action and not any(a.startswith(f"proposed: {top.fault} ")
                                                      for a in actions):
            actions = (*actions, f"proposed: {top.fault} on {top.resource}: {top.action}"
                       f" (at {now_ns / NS:.0f} s; awaiting approval)")
        return Incident(
            id=prev.id if prev is not None else "inc-" + g.id[2:],
            status="open",
            opened_ns=prev.opened_ns if prev is not None else now_ns,
            updated_ns=now_ns, first_symptom_ns=first_symptom, detected_ns=detected,
            root_causes=d.root_causes, findings=tuple(o.id for o in obs), severity=sev,
            blast=blast, root_cause_ns=rc_ns,
            action_ns=(prev.action_ns if prev is not None and prev.action_ns is not None
                       else (rc_ns if top is not None else None)),
            closed_ns=None, title=title, actions=actions)

    def _blast(self, obs: Sequence[Observed], d: Diagnosis) -> dict[str, int]:
        f = self.rmap.fabric
        links: set[str] = set()
        gpus: set[str] = set()
        jobs: set[str] = set()
        for o in obs:
            links.update(self.rmap.resources(o.subject, "cable"))
            gpus.update(self.rmap.resources(o.subject, "gpu"))
            j = o.finding.details.get("job")
            if isinstance(j, str):
                jobs.add(j)
        for rc in d.root_causes:
            kind = resource_kind(f, rc.resource)
            if kind == "switch":
                gpus.update(self.rmap.resources(rc.resource, "gpu", near=True))
        return {"links": len(links), "gpus": len(gpus), "jobs": len(jobs)}

    def incidents(self) -> list[Incident]:
        """Every incident opened so far (open and closed), oldest first."""
        out = [g.incident for g in self._groups.values() if g.incident is not None]
        return sorted(out, key=lambda i: (i.opened_ns, i.id))

    def named_at(self) -> list[tuple[str, tuple[str, str], int]]:
        """(incident id, (resource, fault), first time named) for every root cause ever
        named by an open incident: the raw material of time-to-root-cause."""
        out = []
        for g in self._groups.values():
            if g.incident is None:
                continue
            for k, t in g.named.items():
                out.append((g.incident.id, k, t))
        return out


def _differs(a: Incident, b: Incident) -> bool:
    return (a.root_causes != b.root_causes or a.findings != b.findings or a.status != b.status
            or a.severity != b.severity or a.actions != b.actions)
