"""Synthetic multi-agent traces (dispatch -> domain agent -> LLM + tool agent) with known slow hops.

The chain is the one of OPERATIONS.md section 7: task dispatch -> domain agent -> tool agent, plus an
LLM call with token streaming, ten services in all, each with a few instances. One hop of a chain may
be made slow: a service (its own time), a tool call (the tool agent's internal span) or the network
between two services (the gap between a client span and the server span of the same call). The
output is OTLP JSON lines the way the Collector's file exporter writes them
(https://opentelemetry.io/docs/specs/otel/protocol/file-exporter/): one export request per line,
spans of one service split over many lines, ``parentSpanId`` absent on roots, ``status`` ``{}``
when unset, 64-bit times as decimal strings, enums as integers, ids as lowercase hex.

This module writes plain OTLP JSON and knows nothing of the analysis that reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.model.errors import ConfigError

__all__ = ["SLOW_KINDS", "AgentTraceConfig", "ChainTruth", "generate_agent_traces", "write_agent_traces"]

SLOW_KINDS = ("service", "tool", "network")
DISPATCH = "task-dispatch"
DOMAIN_AGENTS = ("agent-planner", "agent-research", "agent-coder", "agent-analyst")
TOOL_AGENTS = ("tool-search", "tool-sql", "tool-python", "tool-retrieval")
LLM = "llm-gateway"
SERVICES = (DISPATCH, *DOMAIN_AGENTS, *TOOL_AGENTS, LLM)
_TOOL_CALL = {"tool-search": "tool.web_search", "tool-sql": "tool.sql_query", "tool-python": "tool.run_python",
              "tool-retrieval": "tool.vector_lookup"}
_INTERNAL, _SERVER, _CLIENT = 1, 2, 3


@dataclass(frozen=True)
class AgentTraceConfig:
    """Shape of the generated workload (times in milliseconds; jitter is lognormal sigma)."""

    n_traces: int = 1000
    qps: float = 1000.0
    slow_fraction: float = 0.0
    slow_kinds: tuple[str, ...] = SLOW_KINDS
    slowdown_ms: tuple[float, float] = (8.0, 30.0)
    error_rate: float = 0.0
    instances: int = 3
    start_ns: int = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
    net_ms: float = 0.25
    self_ms: dict[str, float] = field(default_factory=lambda: {
        DISPATCH: 0.8, **dict.fromkeys(DOMAIN_AGENTS, 1.5), **dict.fromkeys(TOOL_AGENTS, 0.8), LLM: 1.0})
    tool_ms: float = 1.5
    token_ms: float = 0.06
    tokens: tuple[int, int] = (20, 60)
    jitter: float = 0.2
    batch_spans: int = 256

    def check(self) -> None:
        if self.n_traces <= 0:
            raise ConfigError(f"agent traces: n_traces {self.n_traces} must be > 0")
        if self.qps <= 0:
            raise ConfigError(f"agent traces: qps {self.qps} must be > 0")
        if not 0.0 <= self.slow_fraction <= 1.0:
            raise ConfigError(f"agent traces: slow_fraction {self.slow_fraction} must be in [0, 1]")
        for k in self.slow_kinds:
            if k not in SLOW_KINDS:
                raise ConfigError(f"agent traces: slow hop kind {k!r} is not one of {', '.join(SLOW_KINDS)}")
        lo, hi = self.slowdown_ms
        if not 0 < lo <= hi:
            raise ConfigError(f"agent traces: slowdown_ms {self.slowdown_ms} must be 0 < low <= high")


@dataclass(frozen=True)
class ChainTruth:
    """What the generator did to one trace: the slow hop (``kind`` ``""`` for a healthy chain).

    ``hop`` is the subject an analysis should blame: a service name, ``service/tool-call`` for a
    tool call, ``caller->callee`` for the network between two services.
    """

    trace_id: str
    kind: str
    hop: str
    slowdown_ms: float
    error: bool


class _Trace:
    def __init__(self, rng: np.random.Generator, cfg: AgentTraceConfig, trace_id: str) -> None:
        self.rng, self.cfg, self.trace_id = rng, cfg, trace_id
        self.spans: list[tuple[str, str, dict[str, Any]]] = []  # (service, instance, span)
        self.inst: dict[str, str] = {}

    def instance(self, service: str) -> str:
        if service not in self.inst:
            self.inst[service] = f"{service}-{int(self.rng.integers(self.cfg.instances))}"
        return self.inst[service]

    def sid(self) -> str:
        return self.rng.bytes(8).hex()

    def ms(self, base: float) -> int:
        return int(base * float(self.rng.lognormal(0.0, self.cfg.jitter)) * 1e6)

    def add(self, service: str, instance: str, span: dict[str, Any]) -> None:
        self.spans.append((service, instance, span))


def _span(tr: _Trace, sid: str, parent: str, name: str, kind: int, start: int, end: int,
          attrs: Sequence[tuple[str, dict[str, Any]]] = (), error: bool = False) -> dict[str, Any]:
    sp: dict[str, Any] = {"traceId": tr.trace_id, "spanId": sid}
    if parent:
        sp["parentSpanId"] = parent
    sp.update({"name": name, "kind": kind, "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
               "attributes": [{"key": k, "value": v} for k, v in attrs],
               "status": {"code": 2, "message": "internal error"} if error else {}})
    return sp


def _call(tr: _Trace, caller: str, callee: str, parent: str, start: int, body: Any, name: str,
          extra_net_ns: int, attrs: Sequence[tuple[str, dict[str, Any]]] = ()) -> int:
    """A client span in ``caller``, the network both ways, the callee's server span from ``body``; returns end."""
    inst = tr.instance(callee)
    cid = tr.sid()
    s_start = start + tr.ms(tr.cfg.net_ms) + extra_net_ns
    s_end = body(cid, s_start, inst)
    end = s_end + tr.ms(tr.cfg.net_ms)
    tr.add(caller, tr.instance(caller), _span(tr, cid, parent, name, _CLIENT, start, end,
                             [("server.address", {"stringValue": inst}), *attrs]))
    return int(end)


