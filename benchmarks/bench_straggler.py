#!/usr/bin/env python3
"""Straggler localization: accuracy over twin scenarios, and speed vs ranks.

Accuracy: N scenarios (default 504) mixing fault types (none, slow GPU, slow NIC, degraded
access link, congested access link, sick leaf switch, stage imbalance, sequence imbalance),
parallelism shapes
(DP x TP x PP), noise levels (compute / communication CV 1-5 %), fault severities and
windows (from the start, or starting mid-trace). Communication times use the alpha-beta model
(AlphaBetaComm) for speed; a subset is re-run with the flow engine (EngineComm) and reported
apart. NIC / link faults are drawn on jobs with PP >= 2: a rank's NIC must sit in two network
groups of different membership to be told apart from end-host timings (docs/straggler.md).

Each device-fault scenario is also generated without its fault (same seed): the fault's
true cost is measured on the twin. A fault that costs under 1 % of the iteration has no
symptom; a finding must explain a material share of the iteration time, so top-1 counts the
symptomatic scenarios, and the others are reported apart (found / silent / wrong).

Deep pipelines: fault-free Megatron 1F1B jobs of 8 and 16 stages (fused send/recv calls,
eager sends, wait-inclusive recv), analyzed from the ByteDance Parquet schema (no inventory,
like the OSDI'25 traces) and from the twin columns with the inventory: the share of jobs
with any finding (target <= 1 %).

Speed: a 20-iteration DP x TP8 x PP16 job with a slow GPU, 512 ... 8,192 ranks: analyze()
wall time on the generated operator table (reading files is not included).

Usage:
  python benchmarks/bench_straggler.py                 # full: 504 scenarios, 400 deep, speed to 8,192
  python benchmarks/bench_straggler.py --quick         # 70 scenarios, 200 deep, speed to 2,048
  python benchmarks/bench_straggler.py --only speed --sizes 8192   # speed part only
      (writes benchmarks/results/straggler-speed.json unless --out says otherwise)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from types import ModuleType

import numpy as np

import fabricscope.straggler.analysis as straggler_analysis_mod
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.faults import Fault
from fabricscope.straggler import replay as current_replay
from fabricscope.straggler.analysis import analyze
from fabricscope.straggler.devices import rank_devices
from fabricscope.straggler.readers.bytedance import parse_bytedance
from fabricscope.straggler.table import OpTable, from_columns
from fabricscope.twin.tracegen import (
    TRACE_T0_NS,
    TwinJob,
    TwinTrace,
    bytedance_parquet,
    generate_trace,
    nominal_iteration_ns,
)

KINDS = ("none", "slow-gpu", "slow-nic", "link-degraded", "congestion", "switch-fault",
         "stage-imbalance", "sequence-imbalance")
SHAPES_PP = ((4, 2, 2), (8, 1, 2), (2, 2, 4), (4, 1, 4), (4, 4, 2), (2, 1, 8))
SHAPES_FLAT = ((8, 2, 1), (16, 1, 1), (8, 4, 1))
NETWORK_KINDS = ("slow-nic", "link-degraded", "congestion", "switch-fault")
OUT = Path(__file__).resolve().parent / "results" / "straggler.json"
SPEED_OUT = OUT.with_name("straggler-speed.json")

_fabrics: dict[tuple[int, int], Fabric] = {}


def fabric_for(world: int, tp: int) -> Fabric:
    gpus = 8 if tp > 4 else 4
    servers = max(2, math.ceil(world / gpus))
    key = (servers, gpus)
    if key not in _fabrics:
        _fabrics[key] = rail_optimized_fabric(servers, gpus_per_server=gpus,
                                              radix=16 if servers <= 32 else 64)
    return _fabrics[key]


def to_table(tr: TwinTrace) -> OpTable:
    return from_columns(job=tr.job, rank=tr.rank, iteration=tr.iteration, op=tr.op,
                        group=tr.group, seq=tr.seq, start=tr.start, end=tr.end,
                        nbytes=tr.nbytes, stage=tr.stage, mb=tr.mb, op_names=tr.op_names,
                        groups=tr.groups)


# Severity tiers: "normal" faults are well above the noise (the target); "hard" ones sit at or
# below the analysis thresholds (10 % compute, 25 % transfer, 15 % stage) to show where it fades.
SEVERITY = {
    "normal": {"gpu": (1.2, 2.0), "nic": (0.15, 0.5), "load": (0.5, 0.85), "stage": (1.25, 1.8),
               "cv": (0.2, 0.4)},
    "hard": {"gpu": (1.05, 1.2), "nic": (0.5, 0.85), "load": (0.15, 0.5), "stage": (1.1, 1.25),
             "cv": (0.08, 0.2)},
}


def scenario(i: int, seed: int, severity: str = "normal") -> dict[str, object]:
    rng = np.random.default_rng([seed, i])
    sev = SEVERITY[severity]
    kind = KINDS[i % len(KINDS)]
    if kind in NETWORK_KINDS:
        # (2, 1, 8) on 4-GPU servers keeps DP pairs and half the pipeline hops inside a
        # server: many NICs then carry one network group or none, and no end-host method
        # can single them out (see docs/straggler.md, "identifiability").
        shapes = tuple(s for s in SHAPES_PP if s != (2, 1, 8))
    elif kind == "stage-imbalance":
        shapes = SHAPES_PP
    else:
        shapes = SHAPES_PP + SHAPES_FLAT
    dp, tp, pp = shapes[int(rng.integers(len(shapes)))]
    job = TwinJob(dp=dp, tp=tp, pp=pp, microbatches=int(rng.choice([2, 4, 8])),
                  iterations=int(rng.integers(12, 21)),
                  compute_cv=float(rng.choice([0.01, 0.03, 0.05])),
                  comm_cv=float(rng.choice([0.01, 0.03, 0.05])))
    fab = fabric_for(job.world_size, tp)
    placement = [(h.id, g) for h in fab.hosts for g in range(h.gpus)][: job.world_size]
    transient = bool(rng.random() < 0.5)
    first_it = int(rng.integers(3, job.iterations - 5)) if transient else 0
    start = TRACE_T0_NS + first_it * nominal_iteration_ns(job) if transient else 0
    r = int(rng.integers(job.world_size))
    host, gpu = placement[r]
    nic = fab.nic_of_gpu(host, gpu).id
    port = fab.ports_of[nic][0]
    peer = fab.peer_port[port]
    faults: list[Fault] = []
    if kind == "slow-gpu":
        faults = [Fault("slow-gpu", f"{host}/gpu{gpu}", start,
                        params={"factor": float(rng.uniform(*sev["gpu"]))})]
    elif kind == "slow-nic":
        faults = [Fault("slow-nic", nic, start, params={"factor": float(rng.uniform(*sev["nic"]))})]
    elif kind == "link-degraded":
        faults = [Fault("link-degraded", fab.link_of_port[port].id, start,
                        params={"factor": float(rng.uniform(*sev["nic"]))})]
    elif kind == "congestion":
        faults = [Fault("congestion", f"{peer}->{port}", start,
                        params={"load": float(rng.uniform(*sev["load"]))})]
    elif kind == "switch-fault":
        faults = [Fault("switch-fault", fab.leaves_of_nic[nic][0], start,
                        params={"factor": float(rng.uniform(*sev["nic"]))})]
    elif kind == "stage-imbalance":
        faults = [Fault("stage-imbalance", "job",
                        params={"factor": float(rng.uniform(*sev["stage"])),
                                "stage": int(rng.integers(pp))})]
    elif kind == "sequence-imbalance":
        faults = [Fault("sequence-imbalance", "job", params={"cv": float(rng.uniform(*sev["cv"]))})]
    return {"kind": kind, "job": job, "fabric": fab, "faults": faults, "first_it": first_it,
            "transient": transient, "shape": f"dp{dp}-tp{tp}-pp{pp}", "seed": seed * 100003 + i}


def judge(sc: dict[str, object], comm: str) -> dict[str, object]:
    job = sc["job"]
    fab = sc["fabric"]
    assert isinstance(job, TwinJob) and isinstance(fab, Fabric)
    t0 = time.perf_counter()
    tr = generate_trace(fab, job, faults=sc["faults"], comm=comm, seed=int(sc["seed"]))  # type: ignore[arg-type]
    t1 = time.perf_counter()
    rep = analyze(to_table(tr), devices=rank_devices(fab, tr.placement))
    t2 = time.perf_counter()
    kind = sc["kind"]
    dev = rep.device_findings()
    true_x = 1.0
    if kind in ("slow-gpu", *NETWORK_KINDS):
        # The fault's true cost: the same job and seed without it.
        tr0 = generate_trace(fab, job, faults=[], comm=comm, seed=int(sc["seed"]))
        first = int(sc["first_it"])
        d1, d0 = _iter_durations(tr)[first:], _iter_durations(tr0)[first:]
        true_x = float(d1.mean() / d0.mean()) if d0.size else 1.0
    out: dict[str, object] = {"kind": kind, "shape": sc["shape"], "transient": sc["transient"],
                              "gen_s": t1 - t0, "analyze_s": t2 - t1, "true_slowdown": true_x,
                              "symptom": true_x >= 1.0 + SYMPTOM,
                              "found": [f"{f.kind}:{f.subject}" for f in rep.findings]}
    expected = tr.truth["expected"]
    assert isinstance(expected, list)
    if kind == "none":
        out["false_finding"] = bool(rep.findings)
    elif kind in ("stage-imbalance", "sequence-imbalance"):
        out["imbalance_as_device"] = bool(dev)
        out["correct"] = any(f.kind == "imbalance" and f.subject == expected[0]["subject"]
                             for f in rep.findings)
    else:
        accept = set(expected[0].get("accept", [expected[0]["subject"]]))
        top = dev[0] if dev else None
        out["correct"] = top is not None and top.subject in accept
        out["extra_device_findings"] = max(0, len(dev) - 1)
        if top is not None and out["correct"] and sc["transient"]:
            out["window_err"] = abs(int(top.details["first_iteration"]) - int(sc["first_it"]))  # type: ignore[call-overload]
    return out


SYMPTOM = 0.01  # a fault costing under 1 % of the iteration has no symptom to explain


def _iter_durations(tr: TwinTrace) -> np.ndarray:
    its = np.unique(tr.iteration)
    s = np.full(its.size, np.iinfo(np.int64).max)
    e = np.full(its.size, np.iinfo(np.int64).min)
    pos = np.searchsorted(its, tr.iteration)
    np.minimum.at(s, pos, tr.start)
    np.maximum.at(e, pos, tr.end)
    return (e - s).astype(np.float64)


def deep_job(i: int, seed: int) -> tuple[TwinJob, int]:
    """A fault-free 1F1B job of 8 or 16 stages: shapes, micro-batches, noise, host gaps vary."""
    rng = np.random.default_rng([seed, 77, i])
    pp = int(rng.choice([8, 16]))
    dp = int(rng.choice([1, 2, 4])) if pp == 8 else int(rng.choice([1, 2]))
    tp = int(rng.choice([1, 2])) if dp * pp <= 16 else 1
    m = int(rng.choice([pp // 2, pp, pp + 3, 2 * pp]))
    job = TwinJob(dp=dp, tp=tp, pp=pp, microbatches=m, iterations=int(rng.integers(6, 11)),
                  schedule="1f1b", fwd_ns=int(rng.choice([2e6, 20e6])),
                  bwd_ns=int(rng.choice([4e6, 40e6])),
                  activation_bytes=float(rng.choice([8 << 20, 32 << 20, 128 << 20])),
                  compute_cv=float(rng.choice([0.01, 0.03, 0.05])),
                  comm_cv=float(rng.choice([0.01, 0.05, 0.2])),
                  launch_gap_ns=float(rng.choice([0.0, 1e5, 1e6])))
    return job, tp


def deep_fault_free(n: int, seed: int) -> dict[str, object]:
    """Fault-free deep 1F1B pipelines: findings from the ByteDance schema and the twin columns."""
    false_bd: list[str] = []
    false_tw: list[str] = []
    shapes: Counter[str] = Counter()
    t0 = time.perf_counter()
    for i in range(n):
        job, tp = deep_job(i, seed)
        fab = fabric_for(job.world_size, tp)
        tr = generate_trace(fab, job, comm="alpha-beta", seed=seed * 1009 + i)
        shape = f"dp{job.dp}-tp{tp}-pp{job.pp}-m{job.microbatches}"
        shapes[f"pp{job.pp}"] += 1
        res = parse_bytedance(bytedance_parquet(tr, tp), source="twin.parquet")
        rep = analyze(res.table)
        if rep.findings:
            false_bd.append(f"{i} {shape}: " + ", ".join(f"{f.kind}:{f.subject}" for f in rep.findings))
        rep2 = analyze(to_table(tr), devices=rank_devices(fab, tr.placement))
        if rep2.findings:
            false_tw.append(f"{i} {shape}: " + ", ".join(f"{f.kind}:{f.subject}" for f in rep2.findings))
    return {"jobs": n, "shapes": dict(shapes),
            "false_finding_rate_bytedance_schema": len(false_bd) / max(n, 1),
            "false_finding_rate_twin_with_inventory": len(false_tw) / max(n, 1),
            "false_bytedance_schema": false_bd, "false_twin_with_inventory": false_tw,
            "wall_s": round(time.perf_counter() - t0, 1)}


def accuracy(n: int, seed: int, engine_subset: int, hard: int) -> dict[str, object]:
    rows = []
    t0 = time.perf_counter()
    for i in range(n):
        rows.append(judge(scenario(i, seed), "alpha-beta"))
    wall = time.perf_counter() - t0
    eng_rows = [judge(scenario(i, seed), "engine") for i in range(engine_subset)]
    hard_rows = [judge(scenario(i, seed + 1, "hard"), "alpha-beta") for i in range(hard)]
    return {"rows": rows, "engine_rows": eng_rows, "hard_rows": hard_rows, "wall_s": wall}


def summarize(rows: list[dict[str, object]]) -> dict[str, object]:
    all_dev = [r for r in rows if r["kind"] in ("slow-gpu", *NETWORK_KINDS)]
    dev = [r for r in all_dev if r["symptom"]]
    quiet = [r for r in all_dev if not r["symptom"]]
    none = [r for r in rows if r["kind"] == "none"]
    imb = [r for r in rows if r["kind"] in ("stage-imbalance", "sequence-imbalance")]
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in dev + imb:
        per_kind[str(r["kind"])][0] += int(bool(r["correct"]))
        per_kind[str(r["kind"])][1] += 1
    wins = [int(r["window_err"]) for r in dev if "window_err" in r]  # type: ignore[call-overload]
    wrong = Counter(f"{r['kind']}/{r['shape']}" for r in dev if not r["correct"])
    return {
        "scenarios": len(rows),
        "device_fault_scenarios": len(dev),
        "top1_accuracy": sum(bool(r["correct"]) for r in dev) / max(len(dev), 1),
        "fault_free_scenarios": len(none),
        "false_finding_rate": sum(bool(r["false_finding"]) for r in none) / max(len(none), 1),
        "imbalance_scenarios": len(imb),
        "imbalance_reported_as_device": sum(bool(r["imbalance_as_device"]) for r in imb),
        "imbalance_correct_rate": sum(bool(r["correct"]) for r in imb) / max(len(imb), 1),
        "extra_device_findings": sum(int(r.get("extra_device_findings", 0)) for r in dev),  # type: ignore[call-overload]
        "per_kind": {k: {"correct": v[0], "n": v[1]} for k, v in sorted(per_kind.items())},
        "no_symptom_scenarios": len(quiet),
        "no_symptom_found_right": sum(bool(r["correct"]) for r in quiet),
        "no_symptom_silent": sum(not r["found"] for r in quiet),
        "no_symptom_wrong_device": sum(bool(r["found"]) and not r["correct"]
                                       and any(not str(x).startswith("imbalance") for x in r["found"])  # type: ignore[attr-defined]
                                       for r in quiet),
        "transient_window_within_1": (sum(e <= 1 for e in wins) / len(wins)) if wins else None,
        "misses": dict(wrong),
        "analyze_s_mean": float(np.mean([float(r["analyze_s"]) for r in rows])),  # type: ignore[arg-type]
    }


def _load_replay(path: Path) -> ModuleType:
    """A replay module from a file (e.g. an older commit's ``replay.py``), for A/B timing."""
    spec = importlib.util.spec_from_file_location("replay_ref", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: {path}: not a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["replay_ref"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def replay_ab(table: OpTable, devices: object, ref: Path, runs: int = 3) -> dict[str, object]:
    """analyze() with the replay module in ``ref`` and with the current one, interleaved in
    this process (same load on a shared machine); the reports must be identical."""
    mods = {"reference": _load_replay(ref), "current": current_replay}
    names = ("build_graph", "replay", "ideal_durations")
    times: dict[str, list[float]] = {k: [] for k in mods}
    reports: dict[str, str] = {}
    try:
        for i in range(runs + 1):  # the first round compiles the numba kernels
            for k, mod in mods.items():
                for n in names:
                    setattr(straggler_analysis_mod, n, getattr(mod, n))
                a = time.perf_counter()
                rep = analyze(table, devices=devices)  # type: ignore[arg-type]
                if i:
                    times[k].append(round(time.perf_counter() - a, 2))
                reports[k] = json.dumps(rep.to_json(), sort_keys=True)
    finally:
        for n in names:
            setattr(straggler_analysis_mod, n, getattr(mods["current"], n))
    best = {k: min(v) for k, v in times.items()}
    res = {"reference": str(ref), "runs_s": times, "best_s": best,
           "ratio_reference_over_current": round(best["reference"] / best["current"], 2),
           "reports_identical": reports["reference"] == reports["current"]}
    print(f"  replay A/B: reference {best['reference']:.2f} s (runs {times['reference']}), "
          f"current {best['current']:.2f} s (runs {times['current']}): "
          f"x{res['ratio_reference_over_current']}, reports identical "
          f"{res['reports_identical']}", flush=True)
    return res


def speed(sizes: list[int], replay_ref: Path | None = None) -> list[dict[str, object]]:
    out = []
    for ranks in sizes:
        tp, pp = 8, 16
        dp = max(1, ranks // (tp * pp))
        job = TwinJob(dp=dp, tp=tp, pp=pp, microbatches=4, iterations=20)
        fab = fabric_for(job.world_size, tp)
        nic = fab.nic_of_gpu(fab.hosts[len(fab.hosts) // 3].id, 3).id
        t0 = time.perf_counter()
        # A slow GPU: it always costs iteration time (a slow NIC may sit off the critical
        # path here: TP8 keeps most traffic inside servers, and then it is not a finding).
        host = fab.hosts[len(fab.hosts) // 3].id
        tr = generate_trace(fab, job, faults=[Fault("slow-gpu", f"{host}/gpu3",
                                                    params={"factor": 1.5})],
                            comm="alpha-beta", seed=1)
        nic = f"{host}/gpu3"
        t1 = time.perf_counter()
        table = to_table(tr)
        devices = rank_devices(fab, tr.placement)
        times = []
        rep = None
        for _ in range(2):
            a = time.perf_counter()
            rep = analyze(table, devices=devices)
            times.append(time.perf_counter() - a)
        assert rep is not None
        out.append({"ranks": job.world_size, "iterations": 20, "operators": len(table),
                    "gen_s": round(t1 - t0, 2), "analyze_s": round(min(times), 2),
                    "analyze_s_runs": [round(t, 2) for t in times],
                    "found": rep.findings[0].subject if rep.findings else None,
                    "injected": nic})
        print(f"  speed: {job.world_size:6d} ranks, {len(table):>9,} ops: analyze "
              f"{min(times):6.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}), "
              f"found {out[-1]['found']} (injected {nic})", flush=True)
        if replay_ref is not None:
            out[-1]["replay_ab"] = replay_ab(table, devices, replay_ref)
    return out


def _machine() -> dict[str, object]:
    return {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def speed_only(args: argparse.Namespace) -> None:
    """The speed part alone: analyze() on the 20-iteration DP x TP8 x PP16 job."""
    sizes = args.sizes or [8192]
    print("speed (analyze only, this machine):")
    sp = speed(sizes, args.replay_ref)
    doc = {"machine": _machine(),
           "command": "python benchmarks/bench_straggler.py --only speed --sizes "
                      + ",".join(str(n) for n in sizes)
                      + (f" --replay-ref {args.replay_ref}" if args.replay_ref else ""),
           "speed": sp, "targets": {"8192_ranks_20_iterations_s": "< 10"}}
    out = args.out or SPEED_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=int, default=504)
    ap.add_argument("--engine-subset", type=int, default=35)
    ap.add_argument("--hard", type=int, default=140, help="scenarios of the hard severity tier")
    ap.add_argument("--seed", type=int, default=20251)
    ap.add_argument("--deep", type=int, default=400, help="fault-free deep 1F1B jobs")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"JSON output (default {OUT.name}; {SPEED_OUT.name} with --only speed)")
    ap.add_argument("--only", choices=("speed",), default=None,
                    help="run only this part (speed: analyze() wall time vs ranks)")
    ap.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="comma-separated rank counts for the speed part")
    ap.add_argument("--replay-ref", type=Path, default=None,
                    help="with --only speed: also time analyze() with this replay.py (e.g. "
                         "`git show 0479e7e:src/fabricscope/straggler/replay.py`), "
                         "interleaved with the current one")
    args = ap.parse_args()
    if args.only == "speed":
        speed_only(args)
        return
    args.out = args.out or OUT
    n = 70 if args.quick else args.scenarios
    sizes = [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
    print(f"accuracy: {n} twin scenarios (alpha-beta comm) + {args.engine_subset} with the flow engine")
    acc = accuracy(n, args.seed, 14 if args.quick else args.engine_subset,
                   14 if args.quick else args.hard)
    s = summarize(acc["rows"])  # type: ignore[arg-type]
    se = summarize(acc["engine_rows"])  # type: ignore[arg-type]
    sh = summarize(acc["hard_rows"])  # type: ignore[arg-type]
    print(f"  top-1 accuracy (device faults with a symptom): {s['top1_accuracy']:.1%} of "
          f"{s['device_fault_scenarios']}; faults costing < 1 %: {s['no_symptom_scenarios']} "
          f"(found {s['no_symptom_found_right']}, silent {s['no_symptom_silent']}, wrong device "
          f"{s['no_symptom_wrong_device']})")
    print(f"  findings on fault-free jobs:    {s['false_finding_rate']:.1%} of {s['fault_free_scenarios']}")
    print(f"  imbalance reported as a device: {s['imbalance_reported_as_device']} of {s['imbalance_scenarios']}"
          f" (imbalance named correctly {s['imbalance_correct_rate']:.1%})")
    print(f"  per kind: {s['per_kind']}")
    print(f"  transient windows found within 1 iteration: {s['transient_window_within_1']}")
    print(f"  misses: {s['misses']}")
    print(f"  flow-engine subset: top-1 {se['top1_accuracy']:.1%} of {se['device_fault_scenarios']}, "
          f"false {se['false_finding_rate']:.1%}, imbalance-as-device {se['imbalance_reported_as_device']}")
    print(f"  hard tier (faults at the thresholds): top-1 {sh['top1_accuracy']:.1%} of "
          f"{sh['device_fault_scenarios']}, false {sh['false_finding_rate']:.1%}, "
          f"imbalance-as-device {sh['imbalance_reported_as_device']} of {sh['imbalance_scenarios']}, "
          f"imbalance named {sh['imbalance_correct_rate']:.1%}; per kind {sh['per_kind']}")
    n_deep = 200 if args.quick else args.deep
    print(f"deep pipelines: {n_deep} fault-free 1F1B jobs (8/16 stages)")
    deep = deep_fault_free(n_deep, args.seed)
    print(f"  findings, ByteDance schema (no inventory): "
          f"{deep['false_finding_rate_bytedance_schema']:.1%}; twin columns + inventory: "
          f"{deep['false_finding_rate_twin_with_inventory']:.1%} of {n_deep} ({deep['shapes']}); "
          f"{deep['false_bytedance_schema']} {deep['false_twin_with_inventory']}")
    print("speed (analyze only, this machine):")
    sp = speed(sizes)
    doc = {
        "machine": _machine(),
        "command": "python benchmarks/bench_straggler.py" + (" --quick" if args.quick else ""),
        "accuracy": s, "accuracy_engine_subset": se, "accuracy_hard_tier": sh, "accuracy_wall_s": round(float(acc["wall_s"]), 1),  # type: ignore[arg-type]
        "deep_pipelines_fault_free": deep,
        "speed": sp,
        "targets": {"top1_accuracy": ">= 0.98", "false_finding_rate": "<= 0.01",
                    "deep_pipeline_false_finding_rate": "<= 0.01",
                    "imbalance_reported_as_device": "0", "8192_ranks_20_iterations_s": "< 10"},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
