"""Instruments of the closed loop on the twin: each turns a scenario into timed findings.

An instrument is run over a whole scenario on the simulated clock and returns every finding
it would have reported, each as an :class:`~fabricscope.diagnosis.model.Observed` whose
``reported_ns`` is the simulated time it was reported. Instruments are causal: a finding
reported at ``t`` uses only data observed before ``t`` (they analyse growing windows or
stream), so replaying the findings in ``reported_ns`` order is what a continuously running
supervisor would have seen. Times are nanoseconds from the scenario start (``t = 0``).

The instruments read the twin only as a data source (counters, probes, traces, DOM); the
detectors, localizers and analyses they run are the production ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fabricscope.diagnosis.model import Observed
from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.faults import Fault
from fabricscope.twin.transport_replay import TransportEpisode


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    """What every instrument gets: the fabric, the faults (times from 0), the length, a seed,
    and transport engine runs the twin plays into its counters (``--transport``)."""

    fabric: Fabric
    faults: Sequence[Fault]
    duration_s: float
    seed: int = 0
    transport: Sequence[TransportEpisode] = ()


class Instrument(Protocol):
    """Runs on one scenario; returns the findings it reported, in reported order."""

    name: str
    #: Called with (kind, payload) for what the instrument saw (the console's views,
    #: service/console/views.py); None: nothing extra is computed.
    observer: Callable[[str, object], None] | None

    def run(self, spec: ScenarioSpec) -> list[Observed]: ...
