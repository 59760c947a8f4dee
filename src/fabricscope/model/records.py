"""Small frozen records that cross layer boundaries (ARCHITECTURE.md, "Records").

Protobuf, socket or DataFrame objects never travel inward: edges convert to these.
Times are integer nanoseconds (``*_ns``) on the clock of the world that produced them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


class FiveTuple(NamedTuple):
    """An IP flow identity; the ECMP hash input. Protocol 17 = UDP (RoCEv2 uses dport 4791)."""

    src_ip: str
    dst_ip: str
    src_port: int
    dst_port: int
    proto: int = 17


@dataclass(frozen=True, slots=True)
class TelemetryEvent:
    """One leaf update from gNMI (or the twin), flattened once at the edge.

    ``name`` is the schema path without keys (``/interfaces/interface/state/counters/in-octets``),
    ``tags`` hold the keys and the target (``{"interface_name": "eth1"}``).
    """

    name: str
    ts_ns: int
    target: str
    tags: Mapping[str, str]
    value: float | int | str | bool


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """One probe and its answer; ``t_recv_ns`` is None when the probe (or its reply) was lost.

    Responder timestamps (``t_resp_rx_ns``/``t_resp_tx_ns``) let analysis separate the
    responder's processing delay from network RTT:
    ``rtt_net = (t_recv - t_send) - (t_resp_tx - t_resp_rx)``.
    """

    src: str
    dst: str
    flow: FiveTuple
    seq: int
    t_send_ns: int
    t_resp_rx_ns: int | None
    t_resp_tx_ns: int | None
    t_recv_ns: int | None

    @property
    def lost(self) -> bool:
        return self.t_recv_ns is None

    @property
    def network_rtt_ns(self) -> int | None:
        """Round trip minus the responder's processing time, or None when lost."""
        if self.t_recv_ns is None:
            return None
        rtt = self.t_recv_ns - self.t_send_ns
        if self.t_resp_rx_ns is not None and self.t_resp_tx_ns is not None:
            rtt -= self.t_resp_tx_ns - self.t_resp_rx_ns
        return rtt


@dataclass(frozen=True, slots=True)
class OpTiming:
    """One communication or compute operator on one rank in one iteration."""

    job: str
    rank: int
    iteration: int
    op: str
    group: tuple[int, ...]
    seq: int
    t_start_ns: int
    t_end_ns: int
    bytes: int = 0

    @property
    def duration_ns(self) -> int:
        return self.t_end_ns - self.t_start_ns


@dataclass(frozen=True, slots=True)
class DomReading:
    """Digital optical monitoring for one lane of one transceiver port."""

    port: str
    lane: int
    ts_ns: int
    temperature_c: float
    vcc_v: float
    tx_bias_ma: float
    tx_power_dbm: float
    rx_power_dbm: float
    pre_fec_ber: float


@dataclass(frozen=True, slots=True)
class Finding:
    """The one output of every detector and localizer.

    kind:     what is wrong (``gray-link``, ``slow-rank``, ``micro-burst``, ``hash-polarization``...)
    subject:  where: an inventory id (device, port, directed link ``a:eth1->b:eth2``, rank)
    score:    how sure, in [0, 1] (a probability where the method gives one)
    window:   (start_ns, end_ns) the evidence covers
    evidence: why: short references (probe flows, iterations, counters) and numbers
    action:   what an operator should do
    """

    kind: str
    subject: str
    score: float
    window: tuple[int, int]
    evidence: tuple[str, ...] = ()
    action: str = ""
    details: Mapping[str, float | int | str] = field(default_factory=dict)
