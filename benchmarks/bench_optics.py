#!/usr/bin/env python3
"""Optics failure prediction: accuracy on unseen synthetic fleets, baselines, and speed.

Accuracy: fleets of the twin's generator that the shipped model never saw (seeds 200+, vendor
mixes with vendors absent from training, other failure-mode proportions and sampling
intervals; >= 1,500 modules, >= 21 days). Every day at 00:00 UTC from day 3, three methods
flag modules, on the same modules and times:

* ``model``: the shipped predictor (fabricscope.optics.predict.default_model), risk >= its
  threshold, after the link-pair attribution (predict.pair_attribution, as predict_fleet does;
  ``--no-pair-attribution``: the raw risks);
* ``threshold``: plain vendor threshold alarms (any metric of any lane beyond its warning in
  the last sample: grade.threshold_alarms);
* ``single-factor``: the single-factor grading score alone at needs-attention or worse
  (grade.single_factor_flags).

Scored by predict.episode_scores against the generator's truth (failure times, including
modules that fail after the window): "fails within 7 days, flagged >= 1 day ahead", module
level; false positives once per run of false flags, false alarms per 1,000 modules per day;
median lead time. With and without the sudden deaths (no precursor: nothing can see them).

Speed: one 10,000-module x 8-lane x 21-day fleet at 10-minute samples written with write_fleet
to a temporary folder, then read_history (timed apart), grade + predict at one time, peak RSS
(in a child process so that its RSS is its own); the folder is deleted afterwards.

Usage:
  python benchmarks/bench_optics.py                  # accuracy (3 fleets) + speed
  python benchmarks/bench_optics.py --only accuracy  # or: --only speed
  python benchmarks/bench_optics.py --quick          # 1 small fleet, no speed (smoke test)
Writes benchmarks/results/optics.json (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.optics.features import DAY_NS, HOUR_NS, feature_series
from fabricscope.optics.grade import grade_fleet, single_factor_flags, threshold_alarms
from fabricscope.optics.predict import (
    NO_FAILURE,
    EpisodeScores,
    Model,
    default_model,
    episode_scores,
    eval_times,
    model_inputs,
    pair_attribution,
    peer_rows,
    predict_fleet,
)
from fabricscope.optics.readers.table import read_history
from fabricscope.twin.optics_fleet import Fleet, FleetConfig, generate_fleet, write_fleet

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("model", "threshold", "single-factor")
ANCHORS = {"published optical-failure predictor": {"f1": 0.884, "median_lead_days": 1.1},
           "vendor claim (OPERATIONS.md section 2)": {"warning_accuracy": 0.95}}


def eval_fleets(quick: bool) -> list[tuple[int, FleetConfig, str]]:
    """Fleets not used in training (scripts/train_optics_model.py uses seeds 100-104)."""
    if quick:
        return [(200, FleetConfig(modules=400, days=14), "quick")]
    return [
        (200, FleetConfig(
            modules=1500, days=21, sample_s=600,
            vendor_mix={"Cobalt": 0.4, "Eagle": 0.4, "Acme": 0.2},
            mode_mix={"aging-laser": 0.2, "connector": 0.2, "bent-fiber": 0.15,
                      "hot-module": 0.15, "fec-degradation": 0.1, "sudden-death": 0.2}),
         "new vendor Eagle, more bent-fiber / hot / sudden, 600 s, 21 d"),
        (201, FleetConfig(
            modules=1800, days=24, sample_s=1200,
            vendor_mix={"Borealis": 0.7, "Fulcrum": 0.3},
            mode_mix={"aging-laser": 0.3, "connector": 0.3, "bent-fiber": 0.05,
                      "hot-module": 0.05, "fec-degradation": 0.2, "sudden-death": 0.1},
            fail_fraction=0.05, parked_fraction=0.05),
         "new vendor Fulcrum, aging / connector heavy, 1200 s, 24 d"),
        (202, FleetConfig(
            modules=1500, days=22, sample_s=450,
            vendor_mix={"Acme": 0.3, "Borealis": 0.2, "Cobalt": 0.2, "Eagle": 0.3},
            media_mix={"400GBASE-DR4": 0.3, "800GBASE-DR8": 0.35, "400GBASE-FR4": 0.15,
                       "400GBASE-SR8": 0.1, "100GBASE-SR4": 0.1},
            mode_mix={"aging-laser": 0.2, "connector": 0.15, "bent-fiber": 0.1,
                      "hot-module": 0.1, "fec-degradation": 0.3, "sudden-death": 0.15},
            fail_fraction=0.07, reseat_fraction=0.05),
         "FEC heavy, DR8 heavy, 450 s, 22 d"),
    ]


def fresh_fleets() -> list[tuple[int, FleetConfig, str]]:
    """Three more unseen fleets (seeds 300-302), defined with the randomized-training change
    and never used to choose anything: other sizes, intervals, vendor names, media and modes."""
    return [
        (300, FleetConfig(
            modules=2000, days=21, sample_s=1800,
            vendor_mix={"Borealis": 0.3, "Gamma": 0.4, "Cobalt": 0.3},
            media_mix={"400GBASE-DR4": 0.5, "800GBASE-DR8": 0.1, "400GBASE-FR4": 0.2,
                       "400GBASE-SR8": 0.1, "100GBASE-SR4": 0.1},
            mode_mix={"aging-laser": 0.35, "connector": 0.1, "bent-fiber": 0.1,
                      "hot-module": 0.1, "fec-degradation": 0.2, "sudden-death": 0.15},
            fail_fraction=0.05),
         "new vendor Gamma, 2,000 modules, 1800 s, aging / FEC heavy, 21 d"),
        (301, FleetConfig(
            modules=1500, days=21, sample_s=400,
            vendor_mix={"Acme": 0.5, "Helix": 0.5},
            mode_mix={"aging-laser": 0.1, "connector": 0.35, "bent-fiber": 0.25,
                      "hot-module": 0.05, "fec-degradation": 0.1, "sudden-death": 0.15},
            fail_fraction=0.06, parked_fraction=0.07, reseat_fraction=0.06),
         "new vendor Helix, 400 s, connector / bent-fiber heavy, more parked and reseats"),
        (302, FleetConfig(
            modules=2400, days=28, sample_s=900,
            vendor_mix={"Acme": 0.2, "Borealis": 0.2, "Iris": 0.3, "Jade": 0.3},
            media_mix={"400GBASE-DR4": 0.1, "800GBASE-DR8": 0.1, "400GBASE-FR4": 0.1,
                       "400GBASE-SR8": 0.35, "100GBASE-SR4": 0.35},
            mode_mix={"aging-laser": 0.15, "connector": 0.2, "bent-fiber": 0.05,
                      "hot-module": 0.25, "fec-degradation": 0.15, "sudden-death": 0.2},
            fail_fraction=0.08),
         "two new vendors, 2,400 modules, 28 d, 900 s, VCSEL heavy, hot-module heavy"),
    ]


def dev_fleets() -> list[tuple[int, FleetConfig, str]]:
    """Development fleets (seeds 105-110, generator defaults but the interval): error
    analysis only, never the final measurement."""
    return [(105 + k, FleetConfig(sample_s=s), f"dev, defaults, {s} s")
            for k, s in enumerate((600, 900, 300, 1200, 600, 1800))]


def _truth_fail(fleet: Fleet) -> tuple[np.ndarray, np.ndarray]:
    idx = fleet.history.modules.index()
    fail = np.full(len(fleet.history.modules), NO_FAILURE, dtype=np.int64)
    mode = np.array(["healthy"] * len(fail), dtype=object)
    for t in fleet.truth:
        i = idx[(t.device, t.port)]
        mode[i] = t.mode
        if t.failure_ts_ns is not None:
            fail[i] = int(t.failure_ts_ns)
    return fail, mode


CEILING_PROGRESS = (0.05, 0.2)


def _progress_at(t_ns: int, truth: Any, start_ns: int) -> float:
    """How far a failing module's degradation has gone at ``t_ns`` (0 at the onset, 1 at the
    failure), as the generator draws it: ((t - onset) / lead) ** shape, or for a connector that
    fails in steps the share of its steps already taken (at least 1 / steps after the first)."""
    on, fail = truth.onset_ts_ns, truth.failure_ts_ns
    if t_ns < on:
        return 0.0
    p = truth.params
    if "first_step_s" in p:
        first = start_ns + round(p["first_step_s"] * 1e9)
        return 0.0 if t_ns < first else 1.0 / p["steps"]
    return float(((t_ns - on) / max(fail - on, 1)) ** p.get("shape", 1.0))


def _ceiling(fleet: Fleet, times: list[int], flags: np.ndarray, fail: np.ndarray,
             evaluated: np.ndarray) -> dict[str, Any]:
    """What recall the protocol allows at all (sudden deaths excluded), beside the model's.

    Of the positives ``episode_scores`` counts (an evaluated time in [T - 7 d, T - 1 d]):
    ``reachable``, those with such a time at or after the onset of their degradation (an
    oracle that knew every onset could flag no more); ``progress>=X``, those whose degradation
    has gone at least X of the way to the failure (:func:`_progress_at`) by the last such time.
    ``f1_max`` is 2r / (1 + r) for that recall r at perfect precision. Uses the generator's
    truth: a bound on the benchmark, never an input to the model."""
    idx = fleet.history.modules.index()
    tt = np.asarray(times, dtype=np.int64)
    sets: dict[str, list[int]] = {"positives": [0, 0], "reachable": [0, 0]}
    for x in CEILING_PROGRESS:
        sets[f"progress>={x:g}"] = [0, 0]
    for tr in fleet.truth:
        if tr.mode in ("healthy", "sudden-death") or tr.failure_ts_ns is None:
            continue
        m = idx[(tr.device, tr.port)]
        T = int(fail[m])
        win = (tt >= T - 7 * DAY_NS) & (tt <= T - DAY_NS) & evaluated[:, m]
        if not win.any():
            continue
        hit = int((flags[:, m] & win).any())
        member = ["positives"]
        after = tt[win & (tt >= int(tr.onset_ts_ns))]
        if after.size:
            member.append("reachable")
            prog = _progress_at(int(after.max()), tr, fleet.config.start_ts_ns)
            member += [f"progress>={x:g}" for x in CEILING_PROGRESS if prog >= x]
        for k in member:
            sets[k][0] += 1
            sets[k][1] += hit
    return {k: {"modules": n, "model_hits": h} for k, (n, h) in sets.items()}


def _pool_ceiling(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Pooled ceiling rows: share of the positives, F1 at perfect precision, model recall
    within the set."""
    parts = [res[key] for res in results if key in res]
    names = list(parts[0]) if parts else []
    pos = sum(p["positives"]["modules"] for p in parts)
    out = {}
    for k in names:
        n = sum(p[k]["modules"] for p in parts)
        h = sum(p[k]["model_hits"] for p in parts)
        r = n / pos if pos else float("nan")
        out[k] = {"modules": n, "share_of_positives": round(r, 4),
                  "f1_max": round(2 * r / (1 + r), 4) if pos else float("nan"),
                  "model_hits": h, "model_recall_in_set": round(h / n, 4) if n else float("nan")}
    return out


