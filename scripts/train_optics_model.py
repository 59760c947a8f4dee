#!/usr/bin/env python3
"""Train the shipped optics failure predictor (src/fabricscope/optics/model_default.json).

Eleven domain-randomized synthetic fleets of the twin's generator
(fabricscope.twin.optics_fleet; random_config: 900-1,500 modules, 16-28 days, sampling
300-1,800 s, random vendor mixes with vendors the generator has no profile for, media and
failure-mode mixes, nuisance shares), seeds 111-121: 6 train, 2 stop the boosting early, 3
calibrate and choose the threshold (predict.train by fleet). Examples every 12 hours (the phase
alternating by fleet; modules already failed left out, times whose 7-day horizon passes the end
of the labels left out), LightGBM seed 0. Seeds 105-110 are the development fleets, 200-202 and
300-302 the benchmark's (benchmarks/bench_optics.py): never trained on.

Usage (about 6 minutes on a 2-core machine, peak RSS about 4.6 GB):
  python scripts/train_optics_model.py                    # writes the shipped model
  python scripts/train_optics_model.py --out /tmp/m.json  # elsewhere
  python scripts/train_optics_model.py --quick            # 3 small fleets, for a smoke test
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.optics.features import HOUR_NS
from fabricscope.optics.predict import NO_FAILURE, Examples, train, training_examples
from fabricscope.optics.readers.table import Labels
from fabricscope.twin.optics_fleet import Fleet, FleetConfig, generate_fleet

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "src" / "fabricscope" / "optics" / "model_default.json"


@dataclass(frozen=True)
class TrainFleet:
    seed: int
    config: FleetConfig
    note: str
    role: str = "train"  # train / validation (early stopping) / calibration (isotonic, threshold)


KNOWN_VENDORS = ("Acme", "Borealis", "Cobalt")
MEDIA = ("400GBASE-DR4", "800GBASE-DR8", "400GBASE-FR4", "400GBASE-SR8", "100GBASE-SR4")
FAIL_MODES = ("aging-laser", "connector", "bent-fiber", "hot-module", "fec-degradation")


def random_config(rng: np.random.Generator, *, modules: tuple[int, int] = (900, 1500),
                  days: tuple[float, float] = (16.0, 28.0)) -> tuple[FleetConfig, str]:
    """A domain-randomized fleet: size, duration, sampling interval (300-1,800 s, log-uniform),
    vendor mix (a random subset of the generator's vendors plus 0-2 vendors it has no profile
    for, so their offsets are drawn from the seed), media mix, failure-mode proportions
    (Dirichlet; sudden deaths 5-25 %), failing / parked / reseat shares. The model should learn
    the failure class, not one generator setting."""
    n_known = int(rng.integers(1, 4))
    vendors = list(rng.choice(KNOWN_VENDORS, size=n_known, replace=False))
    vendors += [f"Unseen{int(rng.integers(0, 10**6))}" for _ in range(int(rng.integers(0, 3)))]
    vw = rng.dirichlet(np.full(len(vendors), 2.0))
    media = rng.dirichlet(np.full(len(MEDIA), 1.5))
    mw = rng.dirichlet(np.full(len(FAIL_MODES), 1.5))
    sd = float(rng.uniform(0.05, 0.25))
    mode_mix = {m: float(w) * (1 - sd) for m, w in zip(FAIL_MODES, mw, strict=True)}
    mode_mix["sudden-death"] = sd
    sample_s = int(round(float(np.exp(rng.uniform(np.log(300), np.log(1800)))) / 30) * 30)
    cfg = FleetConfig(
        modules=int(rng.integers(modules[0], modules[1] + 1)) // 2 * 2,
        days=round(float(rng.uniform(*days)), 1), sample_s=sample_s,
        vendor_mix={v: float(w) for v, w in zip(vendors, vw, strict=True)},
        media_mix={m: float(w) for m, w in zip(MEDIA, media, strict=True)},
        mode_mix=mode_mix, fail_fraction=round(float(rng.uniform(0.04, 0.09)), 3),
        late_fraction=round(float(rng.uniform(0.005, 0.02)), 3),
        parked_fraction=round(float(rng.uniform(0.02, 0.07)), 3),
        reseat_fraction=round(float(rng.uniform(0.02, 0.06)), 3))
    note = (f"randomized: {cfg.modules} modules, {cfg.days:g} d, {cfg.sample_s} s, vendors "
            f"{'/'.join(vendors)}")
    return cfg, note


def _fleets(quick: bool, n_train: int, n_val: int, n_cal: int) -> list[TrainFleet]:
    """Randomized fleets, seeds 111+ in order train, validation, calibration (seeds 105-110
    are the development fleets and 200+ the benchmark's: never trained on)."""
    if quick:
        return [TrainFleet(100, FleetConfig(modules=400, days=14), "quick"),
                TrainFleet(101, FleetConfig(modules=400, days=14, sample_s=900,
                                            fail_fraction=0.1), "quick", "validation"),
                TrainFleet(102, FleetConfig(modules=400, days=14, sample_s=1200,
                                            fail_fraction=0.1), "quick", "calibration")]
    out = []
    rng = np.random.default_rng(np.random.SeedSequence(20261202))
    roles = ["train"] * n_train + ["validation"] * n_val + ["calibration"] * n_cal
    for k, role in enumerate(roles):
        cfg, note = random_config(rng)
        out.append(TrainFleet(111 + k, cfg, note, role))
    return out


def fleet_labels(fleet: Fleet) -> Labels:
    """The fleet's failure labels as the labels reader returns them."""
    lab = fleet.labels
    return Labels(device=tuple(x.device for x in lab), port=tuple(x.port for x in lab),
                  serial=tuple(x.serial for x in lab),
                  failure_ts=np.array([x.failure_ts_ns for x in lab], dtype=np.int64),
                  cause=tuple(x.cause for x in lab))


def subsample_healthy(ex: Examples, fraction: float, rng: np.random.Generator) -> Examples:
    """Keep every example of a module that fails, and ``fraction`` of the modules that never
    do (whole modules, so that a kept module keeps all its days)."""
    mods = np.unique(ex.groups[ex.fail_ts == NO_FAILURE])
    keep_mod = mods[rng.random(mods.size) < fraction]
    keep = (ex.fail_ts != NO_FAILURE) | np.isin(ex.groups, keep_mod)
    return Examples(ex.X[keep], ex.y[keep], ex.groups[keep], ex.times[keep], ex.names,
                    ex.fail_ts[keep])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0, help="LightGBM seed")
    ap.add_argument("--train-fleets", type=int, default=6)
    ap.add_argument("--validation-fleets", type=int, default=2)
    ap.add_argument("--every-h", type=int, default=12, choices=(6, 12, 24),
                    help="hours between the examples' evaluation times")
    ap.add_argument("--calibration-fleets", type=int, default=3)
    ap.add_argument("--healthy-fraction", type=float, default=1.0,
                    help="share of the examples of never-failing modules kept in the training "
                         "fleets (memory); validation and calibration fleets keep all")
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    examples: dict[str, list[Examples]] = {"train": [], "validation": [], "calibration": []}
    fleets_meta: list[dict[str, Any]] = []
    rng = np.random.default_rng(args.seed)
    for tf in _fleets(args.quick, args.train_fleets, args.validation_fleets,
                      args.calibration_fleets):
        t0 = time.perf_counter()
        fleet = generate_fleet(tf.config, seed=tf.seed)
        t1 = time.perf_counter()
        # every `--every-h` hours, the phase alternating by fleet: flags are raised at any
        # hour of the day (the diurnal cycle must not look like a fault at 06:00 only)
        every = args.every_h * HOUR_NS
        offset = 0 if tf.role == "calibration" else (len(fleets_meta) * 6 * HOUR_NS) % every
        ex = training_examples(fleet.history, fleet_labels(fleet), peers=fleet.peers,
                               eval_every_ns=every, eval_offset_ns=offset)
        n_all = int(ex.y.shape[0])
        if tf.role == "train" and args.healthy_fraction < 1.0:
            ex = subsample_healthy(ex, args.healthy_fraction, rng)
        t2 = time.perf_counter()
        examples[tf.role].append(ex)
        c = tf.config
        fleets_meta.append({"seed": tf.seed, "role": tf.role, "note": tf.note,
                            "modules": c.modules, "days": c.days, "sample_s": c.sample_s,
                            "vendor_mix": dict(c.vendor_mix), "mode_mix": dict(c.mode_mix),
                            "media_mix": dict(c.media_mix), "fail_fraction": c.fail_fraction,
                            "parked_fraction": c.parked_fraction,
                            "reseat_fraction": c.reseat_fraction,
                            "eval_every_h": args.every_h, "eval_offset_h": offset // HOUR_NS,
                            "rows": len(fleet.history), "labels": len(fleet.labels),
                            "examples_all": n_all,
                            "examples": int(ex.y.shape[0]), "positives": int(ex.y.sum())})
        print(f"fleet seed {tf.seed} [{tf.role}] {tf.note}: {len(fleet.history):,} rows, "
              f"{len(fleet.labels)} labels; generate {t1 - t0:.1f} s, examples {t2 - t1:.1f} s "
              f"({ex.y.shape[0]:,} of {n_all:,} rows, {int(ex.y.sum())} positive)", flush=True)
        del fleet
    t3 = time.perf_counter()
    meta = {"trained_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "script": "scripts/train_optics_model.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "fleets": fleets_meta, "generator": "fabricscope.twin.optics_fleet",
            "healthy_fraction": args.healthy_fraction}
    model = train(examples["train"], seed=args.seed, metadata=meta,
                  validation=examples["validation"], calibration=examples["calibration"])
    t4 = time.perf_counter()
    model.save(args.out)
    size = os.path.getsize(args.out)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"trained in {t4 - t3:.1f} s: {model.metadata['rounds']} rounds, threshold "
          f"{model.threshold:.3f}, calibration-block F1 {model.metadata['calibration_f1']:.3f}")
    print(f"wrote {args.out} ({size / 1e6:.2f} MB); total {t4 - t_all:.0f} s, peak RSS "
          f"{rss:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
