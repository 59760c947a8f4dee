"""The coordinator and the verifier: the fewest root causes that explain an incident's findings.

Method: parsimonious covering (Peng & Reggia, "Abductive Inference Models for Diagnostic
Problem-Solving", 1990) with Bayesian scores. Every specialist proposes hypotheses; each is
scored by its log posterior odds (the type's prior, times for every symptom of the type the
likelihood ratio of its presence or, where the source covers the resource and has had time to
report, of its absence; :mod:`fabricscope.diagnosis.specialists`). The coordinator then
covers the findings greedily, as Sherlock / SCORE do for network fault localization (Bahl et
al. SIGCOMM'07; Kompella et al. NSDI'05): take the best-scoring hypothesis that explains a
finding nothing chosen yet explains, mark what it explains, repeat until no hypothesis has
positive odds. A hypothesis's probability is its share of the posterior mass among the
hypotheses competing for the same findings that the evidence could also conclude (a defining
symptom present), including "none of these" (odds 1); types whose defining symptom has not
been observed are listed in the evidence as not excluded yet, not counted.

The verifier then rejects any conclusion whose evidence does not support it: the resource is
not in the inventory, an excluding finding is present, no explained finding names the
resource itself (only neighbours), none of the type's primary (defining) symptoms is
present, the probability is below ``min_probability``, or it
explains less than ``material`` of the incident's findings (weighted by score).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fabricscope.diagnosis.cases import CaseBase, signature_of
from fabricscope.diagnosis.knowledge import KnowledgeBase
from fabricscope.diagnosis.model import Observed, RootCause
from fabricscope.diagnosis.specialists import (
    Assessment,
    Coverage,
    FindingIndex,
    Hypothesis,
    Specialist,
    propose_all,
)


@dataclass(frozen=True, slots=True)
class CoordinatorParams:
    """Decision thresholds (documented in docs/diagnosis.md)."""

    min_probability: float = 0.35
    material: float = 0.1
    max_causes: int = 4
    min_log_odds: float = 0.0
    #: Active checks: propose them for the hypotheses within ``check_margin`` log-odds of the
    #: best one (competitors), at most ``max_checks`` per diagnosis (0: propose none).
    max_checks: int = 0
    check_margin: float = 9.0
    #: Case base (:mod:`fabricscope.diagnosis.cases`): a conclusion whose explained findings
    #: resemble a past case of the same fault type (similarity >= ``case_min_similarity``)
    #: gains ``case_weight`` x similarity log-odds (a prior from experience, a tie-breaker).
    case_weight: float = 1.5
    case_min_similarity: float = 0.5


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The coordinator's answer for one set of findings."""

    root_causes: tuple[RootCause, ...]
    rejected: tuple[tuple[RootCause, str], ...]  # (conclusion, why the verifier refused it)
    unexplained: tuple[str, ...]  # finding ids no accepted root cause explains
    considered: int  # hypotheses assessed
    #: active checks that would separate the competing hypotheses: (kind, resource, for)
    wanted: tuple[tuple[str, str, tuple[str, str]], ...] = ()


def _prob(best: float, rivals: Sequence[float]) -> float:
    m = max([best, 0.0, *rivals])
    den = math.exp(-m) + math.exp(best - m) + sum(math.exp(x - m) for x in rivals)
    return math.exp(best - m) / den


def diagnose(
    findings: Sequence[Observed],
    team: Mapping[str, Specialist],
    index: FindingIndex,
    coverage: Coverage,
    *,
    now_ns: int,
    params: CoordinatorParams = CoordinatorParams(),
    cases: CaseBase | None = None,
) -> Diagnosis:
    """Root causes for ``findings`` (one incident's), ranked by probability.

    ``cases``: past incidents; a conclusion similar to one of its type gains log-odds
    (:attr:`CoordinatorParams.case_weight`) and cites the case in its evidence.
    """
    if not findings:
        return Diagnosis((), (), (), 0)
    kb: KnowledgeBase = next(iter(team.values())).kb
    onset = min(max(0, o.finding.window[0]) for o in findings)
    raised = propose_all(team, findings)
    ids = {o.id for o in findings}
    weight = {o.id: max(0.05, min(1.0, float(o.finding.score))) for o in findings}
    total = sum(weight.values())
    scored: list[Assessment] = []
    for h in raised:
        a = team[h.specialist].assess(h, index, coverage, onset_ns=onset, now_ns=now_ns)
        scored.append(Assessment(a.hypothesis, a.log_odds,
                                 tuple(i for i in a.explains if i in ids), a.checks,
                                 a.excluded, a.self_evidence, a.primary, a.checked_out))
    notes: dict[Hypothesis, str] = {}
    if cases is not None and len(cases):
        scored = [_with_case(a, cases, index, params, notes) for a in scored]
    scored.sort(key=lambda a: (-a.log_odds, a.hypothesis.fault, a.hypothesis.resource))
    unexplained = set(ids)
    accepted: list[RootCause] = []
    rejected: list[tuple[RootCause, str]] = []
    for a in scored:
        if len(accepted) >= params.max_causes or not unexplained:
            break
        if a.log_odds <= params.min_log_odds:
            break
        new = [i for i in a.explains if i in unexplained]
        if not new:
            continue
        # Rivals: the other conclusions the present evidence could support (a defining symptom
        # present). Types whose defining symptom has not been observed are named in the
        # evidence as "not excluded yet", and the plan's checks are what separates them.
        overlap = [b for b in scored if b is not a and set(b.explains) & set(new)]
        p = _prob(a.log_odds, [b.log_odds for b in overlap if b.primary])
        rc = _root_cause(a, p, kb, index, [b for b in overlap if not b.primary
                                           and not b.checked_out
                                           and b.log_odds > a.log_odds - 3.0],
                         notes.get(a.hypothesis, ""))
        why = _verify(a, p, new, weight, total, params, index)
        if why:
            rejected.append((rc, why))
            continue
        accepted.append(rc)
        unexplained.difference_update(a.explains)
    accepted.sort(key=lambda r: -r.probability)
    wanted = _wanted(scored, team, index, params, now_ns) if params.max_checks > 0 else ()
    return Diagnosis(tuple(accepted), tuple(rejected), tuple(sorted(unexplained)), len(scored),
                     wanted)


