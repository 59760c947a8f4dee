"""Transport runs played into the twin: its counters follow the engine, not a scripted fault.

A :class:`TransportEpisode` is one run of the fluid transport engine
(:func:`fabricscope.sim.transport.simulate_transport`) placed on the twin's clock: it starts at
``start_ns`` and, for a job that repeats the same communication every iteration (an all-reduce
per step, an incast per inference batch), again every ``every_ns`` until ``until_ns``. Each
occurrence adds what the engine counted on every directed link to the twin's counters, on the
device and port a switch would report them:

============================  =====================================================================
engine (``TransportStats``)   twin counter, where it is read
============================  =====================================================================
served_bytes                  out/in octets and packets of the link (on top of the background load)
marked_packets                ``ecn-marked-pkts`` of the link's egress queue
drop_bytes - trimmed_bytes    ``out-discards`` / queue ``dropped-pkts`` of the link's egress (MTUs)
trimmed_bytes                 ``trimmed-pkts`` of the link's egress queue (MTUs)
pause_frames                  sent by the link's receiver upstream: ``out-mac-pause-frames`` of the
                              far port, ``in-mac-pause-frames`` (and the PFC priority's) of the
                              near port, whose egress they paused
paused_ns                     ``in-pause-duration-us`` of the paused (near) port: how long the pauses
                              it received held its egress (SAI's ``PFC_n_RX_PAUSE_DURATION_US``)
llr_retried_frames            ``llr/retried-frames`` of the link's sender port (UEC link-level retry)
max_queue_bytes               the queue watermark; ``depth`` follows the engine's queue trace
                              while a twin sample falls inside an occurrence (traced links only)
============================  =====================================================================

With the flows' routes (``paths``, as :func:`fabricscope.service.twin_transport.parse_transport`
records them), the switch where each flow leaves the fabric also acts as its INT sink: it
serves the INT-MD header and metadata stack (:mod:`fabricscope.model.int_md`, INT spec v2.1)
of the flow's worst packet in the latest occurrence, the one whose path held the most queue,
as ``/fabricscope/int/flows/flow[id=E.F]/state/int-md`` (hex). The metadata semantics the
spec leaves to each device are :data:`SEMANTICS`.

The engine's links are matched to the twin's by id, so a run on another fabric is refused. A
pause storm or an incast seen this way carries the physics' own signature (which ports pause,
how much is marked and dropped), which the telemetry detectors and the diagnosis then read as
they read a switch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.model import int_md
from fabricscope.model.errors import ConfigError
from fabricscope.sim.transport.results import TransportResult

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class TransportEpisode:
    """One transport run on the twin's clock (see the module docstring).

    ``result``: the engine's run on the twin's fabric. ``start_ns``: twin time of the first
    occurrence. ``every_ns``: repeat period (None: once); must be at least the run's simulated
    time, since occurrences of one job do not overlap. ``until_ns``: no occurrence starts at
    or after it (None: forever).
    """

    result: TransportResult
    start_ns: int
    every_ns: int | None = None
    until_ns: int | None = None
    paths: tuple[tuple[int, ...], ...] = ()  # per flow: its links, sender to receiver (INT)

    def __post_init__(self) -> None:
        span = self.result.stats.sim_time_ns
        if self.every_ns is not None and self.every_ns <= 0:
            raise ConfigError(f"twin transport episode: every_ns: must be > 0, got {self.every_ns}")
        if self.every_ns is not None and self.every_ns < span:
            raise ConfigError(f"twin transport episode: every_ns: {self.every_ns} is shorter than the "
                              f"run it repeats ({span:.0f} ns simulated)")
        if self.paths and len(self.paths) != len(self.result.sim.flow_ids):
            raise ConfigError(f"twin transport episode: paths: {len(self.paths)} routes for "
                              f"{len(self.result.sim.flow_ids)} flows")
        if self.until_ns is not None and self.until_ns < self.start_ns:
            raise ConfigError(f"twin transport episode: until_ns: {self.until_ns} is before "
                              f"start_ns {self.start_ns}")

    @property
    def span_ns(self) -> float:
        """Simulated time of one occurrence."""
        return float(self.result.stats.sim_time_ns)

    def starts_in(self, t0: int, t1: int) -> int:
        """How many occurrences start in ``[t0, t1)``."""
        end = t1 if self.until_ns is None else min(t1, self.until_ns)
        if end <= self.start_ns or end <= t0:
            return 0
        if self.every_ns is None:
            return int(t0 <= self.start_ns < end)
        first = max(0, -(-(t0 - self.start_ns) // self.every_ns))  # first k with start + k P >= t0
        last = (end - 1 - self.start_ns) // self.every_ns  # last k with start + k P < end
        return max(0, int(last - first + 1))

    def latest_start(self, t: int) -> int | None:
        """Start of the latest occurrence that began at or before ``t`` (None: none yet)."""
        if t < self.start_ns:
            return None
        k = 0 if self.every_ns is None else (t - self.start_ns) // self.every_ns
        begin = self.start_ns + k * (self.every_ns or 0)
        if self.until_ns is not None and begin >= self.until_ns:
            if self.every_ns is None:
                return None
            k = (self.until_ns - 1 - self.start_ns) // self.every_ns
            begin = self.start_ns + k * self.every_ns
        return int(begin)

    def offset_at(self, t: int) -> float | None:
        """Time since the start of the occurrence that holds ``t`` (None: none does; one that
        began before ``until_ns`` runs to its end)."""
        begin = self.latest_start(t)
        if begin is None:
            return None
        off = float(t - begin)
        return off if off < self.span_ns else None


@dataclass(frozen=True)
class EpisodeCounters:
    """One occurrence's increments per twin edge (the twin's ``Fabric.index`` order)."""

    served_bytes: F64
    marked: F64
    dropped_pkts: F64
    trimmed_pkts: F64
    pause_frames_rev: F64  # on the reverse edge: sent by the link's receiver to its sender
    paused_us_rev: F64
    llr_retried: F64
    max_queue_bytes: F64


#: A switch holding XOFF re-sends PAUSE before the last one expires: IEEE 802.1Qbb's longest
#: pause is 65,535 quanta of 512 bit times; the refresh is assumed at half of it.
PAUSE_QUANTA_BITS = 65_535 * 512
REFRESH_FRACTION = 0.5


def episode_counters(ep: TransportEpisode, edge_ids: tuple[str, ...], mtu_bytes: float, *,
                     speed_bps: F64) -> EpisodeCounters:
    """The per-occurrence increments of ``ep`` on a twin whose edges are ``edge_ids`` and
    link speeds ``speed_bps``.

    The engine counts XOFF transitions; a receiver that holds XOFF also refreshes it, so the
    pause frames reported are the transitions plus the paused time over the refresh period
    (:data:`REFRESH_FRACTION` of the longest pause at the link's speed). Edge ``e ^ 1`` is the
    reverse of ``e`` (the fabric index pairs them). Refuses a run whose links are not the
    twin's (another fabric, or another build of it)."""
    st = ep.result.stats
    if tuple(st.edge_ids) != tuple(edge_ids):
        extra = sorted(set(st.edge_ids) - set(edge_ids))[:1]
        raise ConfigError("twin transport episode: result: its links are not the twin's fabric "
                          f"({len(st.edge_ids)} links against {len(edge_ids)}"
                          + (f"; {extra[0]!r} is not the twin's" if extra else "") + ")")
    m = len(edge_ids)
    rev = np.arange(m) ^ 1
    zeros = np.zeros(m)
    trimmed = st.trimmed_bytes if st.trimmed_bytes is not None else zeros
    paused = np.asarray(st.paused_ns, dtype=np.float64)
    refresh_ns = REFRESH_FRACTION * PAUSE_QUANTA_BITS / np.maximum(speed_bps, 1.0) * 1e9
    pause = np.asarray(st.pause_frames, dtype=np.float64) + np.floor(paused / refresh_ns)
    return EpisodeCounters(
        served_bytes=np.asarray(st.served_bytes, dtype=np.float64),
        marked=np.asarray(st.marked_packets, dtype=np.float64),
        dropped_pkts=np.maximum(st.drop_bytes - trimmed, 0.0) / mtu_bytes,
        trimmed_pkts=np.asarray(trimmed, dtype=np.float64) / mtu_bytes,
        pause_frames_rev=pause[rev],
        paused_us_rev=paused[rev] / 1e3,
        llr_retried=(np.asarray(st.llr_retried_frames, dtype=np.float64)
                     if st.llr_retried_frames is not None else zeros),
        max_queue_bytes=np.asarray(st.max_queue_bytes, dtype=np.float64),
    )


def depth_at(ep: TransportEpisode, offset_ns: float, n_edges: int) -> tuple[I64, F64]:
    """Queue depth of the run's traced links ``offset_ns`` into an occurrence: (edges, bytes);
    empty when nothing was traced."""
    r = ep.result
    if r.trace_edges.size == 0 or r.queue_trace_t_ns.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    k = int(np.searchsorted(r.queue_trace_t_ns, offset_ns, side="right")) - 1
    k = min(max(k, 0), r.queue_trace_t_ns.size - 1)
    edges = np.asarray(r.trace_edges, dtype=np.int64)
    keep = (edges >= 0) & (edges < n_edges)
    return edges[keep], np.asarray(r.queue_trace_bytes[k], dtype=np.float64)[keep]


#: The units of the INT-MD metadata the twin writes (the spec leaves them to each device).
SEMANTICS: dict[str, str] = {
    "instructions": "node ID, level 1 ports, hop latency, queue, ingress / egress timestamps, Tx utilization",
    "node_id": "the switch's position in the fabric's switch list, from 1",
    "l1_ingress / l1_egress": "N of the port's name ethN (0 when it has none)",
    "hop_latency": "ns the packet waited in the egress queue (occupancy / line rate)",
    "queue_id / queue_occupancy": "3 (the RoCE class) / bytes in that egress queue",
    "ingress_ts / egress_ts": "ns since the Unix epoch on the twin's clock; each hop's ingress is "
                              "the previous egress plus the link's latency",
    "tx_utilization": "parts per million of the egress port's speed, averaged over the run",
}


def _port_number(port_id: str) -> int:
    name = port_id.rsplit(":", 1)[-1]
    digits = name[len(name.rstrip("0123456789")):]
    return int(digits) if digits else 0


def sink_of(fabric: Fabric, path: tuple[int, ...]) -> str | None:
    """The switch where a route leaves the fabric (the last switch on it), None without one."""
    ix = fabric.index
    for e in reversed(path):
        node = int(ix.src[e])
        if ix.is_switch[node]:
            return ix.node_ids[node]
    return None


def _trace_columns(r: TransportResult) -> dict[int, int]:
    """Link -> its column in the run's queue trace."""
    return {int(e): k for k, e in enumerate(r.trace_edges.tolist())}


def worst_row(ep: TransportEpisode, flow: int, fabric: Fabric) -> int | None:
    """Row of the run's queue trace at which ``flow``'s route held the most queueing delay
    (None: nothing on its route was traced)."""
    r = ep.result
    if not ep.paths or r.queue_trace_t_ns.size == 0:
        return None
    col = _trace_columns(r)
    cap = fabric.index.capacity_bps / 8.0
    cols = [(col[e], cap[e]) for e in ep.paths[flow] if e in col]
    if not cols:
        return None
    delay = sum(r.queue_trace_bytes[:, k] / c for k, c in cols)
    return int(np.argmax(delay))


def int_stack(ep: TransportEpisode, flow: int, fabric: Fabric, *, begin_ns: int,
              node_ids: dict[str, int]) -> list[int_md.IntHop]:
    """The INT-MD stack (most recent hop first) of ``flow``'s worst packet in the occurrence
    that began at ``begin_ns``: every switch on its route pushes node, ports, hop latency,
    queue, timestamps and Tx utilization (:data:`SEMANTICS`); a queue the run did not trace is
    invalid (None)."""
    ix = fabric.index
    r = ep.result
    path = ep.paths[flow]
    row = worst_row(ep, flow, fabric)
    col = _trace_columns(r)
    cap = ix.capacity_bps / 8.0
    span = max(r.stats.sim_time_ns, 1.0)
    t = float(begin_ns) + (float(r.queue_trace_t_ns[row]) if row is not None else 0.0)
    hops: list[int_md.IntHop] = []
    for prev, e in itertools.pairwise(path):
        t += float(ix.latency_ns[prev])
        q = float(r.queue_trace_bytes[row, col[e]]) if row is not None and e in col else None
        lat = None if q is None else q / cap[e] * 1e9
        util = r.stats.served_bytes[e] / (cap[e] * span * 1e-9) * 1e6
        node = ix.node_ids[int(ix.src[e])]
        hops.append(int_md.IntHop(
            node_id=node_ids.get(node), l1_ingress=_port_number(ix.to_port[prev]),
            l1_egress=_port_number(ix.from_port[e]), hop_latency=None if lat is None else round(lat),
            queue_id=3, queue_occupancy=None if q is None else round(q), ingress_ts=round(t),
            egress_ts=round(t + (lat or 0.0)), tx_utilization=round(util)))
        t += lat or 0.0
    hops.reverse()
    return hops


def int_md_hex(ep: TransportEpisode, flow: int, fabric: Fabric, *, now_ns: int,
               node_ids: dict[str, int]) -> str:
    """What the flow's INT sink serves at ``now_ns``: the hex INT-MD header and stack of the
    latest occurrence's worst packet ("" before the first occurrence)."""
    begin = ep.latest_start(now_ns)
    if begin is None or not ep.paths or not ep.paths[flow]:
        return ""
    stack = int_stack(ep, flow, fabric, begin_ns=begin, node_ids=node_ids)
    hdr = int_md.IntMdHeader(instructions=int_md.HPCC_INSTRUCTIONS,
                             hop_ml=int_md.hop_words(int_md.HPCC_INSTRUCTIONS),
                             remaining_hop_count=max(0, 8 - len(stack)))
    return int_md.pack(hdr, stack).hex()
