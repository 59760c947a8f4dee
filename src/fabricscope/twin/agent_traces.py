"""Synthetic multi-agent traces (dispatch -> domain agent -> LLM + tool agent) with known slow hops.

The chain is the one of OPERATIONS.md section 7: task dispatch -> domain agent -> tool agent, plus an
LLM call with token streaming, ten services in all, each with a few instances. One hop of a chain may
be made slow: a service (its own time), a tool call (the tool agent's internal span) or the network
between two services (the gap between a client span and the server span of the same call). The
output is OTLP JSON lines the way the Collector's file exporter writes them
(https://opentelemetry.io/docs/specs/otel/protocol/file-exporter/): one export request per line,
spans of one service split over many lines, ``parentSpanId`` absent on roots, ``status`` ``{}``
when unset, 64-bit times as decimal strings, enums as integers, ids as lowercase hex.

Harder workloads, each behind an option that is off by default (the default output is the same,
draw for draw, as before the options existed):

* ``parallel_tools`` > 1: the domain agent fans out that many tool calls at once (distinct tool
  agents, overlapping in time), so the chain's critical path is the longest branch, not the sum;
  a slowdown on a branch that is not the longest is recorded ``critical=False``.
* ``jitter`` is the sigma of the lognormal per-hop jitter (0.2 by default; 0.5-0.7 is heavy-tailed:
  p99/median ~ 3-5x, the shape reported for RPC latencies, e.g. Dean & Barroso, "The Tail at Scale",
  CACM 2013).
* ``slowdown_ms`` small (2-5 ms on a ~10 ms chain) makes the anomaly comparable to that tail.
* ``persistent_hop`` / ``persistent_ms``: a hop slow in every trace that passes through it, not an
  anomaly relative to other traces (truth: ``persistent``).
* ``retry_fraction``: a tool call fails (error status on the client and server spans, after
  ``retry_fail_ms``) and is retried after ``retry_backoff_ms``; truth kind ``retry``, hop the tool
  agent whose failure cost the extra round trip.
* ``skew_ms``: each service instance's clock is off by a fixed uniform(-skew, +skew) offset (its
  own RNG stream, so the same seed gives the same traces with and without skew), shifting all the
  spans it reports.
* ``slow_hops``: draw the slow hop only among these subjects (a service, ``service/call``,
  ``caller->callee``).

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
    slow_hops: tuple[str, ...] = ()
    parallel_tools: int = 1
    persistent_hop: str = ""
    persistent_ms: float = 0.0
    retry_fraction: float = 0.0
    retry_fail_ms: float = 3.0
    retry_backoff_ms: float = 1.0
    skew_ms: float = 0.0

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
        for h in (*self.slow_hops, *((self.persistent_hop,) if self.persistent_hop else ())):
            if h not in all_hops():
                raise ConfigError(f"agent traces: hop {h!r} is not a hop of the chain (e.g. {DISPATCH}, "
                                  f"tool-sql/{_TOOL_CALL['tool-sql']}, {DISPATCH}->{DOMAIN_AGENTS[0]})")
        if not 1 <= self.parallel_tools <= len(TOOL_AGENTS):
            raise ConfigError(f"agent traces: parallel_tools {self.parallel_tools} must be in 1..{len(TOOL_AGENTS)}")
        if not 0.0 <= self.retry_fraction <= 1.0:
            raise ConfigError(f"agent traces: retry_fraction {self.retry_fraction} must be in [0, 1]")
        for name in ("persistent_ms", "retry_fail_ms", "retry_backoff_ms", "skew_ms", "jitter"):
            if getattr(self, name) < 0:
                raise ConfigError(f"agent traces: {name} {getattr(self, name)} must be >= 0")
        if self.persistent_hop and self.persistent_ms <= 0:
            raise ConfigError("agent traces: persistent_hop needs persistent_ms > 0")


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
    critical: bool = True
    persistent: str = ""


def all_hops() -> tuple[str, ...]:
    """Every hop subject a chain can have: services, ``tool/call`` and ``caller->callee`` edges."""
    tools = tuple(f"{t}/{_TOOL_CALL[t]}" for t in TOOL_AGENTS)
    return (*SERVICES, *tools, *_edges())


def _edges() -> list[str]:
    return [f"{DISPATCH}->{d}" for d in DOMAIN_AGENTS] + [f"{d}->{LLM}" for d in DOMAIN_AGENTS] + \
        [f"{d}->{t}" for d in DOMAIN_AGENTS for t in TOOL_AGENTS]


def _hop_kind(hop: str) -> str:
    return "network" if "->" in hop else "tool" if "/" in hop else "service"


class _Trace:
    def __init__(self, rng: np.random.Generator, cfg: AgentTraceConfig, trace_id: str,
                 skew: dict[str, int] | None = None) -> None:
        self.rng, self.cfg, self.trace_id = rng, cfg, trace_id
        self.spans: list[tuple[str, str, dict[str, Any]]] = []  # (service, instance, span)
        self.inst: dict[str, str] = {}
        self.skew = skew  # instance -> clock offset (ns), fixed over the run
        self.critical = True
        self.retried = ""

    def instance(self, service: str) -> str:
        if service not in self.inst:
            self.inst[service] = f"{service}-{int(self.rng.integers(self.cfg.instances))}"
        return self.inst[service]

    def sid(self) -> str:
        return self.rng.bytes(8).hex()

    def ms(self, base: float) -> int:
        return int(base * float(self.rng.lognormal(0.0, self.cfg.jitter)) * 1e6)

    def add(self, service: str, instance: str, span: dict[str, Any]) -> None:
        if self.skew is not None:
            off = self.skew[instance]
            for k in ("startTimeUnixNano", "endTimeUnixNano"):
                span[k] = str(int(span[k]) + off)
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
          extra_net_ns: int, attrs: Sequence[tuple[str, dict[str, Any]]] = (), error: bool = False) -> int:
    """A client span in ``caller``, the network both ways, the callee's server span from ``body``; returns end."""
    inst = tr.instance(callee)
    cid = tr.sid()
    s_start = start + tr.ms(tr.cfg.net_ms) + extra_net_ns
    s_end = body(cid, s_start, inst)
    end = s_end + tr.ms(tr.cfg.net_ms)
    tr.add(caller, tr.instance(caller), _span(tr, cid, parent, name, _CLIENT, start, end,
                             [("server.address", {"stringValue": inst}), *attrs], error=error))
    return int(end)


