"""Clocks: the only difference between the simulated twin and the live one.

Following simpy's design, the engine never reads the time itself; it is handed a clock.
``SimClock`` advances only when told (tests, benchmarks: fast and deterministic);
``WallClock`` reads the host's monotonic and real-time clocks (the live demo).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything that tells the time in integer nanoseconds."""

    def now_ns(self) -> int: ...


class SimClock:
    """A manually advanced clock starting at ``start_ns``."""

    def __init__(self, start_ns: int = 0) -> None:
        self._t = int(start_ns)

    def now_ns(self) -> int:
        return self._t

    def advance(self, delta_ns: int) -> int:
        """Move forward by ``delta_ns`` (>= 0) and return the new time."""
        if delta_ns < 0:
            raise ValueError(f"SimClock.advance: delta_ns must be >= 0, got {delta_ns}")
        self._t += int(delta_ns)
        return self._t

    def set(self, t_ns: int) -> None:
        """Jump to ``t_ns`` (never backwards)."""
        if t_ns < self._t:
            raise ValueError(f"SimClock.set: time cannot go backwards ({t_ns} < {self._t})")
        self._t = int(t_ns)


class WallClock:
    """Real time: ``time.time_ns()`` (epoch nanoseconds, what gNMI timestamps use)."""

    def now_ns(self) -> int:
        return time.time_ns()
