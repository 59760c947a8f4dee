"""The ``cluster:`` config section, ``gnmi collect --cluster`` and ``fabricscope worker`` (issue 14).

Config parsing is pure; the worker tests run the real CLI against a real nats-server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli_inprocess import run_main
from fabricscope.model.errors import ConfigError
from fabricscope.telemetry.config import (
    ClusterConfig,
    default_member_name,
    load_config,
    parse_config,
)
from test_cluster_e2e import _MAIN, NATS, free_port, nats_server

BASE: dict[str, Any] = {
    "targets": {"twin": {"address": "127.0.0.1:9339", "names": ["leaf-000", "leaf-001"]}},
    "subscriptions": {"c": {"paths": ["/interfaces/interface[name=*]/state/counters"]}},
}


def _cfg(cluster: object) -> dict[str, Any]:
    return {**BASE, "cluster": cluster}


def test_no_cluster_section_is_the_embedded_mode_unchanged() -> None:
    assert parse_config(BASE).cluster is None


def test_cluster_section_parsed_with_defaults_and_no_secret_in_repr(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    c = parse_config(_cfg({"nats": "tls://bus.example:4222", "user": "fs", "password-env": "FS_NATS_PW",
                           "tls-ca": str(ca), "lease": "5s", "max-bytes": 1 << 24}), source="c.yaml").cluster
    assert isinstance(c, ClusterConfig)
    assert (c.nats, c.user, c.password_env, c.tls_ca, c.lease_ns, c.max_bytes) == (
        "tls://bus.example:4222", "fs", "FS_NATS_PW", str(ca), 5_000_000_000, 1 << 24)
    assert c.member == default_member_name() and c.storage == "file"
    d = parse_config(_cfg({"nats": "nats://127.0.0.1:4222", "member": "col-a"})).cluster
    assert d is not None and d.member == "col-a" and d.lease_ns == 3_000_000_000
    assert "s3cret" not in repr(parse_config(_cfg({"nats": "nats://h:1", "token-env": "FS_TOKEN"})))


@pytest.mark.parametrize(("cluster", "message"), [
    ({"member": "a"}, r"c\.yaml: cluster\.nats: required"),
    ({"nats": "http://h:4222"}, r"c\.yaml: cluster\.nats: expected nats://host:port or tls://host:port, got 'http://h:4222'"),
    ({"nats": "nats://h:99999"}, r"cluster\.nats: expected nats://host:port"),
    ({"nats": "nats://h:1", "member": "a b"}, r"cluster\.member: expected 1-128 letters, digits, '-' or '_', got 'a b'"),
    ({"nats": "nats://h:1", "lease": "10ms"}, r"cluster\.lease: must be between 200ms and 1h, got '10ms'"),
    ({"nats": "nats://h:1", "leas": "3s"}, r"cluster\.leas: unknown field; allowed: "),
    ({"nats": "nats://h:1", "password-env": "X"}, r"cluster\.user: password-env is given but no user"),
    ({"nats": "nats://h:1", "user": "u", "token-env": "T"}, r"cluster: user, token-env and creds: choose one"),
    ({"nats": "nats://h:1", "creds": "/nonexistent.creds"}, r"cluster\.creds: no such file '/nonexistent\.creds'"),
    ({"nats": "nats://h:1", "storage": "disk"}, r"cluster\.storage: expected file\|memory, got 'disk'"),
    ("nats://h:1", r"c\.yaml: cluster: expected a mapping, got str"),
])
def test_cluster_section_errors_name_file_and_field(cluster: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_cfg(cluster), source="c.yaml")


def test_secret_pasted_as_an_env_name_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(_cfg({"nats": "nats://h:1", "user": "u", "password-env": "hunter2 pass!"}), source="c.yaml")
    assert "hunter2" not in str(ei.value) and "cluster.password-env" in str(ei.value)


def test_tls_cert_needs_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match=r"cluster\.tls-cert: give tls-cert and tls-key together"):
        parse_config(_cfg({"nats": "nats://h:1", "tls-cert": str(cert)}), source="c.yaml")


def test_collect_cluster_without_section_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(BASE))
    assert load_config(p).cluster is None
    code, out, err = run_main(capsys, monkeypatch, "gnmi", "collect", "--config", str(p), "--cluster")
    assert code == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{p}: cluster: --cluster needs a cluster: section" in lines[0], err


def _worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _MAIN, "worker", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_worker_bad_flags_exit_2_with_one_line() -> None:
    for args, want in ((["--nats", "http://x:1"], "--nats: expected nats://host:port"),
                       (["--duration", "-1"], "--duration: expected a number of seconds > 0"),
                       (["--nats", f"nats://127.0.0.1:{free_port()}", "--duration", "1"], "cannot connect to")):
        p = _worker(*args)
        _out, err = p.communicate(timeout=30)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and want in lines[0], (args, p.returncode, err)
        assert "Traceback" not in err


@pytest.mark.skipif(not os.path.exists(NATS), reason="nats-server not installed (CI installs it)")
def test_worker_finds_stores_and_drains_on_sigterm(tmp_path: Path) -> None:
    from fabricscope.cluster.bus import BusConfig, BusPublisher
    from fabricscope.model.records import TelemetryEvent
    from fabricscope.store.findings import DiagnosisStore

    db = tmp_path / "f.duckdb"
    name = "/interfaces/interface/state/counters/in-errors"
    with nats_server() as url:
        pub = BusPublisher(BusConfig(url=url))
        t0 = 1_700_000_000_000_000_000
        evs = [TelemetryEvent(name, t0 + i * 1_000_000_000, "leaf-000", {"name": "eth1"}, float(v))
               for i, v in enumerate((0, 0, 7))]
        pub.write(evs, [])
        pub.write(evs, [])  # at-least-once: the same events again are dropped by the worker
        assert pub.flush(10)
        pub.close()
        prom = tmp_path / "worker.prom"
        w = _worker("--nats", url, "--durable", "t1", "--db", str(db), "--json-stats", "--metrics-file", str(prom))
        try:
            end = time.monotonic() + 20
            assert w.stdout is not None
            first = w.stdout.readline()  # the printed finding
            assert "error-counter-increase" in first and "leaf-000" in first, first
            assert time.monotonic() < end
            w.send_signal(signal.SIGTERM)
            out, err = w.communicate(timeout=10)
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()
        assert w.returncode == 143, err
        stats = json.loads(out.strip().splitlines()[-1])
        assert stats["unique_events"] == 3 and stats["duplicate_events"] == 3, stats
        assert stats["findings_published"] >= 1 and stats["stored_findings"] == stats["findings_published"]
    # the textfile holds the final counters, in the exposition format Prometheus parses
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    got = {smp.name: smp.value for f in fams.values() for smp in f.samples}
    assert fams["fabricscope_bus_worker_batches"].type == "counter" and fams["fabricscope_bus_worker_lag"].type == "gauge"
    assert got["fabricscope_bus_worker_unique_events_total"] == 3 and got["fabricscope_bus_worker_lag"] == 0, got
    assert got["fabricscope_bus_worker_findings_published_total"] == stats["findings_published"]
    store = DiagnosisStore(db, read_only=True)
    try:
        n = store.con.execute("select count(*) from findings").fetchone()
    finally:
        store.con.close()
    assert n is not None and n[0] == stats["stored_findings"]


def _help_examples() -> list[list[str]]:
    import shlex

    from fabricscope.cli.worker import _HELP

    text = _HELP.split("Examples:", 1)[1].replace("\\\n", " ")
    return [shlex.split(ln.strip()) for ln in text.splitlines() if ln.strip()]


@pytest.mark.skipif(not os.path.exists(NATS), reason="nats-server not installed (CI installs it)")
def test_worker_help_examples_run(tmp_path: Path) -> None:
    from fabricscope.fabric import leaf_spine_fabric
    from fabricscope.fabric.io import write_fabric

    examples = _help_examples()
    assert len(examples) == 5
    plain = [ex for ex in examples if ex[0] == "fabricscope"]
    # the last example needs a TLS server with a user and password: its flags are checked by
    # the config tests of BusConfig, not run here
    assert len(plain) == 4
    files = {"cluster.yaml": str(write_fabric(leaf_spine_fabric(leaves=1, hosts_per_leaf=2, spines=1),
                                              tmp_path / "cluster.yaml")),
             "probes.duckdb": str(tmp_path / "probes.duckdb"), "incidents.duckdb": str(tmp_path / "inc.duckdb")}
    with nats_server() as url:
        for ex in plain:
            args = [url if a == "nats://127.0.0.1:4222" else files.get(a, a) for a in ex[2:]]
            if "--duration" in args:
                args[args.index("--duration") + 1] = "1"
            else:
                args += ["--duration", "1"]
            p = _worker(*args)
            out, err = p.communicate(timeout=30)
            assert p.returncode == 0, (ex, err)
            last = out.strip().splitlines()[-1]
            if "--json-stats" in args:
                assert json.loads(last)["batches"] == 0, out
            elif "incidents" in args:
                assert last.startswith("worker fs-incidents: 0 batches, 0 findings, 0 incidents"), out
            elif "probes" in args:
                assert last.startswith("worker fs-probes: 0 batches, 0 probe samples, 0 windows"), out
            else:
                assert last.startswith("worker fs-detectors: 0 batches, 0 events"), out
