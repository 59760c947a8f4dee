"""Advisor speed (issue 15): `fabricscope diagnose` on a day of stored findings, telemetry and
probes of a 2,048-GPU twin. Prints a table and writes benchmarks/results/advisor.json.

    python benchmarks/bench_advisor.py            # 2,048 GPUs (about 10 min on 2 busy cores)
    python benchmarks/bench_advisor.py --quick    # 256 GPUs, a smaller day: a smoke pass

What is stored (seeded):

* fault scenarios (gray-loss, link-flap, pfc-storm, optic-degrading, nic-fault, cpu-starved,
  slow-nic, congestion) run through every twin instrument of the closed loop (telemetry with
  suppress-redundant, probe mesh, straggler, optics; service/instruments) for
  ``--scenario-s`` each; their findings are replicated shifted in time, one episode every
  ``--every-min`` minutes over 24 h (cycling through the scenarios);
* a diagnosis store (``supervise --db``) holding every instrument's findings of that day;
* a telemetry store (``gnmi collect --db``) holding the telemetry detectors' findings of that
  day plus raw telemetry rows: every detector leaf of every switch port (the names, targets and
  tags the instrument's subscription produced) at 10 s, generated in time order from 00:00 for
  at most ``--raw-s`` seconds of generation; the fraction of the day stored is printed;
* a probe store holding the mesh's probes (20 probes/s per NIC, the probe instrument's rate)
  of ``--probe-window-s`` seconds around the gray link of the episode at 12:00.

Then ``advise(...)`` is timed (``--repeats``, median wall and CPU) on: the findings store
(whole day, and a one-hour window), the telemetry store, the probe window (whole and its
first 30 s), and all three with ``--subject`` on the probe window; then the command itself,
``fabricscope diagnose --probes`` on the probe window, from process start to the printed
answer (what an operator waits for: imports and the inventory included).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fabricscope.diagnosis.model import Observed
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.probe.analysis import Observations
from fabricscope.service.advisor import Inputs, advise
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.probe import ProbeInstrument
from fabricscope.service.instruments.telemetry import TelemetryInstrument
from fabricscope.service.supervise_twin import NS, default_instruments
from fabricscope.sim.faults import FaultSchedule
from fabricscope.store.findings import DiagnosisStore
from fabricscope.store.probes import ProbeStore
from fabricscope.store.telemetry import TelemetryStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_diagnosis import _job_gpus, random_fault

RESULTS = Path(__file__).resolve().parent / "results" / "advisor.json"
KINDS = ("gray-loss", "link-flap", "pfc-storm", "optic-degrading", "nic-fault", "cpu-starved",
         "slow-nic", "congestion")
DAY_NS = 86_400 * NS
NOON_NS = 43_200 * NS
TARGET_S = 5.0


def shifted(o: Observed, dt: int) -> Observed:
    f = o.finding
    return Observed(o.source, replace(f, window=(f.window[0] + dt, f.window[1] + dt)),
                    o.reported_ns + dt)


def run_scenarios(fabric: Fabric, args: argparse.Namespace) -> tuple[list[dict[str, Any]], set[
        tuple[str, str, str]]]:
    """Every instrument on each scenario; also the distinct telemetry leaves (target, name, tags)."""
    leaves: set[tuple[str, str, str]] = set()

    def keep(events: Any) -> None:
        for e in events:
            leaves.add((e.target, e.name, json.dumps(dict(e.tags), sort_keys=True)))

    instruments = default_instruments()
    for ins in instruments:
        if isinstance(ins, TelemetryInstrument):
            ins.on_events = keep
    rng = np.random.default_rng(args.seed)
    jg = _job_gpus(fabric, instruments, ScenarioSpec(fabric, [], args.scenario_s, args.seed))
    out = []
    for n, kind in enumerate(KINDS[: args.scenarios]):
        fault = random_fault(fabric, kind, rng, int(rng.uniform(20, 40) * NS), jg, set())
        spec = ScenarioSpec(fabric, [fault], args.scenario_s, args.seed * 1000 + n)
        t0 = time.perf_counter()
        found: list[Observed] = []
        for ins in instruments:
            found.extend(ins.run(spec))
        found.sort(key=lambda o: (o.reported_ns, o.source, o.id))
        by: dict[str, int] = {}
        for o in found:
            by[o.source] = by.get(o.source, 0) + 1
        print(f"  scenario {n}: {kind} on {fault.subject}: {len(found)} finding(s) {by} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        out.append({"kind": kind, "fault": fault, "findings": found})
        if n == 0:
            for ins in instruments:  # leaves of one scenario are all of them (heartbeats)
                if isinstance(ins, TelemetryInstrument):
                    ins.on_events = None
    return out, leaves


def day_of(scen: list[dict[str, Any]], every_ns: int) -> tuple[list[Observed], int]:
    """Episodes every ``every_ns`` over 24 h, cycling scenarios; scenario 0 (gray-loss) starts
    at 12:00 exactly. Returns the findings and the gray-loss fault's onset at noon (ns)."""
    out: list[Observed] = []
    n_ep = DAY_NS // every_ns
    noon_ep = NOON_NS // every_ns
    for k in range(n_ep):
        start = k * every_ns
        i = (k - noon_ep) % len(scen)
        out.extend(shifted(o, start) for o in scen[i]["findings"])
    out.sort(key=lambda o: (o.reported_ns, o.source, o.id))
    return out, NOON_NS + int(scen[0]["fault"].start_ns)


