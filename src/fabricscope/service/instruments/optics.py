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

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from fabricscope.diagnosis.model import Observed
from fabricscope.diagnosis.suspicions import suspicion
from fabricscope.model.errors import ConfigError
from fabricscope.optics.dom import DomDetector, DomThresholds
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.telemetry import twin_faults
from fabricscope.sim.clock import SimClock
from fabricscope.twin.state import Twin, TwinConfig

__all__ = ["GRADES", "OpticsInstrument", "dom_grades", "own_light_drop"]

NS = 1_000_000_000
I8 = npt.NDArray[np.int8]

#: Grades of a port's optic, best first (codes are the indices): ``good``; ``watch``: a lane
#: is bad now (own light >= half the drop threshold below baseline, pre-FEC BER over the
#: detector's fraction of the FEC limit, or rx below the low warning) but no episode is open;
#: ``degrading``: an ``optic-degrading`` episode is open; ``failing``: an ``optic-rx-low``
#: episode is open, or some lane's pre-FEC BER is at the FEC correction limit itself.
GRADES: tuple[str, ...] = ("good", "watch", "degrading", "failing")


def own_light_drop(det: DomDetector, ports: Sequence[str]) -> npt.NDArray[np.float64]:
    """Each port's worst lane's own light drop below its baseline (dB): the tx drop, or the
    rx drop its far end's transmitter does not explain (the detector's rule, read from its
    state without changing it; 0 where unknown)."""
    rows = det._rows(ports)
    cur, base, peer = det._cur[rows], det._base[rows], det._peer[rows]
    with np.errstate(invalid="ignore"):
        peer_tx_drop = np.where(peer[:, None] >= 0, det._base[peer, 1] - det._cur[peer, 1], 0.0)
        explained = np.clip(np.nan_to_num(peer_tx_drop, nan=0.0), 0.0, None)
        own = np.fmax(base[:, 1] - cur[:, 1], base[:, 0] - cur[:, 0] - explained)
    out: npt.NDArray[np.float64] = np.nan_to_num(own, nan=0.0).max(axis=1)
    return out


def dom_grades(det: DomDetector, ports: Sequence[str]) -> I8:
    """The :data:`GRADES` code of each of ``ports`` from the detector's state after a round.

    Reads the detector's per-port arrays (baseline, latest reading, peer, open episodes,
    bad-reading runs) without changing them, and applies its own rules (module doc of
    :mod:`fabricscope.optics.dom`): ``degrading`` / ``failing`` exactly while it holds an
    episode open; ``watch`` when a lane has a bad reading the episode rule has not yet
    confirmed (``k`` in a row), or the port's own light (tx drop, or rx drop not explained
    by the far end's transmitter) is at least half the drop threshold below baseline.
    """
    rows = det._rows(ports)
    th = det.th
    cur = det._cur[rows]  # (n, 3, lanes): latest rx, tx, ber
    base = det._base[rows]  # (n, 2, lanes): baseline rx, tx
    peer = det._peer[rows]
    with np.errstate(invalid="ignore"):
        peer_tx_drop = np.where(peer[:, None] >= 0, det._base[peer, 1] - det._cur[peer, 1], 0.0)
        explained = np.clip(np.nan_to_num(peer_tx_drop, nan=0.0), 0.0, None)
        own = np.fmax(base[:, 1] - cur[:, 1], base[:, 0] - cur[:, 0] - explained)
        watch = (np.nan_to_num(own, nan=0.0) >= th.drop_db / 2).any(axis=1)
        failing = det._open[1, rows] | (np.nan_to_num(cur[:, 2]) >= th.ber_limit).any(axis=1)
    watch |= (det._run[:, rows] > 0).any(axis=(0, 2))
    g = np.where(det._open[0, rows], 2, np.where(watch, 1, 0))
    return np.where(failing, 3, g).astype(np.int8)


class OpticsInstrument:
    """DOM of every cabled port of the twin, polled every ``interval_s``, through :class:`DomDetector`.

    ``thresholds`` are the detector's (:class:`~fabricscope.optics.dom.DomThresholds`);
    ``warmup`` polls ``thresholds.baseline_n`` rounds before ``t = 0`` for the baseline.
    Deterministic for a seed (the twin's optics are drawn from ``spec.seed``, like the
    telemetry instrument's twin).

    ``observer`` (optional, also settable as the attribute) gets ``("optics", payload)`` at
    every round from ``t = 0`` on::

        {"t_ns": t, "ports": port ids, "rx_dbm": F64[n, lanes], "tx_dbm": F64[n, lanes],
         "temp_c": F64[n] (module temperature: mean over lanes), "grade": I8[n]}

    ``grade`` codes index :data:`GRADES` (:func:`dom_grades`). None (the default) costs
    nothing.

    ``suspicions`` (default off): also publish a suspicion
    (:mod:`fabricscope.diagnosis.suspicions`) at a round for every port without an open
    episode whose own light is at least ``suspect_db`` below baseline (default a sixth of
    the drop threshold, 0.25 dB: twice the worst healthy drift of the twin's modules over an
    hour at 2,048 GPUs, 0.12 dB) or that is on the *watch* grade (a bad reading the
    ``k``-in-a-row rule has not confirmed yet), anticipating ``optic-degrading``.
    """

    name = "optics"

    def __init__(self, interval_s: float = 60.0, thresholds: DomThresholds | None = None, *,
                 warmup: bool = True, suspicions: bool = False, suspect_db: float | None = None,
                 observer: Callable[[str, object], None] | None = None) -> None:
        if not interval_s > 0:
            raise ConfigError(f"optics instrument: interval_s: must be > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.thresholds = thresholds or DomThresholds()
        self.warmup = warmup
        self.suspicions = suspicions
        self.suspect_db = float(suspect_db) if suspect_db is not None else self.thresholds.drop_db / 6
        if not self.suspect_db > 0:
            raise ConfigError(f"optics instrument: suspect_db: must be > 0, got {suspect_db!r}")
        self.observer = observer
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
            if self.suspicions and t >= 0:
                out.extend(self._suspicions(det, ports, t))
            if self.observer is not None and t >= 0:
                self.observer("optics", {
                    "t_ns": t, "ports": ports, "rx_dbm": twin.field("rx_power_dbm").copy(),
                    "tx_dbm": twin.field("tx_power_dbm").copy(),
                    "temp_c": twin.field("temperature_c").mean(axis=1),
                    "grade": dom_grades(det, ports)})
        self.stats = {"ports": len(ports), "rounds": last - first + 1, "findings": len(out)}
        return out

    def _suspicions(self, det: DomDetector, ports: Sequence[str], t: int) -> list[Observed]:
        """Suspicions of the ports suspect after the round at ``t`` (class doc)."""
        grade = dom_grades(det, ports)
        drop = own_light_drop(det, ports)
        rows = np.flatnonzero((grade == 1) | ((grade == 0) & (drop >= self.suspect_db)))
        th = self.thresholds
        return [suspicion("optics", "optic-degrading", ports[i], t, (t, t),
                          statistic="own light drop", value=float(drop[i]), early=self.suspect_db,
                          alarm=th.drop_db,
                          evidence=f"own light {float(drop[i]):.2f} dB below baseline (suspect: >= "
                          f"{self.suspect_db:.2f} dB, or one bad reading of the {th.k} in a row "
                          f"the detector needs)")
                for i in rows.tolist()]
