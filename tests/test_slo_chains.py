"""Breach localization on generated chains: the right hop for >= 95% of one-slow-hop chains, none on healthy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fabricscope.slo.chains import analyze_chains, hex_keys, hop_shares
from fabricscope.slo.otlp import read_spans
from fabricscope.twin.agent_traces import AgentTraceConfig, write_agent_traces


@pytest.mark.parametrize("kind", ["service", "tool", "network"])
def test_one_slow_hop_localized(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "t.jsonl"
    truth = write_agent_traces(p, AgentTraceConfig(n_traces=600, slow_fraction=0.5, slow_kinds=(kind,)), seed=11)
    ch = analyze_chains(read_spans([p]), slo_ns=25_000_000)
    by_id = {t.trace_id: t for t in truth}
    got = dict(zip((x.decode() for x in ch.trace_id), ch.blamed_subjects(), strict=True))
    slow = [t for t in truth if t.kind]
    healthy = [t for t in truth if not t.kind]
    assert len(slow) > 200 and len(healthy) > 200
    hits = sum(got[t.trace_id] == t.hop for t in slow)
    # target 95%: with n ~ 300, a true rate of 0.95 falls below 0.92 with probability < 1%
    assert hits / len(slow) >= 0.92, (hits, len(slow))
    false_blame = sum(got[t.trace_id] != "" for t in healthy)
    assert false_blame == 0
    assert set(by_id) == set(got)


def test_hop_shares_sum_to_one_per_trace(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    write_agent_traces(p, AgentTraceConfig(n_traces=50), seed=2)
    ch = analyze_chains(read_spans([p]), slo_ns=25_000_000)
    per_trace = np.bincount(ch.trace, weights=ch.excl_ns) / ch.e2e_ns
    # exclusive times of a sequential chain partition the root's duration
    assert np.allclose(per_trace, 1.0, atol=1e-9)
    kinds = {r["kind"] for r in hop_shares(ch)}
    assert kinds == {"service", "edge", "call"}


def test_hex_keys_distinct() -> None:
    ids = np.array([f"{i:032x}".encode() for i in range(1000)], dtype="S32")
    assert len(np.unique(hex_keys(ids))) == 1000
