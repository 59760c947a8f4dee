"""Events per CPU-second through the NATS JetStream bus vs the embedded single-process mode.

Starts a real ``nats-server -js`` on loopback (temp store), then, in sequential phases so
``time.process_time`` (all threads of this process) isolates each side:

  publisher  BusPublisher.write of every event (batched per target), flush until acked
  worker     Worker: fetch, decode, de-dup, default detectors, ack, until all are seen
  embedded   the same events straight into default_detectors() (no bus)

for batch sizes 100 and 1000. The server's own CPU (utime+stime from /proc) is reported
apart. Also prints the encoding comparison that chose the wire format (bytes/event and
encode/decode us/event: this format raw and zlib'd, zlib'd JSON).

Usage: python benchmarks/bench_cluster_bus.py [--events 200000] [--targets 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from fabricscope.cluster.bus import BusConfig, BusPublisher
from fabricscope.cluster.encoding import decode_events, encode_events
from fabricscope.cluster.worker import Worker
from fabricscope.model.records import TelemetryEvent
from fabricscope.telemetry.detectors import default_detectors

ROOT = Path(__file__).resolve().parent
LEAVES = ("in-octets", "out-octets", "in-pkts", "out-pkts", "in-errors", "in-discards", "out-discards",
          "in-fcs-errors", "carrier-transitions", "in-pause-frames")


def workload(n: int, targets: int, seed: int) -> list[TelemetryEvent]:
    """Counter samples of ``targets`` switches x 32 ports x the leaves above, 1 s apart, in
    collector order (one notification's leaves together); traffic counters grow by up to 1 MiB
    per sample, pause frames by < 100, errors / discards / carrier transitions rarely (1e-4)."""
    rng = random.Random(seed)
    tagsets = [{"interface_name": f"Ethernet{p}"} for p in range(32)]
    out: list[TelemetryEvent] = []
    t = 1_700_000_000_000_000_000
    value: dict[tuple[int, int, int], int] = {}
    while len(out) < n:
        for tg in range(targets):
            for p in range(32):
                for li, leaf in enumerate(LEAVES):
                    k = (tg, p, li)
                    if li < 4:  # traffic counters
                        step = rng.randrange(1 << 20)
                    elif leaf == "in-pause-frames":
                        step = rng.randrange(100)
                    else:  # errors, discards, flaps: rare
                        step = 1 if rng.random() < 1e-4 else 0
                    value[k] = value.get(k, rng.randrange(1 << 30) if li < 4 else 0) + step
                    out.append(TelemetryEvent(f"/interfaces/interface/state/counters/{leaf}", t, f"leaf-{tg:03d}",
                                              tagsets[p], value[k]))
        t += 1_000_000_000
    return out[:n]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                time.sleep(0.2)  # JetStream comes up just after the listener
                return
        time.sleep(0.05)
    raise SystemExit(f"nats-server did not listen on 127.0.0.1:{port} within {timeout_s} s")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def encoding_table(events: list[TelemetryEvent], batch: int) -> list[dict[str, object]]:
    chunks = [events[i:i + batch] for i in range(0, min(len(events), 50_000), batch)]
    n = sum(map(len, chunks))

    def jenc(ev: list[TelemetryEvent]) -> bytes:
        return zlib.compress(json.dumps([[e.name, e.ts_ns, e.target, dict(e.tags), e.value] for e in ev]).encode(), 1)

    def jdec(b: bytes) -> list[TelemetryEvent]:
        return [TelemetryEvent(a, t, g, d, v) for a, t, g, d, v in json.loads(zlib.decompress(b))]

    rows = []
    for name, enc, dec in (("fsb v1", lambda e: encode_events(e, compress=False), decode_events),
                           ("fsb v1 + zlib", lambda e: encode_events(e, compress=True), decode_events),
                           ("json + zlib", jenc, jdec)):
        t = time.process_time()
        blobs = [enc(c) for c in chunks]
        te = time.process_time() - t
        t = time.process_time()
        for b in blobs:
            dec(b)
        td = time.process_time() - t
        rows.append({"format": name, "batch": batch, "bytes_per_event": sum(map(len, blobs)) / n,
                     "encode_us_per_event": te / n * 1e6, "decode_us_per_event": td / n * 1e6})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "results" / "cluster_bus.json"))
    a = ap.parse_args()
    # `timeout` sends SIGTERM: leave through the finally blocks so nats-server is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    nats_bin = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not os.path.exists(nats_bin):
        print("bench_cluster_bus: nats-server not found on PATH or at /usr/sbin/nats-server", file=sys.stderr)
        return 2
    events = workload(a.events, a.targets, a.seed)
    rows: list[dict[str, object]] = []
    enc_rows: list[dict[str, object]] = []
    for batch in (100, 1000):
        enc_rows += encoding_table(events, batch)
        with tempfile.TemporaryDirectory() as d:
            port = free_port()
            srv = subprocess.Popen([nats_bin, "-js", "-sd", d, "-a", "127.0.0.1", "-p", str(port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_listening(port)
                cfg = BusConfig(url=f"nats://127.0.0.1:{port}", max_bytes=4 << 30)
                srv0 = proc_cpu_s(srv.pid)
                c0, w0 = time.process_time(), time.perf_counter()
                pub = BusPublisher(cfg, batch_events=batch, linger_s=0.05)
                for i in range(0, len(events), 10_000):  # the collector writer's batch size
                    pub.write(events[i:i + 10_000], [])
                if not pub.flush(120):
                    raise SystemExit("publisher did not drain in 120 s")
                c1, w1 = time.process_time(), time.perf_counter()
                pst = pub.stats()
                pub.close(5)
                srv1 = proc_cpu_s(srv.pid)
                w = Worker(cfg, fetch_batch=max(1, 64_000 // batch // 4), max_ack_pending=4096)
                c2, w2 = time.process_time(), time.perf_counter()
                wst = asyncio.run(w.run(until=lambda s: s.unique_events >= len(events), duration_s=180))
                c3, w3 = time.process_time(), time.perf_counter()
                srv2 = proc_cpu_s(srv.pid)
            finally:
                srv.terminate()
                srv.wait(10)
        assert wst.unique_events == len(events) and pst.dropped_events == 0, (wst, pst)
        det = default_detectors()
        c4 = time.process_time()
        n_emb = 0
        for i in range(0, len(events), batch):
            n_emb += len(det(events[i:i + batch]))
        c5 = time.process_time()
        rows.append({
            "batch": batch, "events": len(events), "messages": pst.published_batches,
            "publisher_events_per_cpu_s": len(events) / (c1 - c0), "publisher_wall_s": w1 - w0,
            "worker_events_per_cpu_s": len(events) / (c3 - c2), "worker_wall_s": w3 - w2,
            "server_cpu_s_publish": srv1 - srv0, "server_cpu_s_consume": srv2 - srv1,
            "embedded_events_per_cpu_s": len(events) / (c5 - c4),
            "findings_worker": wst.findings_published, "findings_embedded": n_emb,
            "duplicates": wst.duplicate_events,
        })
    print(f"{'format':<16}{'batch':>6}{'B/event':>9}{'enc us':>8}{'dec us':>8}")
    for r in enc_rows:
        print(f"{r['format']:<16}{r['batch']:>6}{r['bytes_per_event']:>9.1f}{r['encode_us_per_event']:>8.2f}"
              f"{r['decode_us_per_event']:>8.2f}")
    print()
    print(f"{'batch':>6}{'pub ev/cpu-s':>14}{'worker ev/cpu-s':>17}{'embedded ev/cpu-s':>19}{'srv cpu s':>11}"
          f"{'pub wall s':>11}{'wrk wall s':>11}")
    for r in rows:
        print(f"{r['batch']:>6}{r['publisher_events_per_cpu_s']:>14,.0f}{r['worker_events_per_cpu_s']:>17,.0f}"
              f"{r['embedded_events_per_cpu_s']:>19,.0f}"
              f"{float(r['server_cpu_s_publish']) + float(r['server_cpu_s_consume']):>11.2f}"  # type: ignore[arg-type]
              f"{r['publisher_wall_s']:>11.2f}{r['worker_wall_s']:>11.2f}")
    out = {"benchmark": "cluster bus (NATS JetStream) vs embedded", "args": vars(a),
           "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                       "nats_server": subprocess.run([nats_bin, "--version"], capture_output=True, text=True).stdout.strip()},
           "encoding": enc_rows, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