def accuracy_fleet(seed: int, cfg: FleetConfig, model: Model, every_h: int = 24,
                   pairs: bool = True) -> dict[str, Any]:
    """Score the three methods on one fleet under the daily protocol (00:00 UTC) and, with
    ``every_h`` < 24, also flagging every ``every_h`` hours (the daily times are a subset).
    ``pairs``: the model's risks go through the link-pair attribution (predict_fleet's
    default; the cabling is the fleet's ``links``, never its truth)."""
    t0 = time.perf_counter()
    fleet = generate_fleet(cfg, seed=seed)
    t_gen = time.perf_counter() - t0
    h = fleet.history
    fail, mode = _truth_fail(fleet)
    daily = eval_times(h)
    times = eval_times(h, every_ns=every_h * HOUR_NS) if every_h < 24 else daily
    is_daily = np.isin(np.asarray(times, dtype=np.int64), np.asarray(daily, dtype=np.int64))
    if int(is_daily.sum()) != len(daily):
        raise SystemExit(f"fleet {seed}: the daily times are not a subset of the "
                         f"{every_h} h times")
    nm = len(h.modules)
    flags = {m: np.zeros((len(times), nm), dtype=bool) for m in METHODS}
    evaluated = np.zeros((len(times), nm), dtype=bool)
    risks: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    t1 = time.perf_counter()
    for e, f in enumerate(feature_series(h, times, peers=fleet.peers)):
        t = times[e]
        gr = grade_fleet(h, at_ns=t, peers=fleet.peers, features=f)
        mf, cols = model_inputs(f, gr, fleet.peers)
        idx = mf.module.astype(np.int64)
        x = np.stack([cols.get(c, np.full(idx.size, np.nan)) for c in model.feature_names],
                     axis=1)
        r = model.risk(x)
        if pairs:
            r, _ = pair_attribution(r, cols, peer_rows(mf, fleet.peers))
        alive = fail[idx] > t
        evaluated[e, idx[alive]] = True
        flags["model"][e, idx] = r >= model.threshold
        flags["threshold"][e] = threshold_alarms(h, at_ns=t)
        flags["single-factor"][e] = single_factor_flags(h, at_ns=t, peers=fleet.peers,
                                                        features=f)
        if is_daily[e]:
            risks.append(r[alive])
            labels.append((fail[idx][alive] <= t + model.horizon_ns).astype(np.int8))
    t_eval = time.perf_counter() - t1
    no_sd = mode != "sudden-death"
    out_fast: dict[str, Any] = {}
    ceiling_fast = (_ceiling(fleet, times, flags["model"], fail, evaluated)
                    if every_h < 24 else None)
    if every_h < 24:
        for m in METHODS:
            s_all = episode_scores(times, flags[m], fail, evaluated=evaluated)
            s_ex = episode_scores(times, flags[m], fail, evaluated=evaluated, include=no_sd)
            out_fast[m] = {"all": s_all.to_json(), "no_sudden_death": s_ex.to_json(),
                           "_all": s_all, "_ex": s_ex}
        times = daily
        evaluated = evaluated[is_daily]
        flags = {m: v[is_daily] for m, v in flags.items()}
    out: dict[str, Any] = {"seed": seed, "modules": nm, "days": cfg.days,
                           "sample_s": cfg.sample_s, "rows": len(h),
                           "vendor_mix": dict(cfg.vendor_mix), "mode_mix": dict(cfg.mode_mix),
                           "failures_in_window": len(fleet.labels),
                           "eval_times": len(times), "generate_s": round(t_gen, 1),
                           "evaluate_s": round(t_eval, 1), "methods": {}}
    for m in METHODS:
        s_all = episode_scores(times, flags[m], fail, evaluated=evaluated)
        s_ex = episode_scores(times, flags[m], fail, evaluated=evaluated, include=no_sd)
        out["methods"][m] = {"all": s_all.to_json(), "no_sudden_death": s_ex.to_json(),
                             "_all": s_all, "_ex": s_ex}
    # which modes the model catches (positives with a window)
    per_mode: dict[str, list[int]] = {}
    for md in sorted(set(mode.tolist()) - {"healthy"}):
        sel = mode == md
        s = episode_scores(times, flags["model"], fail, evaluated=evaluated, include=sel)
        per_mode[md] = [s.tp, s.tp + s.fn]
    out["model_recall_by_mode"] = per_mode
    out["ceiling"] = _ceiling(fleet, times, flags["model"], fail, evaluated)
    if out_fast:
        out["every_h"] = every_h
        out["methods_every_h"] = out_fast
        out["ceiling_every_h"] = ceiling_fast
    out["_debug"] = (times, flags["model"], fail, mode, evaluated)
    positives = out["methods"]["model"]["_all"].tp + out["methods"]["model"]["_all"].fn
    positives_ex = out["methods"]["model"]["_ex"].tp + out["methods"]["model"]["_ex"].fn
    out["sudden_death_share_of_positives"] = round(1 - positives_ex / max(positives, 1), 4)
    r = np.concatenate(risks)
    y = np.concatenate(labels)
    out["brier"] = round(float(np.mean((r - y) ** 2)), 5)
    out["_calib"] = (r, y)
    return out


