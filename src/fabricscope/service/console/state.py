"""What ``fabricscope serve`` knows, shared by the supervisor thread and the HTTP API.

One :class:`ConsoleState` per process. The supervisor (twin or live sources) writes to it
(incidents, findings, per-instrument views: probe loss matrix, straggler report, optics
grades, link state); the API reads it; listeners (alert senders, the SSE fan-out) are called
on every change. Every collection is bounded (``max_findings``, ``max_incidents``: the oldest
*closed* incidents go first), so a long-running console holds a fixed amount of memory.

Thread safety: one lock guards every mutable field; readers get copies or immutable records
(:class:`~fabricscope.diagnosis.model.Incident` and ``Observed`` are frozen). Listeners are
called outside the lock, in the writer's thread, and must not block (the SSE fan-out and the
alert sender only enqueue).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabricscope.diagnosis.actions import Executor, check_mode, plan_action, refusal
from fabricscope.diagnosis.knowledge import KnowledgeBase
from fabricscope.diagnosis.model import Incident, Observed
from fabricscope.fabric.inventory import Fabric

#: A change: ``("incident", Incident)``, ``("finding", Observed)``, ``("tick", sim_ns)``,
#: ``("ack", incident_id)``, ``("approve", incident_id)``.
Event = tuple[str, Any]
Listener = Callable[[Event], None]

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")


@dataclass(frozen=True, slots=True)
class Ack:
    """An operator's acknowledgement (or approval of an action) of one incident."""

    by: str
    at_s: float  # wall clock, seconds since the epoch
    note: str = ""
    action: str = ""  # for approvals: the action approved
    executed: bool = False  # approvals: whether an executor carried it out
    result: str = ""  # approvals: what the executor did, or why it was not executed


@dataclass
class Counters:
    """Monotonic counts since start (exported as Prometheus counters)."""

    findings: Counter[tuple[str, str]] = field(default_factory=Counter)  # (source, kind)
    incidents_opened: int = 0
    incidents_closed: int = 0
    incidents_evicted: int = 0
    findings_evicted: int = 0
    segments: int = 0  # supervisor runs of the instruments
    supervisor_cpu_s: float = 0.0
    acks: int = 0
    approvals: int = 0


def incident_kind(inc: Incident) -> str:
    """The fault type of the top root cause, or ``unexplained``."""
    return inc.root_causes[0].fault if inc.root_causes else "unexplained"


