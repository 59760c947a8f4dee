"""``fabricscope gnmi``: serve-twin + get/subscribe/collect end to end through the real CLI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest


def _cli(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_serve_twin_then_get_subscribe_and_collect(tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "GNMI_PW": "s3cret"}
    server = subprocess.Popen(
        [sys.executable, "-c", "from fabricscope.cli import main; main()", "gnmi", "serve-twin",
         "--address", f"127.0.0.1:{port}", "--duration", "25", "--username", "admin", "--password-env", "GNMI_PW",
         "--fault", "link-flap leaf-000:eth5|spine-00:eth1 start=0s period_ns=1e9"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert f"127.0.0.1:{port}" in line and "auth=on" in line
        addr = f"127.0.0.1:{port}"
        r = _cli("gnmi", "get", addr, "-t", "leaf-000", "/interfaces/interface[name=eth1]/state/counters/in-octets",
                 "--json", "--username", "admin", "--password-env", "GNMI_PW", env=env)
        assert r.returncode == 0, r.stderr
        assert '"interface_name": "eth1"' in r.stdout
        bad = _cli("gnmi", "get", addr, "-t", "leaf-000", "/interfaces", "--username", "admin",
                   "--password-env", "NOPE_UNSET", env=env)
        assert bad.returncode == 2 and "NOPE_UNSET" in bad.stderr and "Traceback" not in bad.stderr
        wrong = _cli("gnmi", "get", addr, "-t", "leaf-000", "/interfaces", env=env)
        assert wrong.returncode == 2 and "UNAUTHENTICATED" in wrong.stderr
        sub = _cli("gnmi", "subscribe", addr, "-t", "leaf-000", "/interfaces/interface[name=eth5]/state/oper-status",
                   "--stream-mode", "on-change", "--duration", "2.5", "--username", "admin",
                   "--password-env", "GNMI_PW", env=env)
        assert sub.returncode == 0, sub.stderr
        states = [ln.rsplit("= ", 1)[1] for ln in sub.stdout.splitlines() if "oper-status" in ln]
        assert "UP" in states and "DOWN" in states  # the flap, seen on change
        cfg = tmp_path / "collector.yaml"
        db = tmp_path / "t.duckdb"
        cfg.write_text(f"""
targets:
  twin:
    address: {addr}
    names: [leaf-000, spine-00]
    username: admin
    password-env: GNMI_PW
subscriptions:
  ifs:
    paths: ["/interfaces/interface[name=*]/state"]
    sample-interval: 500ms
detectors: {{link-flap: {{}}}}
sinks:
  - {{type: duckdb, path: "{db}"}}
""")
        col = _cli("gnmi", "collect", "--config", str(cfg), "--duration", "4", env=env)
        assert col.returncode == 0, col.stderr
        assert "link-flap" in col.stdout and "leaf-000:eth5" in col.stdout
        con = duckdb.connect(str(db), read_only=True)
        n = con.execute("SELECT count(*) FROM telemetry").fetchone()
        f = con.execute("SELECT kind, subject FROM findings").fetchall()
        assert n is not None and n[0] > 100
        assert ("link-flap", "leaf-000:eth5") in f
        con.close()
        # SIGTERM (systemd, docker stop) drains the buffer into the store and prints the summary
        db.unlink()
        proc = subprocess.Popen([sys.executable, "-c", "from fabricscope.cli import main; main()", "gnmi", "collect",
                                 "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        time.sleep(3.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err  # terminated: the exit code says so, after the drain
        summary = out.strip().splitlines()[-1]  # "received N, written N, findings K"
        received, written = (int(x.split()[1]) for x in summary.split(",")[:2])
        assert received == written > 0, summary
        n = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM telemetry").fetchone()
        assert n is not None and n[0] == written
    finally:
        server.terminate()
        server.wait(10)


def test_collect_with_a_bad_config_is_one_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("targets: {t: {address: 127.0.0.1:1}}\nsubscriptions: {s: {paths: [/a], mode: streem}}\n")
    t0 = time.monotonic()
    r = _cli("gnmi", "collect", "--config", str(cfg))
    assert r.returncode == 2
    assert "c.yaml" in r.stderr and "subscriptions.s.mode" in r.stderr and "'streem'" in r.stderr
    assert "Traceback" not in r.stderr and time.monotonic() - t0 < 30
