"""Prometheus Remote-Write output: encode + compress cost, and end to end into a real Prometheus.

Part 1 (CPU): events -> queue entries (``RemoteWriteSink.write``'s conversion) and one request
body (group by series, protobuf ``WriteRequest``, snappy block) for batches of 1,000 and
10,000 samples, in two shapes: one sample per series (a collector's usual batch: every port
once) and 10 samples per series. Samples per CPU-second use ``time.process_time``; the sink's
sender thread stays idle (a batch wait of an hour), so only the timed calls use the CPU.

Part 2 (end to end): a real Prometheus started with ``--web.enable-remote-write-receiver``,
``--samples`` samples (default 200,000: 2,000 series x 100 timestamps 1 s apart, recent),
written through one ``RemoteWriteSink`` in collector-sized batches; wall time until the
receiver accepted everything, the client's CPU seconds, and a PromQL check that every sample
is stored (``count_over_time`` summed over the series).

Usage: python benchmarks/bench_remote_write.py [--samples 200000] [--repeat 5] [--no-e2e]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import cramjam

from fabricscope.model.records import TelemetryEvent
from fabricscope.telemetry.remote_write import RemoteWriteOptions, RemoteWriteSink

ROOT = Path(__file__).resolve().parent
PATHS = ("/interfaces/interface/state/counters/in-octets", "/interfaces/interface/state/counters/out-octets",
         "/interfaces/interface/state/counters/in-pkts", "/interfaces/interface/state/counters/out-pkts")
MS = 1_000_000


def events(n_series: int, per_series: int, t0_ms: int, step_ms: int = 1000) -> list[TelemetryEvent]:
    """Time-major (all series at t0, then t1 ...), as a collector produces them; 64 ports per switch."""
    out = []
    for j in range(per_series):
        for i in range(n_series):
            path = PATHS[i % len(PATHS)]
            port = (i // len(PATHS)) % 64
            sw = i // (len(PATHS) * 64)
            out.append(TelemetryEvent(path, (t0_ms + j * step_ms) * MS, f"leaf-{sw:03d}",
                                      {"interface_name": f"Ethernet{port}"}, 1_000_000 * i + 1234 * j))
    return out


def cpu_bench(n: int, per_series: int, repeat: int) -> dict[str, Any]:
    """The sink's own code path: ``write`` (cold and warm label cache) then ``_encode`` (one request)."""
    evs = events(n // per_series, per_series, 1_800_000_000_000)
    opts = RemoteWriteOptions(url="http://127.0.0.1:9/api/v1/write", max_queue_samples=10 * n,
                              max_samples_per_send=10 * n, batch_wait_s=3600.0)  # never a full batch
    cold = warm = enc = float("inf")
    body = b""
    for _ in range(repeat):
        sink = RemoteWriteSink(opts)  # a new sink each round: its label cache starts cold
        try:
            c0 = time.process_time()
            sink.write(evs, [])
            c1 = time.process_time()
            sink._queue.clear()
            sink.write(evs, [])  # the same series again: the steady state of a collector
            c2 = time.process_time()
            batch = list(sink._queue)
            sink._queue.clear()
            c3 = time.process_time()
            body, k, _ = sink._encode(batch)
            c4 = time.process_time()
            assert k == n
        finally:
            sink.close(0)
        cold, warm, enc = min(cold, c1 - c0), min(warm, c2 - c1), min(enc, c4 - c3)
    raw = bytes(cramjam.snappy.decompress_raw(body))
    return {"samples": n, "per_series": per_series, "series": n // per_series,
            "convert_cold_cpu_s": cold, "convert_warm_cpu_s": warm, "encode_cpu_s": enc,
            "convert_cold_samples_per_cpu_s": n / cold, "convert_warm_samples_per_cpu_s": n / warm,
            "encode_samples_per_cpu_s": n / enc, "total_warm_samples_per_cpu_s": n / (warm + enc),
            "raw_bytes": len(raw), "snappy_bytes": len(body), "bytes_per_sample": len(body) / n,
            "ratio": len(raw) / len(body)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prom_query(base: str, **params: str) -> Any:
    with urllib.request.urlopen(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=30) as r:
        return json.load(r)["data"]["result"]


def e2e_bench(samples: int) -> dict[str, Any]:
    prom = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.path.exists(prom):
        return {"skipped": "prometheus not installed"}
    n_series = 2000
    per = max(1, samples // n_series)
    t0 = (int(time.time()) - 600) * 1000
    evs = events(n_series, per, t0)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        (Path(tmp) / "p.yml").write_text("global:\n  scrape_interval: 1m\n")
        proc = subprocess.Popen([prom, f"--config.file={tmp}/p.yml", f"--storage.tsdb.path={tmp}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                                 "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            end = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(base + "/-/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > end:
                    raise RuntimeError("prometheus did not become ready")
                time.sleep(0.1)
            sink = RemoteWriteSink(RemoteWriteOptions(url=base + "/api/v1/write", batch_wait_s=0.05,
                                                      max_queue_samples=max(200_000, len(evs))))
            w0, c0 = time.perf_counter(), time.process_time()
            for i in range(0, len(evs), 20_000):  # the collector's default batch_max
                sink.write(evs[i:i + 20_000], [])
            while sink.stats().samples_sent + sink.stats().rejected < len(evs):
                time.sleep(0.01)
            w1, c1 = time.perf_counter(), time.process_time()
            sink.close(10)
            st = sink.stats()
            t_end = (t0 + (per - 1) * 1000) / 1000
            stored = 0
            for path in PATHS:  # one name per query: count_over_time drops __name__, the series would clash
                m = "gnmi_" + path.strip("/").replace("/", "_").replace("-", "_")
                res = prom_query(base, query=f"sum(count_over_time({m}[{per + 5}s]))", time=f"{t_end:.3f}")
                stored += int(float(res[0]["value"][1])) if res else 0
        finally:
            proc.terminate()
            proc.wait(15)
    return {"samples": len(evs), "series": n_series, "wall_s": w1 - w0, "client_cpu_s": c1 - c0,
            "samples_per_s": len(evs) / (w1 - w0), "samples_per_client_cpu_s": len(evs) / (c1 - c0),
            "requests": st.requests, "retries": st.retries, "rejected": st.rejected, "dropped": st.dropped,
            "stored_in_prometheus": stored}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-e2e", action="store_true")
    a = ap.parse_args(argv)
    rows = [cpu_bench(n, per, a.repeat) for n in (1_000, 10_000) for per in (1, 10)]
    print(f"samples per CPU-second (best of {a.repeat} rounds): write() with a cold / warm label cache, "
          "then one request encoded (group, protobuf, snappy)")
    print(f"{'samples':>8} {'/series':>7} {'write cold':>11} {'write warm':>11} {'encode':>10} {'warm total':>11} "
          f"{'B/sample':>9} {'snappy x':>8}")
    for r in rows:
        print(f"{r['samples']:>8} {r['per_series']:>7} {r['convert_cold_samples_per_cpu_s']:>11,.0f} "
              f"{r['convert_warm_samples_per_cpu_s']:>11,.0f} {r['encode_samples_per_cpu_s']:>10,.0f} "
              f"{r['total_warm_samples_per_cpu_s']:>11,.0f} {r['bytes_per_sample']:>9.1f} {r['ratio']:>8.1f}")
    out: dict[str, Any] = {"cpu": rows, "python": sys.version.split()[0], "machine": platform.machine(),
                           "load_avg": os.getloadavg(), "date": time.strftime("%Y-%m-%d")}
    if not a.no_e2e:
        e = e2e_bench(a.samples)
        out["e2e"] = e
        if "skipped" in e:
            print("end to end: skipped,", e["skipped"])
        else:
            print(f"\nend to end into Prometheus: {e['samples']:,} samples ({e['series']} series) in "
                  f"{e['wall_s']:.2f} s = {e['samples_per_s']:,.0f} samples/s; client "
                  f"{e['samples_per_client_cpu_s']:,.0f} samples per CPU-s; {e['requests']} requests, "
                  f"{e['retries']} retries, {e['rejected']} rejected; stored (PromQL) {e['stored_in_prometheus']:,}")
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "remote_write.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
