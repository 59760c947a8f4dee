"""Failover time of collector target ownership: kill -9 a member, time until its targets stream again.

For each lease setting, a fresh ``nats-server -js`` and 3 ``fabricscope cluster member``
processes share 500 targets. Each repetition kills one member with SIGKILL (rotating), times
until every target it held has been acquired by a survivor (from the members' timestamped
acquire lines), then restarts it and times until the ring's share is back where it belongs.
Ownership intervals are checked for overlap throughout (reported as ``overlaps``; must be 0).

    .venv/bin/python benchmarks/bench_cluster_failover.py            # leases 2 3 5 s, 5 reps
    .venv/bin/python benchmarks/bench_cluster_failover.py --leases 3 --reps 3

Writes ``benchmarks/results/cluster_failover.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fabricscope.cluster.ring import assign  # noqa: E402

_MAIN = ("import fabricscope.cli as c, fabricscope.cli.cluster as k\n"
         "if 'fabricscope.cli.cluster' not in c._COMMAND_MODULES: k.register(c.app)\n"
         "c.main()\n")


class Ledger:
    """Open and closed ownership intervals per (member, target)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[tuple[str, str], float] = {}
        self.closed: list[tuple[str, str, float, float]] = []

    def event(self, m: str, what: str, t: str, ts: float) -> None:
        with self.lock:
            if what == "acquire":
                self.open[(m, t)] = ts
            elif (m, t) in self.open:
                self.closed.append((m, t, self.open.pop((m, t)), ts))

    def kill(self, m: str, ts: float) -> None:
        with self.lock:
            for key in [k for k in self.open if k[0] == m]:
                self.closed.append((m, key[1], self.open.pop(key), ts))

    def owned(self) -> dict[str, set[str]]:
        with self.lock:
            out: dict[str, set[str]] = {}
            for m, t in self.open:
                out.setdefault(m, set()).add(t)
            return out

    def holders(self, t: str) -> list[tuple[str, float]]:
        with self.lock:
            return [(m, s) for (m, tt), s in self.open.items() if tt == t]

    def overlaps(self) -> int:
        with self.lock:
            now = time.time()
            spans = self.closed + [(m, t, s, now) for (m, t), s in self.open.items()]
        by_t: dict[str, list[tuple[float, float]]] = {}
        for _m, t, s, e in spans:
            by_t.setdefault(t, []).append((s, e))
        n = 0
        for iv in by_t.values():
            iv.sort()
            n += sum(1 for a, b in itertools.pairwise(iv) if b[0] < a[1])
        return n


def _member(url: str, name: str, tfile: Path, lease: float, ledger: Ledger) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", _MAIN, "cluster", "member", "--nats", url,
                          "--name", name, "--targets", str(tfile), "--lease", f"{lease}s"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            ts, n, what, t = line.split()
            ledger.event(n, what, t, dt.datetime.fromisoformat(ts).timestamp())

    threading.Thread(target=read, daemon=True).start()
    return p


def _wait(pred: Any, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.01)
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_setting(lease: float, reps: int, n_targets: int, nats: str) -> dict[str, Any]:
    targets = [f"leaf-{i:04d}" for i in range(n_targets)]
    names = ["c1", "c2", "c3"]
    share = {m: set(ts) for m, ts in assign(targets, names).items()}
    port = _free_port()
    store = tempfile.mkdtemp(prefix="fs-bench-nats-")
    tdir = tempfile.mkdtemp(prefix="fs-bench-targets-")
    tfile = Path(tdir) / "targets.txt"
    tfile.write_text("\n".join(targets) + "\n")
    srv = subprocess.Popen([nats, "-js", "-sd", store, "-a", "127.0.0.1", "-p", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"nats://127.0.0.1:{port}"
    ledger = Ledger()
    procs: dict[str, subprocess.Popen[str]] = {}
    failover: list[float] = []
    first: list[float] = []
    comeback: list[float] = []
    try:
        _wait(lambda: _port_open(port), 10)
        for n in names:
            procs[n] = _member(url, n, tfile, lease, ledger)
        if not _wait(lambda: ledger.owned() == share, 30):
            raise RuntimeError("cluster did not settle")
        for r in range(reps):
            victim = names[r % len(names)]
            lost = set(share[victim])
            procs[victim].send_signal(signal.SIGKILL)
            t_kill = time.time()
            procs[victim].wait(5)
            ledger.kill(victim, t_kill)
            if not _wait(lambda lost=lost: all(ledger.holders(t) for t in lost), 30):
                raise RuntimeError(f"failover did not finish (lease {lease}s)")
            starts = [s for t in lost for _m, s in ledger.holders(t)]
            failover.append(max(starts) - t_kill)
            first.append(min(starts) - t_kill)
            t_back = time.time()
            procs[victim] = _member(url, victim, tfile, lease, ledger)
            if not _wait(lambda: ledger.owned() == share, 30):
                raise RuntimeError("comeback did not restore the share")
            comeback.append(time.time() - t_back)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.poll() is None:
                p.kill()
        srv.terminate()
        srv.wait(10)
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(tdir, ignore_errors=True)
    return {
        "lease_s": lease, "heartbeat_s": round(lease / 3, 3), "margin_s": round(lease / 6, 3),
        "reps": reps, "failover_s": [round(x, 3) for x in failover],
        "failover_median_s": round(statistics.median(failover), 3),
        "failover_max_s": round(max(failover), 3),
        "first_takeover_min_s": round(min(first), 3),
        "comeback_s": [round(x, 3) for x in comeback],
        "bound_s": round(lease + 0.25 + 0.2, 3),  # lease + tick + CAS/callback allowance
        "overlaps": ledger.overlaps(),
    }


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.2):
            return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leases", type=float, nargs="+", default=[2.0, 3.0, 5.0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cluster_failover.json")
    args = ap.parse_args()
    nats = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not os.path.exists(nats):
        sys.exit("nats-server not found")
    t0 = time.monotonic()
    rows = [run_setting(lease, args.reps, args.targets, nats) for lease in args.leases]
    print(f"{'lease':>6} {'hb':>6} {'failover median':>16} {'max':>7} {'first':>7} "
          f"{'comeback med':>13} {'overlaps':>9}")
    for r in rows:
        print(f"{r['lease_s']:>5g}s {r['heartbeat_s']:>5.2f}s {r['failover_median_s']:>15.2f}s "
              f"{r['failover_max_s']:>6.2f}s {r['first_takeover_min_s']:>6.2f}s "
              f"{statistics.median(r['comeback_s']):>12.2f}s {r['overlaps']:>9d}")
    doc = {
        "command": "python benchmarks/bench_cluster_failover.py " + " ".join(sys.argv[1:]),
        "members": 3, "targets": args.targets, "nats_server": "v2.9.10 (local, loopback)",
        "cpu_count": os.cpu_count(), "wall_s": round(time.monotonic() - t0, 1), "settings": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
