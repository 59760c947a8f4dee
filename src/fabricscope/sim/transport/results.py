"""What a transport run adds to a flow result: per-link queue, mark, pause and drop counters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabricscope.sim.results import SimResult

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class TransportStats:
    """Counters per directed link (index = fabric edge index) over the whole run.

    max_queue_bytes / mean_queue_bytes: egress queue watermark and time average
    drop_bytes:     bytes dropped at the egress (full buffer, dynamic threshold, watchdog),
                    trimmed payload included
    trimmed_bytes:  of those, payload cut by trimming whose header went on to the receiver
                    (UEC switches, ``nscc`` / ``eqds`` with trimming; zero otherwise)
    llr_retried_frames: frames the link corrupted and re-sent itself (link-level retry)
    marked_packets: ECN-marked packets (marked bytes / MTU)
    pause_frames:   XOFF transitions sent upstream by the receiver of the link
    paused_ns:      time the link's sender was paused while it had bytes to send
    watchdog_events: times the PFC watchdog declared the link's queue stormed
    served_bytes:   bytes the link carried
    """

    edge_ids: tuple[str, ...]
    max_queue_bytes: FloatArray
    mean_queue_bytes: FloatArray
    drop_bytes: FloatArray
    marked_packets: FloatArray
    pause_frames: IntArray
    paused_ns: FloatArray
    watchdog_events: IntArray
    served_bytes: FloatArray
    sim_time_ns: float
    dt_ns: float
    steps: int
    trimmed_bytes: FloatArray | None = None
    llr_retried_frames: FloatArray | None = None

    def totals(self) -> dict[str, float]:
        """Fabric-wide figures (what ``fabricscope sim --cc`` prints)."""
        return {
            "max_queue_KB": round(float(self.max_queue_bytes.max(initial=0.0)) / 1e3, 3),
            "drops_KB": round(float(self.drop_bytes.sum()) / 1e3, 3),
            "trimmed_KB": round(float(self.trimmed_bytes.sum()) / 1e3, 3) if self.trimmed_bytes is not None else 0.0,
            "llr_retries": round(float(self.llr_retried_frames.sum()), 1) if self.llr_retried_frames is not None else 0.0,
            "ecn_marks": round(float(self.marked_packets.sum()), 1),
            "pause_frames": int(self.pause_frames.sum()),
            "paused_links": int((self.paused_ns > 0).sum()),
            "paused_us": round(float(self.paused_ns.sum()) / 1e3, 3),
            "watchdog_events": int(self.watchdog_events.sum()),
        }

    def hottest_queues(self, k: int = 5) -> list[dict[str, object]]:
        """The ``k`` links with the highest queue watermark."""
        order = np.argsort(-self.max_queue_bytes, kind="stable")[:k]
        return [
            {"link": self.edge_ids[int(e)], "max_queue_KB": round(float(self.max_queue_bytes[e]) / 1e3, 3),
             "mean_queue_KB": round(float(self.mean_queue_bytes[e]) / 1e3, 3),
             "paused_us": round(float(self.paused_ns[e]) / 1e3, 3)}
            for e in order if self.max_queue_bytes[e] > 0
        ]


@dataclass(frozen=True)
class TransportWatch:
    """What a watched run (``FluidTransport(watch=True)``) adds for a report.

    first_pause_ns:        per directed link, start of the engine chunk in which its receiver
                           sent the first XOFF (NaN: never paused); the XOFF came at most
                           ``first_pause_window_ns`` later (max(dt, 1 % of the time elapsed))
    xoff_empty_bytes:      per node, the XOFF threshold of a switch's ingress queues while its
                           buffer is empty (NaN: a NIC, or PFC off); a dynamic one is lower
                           when the buffer holds bytes
    ecn_kmin/kmax_bytes:   the marking thresholds, when the congestion control reacts to ECN
                           (DCQCN, NSCC; None for HPCC and none)
    trace_every_ns:        the interval of the queue trace at the end of the run (each row is
                           the maximum of the samples merged into it)
    max_rows:              rows of the trace buffer (memory: max_rows x traced links x 8 B);
                           the trace returned holds at most half of them
    feeds:                 (k, 2) distinct (ingress link, egress link) pairs some route takes
                           through a switch: which egress queues a paused link's bytes wait in
    """

    first_pause_ns: FloatArray
    first_pause_window_ns: FloatArray
    xoff_empty_bytes: FloatArray
    ecn_kmin_bytes: float | None
    ecn_kmax_bytes: float | None
    trace_every_ns: float
    max_rows: int
    feeds: IntArray


@dataclass(frozen=True)
class TransportResult:
    """A flow result (same fields as the ideal engine's) plus the transport counters.

    ``queue_trace_t_ns`` / ``queue_trace_bytes`` sample the egress queue of the links asked for
    (``trace_edges``) every ``trace_every_ns``; ``queueing_delay_ns`` is each flow's mean
    queueing delay over its lifetime (what its RTT carried on top of the base RTT). A watched
    run (``watch=True``) traces every busy switch egress queue and fills ``watch``.
    """

    sim: SimResult
    stats: TransportStats
    trace_edges: IntArray
    queue_trace_t_ns: FloatArray
    queue_trace_bytes: FloatArray
    queueing_delay_ns: FloatArray
    unfinished: int
    watch: TransportWatch | None = None
