"""The suspicion channel: early, sub-alarm observations answered by active checks.

An instrument that computes a per-window statistic publishes a *suspicion* where the
statistic crosses a lower, early threshold but not (yet) its alarm threshold: the mesh
prober's localizer blames a link in one window, before the hysteresis tracker's
``open_after`` windows have confirmed it; a transceiver lane's own light is on the optics
detector's *watch* grade (half the drop threshold, or one bad reading of the ``k`` in a row
the episode rule needs). A suspicion is an :class:`~fabricscope.diagnosis.model.Observed`
of kind :data:`SUSPICION` whose ``details["anticipates"]`` names the finding kind the
instrument would report once the alarm's evidence is complete.

A suspicion is never evidence: it never joins an incident, never enters the finding index
and never becomes a root cause. The :class:`SuspicionGate` turns it into the coordinator's
existing active checks (:mod:`fabricscope.diagnosis.checks`, with their modelled costs) on
the suspect resource, and only what a check *measures* (a present symptom, the same finding
kind and subject the passive detector reports) enters the diagnosis, like any other check
result. Unconfirmed, a suspicion is re-checked every ``recheck_ns`` while the instrument
keeps reporting it (a watch list polled faster than the periodic instrument), within the
rate bounds.

Rate bounds, so a noisy fabric cannot flood the checks: at most ``per_resource`` check
rounds per resource and at most ``max_rounds`` over the whole fabric per ``window_ns``;
a round runs the check kinds that decide a primary symptom of the anticipated fault types
(at most ``max_kinds``, in parallel).

The method is the "alarm -> measurement" loop of model-based diagnosis (de Kleer & Williams,
"Diagnosing multiple faults", Artificial Intelligence 32, 1987, section 5: measure where the
candidates differ) triggered earlier, by a sub-threshold statistic, as in the two-level
(warning / alarm) thresholds of statistical process control (Montgomery, *Introduction to
Statistical Quality Control*, the Western Electric rules' warning limits).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fabricscope.diagnosis.checks import (
    CHECK_KINDS,
    CHECKABLE,
    CheckOutcome,
    CheckRequest,
    kinds_for,
)
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.knowledge import KnowledgeBase
from fabricscope.diagnosis.model import Observed
from fabricscope.model.records import Finding

NS = 1_000_000_000

#: The finding kind of a suspicion (no knowledge-base symptom has it).
SUSPICION = "suspicion"
#: ``CheckRequest.for_[1]`` of a check the gate started (what it was for).
FOR_SUSPICION = "suspicion"


def is_suspicion(o: Observed) -> bool:
    """Whether ``o`` is a suspicion (not an alarm)."""
    return o.finding.kind == SUSPICION


def suspicion(source: str, anticipates: str, subject: str, t_ns: int, window: tuple[int, int], *,
              statistic: str, value: float, early: float, alarm: float,
              evidence: str, score: float = 0.2) -> Observed:
    """A suspicion of ``source`` reported at ``t_ns``: ``statistic`` on ``subject`` reached
    ``value`` (>= the early threshold ``early``, below the alarm's ``alarm`` or before its
    evidence is complete); ``anticipates`` the finding kind the alarm would be."""
    f = Finding(SUSPICION, subject, float(score), (int(window[0]), int(window[1])),
                (evidence,), "", {"anticipates": anticipates, "statistic": statistic,
                                  "value": float(value), "early": float(early),
                                  "alarm": float(alarm)})
    return Observed(source, f, int(t_ns))


@dataclass(frozen=True, slots=True)
class SuspicionParams:
    """The gate's rate bounds and re-check cadence (documented in docs/diagnosis.md)."""

    window_ns: int = 60 * NS
    per_resource: int = 4
    max_rounds: int = 32
    recheck_ns: int = 10 * NS
    hold_ns: int = 60 * NS
    max_kinds: int = 2


@dataclass
class _Suspect:
    resource: str
    kinds: tuple[str, ...]
    first_ns: int
    last_seen_ns: int
    reason: str
    wanted: frozenset[tuple[str, str]] = frozenset()
    last_check_ns: int | None = None
    in_flight: int = 0
    confirmed: bool = False
    settled: str = ""  # why no more rounds: "explained" | "undecidable" (or confirmed)
    rounds: deque[int] = field(default_factory=deque)


