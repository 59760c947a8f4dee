"""Push vs poll: can 60 s polling see 1-50 ms micro-bursts that streaming telemetry sees?

Runs in the twin on the simulated clock through the pure pipeline (twin -> TelemetryEvent ->
MicroBurstDetector), not over gRPC, so ten simulated minutes take seconds. Bytes on the wire
are the serialized gNMI SubscribeResponse messages each mode would send, built with the same
encoder the gNMI target uses (``codec.encode_notification``; gRPC/HTTP2 framing, ~14 B per
message, excluded).

Modes (same leaves: the RoCE queue's watermark and ECN-marked counter on every switch port):
  stream  ON_CHANGE watermark (target checks every 100 ms) + 1 s SAMPLE of watermark and ECN
  poll60  both leaves read every 60 s (SNMP-style polling)

Usage: python benchmarks/bench_pushpoll.py [--bursts 120] [--minutes 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.fabric.inventory import port_device
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.telemetry.codec import encode_notification, path_bytes, prefix_bytes
from fabricscope.telemetry.detectors import MicroBurstDetector
from fabricscope.telemetry.paths import parse_path, schema_name, tags_of
from fabricscope.twin.state import NS, Twin, background_load

ROOT = Path(__file__).resolve().parent
QUEUE_LEAVES = ("watermark-bytes", "ecn-marked-pkts")


def bursts(fabric, n: int, minutes: float, rng: np.random.Generator) -> list[Fault]:  # type: ignore[no-untyped-def]
    """``n`` micro-bursts of 1-50 ms (log-uniform) on random switch egress ports, >= 5 s apart per port."""
    ports = sorted(p for p in fabric.peer_port if fabric.devices[port_device(p)].is_switch)
    cap = {p: fabric.ports[p].speed_gbps * 1e9 / 8 for p in ports}
    out: list[Fault] = []
    last: dict[str, int] = {}
    horizon = int(minutes * 60 * NS) - 5 * NS
    while len(out) < n:
        p = ports[int(rng.integers(len(ports)))]
        t = int(rng.integers(5 * NS, horizon))
        if abs(t - last.get(p, -10**18)) < 5 * NS:
            continue
        d_ns = int(np.exp(rng.uniform(np.log(1e6), np.log(50e6))))
        # the queue grows at half line rate for the burst: depth ~ d x rate / 2, capped by the buffer
        depth = float(min(32e6, max(0.3e6, 0.5 * cap[p] * d_ns / NS)))
        out.append(Fault("micro-burst", p, t, t + d_ns, {"depth_bytes": depth}))
        last[p] = t
    return sorted(out, key=lambda f: f.start_ns)


def _run(mode: str, fabric, faults: list[Fault], minutes: float, seed: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    clock = SimClock()
    twin = Twin(fabric, clock=clock, faults=FaultSchedule.of(faults),
                load_bps=background_load(fabric, utilization=0.4, seed=seed), rng=seed)
    leaves = {}
    for t in twin.targets():
        lv = [lf for lf in twin.leaves(t) if lf.path.rsplit("/", 1)[-1] in QUEUE_LEAVES and "queue[name=3]" in lf.path]
        parsed = [parse_path(lf.path) for lf in lv]
        leaves[t] = (lv, [(schema_name(p), tags_of(p)) for p in parsed], [path_bytes(p) for p in parsed],
                     prefix_bytes(t))
    det = MicroBurstDetector()
    findings: list[Finding] = []
    wire_bytes = 0
    updates = 0
    messages = 0
    last: dict[str, list[object]] = {}
    tick = 100_000_000 if mode == "stream" else 60 * NS
    end = int(minutes * 60 * NS)
    while clock.now_ns() < end:
        clock.advance(tick)
        twin.sync()
        now = clock.now_ns()
        sample = mode == "poll60" or now % NS == 0
        for t, (lv, meta, wire, pre) in leaves.items():
            vals = twin.read(lv)
            prev = last.get(t)
            if sample or prev is None:
                idx = range(len(lv))
            else:  # on-change: watermark leaves whose value moved since the last send
                idx = [i for i, v in enumerate(vals) if v != prev[i] and meta[i][0].endswith("watermark-bytes")]
            if prev is None:
                prev = last[t] = list(vals)
            for i in idx:
                prev[i] = vals[i]
            if not idx:
                continue
            events = [TelemetryEvent(meta[i][0], now, t, meta[i][1], vals[i]) for i in idx]
            msg = encode_notification(now, pre, [(wire[i], vals[i]) for i in idx])
            wire_bytes += len(msg)
            messages += 1
            updates += len(events)
            findings += det(events)
    detected, delays = 0, []
    for f in faults:
        hits = [g.window[0] for g in findings if g.subject == f.subject and g.window[0] >= f.start_ns
                and g.window[0] <= f.start_ns + 120 * NS]
        if hits:
            detected += 1
            delays.append((min(hits) - f.start_ns) / 1e9)
    by_len = {"1-5 ms": (1e6, 5e6), "5-20 ms": (5e6, 20e6), "20-50 ms": (20e6, 51e6)}
    rate_by_len = {}
    for name, (lo, hi) in by_len.items():
        sel = [f for f in faults if lo <= (f.end_ns or 0) - f.start_ns < hi]
        hit = sum(1 for f in sel if any(g.subject == f.subject and f.start_ns <= g.window[0] <= f.start_ns + 120 * NS
                                        for g in findings))
        rate_by_len[name] = (hit, len(sel))
    explained = {f.subject for f in faults}
    return {
        "mode": mode, "bursts": len(faults), "detected": detected, "rate": detected / len(faults),
        "delay_median_s": float(np.median(delays)) if delays else None,
        "delay_p95_s": float(np.percentile(delays, 95)) if delays else None,
        "by_length": {k: {"detected": a, "of": b} for k, (a, b) in rate_by_len.items()},
        "false_findings": sum(1 for g in findings if g.subject not in explained),
        "updates": updates, "messages": messages, "bytes": wire_bytes,
        "bytes_per_s": wire_bytes / (minutes * 60),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bursts", type=int, default=120)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    fabric = leaf_spine_fabric(leaves=8, hosts_per_leaf=8, spines=4, host_gbps=100, uplink_gbps=200)
    faults = bursts(fabric, a.bursts, a.minutes, np.random.default_rng(a.seed))
    t0 = time.perf_counter()
    rows = [_run(m, fabric, faults, a.minutes, a.seed) for m in ("stream", "poll60")]
    print(f"push vs poll: {a.bursts} micro-bursts of 1-50 ms on random switch ports of {fabric.name}, "
          f"{a.minutes:.0f} simulated minutes (twin, simulated clock, pure pipeline)")
    print(f"{'mode':<8} {'detected':>9} {'rate':>6} {'1-5ms':>7} {'5-20ms':>7} {'20-50ms':>8} {'delay p50':>10} "
          f"{'delay p95':>10} {'false':>6} {'updates':>9} {'wire bytes':>11} {'B/s':>8}")
    for r in rows:
        bl = r["by_length"]
        cells = [f"{bl[k]['detected']}/{bl[k]['of']}" for k in ("1-5 ms", "5-20 ms", "20-50 ms")]  # type: ignore[index]
        p50 = "-" if r["delay_median_s"] is None else f"{r['delay_median_s']:.2f}s"
        p95 = "-" if r["delay_p95_s"] is None else f"{r['delay_p95_s']:.2f}s"
        print(f"{r['mode']:<8} {r['detected']:>9} {r['rate']:>6.0%} {cells[0]:>7} {cells[1]:>7} {cells[2]:>8} "
              f"{p50:>10} {p95:>10} {r['false_findings']:>6} {r['updates']:>9} {r['bytes']:>11} {r['bytes_per_s']:>8.0f}")
    out = {"benchmark": "telemetry push vs poll", "fabric": fabric.name, "args": vars(a), "rows": rows,
           "seconds": round(time.perf_counter() - t0, 1), "machine": platform.platform(),
           "method": "twin on simulated clock, pure pipeline (no gRPC); bytes = serialized SubscribeResponse"}
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "telemetry_pushpoll.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
