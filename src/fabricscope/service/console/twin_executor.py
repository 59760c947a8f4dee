"""The console's action executor on the embedded twin (``fabricscope serve --actions``).

The console's twin is replayed segment by segment from the list of injected faults
(:mod:`fabricscope.service.console.twin_source`), so an executed action changes that list:

* ``cost-out-link`` takes the traffic off a cable (a routing cost-out: its ECMP siblings
  carry the load). What a fault on that cable shows *through the traffic* stops then: the
  frame errors of a gray link, the queue and marks of a congested or bursting link, the
  slowness of a degraded one. The fault itself is not repaired: the symptoms that do not
  need traffic go on (a degrading optic's readings, a flapping link's carrier transitions, a
  stuck receiver's pause frames), so their incidents stay open until the part is fixed, as
  they would on a real fabric.
* ``shift-lb-weight`` and ``restart-agent`` are not carried out here: a shifted weight leaves
  part of the symptom, which the replay's fault list cannot express, and the twin models no
  host agents (:meth:`ConsoleTwinExecutor.supports` says so; the console reports the refusal).

Every execution is kept in ``done`` with its undo; :meth:`ConsoleTwinExecutor.revert` carries
the undo out (a cost-in).
"""

from __future__ import annotations

from fabricscope.diagnosis.actions import ActionResult
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.service.console.twin_source import TwinSupervisor

__all__ = ["TRAFFIC_BORNE", "ConsoleTwinExecutor"]

NS = 1_000_000_000
# Fault kinds whose every symptom is carried by the link's traffic.
TRAFFIC_BORNE = frozenset({"gray-loss", "congestion", "link-degraded", "micro-burst"})


class ConsoleTwinExecutor:
    """Executes ``cost-out-link`` on the console's twin (module doc)."""

    def __init__(self, supervisor: TwinSupervisor) -> None:
        self.supervisor = supervisor
        self.rmap = ResourceMap(supervisor.fabric)
        self.done: list[ActionResult] = []
        self._ended: dict[str, list[int]] = {}  # cable -> indices of the faults it mitigated

    def supports(self, automation: str) -> bool:
        """Whether ``automation`` can be carried out here (``cost-out-link`` only)."""
        return automation == "cost-out-link"

    def execute(self, automation: str, resource: str) -> ActionResult:
        """Cost out the cable ``resource`` names (a cable, a port or a direction of it)."""
        # a cable, a port or a direction: one cable (a switch would name all of its cables)
        cables = (self.rmap.resources(resource, "cable")
                  if self.rmap.ports_of_subject(resource) else ())
        if not self.supports(automation):
            res = ActionResult(automation, resource, False,
                               f"{automation}: not supported on the console's twin")
        elif not cables:
            res = ActionResult(automation, resource, False, f"{resource}: names no cable, port or direction of one")
        else:
            res = self._cost_out(automation, cables[0])
        self.done.append(res)
        return res

    def _cost_out(self, automation: str, cable: str) -> ActionResult:
        sup = self.supervisor
        now_s = sup.now_ns / NS
        ended: list[str] = []
        kept: list[str] = []
        for i, inj in enumerate(sup.faults()):
            f = inj.fault
            if inj.mitigated or (f.end_ns is not None and f.end_ns <= sup.now_ns):
                continue
            if not self.rmap.ports_of_subject(f.subject) or \
                    cable not in self.rmap.resources(f.subject, "cable"):
                continue
            if f.kind in TRAFFIC_BORNE:
                sup.mitigate(i, f"{automation} {cable} at {now_s:.0f} s")
                self._ended.setdefault(cable, []).append(i)
                ended.append(f.kind)
            else:
                kept.append(f.kind)
        detail = f"{automation}: {cable} carries no traffic from {now_s:.0f} s (twin)"
        if ended:
            detail += f"; the traffic symptoms of {', '.join(ended)} on it end"
        if kept:
            detail += f"; {', '.join(kept)} on it goes on (needs no traffic to show)"
        return ActionResult(automation, cable, True, detail, undo=f"cost in {cable}")

    def revert(self, done: ActionResult) -> ActionResult:
        """Undo an executed cost-out (a cost-in): the cable carries traffic again, and the
        faults on it that were never repaired show their symptoms again from now."""
        if done.automation != "cost-out-link" or not done.ok:
            return ActionResult(done.automation, done.resource, False,
                                f"{done.automation} on {done.resource}: nothing to undo")
        back = self._ended.pop(done.resource, [])
        for i in back:
            self.supervisor.restore(i)
        now_s = self.supervisor.now_ns / NS
        kinds = [self.supervisor.faults()[i].fault.kind for i in back]
        return ActionResult("cost-in-link", done.resource, True,
                            f"cost-in-link: {done.resource} carries traffic again from {now_s:.0f} s "
                            "(twin)" + (f"; {', '.join(kinds)} on it shows again (not repaired)"
                                        if kinds else ""))
