"""Diagnosis benchmark: the closed loop on a 2,048-GPU twin against injected faults.

    python benchmarks/bench_diagnosis.py                        # 200 scenarios (see --help)
    python benchmarks/bench_diagnosis.py --single 2 --multi 4 --clean 2 --servers 32   # a quick pass

Scenarios (seeded): single faults of every kind the loop's instruments can see (gray-loss,
link-flap, link-down, link-degraded, congestion, micro-burst, pfc-storm, optic-degrading,
switch-fault, nic-fault, slow-nic, slow-gpu, cpu-starved), 2-3 concurrent faults, and
fault-free runs. Each runs every instrument on the twin for ``--duration`` simulated seconds
(faults start at a random time in [20 s, 60 s] and last to the end; a micro-burst
lasts 50 ms to 3 s), replays the findings into
the correlator and scores the incidents' root causes as NIKA does: set precision / recall / F1
over (resource, fault type) pairs, plus localization-only and type-only F1. The
knowledge-tree baseline (diagnosis/baseline.py) reads the same findings. Both run active checks
on the twin (diagnosis/checks.py: the same checks at the same modelled costs; the coordinator
all at once, the tree one after another) unless --no-checks; each is also replayed without
checks, and the coordinator once more with a case base retained from the earlier scenarios.
The instruments also publish suspicions (diagnosis/suspicions.py: sub-alarm statistics the
coordinator answers with rate-bounded checks; the tree reads alarms only) unless
--no-suspicions; each scenario is also replayed with the channel off (same findings).
Time to correct root cause: first simulated time the pair is named, minus the fault's onset
(and minus the first report that implicates the faulty resource: the diagnosis proper). The
tree's time is the earlier of two walks, with and without the checks that decide presence
only (a probe burst through a cable or switch): run one after another, such a check delays
the tree's walk even when it finds nothing, which must not count against the baseline.

Prints tables and writes benchmarks/results/diagnosis.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.diagnosis.baseline import TreeWalker
from fabricscope.diagnosis.cases import Case, CaseBase, signature_of
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import CorrelatorParams
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.scoring import ScenarioScore, macro_f1, micro, score_scenario
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.checks import TwinChecks
from fabricscope.service.supervise_twin import (
    DEFAULT_PARAMS,
    NS,
    LoopResult,
    TreeSide,
    default_instruments,
    replay,
    run_loop,
    truth_pairs,
)
from fabricscope.sim.faults import Fault

RESULTS = Path(__file__).resolve().parent / "results" / "diagnosis.json"
KINDS = ("gray-loss", "link-flap", "link-down", "link-degraded", "congestion", "micro-burst",
         "pfc-storm", "optic-degrading", "switch-fault", "nic-fault", "slow-nic", "slow-gpu",
         "cpu-starved")


def _job_gpus(fabric: Fabric, instruments: list[Any], spec: ScenarioSpec) -> list[str]:
    for ins in instruments:
        fn = getattr(ins, "job_gpus", None)
        if fn is not None:
            return list(fn(spec))
    return [f"{h.id}/gpu{g}" for h in fabric.hosts for g in range(h.gpus)]


def random_fault(f: Fabric, kind: str, rng: np.random.Generator, start_ns: int,
                 job_gpus: list[str], used: set[str]) -> Fault:
    """A fault of ``kind`` on a random subject not in ``used`` (params around the defaults)."""
    ix = f.index
    switch_links = [lk for lk in f.links
                    if f.devices[lk.a.rsplit(':', 1)[0]].is_switch
                    and f.devices[lk.b.rsplit(':', 1)[0]].is_switch]
    rm = ResourceMap(f)
    p = dict(DEFAULT_PARAMS.get(kind, {}))

    def pick(seq: list[str]) -> str:
        for _ in range(100):
            s = seq[int(rng.integers(len(seq)))]
            if s not in used:
                used.add(s)
                return s
        return seq[0]

    if kind == "gray-loss":
        subj = pick([ix.edge_id(e) for e in range(ix.n_edges)])
        p["loss"] = float(rng.uniform(0.005, 0.05))
    elif kind in ("link-flap", "link-down"):
        subj = pick([lk.id for lk in f.links])
    elif kind == "link-degraded":
        nics = sorted({rm.resources(g, "nic")[0] for g in job_gpus if rm.resources(g, "nic")})
        subj = pick([rm.resources(n, "cable")[0] for n in nics])
        p["factor"] = float(rng.uniform(0.1, 0.4))
    elif kind == "congestion":
        lk = switch_links[int(rng.integers(len(switch_links)))]
        subj = pick([f"{lk.a}->{lk.b}", f"{lk.b}->{lk.a}"])
    elif kind == "micro-burst":
        subj = pick([ix.edge_id(e) for e in range(ix.n_edges)
                     if f.devices[ix.from_port[e].rsplit(':', 1)[0]].is_switch])
    elif kind in ("pfc-storm", "optic-degrading"):
        subj = pick([pt for pt in f.ports if f.devices[pt.rsplit(':', 1)[0]].is_switch
                     and pt in f.peer_port])
    elif kind == "switch-fault":
        subj = pick([s.id for s in f.switches])
        p["loss"] = float(rng.uniform(0.005, 0.05))
    elif kind == "nic-fault":
        subj = pick([n.id for n in f.nics])
        p["loss"] = float(rng.uniform(0.01, 0.10))
    elif kind == "slow-nic":
        nics = sorted({rm.resources(g, "nic")[0] for g in job_gpus if rm.resources(g, "nic")})
        subj = pick(nics)
        p["factor"] = float(rng.uniform(0.1, 0.4))
    elif kind == "slow-gpu":
        subj = pick(job_gpus)
        p["factor"] = float(rng.uniform(1.3, 2.0))
    elif kind == "cpu-starved":
        subj = pick([h.id for h in f.hosts])
        p["delay_ns"] = float(rng.uniform(5e5, 5e6))
    else:
        raise ValueError(kind)
    end = None
    if kind == "micro-burst":  # a burst: milliseconds to seconds, never minutes
        end = start_ns + int(rng.uniform(0.05, 3.0) * NS)
    return Fault(kind, subj, start_ns, end, p)  # type: ignore[arg-type]


def scenarios(f: Fabric, args: argparse.Namespace, job_gpus: list[str]) -> list[dict[str, Any]]:
    rng = np.random.default_rng(args.seed)
    out: list[dict[str, Any]] = []

    def start() -> int:
        return int(rng.uniform(20, 60) * NS)

    for _r in range(args.single):
        for k in KINDS:
            used: set[str] = set()
            out.append({"group": "single", "faults": [random_fault(f, k, rng, start(), job_gpus, used)]})
    for i in range(args.multi):
        n = 2 + i % 2
        used = set()
        kinds = rng.choice(len(KINDS), size=n, replace=False)
        out.append({"group": "concurrent", "faults": [
            random_fault(f, KINDS[int(k)], rng, start(), job_gpus, used) for k in kinds]})
    for _ in range(args.clean):
        out.append({"group": "fault-free", "faults": []})
    return out


def baseline_timeline(findings: list[Any], kb: Any, rmap: ResourceMap, tick_ns: int, end_ns: int,
                      checks: TwinChecks | None, *, presence_only: bool = True,
                      ) -> tuple[list[tuple[str, str]], list[tuple[int, list[tuple[str, str]]]], int]:
    """The knowledge-tree baseline over the same findings, through the same driver as the
    coordinator (supervise_twin.replay), with its checks on ``checks`` (None: no checks);
    ``presence_only=False``: without the checks that decide only presence on a resource."""
    def res_of(subject: str, kind: str) -> tuple[str, ...]:
        return rmap.resources(subject, kind)

    walker = TreeWalker(kb, res_of, checks=checks is not None, presence_only=presence_only)
    tl, _ = replay(findings, TreeSide(walker), checks, tick_ns=tick_ns, end_ns=end_ns)
    return sorted(walker.named), tl, len(checks.log) if checks is not None else 0


def _first(tl: list[tuple[int, list[tuple[str, str]]]], pair: tuple[str, str]) -> int | None:
    return next((t for t, ps in tl if pair in ps), None)


def detected_at(rmap: ResourceMap, kb: Any, res: LoopResult, f: Fault, pair: tuple[str, str]) -> int | None:
    """When the first finding that implicates the fault's resource was reported (both sides
    see it at the same time): the start of diagnosis proper."""
    kind = kb.types[pair[1]].resource
    for o in res.findings:  # in reported order (alarms: suspicions are kept apart)
        if o.reported_ns >= f.start_ns and (
                pair[0] in rmap.resources(o.subject, kind, near=True) or o.subject == pair[0]):
            return o.reported_ns
    return None


def retain(cb: CaseBase, rmap: ResourceMap, kb: Any, res: LoopResult,
           truth: list[tuple[Fault, tuple[str, str]]], tag: str) -> None:
    """Case-based reasoning's *retain*: every injected fault becomes a case, as an operator
    resolving the incident would file it (its true type; the findings of the incident that
    touched the faulty resource). Only later scenarios retrieve it."""
    by_id = {o.id: o for o in res.findings}
    for k, (_f, (resource, fault)) in enumerate(truth):
        kind = kb.types[fault].resource
        for inc in res.incidents:
            mine = [by_id[i] for i in inc.findings if i in by_id]
            if not any(resource in rmap.resources(o.subject, kind, near=True) for o in mine):
                continue
            sig = signature_of(mine, resource)
            cb.add(Case(id=f"case-{tag}-{k}", title=f"{fault} on {resource}", fault=fault,
                        resource_kind=kind, signature=tuple(sorted(sig.items())),
                        resolution=f"benchmark scenario {tag}: {fault} on {resource}", date="",
                        resource=resource, source=f"scenario {tag}"))
            break


def run(args: argparse.Namespace) -> dict[str, Any]:
    fabric = rail_optimized_fabric(args.servers)
    kb = load_kb()
    rmap = ResourceMap(fabric)
    instruments = default_instruments(suspicions=not args.no_suspicions)
    probe_spec = ScenarioSpec(fabric, [], args.duration, args.seed)
    jg = _job_gpus(fabric, instruments, probe_spec)
    scen = scenarios(fabric, args, jg)
    print(f"fabric rail-optimized servers={args.servers}: {fabric.gpu_count} GPUs, "
          f"{len(fabric.links)} cables; {len(scen)} scenarios of {args.duration:.0f} s; "
          f"job on {len(jg)} GPUs", flush=True)
    rows = []
    case_base = CaseBase()
    t_start = time.perf_counter()
    for n, sc in enumerate(scen):
        spec = ScenarioSpec(fabric, sc["faults"], args.duration, args.seed * 1000 + n)
        t0 = time.perf_counter()
        c0 = time.process_time()
        active = not args.no_checks
        runner = TwinChecks(spec) if active else None
        res = run_loop(spec, instruments, kb=kb, tick_s=args.tick, checks=runner)
        cpu_ours = time.process_time() - c0
        everything = res.findings + res.suspicions
        # the suspicion channel off: the same findings, the coordinator with its checks
        # answering alarms only (what the code did before the channel)
        off_runner = TwinChecks(spec) if active and res.suspicions else runner
        off = run_loop(spec, instruments, kb=kb, tick_s=args.tick, findings=everything,
                       checks=off_runner, params=CorrelatorParams(suspicions=None)) \
            if off_runner is not runner else res
        passive = run_loop(spec, instruments, kb=kb, tick_s=args.tick, findings=res.findings) \
            if active else res
        wall = time.perf_counter() - t0
        truth = truth_pairs(fabric, kb, sc["faults"])
        tp = [p for _, p in truth]
        ours = res.predicted()
        tick_ns, end_ns = int(args.tick * NS), int(args.duration * NS)
        c1 = time.process_time()
        base, btl, bchecks = baseline_timeline(res.findings, kb, rmap, tick_ns, end_ns,
                                               TwinChecks(spec) if active else None)
        cpu_base = time.process_time() - c1
        # the tree walks its checks one after another: a presence-only check (a probe burst
        # through a cable or switch) costs it 1.5 s even when it finds nothing, so its time
        # to each root cause is the earlier of the walks with and without those checks
        base_np, btl_np, _ = baseline_timeline(res.findings, kb, rmap, tick_ns, end_ns,
                                               TwinChecks(spec), presence_only=False) \
            if active else (base, btl, 0)
        with_cases = run_loop(spec, instruments, kb=kb, tick_s=args.tick, findings=everything,
                              checks=TwinChecks(spec) if active else None,
                              cases=case_base) if len(case_base) else res
        n_cases = len(case_base)
        retain(case_base, rmap, kb, res, truth, str(n))
        base_p, btl_p, _ = baseline_timeline(res.findings, kb, rmap, tick_ns, end_ns, None) \
            if active else (base, btl, 0)
        s_ours = score_scenario(tp, ours)
        s_base = score_scenario(tp, base)
        ttrc, ttrc_b, ttrc_p, ttrc_bp, dtrc, dtrc_b, ttrc_c, ttrc_o = [], [], [], [], [], [], [], []

        def since(t: int | None, t0: int | None) -> float | None:
            return None if t is None or t0 is None else max(0.0, (t - t0) / NS)

        for f, pair in truth:
            det = detected_at(rmap, kb, res, f, pair)
            t = res.first_named(pair)
            tb = min((x for x in (_first(btl, pair), _first(btl_np, pair)) if x is not None),
                     default=None)
            ttrc.append(since(t, f.start_ns))
            ttrc_b.append(since(tb, f.start_ns))
            dtrc.append(since(t, det))
            dtrc_b.append(since(tb, det))
            ttrc_p.append(since(passive.first_named(pair), f.start_ns))
            ttrc_c.append(since(with_cases.first_named(pair), f.start_ns))
            ttrc_bp.append(since(_first(btl_p, pair), f.start_ns))
            ttrc_o.append(since(off.first_named(pair), f.start_ns))
        rows.append({
            "passive": passive.predicted(), "baseline_passive": base_p,
            "_sp": score_scenario(tp, passive.predicted()), "_bp": score_scenario(tp, base_p),
            "ttrc_passive_s": ttrc_p, "ttrc_baseline_passive_s": ttrc_bp,
            "dtrc_s": dtrc, "dtrc_baseline_s": dtrc_b,
            "with_cases": with_cases.predicted(), "_sc": score_scenario(tp, with_cases.predicted()),
            "ttrc_cases_s": ttrc_c, "cases_before": n_cases,
            "off": off.predicted(), "_so": score_scenario(tp, off.predicted()),
            "ttrc_off_s": ttrc_o, "suspicions": len(res.suspicions),
            "suspicion_stats": res.suspicion_stats,
            "checks_off": len(off_runner.log) if off_runner is not None else 0,
            "checks": len(runner.log) if runner is not None else 0, "checks_baseline": bchecks,
            "cpu_ours_s": round(cpu_ours, 3), "cpu_baseline_s": round(cpu_base, 3),
            "group": sc["group"], "kinds": [f.kind for f in sc["faults"]],
            "truth": tp, "ours": ours, "baseline": base, "baseline_no_presence_only": base_np,
            "_bn": score_scenario(tp, base_np),
            "score": _s(s_ours), "baseline_score": _s(s_base),
            "incidents": len(res.incidents), "findings": len(res.findings),
            "ttrc_s": ttrc, "ttrc_baseline_s": ttrc_b, "wall_s": round(wall, 2),
            "cpu_s": res.seconds,
            "_s": s_ours, "_b": s_base,
        })
        done = n + 1
        el = time.perf_counter() - t_start
        if done % max(1, len(scen) // 20) == 0 or done == len(scen):
            print(f"  {done}/{len(scen)} scenarios, {el:.0f} s, ~{el / done * (len(scen) - done):.0f} s left",
                  flush=True)
            if args.partial:  # what is done so far, for a run that may be cut short
                import contextlib
                import io
                with contextlib.redirect_stdout(io.StringIO()):
                    part = summarize(rows, args, fabric)
                Path(args.partial).write_text(json.dumps(part, indent=1, default=str) + "\n")
    out = summarize(rows, args, fabric)
    if args.hours > 0:
        spec = ScenarioSpec(fabric, [], args.hours * 3600.0, args.seed + 99)
        t0 = time.perf_counter()
        hr = None if args.no_checks else TwinChecks(spec)
        res = run_loop(spec, instruments, kb=kb, tick_s=args.tick, checks=hr)
        wall = time.perf_counter() - t0
        cpu = sum(res.seconds.values())
        out["fault_free_hours"] = {"hours": args.hours, "incidents": len(res.incidents),
                                   "findings": len(res.findings), "suspicions": len(res.suspicions),
                                   "suspicion_gate": res.suspicion_stats,
                                   "checks": len(hr.log) if hr is not None else 0, "cpu_s": round(cpu, 2),
                                   "wall_s": round(wall, 2),
                                   "cores": round(cpu / spec.duration_s, 4),
                                   "cpu_by_part": res.seconds}
        print(f"\nfault-free {args.hours:g} h on the twin: {len(res.incidents)} incident(s), "
              f"{len(res.findings)} finding(s), {len(res.suspicions)} suspicion(s) (gate "
              f"{res.suspicion_stats}); {cpu:.1f} CPU s for {spec.duration_s:.0f} s "
              f"simulated = {cpu / spec.duration_s:.4f} core(s); by part {res.seconds}")
    return out


def _s(s: ScenarioScore) -> dict[str, Any]:
    return {k: {"tp": getattr(s, k).tp, "fp": getattr(s, k).fp, "fn": getattr(s, k).fn}
            for k in ("pairs", "resources", "types")}


def summarize(rows: list[dict[str, Any]], args: argparse.Namespace, fabric: Fabric) -> dict[str, Any]:
    out: dict[str, Any] = {"groups": {}, "per_kind": {}}
    print()
    print(f"{'group':12} {'n':>4} {'F1':>6} {'P':>6} {'R':>6} {'loc F1':>7} {'type F1':>8} "
          f"{'base F1':>8} {'base loc':>9} {'incidents':>10}")
    for g in ("single", "concurrent", "fault-free", "all"):
        rs = [r for r in rows if g == "all" or r["group"] == g]
        if not rs:
            continue
        so = [r["_s"] for r in rs]
        sb = [r["_b"] for r in rs]
        m, mb = micro(so), micro(sb)
        d = {"n": len(rs), "f1": round(m.f1, 4), "precision": round(m.precision, 4),
             "recall": round(m.recall, 4), "loc_f1": round(micro(so, "resources").f1, 4),
             "type_f1": round(micro(so, "types").f1, 4), "macro_f1": round(macro_f1(so), 4),
             "baseline_f1": round(mb.f1, 4), "baseline_loc_f1": round(micro(sb, "resources").f1, 4),
             "baseline_precision": round(mb.precision, 4), "baseline_recall": round(mb.recall, 4),
             "incidents": sum(r["incidents"] for r in rs)}
        out["groups"][g] = d
        print(f"{g:12} {d['n']:4d} {d['f1']:6.3f} {d['precision']:6.3f} {d['recall']:6.3f} "
              f"{d['loc_f1']:7.3f} {d['type_f1']:8.3f} {d['baseline_f1']:8.3f} "
              f"{d['baseline_loc_f1']:9.3f} {d['incidents']:10d}")
    if any("_sp" in r for r in rows):
        print()
        print("active checks on / off (F1 over (resource, type) pairs; same findings):")
        print(f"{'group':12} {'ours+checks':>12} {'ours passive':>13} {'tree+checks':>12} {'tree passive':>13}"
              f" {'ours, no suspicions':>20} {'tree, no presence-only':>23}")
        out["checks_f1"] = {}
        for g in ("single", "concurrent", "all"):
            rs = [r for r in rows if g == "all" or r["group"] == g]
            if not rs:
                continue
            v = [round(micro([r[k] for r in rs]).f1, 4)
                 for k in ("_s", "_sp", "_b", "_bp", "_so", "_bn")]
            out["checks_f1"][g] = dict(zip(("ours", "ours_passive", "baseline", "baseline_passive",
                                            "ours_no_suspicions", "baseline_no_presence_only"),
                                           v, strict=True))
            print(f"{g:12} {v[0]:12.3f} {v[1]:13.3f} {v[2]:12.3f} {v[3]:13.3f} {v[4]:20.3f}"
                  f" {v[5]:23.3f}")
        out["checks_run"] = {"ours_median": statistics.median(r["checks"] for r in rows),
                             "baseline_median": statistics.median(r["checks_baseline"] for r in rows),
                             "ours_total": sum(r["checks"] for r in rows),
                             "baseline_total": sum(r["checks_baseline"] for r in rows),
                             "ours_no_suspicions_median": statistics.median(r["checks_off"] for r in rows),
                             "ours_no_suspicions_total": sum(r["checks_off"] for r in rows)}
        print(f"checks run per scenario (median): ours {out['checks_run']['ours_median']}, "
              f"tree {out['checks_run']['baseline_median']}, ours without suspicions "
              f"{out['checks_run']['ours_no_suspicions_median']} (totals "
              f"{out['checks_run']['ours_total']} / {out['checks_run']['baseline_total']} / "
              f"{out['checks_run']['ours_no_suspicions_total']})")
        sus: Counter[str] = Counter()
        sus_clean: Counter[str] = Counter()
        for r in rows:
            sus.update(r["suspicion_stats"])
            if r["group"] == "fault-free":
                sus_clean.update(r["suspicion_stats"])
        out["suspicions"] = {"all": dict(sus), "fault_free": dict(sus_clean),
                             "per_scenario_median": statistics.median(r["suspicions"] for r in rows)}
        print(f"suspicion gate, all scenarios: {dict(sus)}; fault-free scenarios: {dict(sus_clean)}")
        print()
        print("case base (cases retained from earlier scenarios only; with checks):")
        out["cases_f1"] = {}
        for g in ("single", "concurrent", "all"):
            rs = [r for r in rows if (g == "all" or r["group"] == g) and r["cases_before"] > 0]
            if not rs:
                continue
            v = [round(micro([r[k] for r in rs]).f1, 4) for k in ("_s", "_sc")]
            out["cases_f1"][g] = {"n": len(rs), "without": v[0], "with": v[1]}
            print(f"  {g:12} n={len(rs):3d}: F1 without {v[0]:.3f}, with {v[1]:.3f}")
        out["time_pairs"] = {}
        print()
        print("time to correct root cause on the faults both found (median s, paired):")
        for label, a_key, b_key in (("from onset, with checks", "ttrc_s", "ttrc_baseline_s"),
                                    ("from detection, with checks", "dtrc_s", "dtrc_baseline_s"),
                                    ("from onset, passive", "ttrc_passive_s", "ttrc_baseline_passive_s"),
                                    ("from onset, checks + cases", "ttrc_cases_s", "ttrc_baseline_s"),
                                    ("from onset, no suspicions", "ttrc_off_s", "ttrc_baseline_s"),
                                    ("suspicions on vs off", "ttrc_s", "ttrc_off_s")):
            pr = [(a, b) for r in rows for a, b in zip(r[a_key], r[b_key], strict=True)
                  if a is not None and b is not None]
            if not pr:
                continue
            ma, mb = statistics.median(a for a, _ in pr), statistics.median(b for _, b in pr)
            sa, sb = sum(a for a, _ in pr), sum(b for _, b in pr)
            gain = 1 - sa / sb if sb > 0 else None
            out["time_pairs"][label] = {"n": len(pr), "ours_median": ma, "baseline_median": mb,
                                        "ours_mean": sa / len(pr), "baseline_mean": sb / len(pr),
                                        "mean_reduction": gain}
            print(f"  {label:30} n={len(pr):3d}: ours {ma:6.2f} s, tree {mb:6.2f} s (medians); "
                  f"means {sa / len(pr):6.2f} vs {sb / len(pr):6.2f} s"
                  + (f" ({gain:+.0%} lower)" if gain is not None else ""))
        print()
        print("per kind, paired from onset (median s): ours / ours without suspicions / tree")
        out["time_by_kind"] = {}
        kinds_t: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for r in rows:
            for k, a, o, b in zip(r["kinds"], r["ttrc_s"], r["ttrc_off_s"], r["ttrc_baseline_s"],
                                  strict=True):
                if a is not None and b is not None and o is not None:
                    kinds_t[k].append((a, o, b))
        for k in sorted(kinds_t):
            v = kinds_t[k]
            m = [statistics.median(x[i] for x in v) for i in range(3)]
            out["time_by_kind"][k] = {"n": len(v), "ours": m[0], "ours_no_suspicions": m[1],
                                      "baseline": m[2]}
            print(f"  {k:16} n={len(v):3d}: {m[0]:7.2f} / {m[1]:7.2f} / {m[2]:7.2f}")
    # time to root cause, faults both found
    ours = [t for r in rows for t in r["ttrc_s"] if t is not None]
    base = [t for r in rows for t in r["ttrc_baseline_s"] if t is not None]
    both = [(a, b) for r in rows for a, b in zip(r["ttrc_s"], r["ttrc_baseline_s"], strict=True)
            if a is not None and b is not None]
    med = statistics.median(ours) if ours else None
    medb = statistics.median(base) if base else None
    medp = (statistics.median(a for a, _ in both), statistics.median(b for _, b in both)) if both else (None, None)
    out["time_to_root_cause_s"] = {"median": med, "baseline_median": medb,
                                   "paired_median": medp[0], "paired_baseline_median": medp[1],
                                   "paired_n": len(both), "n": len(ours), "baseline_n": len(base)}
    print()
    print(f"time to correct root cause: median {med} s (n={len(ours)}); baseline {medb} s "
          f"(n={len(base)}); on faults both found (n={len(both)}): {medp[0]} s vs {medp[1]} s")
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        if r["group"] != "single":
            continue
        k = r["kinds"][0]
        per[k]["n"] += 1
        per[k]["ours"] += int(r["_s"].pairs.tp == 1 and r["_s"].pairs.fp == 0)
        per[k]["ours_found"] += r["_s"].pairs.tp
        per[k]["base"] += int(r["_b"].pairs.tp == 1 and r["_b"].pairs.fp == 0)
        per[k]["base_found"] += r["_b"].pairs.tp
    print()
    print(f"{'single fault kind':18} {'n':>3} {'exact':>6} {'found':>6} {'base exact':>11} {'base found':>11}")
    for k, c in sorted(per.items()):
        print(f"{k:18} {c['n']:3d} {c['ours']:6d} {c['ours_found']:6d} {c['base']:11d} {c['base_found']:11d}")
        out["per_kind"][k] = dict(c)
    cpu = [sum(r["cpu_s"].values()) for r in rows]
    out["cores"] = round(statistics.median(cpu) / args.duration, 4) if cpu else None
    out["cpu_s_median"] = round(statistics.median(cpu), 3) if cpu else None
    out["cpu_by_part_median"] = {k: round(statistics.median(r["cpu_s"].get(k, 0.0) for r in rows), 3)
                                 for k in rows[0]["cpu_s"]} if rows else {}
    print(f"\nCPU per scenario (median): {out['cpu_s_median']} s for {args.duration:.0f} s simulated "
          f"= {out['cores']} core(s); by part {out['cpu_by_part_median']}")
    out["rows"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    out["config"] = {"servers": args.servers, "gpus": fabric.gpu_count, "duration_s": args.duration,
                     "tick_s": args.tick, "seed": args.seed, "single_per_kind": args.single,
                     "multi": args.multi, "clean": args.clean}
    out["machine"] = {"python": sys.version.split()[0], "platform": platform.platform(),
                      "cpus": os.cpu_count()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=256, help="rail-optimized servers x 8 GPUs (256: 2,048 GPUs)")
    ap.add_argument("--single", type=int, default=10, help="single-fault scenarios per kind")
    ap.add_argument("--multi", type=int, default=50, help="scenarios with 2-3 concurrent faults")
    ap.add_argument("--clean", type=int, default=20, help="fault-free scenarios")
    ap.add_argument("--duration", type=float, default=180.0, help="simulated seconds per scenario")
    ap.add_argument("--tick", type=float, default=5.0, help="correlation interval (s)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--hours", type=float, default=1.0,
                    help="also run this many fault-free simulated hours (0: skip)")
    ap.add_argument("--no-checks", action="store_true",
                    help="passive evidence only (no active checks on either side)")
    ap.add_argument("--no-suspicions", action="store_true",
                    help="instruments publish no suspicions (the suspicion channel off)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--partial", default="", help="also write the summary so far to this file "
                    "every 5%% of the scenarios")
    args = ap.parse_args()
    out = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
