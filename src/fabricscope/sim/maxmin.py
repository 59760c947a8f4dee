"""Max-min fair rates of flows over capacitated links (progressive filling, vectorized).

The input is a sparse *flow x link* incidence matrix ``A`` whose entry ``A[f, l]`` is the
fraction of flow ``f``'s bytes that cross link ``l`` (1 for a single-path flow, fractional
for a sprayed one). Rates ``r`` are max-min fair subject to ``A.T @ r <= capacity``
(Bertsekas & Gallager, *Data Networks*, 2nd ed., §6.5.2, progressive filling).

Instead of raising every flow by one global increment per round (one bottleneck level per
round), each round freezes *every* link whose fair share is the smallest among the links its
own flows cross. Fair shares ``rem_l / W_l`` never decrease while filling (a frozen flow only
frees capacity), so such a local-minimum link saturates at exactly its current share: the
result equals sequential progressive filling, in far fewer rounds (this is the parallel
"bottleneck" variant used by fluid data-centre simulators, e.g. Nagaraj et al., NSDI'16).
Each round is four passes over the non-zeros, all numpy.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from functools import cache
from typing import Literal, cast

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix

FloatArray = npt.NDArray[np.float64]

_REL_EPS = 1e-9


def _segment_min(values: FloatArray, indptr: npt.NDArray[np.int64], empty: float) -> FloatArray:
    """Minimum of ``values[indptr[i]:indptr[i+1]]`` per row; ``empty`` for empty rows."""
    n = indptr.shape[0] - 1
    out = np.full(n, empty, dtype=np.float64)
    if values.shape[0] == 0:
        return out
    nonempty = indptr[1:] > indptr[:-1]
    starts = indptr[:-1][nonempty]
    out[nonempty] = np.minimum.reduceat(values, starts)
    return out


def max_min_rates(
    incidence: csr_matrix,
    capacity: FloatArray,
    *,
    method: Literal["auto", "heap", "rounds"] = "auto",
    max_rounds: int = 100_000,
) -> FloatArray:
    """Max-min fair rates (same unit as ``capacity``) for the rows of ``incidence``.

    Parameters
    ----------
    incidence:
        CSR matrix, one row per flow, one column per link, entry = fraction of the flow on
        that link (> 0). A flow with an empty row is unconstrained and gets ``inf``.
    capacity:
        Capacity of each link (length = number of columns), > 0.

    Returns
    -------
    numpy array of one rate per flow.

    method:
        ``rounds``: the vectorized numpy rounds described in the module docstring,
        O(rounds x nnz); ``heap``: sequential water-filling over a heap of link shares,
        O(nnz + links log links), compiled with numba (docs/design/sim-maxmin.md);
        ``auto``: ``heap`` when numba is installed, else ``rounds``.
    """
    a = incidence.tocsr()
    n_flows = a.shape[0]
    rates = np.full(n_flows, np.inf, dtype=np.float64)
    if n_flows == 0:
        return rates
    a.sum_duplicates()
    if method == "heap" or (method == "auto" and _heap_kernel() is not None):
        return _max_min_heap(a, np.asarray(capacity, dtype=np.float64), rates)
    rem = np.asarray(capacity, dtype=np.float64).copy()
    cap_scale = float(np.max(rem)) if rem.size else 1.0
    live = np.flatnonzero(a.indptr[1:] > a.indptr[:-1])  # flows with at least one link
    rates[live] = 0.0
    # Work on the sub-matrix of still-active flows; it is compacted whenever half of its
    # rows froze, so late rounds (few flows left) cost little.
    sub = a[live] if live.shape[0] < n_flows else a
    for _ in range(max_rounds):
        if live.shape[0] == 0:
            break
        at = sub.T.tocsr()  # link x flow
        f_ptr = sub.indptr.astype(np.int64)
        l_ptr = at.indptr.astype(np.int64)
        f_links = sub.indices
        l_flows = at.indices
        active = np.ones(live.shape[0], dtype=bool)
        n_rows = live.shape[0]
        while active.any() and active.sum() * 2 > n_rows:
            w = at @ active.astype(np.float64)  # active weight per link
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(w > 0, np.maximum(rem, 0.0) / w, np.inf)
            fmin = _segment_min(share[f_links], f_ptr, np.inf)
            fmin_act = np.where(active, fmin, np.inf)
            lmin = _segment_min(fmin_act[l_flows], l_ptr, np.inf)
            # A bottleneck link: its share is the smallest along every active flow crossing it.
            tol = _REL_EPS * np.maximum(share, cap_scale * _REL_EPS)
            bott = (w > 0) & (share <= lmin + tol)
            # Flows that cross a bottleneck link freeze at their own smallest share.
            hit = np.zeros(n_rows, dtype=bool)
            if bott.any():
                hit_links = np.flatnonzero(bott)
                starts = l_ptr[hit_links]
                lens = l_ptr[hit_links + 1] - starts
                idx = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
                hit[l_flows[idx]] = True
            hit &= active
            if not hit.any():  # numerical corner: freeze the global minimum
                hit = active & (fmin_act <= fmin_act.min() * (1 + _REL_EPS))
            rates[live[hit]] = fmin_act[hit]
            active &= ~hit
            rem -= at @ np.where(hit, fmin_act, 0.0)
        keep = np.flatnonzero(active)
        live = live[keep]
        sub = sub[keep]
    return rates


def _water_fill(
    f_ptr: npt.NDArray[np.int64], f_idx: npt.NDArray[np.int64], f_w: FloatArray,
    l_ptr: npt.NDArray[np.int64], l_idx: npt.NDArray[np.int64], cap: FloatArray, rates: FloatArray,
    frozen: npt.NDArray[np.bool_],
) -> None:
    """Sequential progressive filling: repeatedly saturate the link with the smallest share.

    Shares ``rem / W`` only grow while filling, so a heap entry is a lower bound and a stale
    one is re-pushed when popped (lazy update): each (flow, link) pair is touched once.
    Flows with ``frozen[f]`` set on entry are ignored (not active); ``rates`` is written for
    the others. Written in the numba-compatible subset; runs as plain Python without numba.
    """
    n_links = cap.shape[0]
    n = f_ptr.shape[0] - 1
    weight = np.zeros(n_links)
    count = np.zeros(n_links, dtype=np.int64)
    for f in range(n):
        if frozen[f]:
            continue
        for k in range(f_ptr[f], f_ptr[f + 1]):
            weight[f_idx[k]] += f_w[k]
            count[f_idx[k]] += 1
    rem = cap.copy()
    heap = [(np.inf, np.int64(0))]
    heap.pop()
    for m in range(n_links):
        if count[m] > 0:
            heap.append((max(rem[m], 0.0) / weight[m], np.int64(m)))
    heapq.heapify(heap)
    while len(heap) > 0:
        s, lnk = heapq.heappop(heap)
        if count[lnk] == 0:
            continue
        cur = max(rem[lnk], 0.0) / weight[lnk] if weight[lnk] > 0 else np.inf
        if cur > s * (1.0 + 1e-12) + 1e-300:
            heapq.heappush(heap, (cur, lnk))  # stale: its share grew since it was pushed
            continue
        for k in range(l_ptr[lnk], l_ptr[lnk + 1]):
            f = l_idx[k]
            if frozen[f]:
                continue
            frozen[f] = True
            rates[f] = cur
            for j in range(f_ptr[f], f_ptr[f + 1]):
                m = f_idx[j]
                rem[m] -= cur * f_w[j]
                weight[m] -= f_w[j]
                count[m] -= 1
        count[lnk] = 0


_Kernel = Callable[..., None]


@cache
def _heap_kernel() -> _Kernel | None:
    """The numba-compiled water-filling kernel, or None when numba is not installed."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a declared dependency
        return None
    return cast(_Kernel, numba.njit(cache=True, nogil=True)(_water_fill))


