"""Trace chains: each hop's own time, the caller->callee network gap, and the hop to blame per trace.

Method (the critical-path / self-time decomposition of distributed-tracing analysis, e.g. Canopy,
Kaldor et al., SOSP 2017, and the client/server span pairing of the OpenTelemetry trace semantic
conventions): a span's *exclusive* time is its duration minus its children's durations. The
exclusive time of a server span is the service's own time (hop kind ``service``); of a client span
whose child is the callee's server span it is the network and the client stack between the two
(hop ``edge``, subject ``caller->callee``); of a leaf internal span or a client span with no server
child it is that call itself (hop ``call``, subject ``service/name``: a tool call, an external API).

Each hop's reference cost is the median exclusive time over the traces that met the SLO (the
healthy reference); the hop of a trace to blame is the one whose exclusive time exceeds its
reference by the most, and only when that excess is clearly above the hop's own noise
(``k`` scaled MADs and ``min_excess_ns``); otherwise the trace has no single slow hop and says so.
Assumes children of a span run one after another (overlapping parallel children make the
parent's exclusive time an underestimate, clipped at 0). Trace and span ids are folded into 64-bit
keys (a hash; a collision among 10^7 traces has probability ~10^-6).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fabricscope.slo._group import factorize, group_median, group_quantile
from fabricscope.slo.otlp import KIND_CLIENT, KIND_INTERNAL, KIND_PRODUCER, SpanTable

__all__ = ["HOP_CALL", "HOP_EDGE", "HOP_SERVICE", "Chains", "analyze_chains", "hex_keys"]

HOP_SERVICE, HOP_EDGE, HOP_CALL = 0, 1, 2
_HOP_NAMES = ("service", "edge", "call")


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
    ``hop_service`` (service code that owns the hop), ``hop_ref_ns`` (healthy reference),
    ``hop_noise_ns`` (1.4826 MAD), ``hop_ref_n``. Per trace: ``trace_id`` (hex), ``start_ns``,
    ``e2e_ns``, ``blame`` (hop index, -1 none), ``blame_excess_ns``, ``runner_up_excess_ns``.
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

    def blamed_subjects(self) -> list[str]:
        """The blamed hop's subject per trace (``""`` when no single hop stands out)."""
        subj = np.array((*self.hop_subject, ""), dtype=object)
        return list(subj[self.blame])


