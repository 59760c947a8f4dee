"""The console's HTTP API against a real uvicorn server on loopback (httpx as the client).

The twin supervisor is driven with ``advance_to`` (simulated time, no wall pacing) so a test
is deterministic; the live, wall-paced loop is exercised by ``test_serve_*`` through the real
``fabricscope serve`` process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from fabricscope.api.app import ApiSettings, create_app
from fabricscope.api.server import ServerHandle, TlsFiles, start_server
from fabricscope.fabric.catalog import build_fabric
from fabricscope.service.console.services import ConsoleServices, build_twin_console
from fabricscope.service.console.state import ConsoleState
from fabricscope.store.telemetry import TelemetryStore

NS = 1_000_000_000
TOKEN = "t0ken-for-tests-0123456789"
FAULT = "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0,loss=0.03"
LINK = "host0002/nic1:p0|leaf-p0-r1-00:eth3"


@pytest.fixture(scope="module")
def fabric():  # type: ignore[no-untyped-def]
    return build_fabric("rail-optimized", {"servers": 8}, source="test")


@pytest.fixture(scope="module")
def console(fabric) -> Iterator[tuple[ConsoleState, ConsoleServices, ServerHandle]]:  # type: ignore[no-untyped-def]
    state, svc = build_twin_console(fabric)
    app = create_app(state, ApiSettings(token=TOKEN), svc)
    h = start_server(app)
    try:
        yield state, svc, h
    finally:
        h.stop()
        svc.close()


def _client(h: ServerHandle, token: str | None = TOKEN) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=h.url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def with_incident(console):  # type: ignore[no-untyped-def]
    """The twin after a gray link was injected at t=30 s and 90 s more were simulated."""
    _, svc, h = console
    assert svc.supervisor is not None
    svc.supervisor.advance_to(30 * NS)
    with _client(h) as c:
        r = c.post("/api/v1/twin/faults", json={"fault": FAULT})
        assert r.status_code == 201, r.text
        assert r.json()["start_ns"] == 30 * NS
    svc.supervisor.advance_to(120 * NS)
    return console


def test_every_api_route_needs_the_token_and_the_page_does_not(console) -> None:  # type: ignore[no-untyped-def]
    _, _, h = console
    with _client(h, None) as c:
        for path in ("/api/v1/status", "/api/v1/incidents", "/api/v1/fabric", "/metrics",
                     "/api/openapi.json", "/api/v1/events"):
            r = c.get(path)
            assert r.status_code == 401, (path, r.status_code)
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert c.get("/").status_code in (200, 503)  # the page (503 only if the UI is absent)
    with _client(h) as c:
        assert c.get("/api/v1/status").json()["mode"] == "twin"
    basic = httpx.BasicAuth("fabricscope", TOKEN)
    assert httpx.get(h.url + "/api/v1/status", auth=basic).status_code == 200
    wrong = httpx.BasicAuth("fabricscope", TOKEN + "x")
    assert httpx.get(h.url + "/api/v1/status", auth=wrong).status_code == 401


def test_failed_logins_are_logged_without_the_secret_and_throttled(
        fabric, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    state = ConsoleState(fabric)
    h = start_server(create_app(state, ApiSettings(token=TOKEN, max_failures=3, lockout_s=30),
                                ConsoleServices()))
    guess = "guess-" + "z" * 20
    try:
        with caplog.at_level(logging.WARNING, logger="fabricscope.serve.auth"), \
                _client(h, guess) as bad, _client(h) as good:
            codes = [bad.get("/api/v1/status").status_code for _ in range(3)]
            assert codes == [401, 401, 429]
            r = good.get("/api/v1/status")  # locked out: even the right token waits
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        text = caplog.text
        assert "failed login from 127.0.0.1" in text and "locked out" in text
        assert guess not in text and TOKEN not in text
    finally:
        h.stop()


def test_openapi_schema_lists_every_endpoint(console) -> None:  # type: ignore[no-untyped-def]
    _, _, h = console
    with _client(h) as c:
        spec = c.get("/api/openapi.json").json()
    paths = set(spec["paths"])
    for p in ("/api/v1/status", "/api/v1/fabric", "/api/v1/fabric/overlay", "/api/v1/incidents",
              "/api/v1/incidents/{id}", "/api/v1/incidents/{id}/ack",
              "/api/v1/incidents/{id}/approve", "/api/v1/findings", "/api/v1/telemetry/series",
              "/api/v1/probes/matrix", "/api/v1/stragglers", "/api/v1/optics",
              "/api/v1/health/checks", "/api/v1/whatif", "/api/v1/whatif/{id}",
              "/api/v1/advise", "/api/v1/twin/faults", "/api/v1/events"):
        assert p in paths, p
    assert spec["openapi"].startswith("3.")


def test_fabric_is_the_inventory(console, fabric) -> None:  # type: ignore[no-untyped-def]
    _, _, h = console
    with _client(h) as c:
        doc = c.get("/api/v1/fabric").json()
    assert doc["counts"]["links"] == len(fabric.links) == len(doc["links"]["id"])
    assert doc["counts"]["gpus"] == 64
    ids = doc["devices"]["id"]
    i = doc["links"]["id"].index(LINK)
    assert {ids[doc["links"]["a"][i]], ids[doc["links"]["b"][i]]} == {"host0002/nic1",
                                                                       "leaf-p0-r1-00"}


def test_injected_fault_becomes_an_incident_with_its_evidence(with_incident) -> None:  # type: ignore[no-untyped-def]
    _, _, h = with_incident
    with _client(h) as c:
        lst = c.get("/api/v1/incidents", params={"status": "open"}).json()
        assert lst["total"] >= 1
        hit = [i for i in lst["items"] if i["resource"] == LINK]
        assert hit and hit[0]["kind"] == "gray-link"
        # found within 30 s of simulated time after the injection
        assert hit[0]["root_cause_ns"] - 30 * NS <= 30 * NS
        d = c.get(f"/api/v1/incidents/{hit[0]['id']}").json()
        assert d["incident"]["root_causes"][0]["fault"] == "gray-link"
        assert d["findings"] and all(f["id"] in d["incident"]["findings"] for f in d["findings"])
        assert any("lost" in e for f in d["findings"] for e in f["evidence"])
        assert d["history"][0]["what"].startswith("opened")
        # filters
        assert c.get("/api/v1/incidents", params={"kind": "gray-link"}).json()["total"] >= 1
        assert c.get("/api/v1/incidents", params={"kind": "pfc-storm"}).json()["total"] == 0
        assert c.get("/api/v1/incidents", params={"q": "host0002/nic1"}).json()["total"] >= 1
        r = c.get("/api/v1/incidents", params={"severity": "loud"})
        assert r.status_code == 400 and "severity" in r.json()["detail"]
        assert c.get("/api/v1/incidents/inc-nope").status_code == 404


def test_ack_and_approve_are_recorded_not_executed(with_incident) -> None:  # type: ignore[no-untyped-def]
    state, _, h = with_incident
    inc = state.incidents(status="open")[1][0]
    with _client(h) as c:
        assert c.post(f"/api/v1/incidents/{inc.id}/ack", json={"note": "on it"}).status_code == 200
        r = c.post(f"/api/v1/incidents/{inc.id}/approve", json={"action": "reboot the world"})
        assert r.status_code == 400 and "proposed" in r.json()["detail"]
        action = inc.root_causes[0].action
        r = c.post(f"/api/v1/incidents/{inc.id}/approve", json={"action": action})
        assert r.status_code == 200 and r.json()["approval"]["executed"] is False
        d = c.get(f"/api/v1/incidents/{inc.id}").json()
        assert d["ack"]["note"] == "on it" and d["approvals"][0]["action"] == action
        assert any(i["acked"] for i in c.get("/api/v1/incidents").json()["items"])


def test_bad_fault_is_a_400_naming_it(console) -> None:  # type: ignore[no-untyped-def]
    _, _, h = console
    with _client(h) as c:
        r = c.post("/api/v1/twin/faults", json={"fault": "gray-loss:nowhere:eth9"})
        assert r.status_code == 400 and "not in the inventory" in r.json()["detail"]
        r = c.post("/api/v1/twin/faults", json={"fault": 7})
        assert r.status_code == 400 and r.json()["detail"].startswith("fault:")


def test_sse_streams_incidents_live(fabric) -> None:  # type: ignore[no-untyped-def]
    state, svc = build_twin_console(fabric, views=False)
    h = start_server(create_app(state, ApiSettings(token=TOKEN), svc))
    got: list[str] = []
    ready = threading.Event()

    def listen() -> None:
        with _client(h) as c, c.stream("GET", "/api/v1/events") as s:
            for line in s.iter_lines():
                ready.set()
                got.append(line)
                if line.startswith("event: incident"):
                    return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    try:
        assert ready.wait(10)
        assert svc.supervisor is not None
        svc.supervisor.inject(FAULT)
        svc.supervisor.advance_to(60 * NS)
        t.join(30)
        assert "event: incident" in got
    finally:
        h.stop()
        svc.close()


def test_telemetry_series_is_downsampled_in_the_store(fabric) -> None:  # type: ignore[no-untyped-def]
    store = TelemetryStore()
    n = 3600
    rng = np.random.default_rng(7)
    ts = np.arange(n, dtype=np.int64) * NS
    vals = np.cumsum(rng.integers(0, 1000, n)).astype(float)
    rows = []
    for port, v in (("eth1", vals), ("eth2", vals * 2)):
        rows.append(pa.table({"ts_ns": ts, "target": ["leaf-01"] * n,
                              "name": ["/interfaces/interface/state/counters/in-octets"] * n,
                              "tags": [json.dumps({"interface_name": port})] * n,
                              "value_num": v, "value_str": pa.nulls(n, pa.string())}))
    for t in rows:
        store.write_table(t)
    state = ConsoleState(fabric, mode="store")
    svc = ConsoleServices(telemetry=store.con.cursor())
    h = start_server(create_app(state, ApiSettings(token=TOKEN), svc))
    name = "/interfaces/interface/state/counters/in-octets"
    try:
        with _client(h) as c:
            q = {"target": "leaf-01", "name": name, "interface": "eth1", "start_ns": 0,
                 "end_ns": n * NS, "points": 60}
            doc = c.get("/api/v1/telemetry/series", params=q).json()
            assert len(doc["points"]) == 60 and doc["raw_points"] == n
            step = doc["step_ns"] // NS
            assert np.allclose([p[1] for p in doc["points"]],
                               vals.reshape(-1, step).mean(axis=1))
            rate = c.get("/api/v1/telemetry/series", params={**q, "agg": "rate"}).json()
            d = np.diff(vals)
            expect = [d[max(0, i * step - 1): (i + 1) * step - 1].mean() for i in range(60)]
            assert np.allclose([p[1] for p in rate["points"]], expect)
            r = c.get("/api/v1/telemetry/series", params={**q, "interface": None})
            assert r.status_code == 400 and "2 series" in r.json()["detail"]
            r = c.get("/api/v1/telemetry/series", params={**q, "agg": "median"})
            assert r.status_code == 400 and "agg" in r.json()["detail"]
            names = c.get("/api/v1/telemetry/names").json()["names"]
            assert names == [{"name": name, "targets": 1}]
    finally:
        h.stop()
        store.close()


def test_whatif_runs_the_simulator(console) -> None:  # type: ignore[no-untyped-def]
    _, _, h = console
    sc = {"topology": {"kind": "rail-optimized", "params": {"servers": 16, "servers_per_leaf": 4}},
          "workload": {"kind": "permutation", "size": "8MiB"}, "lb": ["ecmp", "spray"],
          "seeds": [0]}
    with _client(h) as c:
        r = c.post("/api/v1/whatif", json={"scenario": sc})
        assert r.status_code == 202
        wid = r.json()["id"]
        deadline = time.monotonic() + 60
        while (doc := c.get(f"/api/v1/whatif/{wid}").json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert doc["status"] == "done", doc["error"]
        assert [row["scheme"] for row in doc["table"]] == ["ecmp", "spray"]
        bad = c.post("/api/v1/whatif", json={"scenario": {**sc, "lb": ["magic"]}})
        assert bad.status_code == 400 and "lb" in bad.json()["detail"]


def test_advisor_answers_from_the_console_findings(with_incident) -> None:  # type: ignore[no-untyped-def]
    _, _, h = with_incident
    with _client(h) as c:
        ans = c.post("/api/v1/advise", json={"symptom": "slow all-reduce on host0002"}).json()
    rcs = ans["answer"]["root_causes"]
    assert rcs and rcs[0]["resource"] == LINK and rcs[0]["fault"] == "gray-link"
    assert ans["answer"]["plan"]


def test_health_checks_say_they_are_not_built(console) -> None:  # type: ignore[no-untyped-def]
    _, _, h = console
    with _client(h) as c:
        doc = c.get("/api/v1/health/checks").json()
    assert doc["available"] is False and "not built" in doc["reason"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: apt-get install openssl")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ca", "-days", "1")
    (d / "srv.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("srv", ["-extfile", "srv.ext"]), ("cli", [])):
        ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext)
    return d


def test_tls_and_mtls(fabric, pki: Path) -> None:  # type: ignore[no-untyped-def]
    state = ConsoleState(fabric)
    tls = TlsFiles(pki / "srv.pem", pki / "srv.key", pki / "ca.pem")
    tls.check()
    h = start_server(create_app(state, ApiSettings(token=TOKEN), ConsoleServices()), tls=tls)
    try:
        assert h.url.startswith("https://")
        hdr = {"Authorization": f"Bearer {TOKEN}"}
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        ctx.load_cert_chain(str(pki / "cli.pem"), str(pki / "cli.key"))
        ok = httpx.get(h.url + "/api/v1/status", headers=hdr, verify=ctx)
        assert ok.status_code == 200
        bare = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with pytest.raises(httpx.HTTPError):  # no client certificate: the handshake fails
            httpx.get(h.url + "/api/v1/status", headers=hdr, verify=bare)
    finally:
        h.stop()


def _serve(args: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("FABRICSCOPE_TOKEN", None)
    exe = str(Path(sys.executable).with_name("fabricscope"))
    return subprocess.Popen([exe, "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_serve_refuses_a_public_address_without_tls(tmp_path: Path) -> None:
    p = _serve(["--host", "198.18.0.1", "--port", "0"], tmp_path)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "--host 198.18.0.1" in err and "TLS" in err and "Traceback" not in err


def test_serve_runs_the_twin_live_and_stops_within_its_deadline(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    p = _serve(["--port", "0", "--token-file", str(tok), "--speed", "10", "--fault",
                FAULT.replace(",", "@10s,", 1)], tmp_path)
    try:
        url = None
        assert p.stderr is not None
        for line in p.stderr:
            if line.startswith("fabricscope console on "):
                url = line.split()[3].rstrip("/")
                break
        assert url, "no startup line"
        assert oct(tok.stat().st_mode & 0o777) == "0o600"
        token = tok.read_text().strip()
        assert token not in line
        deadline = time.monotonic() + 60
        hit = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            while not hit and time.monotonic() < deadline:
                hit = [i for i in c.get("/api/v1/incidents").json()["items"]
                       if i["resource"] == LINK]
                time.sleep(0.5)
        assert hit, "the injected fault never became an incident"
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        rest = p.communicate(timeout=20)[1]
        assert time.monotonic() - t0 < 10
        # Ctrl-C: exit 130 (the convention of every command), after a clean shutdown
        assert p.returncode == 130 and "stopped after" in rest and "Traceback" not in rest
        assert token not in rest
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_hostile_clients_are_cut_off(fabric) -> None:  # type: ignore[no-untyped-def]
    """A connection that sends nothing or half its headers is closed at the header deadline;
    a body over the cap is a 413 (by Content-Length or counted while it streams)."""
    import socket

    state = ConsoleState(fabric)
    h = start_server(create_app(state, ApiSettings(token=TOKEN), ConsoleServices()),
                     header_timeout_s=1.0)
    port = int(h.url.rsplit(":", 1)[1])
    try:
        for first in (b"", b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                if first:
                    s.sendall(first)
                t0 = time.monotonic()
                assert s.recv(100) == b""  # closed by the server, not by our timeout
                assert time.monotonic() - t0 < 5
        with _client(h) as c:
            assert c.get("/api/v1/status").status_code == 200  # still serving
            big = b"x" * (1 << 20 + 1)
            r = c.post("/api/v1/advise", content=big,
                       headers={"Content-Type": "application/json"})
            assert r.status_code == 413 and "larger than" in r.json()["detail"]

            def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
                for _ in range(40):
                    yield b"y" * 65536

            r = c.post("/api/v1/advise", content=chunks(),
                       headers={"Content-Type": "application/json"})
            assert r.status_code == 413
    finally:
        h.stop()


def test_counters_behind_a_telemetry_finding(fabric) -> None:  # type: ignore[no-untyped-def]
    """A PFC storm's finding comes with the port's counters: the pause counter the storm
    drives moved (at the injected rate), the others did not."""
    state, svc = build_twin_console(fabric)
    h = start_server(create_app(state, ApiSettings(token=TOKEN), svc))
    try:
        assert svc.supervisor is not None
        svc.supervisor.advance_to(30 * NS)
        svc.supervisor.inject("pfc-storm:leaf-p0-r1-00:eth2,rate=2e5")
        svc.supervisor.advance_to(90 * NS)
        storm = [o for o in state.findings(source="telemetry") if o.kind == "pause-storm"]
        assert storm
        with _client(h) as c:
            d = c.get(f"/api/v1/findings/{storm[0].id}/counters").json()
            assert (d["target"], d["interface"]) == ("leaf-p0-r1-00", "eth2")
            moved = {s["name"].rsplit("/", 1)[1]: s for s in d["series"] if s["moved"]}
            assert "out-mac-pause-frames" in moved
            peak = max(p[1] for p in moved["out-mac-pause-frames"]["points"] if p[1] is not None)
            assert peak == pytest.approx(2e5, rel=0.05)
            assert not {"in-crc-errors", "in-fcs-errors"} & set(moved)
            probe = state.findings(source="probe")
            if probe:  # not a telemetry finding: no series, and the reason
                assert c.get(f"/api/v1/findings/{probe[0].id}/counters").json()["reason"]
            assert c.get("/api/v1/findings/f-nope/counters").status_code == 404
    finally:
        h.stop()
        svc.close()
