"""``serve --config``: the console following live sources, end to end with the real tools.

A real gNMI target (``gnmi serve-twin``, a link taken down 4 s after start), the real
collector (``gnmi collect``, a rolling DuckDB store read while it writes), and the real
``fabricscope serve --config`` polling that store: the link-down the collector's detector
reports becomes an incident in the console's API, and the console's telemetry query reads
the counters the collector is writing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.service.console.store_source import read_live_config

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LINK = "leaf-000:eth3|spine-00:eth1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], cwd: Path, extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICSCOPE_")}
    env["XDG_CONFIG_HOME"] = str(cwd / ".config")
    env.update(extra or {})
    return subprocess.Popen([str(BIN / "fabricscope"), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stop(p: subprocess.Popen[str]) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
    try:
        return p.communicate(timeout=20)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()[1] + "\n(killed: did not stop within 20 s)"


def _collector_yaml(gport: int, login: str = "") -> str:
    """A collector config for the twin's four switches: counters sampled at 1 s, oper-status
    on change, the error and flap detectors, a rolling DuckDB store."""
    return f"""
targets:
  twin:
    address: 127.0.0.1:{gport}
    names: [leaf-000, leaf-001, spine-00, spine-01]{login}
subscriptions:
  counters:
    paths: ["/interfaces/interface[name=*]/state/counters"]
    stream-mode: sample
    sample-interval: 1s
  status:
    paths: ["/interfaces/interface[name=*]/state/oper-status"]
    stream-mode: on-change
    heartbeat-interval: 30s
detectors: {{error-increase: {{}}, link-flap: {{}}}}
sinks:
  - {{type: duckdb, path: telemetry.duckdb, roll-interval: 1s}}
"""


def test_live_sources_become_incidents(tmp_path: Path) -> None:
    gport = _free_port()
    (tmp_path / "collector.yaml").write_text(_collector_yaml(gport))
    (tmp_path / "console.yaml").write_text(f"""
inventory: {ROOT / 'examples' / 'fabric.yaml'}
sources:
  telemetry: telemetry.duckdb
