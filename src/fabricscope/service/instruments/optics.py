"""Optics instrument: the twin's transceiver DOM readings of every cabled port into the DOM detector.

Every ``interval_s`` (DOM is polled at minute granularity in practice: ``ethtool -m``, SONiC
TRANSCEIVER_DOM_SENSOR, OpenConfig transceiver leaves) the instrument reads rx / tx power and
pre-FEC BER of every cabled port and lane straight from the twin's arrays (no per-reading
records: 8k ports x 4 lanes per round at 2,048 GPUs) and feeds
:class:`~fabricscope.optics.dom.DomDetector` with the fabric's cable map, so a port whose rx
drop is its peer's fading transmitter is not blamed.

The detector needs a baseline of ``baseline_n`` readings. A production monitor has months of
history before any incident; the twin has none before the scenario's ``t = 0``, so the
instrument polls ``baseline_n`` rounds *before* 0 (faults start at or after 0, so the
baseline is clean). Findings are reported at the round that produced them (never before 0).

The twin's ``optic-degrading`` fault drifts power by ``rate`` dB/day x ``accel``: real aging
(~0.01-1 dB/day) is invisible in a minutes-long scenario, so scenarios pass ``accel``; see
docs/design/diagnosis-instruments-telemetry.md for the values a benchmark should use.
"""

from __future__ import annotations

from fabricscope.diagnosis.model import Observed
from fabricscope.model.errors import ConfigError
from fabricscope.optics.dom import DomDetector, DomThresholds
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.telemetry import twin_faults
from fabricscope.sim.clock import SimClock
from fabricscope.twin.state import Twin, TwinConfig

__all__ = ["OpticsInstrument"]

NS = 1_000_000_000


class OpticsInstrument:
    """DOM of every cabled port of the twin, polled every ``interval_s``, through :class:`DomDetector`.

    ``thresholds`` are the detector's (:class:`~fabricscope.optics.dom.DomThresholds`);
    ``warmup`` polls ``thresholds.baseline_n`` rounds before ``t = 0`` for the baseline.
    Deterministic for a seed (the twin's optics are drawn from ``spec.seed``, like the
    telemetry instrument's twin).
    """

    name = "optics"

    def __init__(self, interval_s: float = 60.0, thresholds: DomThresholds | None = None, *,
                 warmup: bool = True) -> None:
        if not interval_s > 0:
            raise ConfigError(f"optics instrument: interval_s: must be > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.thresholds = thresholds or DomThresholds()
        self.warmup = warmup
        self.stats: dict[str, int] = {}

    def run(self, spec: ScenarioSpec) -> list[Observed]:
        """Every optics finding of the scenario, each reported at its polling round."""
        if not spec.duration_s >= 0:
            raise ConfigError(f"scenario: duration_s: must be >= 0, got {spec.duration_s!r}")
        interval_ns = max(1, round(self.interval_s * NS))
        first = -self.thresholds.baseline_n if self.warmup else 0
        clock = SimClock(first * interval_ns)
        # No traffic load: the twin's optics do not depend on it (and building it costs more
        # than the whole optics run). The watermark period only sets the twin's step.
        twin = Twin(spec.fabric, clock=clock, faults=twin_faults(spec.faults), rng=spec.seed,
                    config=TwinConfig(watermark_period_ns=interval_ns))
        det = DomDetector(self.thresholds, peers=spec.fabric.peer_port, max_lanes=twin.cfg.lanes)
        ports = twin.port_ids
        out: list[Observed] = []
        last = round(spec.duration_s * NS) // interval_ns
        for k in range(first, last + 1):
            t = k * interval_ns
            clock.set(t)
            twin.advance_to(t)
            found = det.observe(t, ports, twin.field("rx_power_dbm"), twin.field("tx_power_dbm"),
                                twin.field("pre_fec_ber"))
            out.extend(Observed("optics", f, max(t, 0)) for f in found)
        self.stats = {"ports": len(ports), "rounds": last - first + 1, "findings": len(out)}
        return out
