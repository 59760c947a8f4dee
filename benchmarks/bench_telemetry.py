"""Telemetry throughput: twin gNMI target -> collector pipeline -> DuckDB, vs pygnmi on the same target.

Measures, on this machine, with the target in its own process (``fabricscope gnmi serve-twin``):

1. end-to-end updates/s into DuckDB (steady state, after every subscription's first sync),
   also per CPU-second of the collector process (the cores are shared with other work, so
   wall-clock rates are noisy; CPU-normalized rates are the capacity figure);
2. pygnmi 0.8.15's subscribe loop (its own virtualenv, one StreamSubscriber per target,
   updates parsed to dicts, nothing stored) against the same target, and the ratio;
3. collector memory per 1,000 subscribed paths (RSS slope between two subscription sizes);
4. throughput vs number of targets, 10 -> 500 (offered load kept ~250k updates/s).

Usage: python benchmarks/bench_telemetry.py [--quick]
       python benchmarks/bench_telemetry.py --ab /tmp/old/src --repeat 4   # old checkout vs this tree
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fabricscope.fabric.catalog import build_fabric, parse_params
from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.clock import SimClock

ROOT = Path(__file__).resolve().parent
PYGNMI_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fabricscope" / "pygnmi-0.8.15"

PYGNMI_LOOP = r"""
import json, os, sys, threading, time
from pygnmi.client import gNMIclient
port, names, interval, warm, secs = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
count = [0]
lock = threading.Lock()
stop = threading.Event()
def worker(gc, name):
    sub = {"subscription": [{"path": "/", "mode": "sample", "sample_interval": interval}], "mode": "stream"}
    s = gc.subscribe_stream(subscribe=sub, target=name)
    while not stop.is_set():
        try:
            m = s.get_update(timeout=1)
        except Exception:
            continue
        if "update" in m:
            with lock:
                count[0] += len(m["update"]["update"])
    s.close()
with gNMIclient(target=("127.0.0.1", port), insecure=True, grpc_options=[("grpc.max_receive_message_length", 64 << 20)]) as gc:
    ths = [threading.Thread(target=worker, args=(gc, n), daemon=True) for n in names]
    for t in ths: t.start()
    time.sleep(warm)
    c0, t0, p0 = count[0], time.perf_counter(), time.process_time()
    time.sleep(secs)
    c1, t1, p1 = count[0], time.perf_counter(), time.process_time()
    stop.set()
print(json.dumps({"updates": c1 - c0, "wall_s": t1 - t0, "cpu_s": p1 - p0}))
"""


def _cpu_of(pid: int) -> float:
    """utime + stime of a process, seconds (Linux /proc)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class TwinServer:
    """``fabricscope gnmi serve-twin`` in a subprocess."""

    def __init__(self, topo: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from fabricscope.cli import main; main()", "gnmi", "serve-twin",
             "--topo", topo, "--address", "127.0.0.1:0", "--utilization", "0.3"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"serve-twin did not start: {line}{self.proc.stderr.read() if self.proc.stderr else ''}")
        self.port = int(line.split(" on 127.0.0.1:")[1].split()[0])
        self.targets = int(line.split("serving ")[1].split()[0])

    def cpu(self) -> float:
        return _cpu_of(self.proc.pid)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _collect(port: int, names: list[str], interval: str, warm: float, secs: float, sink: str,
             paths: tuple[str, ...] = ("/",), server: TwinServer | None = None) -> dict[str, float]:
    from fabricscope.telemetry.collector import Collector
    from fabricscope.telemetry.config import parse_config
    from fabricscope.telemetry.detectors import default_detectors
    from fabricscope.telemetry.sinks import DuckDBSink, MemorySink

    class CountSink(MemorySink):
        def write(self, events, findings):  # type: ignore[no-untyped-def]
            self.n = getattr(self, "n", 0) + len(events)

    cfg = parse_config({"targets": {"twin": {"address": f"127.0.0.1:{port}", "names": names}},
                        "subscriptions": {"all": {"paths": list(paths), "sample-interval": interval}},
                        "buffer": {"batch": 50_000, "max-events": 2_000_000}}, source="bench")
    tmp = tempfile.mkdtemp()
    sinks = [DuckDBSink(str(Path(tmp) / "bench.duckdb"))] if sink == "duckdb" else [CountSink()]
    col = Collector(cfg, sinks=sinks, detectors=default_detectors())

    async def run() -> dict[str, float]:
        task = asyncio.create_task(col.run(duration_s=warm + secs + 20.0))
        await asyncio.sleep(warm)
        # steady state: every stream has delivered its initial sync (leaf caches are warm)
        t_wait = time.perf_counter()
        while time.perf_counter() - t_wait < 15 and (
                len(col.stats.targets) < len(names) or any(st.syncs == 0 for st in col.stats.targets.values())):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        w0, t0, c0 = col.stats.written, time.perf_counter(), time.process_time()
        s0 = server.cpu() if server else 0.0
        await asyncio.sleep(secs)
        w1, t1, c1 = col.stats.written, time.perf_counter(), time.process_time()
        s1 = server.cpu() if server else 0.0
        col.stop()
        await task
        return {"updates": w1 - w0, "wall_s": t1 - t0, "cpu_s": c1 - c0, "target_cpu_s": s1 - s0,
                "rate": (w1 - w0) / (t1 - t0), "rate_per_cpu_s": (w1 - w0) / max(c1 - c0, 1e-9),
                "rss_kb": _rss_kb(), "buffer_high_water": col.buffer.high_water if col.buffer else 0}

    out = asyncio.run(run())
    col.close()
    return out


