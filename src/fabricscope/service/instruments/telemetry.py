"""Telemetry instrument: the twin's switch counters, as the gNMI collector receives them, into the detectors.

One scenario runs on a twin on a simulated clock (counters, queues and oper-status under the
scenario's faults). Every ``interval_s`` the instrument reads the leaves of the demo's gNMI
subscription (:mod:`fabricscope.service.demo_telemetry`: SAMPLE for interface / Ethernet
counters and queue 3, ON_CHANGE for oper-status) and turns them into exactly the
:class:`~fabricscope.model.records.TelemetryEvent` the collector would produce: the leaf
paths are the twin's own (:meth:`Twin.leaves`), the names and tags come from
:func:`~fabricscope.telemetry.paths.schema_name` / :func:`~fabricscope.telemetry.paths.tags_of`
(what the collector's flattener uses), the target is the switch. No socket is opened.

Only the leaves the detectors read are subscribed (octets and packets change every sample and
no default detector reads them), and the subscription uses gNMI ``suppress_redundant``
(gNMI specification section 3.5.1.5.2): a leaf is sent when its value changed since it was
last sent, or when it has been silent for ``heartbeat_intervals`` samples (the heartbeat
bounds the silent period). That is what makes a 2,048-GPU twin cheap: at rest only the
watermark gauges change. See docs/design/diagnosis-instruments-telemetry.md.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from fabricscope.diagnosis.model import Observed, finding_id
from fabricscope.diagnosis.suspicions import suspicion
from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.telemetry.detectors import (
    DetectorSet,
    FlapDetector,
    MicroBurstDetector,
    default_detectors,
    port_of,
)
from fabricscope.telemetry.paths import GPath, match, parse_path, schema_name, tags_of
from fabricscope.twin.state import Twin, TwinConfig, background_load
from fabricscope.twin.transport_replay import TransportEpisode

__all__ = [
    "DETECTOR_LEAVES",
    "ON_CHANGE_PATHS",
    "SAMPLE_PATHS",
    "TWIN_FAULT_KINDS",
    "TelemetryInstrument",
    "detector_leaves",
    "link_rates",
    "twin_faults",
]

NS = 1_000_000_000

# Fault kinds the twin's device state models (twin/state.py); the others (slow GPU, CPU-starved
# host, link delay, ...) belong to other instruments and are left out of this twin.
TWIN_FAULT_KINDS: frozenset[str] = frozenset({
    "link-degraded", "gray-loss", "congestion", "link-flap", "link-down", "micro-burst",
    "pfc-storm", "optic-degrading",
})

# The demo's subscription (service/demo_telemetry.py).
SAMPLE_PATHS: tuple[str, ...] = (
    "/interfaces/interface[name=*]/state/counters",
    "/interfaces/interface[name=*]/ethernet/state/counters",
    "/fabricscope/qos/interfaces/interface[interface-id=*]/queues/queue[name=3]/state",
    # how long received pauses held each port (pause-storm below the frame-rate rule)
    "/fabricscope/interfaces/interface[name=*]/pfc/priority[id=3]/state/in-pause-duration-us",
)
ON_CHANGE_PATHS: tuple[str, ...] = ("/interfaces/interface[name=*]/state/oper-status",)

# Leaves of that subscription the default detectors read (telemetry/detectors.py): FCS / CRC /
# error / discard counters (error-counter-increase), carrier-transitions and oper-status
# (link-flap), MAC pause frames and pause duration (pause-storm), queue-3 watermark and ECN
# marks (micro-burst).
DETECTOR_LEAVES: tuple[str, ...] = (
    "in-errors", "in-discards", "in-fcs-errors", "out-errors", "out-discards",
    "carrier-transitions", "in-mac-pause-frames", "out-mac-pause-frames", "in-crc-errors",
    "watermark-bytes", "ecn-marked-pkts", "oper-status", "in-pause-duration-us",
)

_INT, _FLOAT, _STATUS = 0, 1, 2
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def twin_faults(faults: Iterable[Fault]) -> FaultSchedule:
    """The faults the twin models (:data:`TWIN_FAULT_KINDS`), as a schedule; others are dropped."""
    return FaultSchedule.of(f for f in faults if f.kind in TWIN_FAULT_KINDS)


def detector_leaves(detectors: DetectorSet) -> frozenset[str] | None:
    """Last path elements ``detectors`` read, or None when one of them reads everything.

    The built-in detectors declare the leaves they look at (the same declaration
    :class:`DetectorSet` filters on); a user's detector without one sees every leaf.
    """
    wanted: set[str] = set()
    for d in detectors.detectors:
        names = getattr(d, "_names", None)
        leaves = getattr(names, "wanted", None)
        if not isinstance(leaves, frozenset):
            return None
        wanted |= leaves
    return frozenset(wanted)


@dataclass(frozen=True, slots=True)
class _Plan:
    """The subscribed leaves of a fabric's twin, as arrays: what to read and how to name it."""

    groups: tuple[tuple[str, I64, I64, I64], ...]  # (field, plan rows, state index, lane)
    kinds: I64  # _INT / _FLOAT / _STATUS per plan row
    on_change: npt.NDArray[np.bool_]
    targets: tuple[str, ...]
    names: tuple[str, ...]
    tags: tuple[Mapping[str, str], ...]

    @property
    def size(self) -> int:
        return len(self.names)

    def read(self, twin: Twin) -> F64:
        """The values the target would serve now (counters truncated to ints, status 1/0)."""
        out = np.empty(self.size)
        for fld, rows, idx, lane in self.groups:
            arr = twin.field(fld)
            out[rows] = arr[idx, lane] if arr.ndim == 2 else np.trunc(arr[idx])
        return out

    def events(self, rows: I64, values: F64, ts_ns: int) -> list[TelemetryEvent]:
        """The events of the leaves ``rows`` (served ``values``) sampled at ``ts_ns``."""
        vals: list[int | float | str] = values[rows].astype(np.int64).tolist()
        kinds = self.kinds[rows]
        for j in np.flatnonzero(kinds != _INT).tolist():  # few: status, optics readings
            v = float(values[rows[j]])
            vals[j] = v if kinds[j] == _FLOAT else ("UP" if v > 0 else "DOWN")
        rs = rows.tolist()
        if len(rs) < 2:  # itemgetter of one index returns the item, not a 1-tuple
            return [TelemetryEvent(self.names[r], ts_ns, self.targets[r], self.tags[r], v)
                    for r, v in zip(rs, vals, strict=True)]
        pick = itemgetter(*rs)  # C-level gathers: this is most of the instrument's own cost
        return list(map(TelemetryEvent, pick(self.names), repeat(ts_ns, len(rs)),
                        pick(self.targets), pick(self.tags), vals))


