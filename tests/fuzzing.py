"""Shared Hypothesis settings for the property (fuzz) tests that stay in the suite.

Every fuzz target runs ``FABRICSCOPE_FUZZ_EXAMPLES`` examples (10,000 by default, the
issue's CI floor) with a fixed seed, so a CI run is reproducible. The long run
(``benchmarks/fuzz_long.py``) raises the count and lets each target run for minutes.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES = int(os.environ.get("FABRICSCOPE_FUZZ_EXAMPLES", "10000"))


def fuzz_settings(examples: int | None = None) -> settings:
    """Settings for one fuzz target: fixed seed via ``derandomize``, no deadline, no DB."""
    return settings(
        max_examples=examples if examples is not None else FUZZ_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
    )