def _collect_sharded(port: int, names: list[str], interval: str, warm: float, secs: float, workers: int,
                     server: TwinServer) -> dict[str, float]:
    from fabricscope.telemetry.config import parse_config
    from fabricscope.telemetry.shards import ShardedCollector
    from fabricscope.telemetry.sinks import DuckDBSink

    cfg = parse_config({"targets": {"twin": {"address": f"127.0.0.1:{port}", "names": names}},
                        "subscriptions": {"all": {"paths": ["/"], "sample-interval": interval}},
                        "detectors": {"micro-burst": {}, "error-increase": {}, "link-flap": {}, "pause-storm": {}},
                        "buffer": {"batch": 50_000, "max-events": 2_000_000}, "workers": workers}, source="bench")
    sink = DuckDBSink(str(Path(tempfile.mkdtemp()) / "bench.duckdb"))
    col = ShardedCollector(cfg, workers=workers, sinks=[sink])

    def cpu() -> float:
        return time.process_time() + sum(_cpu_of(p) for p in col.pids if Path(f"/proc/{p}").exists())

    async def run() -> dict[str, float]:
        task = asyncio.create_task(col.run(duration_s=warm + secs + 20.0))
        await asyncio.sleep(warm + 2.0)  # spawn + import + first sync of every stream
        w0, t0, c0, s0 = col.stats.written, time.perf_counter(), cpu(), server.cpu()
        await asyncio.sleep(secs)
        w1, t1, c1, s1 = col.stats.written, time.perf_counter(), cpu(), server.cpu()
        col.stop()
        await task
        return {"updates": w1 - w0, "wall_s": t1 - t0, "cpu_s": c1 - c0, "target_cpu_s": s1 - s0,
                "rate": (w1 - w0) / (t1 - t0), "rate_per_cpu_s": (w1 - w0) / max(c1 - c0, 1e-9),
                "workers": workers}

    out = asyncio.run(run())
    col.close()
    return out


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _pygnmi_python() -> Path | None:
    py = PYGNMI_VENV / "bin" / "python"
    if (PYGNMI_VENV / ".installed").exists() and py.exists():
        return py
    try:
        import venv

        venv.EnvBuilder(with_pip=True, clear=True).create(PYGNMI_VENV)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "pygnmi==0.8.15"], capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    (PYGNMI_VENV / ".installed").write_text("pygnmi==0.8.15")
    return py


def _fabric(topo: str) -> Fabric:
    kind, _, rest = topo.partition(":")
    return build_fabric(kind, parse_params(rest.split(","), source="bench"), source="bench")


def _switch_names(topo: str) -> list[str]:
    return [d.id for d in _fabric(topo).switches]


