"""Active checks: what a specialist asks a source to measure now, what it costs, what it decides.

A *check* is a concrete action against a source (issue 15): here a gNMI Get of one resource's
switch ports (counters twice, a second apart, for rates; the negotiated speed), an on-demand
transceiver (DOM) read, a burst of targeted probes toward a suspect host or NIC, or the
straggler analysis run now on the trace store (a query on the stores). Each
:class:`CheckKind` decides a fixed set of knowledge-base symptoms on the resource it reads: the symptom is *present* (the check returns a finding, the same kind
and subject the passive detector would report) or *absent* (decided: its absence is evidence
now, without waiting for the passive instrument's polling interval,
:class:`~fabricscope.diagnosis.specialists.Coverage`).

Every check has a modelled latency on the simulated clock (:data:`CHECK_KINDS`, justified in
docs/design/diagnosis.md, "Active checks"); the coordinator runs the checks of competing
hypotheses concurrently, the knowledge-tree baseline one after another, at the same costs.
Executing a check is the service layer's job (:class:`CheckRunner`; the twin backend is
``fabricscope.service.instruments.checks``); this module is pure.

The method is the classical one of model-based diagnosis: choose the measurement that
separates the surviving candidates (de Kleer & Williams, "Diagnosing multiple faults",
Artificial Intelligence 32, 1987, section 5), here every separating measurement at once
because each is cheap and they run in parallel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from fabricscope.diagnosis.knowledge import FaultType
from fabricscope.diagnosis.model import Observed

NS = 1_000_000_000
MS = 1_000_000

#: One gNMI Get of a handful of leaves of one port: one in-datacenter management RTT (< 1 ms)
#: plus the switch agent's processing (tens of ms on SONiC / EOS gNMI servers); 50 ms.
GNMI_GET_NS = 50 * MS
#: A rate needs two readings; switch ASIC port counters are refreshed about once a second
#: (SONiC's FLEX_COUNTER port-stat poll interval defaults to 1,000 ms), so the second Get is
#: one second after the first.
COUNTER_GAP_NS = 1 * NS
#: An on-demand transceiver read: the module's EEPROM pages over I2C (ethtool -m on a QSFP /
#: OSFP module takes a few hundred ms; the periodic DOM poll is every 60 s); 500 ms.
DOM_READ_NS = 500 * MS
#: A burst of targeted probes toward a suspect host or NIC: its mesh peers send a few probes each
#: over 500 ms (a few hundred probes, well under the prober's rate limits), and a probe's
#: outcome is known when its reply arrives or the prober's reply timeout (1 s) has passed.
PROBE_BURST_NS = 500 * MS
PROBE_TIMEOUT_NS = 1 * NS
#: The straggler analysis on demand: a query of the trace store's last 32 iterations and one
#: run of the analysis (~0.1 s CPU for a 128-GPU job, measured), rounded up for the read.
TRACE_WINDOW_NS = 500 * MS


@dataclass(frozen=True, slots=True)
class CheckKind:
    """A kind of check: the signal it reads, the symptoms it decides, its latency."""

    name: str
    signal: str
    decides: frozenset[str]
    latency_ns: int
    how: str
    resources: frozenset[str] = frozenset({"cable", "port"})
    #: Resource kinds on which the check decides presence only: a finding is evidence, a
    #: clean result is not (it never excludes a symptom there).
    presence_only: frozenset[str] = frozenset()


CHECK_KINDS: Mapping[str, CheckKind] = {
    "port-counters": CheckKind(
        "port-counters", "telemetry",
        frozenset({"error-counter-increase", "discard-increase", "pause-storm", "queue-buildup",
                   "link-down"}),
        COUNTER_GAP_NS + 2 * GNMI_GET_NS,
        "fabricscope gnmi get ADDR -t SWITCH /interfaces/interface[name=PORT]/state "
        "(twice, 1 s apart: FCS / error / discard / pause rates, oper-status, queue depth)"),
    "port-speed": CheckKind(
        "port-speed", "telemetry", frozenset({"speed-degraded"}), GNMI_GET_NS,
        "fabricscope gnmi get ADDR -t SWITCH "
        "/interfaces/interface[name=PORT]/ethernet/state/negotiated-port-speed"),
    "dom": CheckKind(
        "dom", "optics", frozenset({"optic-degrading", "optic-rx-low"}), DOM_READ_NS,
        "ethtool -m IF (or the OpenConfig transceiver leaves): rx / tx power per lane"),
    "probe-burst": CheckKind(
        "probe-burst", "probe", frozenset({"cpu-starved", "nic-fault", "gray-link",
                                           "switch-fault"}),
        PROBE_BURST_NS + PROBE_TIMEOUT_NS,
        "a 500 ms burst of probes from the suspect's mesh peers (their probe agents): toward "
        "a host's NICs (responder times far above the baseline = CPU starvation), to and "
        "from a NIC and its leaf-mates (loss on the NIC's paths only = the NIC), or along "
        "paths through a cable or switch and through its neighbours (loss on the suspect's "
        "paths only = the suspect)",
        frozenset({"host", "nic", "cable", "switch"}), frozenset({"cable", "switch"})),
    "trace-window": CheckKind(
        "trace-window", "straggler", frozenset({"slow-gpu", "slow-nic"}), TRACE_WINDOW_NS,
        "fabricscope straggler analyze TRACES (the job's last 32 completed iterations, now "
        "rather than at the next scheduled analysis)",
        frozenset({"gpu", "nic"})),
}

#: Resource kinds some check can read (the ports of a cable or a port, a host's or NIC's
#: probes, a GPU's traces).
CHECKABLE: frozenset[str] = frozenset().union(*(c.resources for c in CHECK_KINDS.values()))


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """Run check ``kind`` on ``resource`` from ``requested_ns``; ``for_`` the hypothesis
    (resource, fault type) that asked for it."""

    kind: str
    resource: str
    requested_ns: int
    for_: tuple[str, str] = ("", "")

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.resource)


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """What a check found: the findings it produced (present symptoms, in the diagnosis'
    terms) and the (signal, finding) pairs it decided on ``decided_on`` (the resource and the
    ports it read); ``detail`` what was read, for the incident."""

    request: CheckRequest
    done_ns: int
    present: tuple[Observed, ...]
    decided: tuple[tuple[str, str], ...]
    decided_on: tuple[str, ...]
    detail: str = ""

    def result_for(self, ft: FaultType, *, exclude: tuple[str, str] | None = None) -> str:
        """``supports`` when a present finding is an ``at: self`` symptom of ``ft`` (other
        than ``exclude``), ``excludes`` when the check decided every such symptom it could and
        none is present, ``inconclusive`` otherwise."""
        wanted = {s.key for s in ft.symptoms if s.at == "self"} - ({exclude} if exclude else set())
        got = {(o.source, o.kind) for o in self.present}
        if wanted & got:
            return "supports"
        if wanted & set(self.decided):
            return "excludes"
        return "inconclusive"


class CheckRunner(Protocol):
    """Executes checks on the simulated (or wall) clock.

    The caller guarantees that calls come in non-decreasing time order over all requests
    (``start`` at ``requested_ns``, ``finish`` at the ``done_ns`` that ``start`` returned),
    so a backend that advances a time-stepped model never goes back.
    """

    def start(self, request: CheckRequest) -> int:
        """Begin ``request`` (first readings); return when it completes (ns)."""
        ...

    def finish(self, request: CheckRequest) -> CheckOutcome:
        """Complete ``request`` at its completion time; return what it found."""
        ...


def kinds_for(ft: FaultType, *, presence_only: bool = True) -> tuple[str, ...]:
    """The check kinds that decide an ``at: self`` symptom of ``ft`` (:data:`CHECK_KINDS`
    order) and read ``ft``'s resource kind; ``presence_only=False`` leaves out the kinds
    that decide only presence on that resource kind (:attr:`CheckKind.presence_only`)."""
    if ft.resource not in CHECKABLE:
        return ()
    keys = {s.key for s in ft.symptoms if s.at == "self"}
    return tuple(k for k, c in CHECK_KINDS.items()
                 if ft.resource in c.resources and any((c.signal, f) in keys for f in c.decides)
                 and (presence_only or ft.resource not in c.presence_only))


def undecided(ft: FaultType, kind: str, known: Iterable[tuple[str, str]]) -> bool:
    """Whether check ``kind`` would decide an ``at: self`` symptom of ``ft`` that ``known``
    (the (signal, finding) pairs already present or checked on the resource) does not."""
    c = CHECK_KINDS[kind]
    have = set(known)
    return any(s.at == "self" and s.signal == c.signal and s.finding in c.decides
               and s.key not in have for s in ft.symptoms)