def _pool(results: list[dict[str, Any]], method: str, key: str, protocol: str = "methods"
          ) -> EpisodeScores:
    parts = [res[protocol][method][key] for res in results]
    tp, fp, fn = (sum(getattr(p, a) for p in parts) for a in ("tp", "fp", "fn"))
    nf = sum(p.false_flags for p in parts)
    md = sum(p.module_days for p in parts)
    leads = tuple(x for p in parts for x in p.lead_days)
    return EpisodeScores(tp, fp, fn, tp / (tp + fp) if tp + fp else float("nan"),
                         tp / (tp + fn) if tp + fn else float("nan"),
                         2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan"),
                         nf, md, 1000.0 * nf / md if md else float("nan"), leads)


def _calibration_table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = np.concatenate([res["_calib"][0] for res in results])
    y = np.concatenate([res["_calib"][1] for res in results])
    edges = [0.0, 0.01, 0.05, 0.2, 0.5, 0.8, 1.0001]
    out = []
    for a, b in itertools.pairwise(edges):
        sel = (r >= a) & (r < b)
        if sel.any():
            out.append({"risk_bin": f"{a:g}-{min(b, 1):g}", "examples": int(sel.sum()),
                        "mean_risk": round(float(r[sel].mean()), 4),
                        "observed_rate": round(float(y[sel].mean()), 4)})
    return out


