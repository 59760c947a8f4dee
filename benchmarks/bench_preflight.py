"""Preflight speed (issue 16, target "Preflight < 5 s on a host"): median of N runs.

    python benchmarks/bench_preflight.py             # 20 runs each
    python benchmarks/bench_preflight.py --runs 5

Timed: ``run_preflight`` (probe + checks, in-process) on this machine (``--root /``), on the
fixture trees ``tests/data/preflight/{tuned,untuned}`` and on a generated large host (224
CPUs, 8 ConnectX-style NICs with 63 queue IRQs each: a 224-column /proc/interrupts of ~530
rows, like an 8-GPU H100 node); plus the whole command in a fresh Python process (imports
included) on this machine. Prints a table, writes benchmarks/results/preflight.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from fabricscope.preflight import run_preflight  # noqa: E402
from fabricscope.preflight.profiles import PROFILES  # noqa: E402


def _w(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def large_host(root: Path, *, ncpu: int = 224, nics: int = 8, queues: int = 63) -> Path:
    """Write a big 2-node host tree: ``ncpu`` CPUs, ``nics`` NICs x ``queues`` queue IRQs."""
    half = ncpu // 2
    _w(root, "proc/sys/kernel/hostname", "big-h100-01")
    for c in PROFILES["training"].checks:
        if c.kind == "sysctl":
            _w(root, c.path, c.recommended.replace(" ", "\t"))
    _w(root, "sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]")
    for c in range(ncpu):
        _w(root, f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor", "performance")
    _w(root, "sys/devices/system/node/node0/cpulist", f"0-{half - 1}")
    _w(root, "sys/devices/system/node/node1/cpulist", f"{half}-{ncpu - 1}")
    _w(root, "proc/meminfo", "HugePages_Total:       0")
    _w(root, "proc/cmdline", "ro iommu=pt")
    _w(root, "proc/1/comm", "systemd")
    rows = [" " * 11 + "".join(f"CPU{c:<8}" for c in range(ncpu))]
    irq = 100
    for n in range(nics):
        name, pci, node = f"ens{n}np0", f"0000:{0x1a + n * 0x10:02x}:00.0", n * 2 // nics
        dev = f"sys/class/net/{name}/device"
        _w(root, f"{dev}/uevent", f"DRIVER=mlx5_core\nPCI_SLOT_NAME={pci}")
        _w(root, f"{dev}/numa_node", str(node))
        _w(root, f"{dev}/infiniband/mlx5_{n}/fw_ver", "28.39.1002")
        for f, v in (("mtu", "9000"), ("speed", "400000"), ("operstate", "up")):
            _w(root, f"sys/class/net/{name}/{f}", v)
        for q in range(queues):
            rows.append(f"{irq:>4}:" + "".join(f"{q * c % 9973:>11}" for c in range(ncpu))
                        + f"  IR-PCI-MSIX-{pci} {q + 1}-edge      mlx5_comp{q}@pci:{pci}")
            _w(root, f"proc/irq/{irq}/smp_affinity_list", str(node * half + q % half))
            irq += 1
    _w(root, "proc/interrupts", "\n".join(rows))
    return root


def _median(fn: object, runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        big = large_host(Path(tmp) / "big")
        targets = [("this machine (--root /)", "/"),
                   ("fixture tuned", str(REPO / "tests/data/preflight/tuned")),
                   ("fixture untuned", str(REPO / "tests/data/preflight/untuned")),
                   ("generated 224 CPUs, 8x63 queue IRQs", str(big))]
        for label, root in targets:
            for prof in ("training", "inference"):
                _, results, _ = run_preflight(PROFILES[prof], root=root)
                med, worst = _median(lambda r=root, p=prof: run_preflight(PROFILES[p], root=r),
                                     args.runs)
                rows.append({"target": label, "profile": prof, "runs": args.runs,
                             "median_s": med, "max_s": worst, "results": len(results)})
    cold = []
    code = ("import typer; from fabricscope.cli.preflight import register; app=typer.Typer(); "
            "register(app); app.command('x')(lambda: None); app(['preflight','--json'])")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for _ in range(max(3, args.runs // 5)):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=False)
        cold.append(time.perf_counter() - t0)
    rows.append({"target": "this machine, fresh process (imports + run)", "profile": "training",
                 "runs": len(cold), "median_s": statistics.median(cold), "max_s": max(cold),
                 "results": None})
    print(f"{'target':<46} {'profile':<10} {'runs':>4} {'median s':>9} {'max s':>8} {'checks':>6}")
    for r in rows:
        print(f"{r['target']:<46} {r['profile']:<10} {r['runs']:>4} {r['median_s']:>9.4f} "
              f"{r['max_s']:>8.4f} {r['results'] if r['results'] is not None else '-':>6}")
    out = REPO / "benchmarks/results/preflight.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"target_s": 5.0, "machine": platform.platform(),
                               "cpus": os.cpu_count(), "python": platform.python_version(),
                               "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
