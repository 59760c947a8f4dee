"""The time-stepped fluid transport engine: queues, ECN, PFC and DCQCN on the engine's routes.

:class:`FluidTransport` holds the state of one run and advances it in steps of ``dt``
(:mod:`fabricscope.sim.transport.kernel`); :func:`simulate_transport` runs it to the end
and returns a :class:`~fabricscope.sim.transport.results.TransportResult`. Flows take the
routes the flow-level engine gives them (:func:`fabricscope.sim.loadbalance.route_flows`
through the engine's own flow table), so ECMP hashing, spraying and failed links mean the
same thing in both engines. The model: docs/design/sim-transport.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.hashing import HashConfig
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.engine import Progress, _as_faults, _edge_ids_of, _Engine, edge_tiers
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.sim.flows import Workload
from fabricscope.sim.loadbalance import DYNAMIC_SCHEMES, PathTable, check_scheme
from fabricscope.sim.results import SimResult
from fabricscope.sim.transport import eqds as EQ
from fabricscope.sim.transport import kernel as K
from fabricscope.sim.transport import nscc as NS
from fabricscope.sim.transport.config import TransportConfig
from fabricscope.sim.transport.reroute import reroute, segment_levels
from fabricscope.sim.transport.results import TransportResult, TransportStats, TransportWatch
from fabricscope.sim.transport.segments import build_segments

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_DT_NS = 500.0
CC_DT_NS = 1000.0
#: Adaptive routing (``--lb ar``): ports' queueing delays are levelled to within ~AR_TAU_NS,
#: the split reacting within ~AR_REACT_NS (a switch re-decides per packet: well under a
#: microsecond of its own; the fluid step sets the floor).
AR_TAU_NS = 1000.0
AR_REACT_NS = 2000.0
CHUNK_STEPS = 20_000
# A watched run (``watch=True``) keeps at most WATCH_BYTES of queue trace: rows x traced
# links x 8 B x 2 (the buffer holds two halves), between WATCH_MIN_ROWS and WATCH_MAX_ROWS
# rows; each link's first pause is timed to WATCH_RESOLUTION of the time elapsed (>= 1 step).
WATCH_BYTES = 32 * 1024 * 1024
WATCH_MIN_ROWS, WATCH_MAX_ROWS = 64, 512
WATCH_RESOLUTION = 1.0 / 100.0


class FluidTransport:
    """One transport run, advanced with :meth:`advance_to` and read with :meth:`result`.

    Parameters
    ----------
    lb:
        ``ecmp``, ``random``, ``spray``, ``stripe`` or ``oblivious:paths=N`` (static routes), or
        ``reps[:paths=N]``: N entropies that each sender re-weights once per RTT by the marks and
        losses their packets see (REPS; ``flowlet``/``dlb`` re-route per flowlet and are not in
        the transport engine yet).
    faults:
        ``link-down`` / ``link-degraded`` faults active for the whole run (start 0, no end).
    stuck_nics:
        NIC ids that never accept data and send PAUSE continuously (a PFC storm source).
    paths:
        Routes to use instead of the routing's (one row per flow, fabric edge indices):
        how a non-up-down route, e.g. after a link failure, is given.
    trace_edges / trace_every_ns:
        Sample these links' egress queues every ``trace_every_ns``.
    watch:
        Record what a report needs without knowing the hot links in advance: every switch
        egress queue that carries traffic is traced (no ``trace_edges`` with it), starting at
        every step; whenever the trace holds more than ``R`` rows, pairs of rows are merged
        (their maximum, so a peak survives) and the interval doubles, so memory stays under
        ``(2 R + 2) x links x 8 B`` with ``R = clamp(WATCH_BYTES / (16 x links), 64, 512)``
        whatever the run's length: about 32 MiB up to 32,768 traced links, ~1 KiB per link
        beyond. Each link's first XOFF is
        timed to within ``max(dt, WATCH_RESOLUTION x elapsed time)`` by advancing in chunks
        that short (a run makes a few hundred calls instead of one; on the 1,024-host
        permutation of benchmarks/bench_transport.py 5 % more CPU time, the 127:1 incast 2 %).
        :attr:`TransportResult.watch` holds the result.
    """

    def __init__(
        self,
        fabric: Fabric,
        workload: Workload,
        *,
        config: TransportConfig | None = None,
        lb: str = "ecmp",
        hash_config: HashConfig | None = None,
        faults: FaultSchedule | Iterable[Fault] = (),
        seed: int = 0,
        stuck_nics: Sequence[str] = (),
        paths: PathTable | None = None,
        trace_edges: Sequence[int] = (),
        trace_every_ns: float = 0.0,
        trace_max: int = 200_000,
        watch: bool = False,
    ) -> None:
        cfg = config or TransportConfig()
        cfg.validate()
        self.config = cfg
        scheme = check_scheme(lb)
        if scheme in DYNAMIC_SCHEMES:
            raise ConfigError(f"lb {scheme}: re-routing per flowlet is not in the transport engine yet "
                              "(use ecmp, random, spray, stripe or oblivious:paths=N)")
        fl = _as_faults(faults)
        for f in fl:
            if f.kind in ("link-down", "link-degraded", "gray-loss") and (f.start_ns > 0 or f.end_ns is not None):
                raise ConfigError(f"fault {f.kind} on {f.subject}: the transport engine takes link faults "
                                  "for the whole run only (start 0, no end)")
        # gray-loss: the link corrupts that fraction of its frames (dropped by the next hop's
        # FCS check and re-sent end to end, or retried on the link with LLR)
        e_fer = np.zeros(fabric.index.n_edges)
        for f in fl:
            if f.kind == "gray-loss":
                loss = f.param("loss", 0.0)
                if not 0 <= loss < 1:
                    raise ConfigError(f"fault gray-loss on {f.subject}: params.loss must be in [0, 1), got {loss}")
                e_fer[_edge_ids_of(fabric, f.subject, "fault gray-loss")] = loss
        self.fabric = fabric
        self.workload = workload
        self.scheme = scheme
        self.t0_wall = time.perf_counter()
        eng = _Engine(fabric, workload.flows, scheme=scheme, hash_config=hash_config, faults=fl,
                      seed=seed, flowlet_bytes=float("inf"), mtu_bytes=cfg.mtu_bytes, batch_rtol=1e-9)
        ix = fabric.index
        n = eng.n
        cap = eng.capacity
        if paths is None:
            eng._route_all_static()
            assert eng.table is not None
            table = eng.table
            lat_ns, sf_ns = eng.lat_ns.copy(), eng.sf_ns.copy()
        else:
            if paths.n_flows != n:
                raise ConfigError(f"paths: {paths.n_flows} rows for {n} flows")
            table = paths
            rows = np.repeat(np.arange(n), np.diff(table.indptr))
            lat = ix.latency_ns.astype(np.float64)
            lat_ns = np.bincount(rows, weights=table.weights * lat[table.edges], minlength=n).astype(np.float64)
            ser = 8.0 * cfg.mtu_bytes / cap[table.edges] * 1e9
            tot = np.bincount(rows, weights=table.weights * ser, minlength=n)
            hops_w = np.bincount(rows, weights=table.weights, minlength=n)
            sf_ns = np.where(hops_w > 0, tot - tot / np.maximum(hops_w, 1e-12), 0.0)
        self.eng = eng
        self.sf_ns = sf_ns
        self.lat_ns = lat_ns
        unroutable = table.unroutable.copy()
        local = eng.src == eng.dst
        if (local & (eng.ndeps > 0)).any():
            raise WorkloadError("flows: a NIC sending to itself inside a dependency chain is not "
                                "supported by the transport engine")
        segs = build_segments(table.indptr, table.edges, table.weights, edge_src=ix.src, edge_dst=ix.dst,
                              flow_src=eng.src, flow_dst=eng.dst, n_nodes=ix.n_nodes, n_edges=ix.n_edges)
        self.segs = segs
        used_lat = ix.latency_ns[table.edges] if table.edges.shape[0] else ix.latency_ns
        min_lat = float(used_lat[used_lat > 0].min()) if (used_lat > 0).any() else DEFAULT_DT_NS
        dt = cfg.dt_ns if cfg.dt_ns is not None else min(DEFAULT_DT_NS, min_lat / 2)
        self.dt = float(dt)
        e_delay = np.maximum(np.rint(ix.latency_ns / dt), 1).astype(np.int64)
        L = int(e_delay.max()) + 1
        e_cap = cap / 8.0 / 1e9  # bytes per ns
        e_src_sw = ix.is_switch[ix.src].copy()
        e_dst_sw = ix.is_switch[ix.dst].copy()
        if stuck_nics and not cfg.pfc.enabled:
            raise ConfigError("stuck_nics: a stuck receiver pauses its link with PFC; enable PfcConfig "
                              "(without PFC it would only drop, which a link-down fault models)")
        stuck_nodes = set()
        for nic in stuck_nics:
            node = ix.node_of.get(nic)
            if node is None or ix.is_switch[node]:
                raise ConfigError(f"stuck_nics: {nic!r} is not a NIC of fabric {fabric.name!r}")
            stuck_nodes.add(node)
        e_stuck = np.isin(ix.dst, np.array(sorted(stuck_nodes), dtype=np.int64))
        n_buf = np.where(ix.is_switch, cfg.buffer.size_bytes, np.inf)
        pfc = cfg.pfc
        mtu = float(cfg.mtu_bytes)
        head = (np.full(ix.n_edges, pfc.headroom_bytes) if pfc.headroom_bytes is not None
                else 2.0 * e_cap * ix.latency_ns + 2.0 * mtu)
        n_hroom = np.zeros(ix.n_nodes)
        if pfc.enabled:
            np.add.at(n_hroom, ix.dst[e_dst_sw], head[e_dst_sw])
            too_small = np.flatnonzero(ix.is_switch & (n_hroom >= n_buf))
            if too_small.shape[0]:
                node = int(too_small[0])
                raise ConfigError(
                    f"buffer: {cfg.buffer.size_bytes:.0f} B per switch cannot hold the PFC headroom of "
                    f"{ix.node_ids[node]} ({n_hroom[node]:.0f} B for its ports); give a larger --buffer"
                )
        # Only links that carry a segment (as egress or ingress) or face a stuck NIC are
        # visited each step: an incast on a 1,024-host fabric touches a few hundred of 4,096.
        busy = np.zeros(ix.n_edges, dtype=bool)
        busy[segs.edge] = True
        busy[segs.ingress[segs.ingress >= 0]] = True
        busy |= e_stuck
        e_list = np.flatnonzero(busy).astype(np.int64)
        # flows
        up = ~ix.is_switch[ix.src]
        down = ~ix.is_switch[ix.dst]
        nic_out = np.bincount(ix.src[up], weights=e_cap[up], minlength=ix.n_nodes)
        nic_in = np.bincount(ix.dst[down], weights=e_cap[down], minlength=ix.n_nodes)
        f_line = np.minimum(nic_out[eng.src], nic_in[eng.dst])
        rows = np.repeat(np.arange(n), np.diff(table.indptr))
        last_edge = ~ix.is_switch[ix.dst[table.edges]]
        tail = np.bincount(rows[last_edge], weights=(table.weights * ix.latency_ns[table.edges])[last_edge],
                           minlength=n)
        rtt_steps = np.rint(2.0 * lat_ns / dt).astype(np.int64)
        lcc = int(rtt_steps.max(initial=1)) + 2
        self.state = np.zeros(n, np.int8)
        self.state[unroutable] = 3
        self.state[local] = 2
        self._block(np.flatnonzero(unroutable))
        self.t_start = np.full(n, np.nan)
        self.t_arrive = np.full(n, np.nan)
        self.t_fct = np.full(n, np.nan)
        self.t_start[local] = eng.start_at[local]
        self.t_arrive[local] = eng.start_at[local]
        self.t_fct[local] = 0.0
        ndeps = eng.ndeps.copy()
        ready = np.where(ndeps == 0, eng.start_at + eng.gap, eng.start_at).astype(np.float64)
        cc_mode = {"none": K.CC_NONE, "dcqcn": K.CC_DCQCN, "hpcc": K.CC_HPCC, "nscc": K.CC_NSCC,
                   "eqds": K.CC_EQDS}[cfg.cc]
        p = cfg.dcqcn
        xon = pfc.xon_delta_bytes if pfc.xon_delta_bytes is not None else 2.0 * mtu
        wd_detect = math.ceil(pfc.watchdog_ns / dt) if pfc.enabled and pfc.watchdog_ns > 0 else 0
        self.ip = np.zeros(K.N_IP, np.int64)
        self.ip[[K.IP_L, K.IP_LCC, K.IP_CC, K.IP_PFC, K.IP_WD_DETECT, K.IP_WD_RESTORE]] = [
            L, lcc, cc_mode, int(pfc.enabled), wd_detect, math.ceil(pfc.restore_ns / dt)]
        self.watch = watch
        self._watch_rows = 0
        if watch:
            if len(trace_edges):
                raise ConfigError("watch: traces every busy switch port itself; give no trace_edges with it")
            trace_edges = e_list[e_src_sw[e_list]].tolist()
            trace_every_ns = dt
            self._watch_rows = int(min(max(WATCH_BYTES // (16 * max(len(trace_edges), 1)), WATCH_MIN_ROWS),
                                       WATCH_MAX_ROWS))
            trace_max = 2 * self._watch_rows + 2
        self.first_xoff_lo = np.full(ix.n_edges, np.nan)
        self.first_xoff_hi = np.full(ix.n_edges, np.nan)
        # XOFF threshold of every switch's ingress queues while its buffer is empty (the
        # dynamic one shrinks as the buffer fills): what a report draws as the PFC line.
        if not pfc.enabled:
            self.xoff_empty_bytes = np.full(ix.n_nodes, np.nan)
        elif pfc.xoff_bytes is not None:
            self.xoff_empty_bytes = np.where(ix.is_switch, float(pfc.xoff_bytes), np.nan)
        else:
            self.xoff_empty_bytes = np.where(
                ix.is_switch, np.maximum(pfc.alpha * np.maximum(n_buf - n_hroom, 0.0), 2.0 * float(cfg.mtu_bytes)),
                np.nan)
        self.trace_edges = np.asarray(list(trace_edges), dtype=np.int64)
        every = int(max(1, round(trace_every_ns / dt))) if trace_every_ns > 0 and self.trace_edges.shape[0] else 0
        self.ip[K.IP_TRACE_EVERY] = every
        self.ip[K.IP_WD_FORWARD] = int(pfc.watchdog_action == "forward")
        # UEC link layer: credits per switch ingress port (CBFC) and link-level retry
        ll = cfg.link
        self.ip[K.IP_CBFC] = int(ll.cbfc)
        self.ip[K.IP_LLR] = int(ll.llr)
        climit = (np.full(ix.n_edges, float(ll.credit_bytes)) if ll.credit_bytes is not None
                  else 2.0 * e_cap * ix.latency_ns + 4.0 * mtu)
        cr = np.where(e_dst_sw, climit, np.inf) if ll.cbfc else np.zeros(1)
        if ll.cbfc:
            need = np.zeros(ix.n_nodes)
            np.add.at(need, ix.dst[e_dst_sw], climit[e_dst_sw])
            over = np.flatnonzero(ix.is_switch & (need > n_buf))
            if over.shape[0]:
                node = int(over[0])
                raise ConfigError(
                    f"cbfc: {cfg.buffer.size_bytes:.0f} B per switch cannot back the credit of "
                    f"{ix.node_ids[node]} ({need[node]:.0f} B for its ports); give a larger --buffer"
                )
        crq = np.zeros((L, ix.n_edges)) if ll.cbfc else np.zeros((1, 1))
        self.e_down = np.zeros(ix.n_edges, np.int8)  # links taken down during the run (fail_link)
        # REPS: each flow's segments in hop order (its recycling round walks them both ways)
        self.ip[K.IP_REPS] = int(scheme.startswith("reps"))
        self.ip[K.IP_AR] = int(scheme == "ar")
        if scheme.startswith("reps") or scheme == "ar":
            lv = segment_levels(segs.ingress, segs.ch_ptr, segs.ch_idx)
            lo_idx = np.lexsort((lv, segs.flow)).astype(np.int64)
        else:
            lo_idx = np.zeros(1, np.int64)
        n_rq = segs.n if scheme.startswith("reps") else 1
        # DCQCN is integrated every ~1 us (a tenth of its fastest time constant when shorter):
        # its rates change on 4-50 us scales, the queues it reads on the step's scale.
        self.ip[K.IP_CC_EVERY] = max(1, math.floor(min(CC_DT_NS, 0.1 * p.tau_ns) / dt))
        self.fp = np.zeros(K.N_FP)
        ecn = cfg.ecn
        # NSCC: reacts per acknowledgement (every step here); constants scaled to the fabric.
        # EQDS runs on the same trimming switches (their side of NsccConfig), pulling per step.
        routed = np.diff(table.indptr) > 0
        base_rtt = 2.0 * lat_ns + sf_ns + mtu / np.maximum(f_line, 1e-12)
        self.nscc: NS.NsccDerived | None = None
        if cfg.cc in ("nscc", "eqds"):
            self.ip[K.IP_CC_EVERY] = 1
            net_rtt = float(base_rtt[routed].max()) if routed.any() else 2.0 * DEFAULT_DT_NS
            link = float(f_line[routed].max()) if routed.any() else 12.5
            self.nscc = NS.derive(cfg.nscc, network_rtt_ns=net_rtt, link_bytes_per_ns=link, mtu=mtu)
            if self.nscc.kmin_bytes is not None and self.nscc.kmax_bytes is not None:
                from fabricscope.sim.transport.config import EcnConfig

                ecn = EcnConfig(self.nscc.kmin_bytes, self.nscc.kmax_bytes, 1.0)
        nfp = self.nscc.params if self.nscc is not None else np.zeros(NS.N_NP)
        nst = (NS.init_state(base_rtt, f_line, cfg.nscc.max_window_bdp, mtu) if self.nscc is not None
               else np.zeros((1, NS.N_NS)))
        wire = eng.size.copy()  # bytes on the wire: UEC adds a header per MSS under NSCC / EQDS
        if self.nscc is not None and cfg.nscc.header_bytes > 0:
            mss = mtu - cfg.nscc.header_bytes
            wire = wire + np.ceil(wire / mss) * cfg.nscc.header_bytes
        # EQDS: each receiver NIC's pull pacer and every flow's speculative credit
        self.eqds_wmax = (cfg.eqds.max_window_bdp * self.nscc.network_bdp_bytes
                          if self.nscc is not None and cfg.cc == "eqds" else 0.0)
        rx_rate = nic_in * cfg.eqds.pull_rate if cfg.cc == "eqds" else np.zeros(1)
        est = EQ.init_state(wire, self.eqds_wmax, cfg.eqds) if cfg.cc == "eqds" else np.zeros((1, EQ.N_EQ))
        rx_scr = np.zeros((3, ix.n_nodes)) if cfg.cc == "eqds" else np.zeros((3, 1))
        self.ecn = ecn
        self.fp[[K.FP_DT, K.FP_KMIN, K.FP_KMAX, K.FP_PMAX, K.FP_BUF_ALPHA, K.FP_PFC_ALPHA, K.FP_XOFF,
                 K.FP_XON_DELTA, K.FP_MTU, K.FP_TAU, K.FP_TAU_A, K.FP_TIMER, K.FP_BC, K.FP_F, K.FP_RAI,
                 K.FP_G, K.FP_RMIN, K.FP_NIC_Q, K.FP_ETA, K.FP_WAI, K.FP_MAX_STAGE, K.FP_EQ_WMAX,
                 K.FP_AR_TAU, K.FP_AR_GAIN]] = [
            dt, ecn.kmin_bytes, ecn.kmax_bytes, ecn.pmax, cfg.buffer.alpha, pfc.alpha,
            pfc.xoff_bytes or 0.0, xon, mtu, p.tau_ns, p.tau_alpha_ns, p.timer_ns, p.byte_counter,
            p.fast_recovery, p.rai_bps / 8e9, p.g, p.min_rate_bps / 8e9, 2.0 * mtu,
            cfg.hpcc.eta, cfg.hpcc.wai_bytes, cfg.hpcc.max_stage, self.eqds_wmax,
            AR_TAU_NS, min(1.0, dt / AR_REACT_NS)]
        ns, ne = segs.n, ix.n_edges
        tm = trace_max if every else 1
        self._static = (
            segs.flow, segs.edge, segs.ingress, segs.weight, segs.last, segs.ch_ptr, segs.ch_idx,
            segs.ch_frac, segs.eptr, segs.fptr, segs.fidx, segs.f0ptr, segs.f0idx,
            e_list, e_cap, e_delay, ix.src.astype(np.int64), ix.dst.astype(np.int64), e_src_sw, e_dst_sw, e_stuck,
            n_buf, n_hroom,
            wire, f_line, ready, eng.gap.astype(np.float64), ndeps, eng.kid_ptr, eng.kid_idx,
            rtt_steps, tail + sf_ns, lat_ns.astype(np.float64),
        )
        self.clock = np.zeros(2)
        self.start_step = np.zeros(n, np.int64)
        self.qd_acc = np.zeros(n)
        self.rc = np.zeros(n)
        self.delivered = np.zeros(n)
        self._mutable = (
            self.clock, np.zeros(ns), np.zeros((L, ns)), np.zeros(ne), np.zeros(ne), np.zeros(ix.n_nodes),
            np.zeros((L, ne), np.int8), np.zeros(ne, np.int8), np.zeros(ne, np.int64),
            np.full(ne, -1, np.int64),
            self.state, self.rc, np.zeros(n), np.ones(n), np.zeros(n), self.delivered, np.zeros(n),
            self.t_start, self.t_arrive, self.t_fct, self.start_step,
            np.zeros((lcc, n)), np.zeros((lcc, n)), self.qd_acc, np.full(n, -np.inf), np.zeros(ne), np.zeros(ne), np.zeros(ne), np.zeros(ne),
            np.full(n, -1.0), nst, nfp, np.zeros((2, lcc, n)) if cfg.cc == "nscc" else np.zeros((2, 1, 1)),
            np.zeros(ne),
            eng.dst.astype(np.int64), rx_rate, est, rx_scr, e_fer, cr, crq, self.e_down,
            lo_idx, np.zeros(n_rq), np.zeros(n_rq, np.bool_),
        )
        self.maxq, self.qsum, self.drop, self.mark = (np.zeros(ne) for _ in range(4))
        self.xoff, self.wd = np.zeros(ne, np.int64), np.zeros(ne, np.int64)
        self.paused, self.served, self.trimmed, self.llr = np.zeros(ne), np.zeros(ne), np.zeros(ne), np.zeros(ne)
        self.trace_t = np.zeros(tm)
        self.trace_buf = np.zeros((tm, max(self.trace_edges.shape[0], 1)))
        self.trace_n = np.zeros(1, np.int64)
        self._stats = (self.maxq, self.qsum, self.drop, self.mark, self.xoff, self.paused, self.wd, self.served,
                       self.trimmed, self.llr,
                       self.trace_edges if self.trace_edges.shape[0] else np.zeros(1, np.int64),
                       self.trace_buf, self.trace_t, self.trace_n)
        self.n_done = int((self.state >= 2).sum())
        self._order: IntArray | None = None

    def fail_link(self, subject: str) -> IntArray:
        """Take a link down now: a cable ``a|b`` (both directions) or one direction ``a->b``.
        Its queues and whatever reaches it from now on are lost (silently: a UEC sender
        learns it at its timeout); the routes stay until :meth:`reroute` moves them."""
        edges = np.asarray(_edge_ids_of(self.fabric, subject, "fail_link"), dtype=np.int64)
        self.e_down[edges] = 1
        return edges

    def flows_through(self, edges: IntArray, *, min_share: float = 1e-6) -> npt.NDArray[np.bool_]:
        """Flows that send more than ``min_share`` of their bytes over any of ``edges``."""
        segs = self.segs
        on = np.isin(segs.edge, edges) & (segs.weight > min_share)
        mask = np.zeros(self.state.shape[0], dtype=bool)
        mask[segs.flow[on]] = True
        return mask

    def reroute(self, *, local: bool, pick: bool = False, flows: npt.NDArray[np.bool_] | None = None,
                salt: int = 0) -> int:
        """Move running flows off the links that are down (:mod:`~fabricscope.sim.transport.reroute`):
        ``local`` only where the switch's own port failed, else at the first split upstream
        with a live way; ``pick`` one live next hop per flow (ECMP re-hash) or spread over
        them all (spraying). Returns how many splits changed."""
        segs = self.segs
        if self._order is None:
            lv = segment_levels(segs.ingress, segs.ch_ptr, segs.ch_idx)
            self._order = np.argsort(lv, kind="stable").astype(np.int64)
        mask = np.ones(self.state.shape[0], dtype=bool) if flows is None else flows
        return reroute(s_flow=segs.flow, s_edge=segs.edge, s_in=segs.ingress, s_w=segs.weight, s_last=segs.last,
                       ch_ptr=segs.ch_ptr, ch_idx=segs.ch_idx, ch_frac=segs.ch_frac, order=self._order,
                       e_down=self.e_down, flow_mask=mask, local=local, pick=pick, salt=salt)

    def _block(self, idx: IntArray) -> None:
        """Flows depending (transitively) on an unroutable one never start: state 4."""
        eng = self.eng
        stack = [int(i) for i in idx]
        while stack:
            j = stack.pop()
            for c in eng.kid_idx[eng.kid_ptr[j]:eng.kid_ptr[j + 1]].tolist():
                if self.state[c] == 0:
                    self.state[c] = 4
                    stack.append(c)

    @property
    def now_ns(self) -> float:
        return float(self.clock[0])

    @property
    def finished(self) -> bool:
        return self.n_done >= self.state.shape[0]

    def advance_to(self, t_ns: float, progress: Progress | None = None) -> bool:
        """Advance the simulated clock to ``t_ns`` (or until every flow is done); True if done."""
        n = self.state.shape[0]
        while not self.finished and self.clock[0] < t_ns - 1e-9:
            steps = int(min(CHUNK_STEPS, math.ceil((t_ns - self.clock[0]) / self.dt)))
            if self.watch:
                steps = self._watch_steps(steps)
            self.ip[K.IP_STEPS] = max(steps, 1)
            before = float(self.clock[1])
            t_before = float(self.clock[0])
            self.n_done = int(K.advance(self.ip, self.fp, *self._static, *self._mutable, *self._stats))
            if self.watch:
                self._watch_after(t_before)
            if progress is not None:
                progress(self.n_done, n)
            if float(self.clock[1]) - before < steps and not self.finished:
                break  # nothing left that can run (the rest is blocked)
        return self.finished

    def _watch_steps(self, steps: int) -> int:
        """A watched run's next chunk: short enough to time a first pause to the resolution
        and to leave trace rows for every sample it takes."""
        steps = min(steps, max(1, int(float(self.clock[1]) * WATCH_RESOLUTION)))
        every = int(self.ip[K.IP_TRACE_EVERY])
        if every > 0:
            room = self.trace_buf.shape[0] - int(self.trace_n[0]) - 1
            steps = min(steps, max(room, 1) * every)
        return max(steps, 1)

    def _watch_after(self, t_before: float) -> None:
        """After a watched chunk: time the links that sent their first XOFF in it, and halve
        the trace (max of row pairs, doubled interval) while it holds more than R rows."""
        new = np.isnan(self.first_xoff_lo) & (self.xoff > 0)
        if new.any():
            self.first_xoff_lo[new] = t_before
            self.first_xoff_hi[new] = float(self.clock[0])
        n = int(self.trace_n[0])
        while n > self._watch_rows and self.ip[K.IP_TRACE_EVERY] > 0:
            m = n // 2
            merged = np.maximum(self.trace_buf[0:2 * m:2], self.trace_buf[1:2 * m:2])
            times = self.trace_t[0:2 * m:2].copy()
            if n % 2:
                merged = np.vstack([merged, self.trace_buf[n - 1:n]])
                times = np.append(times, self.trace_t[n - 1])
            n = merged.shape[0]
            self.trace_buf[:n] = merged
            self.trace_t[:n] = times
            self.ip[K.IP_TRACE_EVERY] *= 2
        self.trace_n[0] = n

    def stats(self) -> TransportStats:
        """The counters so far."""
        ix = self.fabric.index
        steps = int(self.clock[1])
        return TransportStats(
            edge_ids=tuple(ix.edge_id(e) for e in range(ix.n_edges)),
            max_queue_bytes=self.maxq.copy(),
            mean_queue_bytes=self.qsum / max(steps, 1),
            drop_bytes=self.drop.copy(),
            marked_packets=self.mark / self.config.mtu_bytes,
            pause_frames=self.xoff.copy(),
            paused_ns=self.paused * self.dt,
            watchdog_events=self.wd.copy(),
            served_bytes=self.served.copy(),
            trimmed_bytes=self.trimmed.copy(),
            llr_retried_frames=self.llr / self.config.mtu_bytes,
            sim_time_ns=float(self.clock[0]),
            dt_ns=self.dt,
            steps=steps,
        )

    def result(self) -> TransportResult:
        """Per-flow times (NaN for flows not finished) and the counters."""
        eng, wl = self.eng, self.workload
        st = self.stats()
        done = self.state == 2
        fct = np.where(done, self.t_fct, np.nan)
        end = np.where(done, self.t_arrive, np.nan)
        start = np.where(np.isfinite(self.t_start), self.t_start, np.nan)
        fluid = end - start - self.lat_ns - self.sf_ns  # last byte left the sender
        ids = np.array([f.id for f in wl.flows], dtype=np.int64)
        meta: dict[str, object] = {"lb": self.scheme, "cc": self.config.cc,
                                   "dcqcn": self.config.dcqcn.name if self.config.cc == "dcqcn" else "-",
                                   "pfc": self.config.pfc.enabled, "dt_ns": self.dt,
                                   "sim_time_us": round(st.sim_time_ns / 1e3, 3)}
        if self.nscc is not None and self.config.cc == "nscc":
            meta["nscc_target_qdelay_us"] = round(self.nscc.target_qdelay_ns / 1e3, 3)
            meta["nscc_network_rtt_us"] = round(self.nscc.network_rtt_ns / 1e3, 3)
            meta["nscc_ecn_kmin_kmax_kb"] = f"{self.ecn.kmin_bytes / 1e3:.1f},{self.ecn.kmax_bytes / 1e3:.1f}"
        if self.nscc is not None and self.config.cc == "eqds":
            meta["eqds_pull_rate"] = self.config.eqds.pull_rate
            meta["eqds_max_window_kb"] = round(self.eqds_wmax / 1e3, 1)
            meta["eqds_network_rtt_us"] = round(self.nscc.network_rtt_ns / 1e3, 3)
        if self.nscc is not None:
            meta["trimming"] = self.config.nscc.trimming
        if self.config.link.cbfc:
            meta["cbfc"] = True
        if self.config.link.llr:
            meta["llr"] = True
        meta.update(st.totals())
        unfinished = int(((self.state == 0) | (self.state == 1)).sum())
        meta["unfinished"] = unfinished
        ix = self.fabric.index
        sim = SimResult(
            scheme=self.scheme, fabric_name=self.fabric.name, workload_name=wl.name, flow_ids=ids,
            src=tuple(f.src for f in wl.flows), dst=tuple(f.dst for f in wl.flows),
            tags=tuple(f.tag for f in wl.flows), size_bytes=eng.size.copy(), start_ns=start,
            fluid_ns=np.where(done, fluid, np.nan), end_ns=end, fct_ns=fct,
            unroutable=tuple(int(i) for i in ids[self.state == 3]),
            blocked=tuple(int(i) for i in ids[self.state == 4]),
            edge_ids=tuple(ix.edge_id(e) for e in range(ix.n_edges)), edge_tier=edge_tiers(self.fabric),
            utilization=None, collective=wl.collective, n_ranks=wl.n_ranks,
            collective_bytes=wl.size_bytes, events=st.steps, solves=0,
            wall_s=time.perf_counter() - self.t0_wall, meta=meta,
        )
        k = int(self.trace_n[0])
        life = np.where(done, end - start, np.maximum(self.now_ns - np.nan_to_num(start, nan=self.now_ns), 1e-9))
        watch = None
        if self.watch:
            watched = self.ecn if self.config.cc in ("dcqcn", "nscc") else None  # ECN drives these senders
            segs = self.segs
            inner = segs.ingress >= 0
            feeds = np.unique(np.stack([segs.ingress[inner], segs.edge[inner]], axis=1).astype(np.int64), axis=0)
            watch = TransportWatch(
                first_pause_ns=self.first_xoff_lo.copy(),
                first_pause_window_ns=self.first_xoff_hi - self.first_xoff_lo,
                xoff_empty_bytes=self.xoff_empty_bytes.copy(),
                ecn_kmin_bytes=None if watched is None else float(watched.kmin_bytes),
                ecn_kmax_bytes=None if watched is None else float(watched.kmax_bytes),
                trace_every_ns=float(self.ip[K.IP_TRACE_EVERY]) * self.dt,
                max_rows=2 * self._watch_rows + 2,
                feeds=feeds.reshape(-1, 2),
            )
        return TransportResult(
            sim=sim, stats=st, trace_edges=self.trace_edges.copy(),
            queue_trace_t_ns=self.trace_t[:k].copy(),
            queue_trace_bytes=self.trace_buf[:k, : self.trace_edges.shape[0]].copy(),
            queueing_delay_ns=self.qd_acc / np.maximum(life, 1e-9),
            unfinished=unfinished,
            watch=watch,
        )


def simulate_transport(
    fabric: Fabric,
    workload: Workload,
    *,
    config: TransportConfig | None = None,
    lb: str = "ecmp",
    hash_config: HashConfig | None = None,
    faults: FaultSchedule | Iterable[Fault] = (),
    seed: int = 0,
    stuck_nics: Sequence[str] = (),
    paths: PathTable | None = None,
    trace_edges: Sequence[int] = (),
    trace_every_ns: float = 0.0,
    progress: Progress | None = None,
    watch: bool = False,
) -> TransportResult:
    """Run ``workload`` on ``fabric`` through the fluid transport engine until every flow is
    done or ``config.max_time_ns`` of simulated time passed (unfinished flows: NaN times,
    counted in ``unfinished``). See :class:`FluidTransport` for the parameters."""
    sim = FluidTransport(
        fabric, workload, config=config, lb=lb, hash_config=hash_config, faults=faults, seed=seed,
        stuck_nics=stuck_nics, paths=paths, trace_edges=trace_edges, trace_every_ns=trace_every_ns,
        watch=watch,
    )
    sim.advance_to(sim.config.max_time_ns, progress=progress)
    return sim.result()
