"""Latent-path likelihood of a single lossy component for flows whose path is unknown.

Without traceroute a probe flow (one 5-tuple) is known only to take *one* of its candidate
ECMP paths, so it crosses component ``c`` with probability ``w`` (the even split per hop of
the candidate set), not "a fraction ``w`` of every probe". The linear (Poisson) model with
fractional weights used for the fast greedy search of :mod:`~fabricscope.probe.localize`
spreads a link's losses over every flow that *might* cross it; on fabrics where the probe
mesh is thin (few flows per candidate) that misspecification can favour the wrong tier. Here
each row's traversal is a latent Bernoulli: with ``w = k + phi`` (``k`` certain traversals,
``phi`` in ``[0, 1)``)::

    P(l | p) = (1 - phi) Pois(l; lam + k n p) + phi Pois(l; lam + (k + 1) n p)

which is the per-flow mixture of network tomography over unknown routes (the EM over
candidate paths of Duffield, "Network tomography of binary network performance
characteristics", IEEE Trans. IT 2006; NetBouncer, Tan et al., NSDI'19, fits the same
per-path success model). Rows with integer weights (traced paths) reduce to the Poisson
model exactly. The drop rate ``p`` is profiled on a shared log grid, so gains of different
candidates are compared on equal terms.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix

F64 = npt.NDArray[np.float64]

DEFAULT_GRID: F64 = np.geomspace(1e-4, 1.0, 97)


def _distinct(cols: list[npt.NDArray[np.float64]], weight: F64 | None = None
              ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """(index of one representative, count) of each distinct row of ``cols`` (by lexsort:
    ``np.unique(axis=0)`` sorts byte strings and is an order of magnitude slower); with
    ``weight``, the count is the sum of the members' weights."""
    order = np.lexsort(cols[::-1])
    srt = [c[order] for c in cols]
    change = np.zeros(order.shape[0], dtype=bool)
    change[0] = True
    for c in srt:
        change[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(change)
    if weight is None:
        counts = np.diff(np.r_[starts, order.shape[0]]).astype(np.float64)
    else:
        counts = np.add.reduceat(np.asarray(weight, dtype=np.float64)[order], starts)
    return order[starts], counts


def _row_loglik(p: F64, n: F64, lost: F64, lam: F64, k: F64, phi: F64, *,
                agnostic: bool = False) -> F64:
    """log P(l | p) - log P(l | 0) per entry for every ``p`` (shape ``(len(p), entries)``)."""
    pn = p[:, None] * n[None, :]
    lo = -k * pn + lost * np.log1p(k * pn / lam)
    hi = -(k + 1.0) * pn + lost * np.log1p((k + 1.0) * pn / lam)
    if agnostic:
        out: F64 = np.where(phi > 0, np.maximum(lo, hi), lo)
        return out
    with np.errstate(divide="ignore"):
        a = np.log1p(-phi) + lo
        b = np.log(phi) + hi
    out = np.logaddexp(a, b)
    return out


def mixture_gains(W: csr_matrix, n: F64, lost: F64, lam: F64,
                  grid: F64 = DEFAULT_GRID, *, agnostic: bool = False,
                  mult: F64 | None = None) -> tuple[F64, F64]:
    """Profile log-likelihood gain (nats, vs no fault) and drop rate of each column of ``W``.

    ``W[r, j]``: expected traversals of candidate ``j`` by one probe of row ``r``;
    ``n``: probes of each row; ``lost``: their losses; ``lam``: expected losses of each row
    without the candidate (background and other components); ``mult``: how many identical
    rows each row stands for (default 1). Lossless rows with equal ``(candidate, n, w)`` are
    grouped, so a million flows cost a few thousand groups.

    ``agnostic``: make no assumption on how a flow's ECMP choice is drawn (hash
    polarization makes the even split wrong: switches of two tiers hashing alike send all
    flows of one uplink to the same next hop). Each uncertain row takes whichever of "crosses
    it" / "does not" fits best: the profile likelihood over the latent paths, which only
    lossy rows that cannot cross the candidate and lossless rows that must cross it count
    against.
    """
    coo = W.tocoo()
    r, j, w = coo.row, coo.col, coo.data
    keep = w > 0
    r, j, w = r[keep], j[keep], w[keep]
    K = W.shape[1]
    k = np.floor(w + 1e-9)
    phi = np.clip(w - k, 0.0, 1.0)
    lossy = lost[r] > 0
    total = np.zeros((grid.shape[0], K))
    # Lossy entries one by one (there are few).
    if lossy.any():
        rl = r[lossy]
        ll = _row_loglik(grid, n[rl].astype(np.float64), lost[rl], np.maximum(lam[rl], 1e-300),
                         k[lossy], phi[lossy], agnostic=agnostic)
        if mult is not None:
            ll = ll * mult[rl]
        for g in range(grid.shape[0]):
            total[g] += np.bincount(j[lossy], weights=ll[g], minlength=K)
    # Lossless entries: log((1-phi) e^{-k n p} + phi e^{-(k+1) n p}), grouped.
    z = ~lossy
    if z.any():
        zj, zn, zw = j[z].astype(np.float64), n[r[z]].astype(np.float64), np.round(w[z], 9)
        first, cnt = _distinct([zj, zn, zw], None if mult is None else mult[r[z]])
        gj = zj[first].astype(np.int64)
        gk = np.floor(zw[first] + 1e-9)
        ll = _row_loglik(grid, zn[first], np.zeros(first.shape[0]), np.ones(first.shape[0]),
                         gk, np.clip(zw[first] - gk, 0.0, 1.0), agnostic=agnostic)
        for g in range(grid.shape[0]):
            total[g] += np.bincount(gj, weights=ll[g] * cnt, minlength=K)
    best = np.argmax(total, axis=0)
    gain: F64 = np.maximum(total[best, np.arange(K)], 0.0)
    p: F64 = np.where(gain > 0, grid[best], 0.0)
    return gain, p


GROUP_GRID: F64 = np.linspace(0.0, 1.0, 11)


def grouped_gains(W: csr_matrix, n: F64, lost: F64, lam: F64, group: npt.NDArray[np.int64],
                  grid: F64 = DEFAULT_GRID[::2], phis: F64 = GROUP_GRID, *,
                  mult: F64 | None = None) -> F64:
    """Profile gain of each column of ``W`` when the split of uncertain rows is unknown per
    ``group`` (the row's origin NIC): within a group, every row that may cross the candidate
    does so with one free probability ``phi`` (profiled on ``phis``), whatever the even
    split says.

    Hash polarization makes a switch send all flows that arrived over one uplink to the same
    next hop, so the flows of one origin cross a downstream link far more (or less) often
    than the even split predicts; within one origin the choice is still one hash per flow.
    A component that should have dropped the lossless flows of an origin that do cross it
    with some probability is still penalized, a device fault is not excused by free choices
    flow by flow.
    """
    coo = W.tocoo()
    r, j, w = coo.row, coo.col, coo.data
    keep = w > 0
    r, j, w = r[keep], j[keep], w[keep]
    K = W.shape[1]
    if r.size == 0:
        return np.zeros(K)
    k = np.floor(w + 1e-9)
    unsure = (w - k) > 1e-9
    G = int(group.max()) + 1 if group.size else 1
    cell = j.astype(np.int64) * G + group[r]
    cells, cinv = np.unique(cell, return_inverse=True)
    cinv = cinv.ravel()
    # Entries grouped by (cell, n, lost, lam, k, unsure): lossless ones collapse a lot.
    lossy = lost[r] > 0
    lam_e = np.where(lossy, np.maximum(lam[r], 1e-300), 1.0)
    cols = [cinv.astype(np.float64), n[r].astype(np.float64), lost[r], lam_e, k,
            unsure.astype(np.float64)]
    first, cnt = _distinct(cols, None if mult is None else mult[r])
    ci = cinv[first].astype(np.int64)
    un, ul, ulam, uk = (c[first] for c in cols[1:5])
    uu = unsure[first]
    best = np.full((grid.shape[0], cells.shape[0]), -np.inf)
    for phi in phis:
        ll = _row_loglik(grid, un, ul, ulam, uk, np.where(uu, phi, 0.0))
        tot = np.zeros((grid.shape[0], cells.shape[0]))
        for g in range(grid.shape[0]):
            tot[g] = np.bincount(ci, weights=ll[g] * cnt, minlength=cells.shape[0])
        best = np.maximum(best, tot)
    col = (cells // G).astype(np.int64)
    per_p = np.zeros((grid.shape[0], K))
    for g in range(grid.shape[0]):
        per_p[g] = np.bincount(col, weights=best[g], minlength=K)
    out: F64 = np.maximum(per_p.max(axis=0), 0.0)
    return out
