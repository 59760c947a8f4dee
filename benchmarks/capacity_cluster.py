"""Capacity model of the collector cluster (issue 14), on paper from the measured per-CPU figures.

For a fabric of N GPUs (one 400G NIC port per GPU, a non-blocking 3-tier Clos: leaf, spine
and super-spine, so 5 switch ports per GPU; radix-64 switches up to 32k GPUs, radix-128 at
100k) and a telemetry plan (updates per port per second), it derives the devices, the update
rate, and from the measured costs the collector, worker and nats-server cores, the bus
bandwidth, and the storage per day. Every input is a flag; the defaults are the figures
measured here (see docs/benchmarks/cluster.md for where each comes from). It measures
nothing itself.

    .venv/bin/python benchmarks/capacity_cluster.py
    .venv/bin/python benchmarks/capacity_cluster.py --changed-fraction 0.5 --headroom 2

Writes ``benchmarks/results/capacity_cluster.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: per port and second at a 1 s sample interval: interface counters (12 leaves), 8 queues x 4
#: (transmit packets / octets, dropped, watermark), PFC 8 priorities x rx/tx pause frames,
#: ECN-marked / buffer occupancy (4); optics (8 lanes x bias / tx / rx power, temperature,
#: voltage = 26 leaves) every 10 s.
UPDATES_PER_PORT_S = 12 + 8 * 4 + 8 * 2 + 4 + 26 / 10


def fabric(gpus: int) -> dict[str, Any]:
    """Switches and ports of a non-blocking 3-tier Clos with one NIC port per GPU."""
    radix = 64 if gpus <= 32 * 1024 else 128
    leaves = math.ceil(gpus / (radix // 2))
    spines = leaves  # half of each leaf's ports go up, spines split half down / half up
    supers = math.ceil(leaves * (radix // 2) / radix)
    return {"gpus": gpus, "radix": radix, "switches": leaves + spines + supers,
            "ports": gpus + 2 * leaves * (radix // 2) + supers * radix}


def model(gpus: int, a: argparse.Namespace) -> dict[str, Any]:
    """The derived rates and resources for ``gpus`` GPUs (see the module docstring)."""
    f = fabric(gpus)
    ups = f["ports"] * a.updates_per_port * a.changed_fraction  # updates/s onto the bus
    batch = max(1.0, min(a.batch_events, ups / f["switches"] * a.linger_s))  # events per message
    msgs = ups / batch
    coll = (f["switches"] * a.device_cpu_s + ups * (a.update_cpu_us + a.publish_cpu_us) * 1e-6) * a.headroom
    work = (msgs * a.worker_msg_cpu_ms * 1e-3 + ups * a.worker_event_cpu_us * 1e-6) * a.headroom
    nats = (msgs * a.nats_msg_cpu_ms * 1e-3 + ups * a.nats_event_cpu_us * 1e-6) * a.headroom
    wire = ups * a.bus_bytes_per_event
    return {**f, "updates_per_s": ups, "events_per_message": batch, "messages_per_s": msgs,
            "collector_cores": coll, "collectors": math.ceil(coll / a.cores_per_process),
            "worker_cores": work, "workers": math.ceil(work / a.cores_per_process), "nats_cores": nats,
            "bus_MB_per_s": wire / 1e6, "jetstream_GB_for_replay": wire * a.replay_s / 1e9,
            "kv_writes_per_s": f["switches"] * 3 / a.lease_s,
            "duckdb_TB_per_day": ups * 86400 * a.duckdb_bytes_per_event / 1e12,
            "duckdb_TB_per_day_1min": ups / 60 * 86400 * a.duckdb_bytes_per_event / 1e12,
            "prometheus_TB_per_day_1min": ups / 60 * 86400 * a.prom_bytes_per_sample / 1e12}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="10240,32768,102400", help="fabric sizes, comma separated")
    ap.add_argument("--updates-per-port", type=float, default=UPDATES_PER_PORT_S)
    ap.add_argument("--changed-fraction", type=float, default=1.0,
                    help="share of updates that reach the bus (suppress-redundant / on-change drop the rest)")
    ap.add_argument("--device-cpu-s", type=float, default=1 / 2318,
                    help="collector CPU-s per owned device and second (bench_cluster.py, 1 collector)")
    ap.add_argument("--update-cpu-us", type=float, default=1e6 / 117_000,
                    help="collector CPU per update (bench_telemetry: 117k/CPU-s with detectors and DuckDB)")
    ap.add_argument("--publish-cpu-us", type=float, default=1e6 / 1.04e6, help="bus publisher (bench_cluster_bus)")
    ap.add_argument("--worker-event-cpu-us", type=float, default=1e6 / 227_000, help="bench_cluster_bus, batch 1000")
    ap.add_argument("--worker-msg-cpu-ms", type=float, default=1e3 / 6717,
                    help="per message, 1-event messages (bench_cluster.py, 1 collector)")
    ap.add_argument("--nats-msg-cpu-ms", type=float, default=1e3 / 8896, help="nats-server per 1-event message")
    ap.add_argument("--nats-event-cpu-us", type=float, default=0.05 / 200_000 * 1e6,
                    help="nats-server per event at batch 1000 (bench_cluster_bus)")
    ap.add_argument("--batch-events", type=float, default=1000)
    ap.add_argument("--linger-s", type=float, default=0.05)
    ap.add_argument("--bus-bytes-per-event", type=float, default=6.8, help="fsb v1 + zlib at batch 100")
    ap.add_argument("--duckdb-bytes-per-event", type=float, default=9.1, help="measured on a counter store")
    ap.add_argument("--prom-bytes-per-sample", type=float, default=2.0, help="Prometheus TSDB: 1-2 B/sample")
    ap.add_argument("--replay-s", type=float, default=600.0, help="JetStream retention a restarted worker needs")
    ap.add_argument("--lease-s", type=float, default=3.0)
    ap.add_argument("--cores-per-process", type=float, default=1.0, help="one process is one Python core")
    ap.add_argument("--headroom", type=float, default=1.0, help="multiply every CPU figure (peaks, noise)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "capacity_cluster.json")
    a = ap.parse_args()
    rows = [model(int(g), a) for g in a.gpus.split(",")]
    print(f"{'GPUs':>8}{'switches':>10}{'ports':>9}{'updates/s':>12}{'collectors':>12}{'workers':>9}"
          f"{'NATS cores':>12}{'bus MB/s':>10}{'KV w/s':>8}{'DuckDB TB/d':>13}{'1-min TB/d':>12}{'Prom 1-min TB/d':>17}")
    for r in rows:
        print(f"{r['gpus']:>8,}{r['switches']:>10,}{r['ports']:>9,}{r['updates_per_s']:>12,.0f}"
              f"{r['collectors']:>12}{r['workers']:>9}{r['nats_cores']:>12.1f}{r['bus_MB_per_s']:>10.1f}"
              f"{r['kv_writes_per_s']:>8,.0f}{r['duckdb_TB_per_day']:>13.2f}{r['duckdb_TB_per_day_1min']:>12.3f}"
              f"{r['prometheus_TB_per_day_1min']:>17.3f}")
    print(f"({a.updates_per_port:g} updates per port per s x {a.changed_fraction:g} reaching the bus; "
          f"CPU x {a.headroom:g}; on paper from the measured per-CPU figures, not a run)")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"inputs": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                                 "rows": rows}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