# Plans depend only on the fabric, the twin's lanes / queues and the leaf set: a benchmark
# running many scenarios on one fabric builds it once. Keyed by the fabric's identity (a
# Fabric holds dicts and is not hashable); the weak reference tells a recycled id apart.
_PLANS: dict[tuple[int, int, tuple[str, ...], frozenset[str] | None],
             tuple[weakref.ref[Fabric], _Plan]] = {}
_PLANS_MAX = 8
# Likewise the fabric's routing (its next-hop cache makes every later background_load cheap).
_ROUTINGS: dict[int, tuple[weakref.ref[Fabric], Routing]] = {}


def _routing_for(fab: Fabric) -> Routing:
    hit = _ROUTINGS.get(id(fab))
    if hit is not None and hit[0]() is fab:
        return hit[1]
    r = Routing(fab)
    if len(_ROUTINGS) >= _PLANS_MAX:
        _ROUTINGS.pop(next(iter(_ROUTINGS)))
    _ROUTINGS[id(fab)] = (weakref.ref(fab), r)
    return r


def _plan_for(twin: Twin, wanted: frozenset[str] | None) -> _Plan:
    fab = twin.fabric
    key = (id(fab), twin.cfg.lanes, twin.cfg.queues, wanted)
    hit = _PLANS.get(key)
    if hit is not None and hit[0]() is fab:
        return hit[1]
    plan = _build_plan(twin, wanted)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = (weakref.ref(fab), plan)
    return plan


