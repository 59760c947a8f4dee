"""Hop segments: a flow's routes cut into (ingress link -> egress link) pieces for the fluid engine.

A segment is the part of one flow that enters a switch through directed link ``g`` and
leaves through ``e`` (``g = -1`` at the sending NIC). Its bytes sit in ``e``'s egress
queue *and* count against ``g``'s ingress queue, which is what PFC needs (802.1Qbb pauses
per ingress port). Weights come from the routing's path table (ECMP: one path, weight 1;
spraying: fractions over many paths): a flow splits at each switch in proportion to the
weights of its out-links there, independent of where the bytes came in (true for hashing and
uniform spraying over shortest paths).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Segments:
    """Segments sorted by egress link (those of link ``e`` are ``eptr[e]:eptr[e+1]``).

    flow, edge, ingress, weight, last: per segment (``ingress`` -1 at the sender;
    ``last``: the egress link ends at the flow's destination NIC).
    ch_ptr / ch_idx / ch_frac: where a segment's bytes go next (CSR, fractions sum to 1).
    fptr / fidx: the segments of each flow; f0ptr / f0idx: its first (sender) segments.
    """

    flow: IntArray
    edge: IntArray
    ingress: IntArray
    weight: FloatArray
    last: npt.NDArray[np.bool_]
    ch_ptr: IntArray
    ch_idx: IntArray
    ch_frac: FloatArray
    eptr: IntArray
    fptr: IntArray
    fidx: IntArray
    f0ptr: IntArray
    f0idx: IntArray

    @property
    def n(self) -> int:
        return int(self.flow.shape[0])


@numba.njit(cache=True)
def _build(indptr, edges, weights, esrc, edst, fsrc, fdst, n_nodes):  # type: ignore[no-untyped-def]
    n_f = indptr.shape[0] - 1
    # pass 1: count segments per flow
    cnt = np.zeros(n_f, np.int64)
    through = np.zeros(n_nodes)
    for f in range(n_f):
        a, b = indptr[f], indptr[f + 1]
        for i in range(a, b):
            e = edges[i]
            if esrc[e] == fsrc[f]:
                cnt[f] += 1
            else:
                for j in range(a, b):
                    if edst[edges[j]] == esrc[edges[i]]:
                        cnt[f] += 1
    fptr = np.zeros(n_f + 1, np.int64)
    for f in range(n_f):
        fptr[f + 1] = fptr[f] + cnt[f]
    n = fptr[n_f]
    s_flow = np.empty(n, np.int64)
    s_edge = np.empty(n, np.int64)
    s_in = np.empty(n, np.int64)
    s_w = np.empty(n)
    s_last = np.zeros(n, np.bool_)
    k = 0
    for f in range(n_f):
        a, b = indptr[f], indptr[f + 1]
        for i in range(a, b):  # total weight leaving each node on this flow's routes
            through[esrc[edges[i]]] = 0.0
        for i in range(a, b):
            through[esrc[edges[i]]] += weights[i]
        for i in range(a, b):
            e = edges[i]
            if esrc[e] == fsrc[f]:
                s_flow[k] = f
                s_edge[k] = e
                s_in[k] = -1
                s_w[k] = weights[i]
                s_last[k] = edst[e] == fdst[f]
                k += 1
            else:
                share = weights[i] / max(through[esrc[e]], 1e-300)
                for j in range(a, b):
                    g = edges[j]
                    if edst[g] == esrc[e]:
                        s_flow[k] = f
                        s_edge[k] = e
                        s_in[k] = g
                        s_w[k] = weights[j] * share
                        s_last[k] = edst[e] == fdst[f]
                        k += 1
    # children: segments of the same flow whose ingress is my egress
    ccnt = np.zeros(n, np.int64)
    for f in range(n_f):
        for s in range(fptr[f], fptr[f + 1]):
            if s_last[s]:
                continue
            for c in range(fptr[f], fptr[f + 1]):
                if s_in[c] == s_edge[s]:
                    ccnt[s] += 1
    ch_ptr = np.zeros(n + 1, np.int64)
    for s in range(n):
        ch_ptr[s + 1] = ch_ptr[s] + ccnt[s]
    ch_idx = np.empty(ch_ptr[n], np.int64)
    ch_frac = np.empty(ch_ptr[n])
    for f in range(n_f):
        for s in range(fptr[f], fptr[f + 1]):
            if s_last[s]:
                continue
            m = ch_ptr[s]
            tot = 0.0
            for c in range(fptr[f], fptr[f + 1]):
                if s_in[c] == s_edge[s]:
                    ch_idx[m] = c
                    tot += s_w[c]
                    m += 1
            for m2 in range(ch_ptr[s], m):
                ch_frac[m2] = s_w[ch_idx[m2]] / max(tot, 1e-300)
    return s_flow, s_edge, s_in, s_w, s_last, ch_ptr, ch_idx, ch_frac, fptr


def build_segments(
    indptr: IntArray,
    edges: IntArray,
    weights: FloatArray,
    *,
    edge_src: IntArray,
    edge_dst: IntArray,
    flow_src: IntArray,
    flow_dst: IntArray,
    n_nodes: int,
    n_edges: int,
) -> Segments:
    """Cut the routes of a path table (CSR rows per flow, see
    :class:`fabricscope.sim.loadbalance.PathTable`) into segments."""
    s_flow, s_edge, s_in, s_w, s_last, ch_ptr, ch_idx, ch_frac, _ = _build(
        indptr.astype(np.int64), edges.astype(np.int64), weights.astype(np.float64),
        edge_src.astype(np.int64), edge_dst.astype(np.int64), flow_src.astype(np.int64),
        flow_dst.astype(np.int64), int(n_nodes),
    )
    order = np.argsort(s_edge, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(order.shape[0])
    lens = np.diff(ch_ptr)[order]
    new_ptr = np.zeros(order.shape[0] + 1, np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    take = (np.repeat(ch_ptr[:-1][order] - new_ptr[:-1], lens) + np.arange(int(lens.sum()))).astype(np.int64)
    new_idx = inv[ch_idx[take]] if take.shape[0] else np.zeros(0, np.int64)
    new_frac = ch_frac[take] if take.shape[0] else np.zeros(0)
    flow = s_flow[order]
    edge = s_edge[order]
    ingress = s_in[order]
    eptr = np.zeros(n_edges + 1, np.int64)
    np.cumsum(np.bincount(edge, minlength=n_edges), out=eptr[1:])
    n_f = int(indptr.shape[0] - 1)
    fo = np.argsort(flow, kind="stable").astype(np.int64)
    fptr = np.zeros(n_f + 1, np.int64)
    np.cumsum(np.bincount(flow, minlength=n_f), out=fptr[1:])
    first = ingress < 0
    f0 = np.flatnonzero(first)
    f0 = f0[np.argsort(flow[f0], kind="stable")].astype(np.int64)
    f0ptr = np.zeros(n_f + 1, np.int64)
    np.cumsum(np.bincount(flow[f0], minlength=n_f), out=f0ptr[1:])
    return Segments(
        flow=flow, edge=edge, ingress=ingress, weight=s_w[order], last=s_last[order],
        ch_ptr=new_ptr, ch_idx=new_idx.astype(np.int64), ch_frac=new_frac, eptr=eptr,
        fptr=fptr, fidx=fo, f0ptr=f0ptr, f0idx=f0,
    )


def main_path(segs: Segments, flow: int) -> list[int]:
    """The links of ``flow``'s heaviest route, sender to receiver: at its first hop and at every
    split, the branch that carries the largest share (its only route under ECMP)."""
    first = segs.f0idx[segs.f0ptr[flow]:segs.f0ptr[flow + 1]]
    if first.shape[0] == 0:
        return []
    s = int(first[int(np.argmax(segs.weight[first]))])
    out = [int(segs.edge[s])]
    while not segs.last[s]:
        a, b = int(segs.ch_ptr[s]), int(segs.ch_ptr[s + 1])
        if a == b:
            break
        s = int(segs.ch_idx[a + int(np.argmax(segs.ch_frac[a:b]))])
        out.append(int(segs.edge[s]))
    return out
