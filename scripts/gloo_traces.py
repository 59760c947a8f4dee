#!/usr/bin/env python3
"""Make real Kineto traces of a small data-parallel job on torch.distributed (gloo, CPU).

Each rank trains a small MLP; per iteration: ``forward-compute`` and ``backward-compute``
(``record_function`` annotations), a gloo all-reduce of the gradients, ``optimizer``.
torch.profiler records iterations as ``ProfilerStep#N`` and writes one Chrome trace per rank.

Faults:
  --delay-rank R --delay-ms D       rank R's compute takes D ms longer (a slow GPU stand-in)
  --throttle-rank R --rate 20mbit   (root) every rank in its own network namespace on a
                                    bridge; rank R's veth gets a ``tc tbf`` rate limit (a slow NIC)

Needs torch (CPU) in a separate venv, never in the project's deps:
  python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0
  /tmp/torchvenv/bin/python scripts/gloo_traces.py --ranks 4 --delay-rank 2 \\
      --out tests/fixtures/gloo/delay-rank2
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def worker(rank: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    master = args.master_addr
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{args.port}", rank=rank,
                            world_size=args.ranks, timeout=__import__("datetime").timedelta(seconds=120))
    cols = max(1, args.ranks // 2) if args.ranks > 2 else args.ranks
    rows_n = args.ranks // cols
    row_pg = col_pg = None
    row: list[int] = []
    col: list[int] = []
    for i in range(rows_n):  # every rank must create every group, in the same order
        members = list(range(i * cols, (i + 1) * cols))
        pg = dist.new_group(members)
        if rank in members:
            row_pg, row = pg, members
    for j in range(cols):
        members = list(range(j, args.ranks, cols))
        pg = dist.new_group(members)
        if rank in members:
            col_pg, col = pg, members
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    dim = args.dim
    layers = [torch.nn.Linear(dim, dim) for _ in range(args.layers)]
    model = torch.nn.Sequential(*[m for lin in layers for m in (lin, torch.nn.ReLU())])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, dim)
    delay_s = args.delay_ms / 1000.0 if rank == args.delay_rank else 0.0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(prof: profile) -> None:
        path = out / f"rank{rank}.json"
        prof.export_chrome_trace(str(path))
        data = path.read_bytes()
        (out / f"rank{rank}.json.gz").write_bytes(gzip.compress(data, mtime=0))
        path.unlink()

    sched = schedule(wait=1, warmup=1, active=args.iterations, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=save,
                 record_shapes=False) as prof:
        for _ in range(args.iterations + 2):
            # A slow GPU runs the same kernels longer: the delayed rank sleeps inside its
            # compute annotations, which adds no events and no CPU load that would slow the
            # other ranks sharing this machine's cores.
            with record_function("forward-compute"):
                loss = model(x).square().mean()
                time.sleep(delay_s)
            with record_function("backward-compute"):
                opt.zero_grad()
                loss.backward()
                time.sleep(2 * delay_s)
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            # HSDP-style 2-D gradient sync: all-reduce inside the row group, then inside the
            # column group. Two groups per rank let end-host timings single out one rank's
            # network (a 1-D data-parallel job cannot: every rank shares its one group).
            # gloo events carry no group, so the call is wrapped in a "pg:<ranks>" annotation.
            for name, members, group in ((f"pg:{','.join(map(str, row))}", row, row_pg),
                                         (f"pg:{','.join(map(str, col))}", col, col_pg)):
                if len(members) > 1:
                    with record_function(name):
                        dist.all_reduce(flat, group=group)
            with record_function("optimizer"):
                opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def netns_setup(n: int, throttle: int, rate: str) -> list[str]:
    """A bridge in the root namespace and one namespace per rank (10.77.0.(r+1)/24)."""
    _sh("ip", "link", "add", "fsgloo-br", "type", "bridge")
    _sh("ip", "addr", "add", "10.77.0.254/24", "dev", "fsgloo-br")
    _sh("ip", "link", "set", "fsgloo-br", "up")
    names = []
    for r in range(n):
        ns = f"fsgloo{r}"
        names.append(ns)
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", f"fsg{r}h", "type", "veth", "peer", "name", f"fsg{r}n")
        _sh("ip", "link", "set", f"fsg{r}n", "netns", ns)
        _sh("ip", "link", "set", f"fsg{r}h", "master", "fsgloo-br")
        _sh("ip", "link", "set", f"fsg{r}h", "up")
        _sh("ip", "-n", ns, "addr", "add", f"10.77.0.{r + 1}/24", "dev", f"fsg{r}n")
        _sh("ip", "-n", ns, "link", "set", f"fsg{r}n", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        if r == throttle:
            # Egress of the rank's NIC and of the bridge port towards it: both directions.
            for dev, pre in ((f"fsg{r}n", ["ip", "netns", "exec", ns]), (f"fsg{r}h", [])):
                _sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", "32kbit", "latency", "400ms")
    return names


def netns_cleanup(n: int) -> None:
    for r in range(n):
        subprocess.run(["ip", "netns", "del", f"fsgloo{r}"], check=False)
        subprocess.run(["ip", "link", "del", f"fsg{r}h"], check=False, stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "link", "del", "fsgloo-br"], check=False, stderr=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--delay-rank", type=int, default=None)
    ap.add_argument("--delay-ms", type=float, default=40.0,
                    help="extra forward time of the delayed rank (backward: twice that)")
    ap.add_argument("--throttle-rank", type=int, default=None)
    ap.add_argument("--rate", default="40mbit")
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:  # a child process
        worker(args.rank, args)
        return 0
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    base = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    namespaces: list[str] = []
    if args.throttle_rank is not None:
        netns_cleanup(args.ranks)
        namespaces = netns_setup(args.ranks, args.throttle_rank, args.rate)
        base += ["--master-addr", "10.77.0.1"]
    procs = []
    try:
        for r in range(args.ranks):
            cmd = [*base, "--rank", str(r)]
            env = dict(os.environ)
            if namespaces:
                cmd = ["ip", "netns", "exec", namespaces[r], *cmd]
                env["GLOO_SOCKET_IFNAME"] = f"fsg{r}n"  # not loopback: the throttled veth
            procs.append(subprocess.Popen(cmd, env=env))
            time.sleep(0.05)
        rc = max(p.wait(timeout=args.timeout) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if namespaces:
            netns_cleanup(args.ranks)
    meta = {"command": " ".join(["scripts/gloo_traces.py", *sys.argv[1:]]),
            "ranks": args.ranks, "delay_rank": args.delay_rank, "delay_ms": args.delay_ms,
            "throttle_rank": args.throttle_rank, "rate": args.rate,
            "expected_culprit_rank": args.delay_rank if args.delay_rank is not None
            else args.throttle_rank,
            "expected_kind": "slow-gpu" if args.delay_rank is not None
            else ("slow-nic" if args.throttle_rank is not None else None)}
    (out / "truth.json").write_text(json.dumps(meta, indent=1))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
