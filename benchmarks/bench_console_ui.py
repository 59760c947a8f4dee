"""Console UI timings in headless Chromium: first meaningful paint, fabric view interactive, heap.

Starts a real console (``create_app`` + uvicorn on 127.0.0.1) over a rail-optimized fabric of
``--gpus`` GPUs (inventory only, no supervisor) and drives the system Chromium (Debian
``chromium`` + ``chromium-driver``) with Selenium, each run a fresh page load with the token
already in session storage:

* ``fcp_ms``: the browser's first-contentful-paint (Paint Timing API) of the page;
* ``first_meaningful_ms``: navigation start -> the incident table and timeline drawn from
  ``/api/v1/incidents`` (the page's ``fabricscope.readyAt.incidents``);
* ``fabric_interactive_ms``: navigation start -> the fabric view's first frame drawn with its
  overlay and its hover index built (``readyAt.fabric``), split into fetch / layout;
* ``frame_ms`` / ``zoomed_frame_ms``: one redraw at zoom 1 (aggregated) and zoomed 8x;
* ``js_heap_mb``: ``JSHeapUsedSize`` of the page (Chrome DevTools ``Performance.getMetrics``)
  after the fabric view is drawn.

    python benchmarks/bench_console_ui.py                 # 32,768 GPUs, 3 runs
    python benchmarks/bench_console_ui.py --gpus 1024 --runs 1
    python benchmarks/bench_console_ui.py --screenshots docs/img   # docs' screenshots too

Prints a table and writes ``benchmarks/results/console_ui.json``.
Targets (issue 10): first meaningful paint < 2 s; 32k-GPU fabric view interactive < 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from console_browser_util import (  # noqa: E402
    browser_missing,
    make_driver,
    sign_in,
    start_console,
    wait_ready,
)

RESULTS = ROOT / "benchmarks" / "results" / "console_ui.json"


def _fresh(driver: Any, url: str, token: str, route: str) -> None:
    """A new document at ``route`` with the session token set (no login round trip)."""
    driver.get(url + "/static/app.css")  # same origin, nothing runs
    driver.execute_script("sessionStorage.setItem('fabricscope.token', arguments[0])", token)
    driver.get(url + "/" + route)


def measure(gpus: int, runs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    c = start_console(servers=gpus // 8, twin=False)
    build_s = time.perf_counter() - t0
    d = make_driver()
    rows: list[dict[str, float]] = []
    try:
        for _ in range(runs):
            _fresh(d, c.url, c.token, "#/incidents")
            wait_ready(d, "incidents", 60)
            fcp = d.execute_script(
                "const e = performance.getEntriesByName('first-contentful-paint')[0];"
                "return e ? e.startTime : null")
            fmp = d.execute_script("return window.fabricscope.readyAt.incidents")
            _fresh(d, c.url, c.token, "#/fabric")
            wait_ready(d, "fabric", 120)
            st = d.execute_script("return window.fabricscope.fabric")
            tti = d.execute_script("return window.fabricscope.readyAt.fabric")
            d.execute_cdp_cmd("Performance.enable", {})
            heap = {m["name"]: m["value"] for m in
                    d.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
            zoomed = d.execute_script(
                "const c = document.getElementById('fabric'), r = c.getBoundingClientRect();"
                "c.dispatchEvent(new WheelEvent('wheel', {deltaY: -1386, clientX: r.left + "
                "r.width / 2, clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));"
                "return new Promise(ok => requestAnimationFrame(() => requestAnimationFrame(() =>"
                " ok(window.fabricscope.fabric))));")
            rows.append({
                "fcp_ms": fcp, "first_meaningful_ms": fmp, "fabric_interactive_ms": tti,
                "fabric_fetch_ms": st["timings"]["fetchMs"],
                "fabric_layout_ms": st["timings"]["layoutMs"],
                "frame_ms": st["frameMs"], "zoomed_frame_ms": zoomed["frameMs"],
                "zoom": zoomed["zoom"], "drawn_segments": st["drawnLinks"],
                "zoomed_segments": zoomed["drawnLinks"],
                "js_heap_mb": (heap.get("JSHeapUsedSize") or d.execute_script(
                    "return performance.memory.usedJSHeapSize")) / 2**20,
                "dom_nodes": heap.get("Nodes", 0),
            })
    finally:
        d.quit()
        c.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    fab = c.state.fabric
    return {"gpus": gpus, "devices": len(fab.devices), "links": len(fab.links),
            "server_build_s": round(build_s, 2), "runs": rows, "median": med}


def screenshots(out: Path, gpus: int) -> list[str]:
    """The docs' screenshots: a live twin with one injected fault, and the --gpus fabric."""
    import httpx

    out.mkdir(parents=True, exist_ok=True)
    saved: list[str] = []
    c = start_console(servers=8, speed=20.0)
    assert c.services.supervisor is not None
    c.services.supervisor.start()
    d = make_driver(width=1400, height=900)
    try:
        auth = {"Authorization": f"Bearer {c.token}"}
        deadline = time.monotonic() + 60
        while c.state.view("optics") is None and time.monotonic() < deadline:
            time.sleep(0.2)
        httpx.post(f"{c.url}/api/v1/twin/faults", headers=auth, timeout=10,
                   json={"fault": "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0,loss=0.03"})
        while not c.state.incidents(limit=1)[0] and time.monotonic() < deadline + 60:
            time.sleep(0.2)
        time.sleep(3)  # a few more ticks: the timeline and matrix have something to show
        d.get(c.url + "/")
        d.execute_script("sessionStorage.clear()")
        d.refresh()
        wait_ready_login(d)
        d.save_screenshot(str(out / "console-login.png"))
        saved.append("console-login.png")
        sign_in(d, c)
        pages = [("incidents", "#/incidents")]
        total, items = c.state.incidents(limit=1)
        if total:
            pages.append(("incident", f"#/incident/{items[0].id}"))
        pages += [("fabric", "#/fabric"), ("probes", "#/probes"), ("stragglers", "#/stragglers"),
                  ("optics", "#/optics")]
        for name, route in pages:
            d.execute_script(f"location.hash = {route!r}")
            wait_ready(d, name, 60)
            if name == "optics":
                btn = d.find_elements("css selector", "#op-table button.port-btn")
                if btn:
                    btn[0].click()
                    time.sleep(0.5)
            if name == "incident":
                d.set_window_size(1400, 1700)
            d.save_screenshot(str(out / f"console-{name}.png"))
            d.set_window_size(1400, 900)
            saved.append(f"console-{name}.png")
        d.execute_script("location.hash = '#/advisor'")
        wait_ready(d, "advisor")
        d.find_element("id", "ad-text").send_keys("host0002 looks slow; all-reduce lost 20%")
        d.find_element("css selector", "#ad-form button").click()
        _until(d, "return !!window.fabricscope.ready.advisor && "
                  "document.getElementById('ad-answer').children.length > 0", 60)
        d.save_screenshot(str(out / "console-advisor.png"))
        saved.append("console-advisor.png")
        d.execute_script("location.hash = '#/whatif'")
        wait_ready(d, "whatif")
        d.find_element("css selector", "#wi-form button[type=submit]").click()
        _until(d, "return document.getElementById('wi-result').children.length > 0", 120)
        d.save_screenshot(str(out / "console-whatif.png"))
        saved.append("console-whatif.png")
    finally:
        d.quit()
        c.stop()
    big = start_console(servers=gpus // 8, twin=False)
    d = make_driver(width=1400, height=900)
    try:
        sign_in(d, big, "#/fabric")
        wait_ready(d, "fabric", 120)
        d.save_screenshot(str(out / "console-fabric-32k.png"))
        saved.append("console-fabric-32k.png")
    finally:
        d.quit()
        big.stop()
    return saved


def wait_ready_login(d: Any) -> None:
    _until(d, "return !!document.getElementById('token') && "
              "!document.getElementById('login').hidden", 30)


def _until(d: Any, script: str, timeout: float) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(d, timeout, poll_frequency=0.1).until(lambda x: x.execute_script(script))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=32768, help="fabric size (multiple of 8)")
    ap.add_argument("--runs", type=int, default=3, help="fresh page loads to take the median of")
    ap.add_argument("--screenshots", type=Path, default=None,
                    help="also save the docs' screenshots (console-*.png) into this folder")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    why = browser_missing()
    if why:
        print(f"bench_console_ui: {why}", file=sys.stderr)
        return 2
    if a.gpus < 8 or a.gpus % 8:
        print(f"bench_console_ui: --gpus: a positive multiple of 8, got {a.gpus}", file=sys.stderr)
        return 2
    res = measure(a.gpus, max(1, a.runs))
    m = res["median"]
    print(f"console UI, rail-optimized {res['gpus']:,} GPUs ({res['devices']:,} devices, "
          f"{res['links']:,} links), median of {len(res['runs'])} fresh loads")
    print(f"{'metric':<32}{'value':>12}  target")
    for key, label, unit, target in (
        ("fcp_ms", "first contentful paint", "ms", ""),
        ("first_meaningful_ms", "first meaningful paint", "ms", "< 2000"),
        ("fabric_interactive_ms", "fabric view interactive", "ms", "< 3000"),
        ("fabric_fetch_ms", "  of which /fabric fetch+parse", "ms", ""),
        ("fabric_layout_ms", "  of which layout + index", "ms", ""),
        ("frame_ms", "redraw, zoom 1", "ms", ""),
        ("zoomed_frame_ms", "redraw, zoomed", "ms", ""),
        ("drawn_segments", "segments drawn, zoom 1", "", ""),
        ("js_heap_mb", "JS heap used", "MiB", "reported"),
        ("dom_nodes", "DOM nodes", "", ""),
    ):
        v = m[key]
        print(f"{label:<32}{v:>12.1f} {unit:<4}{target}")
    res["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    if a.screenshots is not None:
        res["screenshots"] = screenshots(a.screenshots, a.gpus)
        print("screenshots:", ", ".join(res["screenshots"]))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
