"""The twin backend of :class:`~fabricscope.diagnosis.actions.Executor`: allowed actions on a
:class:`~fabricscope.twin.state.Twin`.

``cost-out-link`` drains the cable from the twin's routing (:meth:`Twin.drain` 1.0: the link
carries no traffic, so a gray link's FCS errors and a congested link's queue stop);
``shift-lb-weight`` moves half of its load away (:meth:`Twin.drain` 0.5). The twin models no
host agents, so ``restart-agent`` is not supported here (:meth:`TwinExecutor.supports` says
so and the console reports it). Every execution is kept in ``self.done`` with its undo.
"""

from __future__ import annotations

from fabricscope.diagnosis.actions import ActionResult
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.twin.state import Twin

__all__ = ["TwinExecutor"]

_FRACTION = {"cost-out-link": 1.0, "shift-lb-weight": 0.5}


class TwinExecutor:
    """Executes ``cost-out-link`` and ``shift-lb-weight`` on ``twin``."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.rmap = ResourceMap(twin.fabric)
        self.done: list[ActionResult] = []

    def supports(self, automation: str) -> bool:
        return automation in _FRACTION

    def execute(self, automation: str, resource: str) -> ActionResult:
        """Drain the cable ``resource`` names (a cable, a port or a direction of it)."""
        frac = _FRACTION.get(automation)
        cables = self.rmap.resources(resource, "cable")
        if frac is None or not cables:
            why = (f"{automation}: not supported by the twin executor" if frac is None
                   else f"{resource}: names no cable")
            res = ActionResult(automation, resource, False, why)
        else:
            cable = cables[0]
            edges = self.twin.drain(cable, frac)
            res = ActionResult(automation, cable, bool(edges),
                               f"{automation}: {frac:.0%} of the load on {cable} routed to its "
                               f"ECMP siblings at {self.twin.now_ns / 1e9:.1f} s (twin)",
                               undo=f"cost in {cable} (drain 0)")
        self.done.append(res)
        return res
