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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fabricscope.diagnosis.knowledge import FaultType, KnowledgeBase, Symptom, members
from fabricscope.diagnosis.model import Observed, RootCause

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
