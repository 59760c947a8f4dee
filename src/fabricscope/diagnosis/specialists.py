"""The seven specialists: each owns the fault types of its domain, proposes hypotheses for
the findings it understands and runs the checks that confirm or exclude them.

A specialist (optics / physical layer, link / PHY counters, congestion, routing and load
balancing, host / NIC, job / collective, configuration / change) owns the knowledge-base
fault types whose ``specialist`` is its name. For a finding, it proposes every
(resource, fault type) it owns that lists the finding among the type's symptoms, with the
resources taken from the inventory graph (:class:`~fabricscope.diagnosis.graph.ResourceMap`).
For a hypothesis, it runs the type's symptom checks as queries over the findings seen so far
(is finding K from source S present on the resource?), which is what makes a hypothesis
supported, excluded or not yet decidable: a symptom the source would have shown but did not
counts against it only when it is a symptom of the resource itself (``at: self``; whether a
neighbour shows a symptom depends on traffic the diagnosis does not see), the source emits
that finding today, covers the resource and has had time to report (:class:`Coverage`).

The division of labour follows the vendor design in OPERATIONS.md section 3 (seven agents
over one knowledge base); the per-symptom likelihoods make it a naive-Bayes / noisy-OR
evidence model as in Sherlock (Bahl et al., "Towards highly reliable enterprise network
services via inference of multi-level dependencies", SIGCOMM'07).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fabricscope.diagnosis.checks import CheckOutcome, kinds_for, undecided
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.knowledge import FaultType, KnowledgeBase, Symptom
from fabricscope.diagnosis.model import Check, Observed

SPECIALISTS: tuple[str, ...] = ("optics", "link", "congestion", "routing", "host", "job",
                                "config")
#: P(a symptom's finding appears on one given resource | this fault is absent): the
#: instruments' false-alarm rate per resource and incident window, the same for every symptom.
#: A fleet-wide rate of one false finding per hour over ~10^4 resources is ~10^-4 per resource;
#: 10^-3 is the conservative round figure (the benchmark's fault-free runs measure the fleet
#: rate; docs/benchmarks/diagnosis.md).
FALSE_RATE = 1e-3
#: How long an active check's "not seen" stands as evidence: a fault that develops (an optic
#: fading) may show later; after this the check is proposed again. The correlator's join window.
CHECK_TTL_NS = 300 * 1_000_000_000


@dataclass(frozen=True, slots=True)
class Coverage:
    """Which sources ran, how long each needs before silence means absence, and what each
    can see (``covers(signal, resource)``; None: everything)."""

    latency_ns: Mapping[str, int]
    covers: Callable[[str, str], bool] | None = None

    def decides(self, signal: str, resource: str, age_ns: int) -> bool:
        """Would ``signal`` have reported on ``resource`` by now (``age_ns`` after onset)?"""
        lat = self.latency_ns.get(signal)
        if lat is None or age_ns < lat:
            return False
        return self.covers is None or self.covers(signal, resource)


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A candidate root cause: ``fault`` (a knowledge-base type id) on ``resource``."""

    resource: str
    fault: str
    specialist: str


@dataclass(frozen=True, slots=True)
class Assessment:
    """A hypothesis with its evidence: what it explains, its log-odds and the checks run."""

    hypothesis: Hypothesis
    log_odds: float
    explains: tuple[str, ...]
    checks: tuple[Check, ...]
    excluded: bool
    self_evidence: bool  # at least one explained finding names the resource itself
    primary: bool = False  # a defining (primary) symptom of the type is present
    checked_out: bool = False  # every defining symptom of its own was checked and not seen


@dataclass
class FindingIndex:
    """Findings by (source, kind, resource kind, near) -> resource -> finding ids."""

    rmap: ResourceMap
    by_key: dict[tuple[str, str, str, bool], dict[str, list[str]]] = field(default_factory=dict)
    items: dict[str, Observed] = field(default_factory=dict)
    #: (signal, finding, resource) an active check decided -> (when, check kind)
    checked: dict[tuple[str, str, str], tuple[int, str]] = field(default_factory=dict)

    def record(self, outcome: CheckOutcome) -> None:
        """Remember what an active check decided (its present findings are added apart)."""
        for sig, fnd in outcome.decided:
            for r in outcome.decided_on:
                self.checked[(sig, fnd, r)] = (outcome.done_ns, outcome.request.kind)

    def checked_absent(self, signal: str, finding: str, resource: str, now_ns: int) -> bool:
        """Did an active check decide ``finding`` on ``resource`` within :data:`CHECK_TTL_NS`?"""
        hit = self.checked.get((signal, finding, resource))
        return hit is not None and now_ns - hit[0] <= CHECK_TTL_NS

    def add(self, obs: Observed) -> None:
        self.items[obs.id] = obs
        for key, table in self.by_key.items():
            src, kind, rkind, near = key
            if obs.source == src and obs.kind == kind:
                for r in self.rmap.resources(obs.subject, rkind, near=near):
                    table.setdefault(r, []).append(obs.id)

    def on(self, source: str, kind: str, rkind: str, near: bool, resource: str) -> list[str]:
        key = (source, kind, rkind, near)
        table = self.by_key.get(key)
        if table is None:
            table = {}
            for o in self.items.values():
                if o.source == source and o.kind == kind:
                    for r in self.rmap.resources(o.subject, rkind, near=near):
                        table.setdefault(r, []).append(o.id)
            self.by_key[key] = table
        return table.get(resource, [])