def _build_plan(twin: Twin, wanted: frozenset[str] | None) -> _Plan:
    sample = [parse_path(p) for p in SAMPLE_PATHS]
    on_change = [parse_path(p) for p in ON_CHANGE_PATHS]
    # A leaf path does not name its switch, so every switch with the same port names shares
    # one parse: ~800 parses instead of ~75k at 2,048 GPUs.
    memo: dict[str, tuple[bool, str, dict[str, str]] | None] = {}

    def classify(path: str) -> tuple[bool, str, dict[str, str]] | None:
        if wanted is not None and path.rsplit("/", 1)[-1] not in wanted:
            return None
        gp: GPath = parse_path(path)
        if any(match(p, gp) for p in on_change):
            return True, schema_name(gp), tags_of(gp)
        if any(match(p, gp) for p in sample):
            return False, schema_name(gp), tags_of(gp)
        return None

    by_field: dict[str, tuple[list[int], list[int], list[int]]] = {}
    kinds: list[int] = []
    onc: list[bool] = []
    targets: list[str] = []
    names: list[str] = []
    tags: list[Mapping[str, str]] = []
    ndims: dict[str, int] = {}
    for target in twin.targets():
        for lf in twin.leaves(target):
            if lf.path in memo:
                c = memo[lf.path]
            else:
                c = memo[lf.path] = classify(lf.path)
            if c is None:
                continue
            row = len(names)
            rows, idx, lanes = by_field.setdefault(lf.field, ([], [], []))
            rows.append(row)
            idx.append(lf.index)
            lanes.append(lf.lane)
            ndim = ndims.get(lf.field)
            if ndim is None:
                ndim = ndims[lf.field] = twin.field(lf.field).ndim
            kinds.append(_STATUS if lf.field == "oper_up" else _FLOAT if ndim == 2 else _INT)
            onc.append(c[0])
            targets.append(target)
            names.append(c[1])
            tags.append(c[2])
    groups = tuple((f, np.array(r, dtype=np.int64), np.array(i, dtype=np.int64),
                    np.array(la, dtype=np.int64)) for f, (r, i, la) in by_field.items())
    return _Plan(groups, np.array(kinds, dtype=np.int64), np.array(onc, dtype=bool),
                 tuple(targets), tuple(names), tuple(tags))

# Directed-link counters the link payload reads (twin/state.py EDGE_COUNTERS).
_RATE_FIELDS: tuple[str, ...] = ("out_octets", "out_pkts", "in_errors", "out_discards",
                                 "out_pause")


def link_rates(fabric: Fabric, before: Mapping[str, F64], after: Mapping[str, F64],
               oper_up: F64, t0_ns: int, t1_ns: int) -> dict[str, object]:
    """Per-cable rates over ``[t0, t1)`` from two readings of the directed-link counters.

    Returns the ``("links", payload)`` the telemetry instrument's observer gets::

        {"t_ns": t1, "dt_ns": t1 - t0, "utilization": F64[n], "loss": F64[n],
         "pfc": F64[n], "up": bool[n]}

    indexed like ``fabric.links`` (cable ``i`` is directed links ``2i`` and ``2i + 1`` of
    ``fabric.index``), each cable the worse of its two directions: utilization = carried
    bytes / capacity; loss = (receiver in-errors + sender out-discards) / packets sent
    (0 when nothing was sent); pfc = pause frames per second sent by either end; up = both
    directions oper-up. Counters are those the switch serves (IF-MIB / OpenConfig
    ``interfaces`` counters), so the same arithmetic runs on live counters.
    """
    dt = (t1_ns - t0_ns) / NS
    d = {f: after[f] - before[f] for f in _RATE_FIELDS}
    cap = fabric.index.capacity_bps / 8.0 * dt
    util = np.divide(d["out_octets"], cap, out=np.zeros_like(cap), where=cap > 0)
    pkts = d["out_pkts"]
    lost = d["in_errors"] + d["out_discards"]
    loss = np.divide(lost, pkts, out=np.zeros_like(pkts), where=pkts > 0)
    pfc = d["out_pause"] / dt if dt > 0 else np.zeros_like(pkts)
    return {"t_ns": int(t1_ns), "dt_ns": int(t1_ns - t0_ns),
            "utilization": util.reshape(-1, 2).max(axis=1),
            "loss": np.clip(loss, 0.0, 1.0).reshape(-1, 2).max(axis=1),
            "pfc": pfc.reshape(-1, 2).max(axis=1),
            "up": oper_up.reshape(-1, 2).min(axis=1) > 0}