def _one_trace(tr: _Trace, start: int, slow: tuple[str, str, int], err_service: str, retry: bool = False) -> None:
    cfg, rng = tr.cfg, tr.rng
    domain = DOMAIN_AGENTS[int(rng.integers(len(DOMAIN_AGENTS)))]
    tool = TOOL_AGENTS[int(rng.integers(len(TOOL_AGENTS)))]
    tools = [tool]
    if cfg.parallel_tools > 1:
        others = [t for t in TOOL_AGENTS if t != tool]
        tools += [others[int(i)] for i in rng.permutation(len(others))[: cfg.parallel_tools - 1]]
    kind, hop, extra = slow
    p_hop, p_extra = cfg.persistent_hop, int(cfg.persistent_ms * 1e6)

    def slow_ns(subject: str, svc_kind: str) -> int:
        return (extra if kind == svc_kind and hop == subject else 0) + (p_extra if p_hop == subject else 0)

    def self_ns(svc: str) -> int:
        return tr.ms(cfg.self_ms[svc]) + slow_ns(svc, "service")

    def net(a: str, b: str) -> int:
        return slow_ns(f"{a}->{b}", "network")

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

    def tool_body_of(tool: str) -> Any:
        def tool_body(parent: str, t: int, inst: str) -> int:
            sid, iid = tr.sid(), tr.sid()
            a = t + self_ns(tool) // 2
            call = _TOOL_CALL[tool]
            b = a + tr.ms(cfg.tool_ms) + slow_ns(f"{tool}/{call}", "tool")
            end = b + self_ns(tool) // 2
            tr.add(tool, inst, _span(tr, iid, sid, call, _INTERNAL, a, b))
            tr.add(tool, inst, _span(tr, sid, parent, "POST /v1/tool", _SERVER, t, end, error=err_service == tool))
            return end
        return tool_body

    def failing_body(parent: str, t: int, inst: str) -> int:
        end = t + tr.ms(cfg.retry_fail_ms)
        tr.add(tools[0], inst, _span(tr, tr.sid(), parent, "POST /v1/tool", _SERVER, t, end, error=True))
        return end

    def domain_body(parent: str, t: int, inst: str) -> int:
        sid = tr.sid()
        own = self_ns(domain)
        a = t + own // 3
        b = _call(tr, domain, LLM, sid, a, llm_body, "chat gpt-small", net(domain, LLM),
                  [("gen_ai.request.model", {"stringValue": "gpt-small"})])
        t0 = b + own // 3
        if retry:
            tr.retried = tools[0]  # the first attempt fails, the domain agent backs off and calls again
            f_end = _call(tr, domain, tools[0], sid, t0, failing_body, "POST /v1/tool", net(domain, tools[0]),
                          error=True)
            t0 = f_end + tr.ms(cfg.retry_backoff_ms)
        ends = {tl: _call(tr, domain, tl, sid, t0, tool_body_of(tl), "POST /v1/tool", net(domain, tl))
                for tl in tools}
        c = max(ends.values())
        if len(tools) > 1 and kind:
            slow_tool = next((tl for tl in tools if hop in (tl, f"{tl}/{_TOOL_CALL[tl]}", f"{domain}->{tl}")), "")
            tr.critical = not slow_tool or ends[slow_tool] == c
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
    if cfg.slow_hops:
        hop = cfg.slow_hops[int(rng.integers(len(cfg.slow_hops)))]
        return _hop_kind(hop), hop, extra
    kind = cfg.slow_kinds[int(rng.integers(len(cfg.slow_kinds)))]
    if kind == "service":
        return kind, SERVICES[int(rng.integers(len(SERVICES)))], extra
    if kind == "tool":
        t = TOOL_AGENTS[int(rng.integers(len(TOOL_AGENTS)))]
        return kind, f"{t}/{_TOOL_CALL[t]}", extra
    edges = _edges()
    return kind, edges[int(rng.integers(len(edges)))], extra