class Specialist:
    """One domain's agent over the knowledge base (see the module docstring)."""

    def __init__(self, name: str, kb: KnowledgeBase, rmap: ResourceMap) -> None:
        self.name = name
        self.kb = kb
        self.rmap = rmap
        self.types: tuple[FaultType, ...] = tuple(
            t for t in kb.types.values() if t.specialist == name)

    def propose(self, obs: Observed) -> list[Hypothesis]:
        """Every (resource, type) of this domain that could explain ``obs``."""
        out: list[Hypothesis] = []
        for t, s in self.kb.for_finding(obs.source, obs.kind):
            if t.specialist != self.name:
                continue
            for r in self.rmap.resources(obs.subject, t.resource, near=s.at == "near"):
                out.append(Hypothesis(r, t.id, self.name))
        return out

    def assess(self, h: Hypothesis, index: FindingIndex, coverage: Coverage, *,
               onset_ns: int, now_ns: int) -> Assessment:
        """Run the type's symptom checks for ``h`` against the findings seen so far."""
        t = self.kb.types[h.fault]
        log_odds = math.log(t.prior / (1.0 - t.prior))
        explains: list[str] = []
        checks: list[Check] = []
        self_ev = False
        primary = False
        own_primary = 0
        primary_absent = 0
        used: set[str] = set()
        # A finding counts for one symptom of a hypothesis only (the first it matches, in the
        # knowledge base's order), so one alarm is never evidence twice.
        for s in t.symptoms:
            near = s.at == "near"
            own_primary += int(s.primary and not near)
            all_hits = index.on(s.signal, s.finding, t.resource, near, h.resource)
            hits = [i for i in all_hits if i not in used]
            if all_hits and not hits:
                continue
            if hits:
                used.update(hits)
                log_odds += math.log(s.likelihood / FALSE_RATE)
                explains.extend(hits)
                primary = primary or s.primary
                if not near or any(
                        h.resource in self.rmap.resources(index.items[i].subject, t.resource)
                        for i in hits):
                    self_ev = True
                checks.append(Check(_check_name(s), s.signal, "supports",
                                    f"{len(hits)} finding(s): {', '.join(hits[:3])}"))
            elif not near and index.checked_absent(s.signal, s.finding, h.resource, now_ns):
                t_ns, kind = index.checked[(s.signal, s.finding, h.resource)]
                primary_absent += int(s.primary)
                log_odds += math.log(max(1e-9, 1.0 - s.likelihood) / (1.0 - FALSE_RATE))
                checks.append(Check(_check_name(s), s.signal, "excludes" if s.likelihood >= 0.5
                                    else "inconclusive",
                                    f"active check {kind} at {t_ns / 1e9:.2f} s: not seen"))
            elif s.emitted and not near and coverage.decides(s.signal, h.resource,
                                                              now_ns - onset_ns):
                log_odds += math.log(max(1e-9, 1.0 - s.likelihood) / (1.0 - FALSE_RATE))
                checks.append(Check(_check_name(s), s.signal, "excludes" if s.likelihood >= 0.5
                                    else "inconclusive", "not seen although the source covers it"))
            else:
                why = ("no instrument emits this finding yet" if not s.emitted
                       else "a neighbour's symptom: its absence is not evidence" if near
                       else "source not running, not covering it, or too early")
                checks.append(Check(_check_name(s), s.signal, "not-run", why))
        excluded = False
        for ex in t.excluded_by:
            hits = index.on(ex.signal, ex.finding, t.resource, True, h.resource)
            if hits:
                excluded = True
                checks.append(Check(f"exclusion: {ex.finding} ({ex.signal})", ex.signal,
                                    "excludes", f"{ex.why}: {', '.join(hits[:3])}"))
        return Assessment(h, log_odds, tuple(dict.fromkeys(explains)), tuple(checks), excluded,
                          self_ev, primary, own_primary > 0 and primary_absent == own_primary)


    def checks_for(self, h: Hypothesis, index: FindingIndex, now_ns: int) -> tuple[str, ...]:
        """The active check kinds that would decide a symptom of ``h`` still open (no
        finding present on the resource, not checked yet), :mod:`fabricscope.diagnosis.checks`."""
        t = self.kb.types[h.fault]
        kinds = kinds_for(t)
        if not kinds:
            return ()
        known = {(s.signal, s.finding) for s in t.symptoms if s.at == "self" and (
            index.checked_absent(s.signal, s.finding, h.resource, now_ns)
            or index.on(s.signal, s.finding, t.resource, False, h.resource))}
        return tuple(k for k in kinds if undecided(t, k, known))


def _check_name(s: Symptom) -> str:
    return f"{s.finding} from {s.signal} ({s.at})"


def specialists(kb: KnowledgeBase, rmap: ResourceMap) -> dict[str, Specialist]:
    """The seven specialists over one knowledge base."""
    return {name: Specialist(name, kb, rmap) for name in SPECIALISTS}


def propose_all(team: Mapping[str, Specialist], findings: Iterable[Observed]
                ) -> dict[Hypothesis, list[str]]:
    """Every specialist's hypotheses for ``findings``, with the finding ids that raised each."""
    out: dict[Hypothesis, list[str]] = defaultdict(list)
    for o in findings:
        for sp in team.values():
            for h in sp.propose(o):
                out[h].append(o.id)
    return dict(out)


def footprint(team: Mapping[str, Specialist], obs: Observed) -> Sequence[str]:
    """The resources any specialist would blame for ``obs`` (jobs and the fabric aside):
    findings that share one belong to one incident."""
    return tuple(dict.fromkeys(h.resource for sp in team.values() for h in sp.propose(obs)
                               if h.resource != "fabric"))
