"""The SLO rules: latency breach (backup model), outlier endpoint (eject), error rate (alert).

Defaults are the seed rules of OPERATIONS.md section 7, all configurable from YAML:

* ``latency``: a service/method whose P99 exceeds 15 ms in 3 consecutive 1-minute windows is in
  breach; the breach is localized with the trace chains (the hop most often blamed in the slow
  traces of those windows) and recommends switching to the backup model. Breaches blamed on one hop
  are merged into one finding on that hop (``slo-breach``, subject a service, ``service/call`` or
  ``caller->callee``).
* ``outlier``: an endpoint (``service.instance.id``) with at least 10 requests over 25 ms in one
  interval whose own hop is blamed (downstream slowness excluded) -> recommend ejecting it for
  5 minutes, like Envoy's outlier detection (a recommendation, nothing is enforced)
  (``slo-outlier-endpoint``).
* ``errors``: failed requests (``status.code`` ERROR) above 0.1% of a service's requests in a
  minute -> alert (``slo-error-rate``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.slo._group import factorize
from fabricscope.slo.chains import Chains
from fabricscope.slo.otlp import STATUS_ERROR, SpanTable
from fabricscope.slo.windows import WindowStats, request_mask, window_stats

__all__ = ["RuleConfig", "evaluate_rules", "findings_json", "load_rules"]


@dataclass(frozen=True)
class RuleConfig:
    """Rule thresholds (ms, s, fractions); ``service_slo_ms`` overrides ``slo_ms`` per service."""

    window_s: float = 60.0
    slo_ms: float = 25.0
    service_slo_ms: Mapping[str, float] = field(default_factory=dict)
    latency_quantile: float = 0.99
    latency_threshold_ms: float = 15.0
    latency_for_s: float = 180.0
    latency_min_requests: int = 20
    latency_action: str = "switch the affected requests to the backup model"
    outlier_threshold_ms: float = 25.0
    outlier_count: int = 10
    outlier_interval_s: float = 60.0
    outlier_eject_s: float = 300.0
    error_max_rate: float = 0.001
    error_window_s: float = 60.0
    ambiguous_share: float = 0.5
    min_blame_share: float = 0.2


_YAML_KEYS = {
    ("window_s",): "window_s", ("slo_ms",): "slo_ms",
    ("latency", "quantile"): "latency_quantile", ("latency", "threshold_ms"): "latency_threshold_ms",
    ("latency", "for_s"): "latency_for_s", ("latency", "min_requests"): "latency_min_requests",
    ("latency", "action"): "latency_action",
    ("outlier", "threshold_ms"): "outlier_threshold_ms", ("outlier", "count"): "outlier_count",
    ("outlier", "interval_s"): "outlier_interval_s", ("outlier", "eject_s"): "outlier_eject_s",
    ("errors", "max_rate"): "error_max_rate", ("errors", "window_s"): "error_window_s",
    ("ambiguous_share",): "ambiguous_share", ("min_blame_share",): "min_blame_share",
}


def load_rules(path: str | Path | None = None, *, base: RuleConfig | None = None) -> RuleConfig:
    """Read a rules YAML file (keys as in docs/slo.md); unknown keys and bad values raise ConfigError."""
    import yaml

    cfg = base or RuleConfig()
    if path is None:
        return cfg
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: cannot read rules: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: rules must be a mapping, got {type(doc).__name__}")
    values: dict[str, Any] = {}
    for top, v in doc.items():
        if top == "services":
            if not isinstance(v, dict):
                raise ConfigError(f"{p}: services: must map a service to {{slo_ms: N}}")
            values["service_slo_ms"] = {str(s): _num(p, f"services.{s}.slo_ms", (d or {}).get("slo_ms"))
                                        for s, d in v.items()}
        elif isinstance(v, dict):
            for sub, vv in v.items():
                key = _YAML_KEYS.get((str(top), str(sub)))
                if key is None:
                    raise ConfigError(f"{p}: unknown rule key {top}.{sub}")
                values[key] = vv if key == "latency_action" else _num(p, f"{top}.{sub}", vv)
        else:
            key = _YAML_KEYS.get((str(top),))
            if key is None:
                raise ConfigError(f"{p}: unknown rule key {top}")
            values[key] = _num(p, str(top), v)
    for k in ("latency_min_requests", "outlier_count"):
        if k in values:
            values[k] = int(values[k])
    return replace(cfg, **values)


def _num(p: Path, where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ConfigError(f"{p}: {where}: {v!r} is not a non-negative number")
    return float(v)


def _runs(flags: np.ndarray, need: int) -> list[tuple[int, int]]:
    """[start, end) index runs of True of length >= need."""
    out, i, n = [], 0, len(flags)
    while i < n:
        if flags[i]:
            j = i
            while j < n and flags[j]:
                j += 1
            if j - i >= need:
                out.append((i, j))
            i = j
        else:
            i += 1
    return out


def _ms(x: float) -> str:
    return f"{x:.1f} ms"


def evaluate_rules(t: SpanTable, ch: Chains, cfg: RuleConfig, *, stats: WindowStats | None = None,
                   ) -> list[Finding]:
    """Apply the three rules to the spans; evidence comes from the data only (no generator labels)."""
    win_ns = int(cfg.window_s * 1e9)
    ws = stats if stats is not None else window_stats(t, window_ns=win_ns, slo_ms=cfg.slo_ms,
                                                      service_slo_ms=cfg.service_slo_ms)
    return [*_latency(t, ch, cfg, ws), *_outliers(t, ch, cfg), *_errors(t, cfg)]


def _latency(t: SpanTable, ch: Chains, cfg: RuleConfig, ws: WindowStats) -> list[Finding]:
    q = cfg.latency_quantile
    qcol = ws.p99_ms if q == 0.99 else (ws.p999_ms if q == 0.999 else ws.p50_ms if q == 0.5 else None)
    if qcol is None:
        raise ConfigError(f"slo rules: latency.quantile {q} must be one of 0.5, 0.99, 0.999")
    step = ws.window_ns
    need = max(1, int(np.ceil(cfg.latency_for_s * 1e9 / step)))
    req = request_mask(t)
    svc_code = {s: i for i, s in enumerate(t.services)}
    name_code = {s: i for i, s in enumerate(t.names)}
    nh = len(ch.hop_subject)
    per_hop: dict[tuple[int, bool], dict[str, Any]] = {}
    series: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(ws.service, ws.method, strict=True)):
        series.setdefault(key, []).append(i)
    for (svc, meth), rows in series.items():
        rows.sort(key=lambda r: ws.window_start_ns[r])
        starts = ws.window_start_ns[rows]
        flags = (qcol[rows] > cfg.latency_threshold_ms) & (ws.requests[rows] >= cfg.latency_min_requests)
        # consecutive means adjacent windows: a gap in the data breaks a run
        for a, b in _runs(flags, need):
            seg = starts[a:b]
            for c, d in _runs(np.concatenate(([True], np.diff(seg) == step)), need):
                w0, w1 = int(seg[c]), int(seg[d - 1]) + step
                sel = req & (t.service == svc_code[svc]) & (t.name == name_code[meth]) & \
                    (t.start_ns >= w0) & (t.start_ns < w1) & ((t.end_ns - t.start_ns) > cfg.latency_threshold_ms * 1e6)
                traces = np.unique(ch.trace[sel])
                blamed = ch.blame[traces]
                worst = float(np.max(qcol[rows][a:b][c:d]))
                counts = np.bincount(blamed[blamed >= 0], minlength=nh)
                line = (f"{svc} {meth} p{q * 100:g} up to {_ms(worst)} > {_ms(cfg.latency_threshold_ms)} "
                        f"in {d - c} consecutive windows")
                # localized when the blamed share is above min_blame_share beyond its binomial noise
                # (one-sided 1%): 6 blamed of 28 slow requests is not a located breach
                frac = float(np.mean(blamed >= 0)) if len(traces) else 0.0
                if frac - 2.326 * np.sqrt(frac * (1 - frac) / max(len(traces), 1)) >= cfg.min_blame_share:
                    hops = [(h, False, counts[h] / len(traces)) for h in np.flatnonzero(counts).tolist()
                            if counts[h] / len(traces) >= cfg.ambiguous_share or counts[h] == counts.max()]
                else:
                    # no hop stands out against a healthy reference in the slow traces: the slowness is
                    # in every trace (persistent) or diffuse. A hop that holds most of their latency is
                    # named as persistent; otherwise the breach is unlocalized.
                    h, hshare = _dominant_hop(ch, traces)
                    hops = [(h, True, hshare)] if h >= 0 and hshare >= cfg.ambiguous_share else [(-1, False, 0.0)]
                for h, persistent, share in hops:
                    e = per_hop.setdefault((h, persistent), {
                        "w0": w0, "w1": w1, "series": [], "traces": set(), "blamed": set(),
                        "candidates": counts, "best": -1.0})
                    # the hop's share in the series that blames it most: an upstream series whose
                    # slow requests are slow in several hops (a different one per request) must
                    # not make a hop that explains its own series look ambiguous
                    if share >= e["best"]:
                        e["best"], e["candidates"] = float(share), counts
                    e["w0"], e["w1"] = min(e["w0"], w0), max(e["w1"], w1)
                    e["series"].append(line)
                    e["traces"].update(traces.tolist())
                    if h >= 0 and not persistent:
                        e["blamed"].update(traces[blamed == h].tolist())
    out = []
    for (h, persistent), e in per_hop.items():
        mine = np.array(sorted(e["blamed"]), dtype=np.int64)
        n_traces, share = len(e["traces"]), e["best"]
        ambiguous = h < 0 or (not persistent and share < cfg.ambiguous_share)
        if h < 0:
            subject, ev_hop = "unlocalized", ("no single hop stands out in the slow traces and none holds most "
                                              "of their latency (diffuse slowness)")
        elif persistent:
            subject = ch.hop_subject[h]
            ev_hop = (f"{ch.hop_kind[h]} hop {subject} holds {share:.0%} of the latency of the {n_traces} slow "
                      f"traces, and a hop stands out against a healthy reference in under "
                      f"{cfg.min_blame_share:.0%} of them: persistent slowness (in every trace through the hop, "
                      "so it has no healthy reference); named by its share of the latency, not by an excess")
        else:
            subject = ch.hop_subject[h]
            excess = ch.blame_excess_ns[mine] / 1e6
            ev_hop = (f"{ch.hop_kind[h]} hop {subject} blamed in {len(mine)} of {n_traces} slow traces, "
                      f"median excess {_ms(float(np.median(excess)))} over its healthy "
                      f"{_ms(float(ch.hop_ref_ns[h]) / 1e6)}")
        evidence: tuple[str, ...] = (*e["series"][:8], ev_hop)
        others = [f"{ch.hop_subject[k]} ({int(e['candidates'][k])})" for k in np.argsort(-e["candidates"])[:4].tolist()
                  if k != h and e["candidates"][k] > 0]
        if ambiguous and h >= 0:
            evidence += (("ambiguous: the blame is split; other candidates: " + ", ".join(others)) if others else
                         f"ambiguous: the other {n_traces - len(mine)} slow traces have no single slow hop",)
        out.append(Finding(kind="slo-breach", subject=subject, score=round(float(max(share, 0.0)), 4),
                           window=(e["w0"], e["w1"]), evidence=evidence,
                           action=f"{cfg.latency_action}; the slow hop is {subject}" if h >= 0 else cfg.latency_action,
                           details={"hop_kind": ch.hop_kind[h] if h >= 0 else "", "slow_traces": int(n_traces),
                                    "blamed_traces": len(mine), "ambiguous": int(ambiguous),
                                    "persistent": int(persistent), "breached_series": len(e["series"])}))
    return out


def _dominant_hop(ch: Chains, traces: np.ndarray) -> tuple[int, float]:
    """The hop with the largest share of the traces' end-to-end latency, and that share.

    Ties (within 1%) go to the hop furthest downstream (deepest span), the one the others wait on.
    """
    nh = len(ch.hop_subject)
    if len(traces) == 0 or nh == 0:
        return -1, 0.0
    mask = np.zeros(len(ch.e2e_ns), dtype=bool)
    mask[traces] = True
    sp = mask[ch.trace]
    own = np.bincount(ch.hop[sp], weights=ch.excl_ns[sp], minlength=nh)
    share = own / max(float(ch.e2e_ns[traces].sum()), 1.0)
    depth = np.zeros(len(ch.parent), dtype=np.int64)
    p = ch.parent.copy()
    while (p >= 0).any():  # one pass per tree level, not per span
        depth += p >= 0
        p = np.where(p >= 0, ch.parent[np.maximum(p, 0)], -1)
    hop_depth = np.zeros(nh)
    np.maximum.at(hop_depth, ch.hop[sp], depth[sp])
    near = np.flatnonzero(share >= share.max() - 0.01)
    h = int(near[np.argmax(hop_depth[near])])
    return h, float(share[h])


def _outliers(t: SpanTable, ch: Chains, cfg: RuleConfig) -> list[Finding]:
    req = request_mask(t)
    slow = req & ((t.end_ns - t.start_ns) > cfg.outlier_threshold_ms * 1e6) & (t.endpoint > 0)
    blame = ch.blame[ch.trace]
    own = np.zeros(len(t), dtype=bool)
    hb = blame >= 0
    own[hb] = ch.hop_service[blame[hb]] == t.service[hb]
    own &= np.array([k != "edge" for k in ch.hop_kind] + [False])[np.where(hb, blame, -1)]
    sel = slow & own
    iv = int(cfg.outlier_interval_s * 1e9)
    out: list[Finding] = []
    if not sel.any():
        return out
    ep, w = t.endpoint[sel], t.start_ns[sel] // iv
    keys, cnt = np.unique(np.stack([ep, w]), axis=1, return_counts=True)
    for (e, wi), c in zip(keys.T.tolist(), cnt.tolist(), strict=True):
        if c < cfg.outlier_count:
            continue
        name = t.endpoints[e]
        out.append(Finding(kind="slo-outlier-endpoint", subject=name, score=1.0, window=(wi * iv, (wi + 1) * iv),
                           evidence=(f"{c} requests over {_ms(cfg.outlier_threshold_ms)} in "
                                     f"{cfg.outlier_interval_s:g} s with the endpoint's own hop blamed "
                                     f"(threshold {cfg.outlier_count})",),
                           action=f"eject {name} from the load-balancing pool for {cfg.outlier_eject_s:g} s "
                                  "(outlier detection recommendation; nothing is enforced)",
                           details={"slow_requests": int(c), "eject_s": cfg.outlier_eject_s}))
    return out


def _errors(t: SpanTable, cfg: RuleConfig) -> list[Finding]:
    req = request_mask(t)
    iv = int(cfg.error_window_s * 1e9)
    svc, w = t.service[req].astype(np.int64), t.start_ns[req] // iv
    err = t.status[req] == STATUS_ERROR
    if len(svc) == 0:
        return []
    w0 = int(w.min())
    span = int(w.max()) - w0 + 1
    ukey, inv = factorize(svc * span + (w - w0))
    keys = np.stack([ukey // span, ukey % span + w0])
    cnt = np.bincount(inv, minlength=len(ukey))
    nerr = np.bincount(inv, weights=err.astype(np.float64), minlength=len(ukey))
    out = []
    for j in np.flatnonzero((nerr > 0) & (nerr / cnt > cfg.error_max_rate)).tolist():
        s, wi = int(keys[0, j]), int(keys[1, j])
        rate = nerr[j] / cnt[j]
        out.append(Finding(kind="slo-error-rate", subject=t.services[s], score=1.0, window=(wi * iv, (wi + 1) * iv),
                           evidence=(f"{int(nerr[j])} failed of {int(cnt[j])} requests ({rate:.2%}) > "
                                     f"{cfg.error_max_rate:.2%} in {cfg.error_window_s:g} s",),
                           action=f"alert: {t.services[s]} is failing requests; check its logs and recent changes",
                           details={"errors": int(nerr[j]), "requests": int(cnt[j]), "error_rate": float(rate)}))
    return out


def findings_json(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """Findings as JSON-ready dicts."""
    return [{"kind": f.kind, "subject": f.subject, "score": f.score, "window": list(f.window),
             "evidence": list(f.evidence), "action": f.action, "details": dict(f.details)} for f in findings]