def generate_agent_traces(cfg: AgentTraceConfig, *, seed: int) -> tuple[list[dict[str, Any]], list[ChainTruth]]:
    """Generate the traces; return (OTLP export requests, one per file line; the truth per trace).

    A slow hop drawn for a chain is forced onto a hop the chain really passes through (the domain
    and tool agents are drawn first, then re-drawn until the slow hop lies on the chain), so every
    chain labelled slow is slow.
    """
    cfg.check()
    rng = np.random.default_rng(seed)
    skew: dict[str, int] | None = None
    if cfg.skew_ms > 0:
        srng = np.random.default_rng([seed, 1])  # its own stream: the traces do not change with skew
        skew = {f"{s}-{i}": int(float(srng.uniform(-cfg.skew_ms, cfg.skew_ms)) * 1e6)
                for s in SERVICES for i in range(cfg.instances)}
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
        retry = bool(cfg.retry_fraction) and not slow[0] and float(rng.random()) < cfg.retry_fraction
        while True:
            state = rng.bit_generator.state
            tr = _Trace(rng, cfg, trace_id, skew)
            _one_trace(tr, t, slow, err, retry)
            on_chain = not slow[0] or _on_chain(tr, slow)
            if on_chain:
                break
            rng.bit_generator.state = state
            rng.integers(1 << 30)  # move on so the next draw picks another domain / tool agent
        errored = bool(err) and any(s == err for s, _, _ in tr.spans)
        persistent = cfg.persistent_hop if cfg.persistent_hop and _on_chain(
            tr, (_hop_kind(cfg.persistent_hop), cfg.persistent_hop, 0)) else ""
        if retry:
            truths.append(ChainTruth(trace_id, "retry", tr.retried, cfg.retry_fail_ms + cfg.retry_backoff_ms,
                                     errored, True, persistent))
        else:
            truths.append(ChainTruth(trace_id, slow[0], slow[1], slow[2] / 1e6, errored, tr.critical, persistent))
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