class ConsoleState:
    """The console's shared, bounded, thread-safe state (see module doc)."""

    def __init__(self, fabric: Fabric, *, mode: str = "twin", max_findings: int = 100_000,
                 max_incidents: int = 20_000, clock: Callable[[], float] = time.time) -> None:
        self.fabric = fabric
        self.mode = mode
        self.max_findings = max_findings
        self.max_incidents = max_incidents
        self.clock = clock
        self.started_s = clock()
        self.counters = Counters()
        self._lock = threading.Lock()
        self._incidents: OrderedDict[str, Incident] = OrderedDict()  # opened order
        self._history: dict[str, list[tuple[int, str]]] = {}  # id -> [(sim_ns, what)]
        self._findings: deque[Observed] = deque()
        self._finding_by_id: dict[str, Observed] = {}
        self._acks: dict[str, Ack] = {}
        self._approvals: dict[str, list[Ack]] = {}
        self._listeners: list[Listener] = []
        self._views: dict[str, Any] = {}
        self.sim_ns = 0
        self.speed = 1.0
        self.info: dict[str, Any] = {}
        self.executor: Executor | None = None
        self.action_mode = "off"
        self._kb: KnowledgeBase | None = None
        self._auto_done: set[tuple[str, str, str]] = set()
        self._costed_out: dict[str, int] = {}  # cable -> console time of an executed cost-out
        self._executed: dict[str, list[Any]] = {}  # incident id -> ActionResults not undone

    def configure_actions(self, executor: Executor | None, kb: KnowledgeBase, *,
                          mode: str = "approve") -> None:
        """Let approvals (``approve``) or the supervisor itself (``auto``) execute the
        allowed actions (:mod:`fabricscope.diagnosis.actions`) with ``executor``; ``off``
        (the default state) records approvals only."""
        self.action_mode = check_mode(mode, source="actions")
        self.executor = executor
        self._kb = kb

    # -- listeners -------------------------------------------------------------------------
    def subscribe(self, fn: Listener) -> Callable[[], None]:
        """Call ``fn`` on every change; returns the function that unsubscribes it."""
        with self._lock:
            self._listeners.append(fn)

        def cancel() -> None:
            with self._lock:
                if fn in self._listeners:
                    self._listeners.remove(fn)
        return cancel

    def _emit(self, events: Iterable[Event]) -> None:
        with self._lock:
            fns = list(self._listeners)
        for ev in events:
            for fn in fns:
                fn(ev)

    # -- writers (the supervisor) ----------------------------------------------------------
    def add_findings(self, found: Sequence[Observed]) -> None:
        """Record findings (a refresh of a known id replaces it in place)."""
        new: list[Event] = []
        with self._lock:
            for o in found:
                if o.id not in self._finding_by_id:
                    self.counters.findings[(o.source, o.kind)] += 1
                    self._findings.append(o)
                    new.append(("finding", o))
                self._finding_by_id[o.id] = o
            while len(self._findings) > self.max_findings:
                old = self._findings.popleft()
                if self._finding_by_id.get(old.id) is old or old.id in self._finding_by_id:
                    self._finding_by_id.pop(old.id, None)
                self.counters.findings_evicted += 1
        self._emit(new)

    def upsert_incident(self, inc: Incident) -> None:
        """Record a new or changed incident and notify the listeners."""
        with self._lock:
            prev = self._incidents.get(inc.id)
            what = ("closed" if inc.status == "closed" else "opened" if prev is None
                    else "reopened" if prev.status == "closed" else "updated")
            if prev is None:
                self.counters.incidents_opened += 1
            if inc.status == "closed" and (prev is None or prev.status != "closed"):
                self.counters.incidents_closed += 1
            top = inc.root_causes[0] if inc.root_causes else None
            detail = what + (f": {top.fault} on {top.resource} (p={top.probability:.2f})"
                             if top is not None else f": {inc.title}")
            hist = self._history.setdefault(inc.id, [])
            if not hist or hist[-1][1] != detail:
                hist.append((inc.updated_ns, detail))
                del hist[:-200]
            self._incidents[inc.id] = inc
            self._evict_incidents()
        self._emit([("incident", inc)])
        if self.action_mode == "auto" and inc.status == "open" and inc.root_causes:
            self._auto(inc)

    def _auto(self, inc: Incident) -> None:
        """``auto`` mode: execute the top root cause's allowed action once."""
        rc = inc.root_causes[0]
        if self._kb is None or not rc.action:
            return
        planned = plan_action(self._kb, inc, rc.action)
        key = (inc.id, planned.automation if planned else "", rc.resource)
        if planned is None or key in self._auto_done or refusal(planned, self.executor,
                                                                  self.action_mode):
            return
        self._auto_done.add(key)
        self._execute(inc, rc.action, "supervisor (--actions auto)", "", planned)

    def _evict_incidents(self) -> None:
        while len(self._incidents) > self.max_incidents:
            victim = next((k for k, v in self._incidents.items() if v.status == "closed"),
                          next(iter(self._incidents)))
            del self._incidents[victim]
            self._history.pop(victim, None)
            self._acks.pop(victim, None)
            self._approvals.pop(victim, None)
            self.counters.incidents_evicted += 1

    def set_time(self, sim_ns: int) -> None:
        """Advance the supervisor's clock (simulated ns in twin mode) and notify."""
        with self._lock:
            self.sim_ns = sim_ns
        self._emit([("tick", sim_ns)])

    def set_view(self, name: str, value: Any) -> None:
        """Replace one instrument view (``probes``, ``stragglers``, ``optics``, ``links``...)."""
        with self._lock:
            self._views[name] = value
        self._emit([("view", name)])

    # -- operators --------------------------------------------------------------------------
    def acknowledge(self, id: str, by: str, note: str = "") -> Ack | None:
        """Acknowledge incident ``id``; None when there is no such incident."""
        with self._lock:
            if id not in self._incidents:
                return None
            ack = Ack(by, self.clock(), note[:500])
            self._acks[id] = ack
            self.counters.acks += 1
        self._emit([("ack", id)])
        return ack

    def approve(self, id: str, action: str, by: str, note: str = "") -> Ack | None:
        """Record the approval of ``action`` (one of the incident's proposed actions) for
        incident ``id``, and execute it when actions are on (:meth:`configure_actions`), an
        executor is configured and the action is on the allow-list; the approval says
        whether it was executed and what was done, and so does the incident's history.
        None when there is no such incident or action."""
        with self._lock:
            inc = self._incidents.get(id)
            if inc is None:
                return None
            proposed = {rc.action for rc in inc.root_causes if rc.action} | {
                a for a in inc.actions if a.startswith("proposed: ")}
            if action not in proposed:
                return None
        planned = plan_action(self._kb, inc, action) if self._kb is not None else None
        return self._execute(inc, action, by, note, planned)

    def _execute(self, inc: Incident, action: str, by: str, note: str,
                 planned: Any) -> Ack:
        """Execute ``planned`` when the mode and the allow-list let it (outside the lock:
        an executor may take time), record the approval and what was done in the
        incident's history."""
        why = refusal(planned, self.executor, self.action_mode)
        if why:
            executed, result = False, f"not executed: {why}"
        else:
            assert self.executor is not None and planned is not None
            r = self.executor.execute(planned.automation, planned.root_cause.resource)
            executed = r.ok
            if r.ok:
                with self._lock:
                    self._executed.setdefault(inc.id, []).append(r)
                    if r.automation == "cost-out-link":
                        self._costed_out[r.resource] = self.sim_ns
            result = (f"executed: {r.detail}" + (f" (undo: {r.undo})" if r.undo else "")
                      if r.ok else f"failed: {r.detail}")
        with self._lock:
            ack = Ack(by, self.clock(), note[:500], action=action, executed=executed,
                      result=result)
            self._approvals.setdefault(inc.id, []).append(ack)
            self.counters.approvals += 1
            hist = self._history.setdefault(inc.id, [])
            hist.append((self.sim_ns, f"approved by {by}: {action}; {result}"))
            del hist[:-200]
        self._emit([("approve", inc.id)])
        return ack

    # -- readers ----------------------------------------------------------------------------
    def incidents(self, *, status: str | None = None, severity: str | None = None,
                  kind: str | None = None, q: str | None = None, limit: int = 100,
                  offset: int = 0) -> tuple[int, list[Incident]]:
        """(how many match, the page): newest first, filtered by status, severity, the top
        root cause's fault type (``kind``) and a substring of the title / resources."""
        with self._lock:
            items = list(self._incidents.values())
        items.reverse()
        if status:
            items = [i for i in items if i.status == status]
        if severity:
            items = [i for i in items if i.severity == severity]
        if kind:
            items = [i for i in items if incident_kind(i) == kind]
        if q:
            ql = q.lower()
            items = [i for i in items if ql in i.title.lower() or ql in i.id
                     or any(ql in rc.resource.lower() for rc in i.root_causes)]
        return len(items), items[offset: offset + limit]

    def incident(self, id: str) -> Incident | None:
        with self._lock:
            return self._incidents.get(id)

    def undo(self, id: str, by: str, note: str = "") -> tuple[bool, str] | None:
        """Undo the last executed action of incident ``id`` that is not undone yet (the
        executor's ``revert``: a cost-in after a cost-out); recorded in its history.
        (ok, what was done); None when the incident has no executed action to undo."""
        with self._lock:
            if id not in self._incidents or not self._executed.get(id):
                return None
            done = self._executed[id][-1]
        revert = getattr(self.executor, "revert", None)
        if revert is None:
            ok, detail = False, "this executor cannot undo"
        else:
            r = revert(done)
            ok, detail = r.ok, r.detail
        with self._lock:
            if ok:
                self._executed[id].pop()
                self._costed_out.pop(done.resource, None)
            hist = self._history.setdefault(id, [])
            hist.append((self.sim_ns, f"undo by {by} of {done.automation} on {done.resource}: "
                                      f"{'done: ' if ok else 'failed: '}{detail}"
                                      + (f" ({note[:200]})" if note else "")))
            del hist[:-200]
        self._emit([("approve", id)])
        return ok, detail

    def undoable(self, id: str) -> bool:
        """Whether incident ``id`` has an executed action that :meth:`undo` can reverse."""
        with self._lock:
            return bool(self._executed.get(id))

    def costed_out(self) -> dict[str, int]:
        """Cables an executed ``cost-out-link`` took out, with the console time it did."""
        with self._lock:
            return dict(self._costed_out)

    def history(self, id: str) -> list[tuple[int, str]]:
        """The incident's changes: (sim_ns, what) in order."""
        with self._lock:
            return list(self._history.get(id, ()))

    def ack_of(self, id: str) -> Ack | None:
        with self._lock:
            return self._acks.get(id)

    def approvals_of(self, id: str) -> list[Ack]:
        with self._lock:
            return list(self._approvals.get(id, ()))

    def findings(self, *, ids: Sequence[str] | None = None, source: str | None = None,
                 kind: str | None = None, subject: str | None = None,
                 since_ns: int | None = None, limit: int = 1000) -> list[Observed]:
        """Findings, newest first (by id when ``ids`` is given, in that order)."""
        with self._lock:
            if ids is not None:
                return [self._finding_by_id[i] for i in ids if i in self._finding_by_id][:limit]
            items = list(self._finding_by_id.values())
        items.sort(key=lambda o: o.reported_ns, reverse=True)
        out = []
        for o in items:
            if source and o.source != source:
                continue
            if kind and o.kind != kind:
                continue
            if subject and subject not in o.subject:
                continue
            if since_ns is not None and o.reported_ns < since_ns:
                continue
            out.append(o)
            if len(out) >= limit:
                break
        return out

    def view(self, name: str) -> Any:
        """One instrument view, or None when no instrument has produced it."""
        with self._lock:
            return self._views.get(name)

    def open_by(self) -> Mapping[tuple[str, str], int]:
        """Open incidents counted by (severity, kind) (the Prometheus gauge)."""
        with self._lock:
            items = list(self._incidents.values())
        return Counter((i.severity, incident_kind(i)) for i in items if i.status == "open")

    def snapshot(self) -> dict[str, Any]:
        """Headline numbers for ``/api/v1/status`` and the page header."""
        with self._lock:
            n_open = sum(1 for i in self._incidents.values() if i.status == "open")
            return {
                "mode": self.mode, "fabric": self.fabric.name, "sim_ns": self.sim_ns,
                "speed": self.speed, "incidents_open": n_open,
                "incidents": len(self._incidents), "findings": len(self._finding_by_id),
                "uptime_s": round(self.clock() - self.started_s, 3), **self.info,
            }
