"""The fast group-by primitives of the SLO analysis give exactly what np.unique / np.lexsort give."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.slo._group import (
    factorize,
    group_median,
    group_order_stats,
    group_quantile,
    sort_within_groups,
)


def _ref_sorted(keys: np.ndarray, vals: np.ndarray) -> np.ndarray:
    return vals[np.lexsort((vals, keys))]


def _ref_rank(keys: np.ndarray, vals: np.ndarray, nkeys: int, rank: object) -> np.ndarray:
    out = np.full(nkeys, np.nan)
    for g in range(nkeys):
        v = np.sort(vals[keys == g])
        if len(v):
            r = int(np.clip(rank(np.array([len(v)]))[0], 0, len(v) - 1))  # type: ignore[operator]
            out[g] = v[r]
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-5, 5) | st.integers(-(2**62), 2**62), max_size=200))
def test_factorize_equals_unique(xs: list[int]) -> None:
    v = np.array(xs, dtype=np.int64)
    u, codes = factorize(v)
    ru, rc = np.unique(v, return_inverse=True)
    assert np.array_equal(u, ru) and np.array_equal(codes, rc.ravel())


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.lists(st.tuples(st.integers(0, 11), st.integers(0, 10**6)), max_size=300),
       st.booleans(), st.booleans())
def test_sort_and_order_stats_equal_the_reference(nkeys: int, rows: list[tuple[int, int]], as_float: bool,
                                                  with_nan: bool) -> None:
    keys = np.array([k % nkeys for k, _ in rows], dtype=np.int64)
    vals = np.array([v for _, v in rows], dtype=np.float64 if as_float else np.int64)
    if with_nan and as_float and len(vals):
        vals[:: 3] = np.nan
    sv, cnt, _first = sort_within_groups(keys, vals, nkeys)
    assert np.array_equal(sv, _ref_sorted(keys, vals), equal_nan=True)
    assert np.array_equal(cnt, np.bincount(keys, minlength=nkeys))
    med, _ = group_median(keys, vals, nkeys)
    assert np.array_equal(med, _ref_rank(keys, vals, nkeys, lambda c: (c - 1) // 2), equal_nan=True)
    q10, _ = group_quantile(keys, vals, nkeys, 0.1)
    assert np.array_equal(q10, _ref_rank(keys, vals, nkeys, lambda c: ((c - 1) * 0.1).astype(int)), equal_nan=True)


def test_both_paths_of_order_stats_agree_at_scale() -> None:
    rng = np.random.default_rng(3)
    # few large groups (partition path) and many small ones (sort path), plus > 2**16 keys
    for nkeys, n in ((40, 200_000), (50_000, 200_000), (70_000, 300_000)):
        keys = rng.integers(0, nkeys, n)
        vals = rng.lognormal(0, 1, n)
        got, cnt = group_order_stats(keys, vals, nkeys, [lambda c: (c - 1) // 2, lambda c: np.ceil(0.99 * c) - 1])
        sv = _ref_sorted(keys, vals)
        first = np.concatenate(([0], np.cumsum(cnt)[:-1]))
        has = cnt > 0
        assert np.array_equal(got[0, has], sv[first[has] + (cnt[has] - 1) // 2])
        assert np.array_equal(got[1, has], sv[first[has] + np.maximum(np.ceil(0.99 * cnt[has]) - 1, 0).astype(int)])
        assert np.isnan(got[:, ~has]).all()