def _false_flag_causes(fleet: Fleet, res: dict[str, Any]) -> dict[str, int]:
    """Where the model's false-flag runs come from (development fleets only): the module's
    truth (a failing module flagged > 7 days ahead, a late degrader, the far end of a failing
    link, a nuisance) per run of consecutive false flags."""
    times, flags, fail, mode, ev = res["_debug"]
    idx = fleet.history.modules.index()
    peer_of_failing: set[int] = set()
    nuis: dict[int, str] = {}
    late: set[int] = set()
    for t in fleet.truth:
        i = idx[(t.device, t.port)]
        if t.nuisances:
            nuis[i] = "+".join(sorted(t.nuisances))
        if t.mode != "healthy" and not t.fails_in_window:
            late.add(i)
        if t.mode != "healthy" and t.peer:
            d, _, pt = t.peer.rpartition(":")
            j = idx.get((d, pt))
            if j is not None:
                peer_of_failing.add(j)
    tt = np.asarray(times, dtype=np.int64)
    T = fail[None, :].astype(np.float64)
    within = (fail[None, :] != NO_FAILURE) & (tt[:, None] < T) & (tt[:, None] + 7 * DAY_NS >= T)
    false = flags & ev & ~within
    causes: Counter[str] = Counter()
    for m in np.flatnonzero(false.any(axis=0)).tolist():
        col = false[:, m]
        runs = int(col[0]) + int((col[1:] & ~col[:-1]).sum())
        if fail[m] != NO_FAILURE:
            why = f"fails later ({mode[m]}), flagged > 7 d ahead"
        elif m in late:
            why = "degrading, fails after the window"
        elif m in peer_of_failing:
            why = "far end of a failing / degrading link"
        elif m in nuis:
            why = f"nuisance: {nuis[m]}"
        else:
            why = "healthy, no nuisance"
        causes[why] += runs
    return dict(causes.most_common())