poll: 1s
""")
    procs = []
    try:
        procs.append(_start(["gnmi", "serve-twin", "--inventory", str(ROOT / "examples" /
                                                                      "fabric.yaml"),
                             "--address", f"127.0.0.1:{gport}", "--fault",
                             f"link-down {LINK} start=4s"], tmp_path))
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", gport)) != 0:
            assert time.monotonic() < deadline, "gnmi target did not start"
            assert procs[0].poll() is None, procs[0].communicate()[1]
            time.sleep(0.2)
        procs.append(_start(["gnmi", "collect", "-c", "collector.yaml"], tmp_path))
        while not (tmp_path / "telemetry.duckdb.parts").exists():
            assert time.monotonic() < deadline, "the collector wrote no store"
            assert procs[1].poll() is None, procs[1].communicate()[1]
            time.sleep(0.2)
        tok = tmp_path / "tok"
        serve = _start(["serve", "--config", "console.yaml", "--port", "0", "--token-file",
                        str(tok)], tmp_path)
        procs.append(serve)
        assert serve.stderr is not None
        url, said = "", []
        for line in serve.stderr:
            said.append(line)
            if line.startswith("fabricscope console on "):
                url = line.split()[3].rstrip("/")
                break
        assert url, f"no startup line: {''.join(said)}"
        assert "live sources of console.yaml" in line
        hdr = {"Authorization": f"Bearer {tok.read_text().strip()}"}
        hit: list[dict[str, object]] = []
        with httpx.Client(base_url=url, headers=hdr, timeout=10) as c:
            deadline = time.monotonic() + 60
            while not hit and time.monotonic() < deadline:
                hit = [i for i in c.get("/api/v1/incidents").json()["items"]
                       if i["resource"] == LINK]
                time.sleep(0.5)
            assert hit, c.get("/api/v1/status").json()
            assert hit[0]["kind"] == "link-down"
            st = c.get("/api/v1/status").json()
            assert st["mode"] == "live" and st["polls"] >= 1
            d = c.get(f"/api/v1/incidents/{hit[0]['id']}").json()
            assert d["findings"] and d["findings"][0]["source"] == "telemetry"
            names = [n["name"] for n in c.get("/api/v1/telemetry/names").json()["names"]]
            octets = next(n for n in names if n.endswith("/in-octets"))
            now = time.time_ns()
            ser = c.get("/api/v1/telemetry/series", params={
                "target": "leaf-000", "name": octets, "interface": "eth3",
                "start_ns": now - 120 * 10**9, "end_ns": now, "points": 60}).json()
            assert ser["raw_points"] >= 2, ser
            r = c.post("/api/v1/twin/faults", json={"fault": f"link-down:{LINK}"})
            assert r.status_code == 404  # no twin to inject on: live sources
    finally:
        errs = [_stop(p) for p in reversed(procs)]
    for e in errs:
        assert "Traceback" not in e, e


def _console_url(serve: subprocess.Popen[str]) -> str:
    assert serve.stderr is not None
    said = []
    for line in serve.stderr:
        said.append(line)
        if line.startswith("fabricscope console on "):
            return line.split()[3].rstrip("/")
    raise AssertionError(f"no startup line: {''.join(said)}")


def _wait_port(port: int, proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 30
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert time.monotonic() < deadline, f"{what} did not start"
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.2)


def test_approved_cost_out_is_a_gnmi_set_that_ends_the_gray_link(tmp_path: Path) -> None:
    """The closed loop on live sources: a gray link's FCS errors become an incident, the
    operator approves its cost-out, the console sends the gNMI Set to the switch, the link
    goes down and its errors stop; the link-down that follows is the action's effect, not a
    new incident."""
    gport = _free_port()
    env = {"GNMI_PW": "s3cret-live-pw"}
    (tmp_path / "collector.yaml").write_text(_collector_yaml(
        gport, "\n    username: ops\n    password-env: GNMI_PW"))
    (tmp_path / "console.yaml").write_text(f"""
inventory: {ROOT / 'examples' / 'fabric.yaml'}
sources:
  telemetry: telemetry.duckdb
poll: 1s
actions:
  gnmi: collector.yaml