def _one_trace(tr: _Trace, start: int, slow: tuple[str, str, int], err_service: str) -> None:
    cfg, rng = tr.cfg, tr.rng
    domain = DOMAIN_AGENTS[int(rng.integers(len(DOMAIN_AGENTS)))]
    tool = TOOL_AGENTS[int(rng.integers(len(TOOL_AGENTS)))]
    kind, hop, extra = slow

    def self_ns(svc: str) -> int:
        return tr.ms(cfg.self_ms[svc]) + (extra if kind == "service" and hop == svc else 0)

    def net(a: str, b: str) -> int:
        return extra if kind == "network" and hop == f"{a}->{b}" else 0

    def llm_body(parent: str, t: int, inst: str) -> int:
        sid = tr.sid()
        n_tok = int(rng.integers(cfg.tokens[0], cfg.tokens[1] + 1))
        ttft = self_ns(LLM)
        end = t + ttft + int(n_tok * cfg.token_ms * 1e6 * float(rng.lognormal(0.0, cfg.jitter)))
        tr.add(LLM, inst, _span(tr, sid, parent, "chat gpt-small", _SERVER, t, end, [
            ("gen_ai.operation.name", {"stringValue": "chat"}), ("gen_ai.request.model", {"stringValue": "gpt-small"}),
            ("gen_ai.usage.output_tokens", {"intValue": str(n_tok)}),
            ("gen_ai.server.time_to_first_token", {"doubleValue": ttft / 1e9})], error=err_service == LLM))
        return end

    def tool_body(parent: str, t: int, inst: str) -> int:
        sid, iid = tr.sid(), tr.sid()
        a = t + self_ns(tool) // 2
        call = _TOOL_CALL[tool]
        b = a + tr.ms(cfg.tool_ms) + (extra if kind == "tool" and hop == f"{tool}/{call}" else 0)
        end = b + self_ns(tool) // 2
        tr.add(tool, inst, _span(tr, iid, sid, call, _INTERNAL, a, b))
        tr.add(tool, inst, _span(tr, sid, parent, "POST /v1/tool", _SERVER, t, end, error=err_service == tool))
        return end

    def domain_body(parent: str, t: int, inst: str) -> int:
        sid = tr.sid()
        own = self_ns(domain)
        a = t + own // 3
        b = _call(tr, domain, LLM, sid, a, llm_body, "chat gpt-small", net(domain, LLM),
                  [("gen_ai.request.model", {"stringValue": "gpt-small"})])
        c = _call(tr, domain, tool, sid, b + own // 3, tool_body, "POST /v1/tool", net(domain, tool))
        end = c + own - 2 * (own // 3)
        tr.add(domain, inst, _span(tr, sid, parent, "POST /v1/act", _SERVER, t, end, error=err_service == domain))
        return end

    root = tr.sid()
    own = self_ns(DISPATCH)
    inst = tr.instance(DISPATCH)
    e = _call(tr, DISPATCH, domain, root, start + own // 2, domain_body, "POST /v1/act", net(DISPATCH, domain))
    tr.add(DISPATCH, inst, _span(tr, root, "", "POST /v1/tasks", _SERVER, start, e + own - own // 2,
                                 error=err_service == DISPATCH))


def _slow_choice(rng: np.random.Generator, cfg: AgentTraceConfig) -> tuple[str, str, int]:
    lo, hi = cfg.slowdown_ms
    extra = int(float(rng.uniform(lo, hi)) * 1e6)
    kind = cfg.slow_kinds[int(rng.integers(len(cfg.slow_kinds)))]
    if kind == "service":
        return kind, SERVICES[int(rng.integers(len(SERVICES)))], extra
    if kind == "tool":
        t = TOOL_AGENTS[int(rng.integers(len(TOOL_AGENTS)))]
        return kind, f"{t}/{_TOOL_CALL[t]}", extra
    edges = [f"{DISPATCH}->{d}" for d in DOMAIN_AGENTS] + [f"{d}->{LLM}" for d in DOMAIN_AGENTS] + \
        [f"{d}->{t}" for d in DOMAIN_AGENTS for t in TOOL_AGENTS]
    return kind, edges[int(rng.integers(len(edges)))], extra


def generate_agent_traces(cfg: AgentTraceConfig, *, seed: int) -> tuple[list[dict[str, Any]], list[ChainTruth]]:
    """Generate the traces; return (OTLP export requests, one per file line; the truth per trace).

    A slow hop drawn for a chain is forced onto a hop the chain really passes through (the domain
    and tool agents are drawn first, then re-drawn until the slow hop lies on the chain), so every
    chain labelled slow is slow.
    """
    cfg.check()
    rng = np.random.default_rng(seed)
    batches: list[dict[str, Any]] = []
    truths: list[ChainTruth] = []
    pending: list[tuple[str, str, dict[str, Any]]] = []
    t = cfg.start_ns
    gap_ns = 1e9 / cfg.qps
    for _ in range(cfg.n_traces):
        t += int(rng.exponential(gap_ns))
        trace_id = rng.bytes(16).hex()
        slow = ("", "", 0)
        if cfg.slow_fraction and float(rng.random()) < cfg.slow_fraction:
            slow = _slow_choice(rng, cfg)
        err = SERVICES[int(rng.integers(len(SERVICES)))] if cfg.error_rate and float(rng.random()) < cfg.error_rate \
            else ""
        while True:
            state = rng.bit_generator.state
            tr = _Trace(rng, cfg, trace_id)
            _one_trace(tr, t, slow, err)
            on_chain = not slow[0] or _on_chain(tr, slow)
            if on_chain:
                break
            rng.bit_generator.state = state
            rng.integers(1 << 30)  # move on so the next draw picks another domain / tool agent
        errored = bool(err) and any(s == err for s, _, _ in tr.spans)
        truths.append(ChainTruth(trace_id, slow[0], slow[1], slow[2] / 1e6, errored))
        pending.extend(tr.spans)
        if len(pending) >= cfg.batch_spans:
            batches.extend(_batches(pending, cfg.batch_spans))
            pending = []
    if pending:
        batches.extend(_batches(pending, cfg.batch_spans))
    return batches, truths


def _on_chain(tr: _Trace, slow: tuple[str, str, int]) -> bool:
    kind, hop, _ = slow
    services = {s for s, _, _ in tr.spans}
    if kind == "service":
        return hop in services
    if kind == "tool":
        return hop.split("/")[0] in services
    a, b = hop.split("->")
    return a in services and b in services


def _batches(spans: list[tuple[str, str, dict[str, Any]]], size: int) -> list[dict[str, Any]]:
    """Group spans by resource the way a Collector batch does: one line, several resources."""
    out = []
    for i in range(0, len(spans), size):
        by_res: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for svc, inst, sp in spans[i: i + size]:
            by_res.setdefault((svc, inst), []).append(sp)
        out.append({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": svc}},
                                        {"key": "service.instance.id", "value": {"stringValue": inst}}]},
            "scopeSpans": [{"scope": {"name": "fabricscope.twin.agent_traces"}, "spans": sps}]}
            for (svc, inst), sps in by_res.items()]})
    return out


def write_agent_traces(path: str | Path, cfg: AgentTraceConfig, *, seed: int) -> list[ChainTruth]:
    """Write OTLP JSON lines to ``path`` and the truth to ``path`` + ``.truth.json``; return the truth."""
    batches, truths = generate_agent_traces(cfg, seed=seed)
    p = Path(path)
    with p.open("w", encoding="utf-8") as fh:
        for b in batches:
            fh.write(json.dumps(b, separators=(",", ":")))
            fh.write("\n")
    Path(f"{p}.truth.json").write_text(json.dumps([asdict(t) for t in truths]), encoding="utf-8")
    return truths