def analyze_chains(t: SpanTable, *, slo_ns: int, k_noise: float = 6.0, min_excess_ns: int = 2_000_000,
                   min_reference: int = 5) -> Chains:
    """Decompose every trace into hops and blame each trace's slow hop (see the module docstring).

    ``slo_ns`` picks the healthy reference (traces with end-to-end latency within it); a hop with
    fewer than ``min_reference`` healthy samples falls back to the 10th percentile of all its samples.
    """
    n = len(t)
    tkey = hex_keys(t.trace_id)
    # group the spans by trace with one stable sort; every later per-trace step is a segment
    # reduction over this order, and the parent join below is local to a trace
    order = np.argsort(tkey, kind="stable")
    tk_sorted = tkey[order]
    new_trace = np.ones(n, dtype=bool)
    if n > 1:
        np.not_equal(tk_sorted[1:], tk_sorted[:-1], out=new_trace[1:])
    del tk_sorted
    seg = np.flatnonzero(new_trace)
    nt = len(seg)
    trace_sorted = np.cumsum(new_trace, dtype=np.int64) - 1
    del new_trace
    trace = np.empty(n, dtype=np.int64)
    trace[order] = trace_sorted
    tcount = np.diff(np.append(seg, n))
    # parent join: (trace, span-id hash) packed into one word, sorted within the trace order
    tbits = max(1, int(max(nt - 1, 1)).bit_length())
    low = np.uint64((1 << (64 - tbits)) - 1)
    hi = trace_sorted.astype(np.uint64) << np.uint64(64 - tbits)
    own = hi | (hex_keys(t.span_id)[order] & low)
    want = hi | (hex_keys(t.parent_id)[order] & low)
    del hi
    o2 = np.argsort(own, kind="stable")
    own_sorted = own[o2]
    del own
    pos = np.minimum(np.searchsorted(own_sorted, want), max(n - 1, 0))
    found = own_sorted[pos] == want if n else np.zeros(0, dtype=bool)
    del own_sorted, want
    has_parent_sorted = found & (t.parent_id[order] != b"")
    parent = np.full(n, -1, dtype=np.int64)
    parent[order[has_parent_sorted]] = order[o2[pos[has_parent_sorted]]]
    del o2, pos, found, has_parent_sorted
    dur = (t.end_ns - t.start_ns).astype(np.float64)
    hp = parent >= 0
    child_sum = np.bincount(parent[hp], weights=dur[hp], minlength=n)
    n_children = np.bincount(parent[hp], minlength=n)
    excl = np.maximum(dur - child_sum, 0.0)
    # callee of a client span: the service of a server child (the other side of the same call)
    callee = np.full(n, -1, dtype=np.int64)
    srv_child = hp & ((t.kind == 2) | (t.kind == 5))
    callee[parent[srv_child]] = t.service[srv_child]
    is_client = (t.kind == KIND_CLIENT) | (t.kind == KIND_PRODUCER)
    hop_kind = np.full(n, HOP_SERVICE, dtype=np.int64)
    hop_kind[is_client & (callee >= 0)] = HOP_EDGE
    hop_kind[is_client & (callee < 0)] = HOP_CALL
    hop_kind[(t.kind == KIND_INTERNAL) & (n_children == 0) & hp] = HOP_CALL
    ns, nm = max(len(t.services), 1), max(len(t.names), 1)
    c2 = np.where(hop_kind == HOP_EDGE, callee, 0)
    m2 = np.where(hop_kind == HOP_CALL, t.name, 0)
    composite = ((hop_kind * ns + t.service) * ns + c2) * nm + m2
    ukeys, hop = factorize(composite)
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
    ref, ref_n = group_median(hop[healthy_span], excl[healthy_span], nh)
    weak = ref_n < min_reference
    if weak.any():
        p10, _ = group_quantile(hop, excl, nh, 0.10)
        ref[weak] = p10[weak]
    dev = np.abs(excl - ref[hop])
    mad, _ = group_median(hop[healthy_span], dev[healthy_span], nh)
    mad = np.where(np.isnan(mad), 0.0, mad) * 1.4826
    excess = excl - ref[hop]
    thresh = np.maximum(k_noise * mad, float(min_excess_ns))
    # the top and the runner-up excess per trace (ties: the later span, as a stable sort gives)
    ex_s = excess[order]
    ex_s[np.isnan(ex_s)] = -np.inf
    if n:
        tmax = np.maximum.reduceat(ex_s, seg)
        is_max = np.flatnonzero(ex_s == tmax[trace_sorted])
        last = np.ones(len(is_max), dtype=bool)
        last[:-1] = trace_sorted[is_max[1:]] != trace_sorted[is_max[:-1]]
        top_sorted = is_max[last]
        ex_s[top_sorted] = -np.inf
        second = np.maximum.reduceat(ex_s, seg)
        top = order[top_sorted]
    else:
        tmax = second = np.zeros(0)
        top = np.zeros(0, dtype=np.int64)
    top_excess = tmax
    run_excess = np.where(tcount > 1, second, 0.0)
    stands = top_excess > thresh[hop[top]]
    blame = np.where(stands, hop[top], nh).astype(np.int64)
    blame[~stands] = -1
    hop_service = hk_svc.astype(np.int32)
    return Chains(trace=trace, parent=parent, excl_ns=excl, hop=hop, hop_subject=tuple(subjects),
                  hop_kind=tuple(kinds), hop_service=hop_service, hop_ref_ns=ref, hop_noise_ns=mad,
                  hop_ref_n=ref_n, trace_id=trace_hex, start_ns=tstart, e2e_ns=e2e, blame=blame,
                  blame_excess_ns=np.where(stands, top_excess, 0.0), runner_up_excess_ns=run_excess)


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