def write_raw(ts: TelemetryStore, leaves: set[tuple[str, str, str]], budget_s: float,
              rng: np.random.Generator, batch_rows: int = 2_000_000) -> dict[str, Any]:
    """Raw telemetry rows (every leaf at 10 s from 00:00) for at most ``budget_s`` seconds."""
    keys = sorted(leaves)
    n = len(keys)
    targets = pa.array([k[0] for k in keys], pa.string())
    names = pa.array([k[1] for k in keys], pa.string())
    tags = pa.array([k[2] for k in keys], pa.string())
    per_batch = max(1, batch_rows // max(n, 1))
    samples_day = DAY_NS // (10 * NS)
    rows, k0 = 0, 0
    t0 = time.perf_counter()
    counters = rng.integers(0, 1000, size=n).astype(np.float64)
    while k0 < samples_day and time.perf_counter() - t0 < budget_s:
        m = min(per_batch, samples_day - k0)
        idx = pa.array(np.tile(np.arange(n, dtype=np.int32), m))
        stamps = np.repeat((np.arange(k0, k0 + m, dtype=np.int64) * 10 * NS), n)
        inc = rng.poisson(0.01, size=(m, n)).cumsum(axis=0) + counters
        counters = inc[-1]
        table = pa.Table.from_arrays([
            pa.array(stamps), pa.DictionaryArray.from_arrays(idx, targets),
            pa.DictionaryArray.from_arrays(idx, names), pa.DictionaryArray.from_arrays(idx, tags),
            pa.array(inc.ravel()), pa.nulls(m * n, pa.string()),
        ], names=["ts_ns", "target", "name", "tags", "value_num", "value_str"])
        ts.con.register("_raw", table)
        ts.con.execute("INSERT INTO telemetry SELECT * FROM _raw")
        ts.con.unregister("_raw")
        rows += m * n
        k0 += m
    gen_s = time.perf_counter() - t0
    return {"leaves": n, "rows": rows, "rows_full_day": n * samples_day,
            "fraction_of_day": rows / (n * samples_day), "stored_until_s": k0 * 10,
            "generation_s": round(gen_s, 1), "rows_per_s": round(rows / max(gen_s, 1e-9))}


def insert_probes(ps: ProbeStore, obs: Observations, seq_next: np.ndarray) -> int:
    """Columnar insert of the twin's probes (dictionary-encoded flow columns; ``seq`` counts
    each flow's probes across calls). Same rows as ``ProbeStore.insert_observations``."""
    fl = obs.flows
    n = len(obs)
    order = np.argsort(obs.flow, kind="stable")
    sf = obs.flow[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sf)) + 1]
    seq = np.empty(n, dtype=np.int64)
    seq[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n])) + seq_next[sf]
    np.add.at(seq_next, obs.flow, 1)
    idx = pa.array(obs.flow.astype(np.int32))
    if not hasattr(insert_probes, "_dicts") or insert_probes._dicts[0] is not fl:  # type: ignore[attr-defined]
        insert_probes._dicts = (fl, [pa.array([k[0] for k in fl]), pa.array([k[1] for k in fl]),  # type: ignore[attr-defined]
                                     pa.array([k[2].src_ip for k in fl]),
                                     pa.array([k[2].dst_ip for k in fl])],
                                np.array([(k[2].src_port, k[2].dst_port, k[2].proto) for k in fl]))
    _, d, ports = insert_probes._dicts  # type: ignore[attr-defined]
    lost = obs.t_recv_ns < 0
    table = pa.Table.from_arrays(
        [pa.DictionaryArray.from_arrays(idx, x) for x in d]
        + [pa.array(ports[obs.flow, 0].astype(np.int32)), pa.array(ports[obs.flow, 1].astype(np.int32)),
           pa.array(ports[obs.flow, 2].astype(np.int16)), pa.array(seq), pa.array(obs.t_send_ns),
           pa.array(obs.t_resp_rx_ns, mask=lost), pa.array(obs.t_resp_tx_ns, mask=lost),
           pa.array(obs.t_recv_ns, mask=lost),
           pa.array(np.asarray(obs.status, dtype=np.int16))],
        names=["src", "dst", "src_ip", "dst_ip", "src_port", "dst_port", "proto", "seq",
               "t_send_ns", "t_resp_rx_ns", "t_resp_tx_ns", "t_recv_ns", "status"])
    ps.con.register("_pb", table)
    ps.con.execute("INSERT INTO probes SELECT * FROM _pb")
    ps.con.unregister("_pb")
    return n