""")
    procs = []
    try:
        procs.append(_start(["gnmi", "serve-twin", "--inventory", str(ROOT / "examples" / "fabric.yaml"),
                             "--address", f"127.0.0.1:{gport}", "--username", "ops",
                             "--password-env", "GNMI_PW", "--allow-set", "--fault",
                             "gray-loss leaf-000:eth3->spine-00:eth1 start=3s loss=0.05"],
                            tmp_path, env))
        _wait_port(gport, procs[0], "gnmi target")
        procs.append(_start(["gnmi", "collect", "-c", "collector.yaml"], tmp_path, env))
        tok = tmp_path / "tok"
        serve = _start(["serve", "--config", "console.yaml", "--port", "0", "--token-file",
                        str(tok), "--actions", "approve"], tmp_path, env)
        procs.append(serve)
        url = _console_url(serve)
        hdr = {"Authorization": f"Bearer {tok.read_text().strip()}"}
        with httpx.Client(base_url=url, headers=hdr, timeout=30) as c:
            hit: list[dict[str, object]] = []
            deadline = time.monotonic() + 90
            while not hit and time.monotonic() < deadline:
                hit = [i for i in c.get("/api/v1/incidents").json()["items"] if i["resource"] == LINK]
                time.sleep(0.5)
            assert hit, c.get("/api/v1/status").json()
            inc = c.get(f"/api/v1/incidents/{hit[0]['id']}").json()
            rc = inc["incident"]["root_causes"][0] if "incident" in inc else inc["root_causes"][0]
            assert rc["fault"] == "gray-link", rc
            r = c.post(f"/api/v1/incidents/{hit[0]['id']}/approve", json={"action": rc["action"]})
            assert r.status_code == 200, r.text
            ap = r.json()["approval"]
            assert ap["executed"] is True, ap
            assert "gNMI Set /interfaces/interface[name=eth3]/config/enabled = false on leaf-000" in ap["result"]
            # the errors stop: the receiving port's FCS counter no longer moves
            time.sleep(4)
            names = [n["name"] for n in c.get("/api/v1/telemetry/names").json()["names"]]
            fcs = next(n for n in names if n.endswith("/in-fcs-errors"))

            def fcs_now() -> float:
                now = time.time_ns()
                ser = c.get("/api/v1/telemetry/series", params={
                    "target": "spine-00", "name": fcs, "interface": "eth1", "agg": "max",
                    "start_ns": now - 3 * 10**9, "end_ns": now, "points": 1}).json()
                assert ser.get("raw_points", 0) >= 1, ser
                return float(max(v for _, v in ser["points"] if v is not None))

            first = fcs_now()
            time.sleep(4)
            assert fcs_now() == first and first > 0
            st = c.get("/api/v1/status").json()
            deadline = time.monotonic() + 20
            while st.get("findings_after_cost_out", 0) < 1 and time.monotonic() < deadline:
                time.sleep(0.5)
                st = c.get("/api/v1/status").json()
            assert st.get("findings_after_cost_out", 0) >= 1, st  # the link-down it caused
            kinds = {i["kind"] for i in c.get("/api/v1/incidents").json()["items"]
                     if i["resource"] == LINK}
            assert "link-down" not in kinds, kinds
            # undo: the link is enabled again and, never repaired, errs again
            r = c.post(f"/api/v1/incidents/{hit[0]['id']}/undo", json={})
            assert r.status_code == 200 and r.json()["undo"]["ok"], r.text
            assert "config/enabled = true on leaf-000" in r.json()["undo"]["result"]
            assert c.post(f"/api/v1/incidents/{hit[0]['id']}/undo", json={}).status_code == 400
            before = fcs_now()
            deadline = time.monotonic() + 20
            while fcs_now() == before and time.monotonic() < deadline:
                time.sleep(1)
            assert fcs_now() > before
    finally:
        errs = [_stop(p) for p in reversed(procs)]
    for e in errs:
        assert "Traceback" not in e, e
    assert "s3cret-live-pw" not in "".join(errs)


def test_live_config_mistakes_name_file_and_field(tmp_path: Path) -> None:
    inv = ROOT / "examples" / "fabric.yaml"
    cases = {
        "sources: {telemetry: t.duckdb}\n": "inventory: required",
        f"inventory: {inv}\nsources: {{}}\n": "sources: expected a mapping",
        f"inventory: {inv}\nsources: {{probes: p.duckdb}}\n": "sources.'probes': unknown source",
        f"inventory: {inv}\nsources: {{telemetry: nodir/t.duckdb}}\n":
            "sources.telemetry: 'nodir/t.duckdb': no such directory",
        f"inventory: {inv}\nsources: {{telemetry: {inv}}}\npoll: 0.01s\n": "poll: expected",
        f"inventory: {inv}\nsorces: {{}}\n": "'sorces': unknown key",
        "inventory: [\n": "not valid YAML",
    }
    for i, (text, want) in enumerate(cases.items()):
        p = tmp_path / f"c{i}.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError) as ei:
            read_live_config(p)
        assert str(ei.value).startswith(f"--config {p}") and want in str(ei.value), ei.value
    # a store its collector has not created yet: accepted, with a note
    p = tmp_path / "later.yaml"
    p.write_text(f"inventory: {inv}\nsources: {{telemetry: later.duckdb}}\n")
    cfg = read_live_config(p)
    assert cfg.telemetry_db == tmp_path / "later.duckdb"
    assert cfg.notes and "does not exist yet" in cfg.notes[0]
