"""Sliding-window request statistics per service and method.

Requests are the server-side spans (``SERVER`` / ``CONSUMER`` kinds, and roots of any kind): the
latency a caller of that service sees, minus the network. Windows are ``window_ns`` wide and start
every ``step_ns`` (``window_ns`` a multiple of ``step_ns``; equal: tumbling windows) aligned on
multiples of ``step_ns`` since the Unix epoch; a request belongs to every window covering its start.
Quantiles are exact per window (nearest-rank: the ceil(q*n)-th smallest, Hyndman & Fan 1996
definition 1), computed by one sort of (group, latency) (``slo._group``), not a sketch. Token latency for streaming
inference is the time per output token after the first, ``(duration - ttft) / output_tokens``
(OpenTelemetry GenAI semantic conventions: ``gen_ai.usage.output_tokens``,
``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from fabricscope.model.errors import ConfigError
from fabricscope.slo._group import factorize, group_median, group_order_stats
from fabricscope.slo.otlp import STATUS_ERROR, SpanTable

__all__ = ["WindowStats", "request_mask", "window_stats"]


@dataclass(frozen=True)
class WindowStats:
    """One row per (service, method, window) with at least one request; times in ms, NaN when not measured."""

    service: tuple[str, ...]
    method: tuple[str, ...]
    window_start_ns: np.ndarray
    window_ns: int
    requests: np.ndarray
    rate_per_s: np.ndarray
    p50_ms: np.ndarray
    p99_ms: np.ndarray
    p999_ms: np.ndarray
    error_rate: np.ndarray
    errors: np.ndarray
    attainment: np.ndarray
    token_ms: np.ndarray
    ttft_ms: np.ndarray

    def __len__(self) -> int:
        return len(self.service)

    def rows(self) -> list[dict[str, float | int | str]]:
        out: list[dict[str, float | int | str]] = []
        for i in range(len(self)):
            out.append({"service": self.service[i], "method": self.method[i],
                        "window_start_ns": int(self.window_start_ns[i]), "requests": int(self.requests[i]),
                        "rate_per_s": round(float(self.rate_per_s[i]), 3), "p50_ms": _r(self.p50_ms[i]),
                        "p99_ms": _r(self.p99_ms[i]), "p999_ms": _r(self.p999_ms[i]),
                        "errors": int(self.errors[i]), "error_rate": round(float(self.error_rate[i]), 6),
                        "sla_attainment": round(float(self.attainment[i]), 6), "token_ms": _r(self.token_ms[i]),
                        "ttft_ms": _r(self.ttft_ms[i])})
        return out


def _r(x: float) -> float:
    return round(float(x), 4) if np.isfinite(x) else float("nan")


def request_mask(t: SpanTable) -> np.ndarray:
    """Spans that are requests served by their service (server / consumer spans and roots)."""
    return np.asarray((t.kind == 2) | (t.kind == 5) | (t.parent_id == b""))


def _nearest_rank(q: float) -> Callable[[np.ndarray], np.ndarray]:
    """The 0-based nearest rank ``ceil(q n) - 1`` (Hyndman & Fan definition 1) as a function of n."""
    return lambda c: np.ceil(q * c).astype(np.int64) - 1


def window_stats(t: SpanTable, *, window_ns: int, step_ns: int | None = None, slo_ms: float = 25.0,
                 service_slo_ms: Mapping[str, float] | None = None) -> WindowStats:
    """Per (service, method, window): rate, p50 / p99 / p99.9, error rate, SLA attainment, token latency.

    SLA attainment is requests within their service's SLO (``service_slo_ms`` or ``slo_ms``) over all requests.
    """
    step = window_ns if step_ns is None else step_ns
    if window_ns <= 0 or step <= 0 or window_ns % step:
        raise ConfigError(f"slo windows: window {window_ns} ns must be a positive multiple of step {step} ns")
    m = request_mask(t)
    k = window_ns // step

    def rep(a: np.ndarray) -> np.ndarray:  # a request's value once per window covering it
        return a if k == 1 else np.tile(a, k)

    svc = t.service[m]
    dur = (t.end_ns[m] - t.start_ns[m]).astype(np.float64) / 1e6
    base = t.start_ns[m] // step
    widx = np.concatenate([base - j for j in range(k)]) if k > 1 else base
    del base
    nm = max(len(t.names), 1)
    wmin = int(widx.min()) if len(widx) else 0
    span = int(widx.max()) - wmin + 1 if len(widx) else 1
    group = (rep(svc.astype(np.int64)) * nm + rep(t.name[m].astype(np.int64))) * span + (widx - wmin)
    del widx
    ug, gi = factorize(group)
    del group
    quant, cnt = group_order_stats(gi, rep(dur), len(ug),
                                   [_nearest_rank(0.5), _nearest_rank(0.99), _nearest_rank(0.999)])
    g_sm, g_w = ug // span, ug % span + wmin
    errs = np.bincount(gi, weights=rep(t.status[m] == STATUS_ERROR).astype(np.float64), minlength=len(ug))
    slo_by_svc = np.array([float((service_slo_ms or {}).get(s, slo_ms)) for s in t.services] or [slo_ms])
    ok = np.bincount(gi, weights=rep(dur <= slo_by_svc[svc]).astype(np.float64), minlength=len(ug))
    tok, ttft = t.out_tokens[m], t.ttft_ns[m]
    del svc

    def sub_median(sel: np.ndarray, vals: np.ndarray) -> np.ndarray:
        """Median per group of ``vals`` (given on the requests where ``sel``)."""
        full = np.full(len(sel), np.nan)
        full[sel] = vals
        vv = rep(full)
        fin = np.isfinite(vv)
        return group_median(gi[fin], vv[fin], len(ug))[0]

    has_tok = tok > 0
    t_tok, t_ttft = tok[has_tok], ttft[has_tok]
    per_tok = (dur[has_tok] - np.where(t_ttft >= 0, t_ttft / 1e6, 0.0)) / t_tok
    has_ttft = ttft >= 0
    token_ms = sub_median(has_tok, per_tok)
    ttft_med = sub_median(has_ttft, ttft[has_ttft] / 1e6)
    return WindowStats(
        service=tuple(t.services[s] for s in (g_sm // nm).tolist()), method=tuple(t.names[x] for x in (g_sm % nm).tolist()),
        window_start_ns=g_w * step, window_ns=window_ns, requests=cnt,
        rate_per_s=cnt / (window_ns / 1e9), p50_ms=quant[0], p99_ms=quant[1], p999_ms=quant[2],
        error_rate=errs / cnt, errors=errs.astype(np.int64), attainment=ok / cnt, token_ms=token_ms,
        ttft_ms=ttft_med)