def _child_mem(port: int, names: list[str]) -> dict[str, float]:
    """Collector RSS in a fresh process subscribed to ``names`` (counting sink)."""
    code = (f"import json,sys; sys.path.insert(0, {str(ROOT)!r}); import bench_telemetry as b; "
            f"print(json.dumps(b._collect({port}, {names!r}, '1s', 4.0, 2.0, 'count')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _child_collect(src: str | None, port: int, names: list[str], warm: float, secs: float) -> dict[str, float]:
    """One single-process collector run (counting sink) in a fresh process whose ``fabricscope``
    comes from ``src`` (another checkout's ``src/``; None: this one)."""
    code = (f"import json,sys; sys.path.insert(0, {str(ROOT)!r}); import bench_telemetry as b, fabricscope; "
            f"r = b._collect({port}, {names!r}, '100ms', {warm}, {secs}, 'count'); r['src'] = fabricscope.__file__; "
            f"print(json.dumps(r))")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if src is not None:
        env["PYTHONPATH"] = src
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def ab(old_src: str, rounds: int) -> None:
    """Old checkout vs this tree, alternating, same twin target: the no-regression check.

    The sink counts (no DuckDB), so the figure is the collector's own path: gRPC receive,
    decode, buffer, detectors, writer, whatever each version does per update.
    """
    topo = "leaf-spine:leaves=8,hosts_per_leaf=16,spines=4"
    names = _switch_names(topo)
    server = TwinServer(topo)
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    try:
        for rnd in range(rounds):
            for side, src in (("old", old_src), ("new", None)) if rnd % 2 == 0 else (("new", None), ("old", old_src)):
                r = _child_collect(src, server.port, names, 3.0, 5.0)
                runs[side].append(r)
                print(f"  round {rnd + 1} {side}: {r['rate']:,.0f} updates/s wall, {r['rate_per_cpu_s']:,.0f} per "
                      f"CPU-second ({r['src']}); load {os.getloadavg()[0]:.1f}")
    finally:
        server.close()
    med = {k: {m: float(statistics.median(r[m] for r in v)) for m in ("rate", "rate_per_cpu_s")}
           for k, v in runs.items()}
    ratio = {m: med["new"][m] / med["old"][m] for m in ("rate", "rate_per_cpu_s")}
    print(f"median old {med['old']['rate_per_cpu_s']:,.0f} / new {med['new']['rate_per_cpu_s']:,.0f} updates per "
          f"CPU-second: new/old = {ratio['rate_per_cpu_s']:.3f} (wall {ratio['rate']:.3f})")
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "telemetry_ab.json").write_text(json.dumps(
        {"benchmark": "collector old vs new (counting sink)", "old_src": old_src, "targets": len(names),
         "sample_interval": "100ms", "runs": runs, "median": med, "ratio_new_over_old": ratio,
         "machine": platform.platform(), "cpus": os.cpu_count()}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter windows, fewer scaling points")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds of ours / sharded / pygnmi")
    ap.add_argument("--ab", metavar="OLD_SRC", help="only compare this tree with another checkout's src/ "
                    "(e.g. a git worktree of an older commit), alternating rounds")
    a = ap.parse_args()
    if a.ab:
        ab(a.ab, a.repeat)
        return
    warm, secs = (3.0, 4.0) if a.quick else (4.0, 8.0)
    results: dict[str, object] = {"benchmark": "telemetry end-to-end", "machine": platform.platform(),
                                  "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}

    # 1 + 2: end-to-end and pygnmi against the same target
    topo = "leaf-spine:leaves=16,hosts_per_leaf=16,spines=8"
    names = _switch_names(topo)
    server = TwinServer(topo)
    try:
        print(f"end-to-end (twin target -> collector -> DuckDB, {len(names)} targets, '/' every 100 ms), "
              f"{a.repeat} interleaved rounds:")
        py = _pygnmi_python()
        runs: dict[str, list[dict[str, float]]] = {"single": [], "sharded2": [], "pygnmi": []}
        for rnd in range(a.repeat):
            e2e = _collect(server.port, names, "100ms", warm, secs, "duckdb", server=server)
            runs["single"].append(e2e)
            sh = _collect_sharded(server.port, names, "100ms", warm, secs, 2, server)
            runs["sharded2"].append(sh)
            line = (f"  round {rnd + 1}: single process {e2e['rate']:,.0f}/s wall ({e2e['rate_per_cpu_s']:,.0f} per "
                    f"CPU-s, got {e2e['cpu_s'] / e2e['wall_s']:.0%} CPU); 2 workers {sh['rate']:,.0f}/s "
                    f"({sh['rate_per_cpu_s']:,.0f} per CPU-s)")
            if py is not None:
                s0 = server.cpu()
                r = subprocess.run([str(py), "-c", PYGNMI_LOOP, str(server.port), ",".join(names), "100000000",
                                    str(warm), str(secs)], capture_output=True, text=True, timeout=300,
                                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
                if r.returncode != 0:
                    raise RuntimeError(r.stderr[-2000:])
                pg = json.loads(r.stdout.strip().splitlines()[-1])
                pg["rate"] = pg["updates"] / pg["wall_s"]
                pg["rate_per_cpu_s"] = pg["updates"] / max(pg["cpu_s"], 1e-9)
                pg["target_cpu_s"] = server.cpu() - s0
                runs["pygnmi"].append(pg)
                line += f"; pygnmi {pg['rate']:,.0f}/s ({pg['rate_per_cpu_s']:,.0f} per CPU-s)"
            print(line + f"; load {os.getloadavg()[0]:.1f}")

        def med(rows: list[dict[str, float]], k: str) -> float:
            return float(statistics.median(r[k] for r in rows)) if rows else float("nan")

        summary = {k: {"rate": med(v, "rate"), "rate_per_cpu_s": med(v, "rate_per_cpu_s")} for k, v in runs.items()}
        if runs["pygnmi"]:
            for k in ("single", "sharded2"):
                summary[k]["ratio_wall_vs_pygnmi"] = summary[k]["rate"] / summary["pygnmi"]["rate"]
                summary[k]["ratio_per_cpu_vs_pygnmi"] = summary[k]["rate_per_cpu_s"] / summary["pygnmi"]["rate_per_cpu_s"]
        for k, v in summary.items():
            extra = (f", {v['ratio_wall_vs_pygnmi']:.1f}x pygnmi wall, {v['ratio_per_cpu_vs_pygnmi']:.1f}x per CPU"
                     if "ratio_wall_vs_pygnmi" in v else "")
            print(f"  median {k:<9}: {v['rate']:,.0f} updates/s wall, {v['rate_per_cpu_s']:,.0f} per CPU-second{extra}")
        results["end_to_end"] = {"targets": len(names), "sample_interval": "100ms", "sink": "duckdb",
                                 "runs": runs, "median": summary}

        # 3: memory per 1,000 subscribed paths
        small, big = names[:4], names
        m_small = _child_mem(server.port, small)
        m_big = _child_mem(server.port, big)
    finally:
        server.close()
    # imported here, not at the top: --ab imports this file into older trees without fabricscope.twin
    from fabricscope.twin.state import Twin

    tw = Twin(_fabric(topo), clock=SimClock())
    n_small = sum(len(tw.leaves(n)) for n in small)
    n_big = sum(len(tw.leaves(n)) for n in big)
    kb_per_1000 = (m_big["rss_kb"] - m_small["rss_kb"]) / ((n_big - n_small) / 1000)
    print(f"memory: {n_small} paths -> {m_small['rss_kb'] / 1024:.1f} MiB RSS, {n_big} paths -> "
          f"{m_big['rss_kb'] / 1024:.1f} MiB: {kb_per_1000:.0f} KiB per 1,000 subscribed paths")
    results["memory"] = {"paths_small": n_small, "rss_kb_small": m_small["rss_kb"], "paths_big": n_big,
                         "rss_kb_big": m_big["rss_kb"], "kib_per_1000_paths": kb_per_1000}

    # 4: throughput vs number of targets
    scale_topo = "leaf-spine:leaves=500,hosts_per_leaf=1,spines=4"
    leaves = [n for n in _switch_names(scale_topo) if n.startswith("leaf")]
    points = [10, 100, 500] if a.quick else [10, 50, 100, 250, 500]
    server = TwinServer(scale_topo)
    rows = []
    try:
        per_target = len(Twin(_fabric(scale_topo), clock=SimClock()).leaves(leaves[0]))
        for n in points:
            interval_s = max(0.002, n * per_target / 250_000)
            r = _collect(server.port, leaves[:n], f"{interval_s * 1000:.0f}ms", warm, secs / 2, "duckdb", server=server)
            rows.append({"targets": n, "paths": n * per_target, "interval_ms": round(interval_s * 1000),
                         **{k: r[k] for k in ("rate", "rate_per_cpu_s", "cpu_s", "wall_s", "target_cpu_s")}})
            print(f"  {n:>4} targets x {per_target} paths every {interval_s * 1000:.0f} ms: {r['rate']:,.0f} updates/s "
                  f"wall, {r['rate_per_cpu_s']:,.0f} per collector CPU-second")
    finally:
        server.close()
    results["scaling"] = rows
    results["load_avg_end"] = os.getloadavg()
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "telemetry.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