class SuspicionGate:
    """Suspicions in, rate-bounded active checks out (see the module docstring).

    Driven by the correlator: :meth:`offer` each suspicion as it is reported, :meth:`due`
    at every tick (the checks to start now), :meth:`outcome` with what a check it started
    found (:meth:`owns` tells its checks apart). ``stats`` counts suspicions received, those
    no check can decide (``uncheckable``), rounds refused by a rate bound (``limited``),
    rounds and checks started, suspects confirmed (a symptom present), suspects whose
    resource an open incident already names (``explained``: not checked again) and suspects
    whose check decided none of the anticipated symptoms there (``undecidable``: a cable
    with a host end decides only link-down; not checked again).

    ``explained(resource)``: whether an open incident's root cause already names the
    resource (the correlator passes one); None: never.
    """

    def __init__(self, kb: KnowledgeBase, rmap: ResourceMap,
                 params: SuspicionParams | None = None,
                 explained: Callable[[str], bool] | None = None) -> None:
        self.kb = kb
        self.rmap = rmap
        self.params = params or SuspicionParams()
        self.explained = explained
        self._suspects: dict[str, _Suspect] = {}
        self._rounds: deque[int] = deque()
        self._mine: dict[CheckRequest, str] = {}
        self.stats: dict[str, int] = {"suspicions": 0, "uncheckable": 0, "limited": 0,
                                      "rounds": 0, "checks": 0, "confirmed": 0,
                                      "explained": 0, "undecidable": 0}

    def wanted(self, o: Observed) -> frozenset[tuple[str, str]]:
        """The (signal, finding) primary ``at: self`` symptoms of the fault types whose
        primary symptom suspicion ``o`` anticipates: what a confirming check must decide."""
        want = str(o.finding.details.get("anticipates", ""))
        return frozenset(s.key for ft, _ in self.kb.branches(o.source, want)
                         for s in ft.symptoms if s.at == "self" and s.primary)

    def targets(self, o: Observed) -> dict[str, tuple[str, ...]]:
        """The check kinds per suspect resource for suspicion ``o``: for each fault type
        whose primary symptom is the anticipated finding (its resource kind checkable), the
        kinds that decide one of its primary ``at: self`` symptoms (any of its kinds when
        none does), at most ``max_kinds`` per resource."""
        want = str(o.finding.details.get("anticipates", ""))
        out: dict[str, list[str]] = {}
        for ft, _sym in self.kb.branches(o.source, want):
            if ft.resource not in CHECKABLE:
                continue
            prim = {s.key for s in ft.symptoms if s.at == "self" and s.primary}
            kinds = kinds_for(ft)
            sharp = [k for k in kinds if any((CHECK_KINDS[k].signal, f) in prim
                                             for f in CHECK_KINDS[k].decides)]
            for r in self.rmap.resources(o.subject, ft.resource):
                lst = out.setdefault(r, [])
                for k in sharp or list(kinds):
                    if k not in lst and len(lst) < self.params.max_kinds:
                        lst.append(k)
                break  # the most direct resource only
        return {r: tuple(ks) for r, ks in out.items() if ks}

    def offer(self, o: Observed) -> None:
        """Take suspicion ``o`` (reported at ``o.reported_ns``)."""
        self.stats["suspicions"] += 1
        tg = self.targets(o)
        if not tg:
            self.stats["uncheckable"] += 1
            return
        for r, kinds in tg.items():
            s = self._suspects.get(r)
            if s is None or (s.confirmed and o.reported_ns - s.last_seen_ns > self.params.hold_ns):
                s = self._suspects[r] = _Suspect(r, kinds, o.reported_ns, o.reported_ns,
                                                 f"{o.source}: {o.finding.details.get('statistic', '')}"
                                                 f" on {o.subject}", self.wanted(o))
            else:
                s.last_seen_ns = max(s.last_seen_ns, o.reported_ns)
                s.kinds = tuple(dict.fromkeys((*s.kinds, *kinds)))[: self.params.max_kinds]

    def due(self, now_ns: int) -> list[CheckRequest]:
        """The check rounds to start at ``now_ns`` (first checks and re-checks of suspects
        not yet confirmed, within the rate bounds)."""
        p = self.params
        while self._rounds and now_ns - self._rounds[0] >= p.window_ns:
            self._rounds.popleft()
        out: list[CheckRequest] = []
        for r in sorted(self._suspects):
            s = self._suspects[r]
            if s.confirmed or s.settled or s.in_flight or now_ns - s.last_seen_ns > p.hold_ns:
                continue
            if self.explained is not None and self.explained(r):
                s.settled = "explained"
                self.stats["explained"] += 1
                continue
            if s.last_check_ns is not None and now_ns - s.last_check_ns < p.recheck_ns:
                continue
            while s.rounds and now_ns - s.rounds[0] >= p.window_ns:
                s.rounds.popleft()
            if len(s.rounds) >= p.per_resource or len(self._rounds) >= p.max_rounds:
                if s.last_check_ns != now_ns:
                    self.stats["limited"] += 1
                s.last_check_ns = now_ns  # try again after recheck_ns, not at every tick
                continue
            s.rounds.append(now_ns)
            self._rounds.append(now_ns)
            s.last_check_ns = now_ns
            self.stats["rounds"] += 1
            for k in s.kinds:
                req = CheckRequest(k, r, now_ns, (r, FOR_SUSPICION))
                self._mine[req] = r
                s.in_flight += 1
                out.append(req)
        self.stats["checks"] += len(out)
        return out

    def owns(self, req: CheckRequest) -> bool:
        """Whether the gate started ``req``."""
        return req in self._mine

    def outcome(self, out: CheckOutcome) -> bool:
        """Take the outcome of a check the gate started; True when it confirmed the suspect
        (a symptom present on the resource it read)."""
        r = self._mine.pop(out.request, None)
        if r is None:
            return False
        s = self._suspects.get(r)
        if s is None:
            return False
        s.in_flight = max(0, s.in_flight - 1)
        if out.present and not s.confirmed:
            s.confirmed = True
            self.stats["confirmed"] += 1
        elif not out.present and not set(out.decided) & s.wanted:
            # this check cannot decide what the suspicion anticipates here: drop the kind
            s.kinds = tuple(k for k in s.kinds if k != out.request.kind)
            if not s.kinds and not s.settled:
                s.settled = "undecidable"
                self.stats["undecidable"] += 1
        return bool(out.present)

    def suspects(self) -> Mapping[str, tuple[int, int, bool]]:
        """Resource -> (first reported, rounds in the current window, confirmed)."""
        return {r: (s.first_ns, len(s.rounds), s.confirmed) for r, s in self._suspects.items()}
