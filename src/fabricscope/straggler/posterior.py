"""Cross-iteration MAP / posterior ranking of candidate devices (after Holmes, NSDI'25).

Each candidate device d (GPU, NIC, switch) explains a pattern: under "d is faulty during an
interval W of iterations", every observation involving d inside W is slow with probability
``p_hit`` and every other observation with ``p_false``; outside W (and under the null
hypothesis "no device fault") all observations are slow with ``p_false``. The log-likelihood
ratio against the null is then, per iteration, ``h * log(p_hit/p_false) - f *
log((1-p_false)/(1-p_hit))`` (h slow and f fast observations involving d), summed over the
best interval (a maximum-subarray problem, solved for all candidates at once with cumulative
sums). A device shared by many groups (a leaf, a busy NIC) collects the fast observations of
every group it serves, so it is not blamed for one group's slowness: the prior need not
penalize central devices much, and it is the evidence that does.

Yao et al., "Holmes: Localizing Irregularities in LLM Training with Mega-scale GPU
Clusters", NSDI'25 (operator graph, cross-iteration analysis, MAP over devices).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

P_HIT = 0.9
P_FALSE = 0.01


@dataclass(frozen=True, slots=True)
class Windowed:
    """Best interval per candidate: LLR and the [start, end) iteration positions."""

    llr: F64
    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]


def interval_llr(
    hits: F64, fasts: F64, *, p_hit: float = P_HIT, p_false: float | F64 = P_FALSE
) -> Windowed:
    """LLR of "faulty during its best interval" vs "no fault" for every candidate (row).

    ``hits``/``fasts``: [candidates, iterations] counts of slow / fast observations involving
    each candidate; ``p_false`` may be one rate per candidate. Returns the maximum over intervals (Kadane via prefix sums) and where.
    """
    pf = np.asarray(p_false, dtype=np.float64)
    pf = pf[:, None] if pf.ndim == 1 else pf
    a = np.log(p_hit / pf)
    b = np.log(np.maximum(1.0 - pf, 1e-12) / (1.0 - p_hit))
    score = hits * a - fasts * b
    n_c, n_i = score.shape
    cs = np.zeros((n_c, n_i + 1))
    np.cumsum(score, axis=1, out=cs[:, 1:])
    runmin = np.minimum.accumulate(cs, axis=1)
    gain = cs[:, 1:] - runmin[:, :-1]
    end = np.argmax(gain, axis=1) if n_i else np.zeros(n_c, dtype=np.int64)
    best = gain[np.arange(n_c), end] if n_i else np.zeros(n_c)
    # The interval starts just after the prefix minimum that precedes its end.
    start = np.zeros(n_c, dtype=np.int64)
    if n_i:
        for c in np.flatnonzero(best > 0).tolist():
            start[c] = int(np.argmin(cs[c, : end[c] + 1]))
    return Windowed(np.maximum(best, 0.0), start, (end + 1).astype(np.int64))


def posteriors(llr: F64, log_prior: F64, *, log_prior_null: float) -> tuple[F64, F64, float]:
    """Normalized posterior over {null} + candidates, and each candidate's own odds.

    Returns ``(share, individual, p_null)``: ``share`` is P(d is the culprit) under the
    single-fault assumption; ``individual`` is P(d faulty) against the null alone.
    """
    lp = log_prior + llr
    top = max(float(lp.max()) if lp.size else -np.inf, log_prior_null)
    w = np.exp(lp - top)
    w0 = float(np.exp(log_prior_null - top))
    total = w0 + float(w.sum())
    individual = 1.0 / (1.0 + np.exp(np.clip(log_prior_null - lp, -700, 700)))
    return w / total, individual, w0 / total
