"""Group-by primitives for the span analysis, linear or n log n with small constants at 10^7 rows.

``np.unique`` and ``np.lexsort`` over ten million rows cost seconds each (two comparison sorts, random
memory access); the SLO analysis needs a handful of them. These do the same jobs faster:

- :func:`factorize` codes values by hashing (Arrow's ``dictionary_encode``), then sorts only the
  distinct values, so the codes equal ``np.unique(v, return_inverse=True)``'s;
- :func:`sort_within_groups` sorts values inside their groups with one sort of 64-bit words that
  pack (group, value) when the values are small non-negative integers (durations in ns), falling
  back to ``np.lexsort`` otherwise; the result is the same either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["factorize", "group_median", "group_order_stats", "group_quantile", "segment_cummax",
           "sort_within_groups"]


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(uniques, codes)`` as ``np.unique(values, return_inverse=True)`` gives them, by hashing."""
    v = np.ascontiguousarray(values)
    if len(v) == 0:
        return v[:0], np.zeros(0, dtype=np.int64)
    import pyarrow as pa
    import pyarrow.compute as pc

    d = pc.dictionary_encode(pa.array(v))
    uniq = np.asarray(d.dictionary.to_numpy(zero_copy_only=False))
    idx = np.asarray(d.indices.to_numpy(zero_copy_only=False))
    o = np.argsort(uniq, kind="stable")
    rank = np.empty(len(o), dtype=np.int64)
    rank[o] = np.arange(len(o), dtype=np.int64)
    return uniq[o], rank[idx]


def sort_within_groups(keys: np.ndarray, vals: np.ndarray, nkeys: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``vals`` sorted by (key, value), with the count and the first position of each key.

    ``keys`` are codes in ``[0, nkeys)``. When every value is a non-negative integer (as a float or
    an int) below ``2**(63 - bits(nkeys))`` the pair is packed into one int64 and sorted once
    (``np.sort``, no permutation); otherwise ``np.lexsort`` sorts the pairs. NaN sorts last in a group
    (as ``np.lexsort`` puts it).
    """
    k = np.asarray(keys, dtype=np.int64)
    cnt = np.bincount(k, minlength=nkeys)
    first = np.zeros(nkeys, dtype=np.int64)
    if nkeys > 1:
        np.cumsum(cnt[:-1], out=first[1:])
    if len(k) == 0:
        return np.asarray(vals)[:0], cnt, first
    vb = 63 - max(1, int(nkeys - 1).bit_length())
    v = np.asarray(vals)
    packable = False
    if v.dtype.kind in "iu":
        packable = bool(v.min() >= 0 and int(v.max()) < (1 << vb))
    elif v.dtype.kind == "f" and np.isfinite(v).all():
        packable = bool(v.min() >= 0 and v.max() < float(1 << min(vb, 52)) and np.array_equal(v, np.floor(v)))
    if packable:
        packed = (k << np.int64(vb)) | v.astype(np.int64)
        packed.sort()
        out = (packed & np.int64((1 << vb) - 1)).astype(v.dtype)
        return out, cnt, first
    order = np.lexsort((v, k))
    return v[order], cnt, first


def group_order_stats(keys: np.ndarray, vals: np.ndarray, nkeys: int, ranks: Sequence[Callable[[np.ndarray], np.ndarray]],
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Order statistics per key: row ``j`` holds, per key, the value of rank ``ranks[j](count)``.

    ``ranks[j]`` maps the per-key counts to 0-based ranks in the key's sorted values (NaN sorts
    last). Groups are formed by one stable radix sort of the key codes (16-bit when ``nkeys`` fits)
    and each group is selected with ``np.partition`` (introselect, O(n) per group), which beats a
    full sort of (key, value) by about 4x at 10^7 rows; with many small groups one sort is used
    instead. Returns the ``(len(ranks), nkeys)`` values (NaN for empty keys) and the counts.
    """
    k = np.asarray(keys, dtype=np.int64)
    out = np.full((len(ranks), nkeys), np.nan)
    cnt = np.bincount(k, minlength=nkeys)
    if len(k) == 0:
        return out, cnt
    first = np.zeros(nkeys, dtype=np.int64)
    if nkeys > 1:
        np.cumsum(cnt[:-1], out=first[1:])
    has = np.flatnonzero(cnt)
    rk = np.stack([np.clip(np.asarray(r(cnt), dtype=np.int64), 0, np.maximum(cnt - 1, 0)) for r in ranks])
    if len(has) * 64 > len(k):  # many small groups: one sort of (key, value)
        sv, _, _ = sort_within_groups(k, vals, nkeys)
        for j in range(len(ranks)):
            out[j, has] = sv[first[has] + rk[j, has]]
        return out, cnt
    o = np.argsort(k.astype(np.uint16) if nkeys <= 1 << 16 else k, kind="stable")
    sv = np.asarray(vals)[o]
    for g in has.tolist():
        seg = sv[first[g]: first[g] + cnt[g]]
        kth = np.unique(rk[:, g])
        part = np.partition(seg, kth)
        out[:, g] = part[rk[:, g]]
    return out, cnt


def group_quantile(keys: np.ndarray, vals: np.ndarray, nkeys: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """The ``floor((n - 1) q)``-th smallest value per key (NaN where a key has none) and the count per key."""
    res, cnt = group_order_stats(keys, vals, nkeys, [lambda c: ((c - 1) * q).astype(np.int64)])
    return res[0], cnt


def group_median(keys: np.ndarray, vals: np.ndarray, nkeys: int) -> tuple[np.ndarray, np.ndarray]:
    """The lower median per key (the ``(n - 1) // 2``-th smallest; NaN where a key has none) and the count."""
    res, cnt = group_order_stats(keys, vals, nkeys, [lambda c: (c - 1) // 2])
    return res[0], cnt


def segment_cummax(seg: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Running maximum of ``vals`` restarted at every change of the non-decreasing ``seg``.

    Hillis-Steele doubling scan (Hillis & Steele, CACM 1986): ``ceil(log2 L)`` vectorized passes for a
    longest segment of ``L`` rows, so O(n log L) with no per-row Python work.
    """
    v = np.array(vals, copy=True)
    n = len(v)
    if n < 2:
        return v
    s = np.asarray(seg)
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    longest = int(np.diff(np.append(starts, n)).max())
    d = 1
    while d < longest:
        same = s[d:] == s[:-d]
        cand = np.where(same, v[:-d], v[d:])
        np.maximum(v[d:], cand, out=v[d:])
        d *= 2
    return v
