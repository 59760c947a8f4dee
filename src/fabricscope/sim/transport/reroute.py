"""Moving a running flow's bytes off a failed link: the split fractions of its segments.

A flow's segments (:mod:`~fabricscope.sim.transport.segments`) split at every switch in
``ch_frac``; a failed link makes a segment *dead* when its own link is down or every child it
sends bytes to is dead. Re-routing moves a dead child's share to the live children of the
same split, which is where a load balancer decides:

* ``local``: only at the switch whose own port went down (switch adaptive routing, a
  hardware ECMP group that drops a port): children whose link is down;
* ``global``: at the first split upstream that still has a live way, whatever the distance
  (a sender that stops using entropies that lost packets, REPS; routing that reconverged);
* ``spread`` moves the share to every live child in proportion to what it carries
  (spraying), ``pick`` moves it to one live child chosen by a hash of the flow (ECMP
  re-hashing after reconvergence).

Then every segment's weight (the fraction of its flow it carries) is recomputed from the
senders down. Pure numpy / numba; the engine's arrays are changed in place.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def segment_levels(s_in: IntArray, ch_ptr: IntArray, ch_idx: IntArray) -> IntArray:
    """Hop index of every segment (0 at the sender), for the top-down weight pass."""
    n = s_in.shape[0]
    level = np.where(s_in < 0, 0, -1).astype(np.int64)
    frontier = np.flatnonzero(level == 0)
    d = 0
    while frontier.shape[0]:
        d += 1
        kids = np.concatenate([ch_idx[ch_ptr[s]:ch_ptr[s + 1]] for s in frontier]) if frontier.shape[0] else frontier
        kids = np.unique(kids)
        kids = kids[level[kids] < d]
        level[kids] = d
        frontier = kids
        if d > n:
            break
    return level


@numba.njit(cache=True)
def _dead(s_edge, s_last, ch_ptr, ch_idx, ch_frac, e_down, local):  # type: ignore[no-untyped-def]
    n = s_edge.shape[0]
    dead = np.zeros(n, np.bool_)
    for s in range(n):
        dead[s] = e_down[s_edge[s]] != 0
    if local:
        return dead
    for _ in range(64):
        changed = False
        for s in range(n):
            if dead[s] or s_last[s]:
                continue
            live = False
            for m in range(ch_ptr[s], ch_ptr[s + 1]):
                if ch_frac[m] > 0.0 and not dead[ch_idx[m]]:
                    live = True
                    break
            if not live and ch_ptr[s + 1] > ch_ptr[s]:
                dead[s] = True
                changed = True
        if not changed:
            break
    return dead


@numba.njit(cache=True)
def _move(s_flow, s_last, ch_ptr, ch_idx, ch_frac, dead, flow_mask, pick, salt):  # type: ignore[no-untyped-def]
    moved = 0
    for s in range(s_flow.shape[0]):
        if s_last[s] or not flow_mask[s_flow[s]] or dead[s]:
            continue
        gone = 0.0
        live_w = 0.0
        n_live = 0
        for m in range(ch_ptr[s], ch_ptr[s + 1]):
            if dead[ch_idx[m]]:
                gone += ch_frac[m]
            else:
                live_w += ch_frac[m]
                n_live += 1
        if gone <= 0.0 or n_live == 0:
            continue
        moved += 1
        if pick:
            k = (s_flow[s] * 2654435761 + salt) % n_live
            j = 0
            for m in range(ch_ptr[s], ch_ptr[s + 1]):
                if dead[ch_idx[m]]:
                    ch_frac[m] = 0.0
                else:
                    if j == k:
                        ch_frac[m] += gone
                    j += 1
        else:
            for m in range(ch_ptr[s], ch_ptr[s + 1]):
                if dead[ch_idx[m]]:
                    ch_frac[m] = 0.0
                elif live_w > 0.0:
                    ch_frac[m] += gone * ch_frac[m] / live_w
                else:
                    ch_frac[m] = 1.0 / n_live
    return moved


@numba.njit(cache=True)
def propagate_weights(order, lo, hi, s_in, s_w, ch_ptr, ch_idx, ch_frac):  # type: ignore[no-untyped-def]
    """Recompute the weights of the segments ``order[lo:hi]`` (parents before children) from
    their senders' segments (``s_in < 0``, kept) down through ``ch_frac``. Used for all
    segments after a re-route and for one flow's after a REPS round."""
    for i in range(lo, hi):
        s = order[i]
        if s_in[s] >= 0:
            s_w[s] = 0.0
    for i in range(lo, hi):
        s = order[i]
        for m in range(ch_ptr[s], ch_ptr[s + 1]):
            s_w[ch_idx[m]] += s_w[s] * ch_frac[m]


def reroute(
    *, s_flow: IntArray, s_edge: IntArray, s_in: IntArray, s_w: FloatArray, s_last: npt.NDArray[np.bool_],
    ch_ptr: IntArray, ch_idx: IntArray, ch_frac: FloatArray, order: IntArray, e_down: npt.NDArray[np.int8],
    flow_mask: npt.NDArray[np.bool_], local: bool, pick: bool, salt: int = 0,
) -> int:
    """Move the shares of ``flow_mask``'s flows off dead segments (see the module); returns
    how many splits changed. ``order``: segments by :func:`segment_levels` (top-down)."""
    dead = _dead(s_edge, s_last, ch_ptr, ch_idx, ch_frac, e_down, local)
    moved = int(_move(s_flow, s_last, ch_ptr, ch_idx, ch_frac, dead, flow_mask, pick, np.int64(salt)))
    if moved:
        propagate_weights(order, 0, order.shape[0], s_in, s_w, ch_ptr, ch_idx, ch_frac)
    return moved