class _LinkCounters:
    """The last reading of the directed-link counters, for :func:`link_rates` per sample."""

    def __init__(self, twin: Twin) -> None:
        self.fabric = twin.fabric
        self.last: dict[str, F64] | None = None
        self.t_ns = 0

    def sample(self, twin: Twin, t_ns: int) -> dict[str, object] | None:
        cur = {f: twin.field(f).copy() for f in _RATE_FIELDS}
        prev, t0 = self.last, self.t_ns
        self.last, self.t_ns = cur, t_ns
        if prev is None or t_ns <= t0:
            return None
        return link_rates(self.fabric, prev, cur, twin.field("oper_up"), t0, t_ns)


class _EarlyQueue:
    """A first-sample queue rise below the micro-burst detector's thresholds: a queue-3
    watermark >= ``1 / 16`` of its ``watermark_bytes`` or an ECN-mark rate >= ``1 / 100`` of
    its ``ecn_rate`` over the last sample interval (a healthy queue at the twin's background
    load marks nothing and peaks at a few kB), published as a suspicion that anticipates
    ``micro-burst``."""

    def __init__(self, det: MicroBurstDetector, interval_ns: int) -> None:
        self.wm_alarm, self.ecn_alarm = float(det.watermark_bytes), float(det.ecn_rate)
        self.wm_early, self.ecn_early = self.wm_alarm / 16, self.ecn_alarm / 100
        self.interval_ns = interval_ns
        self._ecn: dict[tuple[str, str], float] = {}

    def __call__(self, events: Sequence[TelemetryEvent], t: int,
                 alarmed: frozenset[str] = frozenset()) -> list[Observed]:
        """Suspicions of this sample's events (none on a port in ``alarmed``: the ports a
        detector reported at this sample)."""
        out: list[Observed] = []
        for e in events:
            leaf = e.name.rsplit("/", 1)[-1]
            if leaf not in ("watermark-bytes", "ecn-marked-pkts") or isinstance(e.value, str):
                continue
            v = float(e.value)
            port = port_of(e)
            if leaf == "ecn-marked-pkts":
                key = (e.target, port)
                prev = self._ecn.get(key)
                self._ecn[key] = v
                if prev is None or v <= prev:
                    continue
                value, early, alarm = (v - prev) * NS / self.interval_ns, self.ecn_early, self.ecn_alarm
                stat = "ECN marks/s"
            else:
                value, early, alarm, stat = v, self.wm_early, self.wm_alarm, "watermark bytes"
            if early <= value < alarm and port not in alarmed:
                out.append(suspicion("telemetry", "micro-burst", port, t, (t - self.interval_ns, t),
                                     statistic=stat, value=value, early=early, alarm=alarm,
                                     evidence=f"{stat} {value:.0f} on {port}: >= {early:.0f}, "
                                     f"below the detector's {alarm:.0f}"))
        return out


