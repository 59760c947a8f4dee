"""Telemetry detectors: raw leaf events in, :class:`Finding` out (micro-burst, errors, flaps, pause storms).

Each detector is a small stateful object ``events -> findings`` that reads time only from
the events, so it runs identically on the twin's simulated clock and on live switches.
Detectors work on raw counters (they difference them themselves) so they can sit next to
any processor chain. A finding is emitted once per *episode*: a port that stays bad does
not re-alert every sample; it re-arms after ``quiet_ns`` without evidence.

Thresholds follow operator practice for RoCE fabrics: queue watermark above the ECN
``Kmax`` region (DCQCN, Zhu et al., SIGCOMM'15), ECN marking rates far above the background,
any FCS/CRC increase (gray links, Zhang et al. "007", NSDI'18 treat any drop as evidence),
>= 2 carrier transitions in a window, PFC pause rates that would stall a 400G port.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, TelemetryEvent

__all__ = [
    "DETECTORS",
    "Detector",
    "DetectorSet",
    "ErrorIncreaseDetector",
    "FlapDetector",
    "MicroBurstDetector",
    "PauseStormDetector",
    "build_detector",
    "port_of",
]

Events = Sequence[TelemetryEvent]


class Detector(Protocol):
    def __call__(self, events: Events) -> list[Finding]: ...


def port_of(e: TelemetryEvent) -> str:
    """The inventory port id an event is about (``<target>:<interface>``), else the target."""
    t = e.tags
    ifc = t.get("interface_name") or t.get("interface_interface-id") or t.get("component_name")
    return f"{e.target}:{ifc}" if ifc else e.target


def _leaf(name: str) -> str:
    return name.rsplit("/", 1)[-1]


class _Names:
    """Memoized ``event name -> last path element if wanted else None`` (a dict hit per event)."""

    def __init__(self, wanted: frozenset[str]) -> None:
        self.wanted = wanted
        self._memo: dict[str, str | None] = {}

    def __call__(self, name: str) -> str | None:
        try:
            return self._memo[name]
        except KeyError:
            leaf = _leaf(name)
            hit = leaf if leaf in self.wanted else None
            self._memo[name] = hit
            return hit


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


@dataclass
class _Episode:
    start_ns: int
    last_ns: int
    peak: float
    count: int = 1
    escalated: bool = False


def _series(e: TelemetryEvent, subject: str) -> tuple[object, ...]:
    """One counter series: the target, port and leaf, and every other key of the path (a port
    reports ``ecn-marked-pkts`` per queue and pause frames per priority: each is its own
    counter, and mixing two would read every sample of one as a reset of the other). The keys
    of one leaf come in path order, so their values name the series."""
    t = e.tags
    if len(t) > 1:
        return (e.target, e.name, tuple(t.values()))
    return (e.target, subject, e.name)


class _CounterState:
    """Per-series previous sample, for deltas and rates."""

    def __init__(self) -> None:
        self._last: dict[tuple[object, ...], tuple[int, float]] = {}

    def delta(self, key: tuple[object, ...], ts: int, v: float) -> tuple[float, int] | None:
        prev = self._last.get(key)
        self._last[key] = (ts, v)
        if prev is None or ts <= prev[0]:
            return None
        return (v - prev[1] if v >= prev[1] else v), ts - prev[0]


class _EpisodeDetector:
    """Shared episode bookkeeping: open on evidence, close after ``quiet_ns`` without."""

    kind = ""
    action = ""

    def __init__(self, *, quiet_ns: int = 5_000_000_000) -> None:
        self.quiet_ns = quiet_ns
        self._open: dict[str, _Episode] = {}

    def evidence_at(self, ts_ns: int) -> list[str]:
        """Subjects whose open episode had evidence at ``ts_ns`` (a symptom that persists)."""
        return [s for s, ep in self._open.items() if ep.last_ns == ts_ns]

    def _evidence(self, subject: str, ts: int, value: float, ev: str, details: Mapping[str, float | int | str],
                  score: float) -> Finding | None:
        ep = self._open.get(subject)
        if ep is not None and ts - ep.last_ns <= self.quiet_ns:
            ep.last_ns = ts
            ep.peak = max(ep.peak, value)
            ep.count += 1
            return None
        self._open[subject] = _Episode(ts, ts, value)
        return Finding(self.kind, subject, score, (ts, ts), (ev,), self.action, dict(details))


class MicroBurstDetector(_EpisodeDetector):
    """Queue build-up from buffer watermarks and ECN marking rate.

    Evidence: a watermark sample >= ``watermark_bytes``, or an ECN-mark rate >=
    ``ecn_rate`` marks/s between two samples of the ECN counter. The finding's window starts
    at the first sample that showed it (the burst happened within the preceding sample
    interval). An episode still showing evidence after ``sustain_ns`` escalates once to
    ``queue-buildup`` (a standing queue: congestion rather than a burst).
    """

    kind = "micro-burst"
    action = "check incast / ECMP imbalance on this egress; compare with flow placement"

    def __init__(self, *, watermark_bytes: float = 1e6, ecn_rate: float = 500.0,
                 sustain_ns: int = 3_000_000_000, quiet_ns: int = 2_000_000_000) -> None:
        super().__init__(quiet_ns=quiet_ns)
        self.watermark_bytes = watermark_bytes
        self.ecn_rate = ecn_rate
        self.sustain_ns = sustain_ns
        self._ctr = _CounterState()
        self._names = _Names(frozenset({"watermark-bytes", "ecn-marked-pkts"}))

    def __call__(self, events: Events) -> list[Finding]:
        out: list[Finding] = []
        names = self._names
        for e in events:
            leaf = names(e.name)
            if leaf is None:
                continue
            v = _num(e.value)
            if v is None:
                continue
            subject = port_of(e)
            if leaf == "watermark-bytes":
                if v < self.watermark_bytes:
                    continue
                f = self._evidence(subject, e.ts_ns, v, f"watermark {v:.0f} B >= {self.watermark_bytes:.0f} B",
                                   {"watermark_bytes": v}, min(1.0, 0.5 + 0.5 * v / (4 * self.watermark_bytes)))
            else:
                d = self._ctr.delta(_series(e, subject), e.ts_ns, v)
                if d is None:
                    continue
                rate = d[0] * 1e9 / d[1]
                if rate < self.ecn_rate:
                    continue
                f = self._evidence(subject, e.ts_ns, rate, f"ECN marks {rate:.0f}/s >= {self.ecn_rate:.0f}/s",
                                   {"ecn_marks_per_s": rate, "ecn_marks": d[0]},
                                   min(1.0, 0.5 + 0.5 * rate / (10 * self.ecn_rate)))
            if f is not None:
                out.append(f)
            else:
                ep = self._open[subject]
                if not ep.escalated and ep.last_ns - ep.start_ns >= self.sustain_ns:
                    ep.escalated = True
                    out.append(Finding("queue-buildup", subject, 0.9, (ep.start_ns, ep.last_ns),
                                       (f"queue evidence for {(ep.last_ns - ep.start_ns) / 1e9:.1f} s",),
                                       "standing queue: look for a congested or degraded link downstream",
                                       {"peak": ep.peak, "samples": ep.count}))
        return out


class _CounterDetector(_EpisodeDetector):
    """Shared loop for detectors that judge the delta of monotonic counters.

    Keeps events whose leaf is in ``COUNTERS`` and whose value is numeric, differences them
    per ``(target, port, name)`` series and hands each delta to :meth:`_judge`, which returns
    the finding (via :meth:`_evidence`) or None.
    """

    COUNTERS: frozenset[str] = frozenset()

    def __init__(self, *, quiet_ns: int) -> None:
        super().__init__(quiet_ns=quiet_ns)
        self._ctr = _CounterState()
        self._names = _Names(self.COUNTERS)
        #: Set for a suppress-redundant subscription (gNMI specification 3.5.1.5.2) sampled
        #: every ``max_dt_ns``: an unchanged counter is not sent, so its previous update can
        #: be long before a change, but the change happened within the last sample interval.
        #: The increase is judged over at most that interval (over the whole silence, a
        #: pause storm that began in the last interval read 4x too low). None: every sample
        #: is sent, and the time between updates is the interval.
        self.max_dt_ns: int | None = None

    def _judge(self, leaf: str, subject: str, ts: int, delta: float, dt: int) -> Finding | None:
        """Judge one counter increase ``delta`` over ``dt`` ns ending at ``ts``."""
        raise NotImplementedError

    def __call__(self, events: Events) -> list[Finding]:
        out: list[Finding] = []
        names = self._names
        for e in events:
            leaf = names(e.name)
            if leaf is None:
                continue
            v = _num(e.value)
            if v is None:
                continue
            subject = port_of(e)
            d = self._ctr.delta(_series(e, subject), e.ts_ns, v)
            if d is None:
                continue
            dt = d[1] if self.max_dt_ns is None else min(d[1], self.max_dt_ns)
            f = self._judge(leaf, subject, e.ts_ns, d[0], dt)
            if f is not None:
                out.append(f)
        return out


class ErrorIncreaseDetector(_CounterDetector):
    """Any increase of error / discard counters (FCS, CRC, in/out errors and discards)."""

    kind = "error-counter-increase"
    action = "gray link suspect: check optics (rx power, pre-FEC BER), reseat or replace the cable"
    COUNTERS = frozenset({"in-errors", "in-fcs-errors", "in-crc-errors", "out-errors", "in-discards",
                          "out-discards", "dropped-pkts"})

    def __init__(self, *, min_increase: float = 1.0, quiet_ns: int = 30_000_000_000) -> None:
        super().__init__(quiet_ns=quiet_ns)
        self.min_increase = min_increase

    def _judge(self, leaf: str, subject: str, ts: int, delta: float, dt: int) -> Finding | None:
        if delta < self.min_increase:
            return None
        return self._evidence(subject, ts, delta, f"{leaf} +{delta:.0f} in {dt / 1e9:.2f} s",
                              {"counter": leaf, "increase": delta}, min(1.0, 0.6 + 0.1 * delta / self.min_increase))


_DOWN = frozenset({"DOWN", "LOWER_LAYER_DOWN", "NOT_PRESENT", "DORMANT", "down", "2"})


class FlapDetector(_EpisodeDetector):
    """Oper-status flaps: >= ``min_transitions`` changes within ``window_ns`` (from the
    oper-status leaf or the carrier-transitions counter); and every transition of the
    oper-status leaf to a down state as a ``link-down`` finding (once per down episode: a link
    that goes down and stays down makes one transition, never a flap)."""

    kind = "link-flap"
    action = "flapping link: check the optic and cable, consider draining the link"

    def __init__(self, *, min_transitions: int = 2, window_ns: int = 10_000_000_000,
                 quiet_ns: int = 30_000_000_000) -> None:
        super().__init__(quiet_ns=quiet_ns)
        self.min_transitions = min_transitions
        self.window_ns = window_ns
        self._state: dict[str, str] = {}
        self._changes: dict[str, list[int]] = {}
        self._ctr = _CounterState()
        self._names = _Names(frozenset({"oper-status", "carrier-transitions"}))

    def down_ports(self) -> list[str]:
        """Ports whose last oper-status was a down state."""
        return [s for s, v in self._state.items() if v in _DOWN]

    def __call__(self, events: Events) -> list[Finding]:
        out: list[Finding] = []
        names = self._names
        for e in events:
            leaf = names(e.name)
            if leaf is None:
                continue
            subject = port_of(e)
            n_new = 0
            if leaf == "oper-status":
                prev = self._state.get(subject)
                self._state[subject] = str(e.value)
                if prev is not None and prev != str(e.value):
                    n_new = 1
                    if str(e.value) in _DOWN and prev not in _DOWN:
                        out.append(Finding("link-down", subject, 0.9, (e.ts_ns, e.ts_ns),
                                           (f"oper-status {prev} -> {e.value}",),
                                           "link down: check the optic / cable; confirm traffic "
                                           "rerouted", {"from": prev, "to": str(e.value)}))
            elif leaf == "carrier-transitions":
                v = _num(e.value)
                d = self._ctr.delta(_series(e, subject), e.ts_ns, v) if v is not None else None
                if d is not None:
                    n_new = int(d[0])
            else:
                continue
            if n_new <= 0:
                continue
            # oper-status and carrier-transitions see the same flaps: count each source
            # apart and take the larger, never the sum
            ch = self._changes.setdefault(f"{leaf}|{subject}", [])
            ch.extend([e.ts_ns] * n_new)
            ch[:] = [t for t in ch if e.ts_ns - t <= self.window_ns]
            other = self._changes.get(f"{'carrier-transitions' if leaf == 'oper-status' else 'oper-status'}|{subject}", [])
            if len(other) > len(ch):
                ch = [t for t in other if e.ts_ns - t <= self.window_ns]
            if len(ch) >= self.min_transitions:
                f = self._evidence(subject, e.ts_ns, len(ch),
                                   f"{len(ch)} oper-status transitions in {self.window_ns / 1e9:.0f} s",
                                   {"transitions": len(ch)}, min(1.0, 0.5 + 0.1 * len(ch)))
                if f is not None:
                    out.append(Finding(f.kind, f.subject, f.score, (ch[0], e.ts_ns), f.evidence, f.action, f.details))
        return out


class PauseStormDetector(_CounterDetector):
    """PFC pause frames at a rate >= ``rate`` frames/s on a port (sent or received), or a port
    whose egress was held by received pauses for >= ``paused_fraction`` of the interval.

    The second rule reads the pause duration a switch counts per priority (SAI's
    ``PFC_n_RX_PAUSE_DURATION_US``; ``in-pause-duration-us`` here): a receiver that holds XOFF
    refreshes it only about every half of the longest pause (65,535 quanta of 512 bit times:
    ~6,000 frames/s at 100 Gb/s), so a storm at a low speed can stay under a frame-rate
    threshold while its port is paused nearly all the time. It is the condition the PFC
    watchdog acts on (a queue paused without draining)."""

    kind = "pause-storm"
    action = "PFC storm: find the port sending pauses (stuck NIC / receiver), enable the PFC watchdog"
    COUNTERS = frozenset({"in-mac-pause-frames", "out-mac-pause-frames", "in-pause-frames", "out-pause-frames",
                          "in-pause-duration-us"})

    def __init__(self, *, rate: float = 10_000.0, paused_fraction: float = 0.5,
                 quiet_ns: int = 10_000_000_000) -> None:
        super().__init__(quiet_ns=quiet_ns)
        if not 0.0 < paused_fraction <= 1.0:
            raise ConfigError(f"detectors.pause-storm: paused-fraction: must be in (0, 1], got {paused_fraction!r}")
        self.rate = rate
        self.paused_fraction = paused_fraction

    def _judge(self, leaf: str, subject: str, ts: int, delta: float, dt: int) -> Finding | None:
        if leaf == "in-pause-duration-us":
            frac = delta * 1e3 / dt
            if frac < self.paused_fraction:
                return None
            return self._evidence(subject, ts, frac, f"{subject} paused {100 * min(frac, 1.0):.0f} % of the time "
                                  "by the pauses it receives", {"paused_fraction": round(min(frac, 1.0), 4),
                                                               "direction": "receives"},
                                  min(1.0, 0.6 + 0.4 * min(frac, 1.0)))
        r = delta * 1e9 / dt
        if r < self.rate:
            return None
        direction = "sends" if leaf.startswith("out") else "receives"
        return self._evidence(subject, ts, r, f"{subject} {direction} {r:.0f} pause frames/s",
                              {"pause_per_s": r, "direction": direction}, min(1.0, 0.6 + 0.4 * r / (10 * self.rate)))


class DetectorSet:
    """Several detectors over the same events."""

    def __init__(self, detectors: Sequence[Detector]) -> None:
        self.detectors = list(detectors)
        # Built-in detectors look only at a few leaves (``_names.wanted``) and skip the rest.
        # One pass keeps the events any of them wants, so each detector scans ~1/3 of a
        # full-tree subscription instead of all of it. A detector without ``_names`` (a
        # user's own) still sees every event.
        wanted: set[str] = set()
        for d in self.detectors:
            names = getattr(d, "_names", None)
            if not isinstance(names, _Names):
                self._wanted: _Names | None = None
                break
            wanted |= names.wanted
        else:
            self._wanted = _Names(frozenset(wanted))

    def suppressed_sampling(self, sample_ns: int) -> None:
        """Tell the counter detectors the subscription suppresses unchanged samples, sampled
        every ``sample_ns`` (see ``_CounterDetector.max_dt_ns``)."""
        for d in self.detectors:
            if isinstance(d, _CounterDetector):
                d.max_dt_ns = int(sample_ns)

    def __call__(self, events: Events) -> list[Finding]:
        out: list[Finding] = []
        if not self.detectors:
            return out
        if self._wanted is not None:
            memo = self._wanted._memo
            want = self._wanted
            events = [e for e in events if (memo[e.name] if e.name in memo else want(e.name)) is not None]
        for d in self.detectors:
            out += d(events)
        return out


DETECTORS: dict[str, Callable[..., Detector]] = {
    "micro-burst": MicroBurstDetector,
    "error-increase": ErrorIncreaseDetector,
    "link-flap": FlapDetector,
    "pause-storm": PauseStormDetector,
}


def build_detector(name: str, options: Mapping[str, Any], *, source: str = "detectors") -> Detector:
    cls = DETECTORS.get(name)
    if cls is None:
        raise ConfigError(f"{source}: unknown detector {name!r}; choose from {sorted(DETECTORS)}")
    for k, v in options.items():
        # every detector option is a positive threshold or duration (ns): check it now, so a
        # typo fails at config load, not as a TypeError in the writer mid-run
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ConfigError(f"{source}.{name}.{k}: expected a positive number, got {v!r}")
    try:
        return cls(**{k.replace("-", "_"): v for k, v in options.items()})
    except TypeError as exc:
        raise ConfigError(f"{source}.{name}: bad options {dict(options)!r}: {exc}") from exc


def default_detectors() -> DetectorSet:
    return DetectorSet([cls() for cls in DETECTORS.values()])
