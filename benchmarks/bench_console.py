"""Console API targets (issue 10). Prints a table and writes benchmarks/results/console.json.

    python benchmarks/bench_console.py            # the issue's sizes
    python benchmarks/bench_console.py --quick    # smaller, a smoke pass

Measured against the real server (uvicorn on 127.0.0.1, httpx as the client, the same
process, so client CPU competes with the server on this 2-core machine: the numbers are an
upper bound of what a remote client sees):

* incident list: a console holding ``--incidents`` incidents (synthetic records with 1-3 root
  causes each, a quarter closed); ``GET /api/v1/incidents`` (first page of 100, a filtered
  page, a deep page) timed ``--requests`` times; p50 / p99 wall;
* telemetry query: a store holding one day of 1 s samples of ``--ports`` ports of one switch
  (the port asked for is one of them); ``GET /api/v1/telemetry/series`` over the whole day
  into 600 points (mean and rate), p50 / p99;
* SSE: ``--clients`` concurrent ``/api/v1/events`` streams while ``--events`` incident
  changes are published; errors, and events received per client versus published;
* time to the page on the embedded twin: ``--faults`` faults of several kinds injected at
  different simulated times on the live twin (``TwinSupervisor``, the supervisor of
  ``fabricscope serve``); the simulated time from injection until ``GET /api/v1/incidents``
  lists an incident naming the fault's resource (a slow GPU is one of the training job's:
  outside the job no instrument sees it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa

from fabricscope.api.app import ApiSettings, create_app
from fabricscope.api.server import start_server
from fabricscope.diagnosis.model import Incident, RootCause
from fabricscope.fabric.catalog import build_fabric
from fabricscope.service.console.services import ConsoleServices, build_twin_console
from fabricscope.service.console.state import ConsoleState
from fabricscope.store.telemetry import TelemetryStore

NS = 1_000_000_000
TOKEN = "bench-token-0123456789abcdef"
HDR = {"Authorization": f"Bearer {TOKEN}"}
FAULTS = ("gray-loss", "pfc-storm", "link-down", "slow-gpu", "nic-fault")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def timed(c: httpx.Client, path: str, params: dict[str, Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = c.get(path, params=params)
        out.append((time.perf_counter() - t0) * 1e3)
        r.raise_for_status()
    return out


def synthetic_incidents(fabric: Any, n: int, rng: np.random.Generator) -> list[Incident]:
    links = [lk.id for lk in fabric.links]
    faults = ("gray-link", "link-flap", "pfc-storm", "optic-aging", "congestion", "slow-gpu")
    sev = ("critical", "warning", "info")
    out = []
    for i in range(n):
        k = int(rng.integers(1, 4))
        rcs = tuple(RootCause(links[int(rng.integers(len(links)))], faults[int(rng.integers(6))],
                              float(rng.uniform(0.35, 0.99)), (f"f-{i:06d}",),
                              (f"[f-{i:06d}] evidence line",), action="drain the link")
                    for _ in range(k))
        t = i * 10 * NS
        closed = i % 4 == 0
        out.append(Incident(f"inc-{i:06d}", "closed" if closed else "open", t, t + NS, t, t,
                            rcs, (f"f-{i:06d}",), sev[i % 3], {"links": 1},
                            t, None, t + 60 * NS if closed else None, f"{rcs[0].fault} on "
                            f"{rcs[0].resource}"))
    return out


def bench_incidents(args: argparse.Namespace, fabric: Any) -> dict[str, Any]:
    state = ConsoleState(fabric, max_incidents=args.incidents)
    for inc in synthetic_incidents(fabric, args.incidents, np.random.default_rng(0)):
        state.upsert_incident(inc)
    h = start_server(create_app(state, ApiSettings(token=TOKEN), ConsoleServices()))
    rows = {}
    try:
        with httpx.Client(base_url=h.url, headers=HDR) as c:
            timed(c, "/api/v1/incidents", {}, 5)  # warm
            for name, params in (("first page (100)", {}),
                                 ("filter open+critical", {"status": "open",
                                                           "severity": "critical"}),
                                 ("search 'spine'", {"q": "spine"}),
                                 ("deep page offset 9000", {"offset": args.incidents - 1000})):
                ms = timed(c, "/api/v1/incidents", params, args.requests)
                rows[name] = {"p50_ms": round(pct(ms, 50), 2), "p99_ms": round(pct(ms, 99), 2),
                              "n": len(ms)}
    finally:
        h.stop()
    return {"incidents": args.incidents, "rows": rows}


def bench_telemetry(args: argparse.Namespace, fabric: Any) -> dict[str, Any]:
    store = TelemetryStore()
    n = 86_400
    name = "/interfaces/interface/state/counters/in-octets"
    rng = np.random.default_rng(1)
    ts = np.arange(n, dtype=np.int64) * NS
    for p in range(args.ports):  # time order within a port; ports one after another
        vals = np.cumsum(rng.integers(0, 50_000_000, n)).astype(float)
        store.write_table(pa.table({
            "ts_ns": ts, "target": ["leaf-01"] * n, "name": [name] * n,
            "tags": [json.dumps({"interface_name": f"eth{p}"})] * n,
            "value_num": vals, "value_str": pa.nulls(n, pa.string())}))
    state = ConsoleState(fabric, mode="store")
    h = start_server(create_app(state, ApiSettings(token=TOKEN),
                                ConsoleServices(telemetry=store.con.cursor())))
    rows = {}
    try:
        with httpx.Client(base_url=h.url, headers=HDR) as c:
            q = {"target": "leaf-01", "name": name, "interface": f"eth{args.ports // 2}",
                 "start_ns": 0, "end_ns": n * NS, "points": 600}
            timed(c, "/api/v1/telemetry/series", q, 3)
            for agg in ("mean", "rate", "max"):
                ms = timed(c, "/api/v1/telemetry/series", {**q, "agg": agg}, args.requests // 5)
                rows[f"1 day, 1 s samples, agg={agg}"] = {
                    "p50_ms": round(pct(ms, 50), 1), "p99_ms": round(pct(ms, 99), 1),
                    "n": len(ms)}
    finally:
        h.stop()
        store.close()
    return {"rows_in_store": n * args.ports, "ports": args.ports, "rows": rows}


async def _sse_clients(url: str, n: int, want: int, timeout_s: float,
                       ready: asyncio.Event) -> list[dict[str, Any]]:
    connected = 0

    async def one() -> dict[str, Any]:
        nonlocal connected
        got, err = 0, ""
        try:
            async with httpx.AsyncClient(base_url=url, headers=HDR, timeout=timeout_s) as c, \
                    c.stream("GET", "/api/v1/events") as s:
                if s.status_code != 200:
                    return {"got": 0, "error": f"HTTP {s.status_code}"}
                connected += 1
                if connected == n:
                    ready.set()
                async for line in s.aiter_lines():
                    if line.startswith("event: incident"):
                        got += 1
                        if got >= want:
                            break
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
        return {"got": got, "error": err}

    return await asyncio.gather(*(one() for _ in range(n)))


def bench_sse(args: argparse.Namespace, fabric: Any) -> dict[str, Any]:
    state = ConsoleState(fabric)
    app = create_app(state, ApiSettings(token=TOKEN), ConsoleServices())
    h = start_server(app)
    incs = synthetic_incidents(fabric, args.events, np.random.default_rng(2))
    try:
        async def run() -> list[dict[str, Any]]:
            ready = asyncio.Event()
            task = asyncio.ensure_future(_sse_clients(h.url, args.clients, args.events, 120,
                                                      ready))
            await asyncio.wait_for(ready.wait(), 60)
            t0 = time.perf_counter()
            for i, inc in enumerate(incs):
                state.upsert_incident(inc)
                if i % 50 == 49:
                    await asyncio.sleep(0.05)  # a burst of 50, then a pause
            res = await task
            res.append({"publish_to_last_s": time.perf_counter() - t0})
            return res

        res = asyncio.run(run())
    finally:
        h.stop()
    span = res.pop()["publish_to_last_s"]
    got = [r["got"] for r in res]
    errors = [r["error"] for r in res if r["error"]]
    return {"clients": args.clients, "events": args.events, "errors": len(errors),
            "first_error": errors[0] if errors else "", "min_received": min(got),
            "all_received": sum(g == args.events for g in got),
            "dropped": app.state.hub.dropped, "seconds": round(span, 2)}


def bench_time_to_page(args: argparse.Namespace) -> dict[str, Any]:
    fabric = build_fabric("rail-optimized", {"servers": args.servers}, source="bench")
    rng = np.random.default_rng(3)
    from fabricscope.service.instruments import ScenarioSpec
    from fabricscope.service.instruments.straggler import StragglerInstrument

    # the training job's GPUs: a slow GPU outside the job is seen by no instrument
    job = StragglerInstrument().job_gpus(ScenarioSpec(fabric, [], 60.0))
    rows = []
    for k in range(args.faults):
        kind = FAULTS[k % len(FAULTS)]
        h = int(rng.integers(args.servers))
        nic = int(rng.integers(8))
        host = f"host{h:04d}"
        port = next(lk for lk in fabric.links if lk.a.startswith(f"{host}/nic{nic}:")
                    or lk.b.startswith(f"{host}/nic{nic}:"))
        a, b = (port.a, port.b) if port.a.startswith("leaf") else (port.b, port.a)
        text, resource = {
            "gray-loss": (f"gray-loss:{a}->{b},loss=0.03", port.id),
            "pfc-storm": (f"pfc-storm:{a}", a),
            "link-down": (f"link-down:{port.id}", port.id),
            "slow-gpu": (f"slow-gpu:{job[k % len(job)]}", job[k % len(job)]),
            "nic-fault": (f"nic-fault:{host}/nic{nic}", f"{host}/nic{nic}"),
        }[kind]
        state, svc = build_twin_console(fabric, views=False)
        sup = svc.supervisor
        assert sup is not None
        at = int((60 + 10 * k) * NS)
        sup.advance_to(at)
        c0 = time.process_time()
        sup.inject(text)
        found = None
        t = at
        while found is None and t < at + args.horizon_s * NS:
            t += 5 * NS
            sup.advance_to(t)
            for inc in state.incidents(limit=10_000)[1]:
                if any(rc.resource == resource for rc in inc.root_causes):
                    found = t - at
                    break
        rows.append({"fault": text, "resource": resource,
                     "time_to_page_s": None if found is None else found / NS,
                     "cpu_s": round(time.process_time() - c0, 2)})
        svc.close()
    ok = [r["time_to_page_s"] for r in rows if r["time_to_page_s"] is not None]
    return {"servers": args.servers, "rows": rows, "found": len(ok), "of": len(rows),
            "max_s": max(ok) if ok else None, "within_30s": sum(x <= 30 for x in ok)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--incidents", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--ports", type=int, default=64)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--events", type=int, default=500)
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--horizon-s", type=int, default=120)
    ap.add_argument("--only", default="incidents,telemetry,sse,page")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "console.json")
    args = ap.parse_args()
    if args.quick:
        args.incidents, args.requests, args.ports = 2000, 60, 8
        args.clients, args.events, args.faults = 20, 100, 3
    fabric = build_fabric("rail-optimized", {"servers": 32}, source="bench")
    parts = args.only.split(",")
    doc: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                       "platform": platform.platform()},
                           "args": {k: str(v) for k, v in vars(args).items()}}
    if "incidents" in parts:
        doc["incidents"] = bench_incidents(args, fabric)
        for name, r in doc["incidents"]["rows"].items():
            print(f"incident list ({args.incidents}) {name:24} p50 {r['p50_ms']:7.2f} ms  "
                  f"p99 {r['p99_ms']:7.2f} ms  (target p99 < 100 ms)")
    if "telemetry" in parts:
        doc["telemetry"] = bench_telemetry(args, fabric)
        for name, r in doc["telemetry"]["rows"].items():
            print(f"telemetry {name:30} p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
                  f"({doc['telemetry']['rows_in_store']:,} rows in the store; target < 200 ms)")
    if "sse" in parts:
        s = doc["sse"] = bench_sse(args, fabric)
        print(f"SSE: {s['clients']} clients x {s['events']} incident events: {s['errors']} "
              f"error(s), {s['all_received']} clients got every event (min {s['min_received']}), "
              f"{s['dropped']} dropped, {s['seconds']} s")
    if "page" in parts:
        p = doc["page"] = bench_time_to_page(args)
        for r in p["rows"]:
            print(f"time to page {r['fault']:60} {r['time_to_page_s']} s sim "
                  f"(cpu {r['cpu_s']} s)")
        print(f"time to page: {p['found']}/{p['of']} found, {p['within_30s']} within 30 s of "
              f"simulated time, max {p['max_s']} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
