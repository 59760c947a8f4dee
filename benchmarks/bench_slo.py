"""Benchmark of ``fabricscope slo``: throughput / memory of the analysis, breach-localization accuracy.

Targets (issue 16): 10M spans analysed in < 30 s and < 4 GiB; the right hop in >= 95% of generated
chains with one slow hop; 0 breaches on healthy chains.

Throughput: one base file of generated traces is written once and replicated with the first two hex
digits of every trace id rewritten per copy (distinct traces, same shape), to reach N spans
without minutes of generation. Each size is analysed (decode + windows + chains + rules) in a fresh
subprocess whose peak RSS is its own.

Usage: .venv/bin/python benchmarks/bench_slo.py [--sizes 1000000,10000000] [--tmp /tmp/bench_slo]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from fabricscope.slo.chains import analyze_chains
from fabricscope.slo.otlp import read_spans
from fabricscope.slo.rules import RuleConfig, evaluate_rules
from fabricscope.twin.agent_traces import AgentTraceConfig, write_agent_traces

_CHILD = """
import resource, sys, time
t0 = time.perf_counter()
from fabricscope.slo.otlp import read_spans
from fabricscope.slo.chains import analyze_chains
from fabricscope.slo.windows import window_stats
from fabricscope.slo.rules import RuleConfig, evaluate_rules
from concurrent.futures import ThreadPoolExecutor
t = read_spans([sys.argv[1]])
t1 = time.perf_counter()
with ThreadPoolExecutor(1) as pool:  # as `slo analyze` does: windows beside the chains
    fut = pool.submit(window_stats, t, window_ns=60 * 10**9)
    ch = analyze_chains(t, slo_ns=25_000_000)
    ws = fut.result()
f = evaluate_rules(t, ch, RuleConfig(), stats=ws)
t2 = time.perf_counter()
print(len(t), t1 - t0, t2 - t1, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, len(f))
"""


def _replicate(base: Path, out: Path, copies: int) -> None:
    lines = base.read_text().splitlines()
    pat = re.compile(r'"traceId":"[0-9a-f]{2}')
    with out.open("w") as fh:
        for k in range(copies):
            rep = f'"traceId":"{k:02x}'
            for line in lines:
                fh.write(pat.sub(rep, line))
                fh.write("\n")


def accuracy(tmp: Path, *, n: int = 1000, seed: int = 7) -> dict[str, float]:
    slow = tmp / "slow.jsonl"
    truth = write_agent_traces(slow, AgentTraceConfig(n_traces=n, qps=5, slow_fraction=1.0), seed=seed)
    t = read_spans([slow])
    ch = analyze_chains(t, slo_ns=25_000_000)
    got = dict(zip((x.decode() for x in ch.trace_id), ch.blamed_subjects(), strict=True))
    by_kind: dict[str, list[bool]] = {}
    for tr in truth:
        by_kind.setdefault(tr.kind, []).append(got[tr.trace_id] == tr.hop)
    healthy = tmp / "healthy.jsonl"
    write_agent_traces(healthy, AgentTraceConfig(n_traces=n, qps=5), seed=seed + 1)
    th = read_spans([healthy])
    chh = analyze_chains(th, slo_ns=25_000_000)
    findings = evaluate_rules(th, chh, RuleConfig())
    res = {"slow_chains": n, "localized": sum(sum(v) for v in by_kind.values()) / n,
           "healthy_chains": n, "healthy_findings": len(findings),
           "healthy_breaches": sum(f.kind == "slo-breach" for f in findings),
           "healthy_blamed_traces": int((chh.blame >= 0).sum())}
    res.update({f"localized_{k}": sum(v) / len(v) for k, v in by_kind.items()})
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--tmp", default="/tmp/bench_slo")
    ap.add_argument("--base-traces", type=int, default=12_500)
    a = ap.parse_args()
    tmp = Path(a.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    acc = accuracy(tmp)
    base = tmp / "base.jsonl"
    t0 = time.perf_counter()
    write_agent_traces(base, AgentTraceConfig(n_traces=a.base_traces, qps=1000, slow_fraction=0.05), seed=1)
    gen_s = time.perf_counter() - t0
    spans_per_base = a.base_traces * 8
    rows = []
    for size in (int(s) for s in a.sizes.split(",")):
        copies = max(1, round(size / spans_per_base))
        f = tmp / f"spans_{size}.jsonl"
        _replicate(base, f, copies)
        mb = f.stat().st_size / 2**20
        out = subprocess.run([sys.executable, "-c", _CHILD, str(f)], capture_output=True, text=True, check=True)
        n, dec, ana, rss, nf = out.stdout.split()
        rows.append({"spans": int(n), "file_mib": round(mb), "decode_s": round(float(dec), 2),
                     "analyze_s": round(float(ana), 2), "total_s": round(float(dec) + float(ana), 2),
                     "peak_rss_mib": round(float(rss)), "findings": int(nf)})
        f.unlink()
    print(f"accuracy: localized {acc['localized']:.1%} of {acc['slow_chains']} one-slow-hop chains "
          + ", ".join(f"{k[10:]} {v:.1%}" for k, v in acc.items() if k.startswith("localized_")))
    print(f"healthy: {acc['healthy_findings']} findings ({acc['healthy_breaches']} breaches) on "
          f"{acc['healthy_chains']} chains; {acc['healthy_blamed_traces']} traces blamed")
    print(f"generated base {spans_per_base} spans in {gen_s:.1f} s")
    print(f"{'spans':>10} {'MiB':>6} {'decode s':>9} {'analyze s':>10} {'total s':>8} {'RSS MiB':>8}")
    for r in rows:
        print(f"{r['spans']:>10} {r['file_mib']:>6} {r['decode_s']:>9} {r['analyze_s']:>10} {r['total_s']:>8} "
              f"{r['peak_rss_mib']:>8}")
    if len(rows) >= 2:
        per = (rows[-1]["total_s"] - rows[0]["total_s"]) / (rows[-1]["spans"] - rows[0]["spans"])
        extrap = rows[-1]["total_s"] + per * (10_000_000 - rows[-1]["spans"])
        rss_per = (rows[-1]["peak_rss_mib"] - rows[0]["peak_rss_mib"]) / (rows[-1]["spans"] - rows[0]["spans"])
        rss10 = rows[-1]["peak_rss_mib"] + rss_per * (10_000_000 - rows[-1]["spans"])
        print(f"10M spans extrapolated (linear): {extrap:.0f} s, {rss10:.0f} MiB (NOT measured)")
    else:
        extrap = rss10 = float("nan")
    Path("benchmarks/results").mkdir(parents=True, exist_ok=True)
    Path("benchmarks/results/slo.json").write_text(json.dumps(
        {"accuracy": acc, "throughput": rows, "extrapolated_10M": {"total_s": extrap, "peak_rss_mib": rss10},
         "base_generation_s": gen_s}, indent=1))


if __name__ == "__main__":
    main()
