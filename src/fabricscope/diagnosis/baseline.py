"""The knowledge-tree baseline: alarm-by-alarm rules from the knowledge base.

This is the *baseline* the issue's benchmark compares the coordinator with ("a decision
tree of rules from the same knowledge base, as traditional automated troubleshooting
does"): the rule-based, alarm-driven fault isolation of classical network management
(event -> rule -> root cause; see Steinder & Sethi, "A survey of fault localization
techniques in computer networks", Science of Computer Programming 53, 2004, section on
rule-based / expert systems). It is built mechanically from the knowledge base, so it
knows exactly what the coordinator knows and the benchmark measures the reasoning, not the
knowledge.

How the tree is built and walked:

1. Each alarm (an :class:`~fabricscope.diagnosis.model.Observed` finding) is handled on its
   own, in arrival order (``reported_ns``; ties keep the input order).
2. Its ``(signal, kind)`` selects the branch: the fault types whose *primary* symptom is that
   finding, in a fixed order (prior descending, then id). A type whose resource kind the
   finding's subject does not implicate (``resource_of`` returns nothing) is not a branch.
3. The first type in that order that is *confirmed* is taken: one of its other ``at: self``
   symptoms was already seen (among the alarms so far) on the same resource. When none is
   confirmed, the first branch is taken.
4. One root cause per distinct ``(resource, type)``; a later alarm that lands on the same
   pair adds nothing.

What it does not do (what the coordinator is measured against): no probabilistic
combination (each answer has probability 1.0), no joining of alarms across resources over
the inventory graph, no explaining-away (two symptoms of one fault on different resources
give two root causes), no use of ``excluded_by``. An ambiguous probe finding (subject
``x | y``) is handled as its first member: a directed link as a ``gray-link`` alarm, a NIC
(``host/nicN``) as ``nic-fault``, any other device as ``switch-fault``.

Suspicions (:mod:`fabricscope.diagnosis.suspicions`, sub-alarm statistics) are not read: a
rule-based tree is keyed by alarms (its branches are the knowledge base's primary symptoms,
and a suspicion is none), as in the event-correlation systems the survey describes, which
act on alarms that crossed their thresholds. Giving the tree the coordinator's suspicion
gate would make it a different procedure, not the baseline.

:class:`TreeWalker` is the same tree with active checks (:mod:`fabricscope.diagnosis.checks`):
an unconfirmed branch runs its checks one after another before the walk moves on, each at
the cost the coordinator pays for it; the benchmark compares the two procedures with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fabricscope.diagnosis.checks import CheckOutcome, CheckRequest, kinds_for, undecided
from fabricscope.diagnosis.knowledge import FaultType, KnowledgeBase, Symptom, members
from fabricscope.diagnosis.model import Observed, RootCause
from fabricscope.diagnosis.suspicions import is_suspicion

ResourceOf = Callable[[str, str], tuple[str, ...]]
"""``resource_of(subject, resource_kind)``: the inventory ids of kind ``resource_kind``
(``cable``, ``port``, ``switch``, ``nic``, ``host``, ``gpu``, ``job``, ``fabric``) that a
finding subject implicates, the most direct first (a directed link -> its cable; a port ->
its cable, its device; a NIC -> its access cables, its host; ``host/gpu3`` -> its host);
empty when it implicates none."""

SPECIALIST = "knowledge-tree"


def _member_kind(signal: str, kind: str, subject: str) -> str:
    """The alarm kind a tree handles an ambiguous probe finding as (its first member's)."""
    if signal != "probe" or kind != "ambiguous":
        return kind
    if "->" in subject:
        return "gray-link"
    if "/nic" in subject:
        return "nic-fault"
    return "switch-fault"


def _confirmation(ft: FaultType, branch: Symptom, resource: str, seen: Sequence[Observed],
                  current: Observed, resource_of: ResourceOf) -> Observed | None:
    """An earlier alarm that is another ``at: self`` symptom of ``ft`` on ``resource``."""
    wanted = {s.key for s in ft.symptoms if s.at == "self" and s != branch}
    if not wanted:
        return None
    for g in seen:
        if g is current or (g.source, g.kind) not in wanted:
            continue
        if resource in resource_of(members(g.subject)[0], ft.resource):
            return g
    return None


def knowledge_tree(findings: Sequence[Observed], kb: KnowledgeBase,
                   resource_of: ResourceOf) -> list[RootCause]:
    """Root causes the knowledge-tree baseline names for ``findings`` (see the module doc).

    Parameters
    ----------
    findings:
        The alarms, in any order; they are walked by ``reported_ns``.
    kb:
        The knowledge base the tree is built from (its primary symptoms and priors).
    resource_of:
        Maps a finding subject and a resource kind to the inventory ids it implicates
        (:data:`ResourceOf`); the tree names the first one.

    Returns
    -------
    One :class:`RootCause` per distinct ``(resource, fault type)``, in the order they were
    first named; each with probability 1.0, ``explains`` the alarm that named it, the type's
    first action and ``specialist="knowledge-tree"``.
    """
    findings = [o for o in findings if not is_suspicion(o)]  # alarms only (module doc)
    order = sorted(range(len(findings)), key=lambda i: (findings[i].reported_ns, i))
    seen: list[Observed] = []
    out: dict[tuple[str, str], RootCause] = {}
    for i in order:
        o = findings[i]
        seen.append(o)
        subject = members(o.subject)[0]
        kind = _member_kind(o.source, o.kind, subject)
        branch: list[tuple[FaultType, Symptom, str]] = []
        for ft, sym in kb.branches(o.source, kind):
            if any(b[0].id == ft.id for b in branch):
                continue
            ids = resource_of(subject, ft.resource)
            if ids:
                branch.append((ft, sym, ids[0]))
        if not branch:
            continue
        pick, why = branch[0], "first branch, not confirmed"
        for ft, sym, res in branch:
            g = _confirmation(ft, sym, res, seen, o, resource_of)
            if g is not None:
                pick, why = (ft, sym, res), f"confirmed by {g.source} {g.kind} ({g.id})"
                break
        ft, _, res = pick
        if (res, ft.id) in out:
            continue
        out[(res, ft.id)] = RootCause(
            resource=res, fault=ft.id, probability=1.0, explains=(o.id,),
            evidence=(f"{o.source} {o.kind} on {o.subject} ({o.id}) -> {ft.id} on {res}: "
                      f"{why}",),
            action=ft.actions[0].action if ft.actions else "", specialist=SPECIALIST)
    return list(out.values())


class TreeWalker:
    """The knowledge tree walked the way automated troubleshooting runs it: with checks.

    Each alarm starts a walk over its branches (the order of :func:`knowledge_tree`). At a
    branch, a type already confirmed by a symptom seen so far (rule 3 above) is taken at once;
    otherwise the branch's active checks (:func:`~fabricscope.diagnosis.checks.kinds_for`)
    run *one after another*, and the first whose result supports the type (another of its
    ``at: self`` symptoms present) confirms it. A branch with nothing left to check is passed.
    When no branch is confirmed, the first is taken once every check has run. Walks of
    different alarms proceed independently; a check another walk already ran (or is running)
    is not run twice. The checks and their costs are the coordinator's
    (:data:`~fabricscope.diagnosis.checks.CHECK_KINDS`), so a benchmark compares the two
    procedures, not two sets of measurements. ``presence_only=False`` walks without the
    checks that decide only presence on a branch's resource
    (:attr:`~fabricscope.diagnosis.checks.CheckKind.presence_only`): run one after another,
    such a check costs a walk its latency even when it finds nothing, so a benchmark times
    the tree both ways.

    Driven by the caller's clock: :meth:`add` the alarms, :meth:`step` to advance the walks
    (it returns the checks to start), :meth:`outcome` with what a check found.
    """

    def __init__(self, kb: KnowledgeBase, resource_of: ResourceOf, *, checks: bool = True,
                 presence_only: bool = True) -> None:
        self.kb = kb
        self.checks = checks
        self.presence_only = presence_only
        self.resource_of = resource_of
        self.seen: list[Observed] = []
        self.named: dict[tuple[str, str], int] = {}
        self.causes: dict[tuple[str, str], RootCause] = {}
        self._walks: list[_Walk] = []
        self._results: dict[tuple[str, str], CheckOutcome] = {}
        self._pending: dict[tuple[str, str], list[_Walk]] = {}
        self._checked: set[tuple[str, str, str]] = set()  # (signal, finding, resource)
        self.checks_run = 0

    def add(self, findings: Sequence[Observed]) -> None:
        """New alarms (each starts a walk) in arrival order; suspicions are not alarms and
        are ignored (module doc)."""
        for o in sorted(findings, key=lambda x: x.reported_ns):
            if is_suspicion(o):
                continue
            self.seen.append(o)
            subject = members(o.subject)[0]
            kind = _member_kind(o.source, o.kind, subject)
            branch: list[tuple[FaultType, Symptom, str]] = []
            for ft, sym in self.kb.branches(o.source, kind):
                if any(b[0].id == ft.id for b in branch):
                    continue
                ids = self.resource_of(subject, ft.resource)
                if ids:
                    branch.append((ft, sym, ids[0]))
            if branch:
                self._walks.append(_Walk(o, branch))

    def outcome(self, out: CheckOutcome) -> None:
        """What a check found: its findings become symptoms seen, waiting walks resume."""
        self._results[out.request.key] = out
        self.seen.extend(out.present)
        for sig, fnd in out.decided:
            for r in out.decided_on:
                self._checked.add((sig, fnd, r))
        for w in self._pending.pop(out.request.key, []):
            w.waiting = None
            w.last = out

    def step(self, now_ns: int) -> list[CheckRequest]:
        """Advance every walk not waiting for a check; the checks to start now."""
        out: list[CheckRequest] = []
        for w in self._walks:
            while not w.done and w.waiting is None:
                req = self._advance(w, now_ns)
                if req is not None:
                    out.append(req)
        self._walks = [w for w in self._walks if not w.done]
        return out

    def _advance(self, w: _Walk, now_ns: int) -> CheckRequest | None:
        if w.i >= len(w.branch):
            ft, _, res = w.branch[0]
            self._name(w, ft, res, now_ns, f"first branch, not confirmed after {w.checks} check(s)")
            return None
        ft, sym, res = w.branch[w.i]
        if w.last is not None:
            last, w.last = w.last, None
            if last.result_for(ft, exclude=sym.key) == "supports":
                got = ", ".join(sorted({o.kind for o in last.present}))
                self._name(w, ft, res, now_ns, f"confirmed by check {last.request.kind} ({got})")
                return None
        g = _confirmation(ft, sym, res, self.seen, w.alarm, self.resource_of)
        if g is not None:
            self._name(w, ft, res, now_ns, f"confirmed by {g.source} {g.kind} ({g.id})")
            return None
        if w.kinds is None:
            w.kinds = list(kinds_for(ft, presence_only=self.presence_only)) if self.checks else []
        while w.kinds:
            kind = w.kinds.pop(0)
            known = {s.key for s in ft.symptoms if (s.signal, s.finding, res) in self._checked}
            known.add(sym.key)
            if not undecided(ft, kind, known):
                continue
            key = (kind, res)
            w.checks += 1
            done = self._results.get(key)
            if done is not None:
                w.last = done
                return None
            w.waiting = key
            first = key not in self._pending
            self._pending.setdefault(key, []).append(w)
            return CheckRequest(kind, res, now_ns, (res, ft.id)) if first else None
        w.i += 1
        w.kinds = None
        return None

    def _name(self, w: _Walk, ft: FaultType, res: str, now_ns: int, why: str) -> None:
        w.done = True
        o = w.alarm
        if (res, ft.id) in self.causes:
            return
        self.named[(res, ft.id)] = now_ns
        self.causes[(res, ft.id)] = RootCause(
            resource=res, fault=ft.id, probability=1.0, explains=(o.id,),
            evidence=(f"{o.source} {o.kind} on {o.subject} ({o.id}) -> {ft.id} on {res}: {why}",),
            action=ft.actions[0].action if ft.actions else "", specialist=SPECIALIST)

    def root_causes(self) -> list[RootCause]:
        """Every root cause named so far, in the order named."""
        return list(self.causes.values())


@dataclass
class _Walk:
    alarm: Observed
    branch: list[tuple[FaultType, Symptom, str]]
    i: int = 0
    kinds: list[str] | None = None
    waiting: tuple[str, str] | None = None
    last: CheckOutcome | None = None
    checks: int = 0
    done: bool = False