def _miss_causes(fleet: Fleet, res: dict[str, Any]) -> dict[str, int]:
    """Why the model missed failing modules (development fleets only): sudden death, a lead
    (onset to failure) under 2 days, an onset before the first sample, or none of these, by
    mode."""
    times, flags, fail, _, ev = res["_debug"]
    idx = fleet.history.modules.index()
    tt = np.asarray(times, dtype=np.int64)[:, None]
    T = fail[None, :].astype(np.float64)
    window = (fail[None, :] != NO_FAILURE) & (tt >= T - 7 * DAY_NS) & (tt <= T - DAY_NS) & ev
    missed = window.any(axis=0) & ~(flags & window).any(axis=0)
    start = int(fleet.history.ts.min())
    causes: Counter[str] = Counter()
    for t in fleet.truth:
        i = idx[(t.device, t.port)]
        if not missed[i]:
            continue
        lead = ((t.failure_ts_ns or 0) - (t.onset_ts_ns or 0)) / DAY_NS
        if t.mode == "sudden-death":
            why = "sudden-death"
        elif lead < 2:
            why = f"{t.mode}: lead < 2 d"
        elif (t.onset_ts_ns or 0) < start:
            why = f"{t.mode}: onset before the first sample"
        else:
            why = f"{t.mode}: other"
        causes[why] += 1
    return dict(sorted(causes.items()))