def _max_min_heap(a: csr_matrix, cap: FloatArray, rates: FloatArray) -> FloatArray:
    solver = IncidenceSolver(a)
    empty = np.diff(solver.f_ptr) == 0
    out = solver.solve(~empty, cap)
    out[empty] = rates[empty]
    return out


class IncidenceSolver:
    """Max-min rates for changing subsets of the rows of one fixed incidence matrix.

    The engine routes every flow once; at each event only the set of active flows changes.
    Keeping the CSR and its transpose (and passing an activity mask to the kernel) avoids
    slicing a million-row matrix at every event: a solve costs O(active nnz + links log links).
    """

    def __init__(self, incidence: csr_matrix) -> None:
        a = incidence.tocsr()
        a.sum_duplicates()
        self.shape = a.shape
        self.matrix = a
        self.f_ptr = a.indptr.astype(np.int64)
        self.f_idx = a.indices.astype(np.int64)
        self.f_w = a.data.astype(np.float64)
        at = a.T.tocsr()
        self.transpose = at
        self.l_ptr = at.indptr.astype(np.int64)
        self.l_idx = at.indices.astype(np.int64)

    def subset(self, rows: npt.NDArray[np.int64]) -> IncidenceSolver:
        """A solver over ``rows`` only (the engine compacts when most flows are done)."""
        return IncidenceSolver(self.matrix[rows])

    def solve(self, active: npt.NDArray[np.bool_], capacity: FloatArray) -> FloatArray:
        """Rates of the active rows (0 for inactive rows; inf for active empty rows)."""
        n = self.shape[0]
        rates = np.zeros(n, dtype=np.float64)
        rates[active & (np.diff(self.f_ptr) == 0)] = np.inf
        kernel = _heap_kernel()
        if kernel is None:  # no numba: the vectorized rounds on the active sub-matrix
            idx = np.flatnonzero(active)
            rates[idx] = max_min_rates(self.matrix[idx], capacity, method="rounds")
            return rates
        frozen = ~active | (np.diff(self.f_ptr) == 0)
        kernel(self.f_ptr, self.f_idx, self.f_w, self.l_ptr, self.l_idx,
               np.asarray(capacity, dtype=np.float64).copy(), rates, frozen)
        return rates

    def loads(self, rates: FloatArray) -> FloatArray:
        """Load per link of the given per-row rates (non-finite rates count as 0)."""
        r = np.where(np.isfinite(rates), rates, 0.0)
        return np.asarray(self.transpose @ r, dtype=np.float64)


def link_loads(incidence: csr_matrix, rates: FloatArray) -> FloatArray:
    """Load on each link: ``A.T @ rates`` (infinite rates count as 0)."""
    r = np.where(np.isfinite(rates), rates, 0.0)
    return np.asarray(incidence.T @ r, dtype=np.float64)