def write_probes(fabric: Fabric, path: Path, fault: Any, t0_ns: int, window_s: float,
                 seed: int) -> dict[str, Any]:
    """The probe mesh's probes of ``[t0, t0 + window)`` with ``fault`` active (shifted to t0)."""
    mesh, _ = ProbeInstrument().prepared(fabric)  # the instrument's mesh: 20 probes/s per NIC
    flt = replace(fault, start_ns=t0_ns, end_ns=None)
    tr = mesh.transport_for(FaultSchedule.of([flt]), seed, background_loss=1e-5)
    ps = ProbeStore(path)
    seq_next = np.zeros(len(mesh.flows), dtype=np.int64)
    rows = 0
    t = time.perf_counter()
    chunk = 60 * NS
    s = t0_ns
    end = t0_ns + int(window_s * NS)
    while s < end:
        d = min(chunk, end - s)
        obs = mesh.probe(tr, start_ns=s, duration_ns=d, seed=seed + s // chunk)
        rows += insert_probes(ps, obs, seq_next)
        s += d
    ps.close()
    return {"rows": rows, "flows": len(mesh.flows), "window_ns": [t0_ns, end],
            "rate_pps_per_nic": ProbeInstrument().rate_pps, "nics": len(fabric.nics),
            "generation_s": round(time.perf_counter() - t, 1)}


def timed(fabric: Fabric, inputs: Inputs, repeats: int, **kw: Any) -> dict[str, Any]:
    """Median wall and CPU of ``repeats`` calls; a call slower than 3 x the target is not
    repeated more than once more (its distance to the target does not need a third run)."""
    walls: list[float] = []
    cpus: list[float] = []
    ans = None
    for _ in range(repeats):
        if len(walls) >= 2 and walls[0] > 3 * TARGET_S:
            break
        w, c = time.perf_counter(), time.process_time()
        ans = advise(fabric, inputs, **kw)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    assert ans is not None
    top = [(rc.fault, rc.resource, round(rc.probability, 3)) for _, rc in ans.ranked[:3]]
    return {"wall_s": round(statistics.median(walls), 3), "cpu_s": round(statistics.median(cpus), 3),
            "walls": [round(x, 3) for x in walls], "sources": ans.sources,
            "incidents": len(ans.incidents), "root_causes": len(ans.ranked), "top": top,
            "meets_5s": statistics.median(walls) < TARGET_S}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="256 GPUs, 3 scenarios, small stores")
    ap.add_argument("--servers", type=int, default=None, help="rail-optimized servers (256)")
    ap.add_argument("--scenarios", type=int, default=None, help=f"<= {len(KINDS)} (8)")
    ap.add_argument("--scenario-s", type=float, default=150.0)
    ap.add_argument("--every-min", type=float, default=10.0, help="one fault episode every ...")
    ap.add_argument("--raw-s", type=float, default=None, help="raw telemetry generation budget, s (90)")
    ap.add_argument("--probe-window-s", type=float, default=None, help="stored probe window (120)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--workdir", default=None, help="where the stores go (default: a temp dir, removed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    q = args.quick
    args.servers = args.servers or (32 if q else 256)
    args.scenarios = min(len(KINDS), args.scenarios or (3 if q else len(KINDS)))
    args.raw_s = args.raw_s if args.raw_s is not None else (5.0 if q else 90.0)
    args.probe_window_s = args.probe_window_s or (30.0 if q else 120.0)
    if q:
        args.scenario_s = min(args.scenario_s, 90.0)
    out_path = Path(args.out) if args.out else (RESULTS.with_name("advisor-quick.json") if q else RESULTS)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-advisor-"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    fabric = rail_optimized_fabric(args.servers)
    print(f"fabric rail-optimized servers={args.servers}: {fabric.gpu_count} GPUs, "
          f"{len(fabric.nics)} NICs, {len(fabric.links)} cables; stores in {work}", flush=True)

    print(f"[1/4] {args.scenarios} fault scenarios x {args.scenario_s:.0f} s on the twin", flush=True)
    scen, leaves = run_scenarios(fabric, args)
    day, noon_onset = day_of(scen, int(args.every_min * 60 * NS))
    tele = [o.finding for o in day if o.source == "telemetry"]
    by_src: dict[str, int] = {}
    for o in day:
        by_src[o.source] = by_src.get(o.source, 0) + 1

    print(f"[2/4] a day: {len(day)} findings {by_src} -> diagnosis store; telemetry store "
          f"({len(tele)} findings + raw rows for <= {args.raw_s:.0f} s)", flush=True)
    fdb, tdb, pdb = work / "diagnosis.duckdb", work / "telemetry.duckdb", work / "probes.duckdb"
    for p in (fdb, tdb, pdb):
        p.unlink(missing_ok=True)
    with DiagnosisStore(fdb) as ds:
        ds.add_findings(day)  # same id (source, kind, subject, window start) stored once
        stored_day = ds.counts()[1]
    print(f"  diagnosis store: {stored_day} distinct findings", flush=True)
    ts = TelemetryStore(tdb)
    ts.write_findings(tele)
    raw = write_raw(ts, leaves, args.raw_s, np.random.default_rng(args.seed))
    ts.close()
    print(f"  raw telemetry: {raw['rows']:,} rows ({raw['leaves']:,} leaves x 10 s up to "
          f"{raw['stored_until_s'] / 3600:.2f} h) = {100 * raw['fraction_of_day']:.2f} % of the "
          f"day's {raw['rows_full_day']:,}; {raw['rows_per_s']:,} rows/s; "
          f"{tdb.stat().st_size / 1e6:.0f} MB", flush=True)

    print(f"[3/4] probe store: {args.probe_window_s:.0f} s of the mesh around the noon gray link",
          flush=True)
    gray = scen[0]["fault"]
    probes = write_probes(fabric, pdb, gray, noon_onset, args.probe_window_s, args.seed)
    print(f"  {probes['rows']:,} probes over {probes['flows']:,} flows "
          f"({probes['generation_s']} s; {pdb.stat().st_size / 1e6:.0f} MB)", flush=True)

    print(f"[4/4] advise(), {args.repeats} repeats each", flush=True)
    w0, w1 = probes["window_ns"]
    leaf = next(x for x in gray.subject.replace("->", " ").split() if x.startswith("leaf"))
    subject = leaf.split(":")[0]
    cases: list[tuple[str, Inputs, dict[str, Any]]] = [
        ("findings-db, whole day", Inputs(findings_db=[fdb]), {}),
        ("findings-db, 1 h window", Inputs(findings_db=[fdb]),
         {"since": NOON_NS - 1800 * NS, "until": NOON_NS + 1800 * NS}),
        ("telemetry-db, whole day", Inputs(telemetry_db=[tdb]), {}),
        ("probes, first 30 s", Inputs(probes_db=[pdb]), {"since": w0, "until": w0 + 30 * NS}),
        (f"probes, {args.probe_window_s:.0f} s window", Inputs(probes_db=[pdb]),
         {"since": w0, "until": w1}),
        (f"all three, window, --subject {subject}",
         Inputs(findings_db=[fdb], telemetry_db=[tdb], probes_db=[pdb]),
         {"since": w0, "until": w1, "subject": subject}),
    ]
    results = []
    for name, inputs, kw in cases:
        r = timed(fabric, inputs, args.repeats, **kw)
        r["case"] = name
        results.append(r)
        print(f"  {name}: {r['wall_s']} s wall, {r['cpu_s']} s CPU; read {r['sources']}; "
              f"top {r['top'][:1]}", flush=True)

    # What an operator waits for: the command from process start (imports, inventory, stores
    # opened) to the printed answer, the same probe window.
    cli = [sys.executable, "-c", "from fabricscope.cli import main; main()", "diagnose",
           "--twin", f"rail-optimized:servers={args.servers}", "--probes", str(pdb),
           "--since", str(w0), "--until", str(w1)]
    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        done = subprocess.run(cli, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"diagnose exited {done.returncode}: {done.stderr.strip()[-300:]}")
    end_to_end = {"case": f"`fabricscope diagnose --probes`, {args.probe_window_s:.0f} s window, "
                  "process start to answer", "wall_s": round(statistics.median(walls), 3),
                  "walls": [round(x, 3) for x in walls], "meets_5s": statistics.median(walls) < TARGET_S}
    print(f"  {end_to_end['case']}: {end_to_end['wall_s']} s wall (median of {len(walls)})", flush=True)

    slow = max(results, key=lambda r: r["wall_s"])
    print(f"profile of the slowest case ({slow['case']}), one run under cProfile:", flush=True)
    name, inputs, kw = next(c for c in cases if c[0] == slow["case"])
    prof = cProfile.Profile()
    prof.enable()
    advise(fabric, inputs, **kw)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(r"fabricscope|duckdb", 25)
    profile_text = buf.getvalue()
    print("\n".join(ln for ln in profile_text.splitlines() if ln.strip())[-4000:])

    print()
    print(f"{'case':44} {'wall s':>7} {'CPU s':>7} {'read':>26} {'incid.':>6} {'< 5 s':>6}")
    for r in results:
        src = ", ".join(f"{k[:5]} {v}" for k, v in r["sources"].items())
        print(f"{r['case']:44} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} {src:>26} "
              f"{r['incidents']:6d} {'yes' if r['meets_5s'] else 'NO':>6}")
    print(f"{'diagnose --probes, process start to answer':44} {end_to_end['wall_s']:7.2f} {'':>7} "
          f"{'':>26} {'':>6} {'yes' if end_to_end['meets_5s'] else 'NO':>6}")
    out = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")},
        "fabric": {"servers": args.servers, "gpus": fabric.gpu_count, "nics": len(fabric.nics)},
        "scenarios": [{"kind": s["kind"], "subject": s["fault"].subject,
                       "findings": len(s["findings"])} for s in scen],
        "stored": {"day_findings": len(day), "diagnosis_findings": stored_day, "by_source": by_src,
                   "telemetry_findings": len(tele), "raw_telemetry": raw, "probes": probes,
                   "bytes": {p.name: p.stat().st_size for p in (fdb, tdb, pdb)}},
        "cases": results, "end_to_end": end_to_end, "profile_slowest": {"case": slow["case"], "text": profile_text},
        "target_s": TARGET_S, "total_wall_s": round(time.perf_counter() - t_all, 1),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"\ntotal {out['total_wall_s']} s; wrote {out_path}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