def _print_table(title: str, results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    pooled = {}
    print(f"\n{title}          F1 all   F1 no-SD  precision  recall  FA/1k/day  median lead d")
    for meth in METHODS:
        a, e = _pool(results, meth, "_all", key), _pool(results, meth, "_ex", key)
        pooled[meth] = {"all": a.to_json(), "no_sudden_death": e.to_json()}
        print(f"  {meth:28s} {a.f1:7.3f}  {e.f1:8.3f}  {e.precision:9.3f}  {e.recall:6.3f}  "
              f"{e.false_alarms_per_1000_per_day:9.2f}  {e.median_lead_days:8.2f}")
    return pooled


def run_accuracy(fleets: list[tuple[int, FleetConfig, str]], model: Model, every_h: int,
                 analyse: bool = False, pairs: bool = True) -> dict[str, Any]:
    """Score the model and both baselines on ``fleets`` (daily protocol and every ``every_h``
    hours), pooled and per fleet, with the calibration table."""
    results = []
    for seed, cfg, note in fleets:
        res = accuracy_fleet(seed, cfg, model, every_h, pairs)
        res["note"] = note
        if analyse:
            fl = generate_fleet(cfg, seed=seed)
            res["model_false_flag_runs_by_cause"] = _false_flag_causes(fl, res)
            res["model_misses_by_cause"] = _miss_causes(fl, res)
            del fl
        res.pop("_debug")
        results.append(res)
        print(f"fleet seed {seed} ({note}): {res['rows']:,} rows, {res['eval_times']} days, "
              f"generate {res['generate_s']} s, evaluate {res['evaluate_s']} s", flush=True)
        for key, label in (("methods", "daily"), ("methods_every_h", f"every {every_h} h")):
            if key not in res:
                continue
            for meth in METHODS:
                a, e = res[key][meth]["_all"], res[key][meth]["_ex"]
                print(f"  [{label:>10s}] {meth:14s} F1 {a.f1:.3f} (no sudden {e.f1:.3f})  "
                      f"P {e.precision:.3f} R {e.recall:.3f}  FA/1k/day "
                      f"{e.false_alarms_per_1000_per_day:.2f}  lead {e.median_lead_days:.2f} d",
                      flush=True)
        print(f"  model recall by mode: {res['model_recall_by_mode']}")
        if analyse:
            print(f"  model false-flag runs by cause: {res['model_false_flag_runs_by_cause']}")
            print(f"  model misses by cause: {res['model_misses_by_cause']}")
    pooled = _print_table("pooled, daily at 00:00  ", results, "methods")
    pooled_fast = (_print_table(f"pooled, every {every_h} h     ", results, "methods_every_h")
                   if every_h < 24 else None)
    ceilings = {}
    for key, label in (("ceiling", "daily at 00:00"), ("ceiling_every_h", f"every {every_h} h")):
        pooled_c = _pool_ceiling(results, key)
        if not pooled_c:
            continue
        ceilings[key] = pooled_c
        print(f"\nwhat the protocol allows ({label}; sudden deaths excluded; from the truth):")
        print("  set                modules  share  F1 at precision 1  model recall in set")
        for k, row in pooled_c.items():
            print(f"  {k:17s} {row['modules']:8d}  {row['share_of_positives']:5.3f}  "
                  f"{row['f1_max']:17.3f}  {row['model_recall_in_set']:8.3f}")
    calib = _calibration_table(results)
    print("\ncalibration (daily examples, label: fails within 7 days):")
    for row in calib:
        print(f"  risk {row['risk_bin']:9s} n={row['examples']:6d}  mean risk "
              f"{row['mean_risk']:.4f}  observed {row['observed_rate']:.4f}")
    for res in results:
        res.pop("_calib")
        for key in ("methods", "methods_every_h"):
            for meth in res.get(key, {}):
                res[key][meth].pop("_all")
                res[key][meth].pop("_ex")
    return {"fleets": results, "pooled": pooled, "pooled_every_h": pooled_fast,
            "every_h": every_h, "calibration": calib, "anchors": ANCHORS,
            "ceiling": ceilings,
            "pair_attribution": pairs,
            "model": {"threshold": model.threshold, "features": len(model.feature_names),
                      "trained_on_seeds": [f["seed"] for f in
                                           model.metadata.get("fleets", [])]}}


def _read_links(path: Path) -> dict[str, str]:
    peers: dict[str, str] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            a = f"{row['device_a']}:{row['port_a']}"
            b = f"{row['device_b']}:{row['port_b']}"
            peers[a], peers[b] = b, a
    return peers


def speed_child(folder: str) -> dict[str, Any]:
    """Read, grade and predict the written fleet (runs in its own process)."""
    d = Path(folder)
    t0 = time.perf_counter()
    h = read_history(d / "history.parquet")
    t1 = time.perf_counter()
    peers = _read_links(d / "links.csv")
    at = int(h.ts.max()) // DAY_NS * DAY_NS
    t2 = time.perf_counter()
    gr = grade_fleet(h, at_ns=at, peers=peers)
    t3 = time.perf_counter()
    pred = predict_fleet(h, at_ns=at, peers=peers, grades=gr)
    t4 = time.perf_counter()
    js = pred.to_json()
    t5 = time.perf_counter()
    return {"rows": len(h), "modules": len(h.modules), "read_s": round(t1 - t0, 1),
            "grade_s": round(t3 - t2, 1), "predict_s": round(t4 - t3, 1),
            "json_s": round(t5 - t4, 1), "grade_predict_s": round(t5 - t2, 1),
            "predicted_failures": js["summary"]["predicted_failures"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def run_speed(modules: int, days: float, folder: str | None = None) -> dict[str, Any]:
    cfg = FleetConfig(modules=modules, days=days, sample_s=600,
                      media_mix={"800GBASE-DR8": 0.5, "400GBASE-SR8": 0.5})
    tmp = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="bench_optics_", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        if folder and (tmp / "history.parquet").exists():  # written before with these settings
            rows = -1
        else:
            rows = write_fleet(cfg, tmp, seed=300).rows
        t_write = time.perf_counter() - t0
        size = (tmp / "history.parquet").stat().st_size
        print(f"speed fleet: {rows:,} rows written in {t_write:.0f} s "
              f"({size / 1e9:.2f} GB)", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--speed-child", str(tmp)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-3:] or [
                f"exit status {proc.returncode}" + (" (killed: out of memory?)"
                                                    if proc.returncode == -9 else "")]
            print("speed child failed: " + " | ".join(tail))
            return {"error": " | ".join(tail), "write_s": round(t_write)}
        res: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        res.update({"write_s": round(t_write), "parquet_gb": round(size / 1e9, 2),
                    "fleet": f"{modules} modules x 8 lanes x {days:g} d, 600 s"})
        print(f"  read_history {res['read_s']} s; grade {res['grade_s']} s + predict "
              f"{res['predict_s']} s + JSON {res['json_s']} s = {res['grade_predict_s']} s; "
              f"peak RSS {res['peak_rss_mb']} MB", flush=True)
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("accuracy", "speed"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--speed-modules", type=int, default=10_000)
    ap.add_argument("--speed-days", type=float, default=21.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "optics.json"))
    ap.add_argument("--speed-dir", help="a folder where write_fleet already wrote the speed "
                    "fleet (seed 300, same settings); deleted afterwards")
    ap.add_argument("--speed-child", help=argparse.SUPPRESS)
    ap.add_argument("--fleets", default="eval,fresh",
                    help="comma-separated fleet sets: eval (seeds 200-202), fresh (300-302), "
                         "dev (105-110: error analysis, never the final measurement)")
    ap.add_argument("--every-h", type=int, default=6, choices=(1, 2, 3, 4, 6, 8, 12, 24),
                    help="also flag every N hours (24: the daily protocol only)")
    ap.add_argument("--model", help="a model file instead of the shipped one")
    ap.add_argument("--seeds", help="only these seeds of the chosen sets (comma-separated)")
    ap.add_argument("--no-pair-attribution", action="store_true",
                    help="score the model's risks as they are, without the link-pair "
                         "attribution (the model before it)")
    args = ap.parse_args(argv)
    if args.speed_child:
        print(json.dumps(speed_child(args.speed_child)))
        return 0
    out: dict[str, Any] = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                       "load_avg_start": list(os.getloadavg()),
                                       "python": platform.python_version()},
                           "command": "python benchmarks/bench_optics.py "
                                      + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.only in (None, "accuracy"):
        model = Model.load(args.model) if args.model else default_model()
        sets = {"eval": eval_fleets(args.quick), "fresh": fresh_fleets(), "dev": dev_fleets()}
        for name in args.fleets.split(","):
            if name not in sets:
                print(f"bench_optics: --fleets: unknown set {name!r} (eval, fresh, dev)",
                      file=sys.stderr)
                return 2
            print(f"\n=== fleets: {name} ===", flush=True)
            key = "accuracy" if name == "eval" else f"accuracy_{name}"
            chosen = sets[name] if not args.quick or name == "eval" else sets[name][:1]
            if args.seeds:
                want = {int(x) for x in args.seeds.split(",")}
                chosen = [f for f in chosen if f[0] in want]
            out[key] = run_accuracy(chosen, model, args.every_h, analyse=name == "dev",
                                    pairs=not args.no_pair_attribution)
    if args.only in (None, "speed") and not args.quick:
        out["speed"] = run_speed(args.speed_modules, args.speed_days, args.speed_dir)
    out["machine"]["load_avg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, default=lambda o: o if not isinstance(o, Counter) else
                  dict(o))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
