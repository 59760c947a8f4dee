"""Breach localization (``slo.chains``, ``slo.rules``) on the harder generated workloads of ``twin.agent_traces``.

Per case, 1000 seeded chains, half of them with one slow hop; the localized share is checked against
the 95% target with a one-sided binomial tolerance at 1% (``hits >= n p - 2.33 sqrt(n p (1-p))``) and the
healthy half's false blames against 1% the same way, so a pass or a fail is a statement about the
method, not about the draw. Cases the method does not meet yet are ``xfail(strict=True)`` with the
cause: once ``chains.py`` is fixed they XPASS, which fails the run until the marker is removed.

``python tests/test_slo_hard_chains.py`` prints the table of every case (localized %, false blames).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.slo.chains import analyze_chains
from fabricscope.slo.otlp import SpanTable, spans_from_batches
from fabricscope.slo.rules import RuleConfig, evaluate_rules
from fabricscope.twin.agent_traces import AgentTraceConfig, ChainTruth, generate_agent_traces

Z_1PCT = 2.326  # one-sided 1% normal quantile
TARGET = 0.95
FALSE_MAX = 0.01
SEED = 11
SLO_NS = 25_000_000


def _cfg(**kw: object) -> AgentTraceConfig:
    return AgentTraceConfig(n_traces=1000, slow_fraction=0.5, **kw)  # type: ignore[arg-type]


# name -> (config, why it fails today or "" when it meets the target)
CASES: dict[str, tuple[AgentTraceConfig, str]] = {
    "baseline": (_cfg(), ""),
    "parallel-3-tools": (_cfg(parallel_tools=3), ""),
    "lognormal-0.6": (_cfg(jitter=0.6), ""),
    "slowdown-2-5ms": (_cfg(slowdown_ms=(2.0, 5.0)), ""),
    "parallel-3-small": (_cfg(parallel_tools=3, slowdown_ms=(2.0, 5.0)), ""),
    "lognormal-0.5-small": (_cfg(jitter=0.5, slowdown_ms=(2.0, 5.0)),
                            "a 2-5 ms slowdown on a ~1.5 ms hop with sigma-0.5 lognormal jitter is a 1.6-3 sigma "
                            "event on the log scale, which a healthy chain of ~13 hops shows by chance ~50% of the "
                            "time: per trace it is noise (~50% localized at <= 1% false blames)"),
    "retries": (AgentTraceConfig(n_traces=1000, retry_fraction=0.3), ""),
    "clock-skew-0.5ms": (_cfg(skew_ms=0.5), ""),
    "all-hard": (_cfg(parallel_tools=3, jitter=0.5, slowdown_ms=(2.0, 5.0), retry_fraction=0.1, skew_ms=0.5),
                 "contains lognormal-0.5-small's 2-5 ms slowdowns in a sigma-0.5 tail (~50% localized)"),
}


@dataclass(frozen=True)
class Score:
    slow: int
    hits: int
    healthy: int
    false: int

    @property
    def rate(self) -> float:
        return self.hits / self.slow if self.slow else float("nan")


def _lower(n: int, p: float) -> float:
    return n * p - Z_1PCT * math.sqrt(n * p * (1 - p))


def _upper(n: int, p: float) -> float:
    return n * p + Z_1PCT * math.sqrt(n * p * (1 - p))


def _generate(cfg: AgentTraceConfig, seed: int = SEED) -> tuple[SpanTable, list[ChainTruth]]:
    batches, truth = generate_agent_traces(cfg, seed=seed)
    return spans_from_batches(batches), truth


def score(cfg: AgentTraceConfig, seed: int = SEED) -> Score:
    """Localize every trace; count the slow traces blamed on their true hop and the healthy ones blamed at all."""
    t, truth = _generate(cfg, seed)
    ch = analyze_chains(t, slo_ns=SLO_NS)
    got = dict(zip((x.decode() for x in ch.trace_id), ch.blamed_subjects(), strict=True))
    slow = [x for x in truth if x.kind]
    healthy = [x for x in truth if not x.kind and not x.persistent]
    return Score(len(slow), sum(got[x.trace_id] == x.hop for x in slow), len(healthy),
                 sum(got[x.trace_id] != "" for x in healthy))


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=why) if why else ()) for n, (_, why) in CASES.items()])
def test_localization_meets_target(name: str) -> None:
    s = score(CASES[name][0])
    assert s.slow > 250 and s.healthy > 250
    assert s.hits >= _lower(s.slow, TARGET), f"{name}: localized {s.hits}/{s.slow} = {s.rate:.1%}"
    assert s.false <= _upper(s.healthy, FALSE_MAX), f"{name}: {s.false}/{s.healthy} healthy chains blamed"


@pytest.mark.parametrize("cfg", [AgentTraceConfig(n_traces=3000, qps=10, parallel_tools=3),
                                 AgentTraceConfig(n_traces=3000, qps=10, skew_ms=0.5),
                                 AgentTraceConfig(n_traces=3000, qps=10, jitter=0.35)],
                         ids=["parallel", "skew", "lognormal-0.35"])
def test_no_rule_fires_on_healthy_hard_chains(cfg: AgentTraceConfig) -> None:
    # five minutes at 10 chains/s: the 3-minute rule has room to fire; e2e P99 stays under 15 ms
    t, _ = _generate(cfg, seed=3)
    assert evaluate_rules(t, analyze_chains(t, slo_ns=SLO_NS), RuleConfig()) == []


@pytest.mark.parametrize("hop", [
    "llm-gateway",  # every trace breaches: no healthy reference; the breach names it by its share
    "tool-sql/tool.sql_query",  # one trace in four, all of them slow: the same, within those traces
])
def test_persistent_slowness_breach_names_the_hop(hop: str) -> None:
    cfg = AgentTraceConfig(n_traces=3000, qps=10, persistent_hop=hop, persistent_ms=20.0)
    t, truth = _generate(cfg, seed=3)
    through = sum(x.persistent == hop for x in truth)
    assert through == 3000 if hop == "llm-gateway" else 600 < through < 900  # one tool agent in four
    breaches = [f for f in evaluate_rules(t, analyze_chains(t, slo_ns=SLO_NS), RuleConfig()) if f.kind == "slo-breach"]
    assert [f.subject for f in breaches] == [hop]


# -- the generator's harder options do what they say --------------------------------------------


def _spans(batches: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(service, instance, span) for every span of the export requests."""
    return [(rs["resource"]["attributes"][0]["value"]["stringValue"],
             rs["resource"]["attributes"][1]["value"]["stringValue"], sp)
            for b in batches for rs in b["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]


def test_defaults_unchanged_by_the_new_options() -> None:
    # digests of the output before the harder options existed: the default workload is draw-for-draw the same
    want = {50: "6a03bde2dca5d97eaf3487b7c71adeee1924cfc028d079f6d4c0888ae9fb6a48"}
    for n, digest in want.items():
        b, _ = generate_agent_traces(AgentTraceConfig(n_traces=n), seed=0)
        assert hashlib.sha256(json.dumps(b, sort_keys=True).encode()).hexdigest() == digest


def test_parallel_tools_overlap_and_critical_path_is_the_max() -> None:
    b, truth = generate_agent_traces(AgentTraceConfig(n_traces=200, parallel_tools=3, slow_fraction=0.5, jitter=0.6,
                                                      slow_kinds=("tool",), slowdown_ms=(0.3, 1.0)), seed=4)
    by_parent: dict[str, list[dict[str, Any]]] = {}
    servers = {}
    for svc, _, sp in _spans(b):
        by_parent.setdefault(str(sp.get("parentSpanId", "")), []).append(sp)
        if svc.startswith("agent-") and sp["kind"] == 2:
            servers[str(sp["spanId"])] = sp
    assert len(servers) == 200
    after_max, rest = [], []
    for sid, sp in servers.items():
        tools = [c for c in by_parent[sid] if c["name"] == "POST /v1/tool"]
        assert len({c["attributes"][0]["value"]["stringValue"].rsplit("-", 1)[0] for c in tools}) == 3
        d = [int(c["endTimeUnixNano"]) - int(c["startTimeUnixNano"]) for c in tools]
        starts = {int(c["startTimeUnixNano"]) for c in tools}
        assert len(starts) == 1  # fanned out at once
        waited = int(sp["endTimeUnixNano"]) - starts.pop()
        assert waited >= max(d)  # the agent waits for the longest call...
        after_max.append(waited - max(d))
        rest.append(sum(d) - max(d))
    assert np.median(after_max) < 0.25 * np.median(rest)  # ...and not for the sum of them
    # some slow branches are not the longest: recorded, so a localizer is not blamed for missing them
    assert 0 < sum(not x.critical for x in truth if x.kind) < sum(1 for x in truth if x.kind)


def test_retries_fail_then_succeed() -> None:
    b, truth = generate_agent_traces(AgentTraceConfig(n_traces=300, retry_fraction=0.5), seed=6)
    retried = {x.trace_id: x.hop for x in truth if x.kind == "retry"}
    assert 100 < len(retried) < 200
    calls: dict[str, list[tuple[int, bool, str]]] = {}
    for svc, _, sp in _spans(b):
        if svc.startswith("agent-") and sp["kind"] == 3 and sp["name"] == "POST /v1/tool":
            calls.setdefault(str(sp["traceId"]), []).append(
                (int(sp["startTimeUnixNano"]), bool(sp["status"]), str(sp["attributes"][0]["value"]["stringValue"])))
    for tid, cs in calls.items():
        cs.sort()
        if tid in retried:
            assert [e for _, e, _ in cs] == [True, False]  # failed, then the successful retry
            assert cs[0][2] == cs[1][2] and cs[0][2].startswith(retried[tid])
        else:
            assert [e for _, e, _ in cs] == [False]


def test_clock_skew_shifts_each_instance_by_a_fixed_offset_only() -> None:
    cfg = AgentTraceConfig(n_traces=200)
    plain, _ = generate_agent_traces(cfg, seed=8)
    skewed, _ = generate_agent_traces(AgentTraceConfig(n_traces=200, skew_ms=0.5), seed=8)
    offsets: dict[str, set[int]] = {}
    for (s1, i1, a), (s2, i2, c) in zip(_spans(plain), _spans(skewed), strict=True):
        assert (s1, i1, a["spanId"], a["name"]) == (s2, i2, c["spanId"], c["name"])
        off = int(c["startTimeUnixNano"]) - int(a["startTimeUnixNano"])
        assert off == int(c["endTimeUnixNano"]) - int(a["endTimeUnixNano"])
        offsets.setdefault(i1, set()).add(off)
    assert all(len(v) == 1 for v in offsets.values())  # one clock per instance
    vals = np.array([next(iter(v)) for v in offsets.values()])
    assert np.abs(vals).max() <= 500_000 and len(set(vals.tolist())) == len(vals) and vals.std() > 100_000


def test_persistent_hop_is_slow_in_every_trace_through_it() -> None:
    b, truth = generate_agent_traces(AgentTraceConfig(n_traces=400, persistent_hop="tool-sql/tool.sql_query",
                                                      persistent_ms=5.0), seed=9)
    through = {x.trace_id for x in truth if x.persistent}
    durs: dict[bool, list[int]] = {True: [], False: []}
    for svc, _, sp in _spans(b):
        if sp["kind"] == 1:
            durs[svc == "tool-sql"].append(int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"]))
            assert (svc == "tool-sql") == (sp["traceId"] in through)
    assert min(durs[True]) > 5_000_000 > max(durs[False])
    assert all(x.kind == "" for x in truth)


def test_slow_hops_restricts_the_draw_and_bad_hops_are_named() -> None:
    _, truth = generate_agent_traces(AgentTraceConfig(n_traces=200, slow_fraction=1.0,
                                                      slow_hops=("agent-coder->tool-sql", "llm-gateway")), seed=1)
    assert {x.hop for x in truth} == {"agent-coder->tool-sql", "llm-gateway"}
    assert {x.kind for x in truth} == {"network", "service"}
    for kw, msg in (({"slow_hops": ("tool-sql/tool.nope",)}, "'tool-sql/tool.nope' is not a hop"),
                    ({"parallel_tools": 5}, "parallel_tools 5"), ({"retry_fraction": 1.5}, "retry_fraction 1.5"),
                    ({"persistent_hop": "llm-gateway"}, "persistent_ms > 0"), ({"skew_ms": -1.0}, "skew_ms -1.0")):
        with pytest.raises(ConfigError, match=msg):
            AgentTraceConfig(**kw).check()


if __name__ == "__main__":
    print(f"{'case':22} {'localized':>16} {'need':>6} {'false blames':>14} {'max':>5}")
    for case, (c, _why) in CASES.items():
        sc = score(c)
        print(f"{case:22} {sc.hits:5}/{sc.slow:<4} {sc.rate:6.1%} {math.ceil(_lower(sc.slow, TARGET)):6} "
              f"{sc.false:6}/{sc.healthy:<4} {sc.false / sc.healthy:5.1%} {math.floor(_upper(sc.healthy, FALSE_MAX)):3}")
