"""Mesh prober benchmarks: localization accuracy on a 2,048-GPU twin, coverage, analysis
speed, agent throughput. Prints tables and writes benchmarks/results/probe.json.

    python benchmarks/bench_probe.py                       # everything (about an hour on 2 busy cores)
    python benchmarks/bench_probe.py --parts coverage,analysis,agent
    python benchmarks/bench_probe.py --single 40 --clean 20 --multi 20   # a quicker pass
    python benchmarks/bench_probe.py --parts untraced --untraced 250     # no-paths credible sets

Scenarios (seeded): a gray link (0.5-5 % loss, one direction, any directed link including
NIC access links), a switch-wide fault (0.5-5 % loss on every packet entering it), a NIC
fault (1-10 % loss on every packet it sends or receives), a CPU-starved host (0.5-5 ms mean
added responder delay). Every NIC probes its plan at 100 probes/s for 30 s; the baseline
(background loss 1e-5 per hop) is learned once on a fault-free 10 s warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.fabric.builders import fat_tree_fabric, leaf_spine_fabric, rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.model.records import Finding
from fabricscope.probe.analysis import analyze
from fabricscope.service.probe_twin import TwinMesh, learn_baseline, run_scenario
from fabricscope.sim.faults import Fault, FaultSchedule

RESULTS = Path(__file__).resolve().parent / "results" / "probe.json"
KINDS = ("gray-loss", "switch-fault", "nic-fault", "cpu-starved")
EXPECT = {"gray-loss": "gray-link", "switch-fault": "switch-fault", "nic-fault": "nic-fault",
          "cpu-starved": "cpu-starved"}


def random_fault(f: Fabric, kind: str, rng: np.random.Generator) -> Fault:
    ix = f.index
    if kind == "gray-loss":
        return Fault("gray-loss", ix.edge_id(int(rng.integers(ix.n_edges))),
                     params={"loss": float(rng.uniform(0.005, 0.05))})
    if kind == "switch-fault":
        return Fault("switch-fault", f.switches[int(rng.integers(len(f.switches)))].id,
                     params={"loss": float(rng.uniform(0.005, 0.05))})
    if kind == "nic-fault":
        return Fault("nic-fault", f.nics[int(rng.integers(len(f.nics)))].id,
                     params={"loss": float(rng.uniform(0.01, 0.10))})
    return Fault("cpu-starved", f.hosts[int(rng.integers(len(f.hosts)))].id,
                 params={"delay_ns": float(rng.uniform(5e5, 5e6))})


def matches(fault: Fault, finding: Finding, *, lenient_devices: bool = False) -> bool:
    """Does ``finding`` name ``fault``? (007 names links only: with ``lenient_devices`` a
    link touching the faulty switch / NIC counts for a device fault.)"""
    if finding.kind == EXPECT[fault.kind] and finding.subject == fault.subject:
        return True
    if lenient_devices and finding.kind == "gray-link" and fault.kind in ("switch-fault", "nic-fault"):
        a, b = finding.subject.split("->")
        return fault.subject in (port_device(a), port_device(b))
    return False


def first_time(tl: Any, fault: Fault, *, k: int = 1, opened: bool = False, lenient: bool = False) -> float | None:
    """Seconds of probing until ``fault`` is in the top ``k`` (raw, or opened by hysteresis)."""
    for t, raw, open_ in tl.steps:
        pool = open_ if opened else raw
        if any(matches(fault, x, lenient_devices=lenient) for x in pool[:k]):
            return t / 1e9
    return None


def bench_accuracy(mesh: TwinMesh, args: argparse.Namespace, out: dict[str, Any]) -> None:
    f = mesh.fabric
    rng = np.random.default_rng(args.seed)
    base = learn_baseline(mesh, seed=args.seed)
    out["baseline"] = {"loss_per_hop": base.loss_per_hop, "proc_ns": base.proc_ns}
    methods = ("map", "007")
    single: list[dict[str, Any]] = []
    t0 = time.time()
    for i in range(args.single):
        kind = KINDS[i % len(KINDS)]
        fault = random_fault(f, kind, rng)
        tls, _, _ = run_scenario(mesh, FaultSchedule.of([fault]), seed=1000 + i, step_s=args.step,
                                 methods=methods, baseline=base, all_steps=False)
        row: dict[str, Any] = {"kind": kind, "subject": fault.subject, "params": dict(fault.params)}
        for m in methods:
            last = tls[m].steps[-1][1]
            lenient = m == "007"
            row[m] = {
                "top1": bool(last) and matches(fault, last[0], lenient_devices=lenient),
                "top": [(x.kind, x.subject) for x in last[:3]],
                "t_top1_s": first_time(tls[m], fault, lenient=lenient),
                "t_open_s": first_time(tls[m], fault, opened=True, lenient=lenient),
            }
        single.append(row)
        done = i + 1
        acc = np.mean([r["map"]["top1"] for r in single])
        print(f"\rsingle {done}/{args.single}  MAP top-1 {acc:.3f}  ({time.time() - t0:.0f}s)",
              end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    out["single"] = summarize_single(single, methods)
    out["single_rows"] = single
    save(args, out)

    clean: dict[str, list[int]] = {m: [] for m in methods}
    for i in range(args.clean):
        tls, _, _ = run_scenario(mesh, FaultSchedule(), seed=5000 + i, step_s=args.duration,
                                 methods=methods, baseline=base)
        for m in methods:
            clean[m].append(len(tls[m].steps[-1][1]))
        print(f"\rclean {i + 1}/{args.clean}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    out["clean"] = {m: {"runs": len(v), "runs_with_findings": int(np.count_nonzero(v)),
                        "findings": int(np.sum(v))} for m, v in clean.items()}
    save(args, out)

    multi: list[dict[str, Any]] = []
    for i in range(args.multi):
        n = 2 + int(rng.integers(2))
        faults = [random_fault(f, KINDS[int(rng.integers(len(KINDS)))], rng) for _ in range(n)]
        tls, _, _ = run_scenario(mesh, FaultSchedule.of(faults), seed=9000 + i, step_s=args.duration,
                                 methods=methods, baseline=base)
        row = {"faults": [(x.kind, x.subject) for x in faults]}
        for m in methods:
            last = tls[m].steps[-1][1]
            row[m] = all(any(matches(x, y, lenient_devices=m == "007") for y in last[:5]) for x in faults)
        multi.append(row)
        print(f"\rmulti {i + 1}/{args.multi}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    out["multi"] = {m: {"scenarios": len(multi), "all_in_top5": float(np.mean([r[m] for r in multi]))
                        if multi else None} for m in methods}
    out["multi_rows"] = multi


def summarize_single(rows: list[dict[str, Any]], methods: tuple[str, ...]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for m in methods:
        per_kind = {}
        for k in (*KINDS, "all"):
            sel = [r for r in rows if k in ("all", r["kind"])]
            if not sel:
                continue
            t1 = [r[m]["t_top1_s"] for r in sel if r[m]["t_top1_s"] is not None]
            to = [r[m]["t_open_s"] for r in sel if r[m]["t_open_s"] is not None]
            per_kind[k] = {
                "n": len(sel),
                "top1": float(np.mean([r[m]["top1"] for r in sel])),
                "median_t_top1_s": float(np.median(t1)) if t1 else None,
                "max_t_top1_s": float(np.max(t1)) if t1 else None,
                "median_t_open_s": float(np.median(to)) if to else None,
                "max_t_open_s": float(np.max(to)) if to else None,
            }
        res[m] = per_kind
    return res


def bench_ttl(mesh: TwinMesh, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Time to localize at a finer step: first step with the fault ranked first (raw) and the
    step at which the hysteresis opened it, on ``--ttl`` fresh single-fault scenarios."""
    f = mesh.fabric
    rng = np.random.default_rng(args.seed + 1)
    base = learn_baseline(mesh, seed=args.seed)
    rows = []
    for i in range(args.ttl):
        kind = KINDS[i % len(KINDS)]
        fault = random_fault(f, kind, rng)
        tls, _, _ = run_scenario(mesh, FaultSchedule.of([fault]), seed=7000 + i, step_s=args.ttl_step,
                                 methods=("map",), baseline=base)
        rows.append({"kind": kind, "t_top1_s": first_time(tls["map"], fault),
                     "t_open_s": first_time(tls["map"], fault, opened=True)})
        print(f"\rttl {i + 1}/{args.ttl}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    t1 = [r["t_top1_s"] for r in rows if r["t_top1_s"] is not None]
    to = [r["t_open_s"] for r in rows if r["t_open_s"] is not None]
    out["time_to_localize"] = {
        "scenarios": len(rows), "step_s": args.ttl_step,
        "found": len(t1), "median_t_top1_s": float(np.median(t1)) if t1 else None,
        "max_t_top1_s": float(np.max(t1)) if t1 else None,
        "median_t_open_s": float(np.median(to)) if to else None,
        "max_t_open_s": float(np.max(to)) if to else None, "rows": rows,
    }


def bench_coverage(mesh: TwinMesh, out: dict[str, Any]) -> None:
    """Fraction of each probed pair's ECMP paths its source ports actually hit (twin paths)."""
    from fabricscope.probe.plan import PathCounter

    fl = mesh.flows
    fwd_t, _ = mesh._proto.path_tables()
    # A path's identity: a random linear hash of its edge ids (collisions ~1e-12).
    w = np.random.default_rng(0).random(mesh.fabric.index.n_edges)
    lens = np.diff(fwd_t.offsets)
    key = np.add.reduceat(w[fwd_t.edges], fwd_t.offsets[:-1]) * (lens > 0)
    pair = fl.src_node * mesh.fabric.index.n_nodes + fl.dst_node
    pk = np.unique(np.stack([pair.astype(np.float64), key]), axis=1)
    upair, n_paths_seen = np.unique(pk[0], return_counts=True)
    pc = PathCounter(mesh.fabric, mesh.routing)
    ids = mesh.fabric.index.node_ids
    nn = mesh.fabric.index.n_nodes
    total = np.array([pc(ids[int(p) // nn], ids[int(p) % nn]) for p in upair])
    multi = total > 1
    frac = n_paths_seen[multi] / total[multi]
    out["coverage"] = {
        "pairs": int(upair.shape[0]),
        "multipath_pairs": int(multi.sum()),
        "paths_per_pair": sorted({int(x) for x in total}),
        "target_all_paths_probability": 0.99,
        "pairs_fully_covered": float(np.mean(frac >= 1.0)),
        "mean_fraction_of_paths_covered": float(np.mean(frac)),
        "min_fraction_of_paths_covered": float(np.min(frac)),
    }


def bench_analysis(mesh: TwinMesh, out: dict[str, Any]) -> None:
    """Time to analyze 1,000,000 probe samples (paths already known: the plan's flows)."""
    base = learn_baseline(mesh, seed=3)
    fault = Fault("gray-loss", mesh.fabric.index.edge_id(7), params={"loss": 0.01})
    tr = mesh.transport_for(FaultSchedule.of([fault]), 11, background_loss=1e-5)
    dur = int(1e9 * 1_000_000 / (len(mesh.plans) * mesh.budget_pps))
    obs = mesh.probe(tr, start_ns=0, duration_ns=dur, seed=12)
    t = time.perf_counter()
    findings = analyze(mesh.fabric, mesh.model, obs, base)
    dt = time.perf_counter() - t
    out["analysis"] = {"samples": len(obs), "seconds": dt,
                       "samples_per_s": len(obs) / dt,
                       "top": [(x.kind, x.subject) for x in findings[:1]],
                       "correct": bool(findings) and findings[0].subject == fault.subject}


UNTRACED_SHAPES = {
    # name -> builder; several spines, a rail-optimized one, a 3-tier fat tree, multi-plane.
    "leaf-spine 4x2 (the netns lab)": lambda: leaf_spine_fabric(leaves=4, hosts_per_leaf=2, spines=2),
    "leaf-spine 6x4": lambda: leaf_spine_fabric(leaves=6, hosts_per_leaf=3, spines=4),
    "leaf-spine 8x3, 2 NICs/host": lambda: leaf_spine_fabric(leaves=8, hosts_per_leaf=2, spines=3,
                                                            nics_per_host=2),
    "rail-optimized 16x8 GPUs": lambda: rail_optimized_fabric(16),
    "fat-tree k=4": lambda: fat_tree_fabric(k=4),
}


def untraced_outcome(fault: Fault, findings: list[Finding]) -> dict[str, Any]:
    """How a no-paths analysis did on one gray-link fault: is the truth in the top finding's
    candidate set, was a wrong single link named with score >= 0.99, set size."""
    gray = [x for x in findings if x.kind in ("gray-link", "ambiguous")]
    top = gray[0] if gray else None
    members = top.subject.split(" | ") if top else []
    # Wrong and confident: a finding at score >= 0.99 whose subject (one link or a set)
    # does not contain the faulty link.
    wrong_confident = any(x.score >= 0.99 and fault.subject not in x.subject.split(" | ")
                          for x in findings)
    return {"subject": fault.subject, "loss": fault.params["loss"],
            "top": top.subject if top else None, "top_score": top.score if top else None,
            "in_set": fault.subject in members, "set_size": len(members),
            "exact": members == [fault.subject],
            "wrong_confident": wrong_confident,
            "loss_est": float(top.details["loss"]) if top else None}


def bench_untraced(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Single gray links (0.5-5 % loss, one direction, any directed link) on several fabric
    shapes, analysed WITHOUT traced paths (candidate ECMP sets): wrong confident answers,
    truth in the credible set, set size; the same probes WITH paths for comparison."""
    rng = np.random.default_rng(args.seed + 1)
    rows: list[dict[str, Any]] = []
    n_shapes = len(UNTRACED_SHAPES)
    for si, (name, build) in enumerate(UNTRACED_SHAPES.items()):
        f = build()
        mesh = TwinMesh(f, seed=args.seed + si)
        untraced = mesh.untraced_model
        base = learn_baseline(mesh, seed=args.seed + si)
        n = args.untraced // n_shapes + (si < args.untraced % n_shapes)
        t0 = time.time()
        for i in range(n):
            fault = random_fault(f, "gray-loss", rng)
            seed = int(rng.integers(2**31))
            tr = mesh.transport_for(FaultSchedule.of([fault]), seed, background_loss=1e-5)
            obs = mesh.probe(tr, start_ns=0, duration_ns=int(args.duration * 1e9), seed=seed + 1)
            row = {"shape": name, "i": i, **untraced_outcome(fault, analyze(f, untraced, obs, base))}
            traced = analyze(f, mesh.model, obs, base)
            row["traced_top1"] = bool(traced) and (traced[0].kind, traced[0].subject) == ("gray-link", fault.subject)
            # With paths a weak fault can still leave a set: is its most probable member right?
            best = (str(traced[0].details.get("posterior", "")).split("=")[0] or traced[0].subject) if traced else None
            row["traced_best_member"] = best == fault.subject
            row["traced_set_size"] = len(traced[0].subject.split(" | ")) if traced else 0
            rows.append(row)
        print(f"untraced {name}: {n} faults, {time.time() - t0:.0f} s", file=sys.stderr)
    out["untraced"] = {"rows": rows, "summary": summarize_untraced(rows)}


def summarize_untraced(rows: list[dict[str, Any]]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for shape in (*dict.fromkeys(r["shape"] for r in rows), "all"):
        sel = [r for r in rows if shape in ("all", r["shape"])]
        found = [r for r in sel if r["top"] is not None]
        rel = [r["loss_est"] / r["loss"] - 1 for r in found if r["in_set"]]
        res[shape] = {
            "n": len(sel),
            "wrong_confident": sum(r["wrong_confident"] for r in sel),
            "found": len(found),
            "truth_in_set": sum(r["in_set"] for r in sel),
            "exact": sum(r["exact"] for r in sel),
            "median_set_size": float(np.median([r["set_size"] for r in found])) if found else None,
            "max_set_size": max((r["set_size"] for r in found), default=None),
            "median_loss_rel_err": float(np.median(rel)) if rel else None,
            "traced_top1": sum(r["traced_top1"] for r in sel),
            "traced_best_member": sum(r.get("traced_best_member", False) for r in sel),
        }
    return res


def bench_agent(out: dict[str, Any], seconds: float) -> None:
    from fabricscope.probe.agent import loopback_benchmark

    out["agent"] = loopback_benchmark(seconds=seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=256, help="servers x 8 GPUs (256 -> 2,048 GPUs)")
    ap.add_argument("--single", type=int, default=200)
    ap.add_argument("--clean", type=int, default=100)
    ap.add_argument("--multi", type=int, default=60)
    ap.add_argument("--step", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--agent-seconds", type=float, default=3.0)
    ap.add_argument("--ttl", type=int, default=20, help="scenarios of the time-to-localize sweep")
    ap.add_argument("--ttl-step", type=float, default=2.0)
    ap.add_argument("--untraced", type=int, default=250, help="gray-link faults of the no-paths part")
    ap.add_argument("--parts", default="accuracy,coverage,analysis,ttl,agent")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    out: dict[str, Any] = {}
    if args.out.exists():
        out = json.loads(args.out.read_text())
    out["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                      "platform": platform.platform()}
    if parts & {"accuracy", "coverage", "analysis", "ttl"}:
        t = time.time()
        f = rail_optimized_fabric(args.servers)
        mesh = TwinMesh(f, seed=args.seed)
        out["twin"] = {"gpus": f.gpu_count, "nics": len(f.nics), "switches": len(f.switches),
                       "directed_links": f.index.n_edges, "flows": len(mesh.flows),
                       "probes_per_s_per_agent": mesh.budget_pps, "setup_s": time.time() - t}
        print(f"twin: {out['twin']}", file=sys.stderr)
        if "coverage" in parts:
            bench_coverage(mesh, out)
        if "analysis" in parts:
            bench_analysis(mesh, out)
        save(args, out)
        if "ttl" in parts:
            bench_ttl(mesh, args, out)
            save(args, out)
        if "accuracy" in parts:
            out["accuracy_args"] = {k: getattr(args, k) for k in ("single", "clean", "multi", "step", "duration", "seed")}
            bench_accuracy(mesh, args, out)
    if "untraced" in parts:
        bench_untraced(args, out)
        save(args, out)
    if "agent" in parts:
        bench_agent(out, args.agent_seconds)
    save(args, out)
    print_tables(out)


def save(args: argparse.Namespace, out: dict[str, Any]) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))


def print_tables(out: dict[str, Any]) -> None:
    if "single" in out:
        print("\nsingle-fault scenarios (top-1 at 30 s; times = seconds of probing)")
        print(f"{'method':<6} {'kind':<13} {'n':>4} {'top-1':>7} {'med t_top1':>10} {'max t_top1':>10} {'med t_open':>10}")
        for m, per in out["single"].items():
            for k, r in per.items():
                print(f"{m:<6} {k:<13} {r['n']:>4} {r['top1']:>7.3f} {r['median_t_top1_s']!s:>10} "
                      f"{r['max_t_top1_s']!s:>10} {r['median_t_open_s']!s:>10}")
    if "clean" in out:
        print("\nfault-free runs:", json.dumps(out["clean"]))
    if "multi" in out:
        print("2-3 simultaneous faults, all in top 5:", json.dumps(out["multi"]))
    if "time_to_localize" in out:
        print("time to localize:", json.dumps({k: v for k, v in out["time_to_localize"].items() if k != "rows"}))
    if "untraced" in out:
        print("\nsingle gray links WITHOUT traced paths (credible sets), and WITH paths (traced top-1)")
        print(f"{'shape':<30} {'n':>4} {'wrong>=.99':>10} {'found':>6} {'in set':>7} {'exact':>6} "
              f"{'med size':>8} {'max size':>8} {'med loss err':>12} {'traced top1':>11} {'traced best':>11}")
        for k, r in out["untraced"]["summary"].items():
            err = f"{r['median_loss_rel_err'] * 100:+.1f}%" if r["median_loss_rel_err"] is not None else "-"
            print(f"{k:<30} {r['n']:>4} {r['wrong_confident']:>10} {r['found']:>6} {r['truth_in_set']:>7} "
                  f"{r['exact']:>6} {r['median_set_size']!s:>8} {r['max_set_size']!s:>8} {err:>12} "
                  f"{r['traced_top1']:>11} {r.get('traced_best_member', '-')!s:>11}")
    for k in ("coverage", "analysis", "agent"):
        if k in out:
            print(f"{k}:", json.dumps(out[k]))


if __name__ == "__main__":
    main()
