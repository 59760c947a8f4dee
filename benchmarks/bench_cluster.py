"""The collector cluster over NATS JetStream at 500 devices: failover, throughput per CPU-second, scaling.

Runs the scenario of ``tests/test_cluster_e2e.py`` (a 500-device twin gNMI target, one counter
path per device at 1 s; ``fabricscope gnmi collect --cluster`` members; two ``fabricscope
worker`` processes on one durable consumer) with real processes, and measures:

* failover: kill -9 one of three members (lease 3 s); seconds until each of its devices'
  events reach a worker again (max and median), samples lost, duplicates;
* throughput: events through the bus per CPU-second of the collectors and of the workers
  (utime + stime from /proc/<pid>/stat), with 1 and with 3 collectors;
* the embedded mode: one plain ``fabricscope gnmi collect`` (no bus; the same detectors,
  a memory sink) per CPU-second, side by side.

Wall-clock scaling cannot show on a machine of 2 shared cores (all processes share them);
the scaling is per CPU-second.

    .venv/bin/python benchmarks/bench_cluster.py             # ~2.5 minutes
    .venv/bin/python benchmarks/bench_cluster.py --steady 10

Writes ``benchmarks/results/cluster.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from test_cluster_e2e import _MAIN, _TWIN, PATH, Scenario, cpu_s, nats_server  # noqa: E402

COUNTERS = "/interfaces/interface[name=eth1]/state/counters"


def _published(work: Path, names: list[str]) -> int:
    n = 0
    for m in names:
        for line in (work / f"{m}.log").read_text().splitlines():
            hit = re.search(r"member \S+: acquired \d+, released \d+, received \d+, published (\d+)", line)
            if hit:
                n += int(hit.group(1))
    return n


def _worker_unique(work: Path, names: list[str]) -> int:
    n = 0
    for w in names:
        lines = [ln for ln in (work / f"{w}.log").read_text().splitlines() if ln.startswith("{")]
        n += json.loads(lines[-1])["unique_events"]
    return n


def throughput(collectors: int, devices: int, steady: float, *, path: str = PATH,
               interval: str = "1s") -> dict[str, Any]:
    """Steady state, no kill, workers without --tap: events per CPU-second of each role."""
    with nats_server() as url, tempfile.TemporaryDirectory(prefix="fs-bench-cluster-") as d:
        work = Path(d)
        sc = Scenario(url, work, devices=devices, collectors=collectors, steady_s=steady, kill=False, rejoin=False,
                      tap=False, path=path, interval=interval)
        try:
            r = sc.run()
        finally:
            sc.close()
        cols = [f"c{i}" for i in range(collectors)]
        pub = _published(work, cols)
        uniq = _worker_unique(work, ["w0", "w1"])
        ccpu = sum(r["cpu_s"][c] for c in cols)
        wcpu = r["cpu_s"]["w0"] + r["cpu_s"]["w1"]
        steady_n = r["sent_ready_to_end"]
        dc = sum(r["cpu_s"][c] - r["cpu_ready_s"].get(c, 0.0) for c in cols)
        dw = sum(r["cpu_s"][w] - r["cpu_ready_s"].get(w, 0.0) for w in ("w0", "w1"))
        dn = (r["cpu_s"].get("nats") or 0.0) - r["cpu_ready_s"].get("nats", 0.0)
        return {"collectors": collectors, "devices": devices, "path": path, "interval": interval,
                "steady_events": steady_n, "steady_collector_cpu_s": dc, "steady_worker_cpu_s": dw,
                "steady_nats_cpu_s": dn,
                "steady_events_per_collector_cpu_s": steady_n / dc if dc else None,
                "steady_events_per_worker_cpu_s": steady_n / dw if dw else None,
                "steady_events_per_nats_cpu_s": steady_n / dn if dn else None,
                "steady_s": steady, "published": pub,
                "worker_events": uniq, "collector_cpu_s": ccpu, "worker_cpu_s": wcpu,
                "nats_cpu_s": r["cpu_s"].get("nats"), "twin_cpu_s": r["cpu_s"]["twin"],
                "events_per_collector_cpu_s": pub / ccpu if ccpu else None,
                "events_per_worker_cpu_s": uniq / wcpu if wcpu else None,
                "bus_events_per_nats_cpu_s": pub / r["cpu_s"]["nats"] if r["cpu_s"].get("nats") else None}


def failover(devices: int, lease: float, steady: float) -> dict[str, Any]:
    """Three members, kill -9 one (lease ``lease``), then start it again."""
    with nats_server() as url, tempfile.TemporaryDirectory(prefix="fs-bench-cluster-") as d:
        sc = Scenario(url, Path(d), devices=devices, collectors=3, lease_s=lease, steady_s=steady)
        try:
            r: dict[str, Any] = sc.run()
        finally:
            sc.close()
    r.pop("marks", None)
    r.pop("missing_other_examples", None)
    return r


def embedded(devices: int, duration: float) -> dict[str, Any]:
    """One plain collector (no bus): the same twin, the default detectors, a memory sink."""
    with tempfile.TemporaryDirectory(prefix="fs-bench-embedded-") as d:
        work = Path(d)
        twin = subprocess.Popen([sys.executable, "-c", _TWIN, str(devices), str(work / "twin.json")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert twin.stdout is not None
            port = int(twin.stdout.readline().split()[1])
            names = [f"leaf-{i:03d}" for i in range(devices - 1)] + ["spine-00"]
            cfg = {"targets": {"twin": {"address": f"127.0.0.1:{port}", "names": names}},
                   "subscriptions": {"c": {"paths": [PATH], "sample-interval": "1s"}},
                   "detectors": {"micro-burst": {}, "error-increase": {}, "link-flap": {}, "pause-storm": {}},
                   "sinks": [{"type": "memory"}], "buffer": {"flush-interval": "1s"}, "stats-interval": "0s"}
            (work / "e.yaml").write_text(json.dumps(cfg))
            env = {**os.environ, "GRPC_VERBOSITY": "NONE"}
            col = subprocess.Popen([sys.executable, "-c", _MAIN, "gnmi", "collect", "--config", str(work / "e.yaml")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            time.sleep(5.0)  # start-up and every stream's first sync
            t_a, cpu_a = time.time(), cpu_s(col.pid)
            time.sleep(duration - 5.0)
            t_b, cpu = time.time(), cpu_s(col.pid)
            col.send_signal(signal.SIGTERM)
            out, _ = col.communicate(timeout=30)
            hit = re.search(r"received (\d+), written (\d+)", out)
            written = int(hit.group(2)) if hit else 0
        finally:
            twin.send_signal(signal.SIGTERM)
            twin.wait(30)
        sent = json.loads((work / "twin.json").read_text())["sent"]
    steady = sum(n for rows in sent.values() for _ts, n, t in rows if t_a <= t <= t_b)
    return {"devices": devices, "duration_s": duration, "written": written, "collector_cpu_s": cpu,
            "events_per_collector_cpu_s": written / cpu if cpu else None,
            "steady_events": steady, "steady_collector_cpu_s": cpu - cpu_a,
            "steady_events_per_collector_cpu_s": steady / (cpu - cpu_a) if cpu > cpu_a else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=500)
    ap.add_argument("--steady", type=float, default=15.0, help="seconds of steady state per run")
    ap.add_argument("--lease", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=3, help="failover repetitions (a fresh cluster each)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cluster.json")
    a = ap.parse_args()
    logging.getLogger("fabricscope.cluster.membership").setLevel(logging.ERROR)  # status reads' reconnect lines
    t0 = time.monotonic()
    res: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
                           "python": platform.python_version(), "devices": a.devices,
                           "paths_per_device": 1, "sample_interval_s": 1.0}
    res["failover_runs"] = [failover(a.devices, a.lease, 4.0) for _ in range(a.reps)]
    res["failover"] = max(res["failover_runs"], key=lambda r: r["failover_max_s"] or 0.0)
    res["throughput"] = [throughput(n, a.devices, a.steady) for n in (1, 3)]
    # batches of more than one event: the 11 counters of eth1 per device every 5 s
    res["throughput"].append(throughput(3, a.devices, a.steady, path=COUNTERS, interval="5s"))
    res["embedded"] = embedded(a.devices, a.steady + 5.0)
    res["wall_s"] = time.monotonic() - t0
    res["load_average_end"] = os.getloadavg()
    f = res["failover"]
    print(f"failover (kill -9 of 1 of 3 members, lease {a.lease:g} s, heartbeat {a.lease / 3:g} s, "
          f"{f['victim_devices']} devices): max {f['failover_max_s']:.2f} s, median {f['failover_median_s']:.2f} s; "
          f"lost {f['missing_takeover']} samples (takeover) + {f['missing_other']} other, duplicates "
          f"{f['duplicates']}, double-streamed sessions {f['session_overlaps']}")
    per_run = ", ".join(f"{r['failover_max_s']:.2f}/{r['failover_median_s']:.2f}" for r in res["failover_runs"])
    resub = ", ".join(f"{r['resubscribed_max_s']:.2f}/{r['resubscribed_median_s']:.2f}" for r in res["failover_runs"])
    print(f"  re-subscribed at the device, per run, max/median s: {resub}")
    owned = ", ".join(f"{r['owned_again_s']:.2f}" for r in res["failover_runs"])
    print(f"  per run, max/median s: {per_run}; claims owned again after {owned} s (the worst run above)")
    print("whole run (incl. start-up):")
    print(f"{'mode':<28}{'events':>9}{'coll CPU s':>12}{'ev/coll CPU s':>15}{'work CPU s':>12}"
          f"{'ev/work CPU s':>15}{'nats CPU s':>12}")
    for t in res["throughput"]:
        label = f"cluster, {t['collectors']} coll." + (", 11 ctr/5s" if t["path"] != PATH else "")
        print(f"{label:<28}{t['published']:>9}"
              f"{t['collector_cpu_s']:>12.2f}{t['events_per_collector_cpu_s']:>15.0f}{t['worker_cpu_s']:>12.2f}"
              f"{t['events_per_worker_cpu_s']:>15.0f}{t['nats_cpu_s'] or 0:>12.2f}")
    e = res["embedded"]
    print(f"{'embedded (no bus)':<28}{e['written']:>9}{e['collector_cpu_s']:>12.2f}"
          f"{e['events_per_collector_cpu_s']:>15.0f}{'-':>12}{'-':>15}{'-':>12}")
    print("steady state (CPU from all devices owned to the stop; events the twin sent meanwhile):")
    print(f"{'mode':<28}{'events':>9}{'ev/coll CPU s':>15}{'ev/work CPU s':>15}{'ev/nats CPU s':>15}")
    for t in res["throughput"]:
        label = f"cluster, {t['collectors']} coll." + (", 11 ctr/5s" if t["path"] != PATH else "")
        print(f"{label:<28}{t['steady_events']:>9}{t['steady_events_per_collector_cpu_s']:>15.0f}"
              f"{t['steady_events_per_worker_cpu_s']:>15.0f}{t['steady_events_per_nats_cpu_s'] or 0:>15.0f}")
    print(f"{'embedded (no bus)':<28}{e['steady_events']:>9}{e['steady_events_per_collector_cpu_s']:>15.0f}"
          f"{'-':>15}{'-':>15}")
    print(f"took {res['wall_s']:.0f} s; wall-clock scaling cannot show on 2 shared cores: compare per CPU-second")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
