"""Trace chains: each hop's own time, the caller->callee network gap, and the hop to blame per trace.

Decomposition (the critical-path / self-time decomposition of distributed-tracing analysis, e.g. Canopy,
Kaldor et al., SOSP 2017, and the client/server span pairing of the OpenTelemetry trace semantic
conventions): a span's *exclusive* time is its duration minus the length of the UNION of its
children's intervals, so parallel children (a fan-out of tool calls) are counted once, not summed; a
parent's only child counts its duration (immune to a clock offset between the two hosts). The
exclusive time of a server span is the service's own time (hop kind ``service``); of a client span
whose child is the callee's server span it is the network and the client stack between the two
(hop ``edge``, subject ``caller->callee``); of a leaf internal span or a client span with no server
child it is that call itself (hop ``call``, subject ``service/name``: a tool call, an external API).
An LLM server span's own time is ``ttft + tokens x per-token time``; its decode part is rescaled to
the hop's median output length (OpenTelemetry GenAI ``gen_ai.usage.output_tokens`` and the time to
first token), so a long answer is not mistaken for a slow model.

Blame: a hop's cost in a trace is the sum over its spans there (a retried call is two spans of one
hop). Latency noise is multiplicative (lognormal-like, heavy right tail), so the test is on the log
scale: ``z = (log(cost + eps) - median) / scale`` over the traces that met the SLO (the healthy
reference), with ``scale = (median - 10th percentile) / 1.2816``: a robust, one-sided estimate
(Rousseeuw & Croux, JASA 1993, on robust scales; the lower half because a slowdown only adds time,
and slowed traces that stayed within the SLO would inflate the upper half), shrunk toward the median
scale of the hops of the same kind with 50 pseudo-samples (moderated variances, Smyth 2004) so a hop
seen in 30 traces does not get a scale that is off by a third. A hop stands out when ``z`` exceeds
the Bonferroni quantile ``Phi^-1(1 - alpha / m)`` for the trace's ``m`` hops (``alpha`` =
``false_blame_rate``, 0.4%: the chance a healthy trace is blamed at all, under a lognormal model)
and its excess over the reference is at least ``min_excess_ns`` (0.5 ms: smaller is
not worth an alert). The blamed hop is the standing one with the largest excess; otherwise the trace
has no single slow hop and says so. Measured on ``twin.agent_traces`` (tests/test_slo_hard_chains.py):
a 2-5 ms slowdown on a ~1.5 ms hop with sigma-0.5 jitter is a 1.6-3 sigma event there and is not
localized per trace (about half are); a hop slow in every trace has no healthy reference (the lower
quartile of all its samples stands in) and is named by ``rules`` from its share of the latency.
Trace and span ids are folded into 64-bit keys (a hash; a collision among 10^7 traces has
probability ~10^-6). Cost: one stable sort by trace, a trace-local parent join, a sort of the
children of multi-child parents, a stable sort of (trace, hop) that is already in trace order, and
group order statistics (``_group``); no per-span Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fabricscope.slo._group import (
    factorize,
    group_median,
    group_order_stats,
    group_quantile,
    segment_cummax,
)
from fabricscope.slo.otlp import KIND_CLIENT, KIND_INTERNAL, KIND_PRODUCER, SpanTable

__all__ = ["HOP_CALL", "HOP_EDGE", "HOP_SERVICE", "Chains", "analyze_chains", "hex_keys"]

HOP_SERVICE, HOP_EDGE, HOP_CALL = 0, 1, 2
_HOP_NAMES = ("service", "edge", "call")
_LOG_EPS_NS = 20_000.0  # 20 us added before the log (an own time of 0 is possible)
_LOW_Q, _LOW_Z = 10, 1.2816  # the lower quantile 1/_LOW_Q and its standard normal distance to the median
_POOL_N = 50.0  # pseudo-samples of the per-kind pooled scale
_MIN_HEALTHY_SHARE = 0.1  # a healthy reference below this share of a hop's traces is not used
_MIN_LOG_SCALE = 0.05  # floor of the robust log scale (a hop with constant time)


def hex_keys(ids: np.ndarray) -> np.ndarray:
    """Hash fixed-width lowercase-hex byte strings (``S16`` / ``S32``) to uint64 keys.

    The ASCII bytes are read as 64-bit words and mixed (xor, multiply by an odd constant,
    xor-shift: the multiply-xorshift step of the SplitMix64 finalizer); distinct ids collide with
    probability about n^2 / 2^65.
    """
    width = ids.dtype.itemsize
    if len(ids) == 0:
        return np.zeros(0, dtype=np.uint64)
    words = np.ascontiguousarray(ids).view(np.uint64).reshape(-1, width // 8)
    h = np.zeros(len(ids), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width // 8):
            h = (h ^ words[:, j]) * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
    return h


@dataclass(frozen=True)
class Chains:
    """The per-span decomposition, the hop table and the per-trace blame.

    Per span: ``trace`` (index into the per-trace arrays), ``parent`` (-1 root / parent not in the
    data), ``excl_ns``, ``hop`` (index into ``hop_subject``). Per hop: ``hop_subject``, ``hop_kind``,
    ``hop_service`` (service code that owns the hop), ``hop_ref_ns`` (healthy reference: median
    per-trace cost), ``hop_noise_ns`` (one log-scale unit above the reference, in ns), ``hop_ref_n``,
    ``hop_log_scale``. Per trace: ``trace_id`` (hex), ``start_ns``, ``e2e_ns``, ``blame`` (hop index,
    -1 none), ``blame_excess_ns``, ``runner_up_excess_ns`` (the largest excess of the other hops),
    ``blame_z`` (the blamed hop's log-scale z, 0 when none).
    """

    trace: np.ndarray
    parent: np.ndarray
    excl_ns: np.ndarray
    hop: np.ndarray
    hop_subject: tuple[str, ...]
    hop_kind: tuple[str, ...]
    hop_service: np.ndarray
    hop_ref_ns: np.ndarray
    hop_noise_ns: np.ndarray
    hop_ref_n: np.ndarray
    trace_id: np.ndarray
    start_ns: np.ndarray
    e2e_ns: np.ndarray
    blame: np.ndarray
    blame_excess_ns: np.ndarray
    runner_up_excess_ns: np.ndarray
    hop_log_scale: np.ndarray | None = None
    blame_z: np.ndarray | None = None

    def blamed_subjects(self) -> list[str]:
        """The blamed hop's subject per trace (``""`` when no single hop stands out)."""
        subj = np.array((*self.hop_subject, ""), dtype=object)
        return list(subj[self.blame])


def analyze_chains(t: SpanTable, *, slo_ns: int, k_noise: float | None = None, min_excess_ns: int = 500_000,
                   false_blame_rate: float = 0.004,
                   min_reference: int = 5) -> Chains:
    """Decompose every trace into hops and blame each trace's slow hop (see the module docstring).

    ``slo_ns`` picks the healthy reference (traces with end-to-end latency within it); a hop with
    fewer than ``min_reference`` healthy samples, or healthy samples under 10% of its traces, falls
    back to the lower quartile of all its samples.
    ``k_noise`` fixes the log-scale z threshold instead of the per-trace Bonferroni quantile of
    ``false_blame_rate``.
    """
    n = len(t)
    tkey = hex_keys(t.trace_id)
    # group the spans by trace with one stable sort; every later per-trace step is a segment
    # reduction over this order, and the parent join below is local to a trace
    order = np.argsort(tkey, kind="stable")
    tk_sorted = tkey[order]
    del tkey
    new_trace = np.ones(n, dtype=bool)
    if n > 1:
        np.not_equal(tk_sorted[1:], tk_sorted[:-1], out=new_trace[1:])
    del tk_sorted
    seg = np.flatnonzero(new_trace)
    nt = len(seg)
    trace_sorted = np.cumsum(new_trace, dtype=np.int64) - 1
    del new_trace
    trace: np.ndarray = np.empty(n, dtype=np.int32 if nt < 2**31 else np.int64)
    trace[order] = trace_sorted
    # parent join: (trace, span-id hash) packed into one word, sorted within the trace order
    tbits = max(1, int(max(nt - 1, 1)).bit_length())
    low = np.uint64((1 << (64 - tbits)) - 1)
    hi = trace_sorted.astype(np.uint64) << np.uint64(64 - tbits)
    own = hex_keys(t.span_id)[order]
    own &= low
    own |= hi
    want = hex_keys(t.parent_id)[order]
    want &= low
    want |= hi
    del hi
    o2 = np.argsort(own, kind="stable")
    own_sorted = own[o2]
    del own
    pos = np.minimum(np.searchsorted(own_sorted, want), max(n - 1, 0))
    found = own_sorted[pos] == want if n else np.zeros(0, dtype=bool)
    del own_sorted, want
    has_parent_sorted = found & (t.parent_id[order] != b"")
    parent: np.ndarray = np.full(n, -1, dtype=np.int32 if n < 2**31 else np.int64)
    parent[order[has_parent_sorted]] = order[o2[pos[has_parent_sorted]]]
    del o2, pos, found, has_parent_sorted
    dur = (t.end_ns - t.start_ns).astype(np.float64)
    hp = parent >= 0
    n_children = np.bincount(parent[hp], minlength=n)
    excl = dur - _covered_by_children(t, parent, n_children, dur)
    np.maximum(excl, 0.0, out=excl)
    del dur
    # callee of a client span: the service of a server child (the other side of the same call)
    callee = np.full(n, -1, dtype=np.int64)
    srv_child = hp & ((t.kind == 2) | (t.kind == 5))
    callee[parent[srv_child]] = t.service[srv_child]
    is_client = (t.kind == KIND_CLIENT) | (t.kind == KIND_PRODUCER)
    hop_kind = np.full(n, HOP_SERVICE, dtype=np.int8)
    hop_kind[is_client & (callee >= 0)] = HOP_EDGE
    hop_kind[is_client & (callee < 0)] = HOP_CALL
    hop_kind[(t.kind == KIND_INTERNAL) & (n_children == 0) & hp] = HOP_CALL
    ns, nm = max(len(t.services), 1), max(len(t.names), 1)
    c2 = np.where(hop_kind == HOP_EDGE, callee, 0)
    m2 = np.where(hop_kind == HOP_CALL, t.name, 0)
    del srv_child, is_client, n_children, hp
    composite = ((hop_kind.astype(np.int64) * ns + t.service) * ns + c2) * nm + m2
    del c2, m2, callee
    ukeys, hop = factorize(composite)
    del composite
    hop = hop.astype(np.int32 if len(ukeys) < 2**31 else np.int64)
    subjects, kinds = [], []
    hk_kind = ukeys // (ns * ns * nm)
    hk_svc = (ukeys // (ns * nm)) % ns
    hk_callee = (ukeys // nm) % ns
    hk_name = ukeys % nm
    for kk, s, c, m in zip(hk_kind.tolist(), hk_svc.tolist(), hk_callee.tolist(), hk_name.tolist(), strict=True):
        kinds.append(_HOP_NAMES[kk])
        if kk == HOP_SERVICE:
            subjects.append(t.services[s])
        elif kk == HOP_EDGE:
            subjects.append(f"{t.services[s]}->{t.services[c]}")
        else:
            subjects.append(f"{t.services[s]}/{t.names[m]}")
    nh = len(ukeys)
    # traces
    tstart = np.minimum.reduceat(t.start_ns[order], seg) if n else np.zeros(0, dtype=np.int64)
    tend = np.maximum.reduceat(t.end_ns[order], seg) if n else np.zeros(0, dtype=np.int64)
    e2e = tend - tstart
    trace_hex = t.trace_id[order[seg]]
    healthy_span = e2e[trace] <= slo_ns
    # an LLM span's own time is ttft + tokens x per-token time: its decode part is rescaled to the
    # hop's median output length, so the draw of the output length is not mistaken for slowness
    cost = _token_adjusted(t, hop, excl, hop_kind, healthy_span, nh)
    del hop_kind
    # one value per (trace, hop): a retried call is two spans of one hop in a trace
    hop_s = hop[order]
    hbits = max(1, int(max(nh - 1, 1)).bit_length())
    if tbits + hbits <= 63:  # trace codes are already sorted: a stable sort only orders each trace's hops
        go = np.argsort((trace_sorted << np.int64(hbits)) | hop_s, kind="stable")
    else:
        go = np.lexsort((hop_s, trace_sorted))
    gt_s, gh_s = trace_sorted[go], hop_s[go]
    gnew = np.ones(n, dtype=bool)
    if n > 1:
        gnew[1:] = (gt_s[1:] != gt_s[:-1]) | (gh_s[1:] != gh_s[:-1])
    gstart = np.flatnonzero(gnew)
    ng = len(gstart)
    g_trace, g_hop = gt_s[gstart], gh_s[gstart]
    del gt_s, gh_s, gnew, hop_s
    x = np.add.reduceat(cost[order[go]], gstart) if n else np.zeros(0)
    del go, cost, trace_sorted
    lx = np.log(np.maximum(x, 0.0) + _LOG_EPS_NS)
    g_healthy = e2e[g_trace] <= slo_ns
    # reference = median, scale = (median - 10th percentile) / 1.2816 of the healthy log cost: a
    # slowdown only ever adds time, so slowed traces that stayed within the SLO contaminate the upper
    # half; the lower half is left alone (a one-sided robust scale, cf. Rousseeuw & Croux 1993)
    q, ref_n = group_order_stats(g_hop[g_healthy], lx[g_healthy], nh,
                                 [lambda c: (c - 1) // 2, lambda c: (c - 1) // _LOW_Q])
    ref_log, scale = q[0], (q[0] - q[1]) / _LOW_Z
    # too few healthy traces, or a small minority of the hop's traces (selection-biased: the few that
    # met the SLO despite a slow hop are those where everything else was fast): the lower quartile of
    # all the hop's traces, with the scale of their lower tail ((q25 - q5) / (1.645 - 0.674))
    n_all = np.bincount(g_hop, minlength=nh)
    weak = (ref_n < min_reference) | (ref_n < _MIN_HEALTHY_SHARE * n_all)
    if weak.any():
        qa, _ = group_order_stats(g_hop, lx, nh, [lambda c: (c - 1) // 4, lambda c: (c - 1) // 20])
        ref_log[weak] = qa[0, weak]
        scale[weak] = (qa[0, weak] - qa[1, weak]) / (1.6449 - 0.6745)
    n_ref = np.where(weak, n_all, ref_n)
    scale = _pooled_scale(np.where(np.isnan(scale), 0.0, scale), n_ref, hk_kind)
    ref = np.exp(ref_log) - _LOG_EPS_NS
    z = (lx - ref_log[g_hop]) / scale[g_hop]
    excess = x - ref[g_hop]
    excess[np.isnan(excess)] = -np.inf
    z[np.isnan(z)] = -np.inf
    # every trace has a group and groups run in trace order: group g belongs to trace g_trace[g]
    gseg = np.flatnonzero(np.r_[True, g_trace[1:] != g_trace[:-1]]) if ng else np.zeros(0, dtype=np.int64)
    if k_noise is not None:
        k_t = np.full(nt, float(k_noise))
    else:  # Bonferroni over the trace's hops
        k_t = _bonferroni_k(np.diff(np.append(gseg, ng)), false_blame_rate)
    stands_g = (z > k_t[g_trace]) & (excess > float(min_excess_ns))
    # per trace: the standing group with the largest excess (ties: the later), and the largest
    # excess of the other groups (the runner-up)
    blame = np.full(nt, -1, dtype=np.int64)
    blame_ex = np.zeros(nt)
    run_excess = np.zeros(nt)
    bz = np.zeros(nt)
    if ng:
        sx = np.where(stands_g, excess, -np.inf)
        smax = np.maximum.reduceat(sx, gseg)
        hit = np.flatnonzero(stands_g & (sx == smax[g_trace]))
        pick = np.full(nt, -1, dtype=np.int64)
        pick[g_trace[hit]] = hit
        got = pick >= 0
        blame[got] = g_hop[pick[got]]
        blame_ex[got] = excess[pick[got]]
        bz[got] = z[pick[got]]
        # the runner-up: the top excess with the blamed (or else the top) group left out
        tmax = np.maximum.reduceat(excess, gseg)
        is_max = np.flatnonzero(excess == tmax[g_trace])
        drop = pick.copy()
        drop[~got] = is_max[np.r_[g_trace[is_max[1:]] != g_trace[is_max[:-1]], True]][~got]
        ex2 = excess.copy()
        ex2[drop] = -np.inf
        second = np.maximum.reduceat(ex2, gseg)
        run_excess = np.where(np.isfinite(second), second, 0.0)
    stands = blame >= 0
    hop_service = hk_svc.astype(np.int32)
    noise = ref + _LOG_EPS_NS
    return Chains(trace=trace, parent=parent, excl_ns=excl, hop=hop, hop_subject=tuple(subjects),
                  hop_kind=tuple(kinds), hop_service=hop_service, hop_ref_ns=ref,
                  hop_noise_ns=noise * (np.exp(scale) - 1.0), hop_ref_n=ref_n, trace_id=trace_hex,
                  start_ns=tstart, e2e_ns=e2e, blame=blame,
                  blame_excess_ns=np.where(stands, blame_ex, 0.0), runner_up_excess_ns=run_excess,
                  hop_log_scale=scale, blame_z=bz)


def _bonferroni_k(m: np.ndarray, alpha: float) -> np.ndarray:
    """Per trace, the one-sided normal quantile ``Phi^-1(1 - alpha / m)`` for its ``m`` hops (Bonferroni)."""
    from statistics import NormalDist

    out = np.zeros(len(m))
    nd = NormalDist()
    for v in np.unique(m).tolist():
        out[m == v] = nd.inv_cdf(1.0 - alpha / max(int(v), 1))
    return out


def _pooled_scale(s: np.ndarray, n: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Shrink each hop's robust log scale toward the median scale of the hops of its kind.

    ``s^2 = (n s_h^2 + n0 s_kind^2) / (n + n0)`` with ``n0 = _POOL_N`` pseudo-samples (empirical-Bayes
    variance pooling, e.g. Smyth 2004's moderated variances): a hop seen in 30 healthy traces has a
    MAD off by ~30%, which alone turns a 3.5-sigma threshold into a 2.5-sigma one.
    """
    out = np.array(s, dtype=np.float64)
    for k in np.unique(kind).tolist():
        of_k = kind == k
        seen = of_k & (n > 0)
        if seen.any():  # the hops of a kind are few (tens): a loop over kinds, not spans
            pool = float(np.median(s[seen]))
            out[of_k] = np.sqrt((n[of_k] * s[of_k] ** 2 + _POOL_N * pool ** 2) / (n[of_k] + _POOL_N))
    return np.maximum(out, _MIN_LOG_SCALE)


def _covered_by_children(t: SpanTable, parent: np.ndarray, n_children: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per span, the length of the union of its children's intervals (overlapping children counted once).

    A single child covers its duration (immune to a clock offset between the two hosts). Children of
    a parent with several are sorted by (parent, start) on one packed word and merged with a
    segmented running maximum of their ends: each child adds ``max(0, end - max(start, M))`` with
    ``M`` the largest end before it.
    """
    n = len(t)
    hp = parent >= 0
    covered = np.zeros(n)
    if not hp.any():
        return covered
    multi = hp & (n_children[np.maximum(parent, 0)] >= 2)
    single = hp & ~multi
    covered += np.bincount(parent[single], weights=dur[single], minlength=n)
    idx = np.flatnonzero(multi)
    if len(idx) == 0:
        return covered
    p = parent[idx].astype(np.int64)
    s = t.start_ns[idx] - t.start_ns[p]
    s -= s.min()
    sbits = max(1, int(s.max()).bit_length())
    pbits = max(1, int(n).bit_length())
    # one packed word when it fits, else (a span over ~2^(63 - pbits) ns) a two-key sort
    o = np.argsort((p << np.int64(sbits)) | s) if sbits + pbits <= 63 else np.lexsort((s, p))
    idx, p = idx[o], p[o]
    base = t.start_ns[p]  # times relative to the parent's start: exact in float64 (ns since 1970 are not)
    st = (t.start_ns[idx] - base).astype(np.float64)
    en = (t.end_ns[idx] - base).astype(np.float64)
    run = segment_cummax(p, en)
    prev = np.empty_like(run)
    prev[0] = -np.inf
    prev[1:] = run[:-1]
    first = np.r_[True, p[1:] != p[:-1]]
    prev[first] = -np.inf
    add = np.maximum(en - np.maximum(st, prev), 0.0)
    covered += np.bincount(p, weights=add, minlength=n)
    return covered


def _token_adjusted(t: SpanTable, hop: np.ndarray, excl: np.ndarray, hop_kind: np.ndarray,
                    healthy: np.ndarray, nh: int) -> np.ndarray:
    """An LLM server span's own time with its decode part rescaled to the hop's median output length.

    With the OpenTelemetry GenAI attributes ``gen_ai.usage.output_tokens`` and the server's time to
    first token, own time = ttft + tokens x per-token time; the cost compared across traces is
    ``ttft + median_tokens x per-token time`` (the output length is the request's, not the hop's
    speed). Spans without both attributes, or whose ttft exceeds their own time, are unchanged.
    """
    tok = t.out_tokens
    llm = (hop_kind == HOP_SERVICE) & (tok > 0) & (t.ttft_ns >= 0)
    if not llm.any():
        return excl
    idx = np.flatnonzero(llm)
    ttft = t.ttft_ns[idx].astype(np.float64)
    ok = ttft <= excl[idx]
    idx, ttft = idx[ok], ttft[ok]
    h = healthy[idx]
    med_tok, _ = group_median(hop[idx][h], tok[idx][h].astype(np.float64), nh)
    med_tok = np.where(np.isnan(med_tok), 0.0, med_tok)
    out = excl.copy()
    out[idx] = ttft + (excl[idx] - ttft) / tok[idx] * med_tok[hop[idx]]
    return out


def hop_shares(ch: Chains) -> list[dict[str, float | int | str]]:
    """Per hop: samples, reference and p99 exclusive time, and the mean share of end-to-end latency."""
    nh = len(ch.hop_subject)
    share = ch.excl_ns / np.maximum(ch.e2e_ns[ch.trace], 1.0)
    cnt = np.bincount(ch.hop, minlength=nh)
    mean_share = np.bincount(ch.hop, weights=share, minlength=nh) / np.maximum(cnt, 1)
    p99, _ = group_quantile(ch.hop, ch.excl_ns, nh, 0.99)
    blamed = np.bincount(ch.blame[ch.blame >= 0], minlength=nh)
    rows: list[dict[str, float | int | str]] = []
    for h in np.argsort(-mean_share).tolist():
        rows.append({"hop": ch.hop_subject[h], "kind": ch.hop_kind[h], "spans": int(cnt[h]),
                     "ref_ms": round(float(ch.hop_ref_ns[h]) / 1e6, 4), "p99_ms": round(float(p99[h]) / 1e6, 4),
                     "share_of_e2e": round(float(mean_share[h]), 4), "traces_blamed": int(blamed[h])})
    return rows