class TelemetryInstrument:
    """Switch telemetry of the twin through the production detectors, on the simulated clock.

    Parameters
    ----------
    interval_s:
        SAMPLE interval; the twin is advanced and read every interval (also the watermark
        period: each sample's watermark is the peak of the interval just ended, like a
        switch's periodic watermark cleared at every telemetry interval).
    utilization:
        Background load, a random permutation traffic matrix seeded by the scenario's seed
        (:func:`~fabricscope.twin.state.background_load`).
    heartbeat_intervals:
        Longest silence of a suppressed leaf, in samples (0: no heartbeat).
    detectors:
        Factory of the detector set (one fresh set per run); default
        :func:`~fabricscope.telemetry.detectors.default_detectors`. When every detector of
        the set declares its leaves, only those are subscribed; otherwise every leaf of the
        demo's subscription is.
    on_events:
        Called with every sample's events, in time order (a store or sink of the raw stream).
    observer:
        Optional ``observer(kind, payload)`` (also settable as the attribute): what the
        instrument saw, for the console's views (:mod:`fabricscope.service.console.views`).
        Per sample, ``("telemetry", list[TelemetryEvent])`` (the events the detectors got)
        and, from the second sample on, ``("links", payload)`` with the per-cable rates of
        the interval just ended (see :func:`link_rates`). None (the default) costs nothing.

    Oper-status (ON_CHANGE) is checked at every sample: the twin's state is defined at its
    steps, so a flap faster than the interval shows in ``carrier-transitions``, not in
    oper-status. Deterministic for a seed.

    ``suspicions`` (default off): also publish suspicions
    (:mod:`fabricscope.diagnosis.suspicions`) for a queue that rose below the micro-burst
    detector's thresholds at a sample (:class:`_EarlyQueue`).
    """

    name = "telemetry"

    def __init__(self, interval_s: float = 10.0, utilization: float = 0.3,
                 heartbeat_intervals: int = 6,
                 detectors: Callable[[], DetectorSet] | None = None, *,
                 on_events: Callable[[Sequence[TelemetryEvent]], None] | None = None,
                 refresh_s: float = 30.0, suspicions: bool = False,
                 observer: Callable[[str, object], None] | None = None) -> None:
        if not interval_s > 0:
            raise ConfigError(f"telemetry instrument: interval_s: must be > 0, got {interval_s!r}")
        if not 0 <= utilization <= 1:
            raise ConfigError(f"telemetry instrument: utilization: must be in [0, 1], got {utilization!r}")
        if isinstance(heartbeat_intervals, bool) or not isinstance(heartbeat_intervals, int) \
                or heartbeat_intervals < 0:
            raise ConfigError("telemetry instrument: heartbeat_intervals: must be an integer >= 0, "
                              f"got {heartbeat_intervals!r}")
        self.interval_s = float(interval_s)
        self.utilization = float(utilization)
        self.heartbeat_intervals = heartbeat_intervals
        self.detectors = detectors or self._default_detectors
        self.on_events = on_events
        self.refresh_s = float(refresh_s)
        self.suspicions = suspicions
        self.observer = observer
        self.stats: dict[str, int] = {}

    def _default_detectors(self) -> DetectorSet:
        """The default detectors, with the micro-burst episode's quiet time set to 1.5 sample
        intervals: at a 10 s SAMPLE a standing queue shows at every sample, and a quiet time
        shorter than the interval would report it as a new burst each time instead of
        escalating it to a queue build-up."""
        quiet = int(1.5 * self.interval_s * NS)
        return DetectorSet([MicroBurstDetector(quiet_ns=max(quiet, 2 * NS)) if isinstance(d, MicroBurstDetector)
                            else d for d in default_detectors().detectors])

    def _refreshes(self, detectors: DetectorSet, first: Mapping[tuple[str, str], Finding],
                   refreshed: dict[tuple[str, str], int], t: int) -> list[Observed]:
        """Findings whose symptom persists at ``t`` (an episode with evidence in this sample,
        a port still down), re-reported under their first id every ``refresh_s`` so the
        correlator can tell a persisting symptom from one that cleared."""
        persisting: list[tuple[str, str]] = []
        for d in detectors.detectors:
            if isinstance(d, FlapDetector):
                persisting += [("link-down", p) for p in d.down_ports()]
            evidence_at = getattr(d, "evidence_at", None)  # the episode detectors
            if evidence_at is not None:
                kind = str(getattr(d, "kind", ""))
                kinds = (kind, "queue-buildup") if isinstance(d, MicroBurstDetector) else (kind,)
                persisting += [(k, s) for s in evidence_at(t) for k in kinds]
        out: list[Observed] = []
        step = round(self.refresh_s * NS)
        for key in persisting:
            f0 = first.get(key)
            if f0 is None or t - refreshed.get(key, f0.window[0]) < step or t <= f0.window[0]:
                continue
            refreshed[key] = t
            out.append(Observed("telemetry", replace(f0, window=(f0.window[0], t)), t,
                                id=finding_id("telemetry", f0)))
        return out

    def twin(self, fabric: Fabric, faults: Sequence[Fault], seed: int,
             clock: SimClock | None = None, transport: Sequence[TransportEpisode] = ()) -> Twin:
        """The twin a run uses (what :func:`fabricscope.service.gnmi_twin.twin_for` builds,
        on a simulated clock at 0 with the watermark period set to the interval), with the
        ``transport`` runs played into its counters."""
        interval_ns = max(1, round(self.interval_s * NS))
        tw = Twin(fabric, clock=clock or SimClock(0), faults=twin_faults(faults),
                  load_bps=background_load(fabric, utilization=self.utilization, seed=seed,
                                           routing=_routing_for(fabric)),
                  rng=seed, config=TwinConfig(watermark_period_ns=interval_ns))
        for ep in transport:
            tw.add_transport(ep)
        return tw

    def run(self, spec: ScenarioSpec) -> list[Observed]:
        """Every finding of the scenario, each reported at the sample that produced it."""
        if not spec.duration_s >= 0:
            raise ConfigError(f"scenario: duration_s: must be >= 0, got {spec.duration_s!r}")
        interval_ns = max(1, round(self.interval_s * NS))
        clock = SimClock(0)
        twin = self.twin(spec.fabric, spec.faults, spec.seed, clock, spec.transport)
        detectors = self.detectors()
        detectors.suppressed_sampling(interval_ns)  # the subscription is suppress-redundant
        plan = _plan_for(twin, detector_leaves(detectors))
        last = np.zeros(plan.size)
        last_k = np.zeros(plan.size, dtype=np.int64)
        hb = self.heartbeat_intervals
        out: list[Observed] = []
        first: dict[tuple[str, str], Finding] = {}
        refreshed: dict[tuple[str, str], int] = {}
        sent = 0
        n_samples = round(spec.duration_s * NS) // interval_ns
        observer = self.observer
        counters = _LinkCounters(twin) if observer is not None else None
        mb = next((d for d in detectors.detectors if isinstance(d, MicroBurstDetector)), None)
        early = _EarlyQueue(mb, interval_ns) if self.suspicions and mb is not None else None
        for k in range(n_samples + 1):
            t = k * interval_ns
            clock.set(t)
            twin.advance_to(t)
            served = plan.read(twin)
            if k == 0:  # the initial full update before sync_response
                send = np.ones(plan.size, dtype=bool)
            else:
                send = served != last
                if hb:
                    send |= (k - last_k) >= hb
            rows = np.flatnonzero(send)
            last[rows] = served[rows]
            last_k[rows] = k
            sent += len(rows)
            events = plan.events(rows, served, t)
            if self.on_events is not None:
                self.on_events(events)
            if observer is not None and counters is not None:
                observer("telemetry", events)
                rates = counters.sample(twin, t)
                if rates is not None:
                    observer("links", rates)
            new = detectors(events)
            out.extend(Observed("telemetry", f, t) for f in new)
            if early is not None:  # the first sample seeds the ECN counters
                out.extend(early(events, t, frozenset(f.subject for f in new)))
            for f in new:
                first.setdefault((f.kind, f.subject), f)
            out.extend(self._refreshes(detectors, first, refreshed, t))
        self.stats = {"leaves": plan.size, "samples": n_samples + 1, "events": sent,
                      "findings": len(out)}
        return out
