"""Scoring diagnoses against injected truth, as NIKA does (OPERATIONS.md section 3).

Set-based precision / recall / F1 over (resource, fault type) pairs, plus localization-only
(resources) and fault-type-only (types) F1; rule-based, no judge. Per scenario the predicted
set is the root causes of every incident the run opened; aggregates are micro (sums of true
positives, false positives and false negatives over scenarios) and macro (mean per-scenario
F1; a scenario with no truth and no prediction scores 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Pair = tuple[str, str]  # (resource, fault type)


@dataclass(frozen=True, slots=True)
class PRF:
    """Counts and the derived precision / recall / F1."""

    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        if self.tp + self.fp + self.fn == 0:
            return 1.0
        return 2 * p * r / (p + r) if p + r else 0.0

    def __add__(self, other: PRF) -> PRF:
        return PRF(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)


def prf(truth: Iterable[object], predicted: Iterable[object]) -> PRF:
    """Set precision / recall counts of ``predicted`` against ``truth``."""
    t, p = set(truth), set(predicted)
    return PRF(len(t & p), len(p - t), len(t - p))


@dataclass(frozen=True, slots=True)
class ScenarioScore:
    """One scenario's three scores."""

    pairs: PRF
    resources: PRF
    types: PRF


def score_scenario(truth: Sequence[Pair], predicted: Sequence[Pair]) -> ScenarioScore:
    """NIKA's pair, localization-only and type-only scores for one scenario."""
    return ScenarioScore(prf(truth, predicted), prf((r for r, _ in truth), (r for r, _ in predicted)),
                         prf((t for _, t in truth), (t for _, t in predicted)))


def micro(scores: Sequence[ScenarioScore], which: str = "pairs") -> PRF:
    """Summed counts over scenarios (``which``: pairs, resources or types)."""
    total = PRF(0, 0, 0)
    for s in scores:
        total = total + getattr(s, which)
    return total


def macro_f1(scores: Sequence[ScenarioScore], which: str = "pairs") -> float:
    """Mean per-scenario F1 (1.0 for an empty list)."""
    if not scores:
        return 1.0
    return float(sum(getattr(s, which).f1 for s in scores)) / len(scores)