def _wanted(scored: Sequence[Assessment], team: Mapping[str, Specialist], index: FindingIndex,
            params: CoordinatorParams, now_ns: int) -> tuple[tuple[str, str, tuple[str, str]], ...]:
    """The active checks of the competing hypotheses (best first), one per (kind, resource):
    every one of them runs at once, so the answer waits for the slowest, not for the sum."""
    if not scored:
        return ()
    best = scored[0].log_odds
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for a in scored:
        if a.log_odds < best - params.check_margin or len(out) >= params.max_checks:
            break
        if a.excluded:
            continue
        h = a.hypothesis
        for kind in team[h.specialist].checks_for(h, index, now_ns):
            out.setdefault((kind, h.resource), (h.resource, h.fault))
            if len(out) >= params.max_checks:
                break
    return tuple((k, r, f) for (k, r), f in out.items())


def _verify(a: Assessment, p: float, new: Sequence[str], weight: Mapping[str, float],
            total: float, params: CoordinatorParams, index: FindingIndex) -> str:
    """Why the verifier refuses ``a`` ("" when it stands)."""
    h = a.hypothesis
    if not index.rmap.known(h.resource):
        return f"{h.resource} is not in the inventory"
    if a.excluded:
        return "an excluding finding is present on the resource"
    if not a.primary:
        return "none of the type's defining (primary) symptoms is present"
    if not a.self_evidence:
        return "no explained finding names the resource itself (only its neighbours)"
    if p < params.min_probability:
        return f"probability {p:.2f} < {params.min_probability}"
    share = sum(weight[i] for i in new) / total if total else 0.0
    if share < params.material:
        return f"explains {share:.0%} of the incident's findings (< {params.material:.0%})"
    return ""


def _with_case(a: Assessment, cases: CaseBase, index: FindingIndex, params: CoordinatorParams,
               notes: dict[Hypothesis, str]) -> Assessment:
    """``a`` with the case base's support: the most similar past case of its fault type
    (case-based reasoning's *retrieve* and *reuse*, Aamodt & Plaza 1994)."""
    if not a.primary:
        return a
    h = a.hypothesis
    sig = signature_of([index.items[i] for i in a.explains], h.resource)
    best = cases.retrieve(sig, 1, fault=h.fault)
    if not best or best[0][1] < params.case_min_similarity:
        return a
    case, sim = best[0]
    notes[h] = (f"similar past case {case.id} (similarity {sim:.2f}, +{params.case_weight * sim:.2f}"
                f" log-odds): {case.resolution[:160]}")
    return replace(a, log_odds=a.log_odds + params.case_weight * sim)


def _root_cause(a: Assessment, p: float, kb: KnowledgeBase, index: FindingIndex,
                open_: Sequence[Assessment] = (), case_note: str = "") -> RootCause:
    h: Hypothesis = a.hypothesis
    t = kb.types[h.fault]
    ev = []
    for i in a.explains[:8]:
        o = index.items[i]
        ev.append(f"[{i}] {o.source}: {o.kind} on {o.subject} (score {o.finding.score:.2f})")
    if open_:
        names = sorted({f"{b.hypothesis.fault} on {b.hypothesis.resource}" for b in open_})
        ev.append("not excluded yet (their defining symptoms not observed): "
                  + ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else ""))
    if case_note:
        ev.append(case_note)
    action = t.actions[0].action if t.actions else ""
    return RootCause(resource=h.resource, fault=h.fault, probability=round(p, 4),
                     explains=a.explains, evidence=tuple(ev), checks=a.checks, action=action,
                     specialist=h.specialist)
