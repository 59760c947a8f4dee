"""The three rules on generated traces: 0 findings on healthy chains, breaches blamed on the slow hop."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.slo.chains import analyze_chains
from fabricscope.slo.otlp import SpanTable, read_spans, spans_from_batches
from fabricscope.slo.rules import RuleConfig, evaluate_rules, load_rules
from fabricscope.slo.windows import window_stats
from fabricscope.twin.agent_traces import (
    AgentTraceConfig,
    generate_agent_traces,
    write_agent_traces,
)


def _run(tmp_path: Path, cfg: AgentTraceConfig, seed: int, rules: RuleConfig | None = None) -> list:  # type: ignore[type-arg]
    p = tmp_path / "t.jsonl"
    truth = write_agent_traces(p, cfg, seed=seed)
    t = read_spans([p])
    return [evaluate_rules(t, analyze_chains(t, slo_ns=25_000_000), rules or RuleConfig()), truth]


def test_healthy_chains_no_finding(tmp_path: Path) -> None:
    # 5 minutes at 10 chains/s: enough windows for the 3-minute rule to be able to fire
    findings, _ = _run(tmp_path, AgentTraceConfig(n_traces=3000, qps=10), seed=5)
    assert findings == []


def test_persistent_slow_tool_breach_blamed_on_it(tmp_path: Path) -> None:
    cfg = AgentTraceConfig(n_traces=3000, qps=10, slow_fraction=0.15, slow_kinds=("network",))
    findings, truth = _run(tmp_path, cfg, seed=8)
    breaches = [f for f in findings if f.kind == "slo-breach"]
    assert breaches
    slow_hops = {t.hop for t in truth if t.kind}
    for f in breaches:
        assert f.subject in slow_hops and "->" in f.subject
        assert f.evidence and f.window[1] > f.window[0]
        assert "backup model" in f.action


def test_error_rate_alert(tmp_path: Path) -> None:
    findings, _truth = _run(tmp_path, AgentTraceConfig(n_traces=1200, qps=10, error_rate=0.05), seed=4)
    alerts = [f for f in findings if f.kind == "slo-error-rate"]
    failed_services = {f.subject for f in alerts}
    assert alerts and all(f.details["error_rate"] > 0.001 for f in alerts)
    assert failed_services <= {"task-dispatch", "llm-gateway", "agent-planner", "agent-research", "agent-coder",
                               "agent-analyst", "tool-search", "tool-sql", "tool-python", "tool-retrieval"}
    assert not any(f.kind == "slo-breach" for f in findings)


def test_outlier_endpoint_needs_ten(tmp_path: Path) -> None:
    cfg = AgentTraceConfig(n_traces=600, qps=10, slow_fraction=0.5, slow_kinds=("tool",))
    strict, _ = _run(tmp_path, cfg, seed=9, rules=RuleConfig(outlier_count=10_000))
    loose, _ = _run(tmp_path, cfg, seed=9)
    assert not [f for f in strict if f.kind == "slo-outlier-endpoint"]
    out = [f for f in loose if f.kind == "slo-outlier-endpoint"]
    assert out and all(f.subject.startswith("tool-") for f in out)
    assert all(int(f.details["slow_requests"]) >= 10 for f in out)


def test_rules_yaml(tmp_path: Path) -> None:
    p = tmp_path / "rules.yaml"
    p.write_text("slo_ms: 30\nlatency: {threshold_ms: 20, for_s: 120}\noutlier: {count: 5}\n"
                 "services: {llm-gateway: {slo_ms: 10}}\n")
    cfg = load_rules(p)
    assert (cfg.slo_ms, cfg.latency_threshold_ms, cfg.latency_for_s, cfg.outlier_count) == (30.0, 20.0, 120.0, 5)
    assert cfg.service_slo_ms == {"llm-gateway": 10.0}
    p.write_text("latency: {treshold_ms: 20}\n")
    with pytest.raises(ConfigError, match=r"rules.yaml: unknown rule key latency.treshold_ms"):
        load_rules(p)
    p.write_text("latency: {threshold_ms: fast}\n")
    with pytest.raises(ConfigError, match=r"latency\.threshold_ms: 'fast'"):
        load_rules(p)


def test_window_quantiles_exact(tmp_path: Path) -> None:
    import numpy as np

    p = tmp_path / "t.jsonl"
    write_agent_traces(p, AgentTraceConfig(n_traces=500, qps=50), seed=1)
    t = read_spans([p])
    ws = window_stats(t, window_ns=2 * 10**9, step_ns=10**9)
    i = next(k for k in range(len(ws)) if ws.service[k] == "task-dispatch" and ws.requests[k] > 50)
    w0 = ws.window_start_ns[i]
    m = (t.kind == 2) & (np.array(t.services)[t.service] == "task-dispatch") & (t.start_ns >= w0) & \
        (t.start_ns < w0 + 2 * 10**9)
    d = np.sort((t.end_ns[m] - t.start_ns[m]) / 1e6)
    assert ws.requests[i] == len(d)
    assert ws.p99_ms[i] == d[int(np.ceil(0.99 * len(d))) - 1]
    assert ws.p50_ms[i] == d[int(np.ceil(0.5 * len(d))) - 1]
    llm = [k for k in range(len(ws)) if ws.service[k] == "llm-gateway"]
    assert all(0.03 < ws.token_ms[k] < 0.12 for k in llm)  # 0.06 ms per token, lognormal jitter 0.2
    with pytest.raises(ConfigError):
        window_stats(t, window_ns=3, step_ns=2)


def test_several_slow_tools_are_several_clear_breaches(tmp_path: Path) -> None:
    """Each slow request is slow in one of four tools: upstream series split their blame over
    the four, but each tool explains its own series, so each is a breach of its own, not an
    ambiguous one (it was scored 0.27 and called "split" before)."""
    cfg = AgentTraceConfig(n_traces=2000, qps=10, slow_fraction=0.3, slow_kinds=("tool",))
    findings, truth = _run(tmp_path, cfg, seed=11)
    breaches = [f for f in findings if f.kind == "slo-breach"]
    slow_hops = {t.hop for t in truth if t.kind}
    assert breaches and {f.subject for f in breaches} <= slow_hops
    assert all(f.details["ambiguous"] == 0 and f.score > 0.9 for f in breaches), \
        [(f.subject, f.score) for f in breaches]


def _stretched(t: SpanTable, factor: float) -> SpanTable:
    """Every span's times scaled about its trace's start: every hop slower by the same factor."""
    _, inv = np.unique(t.trace_id, return_inverse=True)
    t0 = np.full(inv.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(t0, inv, t.start_ns)
    base = t0[inv]
    return replace(t, start_ns=base + ((t.start_ns - base) * factor).astype(np.int64),
                   end_ns=base + ((t.end_ns - base) * factor).astype(np.int64),
                   ttft_ns=np.where(t.ttft_ns >= 0, (t.ttft_ns * factor).astype(np.int64), -1))


def test_diffuse_slowness_is_one_unlocalized_breach() -> None:
    # every hop 2.6x slower in every trace: no hop stands out, none holds most of the latency
    batches, _ = generate_agent_traces(AgentTraceConfig(n_traces=3000, qps=10), seed=4)
    t = _stretched(spans_from_batches(batches), 2.6)
    breaches = [f for f in evaluate_rules(t, analyze_chains(t, slo_ns=25_000_000), RuleConfig())
                if f.kind == "slo-breach"]
    assert [f.subject for f in breaches] == ["unlocalized"]
    (f,) = breaches
    assert int(f.details["breached_series"]) > 1 and f.details["ambiguous"] == 1 and f.details["persistent"] == 0
    assert "diffuse" in f.evidence[-1]


def test_persistent_hop_named_by_its_share_with_the_evidence_saying_so() -> None:
    batches, _ = generate_agent_traces(AgentTraceConfig(n_traces=3000, qps=10, persistent_hop="llm-gateway",
                                                        persistent_ms=20.0), seed=4)
    t = spans_from_batches(batches)
    breaches = [f for f in evaluate_rules(t, analyze_chains(t, slo_ns=25_000_000), RuleConfig())
                if f.kind == "slo-breach"]
    assert [f.subject for f in breaches] == ["llm-gateway"]
    (f,) = breaches
    assert f.details["persistent"] == 1 and f.details["ambiguous"] == 0 and f.score > 0.5
    assert "persistent slowness" in f.evidence[-1] and "% of the latency" in f.evidence[-1]
    # the same without the slow hop: nothing at all
    healthy, _ = generate_agent_traces(AgentTraceConfig(n_traces=3000, qps=10), seed=4)
    th = spans_from_batches(healthy)
    assert evaluate_rules(th, analyze_chains(th, slo_ns=25_000_000), RuleConfig()) == []


def test_no_empty_candidate_list_in_evidence(tmp_path: Path) -> None:
    cfg = AgentTraceConfig(n_traces=3000, qps=10, slow_fraction=0.15, slow_kinds=("network",))
    findings, _ = _run(tmp_path, cfg, seed=8)
    for f in findings:
        assert not any(e.rstrip().endswith("candidates:") for e in f.evidence), f.evidence
