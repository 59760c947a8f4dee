"""Remediation actions: the allow-list, the modes, and what an executor must provide.

Only reversible actions of the knowledge base whose ``automation`` is on :data:`ALLOW_LIST`
can be executed (issue 15: "actions only from an allow-list of reversible ones: cost out a
link, shift a load-balancing weight, restart an agent; off by default, executed only after
approval; everything it did is in the incident"):

* ``cost-out-link``: drain a cable from ECMP (the routing avoids it; undo: cost it in);
* ``shift-lb-weight``: move half of a cable's share of the load to its ECMP siblings (undo:
  restore the weight);
* ``restart-agent``: restart the probe / telemetry agent on a host.

Modes (:data:`ACTION_MODES`): ``off`` (the default: actions are proposed, never executed),
``approve`` (an operator's approval through the console / API executes the approved action),
``auto`` (the supervisor executes an incident's allowed action as soon as it is proposed).
Executing is the service layer's job (:class:`Executor`; the twin backend is
``fabricscope.service.instruments.executor``); this module is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fabricscope.diagnosis.knowledge import KbAction, KnowledgeBase
from fabricscope.diagnosis.model import Incident, RootCause
from fabricscope.model.errors import ConfigError

ALLOW_LIST: frozenset[str] = frozenset({"cost-out-link", "shift-lb-weight", "restart-agent"})
ACTION_MODES: tuple[str, ...] = ("off", "approve", "auto")


def check_mode(mode: str, *, source: str = "--actions") -> str:
    """``mode`` when it is one of :data:`ACTION_MODES`, else a ConfigError naming it."""
    if mode not in ACTION_MODES:
        raise ConfigError(f"{source}: expected one of {', '.join(ACTION_MODES)}, got {mode!r}")
    return mode


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an executor did: ``ok`` when it took effect, ``detail`` what it changed,
    ``undo`` how to reverse it."""

    automation: str
    resource: str
    ok: bool
    detail: str
    undo: str = ""


class Executor(Protocol):
    """Carries out allowed actions on a fabric (the twin's, or a live one's)."""

    def supports(self, automation: str) -> bool:
        """Whether this backend can carry out ``automation``."""
        ...

    def execute(self, automation: str, resource: str) -> ActionResult:
        """Carry out ``automation`` on ``resource`` (an inventory id) now."""
        ...


@dataclass(frozen=True, slots=True)
class PlannedAction:
    """An incident's action resolved against the knowledge base."""

    root_cause: RootCause
    action: KbAction

    @property
    def automation(self) -> str:
        return self.action.automation


def allowed(action: KbAction) -> bool:
    """Reversible and on the allow-list."""
    return action.reversible and action.automation in ALLOW_LIST


def plan_action(kb: KnowledgeBase, incident: Incident, text: str) -> PlannedAction | None:
    """The root cause and knowledge-base action that ``text`` names in ``incident``: a root
    cause's action text, or one of the incident's ``proposed: FAULT on RESOURCE: ACTION``
    lines. None when nothing matches."""
    for rc in incident.root_causes:
        if rc.fault not in kb:
            continue
        for a in kb.get(rc.fault).actions:
            line = f"proposed: {rc.fault} on {rc.resource}: {a.action}"
            if (text == a.action and rc.action == a.action) or text.startswith(line):
                return PlannedAction(rc, a)
    return None


def refusal(planned: PlannedAction | None, executor: Executor | None, mode: str) -> str:
    """Why ``planned`` is not executed ("" when it may be)."""
    if mode == "off":
        return "actions are off (--actions off)"
    if executor is None:
        return "no action executor is configured"
    if planned is None:
        return "not an action of the incident's root causes"
    if not allowed(planned.action):
        return (f"{planned.automation or 'manual'}: not on the allow-list of reversible "
                f"actions ({', '.join(sorted(ALLOW_LIST))})")
    if not executor.supports(planned.automation):
        return f"{planned.automation}: this executor cannot carry it out"
    return ""
