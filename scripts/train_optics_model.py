#!/usr/bin/env python3
"""Train the shipped optics failure predictor (src/fabricscope/optics/model_default.json).

Five synthetic fleets of the twin's generator (fabricscope.twin.optics_fleet), seeds 100-104,
1,500 modules each, 21-28 days, sampled every 300 / 600 / 900 s, with different vendor mixes
(one vendor, "Dynamo", unknown to the generator's profiles: its offsets are drawn from the
seed), media mixes and failure-mode proportions. Daily examples from day 3 (modules already
failed left out, times whose 7-day horizon passes the end of the labels left out), then
fabricscope.optics.predict.train with seed 0. The benchmark (benchmarks/bench_optics.py) uses
other seeds (200+) and other mixes.

Usage (about 5-8 minutes on a 2-core machine):
  python scripts/train_optics_model.py                    # writes the shipped model
  python scripts/train_optics_model.py --out /tmp/m.json  # elsewhere
  python scripts/train_optics_model.py --quick            # 2 small fleets, for a smoke test
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

from fabricscope.optics.predict import Examples, train, training_examples
from fabricscope.optics.readers.table import Labels
from fabricscope.twin.optics_fleet import Fleet, FleetConfig, generate_fleet

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "src" / "fabricscope" / "optics" / "model_default.json"


@dataclass(frozen=True)
class TrainFleet:
    seed: int
    config: FleetConfig
    note: str


def _fleets(quick: bool) -> list[TrainFleet]:
    base = FleetConfig()
    if quick:
        return [TrainFleet(100, FleetConfig(modules=400, days=14), "quick"),
                TrainFleet(101, FleetConfig(modules=400, days=14, sample_s=900,
                                            fail_fraction=0.1), "quick")]
    return [
        TrainFleet(100, base, "generator defaults, 600 s, 21 d"),
        TrainFleet(101, FleetConfig(
            sample_s=300, vendor_mix={"Acme": 0.2, "Borealis": 0.3, "Cobalt": 0.5},
            mode_mix={"aging-laser": 0.4, "connector": 0.2, "bent-fiber": 0.05,
                      "hot-module": 0.1, "fec-degradation": 0.1, "sudden-death": 0.15},
            fail_fraction=0.07), "aging-heavy, 300 s, 21 d"),
        TrainFleet(102, FleetConfig(
            sample_s=900, days=28, vendor_mix={"Acme": 0.6, "Dynamo": 0.4},
            mode_mix={"aging-laser": 0.15, "connector": 0.35, "bent-fiber": 0.2,
                      "hot-module": 0.05, "fec-degradation": 0.1, "sudden-death": 0.15},
            fail_fraction=0.08), "connector / bent-fiber heavy, unknown vendor, 900 s, 28 d"),
        TrainFleet(103, FleetConfig(
            sample_s=600, days=28, vendor_mix={"Borealis": 0.5, "Cobalt": 0.3, "Dynamo": 0.2},
            mode_mix={"aging-laser": 0.15, "connector": 0.15, "bent-fiber": 0.1,
                      "hot-module": 0.2, "fec-degradation": 0.25, "sudden-death": 0.15},
            fail_fraction=0.06, parked_fraction=0.06), "FEC / hot heavy, more parked, 600 s, 28 d"),
        TrainFleet(104, FleetConfig(
            sample_s=900, days=24,
            media_mix={"400GBASE-DR4": 0.2, "800GBASE-DR8": 0.2, "400GBASE-FR4": 0.1,
                       "400GBASE-SR8": 0.25, "100GBASE-SR4": 0.25},
            fail_fraction=0.07, reseat_fraction=0.05), "VCSEL-heavy media, more reseats, 900 s, 24 d"),
    ]


def fleet_labels(fleet: Fleet) -> Labels:
    """The fleet's failure labels as the labels reader returns them."""
    lab = fleet.labels
    return Labels(device=tuple(x.device for x in lab), port=tuple(x.port for x in lab),
                  serial=tuple(x.serial for x in lab),
                  failure_ts=np.array([x.failure_ts_ns for x in lab], dtype=np.int64),
                  cause=tuple(x.cause for x in lab))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0, help="LightGBM seed")
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    examples: list[Examples] = []
    fleets_meta: list[dict[str, Any]] = []
    for tf in _fleets(args.quick):
        t0 = time.perf_counter()
        fleet = generate_fleet(tf.config, seed=tf.seed)
        t1 = time.perf_counter()
        ex = training_examples(fleet.history, fleet_labels(fleet), peers=fleet.peers)
        t2 = time.perf_counter()
        examples.append(ex)
        c = tf.config
        fleets_meta.append({"seed": tf.seed, "note": tf.note, "modules": c.modules,
                            "days": c.days, "sample_s": c.sample_s,
                            "vendor_mix": dict(c.vendor_mix), "mode_mix": dict(c.mode_mix),
                            "media_mix": dict(c.media_mix), "fail_fraction": c.fail_fraction,
                            "rows": len(fleet.history), "labels": len(fleet.labels),
                            "examples": int(ex.y.shape[0]), "positives": int(ex.y.sum())})
        print(f"fleet seed {tf.seed}: {len(fleet.history):,} rows, {len(fleet.labels)} labels; "
              f"generate {t1 - t0:.1f} s, examples {t2 - t1:.1f} s ({ex.y.shape[0]:,} rows, "
              f"{int(ex.y.sum())} positive)", flush=True)
        del fleet
    t3 = time.perf_counter()
    meta = {"trained_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "script": "scripts/train_optics_model.py" + (" --quick" if args.quick else ""),
            "fleets": fleets_meta, "generator": "fabricscope.twin.optics_fleet"}
    model = train(examples, seed=args.seed, metadata=meta)
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
