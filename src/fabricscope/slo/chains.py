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
    words = np.frombuffer(np.ascontiguousarray(ids).tobytes(), dtype=np.uint64).reshape(-1, width // 8)
    h = np.zeros(len(ids), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width // 8):
            h = (h ^ words[:, j]) * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
    return h


def _group_median(keys: np.ndarray, vals: np.ndarray, nkeys: int) -> tuple[np.ndarray, np.ndarray]:
    """Median of ``vals`` per key code (NaN where a key has no value) and the count per key."""
    med = np.full(nkeys, np.nan)
    cnt = np.bincount(keys, minlength=nkeys)
    if len(keys) == 0:
        return med, cnt
    order = np.lexsort((vals, keys))
    first = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    has = cnt > 0
    mid = first[has] + (cnt[has] - 1) // 2
    med[has] = vals[order][mid]
    return med, cnt


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
    skey = hex_keys(t.span_id)
    pkey = hex_keys(t.parent_id)
    mix = np.uint64(0x9E3779B97F4A7C15)
    own = tkey ^ (skey * mix)
    order = np.argsort(own, kind="stable")
    sorted_own = own[order]
    want = tkey ^ (pkey * mix)
    pos = np.minimum(np.searchsorted(sorted_own, want), max(n - 1, 0))
    cand = order[pos] if n else pos
    has_parent = (t.parent_id != b"") & (sorted_own[pos] == want) if n else np.zeros(0, bool)
    parent = np.where(has_parent, cand, -1).astype(np.int64)
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
    ukeys, hop = np.unique(composite, return_inverse=True)
    hop = hop.astype(np.int64)
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
    utr, trace, tcount = np.unique(tkey, return_inverse=True, return_counts=True)
    trace = trace.astype(np.int64)
    nt = len(utr)
    tstart = np.full(nt, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(tstart, trace, t.start_ns)
    tend = np.zeros(nt, dtype=np.int64)
    np.maximum.at(tend, trace, t.end_ns)
    e2e = tend - tstart
    first = np.zeros(nt, dtype=np.int64)
    first[trace[::-1]] = np.arange(n - 1, -1, -1)
    trace_hex = t.trace_id[first]
    healthy_span = e2e[trace] <= slo_ns
    ref, ref_n = _group_median(hop[healthy_span], excl[healthy_span], nh)
    weak = ref_n < min_reference
    if weak.any():
        p10 = _group_quantile(hop, excl, nh, 0.10)
        ref[weak] = p10[weak]
    dev = np.abs(excl - ref[hop])
    mad, _ = _group_median(hop[healthy_span], dev[healthy_span], nh)
    mad = np.where(np.isnan(mad), 0.0, mad) * 1.4826
    excess = excl - ref[hop]
    thresh = np.maximum(k_noise * mad, float(min_excess_ns))
    order2 = np.lexsort((excess, trace))
    ends = np.cumsum(tcount) - 1
    top = order2[ends]
    runner = np.where(tcount > 1, order2[np.maximum(ends - 1, 0)], -1)
    top_excess = excess[top]
    run_excess = np.where(runner >= 0, excess[np.maximum(runner, 0)], 0.0)
    stands = top_excess > thresh[hop[top]]
    blame = np.where(stands, hop[top], nh).astype(np.int64)
    blame[~stands] = -1
    hop_service = hk_svc.astype(np.int32)
    return Chains(trace=trace, parent=parent, excl_ns=excl, hop=hop, hop_subject=tuple(subjects),
                  hop_kind=tuple(kinds), hop_service=hop_service, hop_ref_ns=ref, hop_noise_ns=mad,
                  hop_ref_n=ref_n, trace_id=trace_hex, start_ns=tstart, e2e_ns=e2e, blame=blame,
                  blame_excess_ns=np.where(stands, top_excess, 0.0), runner_up_excess_ns=run_excess)


def _group_quantile(keys: np.ndarray, vals: np.ndarray, nkeys: int, q: float) -> np.ndarray:
    out = np.full(nkeys, np.nan)
    cnt = np.bincount(keys, minlength=nkeys)
    if len(keys) == 0:
        return out
    order = np.lexsort((vals, keys))
    first = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    has = cnt > 0
    out[has] = vals[order][first[has] + ((cnt[has] - 1) * q).astype(np.int64)]
    return out


def hop_shares(ch: Chains) -> list[dict[str, float | int | str]]:
    """Per hop: samples, reference and p99 exclusive time, and the mean share of end-to-end latency."""
    nh = len(ch.hop_subject)
    share = ch.excl_ns / np.maximum(ch.e2e_ns[ch.trace], 1.0)
    cnt = np.bincount(ch.hop, minlength=nh)
    mean_share = np.bincount(ch.hop, weights=share, minlength=nh) / np.maximum(cnt, 1)
    p99 = _group_quantile(ch.hop, ch.excl_ns, nh, 0.99)
    blamed = np.bincount(ch.blame[ch.blame >= 0], minlength=nh)
    rows: list[dict[str, float | int | str]] = []
    for h in np.argsort(-mean_share).tolist():
        rows.append({"hop": ch.hop_subject[h], "kind": ch.hop_kind[h], "spans": int(cnt[h]),
                     "ref_ms": round(float(ch.hop_ref_ns[h]) / 1e6, 4), "p99_ms": round(float(p99[h]) / 1e6, 4),
                     "share_of_e2e": round(float(mean_share[h]), 4), "traces_blamed": int(blamed[h])})
    return rows
