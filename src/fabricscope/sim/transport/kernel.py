"""The compiled time-stepped loop of the fluid transport engine (no I/O, no Python objects).

One step of ``dt`` does, in order: activate due flows; land the bytes whose link delay ended
in their segment's egress queue (admission by the shared buffer: dynamic threshold when
lossy, only a full buffer when PFC is on); let senders inject at their rate; serve every
egress queue at its link rate unless PFC paused it (FIFO approximated by serving every
segment in proportion to its bytes), marking ECN in proportion to the RED probability;
update the PFC requests of every ingress queue (they reach the upstream sender one link
delay later) and the watchdog; finish flows whose last byte arrived; integrate the sender CC
(DCQCN, HPCC or NSCC); with EQDS, let every receiver grant credit instead.
The physics and its limits are in docs/design/sim-transport.md.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from fabricscope.sim.transport.dcqcn import dcqcn_derivatives
from fabricscope.sim.transport.eqds import pull, sender_credit
from fabricscope.sim.transport.nscc import (
    NP_HDR_CAP,
    NP_MTU,
    NP_PORT_CAP,
    NP_RTO,
    NP_TRIM_HDR,
    NS_NK_AT,
    NS_NK_PEND,
    NS_RTO_AT,
    NS_RTO_PEND,
    NS_W,
    nscc_update,
)
from fabricscope.sim.transport.reroute import propagate_weights

# ip: integer parameters
(IP_L, IP_LCC, IP_CC, IP_PFC, IP_WD_DETECT, IP_WD_RESTORE, IP_STEPS, IP_TRACE_EVERY, IP_WD_FORWARD,
 IP_CC_EVERY, IP_CBFC, IP_LLR, IP_REPS, IP_AR) = range(14)
# fp: float parameters
(FP_DT, FP_KMIN, FP_KMAX, FP_PMAX, FP_BUF_ALPHA, FP_PFC_ALPHA, FP_XOFF, FP_XON_DELTA, FP_MTU,
 FP_TAU, FP_TAU_A, FP_TIMER, FP_BC, FP_F, FP_RAI, FP_G, FP_RMIN, FP_NIC_Q,
 FP_ETA, FP_WAI, FP_MAX_STAGE, FP_EQ_WMAX, FP_AR_TAU, FP_AR_GAIN) = range(24)
N_IP, N_FP = 14, 24
CC_NONE, CC_DCQCN, CC_HPCC, CC_NSCC, CC_EQDS = 0, 1, 2, 3, 4


@numba.njit(cache=True, inline="always")
def _occupancy(e, q, e_src_sw, qm, pe, st_qsum, st_maxq, kmin, kmax, pmax):  # type: ignore[no-untyped-def]
    """Record the occupancy of egress ``e`` this step and its RED marking probability."""
    if not e_src_sw[e]:  # a NIC's send queue is host memory: not a switch buffer, no ECN
        return
    q = max(q, 0.0)
    qm[e] = q
    st_qsum[e] += q
    if q > st_maxq[e]:
        st_maxq[e] = q
    if q > kmax:
        pe[e] = 1.0
    elif q > kmin:
        pe[e] = pmax * (q - kmin) / max(kmax - kmin, 1e-12)


@numba.njit(cache=True, inline="always")
def _silent_loss(f, x, t, lossy_cc, rto, lost, nst):  # type: ignore[no-untyped-def]
    """``x`` bytes of flow ``f`` vanish (a link that went down, a corrupted frame): a UEC
    sender learns it at its timeout, others re-send at once (RoCE go-back-N is not modelled)."""
    if lossy_cc:
        if nst[f, NS_RTO_PEND] <= 0.0:
            nst[f, NS_RTO_AT] = t + rto
        nst[f, NS_RTO_PEND] += x
    else:
        lost[f] += x


@numba.njit(cache=True)
def _reps(f, fptr, lo_idx, s_edge, s_in, s_w, s_last, ch_ptr, ch_idx, ch_frac, pe, e_down, rq, rdead):  # type: ignore[no-untyped-def]
    """One round of REPS (Bonato et al., "REPS: Recycled Entropy Packet Spraying for Adaptive
    Load Balancing and Failure Mitigation", 2024) for flow ``f``, in expectation: an entropy is
    re-used when its acknowledgement came back unmarked, the rest of the packets take random
    entropies. At every split of the flow, with ``x_k`` the share of next hop ``k`` and ``q_k``
    the probability that a packet sent that way is marked or lost (its subtree, bottom-up):
    ``x_k <- x_k (1 - q_k) + (1 - U) / n``, ``U = sum x_k (1 - q_k)``, the random part spread
    over the ``n`` next hops that are not down (REPS freezes exploration of failed ones); the
    sender's split over its NIC's ports (planes) too. Then the flow's segment weights follow,
    top-down."""
    a, b = fptr[f], fptr[f + 1]
    for i in range(b - 1, a - 1, -1):  # bottom-up: mark-or-loss probability of each subtree
        s = lo_idx[i]
        e = s_edge[s]
        if e_down[e]:
            rq[s] = 1.0
            rdead[s] = True
            continue
        if s_last[s] or ch_ptr[s + 1] == ch_ptr[s]:
            rq[s] = pe[e]
            rdead[s] = False
            continue
        tot = 0.0
        sub = 0.0
        alive = False
        for m in range(ch_ptr[s], ch_ptr[s + 1]):
            c = ch_idx[m]
            sub += ch_frac[m] * rq[c]
            tot += ch_frac[m]
            if not rdead[c]:
                alive = True
        rq[s] = 1.0 - (1.0 - pe[e]) * (1.0 - (sub / tot if tot > 0.0 else 1.0))
        rdead[s] = not alive
    changed = False
    # the sender's own split over its NIC's ports (planes of a multi-plane fabric): the
    # weights of its first segments, by the same law
    tot_w = 0.0
    u = 0.0
    n_roots = 0
    n_alive = 0
    for i in range(a, b):
        s = lo_idx[i]
        if s_in[s] < 0:
            n_roots += 1
            tot_w += s_w[s]
            u += s_w[s] * (1.0 - rq[s])
            if not rdead[s]:
                n_alive += 1
    if n_roots >= 2 and n_alive > 0 and u < tot_w * (1.0 - 1e-12):
        for i in range(a, b):
            s = lo_idx[i]
            if s_in[s] < 0:
                s_w[s] = s_w[s] * (1.0 - rq[s]) + ((tot_w - u) / n_alive if not rdead[s] else 0.0)
        changed = True
    for i in range(a, b):
        s = lo_idx[i]
        k0, k1 = ch_ptr[s], ch_ptr[s + 1]
        if k1 - k0 < 2 or rdead[s]:
            continue
        u = 0.0
        n_alive = 0
        for m in range(k0, k1):
            u += ch_frac[m] * (1.0 - rq[ch_idx[m]])
            if not rdead[ch_idx[m]]:
                n_alive += 1
        if u >= 1.0 - 1e-12:
            continue  # nothing marked: every entropy is re-used as it is
        for m in range(k0, k1):
            c = ch_idx[m]
            ch_frac[m] = ch_frac[m] * (1.0 - rq[c]) + ((1.0 - u) / n_alive if not rdead[c] else 0.0)
        changed = True
    if changed:
        propagate_weights(lo_idx, a, b, s_in, s_w, ch_ptr, ch_idx, ch_frac)


@numba.njit(cache=True)
def _ar(f, fptr, lo_idx, s_edge, s_in, s_w, ch_ptr, ch_idx, ch_frac, e_down, arw, gain):  # type: ignore[no-untyped-def]
    """Switch adaptive routing on local queues for flow ``f``, in a fluid: at every split (a
    switch choosing among its egress ports toward the destination) each live port's share
    moves by ``gain`` toward ``arw[e] / sum(arw)``, ``arw[e] = exp(-d_e / tau)`` with ``d_e``
    the port's own queueing delay (occupancy / line rate). Every packet going to the port
    whose queue drains soonest (join the shortest queue, as DRILL does per packet: Ghorbani et
    al., "Drill: Micro Load Balancing for Low-latency Data Center Networks", SIGCOMM'17) puts
    the ports' delays level; ``tau`` is how close. Ports that are down get nothing."""
    a, b = fptr[f], fptr[f + 1]
    changed = False
    for i in range(a, b):
        s = lo_idx[i]
        k0, k1 = ch_ptr[s], ch_ptr[s + 1]
        if k1 - k0 < 2:
            continue
        tot = 0.0
        for m in range(k0, k1):
            e = s_edge[ch_idx[m]]
            if e_down[e] == 0:
                tot += arw[e]
        if tot <= 0.0:
            continue
        for m in range(k0, k1):
            e = s_edge[ch_idx[m]]
            target = arw[e] / tot if e_down[e] == 0 else 0.0
            ch_frac[m] += gain * (target - ch_frac[m])
        changed = True
    if changed:
        propagate_weights(lo_idx, a, b, s_in, s_w, ch_ptr, ch_idx, ch_frac)


@numba.njit(cache=True)
def _hpcc(f, step, lcc, cc_every, dt_cc, fp, fptr, fidx, s_edge, e_src_sw, e_cap, qm, txr,  # type: ignore[no-untyped-def]
          f_line, f_rtt_steps, start_step, rc, rt, alpha, stage, hist_p, dt):
    """HPCC (Li et al., SIGCOMM'19, Algorithm 1) on the fluid: INT gives every switch hop's
    queue and tx rate one base RTT later; U is the most utilized hop, smoothed with weight
    tau/T; the window is cut to Wc/(U/eta) + W_AI when U >= eta (or after maxStage additive
    steps), else grows by W_AI; Wc follows once per RTT. ``rt`` holds Wc, ``alpha`` U."""
    T = max(f_rtt_steps[f], 1) * dt
    if stage[f] < 0:  # first look: W = Wc = one bandwidth-delay product
        stage[f] = 0.0
        rt[f] = f_line[f] * T
        alpha[f] = 0.0
    u = 0.0
    for m in range(fptr[f], fptr[f + 1]):
        e = s_edge[fidx[m]]
        if e_src_sw[e]:
            x = qm[e] / (e_cap[e] * T) + txr[e] / e_cap[e]
            if x > u:
                u = x
    hist_p[step % lcc, f] = u
    age = step - start_step[f]
    if age % cc_every != 0:
        return
    d = min(f_rtt_steps[f], lcc - 1)
    ud = hist_p[(step - d) % lcc, f] if age >= d else 0.0
    alpha[f] += min(dt_cc / T, 1.0) * (ud - alpha[f])
    eta, wai, max_stage = fp[FP_ETA], fp[FP_WAI], fp[FP_MAX_STAGE]
    update = age % max(f_rtt_steps[f], 1) < cc_every  # Wc moves once per RTT
    if alpha[f] >= eta or stage[f] >= max_stage:
        w = rt[f] / max(alpha[f] / eta, 1e-9) + wai
        if update:
            stage[f] = 0.0
            rt[f] = w
    else:
        w = rt[f] + wai
        if update:
            stage[f] += 1.0
            rt[f] = w
    rc[f] = min(max(w / T, 1e-6), f_line[f])


@numba.njit(cache=True)
def _nscc_flow(f, step, t, lcc, cc_every, fptr, fidx, s_edge, s_w, e_src_sw, e_cap, qm,  # type: ignore[no-untyped-def]
               f_rtt_steps, start_step, sent, delivered, lost, lg, hist_p, hist_r, nhist, nst, nfp):
    """NSCC (:mod:`fabricscope.sim.transport.nscc`) on the fluid: record this step's switch
    queueing delay of the flow's path, its ECN fraction and its delivered bytes; the
    acknowledgements of what was delivered half a base RTT ago (one way) reach the sender
    now, carrying the delay and marks of that moment."""
    dsw = 0.0
    for m in range(fptr[f], fptr[f + 1]):
        s = fidx[m]
        e = s_edge[s]
        if e_src_sw[e]:
            dsw += s_w[s] * qm[e] / e_cap[e]
    h = step % lcc
    hist_p[h, f] = dsw
    nhist[0, h, f] = -math.expm1(lg)
    nhist[1, h, f] = lost[f]
    hist_r[h, f] = delivered[f]
    age = step - start_step[f]
    if age % cc_every != 0:
        return
    d1 = max(min(f_rtt_steps[f] // 2, lcc - 1), 1)
    if age < d1:
        return
    k = (step - d1) % lcc
    acked = hist_r[k, f]
    nacked = nhist[1, k, f]
    inflight = max(sent[f] - nacked - acked, 0.0)
    nscc_update(nst, f, t, acked, nacked, hist_p[k, f], nhist[0, k, f], inflight, nfp)


@numba.njit(cache=True)
def advance(  # type: ignore[no-untyped-def]
    ip, fp,
    s_flow, s_edge, s_in, s_w, s_last, ch_ptr, ch_idx, ch_frac, eptr, fptr, fidx, f0ptr, f0idx,
    e_list, e_cap, e_delay, e_src, e_dst, e_src_sw, e_dst_sw, e_stuck, n_buf, n_hroom,
    f_size, f_line, f_ready, f_gap, f_ndeps, kid_ptr, kid_idx, f_rtt_steps, f_tail_ns, f_ack_ns,
    clock, q, arr, qe, ing, used, pr, req, wd_cnt, storm_until,
    f_state, rc, rt, alpha, sent, delivered, lost, t_start, t_arrive, t_fct, start_step,
    hist_p, hist_r, qd_acc, f_dep_ready, pe, qm, ain, txr, stage, nst, nfp, nhist, trim_q,
    f_rx, rx_rate, est, rx_scr, e_fer, cr, crq, e_down, lo_idx, rq, rdead,
    st_maxq, st_qsum, st_drop, st_mark, st_xoff, st_paused, st_wd, st_served, st_trim, st_llr,
    trace_e, trace_buf, trace_t, trace_n,
):
    L = ip[IP_L]
    lcc = ip[IP_LCC]
    cc = ip[IP_CC]
    pfc = ip[IP_PFC] != 0
    wd_detect = ip[IP_WD_DETECT]
    wd_restore = ip[IP_WD_RESTORE]
    n_steps = ip[IP_STEPS]
    trace_every = ip[IP_TRACE_EVERY]
    wd_forward = ip[IP_WD_FORWARD] != 0  # watchdog action: forward (ignore pauses) or drop
    dt = fp[FP_DT]
    kmin, kmax, pmax = fp[FP_KMIN], fp[FP_KMAX], fp[FP_PMAX]
    buf_alpha, pfc_alpha, xoff_static, xon_delta = fp[FP_BUF_ALPHA], fp[FP_PFC_ALPHA], fp[FP_XOFF], fp[FP_XON_DELTA]
    mtu = fp[FP_MTU]
    nic_q = fp[FP_NIC_Q]
    n_f = f_size.shape[0]
    n_e = e_cap.shape[0]
    t = clock[0]
    step = np.int64(clock[1])
    done = 0
    for f in range(n_f):
        if f_state[f] >= 2:
            done += 1
    rescan = True
    n_active = 0
    next_ready = np.inf
    cc_every = ip[IP_CC_EVERY]
    dt_cc = dt * cc_every
    port_cap = nfp[NP_PORT_CAP] if not pfc else 0.0  # per-port queue limit (lossy NSCC runs)
    trim_frac = nfp[NP_TRIM_HDR] / nfp[NP_MTU] if nfp[NP_MTU] > 0.0 and not pfc else 0.0
    hdr_cap = nfp[NP_HDR_CAP]
    rto = nfp[NP_RTO]
    lossy_cc = cc == CC_NSCC or cc == CC_EQDS  # UEC senders: NACKs and timeouts re-send
    cbfc = ip[IP_CBFC] != 0  # credit-based flow control (UEC link layer) instead of PFC
    llr = ip[IP_LLR] != 0  # link-level retry of corrupted frames
    reps = ip[IP_REPS] != 0  # senders recycle the entropies that came back unmarked
    ar = ip[IP_AR] != 0  # switches split by their own queues (adaptive routing)
    ar_tau = fp[FP_AR_TAU]
    ar_gain = fp[FP_AR_GAIN]
    arw = np.ones(n_e if ar else 1)
    eq_wmax = fp[FP_EQ_WMAX]
    in_stamp = np.full(n_e, -1, np.int64)
    adm_stamp = np.full(n_e, -1, np.int64)
    in_tot = np.zeros(n_e)
    adm_frac = np.ones(n_e)
    for _ in range(n_steps):
        if done == n_f:
            break
        slot = step % L
        # ---------------------------------------------------------- activate
        if rescan or t + 1e-9 >= next_ready:  # only when a start time is due or deps changed
            rescan = False
            n_active = 0
            next_ready = np.inf
            for f in range(n_f):
                if f_state[f] == 0 and f_ndeps[f] == 0:
                    if f_ready[f] <= t + 1e-9:
                        f_state[f] = 1
                        t_start[f] = t
                        start_step[f] = step
                        rc[f] = f_line[f]
                        rt[f] = f_line[f]
                        alpha[f] = 1.0
                    elif f_ready[f] < next_ready:
                        next_ready = f_ready[f]
                if f_state[f] == 1:
                    n_active += 1
        if n_active == 0:
            idle = True
            for e in range(n_e):
                if qe[e] > 1e-9:
                    idle = False
                    break
            if idle:
                for k in range(L):  # bytes still on a wire
                    for s in range(q.shape[0]):
                        if arr[k, s] > 1e-9:
                            idle = False
                            break
                    if not idle:
                        break
            if idle:
                if next_ready == np.inf:
                    break  # nothing will ever run again (blocked or finished)
                jump = max(np.int64(math.ceil((next_ready - t) / dt)), np.int64(1))
                t += jump * dt
                step += jump
                for e in range(n_e):
                    for k in range(L):
                        pr[k, e] = req[e]
                rescan = True
                continue
        # ---------------------------------------------------------- arrivals
        # A full queue drops from every arriving segment in proportion to its bytes (tail
        # drop of interleaved packets), not first-come in segment order: pass 1 sums the
        # step's arrivals per egress, pass 2 admits the same fraction of each.
        for s in range(q.shape[0]):
            b = arr[slot, s]
            if b > 0.0:
                e = s_edge[s]
                if in_stamp[e] != step:
                    in_stamp[e] = step
                    in_tot[e] = 0.0
                in_tot[e] += b
        for s in range(q.shape[0]):
            b = arr[slot, s]
            if b <= 0.0:
                continue
            arr[slot, s] = 0.0
            e = s_edge[s]
            f = s_flow[s]
            if step < storm_until[e] and not wd_forward:
                st_drop[e] += b
                lost[f] += b
                continue
            if e_down[e]:  # the link went down: what reaches it is lost
                st_drop[e] += b
                _silent_loss(f, b, t, lossy_cc, rto, lost, nst)
                continue
            adm = b
            if e_src_sw[e]:
                node = e_src[e]
                if adm_stamp[e] != step:  # this egress's admitted fraction for the step
                    adm_stamp[e] = step
                    free = n_buf[node] - used[node]
                    # dynamic threshold with the admitted bytes counted: q + x <= alpha (free - x)
                    allowed = free if pfc else min(free, (buf_alpha * free - qe[e]) / (1.0 + buf_alpha))
                    if port_cap > 0.0:
                        allowed = min(allowed, port_cap - qe[e])
                    adm_frac[e] = min(max(allowed, 0.0) / in_tot[e], 1.0)
                if adm_frac[e] < 1.0:
                    adm = b * adm_frac[e]
                    st_drop[e] += b - adm
                    if trim_frac > 0.0:  # trimmed: the header goes on (NACK) while it fits
                        hdr = (b - adm) * trim_frac
                        fit = min(max(hdr_cap - trim_q[e], 0.0), hdr)
                        trim_q[e] += fit
                        nack = (b - adm) * fit / hdr
                        st_trim[e] += nack
                        wait = trim_q[e] / e_cap[e]  # the header queues behind earlier ones
                        if wait <= dt:
                            lost[f] += nack
                        else:
                            if nst[f, NS_NK_PEND] <= 0.0:
                                nst[f, NS_NK_AT] = t + wait
                            nst[f, NS_NK_PEND] += nack
                        silent = b - adm - nack
                        if silent > 0.0:  # header dropped too: known at the sender's timeout
                            if nst[f, NS_RTO_PEND] <= 0.0:
                                nst[f, NS_RTO_AT] = t + rto
                            nst[f, NS_RTO_PEND] += silent
                    else:
                        lost[f] += b - adm
                used[node] += adm
            q[s] += adm
            qe[e] += adm
            ain[e] += adm
            if s_in[s] >= 0:
                ing[s_in[s]] += adm
        # ---------------------------------------------------------- senders
        for f in range(n_f):
            if f_state[f] != 1:
                continue
            if lossy_cc:
                if nst[f, NS_NK_PEND] > 0.0 and t >= nst[f, NS_NK_AT]:
                    lost[f] += nst[f, NS_NK_PEND]  # the header left the trimming port
                    nst[f, NS_NK_PEND] = 0.0
                if nst[f, NS_RTO_PEND] > 0.0 and t >= nst[f, NS_RTO_AT]:
                    lost[f] += nst[f, NS_RTO_PEND]  # retransmission timeout
                    nst[f, NS_RTO_PEND] = 0.0
            left = f_size[f] + lost[f] - sent[f]
            if left <= 0.0:
                continue
            want = min(rc[f] * dt, left)
            if cc == CC_NSCC:  # window: bytes in flight (sent, not NACKed, not acknowledged) <= W
                d1 = max(min(f_rtt_steps[f] // 2, lcc - 1), 1)
                old = step - start_step[f] >= d1
                k1 = (step - d1) % lcc
                acked = hist_r[k1, f] if old else 0.0
                nacked = nhist[1, k1, f] if old else 0.0  # a loss is known when its NACK is back
                left = f_size[f] + nacked - sent[f]
                if left <= 0.0:
                    continue
                want = min(rc[f] * dt, left, max(nst[f, NS_W] - (sent[f] - nacked - acked), 0.0))
            elif cc == CC_EQDS:  # credit: speculative, then what the receiver granted one way ago
                d1 = max(min(f_rtt_steps[f] // 2, lcc - 1), 1)
                g_arr = hist_r[(step - d1) % lcc, f] if step - start_step[f] >= d1 else 0.0
                want = min(want, max(sender_credit(est, f, sent[f], g_arr), 0.0))
                if want <= 0.0:
                    continue
            given = 0.0
            cap_q = max(nic_q, 2.0 * f_line[f] * dt)  # a QP keeps two steps of data ready
            for m in range(f0ptr[f], f0ptr[f + 1]):
                s = f0idx[m]
                room = cap_q * s_w[s] - q[s]
                if room <= 0.0:
                    continue
                x = min(want * s_w[s], room)
                q[s] += x
                qe[s_edge[s]] += x
                ain[s_edge[s]] += x
                given += x
            sent[f] += given
        # ---------------------------------------------------------- service
        for ei in range(e_list.shape[0]):
            e = e_list[ei]
            pe[e] = 0.0
            qm[e] = 0.0
            a_in = ain[e]
            ain[e] = 0.0
            txr[e] = 0.0
            budget = e_cap[e] * dt
            if trim_q[e] > 0.0:  # trimmed headers go out first (high priority)
                h_out = min(trim_q[e], budget)
                trim_q[e] -= h_out
                budget -= h_out
            if qe[e] <= 0.0:
                wd_cnt[e] = 0
                continue
            stormed = step < storm_until[e]
            paused = pr[slot, e] != 0 and not stormed
            down = e_down[e] != 0
            if down or (stormed and not wd_forward):  # link down, or watchdog "drop": flush the queue
                tot = 0.0
                for s in range(eptr[e], eptr[e + 1]):
                    x = q[s]
                    if x <= 0.0:
                        continue
                    q[s] = 0.0
                    if down:  # nobody tells the sender: its timeout will
                        _silent_loss(s_flow[s], x, t, lossy_cc, rto, lost, nst)
                    else:
                        lost[s_flow[s]] += x
                    if s_in[s] >= 0:
                        ing[s_in[s]] -= x
                        if cbfc:
                            crq[(step + e_delay[s_in[s]]) % L, s_in[s]] += x
                    tot += x
                qe[e] = 0.0
                st_drop[e] += tot
                if e_src_sw[e]:
                    used[e_src[e]] -= tot
                continue
            if paused:
                _occupancy(e, qe[e] - 0.5 * a_in, e_src_sw, qm, pe, st_qsum, st_maxq, kmin, kmax, pmax)
                st_paused[e] += 1
                if wd_detect > 0:
                    wd_cnt[e] += 1
                    if wd_cnt[e] >= wd_detect:
                        storm_until[e] = step + wd_restore
                        st_wd[e] += 1
                        wd_cnt[e] = 0
                continue
            wd_cnt[e] = 0
            if cbfc and e_dst_sw[e]:  # only into the credit the next switch advertised
                budget = min(budget, max(cr[e], 0.0))
            fer = e_fer[e]  # frame error ratio of the link (gray-loss)
            if fer > 0.0 and llr:  # corrupted frames re-sent on the link: its time, not the flow's
                st_llr[e] += budget * fer
                budget *= 1.0 - fer
            frac = min(1.0, budget / qe[e])
            tot = 0.0
            bad = 0.0
            d = (step + e_delay[e]) % L
            for s in range(eptr[e], eptr[e + 1]):
                x = q[s] * frac
                if x <= 0.0:
                    continue
                q[s] -= x
                tot += x
                if s_in[s] >= 0:
                    ing[s_in[s]] -= x
                    if cbfc:
                        crq[(step + e_delay[s_in[s]]) % L, s_in[s]] += x
                if fer > 0.0 and not llr:  # corrupted, dropped by the next hop: re-sent end to end
                    lx = x * fer
                    x -= lx
                    bad += lx
                    _silent_loss(s_flow[s], lx, t, lossy_cc, rto, lost, nst)
                if s_last[s]:
                    delivered[s_flow[s]] += x
                else:
                    for c in range(ch_ptr[s], ch_ptr[s + 1]):
                        arr[d, ch_idx[c]] += x * ch_frac[c]
            if bad > 0.0:
                st_drop[e] += bad
            if cbfc and e_dst_sw[e]:
                cr[e] -= tot - bad  # a corrupted frame's credit is not held (it never arrived)
            # The queue a packet sees, and what is recorded, is the mean occupancy over the
            # step: in a continuous fluid the step's arrivals and departures overlap, so it is
            # the start-of-step queue plus half of (arrivals - departures) (docs: step size).
            _occupancy(e, qe[e] - 0.5 * (a_in + tot), e_src_sw, qm, pe, st_qsum, st_maxq, kmin, kmax, pmax)
            qe[e] = max(qe[e] - tot, 0.0)
            txr[e] = tot / dt
            if e_src_sw[e]:
                used[e_src[e]] = max(used[e_src[e]] - tot, 0.0)
            st_mark[e] += tot * pe[e]
            st_served[e] += tot
        # ---------------------------------------------------------- PFC
        for ei in range(e_list.shape[0]):
            e = e_list[ei]
            if cbfc and crq[slot, e] != 0.0:  # credit returned by the next switch arrives
                cr[e] += crq[slot, e]
                crq[slot, e] = 0.0
            if e_stuck[e]:
                if req[e] == 0:
                    st_xoff[e] += 1
                req[e] = 1
            elif pfc and e_dst_sw[e]:
                node = e_dst[e]
                if xoff_static > 0.0:
                    xoff = xoff_static
                else:
                    xoff = pfc_alpha * max(n_buf[node] - n_hroom[node] - used[node], 0.0)
                    xoff = max(xoff, 2.0 * mtu)
                if req[e] != 0:
                    if ing[e] <= max(xoff - xon_delta, 0.0):
                        req[e] = 0
                elif ing[e] > xoff:
                    req[e] = 1
                    st_xoff[e] += 1
            pr[(step + e_delay[e]) % L, e] = req[e]
        # ---------------------------------------------------------- flows
        t_next = t + dt
        if ar:
            for e in range(n_e):
                arw[e] = math.exp(-qm[e] / max(e_cap[e], 1e-12) / ar_tau)
        for f in range(n_f):
            if f_state[f] != 1:
                continue
            if delivered[f] >= f_size[f] * (1.0 - 1e-9):
                f_state[f] = 2
                done += 1
                n_active -= 1
                if kid_ptr[f + 1] > kid_ptr[f]:
                    rescan = True
                arrive = t_next + f_tail_ns[f]
                t_arrive[f] = arrive
                t_fct[f] = arrive + f_ack_ns[f] - t_start[f]
                for k in range(kid_ptr[f], kid_ptr[f + 1]):
                    c = kid_idx[k]
                    f_ndeps[c] -= 1
                    if arrive > f_dep_ready[c]:
                        f_dep_ready[c] = arrive
                    if f_ndeps[c] == 0:
                        f_ready[c] = max(f_ready[c], f_dep_ready[c]) + f_gap[c]
                continue
            lg = 0.0
            qd = 0.0
            for m in range(fptr[f], fptr[f + 1]):
                s = fidx[m]
                e = s_edge[s]
                if pe[e] > 0.0:
                    lg += s_w[s] * math.log1p(-min(pe[e], 1.0 - 1e-12))
                qd += s_w[s] * qe[e] / e_cap[e]
            qd_acc[f] += qd * dt
            if reps and (step - start_step[f]) % max(f_rtt_steps[f], 1) == 0:
                _reps(f, fptr, lo_idx, s_edge, s_in, s_w, s_last, ch_ptr, ch_idx, ch_frac, pe, e_down, rq, rdead)
            elif ar:
                _ar(f, fptr, lo_idx, s_edge, s_in, s_w, ch_ptr, ch_idx, ch_frac, e_down, arw, ar_gain)
            if cc == CC_NONE or cc == CC_EQDS:  # noqa: SIM109 (plain compares in numba)
                continue
            if cc == CC_NSCC:
                _nscc_flow(f, step, t, lcc, cc_every, fptr, fidx, s_edge, s_w, e_src_sw, e_cap, qm,
                           f_rtt_steps, start_step, sent, delivered, lost, lg, hist_p, hist_r, nhist, nst, nfp)
                continue
            if cc == CC_HPCC:
                _hpcc(f, step, lcc, cc_every, dt_cc, fp, fptr, fidx, s_edge, e_src_sw, e_cap, qm, txr,
                      f_line, f_rtt_steps, start_step, rc, rt, alpha, stage, hist_p, dt)
                continue
            h = step % lcc
            hist_p[h, f] = -math.expm1(lg)
            hist_r[h, f] = rc[f]
            if (step - start_step[f]) % cc_every != 0:
                continue
            # Marks are taken at dequeue (as DCQCN deployments configure switches), so the
            # signal travels the rest of the path and back as a CNP: one base RTT, whatever
            # the queueing delay the data itself sees.
            delay = min(f_rtt_steps[f], lcc - 1)
            if step - start_step[f] >= delay:
                k = (step - delay) % lcc
                pd = hist_p[k, f]
                rd = hist_r[k, f]
            else:
                pd = 0.0
                rd = f_line[f]
            drc, drt, da = dcqcn_derivatives(
                rc[f], rt[f], alpha[f], pd, rd, mtu, fp[FP_TAU], fp[FP_TAU_A], fp[FP_TIMER],
                fp[FP_BC], fp[FP_F], fp[FP_RAI], fp[FP_G],
            )
            rc[f] = min(max(rc[f] + drc * dt_cc, fp[FP_RMIN]), f_line[f])
            rt[f] = min(max(rt[f] + drt * dt_cc, fp[FP_RMIN]), f_line[f])
            alpha[f] = min(max(alpha[f] + da * dt_cc, 0.0), 1.0)
        if cc == CC_EQDS:  # the receivers' pull pacers
            pull(est, f_state, f_size, f_rx, f_rtt_steps, start_step, sent, lost, hist_r, rx_rate, rx_scr,
                 step, lcc, dt, eq_wmax)
        # ---------------------------------------------------------- trace
        if trace_every > 0 and step % trace_every == 0 and trace_n[0] < trace_buf.shape[0]:
            r = trace_n[0]
            trace_t[r] = t
            for k in range(trace_e.shape[0]):
                trace_buf[r, k] = qm[trace_e[k]]
            trace_n[0] = r + 1
        t = t_next
        step += 1
    clock[0] = t
    clock[1] = step
    return done
