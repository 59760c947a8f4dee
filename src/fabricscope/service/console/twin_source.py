"""The closed loop on the embedded twin, live: what ``fabricscope serve`` runs with no config.

``supervise`` runs every instrument once over a whole scenario. A console runs forever and
takes faults while it runs, so :class:`TwinSupervisor` runs the same instruments segment by
segment on a simulated clock that follows the wall clock (``speed`` simulated seconds per
second):

* to cover simulated time ``(t0, t0 + segment]`` it runs each instrument on a scenario that
  starts ``warmup`` earlier (``offset = t0 - warmup``), so every detector has its baseline and
  sliding windows filled, and keeps only the findings reported inside the segment, shifted to
  absolute simulated time. Instruments are causal (``service/instruments``), so a finding
  reported at ``t`` depends only on ``[offset, t]``: the warm-up replays what the previous
  segment saw, it does not look ahead;
* faults keep their absolute times (a fault that started before ``offset`` has a negative
  start in the segment's scenario, so a degrading optic keeps its age);
* :meth:`inject` adds a fault at the current simulated time and throws away what was computed
  beyond it, so the next tick recomputes the future with the fault in it;
* findings are released to the :class:`~fabricscope.diagnosis.incidents.Correlator` when the
  simulated clock passes their report time, one tick every ``tick_s``; each new or changed
  incident goes to the :class:`~fabricscope.service.console.state.ConsoleState` (and from
  there to the SSE stream and the alert sinks).

Cost: ``(warmup + segment) / segment`` times the cost of ``supervise`` for the same simulated
time (4x with the defaults), measured in ``benchmarks/bench_console.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator, CorrelatorParams
from fabricscope.diagnosis.knowledge import KnowledgeBase, load_kb
from fabricscope.diagnosis.model import Observed, finding_id
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.background import BackgroundLoop
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.instruments import Instrument, ScenarioSpec
from fabricscope.service.supervise_twin import (
    INSTRUMENTS,
    NS,
    coverage_for,
    default_instruments,
    parse_twin_fault,
)
from fabricscope.sim.faults import Fault

log = logging.getLogger("fabricscope.serve.twin")


@dataclass(frozen=True, slots=True)
class TwinSettings:
    """Pacing of the live twin (simulated seconds)."""

    speed: float = 1.0  # simulated seconds per wall second
    segment_s: float = 15.0
    warmup_s: float = 45.0
    tick_s: float = 5.0
    seed: int = 0

    def check(self) -> None:
        for name in ("speed", "segment_s", "tick_s"):
            v = getattr(self, name)
            if not v > 0:
                raise ConfigError(f"--{name.removesuffix('_s').replace('_', '-')}: must be > 0, "
                                  f"got {v!r}")
        if self.warmup_s < 0:
            raise ConfigError(f"--warmup: must be >= 0, got {self.warmup_s!r}")


@dataclass(frozen=True, slots=True)
class Injected:
    """A fault added while the console runs (absolute simulated times)."""

    text: str
    fault: Fault
    at_wall_s: float
    mitigated: str = ""  # what ended its symptoms early (an executed action), if anything
    end_before_ns: int | None = None  # its end before that action (restored by an undo)


class TwinSupervisor(BackgroundLoop):
    """Runs the closed loop on the twin into ``state`` (see module doc)."""

    thread_name = "twin-supervisor"

    def __init__(self, state: ConsoleState, fabric: Fabric, *,
                 settings: TwinSettings | None = None, kb: KnowledgeBase | None = None,
                 instruments: Sequence[str] = INSTRUMENTS,
                 params: CorrelatorParams | None = None, views: Any = None,
                 wall: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.state = state
        self.fabric = fabric
        self.settings = settings or TwinSettings()
        self.settings.check()
        self.kb = kb or load_kb()
        self.instruments: list[Instrument] = default_instruments(instruments)
        self.views = views
        self._wall = wall
        self._lock = threading.RLock()
        self._faults: list[Injected] = []
        self._pending: list[Observed] = []  # computed, not yet released (reported order)
        self._computed_ns = 0  # findings are known up to here
        self._now_ns = 0  # the simulated clock: released up to here
        self._segment = 0
        rmap = ResourceMap(fabric)
        probe = ScenarioSpec(fabric, [], self.settings.segment_s, self.settings.seed)
        self.corr = Correlator(rmap, self.kb, coverage_for(self.instruments, fabric, spec=probe),
                               params=params)
        self.error: str | None = None
        self.failures = 0
        self._held_views: tuple[int, list[tuple[str, Any]]] | None = None
        state.speed = self.settings.speed
        state.info["instruments"] = [i.name for i in self.instruments]

    # -- faults -----------------------------------------------------------------------------
    def inject(self, text: str, *, source: str = "fault") -> Injected:
        """Add ``KIND:SUBJECT[@START[-END]][,K=V]`` with START/END counted from *now* (the
        current simulated time); recomputes everything after now with the fault in it."""
        with self._lock:
            f = parse_twin_fault(text, self.fabric, source=source)
            now = self._now_ns
            end = None if f.end_ns is None else f.end_ns + now
            f = replace(f, start_ns=f.start_ns + now, end_ns=end)
            inj = Injected(text, f, time.time())
            self._faults.append(inj)
            self._pending = [o for o in self._pending if o.reported_ns <= now]
            self._computed_ns = now
            log.info("fault injected at t=%.0fs: %s", now / NS, text)
            return inj

    def faults(self) -> list[Injected]:
        with self._lock:
            return list(self._faults)

    def mitigate(self, index: int, why: str) -> Injected:
        """End the symptoms of fault ``index`` (of :meth:`faults`) now: an executed action
        took the traffic off what it affects. Everything computed beyond now is recomputed
        without them, as :meth:`inject` does."""
        with self._lock:
            inj = self._faults[index]
            now = self._now_ns
            f = inj.fault
            if f.end_ns is None or f.end_ns > now:
                f = replace(f, end_ns=max(now, f.start_ns))
            done = replace(inj, fault=f, mitigated=why, end_before_ns=inj.fault.end_ns)
            self._faults[index] = done
            self._pending = [o for o in self._pending if o.reported_ns <= now]
            self._computed_ns = min(self._computed_ns, now)
            log.info("fault %s: symptoms end at t=%.0fs (%s)", inj.text, now / NS, why)
            return done

    @property
    def now_ns(self) -> int:
        return self._now_ns

    def restore(self, index: int) -> Injected:
        """Undo :meth:`mitigate`: fault ``index`` shows its symptoms again from now until its
        original end (what follows a cost-in of a link whose fault was never repaired)."""
        with self._lock:
            inj = self._faults[index]
            now = self._now_ns
            end = inj.end_before_ns
            back = replace(inj, fault=replace(inj.fault, end_ns=end), mitigated="", end_before_ns=None)
            self._faults[index] = back
            self._pending = [o for o in self._pending if o.reported_ns <= now]
            self._computed_ns = min(self._computed_ns, now)
            log.info("fault %s: symptoms back at t=%.0fs (action undone)", inj.text, now / NS)
            return back

    # -- the loop ---------------------------------------------------------------------------
    def _compute(self) -> None:
        """Run the instruments for the next segment (see module doc)."""
        st = self.settings
        t0 = self._computed_ns
        t1 = t0 + int(st.segment_s * NS)
        offset = max(0, t0 - int(st.warmup_s * NS))
        faults = []
        for inj in self._faults:
            f = inj.fault
            if f.end_ns is not None and f.end_ns <= offset:
                continue
            faults.append(replace(f, start_ns=f.start_ns - offset,
                                  end_ns=None if f.end_ns is None else f.end_ns - offset))
        spec = ScenarioSpec(self.fabric, faults, (t1 - offset) / NS,
                            st.seed + self._segment)
        if self.views is not None:
            # the views now hold data up to t0: shown once the clock reaches t0 (_release)
            held = _HeldViews(self.state)
            self.views.publish(held)
            self._held_views = (t0, held.views)
        c0 = time.thread_time()
        found: list[Observed] = []
        for ins in self.instruments:
            if self.views is not None:
                ins.observer = self.views.observer(offset, t0)
            for o in ins.run(spec):
                rep = o.reported_ns + offset
                if t0 < rep <= t1:
                    fw = o.finding.window
                    fnd = replace(o.finding, window=(fw[0] + offset, fw[1] + offset))
                    found.append(Observed(o.source, fnd, rep, finding_id(o.source, fnd)))
        found.sort(key=lambda o: (o.reported_ns, o.source, o.id))
        self._pending.extend(found)
        self._computed_ns = t1
        self._segment += 1
        self.state.counters.segments += 1
        self.state.counters.supervisor_cpu_s += time.thread_time() - c0

    def _release(self, now: int) -> list[tuple[str, Any]]:
        """The held views, once the simulated clock has passed the data they hold."""
        if self._held_views is None or now < self._held_views[0]:
            return []
        out = self._held_views[1]
        self._held_views = None
        return out

    def advance_to(self, sim_ns: int) -> None:
        """Run the loop up to simulated time ``sim_ns`` (tick by tick), without pacing."""
        tick = int(self.settings.tick_s * NS)
        while True:
            with self._lock:
                nxt = self._now_ns + tick
                if nxt > sim_ns or (self._stop.is_set() and self._thread is not None):
                    return
                while self._computed_ns < nxt:
                    self._compute()
                k = 0
                while k < len(self._pending) and self._pending[k].reported_ns <= nxt:
                    k += 1
                batch, self._pending = self._pending[:k], self._pending[k:]
                if batch:
                    self.corr.add(batch)
                changed = self.corr.tick(nxt)
                self._now_ns = nxt
                views = self._release(nxt)
            for name, body in views:
                self.state.set_view(name, body)
            if batch:
                self.state.add_findings(batch)
            for inc in changed:
                self.state.upsert_incident(inc)
            self.state.set_time(nxt)

    def _run(self) -> None:
        w0 = self._wall()
        base = self._now_ns
        tick_wall = self.settings.tick_s / self.settings.speed
        while not self._stop.is_set():
            target = base + int((self._wall() - w0) * self.settings.speed * NS)
            try:
                self.advance_to(target)
            except Exception as exc:
                self.failures += 1
                self.error = f"{type(exc).__name__}: {exc}"
                self.state.info["supervisor_error"] = self.error
                self.state.info["supervisor_failures"] = self.failures
                if self.failures == 1 or self.failures % 100 == 0:
                    log.exception("twin supervisor: segment failed (%d so far); retrying",
                                  self.failures)
                self._stop.wait(1.0)
                continue
            self._stop.wait(min(0.25, tick_wall / 2))



class _HeldViews:
    """Collects ``set_view`` calls (for :meth:`TwinSupervisor._release`), reads go to the
    state."""

    def __init__(self, state: ConsoleState) -> None:
        self._state = state
        self.views: list[tuple[str, Any]] = []

    def set_view(self, name: str, value: Any) -> None:
        self.views.append((name, value))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)
