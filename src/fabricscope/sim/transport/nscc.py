"""NSCC-like sender congestion control (UEC) on the fluid: a window driven by delay and ECN.

The control law follows the Ultra Ethernet transport's network-signal congestion control
(UEC 1.0 specification, "NSCC") as the reference implementation ``UecSrc`` of
uet-htsim (github.com/ultraethernet/uet-htsim @ 40ccb05, ``htsim/sim/uec.cpp``:
``updateCwndOnAck_NSCC``, ``quick_adapt``, ``fair_increase``, ``proportional_increase``,
``fast_increase``, ``multiplicative_decrease``, ``fulfill_adjustment``, ``initNsccParams``)
runs it; this is an independent re-statement for a fluid, not a copy. Every acknowledged
byte carries two signals, the queueing delay ``D`` its packet saw (RTT - base RTT) and an ECN
mark; with ``t_q`` the target queueing delay:

* unmarked, ``D >= t_q``: *fair increase*, ``inc += FI x bytes``;
* unmarked, ``D < t_q``:  *proportional increase*, ``inc += A x bytes x (t_q - D) / t_q``;
  if ``D`` < 1 us for a whole window, *fast increase* instead: ``W += 0.25 a x bytes``;
* marked, ``D >= t_q``:   *multiplicative decrease*, at most once per base RTT,
  ``W *= max(1 - gamma (D_avg - t_q) / D_avg, 0.5)`` (``D_avg`` an EWMA of the delay);
* marked, ``D < t_q``:    nothing (the mark is taken as a path, not a window, signal);
* every 8 MTU acknowledged (or base RTT): ``W += inc / W``; once per network RTT ``W += ETA``;
* *quick adapt*: once per (base RTT + t_q), if the delay exceeded ``4 t_q`` (or a NACK came)
  and less than ``W_max / 8`` was acknowledged in that period, ``W`` = the bytes acknowledged
  in it, and the marks of the bytes then in flight are ignored;
* a NACK (a trimmed packet; a drop in the fluid) removes its bytes from ``W``.

Defaults (``initNsccParams``): with a = network BDP / (100 Gb/s x 12 us) and
b = t_q / 12 us, FI = 5 MSS a, A = 4 MSS a b, ETA = 0.15 MSS a, gamma = 0.8, EWMA weight
0.0125 per packet, t_q = 0.75 x network RTT with trimming (1 x without), W_max = 1.5 BDP of
the flow's own base RTT, W starts at W_max. The switch side of htsim's UEC runs: per-port
queues of one network BDP (trimming; five without), ECN on dequeue from 0.2 to 0.8 BDP with
probability rising to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import ConfigError

REFERENCE_BDP_BYTES = 100e9 / 8 * 12e-6  # 100 Gb/s x 12 us: the spec's scaling reference
REFERENCE_RTT_NS = 12_000.0

# columns of the per-flow state array
(NS_W, NS_AVG, NS_INC, NS_FI, NS_LAST_DEC, NS_LAST_ADJ, NS_QA_END, NS_ACHIEVED, NS_IGNORE,
 NS_INCREASE, NS_ACKED, NS_LOST, NS_RECEIVED, NS_T, NS_WMAX, NS_TRIGGER, NS_RTO_PEND,
 NS_RTO_AT, NS_NK_PEND, NS_NK_AT) = range(20)
N_NS = 20
# the float parameter vector
(NP_TQ, NP_NET_RTT, NP_GAMMA, NP_EWMA, NP_QA_THR, NP_QA_FRAC, NP_FI, NP_ETA, NP_A, NP_FI_SCALE,
 NP_FAST_DELAY, NP_ADJ_BYTES, NP_MTU, NP_PORT_CAP, NP_TRIM_HDR, NP_HDR_CAP, NP_RTO) = range(17)
N_NP = 17


@dataclass(frozen=True, slots=True)
class NsccConfig:
    """NSCC parameters (defaults: uet-htsim ``initNsccParams``; docs/design/sim-transport.md).

    target_qdelay_ns: t_q; ``None`` = 0.75 x network RTT with trimming, 1 x without
    network_rtt_ns:   the fabric's largest unloaded RTT; ``None`` = the largest of the flows'
    gamma:            multiplicative-decrease gain
    delay_ewma:       EWMA weight of the average delay, per packet
    qa_factor:        quick adapt fires above ``qa_factor x t_q`` of delay
    qa_gate:          ... and only if less than ``W_max / 2^qa_gate`` was acknowledged
    fi_mss / eta_mss / alpha_mss: fair-increase, per-RTT additive and proportional-increase
                      constants in MSS, scaled by a (and b for alpha) as the spec says
    fi_scale:         fast-increase factor (x a) per acknowledged byte
    fast_delay_ns:    fast increase needs the delay below this
    max_window_bdp:   W_max in BDPs of the flow's base RTT
    trimming:         switches trim (htsim's default): t_q = 0.75 RTT, 1-BDP port queues, and
                      a dropped packet's header (``trim_header_bytes``, htsim's 64 B) still
                      crosses the port ahead of data, so a NACK comes back; past
                      ``header_queue_factor`` port queues of waiting headers the packet
                      is lost silently and its sender learns it at its retransmission
                      timeout (htsim ``_min_rto`` = 15 us + 6 port-queue drain times)
    header_bytes:     UEC header per packet: a flow puts ``size + ceil(size / MSS) x 64``
                      bytes on the wire (MSS = MTU - header, as htsim's ``_backlog``)
    ecn_bdp:          (kmin, kmax) as fractions of the network BDP with marking probability
                      rising to 1 at kmax (htsim's default); ``None`` keeps TransportConfig.ecn
    port_queue_bdp:   per-port queue limit in network BDPs when lossy; ``None`` = 1 with
                      trimming, 5 without (htsim); 0 = only the shared buffer limits
    """

    target_qdelay_ns: float | None = None
    network_rtt_ns: float | None = None
    gamma: float = 0.8
    delay_ewma: float = 0.0125
    qa_factor: float = 4.0
    qa_gate: int = 3
    fi_mss: float = 5.0
    eta_mss: float = 0.15
    alpha_mss: float = 4.0
    fi_scale: float = 0.25
    fast_delay_ns: float = 1000.0
    max_window_bdp: float = 1.5
    trimming: bool = True
    ecn_bdp: tuple[float, float] | None = (0.2, 0.8)
    port_queue_bdp: float | None = None
    trim_header_bytes: float = 64.0
    header_bytes: float = 64.0
    header_queue_factor: float = 2.0

    def validate(self, where: str = "nscc") -> None:
        for k in ("gamma", "delay_ewma", "qa_factor", "fi_mss", "alpha_mss", "max_window_bdp"):
            v = getattr(self, k)
            if not v > 0:
                raise ConfigError(f"{where}.{k}: must be > 0, got {v!r}")
        for k in ("eta_mss", "fi_scale", "fast_delay_ns"):
            v = getattr(self, k)
            if not v >= 0:
                raise ConfigError(f"{where}.{k}: must be >= 0, got {v!r}")
        if not 0 < self.gamma <= 1 or not 0 < self.delay_ewma <= 1:
            raise ConfigError(f"{where}: gamma and delay_ewma must be in (0, 1], got {self.gamma!r}, "
                              f"{self.delay_ewma!r}")
        if not 0 <= self.qa_gate <= 16:
            raise ConfigError(f"{where}.qa_gate: must be in 0..16, got {self.qa_gate!r}")
        for k in ("target_qdelay_ns", "network_rtt_ns"):
            v = getattr(self, k)
            if v is not None and not v > 0:
                raise ConfigError(f"{where}.{k}: must be > 0, got {v!r}")
        if self.ecn_bdp is not None:
            lo, hi = self.ecn_bdp
            if not 0 <= lo <= hi or hi <= 0:
                raise ConfigError(f"{where}.ecn_bdp: need 0 <= kmin <= kmax, kmax > 0, got {self.ecn_bdp!r}")
        if not 0 <= self.header_bytes < 4096 or not self.header_queue_factor > 0:
            raise ConfigError(f"{where}: header_bytes must be in [0, 4096) and header_queue_factor > 0, got "
                              f"{self.header_bytes!r}, {self.header_queue_factor!r}")
        if not 0 <= self.trim_header_bytes < 4096:
            raise ConfigError(f"{where}.trim_header_bytes: must be in [0, 4096), got {self.trim_header_bytes!r}")
        if self.port_queue_bdp is not None and self.port_queue_bdp < 0:
            raise ConfigError(f"{where}.port_queue_bdp: must be >= 0, got {self.port_queue_bdp!r}")


@dataclass(frozen=True, slots=True)
class NsccDerived:
    """The numbers one run uses, derived from :class:`NsccConfig` and the fabric."""

    network_rtt_ns: float
    network_bdp_bytes: float
    target_qdelay_ns: float
    kmin_bytes: float | None
    kmax_bytes: float | None
    port_cap_bytes: float
    params: npt.NDArray[np.float64]


def derive(cfg: NsccConfig, *, network_rtt_ns: float, link_bytes_per_ns: float, mtu: float) -> NsccDerived:
    """Scale the spec's constants to this fabric (``initNsccParams``): a = BDP / (100G x 12 us),
    b = t_q / 12 us."""
    rtt = cfg.network_rtt_ns if cfg.network_rtt_ns is not None else network_rtt_ns
    bdp = rtt * link_bytes_per_ns
    tq = cfg.target_qdelay_ns if cfg.target_qdelay_ns is not None else (0.75 if cfg.trimming else 1.0) * rtt
    a = bdp / REFERENCE_BDP_BYTES
    b = tq / REFERENCE_RTT_NS
    kmin = kmax = None
    if cfg.ecn_bdp is not None:
        # htsim rounds the thresholds up to whole packets of the BDP in packets
        bdp_pkt = math.ceil(bdp / mtu)
        kmin = math.ceil(bdp_pkt * cfg.ecn_bdp[0]) * mtu
        kmax = math.ceil(bdp_pkt * cfg.ecn_bdp[1]) * mtu
    qb = cfg.port_queue_bdp if cfg.port_queue_bdp is not None else (1.0 if cfg.trimming else 5.0)
    port_cap = math.ceil(bdp / mtu) * qb * mtu if qb > 0 else 0.0
    p = np.zeros(N_NP)
    p[NP_TQ] = tq
    p[NP_NET_RTT] = rtt
    p[NP_GAMMA] = cfg.gamma
    p[NP_EWMA] = cfg.delay_ewma
    p[NP_QA_THR] = cfg.qa_factor * tq
    p[NP_QA_FRAC] = 1.0 / (1 << cfg.qa_gate)
    p[NP_FI] = cfg.fi_mss * mtu * a
    p[NP_ETA] = cfg.eta_mss * mtu * a
    p[NP_A] = cfg.alpha_mss * mtu * a * b
    p[NP_FI_SCALE] = cfg.fi_scale * a
    p[NP_FAST_DELAY] = cfg.fast_delay_ns
    p[NP_ADJ_BYTES] = 8.0 * mtu
    p[NP_MTU] = mtu
    p[NP_PORT_CAP] = port_cap
    p[NP_TRIM_HDR] = cfg.trim_header_bytes if cfg.trimming else 0.0
    p[NP_HDR_CAP] = cfg.header_queue_factor * port_cap
    p[NP_RTO] = 15_000.0 + 6.0 * port_cap / link_bytes_per_ns
    return NsccDerived(rtt, bdp, tq, kmin, kmax, port_cap, p)


def init_state(base_rtt_ns: npt.NDArray[np.float64], line_bytes_per_ns: npt.NDArray[np.float64],
               max_window_bdp: float, mtu: float) -> npt.NDArray[np.float64]:
    """Per-flow state: W = W_max = ``max_window_bdp`` x the flow's own BDP (``initNscc``)."""
    st = np.zeros((base_rtt_ns.shape[0], N_NS))
    st[:, NS_T] = base_rtt_ns
    st[:, NS_WMAX] = np.maximum(max_window_bdp * base_rtt_ns * line_bytes_per_ns, mtu)
    st[:, NS_W] = st[:, NS_WMAX]
    st[:, NS_LAST_DEC] = -np.inf
    return st


@numba.njit(cache=True)
def _quick_adapt(st, f, now, delay, inflight, p):  # type: ignore[no-untyped-def]
    """``quick_adapt``: True when the window was reset (the rest of the update is skipped)."""
    done = False
    if now > st[f, NS_QA_END]:
        if (st[f, NS_QA_END] != 0.0 and (st[f, NS_TRIGGER] != 0.0 or delay > p[NP_QA_THR])
                and st[f, NS_ACHIEVED] < st[f, NS_WMAX] * p[NP_QA_FRAC]):
            st[f, NS_W] = max(st[f, NS_ACHIEVED], p[NP_MTU])
            st[f, NS_IGNORE] = inflight
            st[f, NS_TRIGGER] = 0.0
            done = True
        st[f, NS_ACHIEVED] = 0.0
        st[f, NS_QA_END] = now + st[f, NS_T] + p[NP_TQ]
    if done:
        st[f, NS_INC] = 0.0
        st[f, NS_RECEIVED] = 0.0
    return done


@numba.njit(cache=True)
def nscc_update(st, f, now, acked, lost, delay, mark, inflight, p):  # type: ignore[no-untyped-def]
    """One NSCC update of flow ``f`` at ``now`` (ns): ``acked`` / ``lost`` are the flow's
    cumulative acknowledged / NACKed bytes, ``delay`` the queueing delay and ``mark`` the ECN
    fraction the acknowledged bytes carry, ``inflight`` its bytes in flight. Updates the
    window ``st[f, NS_W]`` (bytes) in place."""
    mtu = p[NP_MTU]
    tq = p[NP_TQ]
    d_ack = max(acked - st[f, NS_ACKED], 0.0)
    st[f, NS_ACKED] = acked
    d_lost = max(lost - st[f, NS_LOST], 0.0)
    st[f, NS_LOST] = lost
    w_base = st[f, NS_T]
    # ---- NACKs (trimmed / dropped bytes): delay sample base RTT + network RTT, quick adapt
    if d_lost > 0.0:
        k = 1.0 - (1.0 - p[NP_EWMA]) ** (d_lost / mtu)
        st[f, NS_AVG] += k * (p[NP_NET_RTT] - st[f, NS_AVG])
        st[f, NS_TRIGGER] = 1.0
        if not _quick_adapt(st, f, now, 0.0, inflight, p):
            st[f, NS_W] = max(st[f, NS_W] - d_lost, mtu)
    if d_ack <= 0.0:
        return
    st[f, NS_ACHIEVED] += d_ack
    if _quick_adapt(st, f, now, delay, inflight, p):
        return
    marked = d_ack * mark
    clean = d_ack - marked
    ign = min(marked, st[f, NS_IGNORE])  # marks of the bytes in flight at a quick adapt
    st[f, NS_IGNORE] -= ign
    marked -= ign
    # ---- average delay (update_delay): an unmarked sample above target counts as base/4
    n_pk = d_ack / mtu
    k = 1.0 - (1.0 - p[NP_EWMA]) ** n_pk
    x = (clean * 0.25 * w_base + (marked + ign) * delay) / d_ack if delay > tq else delay
    st[f, NS_AVG] += k * (x - st[f, NS_AVG])
    w = st[f, NS_W]
    if delay >= tq:
        st[f, NS_INC] += p[NP_FI] * clean
        if marked > 0.0:
            st[f, NS_INCREASE] = 0.0
            st[f, NS_FI] = 0.0
            avg = st[f, NS_AVG]
            if avg > tq and now - st[f, NS_LAST_DEC] > w_base:
                w *= max(1.0 - p[NP_GAMMA] * (avg - tq) / avg, 0.5)
                st[f, NS_LAST_DEC] = now
    elif clean > 0.0:
        fast = False
        if delay < p[NP_FAST_DELAY]:
            st[f, NS_FI] += clean
            if st[f, NS_FI] > w or st[f, NS_INCREASE] != 0.0:
                w += clean * p[NP_FI_SCALE]
                st[f, NS_INCREASE] = 1.0
                fast = True
        else:
            st[f, NS_FI] = 0.0
        if not fast:
            st[f, NS_INCREASE] = 0.0
            st[f, NS_INC] += p[NP_A] * clean * (tq - delay) / tq
    w = min(max(w, mtu), st[f, NS_WMAX])
    # ---- fulfill adjustment: every 8 MTU acknowledged or once per network RTT
    st[f, NS_RECEIVED] += d_ack
    if st[f, NS_RECEIVED] > p[NP_ADJ_BYTES] or now - st[f, NS_LAST_ADJ] > p[NP_NET_RTT]:
        w += st[f, NS_INC] / w
        if now - st[f, NS_LAST_ADJ] >= p[NP_NET_RTT]:
            w += p[NP_ETA]
            st[f, NS_LAST_ADJ] = now
        st[f, NS_INC] = 0.0
        st[f, NS_RECEIVED] = 0.0
    st[f, NS_W] = min(max(w, mtu), st[f, NS_WMAX])
