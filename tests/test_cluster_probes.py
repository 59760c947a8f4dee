"""Probe samples over the NATS bus (issue 14): agents publish, `worker --role probes` localizes.

Real nats-server. The samples come from the probe twin (a gray link injected) and from two
real `probe agent --nats` processes on loopback; the worker is the real `ProbeWorker` and the
real `fabricscope worker --role probes` CLI.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabricscope.cluster.bus import BusConfig, BusPublisher, connect
from fabricscope.cluster.encoding import decode_findings
from fabricscope.fabric import leaf_spine_fabric
from fabricscope.fabric.io import read_fabric, write_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.service.incident_bus import IncidentWorker
from fabricscope.service.probe_bus import ProbeWorker
from fabricscope.service.probe_live import analyze_observations
from fabricscope.store.findings import DiagnosisStore
from fabricscope.store.probes import ProbeStore
from test_cluster_bus import NATS, NatsServer, nats_server  # noqa: F401  (the fixture)
from test_probe_agent_service import _loopback_inventory

pytestmark = pytest.mark.skipif(NATS is None, reason="nats-server binary not installed (CI installs it: .ci/run)")

CLI = [sys.executable, "-c", "from fabricscope.cli import main; main()"]
FAULT = "gray:spine-01:eth3->leaf-002:eth4,loss=0.05"
WINDOW_S, LATENESS_S = 20.0, 2.0


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[ProbeSample], list[int], Path]:
    """60 s of twin probes with a 5 % gray link: (inventory, samples, statuses, the twin's store)."""
    d = tmp_path_factory.mktemp("probe-twin")
    inv = write_fabric(leaf_spine_fabric(leaves=4, hosts_per_leaf=2, spines=2), d / "lab.json")
    db = d / "twin.duckdb"
    r = subprocess.run([*CLI, "probe", "twin", "-i", str(inv), "--fault", FAULT, "--duration", "60",
                        "--db", str(db)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    st = ProbeStore(db)
    rows = st.con.execute("SELECT src, dst, src_ip, dst_ip, src_port, dst_port, proto, seq, t_send_ns, "
                          "t_resp_rx_ns, t_resp_tx_ns, t_recv_ns, status FROM probes ORDER BY t_send_ns").fetchall()
    st.close()
    samples = [ProbeSample(r[0], r[1], FiveTuple(r[2], r[3], r[4], r[5], r[6]), r[7], r[8], r[9], r[10], r[11])
               for r in rows]
    return inv, samples, [int(r[12]) for r in rows], db


def _publish(url: str, samples: list[ProbeSample], statuses: list[int]) -> None:
    pub = BusPublisher(BusConfig(url=url))
    for i in range(0, len(samples), 5000):  # as an agent does, in flushes
        pub.write_probes(samples[i:i + 5000], statuses[i:i + 5000])
    pub.close(deadline_s=30)
    st = pub.stats()
    assert st.published_events == len(samples) and st.lost_events == 0, st


def _run(w: ProbeWorker, until_samples: int, timeout_s: float = 60.0) -> None:
    asyncio.run(w.run(until=lambda s: w.samples >= until_samples and w.windows >= 1, duration_s=timeout_s))


def _expected_windows(samples: list[ProbeSample]) -> list[tuple[int, int]]:
    w = int(WINDOW_S * 1e9)
    first = min(s.t_send_ns for s in samples) // w * w
    newest = max(s.t_send_ns for s in samples)
    out = []
    end = first + w
    while end + int(LATENESS_S * 1e9) <= newest:
        out.append((end - w, end))
        end += w
    return out


def test_worker_localizes_each_window_as_probe_analyze_does(nats_server: NatsServer, tmp_path: Path,  # noqa: F811
                                                            twin: tuple[Path, list[ProbeSample], list[int], Path]) -> None:
    inv, samples, statuses, twin_db = twin
    fabric = read_fabric(inv)
    _publish(nats_server.url, samples, statuses)
    seen: list[tuple[tuple[int, int], list[str]]] = []
    w = ProbeWorker(BusConfig(url=nats_server.url), fabric, tmp_path / "w.duckdb", window_s=WINDOW_S,
                    lateness_s=LATENESS_S, on_findings=lambda f, win: seen.append((win, [x.subject for x in f])))
    expected = _expected_windows(samples)
    asyncio.run(w.run(until=lambda s: w.windows >= len(expected), duration_s=60))
    assert w.samples == len(samples) and w.stats().decode_errors == 0
    assert [win for win, _ in seen] == expected
    # the same findings as the analysis run directly on the twin's own store, window by window:
    # the bus (with the prober's statuses) loses nothing the localization uses
    ref = ProbeStore(twin_db)
    for (t0, t1), subjects in seen:
        direct = analyze_observations(fabric, ref.observations(t0_ns=t0, t1_ns=t1))
        assert subjects == [f.subject for f in direct], (t0, t1)
    ref.close()
    blamed = {s for _, subs in seen for s in subs}
    assert any("spine-01:eth3" in s and "leaf-002:eth4" in s for s in blamed), seen
    # ... and they are on the findings stream
    async def read_findings() -> list[str]:
        nc = await connect(BusConfig(url=nats_server.url))
        js = nc.jetstream()
        sub = await js.pull_subscribe("fs.findings.>", durable="check", stream="FS_FINDINGS")
        got: list[str] = []
        try:
            while True:
                for m in await sub.fetch(batch=50, timeout=1.0):
                    got.extend(f.subject for f in decode_findings(m.data))
                    await m.ack()
        except Exception:  # the timeout once the stream is read
            pass
        await nc.close()
        return got
    assert sorted(asyncio.run(read_findings())) == sorted(s for _, subs in seen for s in subs)


def test_worker_stopped_and_restarted_on_its_file_loses_and_repeats_nothing(
        nats_server: NatsServer, tmp_path: Path, twin: tuple[Path, list[ProbeSample], list[int], Path]) -> None:  # noqa: F811
    inv, samples, statuses, _ = twin
    fabric = read_fabric(inv)
    _publish(nats_server.url, samples, statuses)
    db = tmp_path / "w.duckdb"
    cfg = BusConfig(url=nats_server.url)
    first = ProbeWorker(cfg, fabric, db, window_s=WINDOW_S, lateness_s=LATENESS_S, fetch_batch=1)
    asyncio.run(first.run(until=lambda s: first.samples >= len(samples) // 3, duration_s=60))
    assert 0 < first.samples < len(samples)
    second = ProbeWorker(cfg, fabric, db, window_s=WINDOW_S, lateness_s=LATENESS_S)
    expected = _expected_windows(samples)
    asyncio.run(second.run(until=lambda s: second.done_end_ns == expected[-1][1]
                           and first.samples + second.samples >= len(samples), duration_s=60))
    assert first.samples + second.samples == len(samples)
    st = ProbeStore(db)
    assert st.count() == len(samples)  # every sample once
    ends = [r[0] for r in st.con.execute("SELECT end_ns FROM fs_probe_windows ORDER BY end_ns").fetchall()]
    st.close()
    assert ends == [e for _, e in expected]  # every window once, none skipped
    assert first.windows + second.windows == len(expected)


def test_bad_worker_settings_are_one_clear_error(tmp_path: Path) -> None:
    fabric = leaf_spine_fabric(leaves=1, hosts_per_leaf=2, spines=1)
    with pytest.raises(ConfigError, match="window 0 s must be > 0"):
        ProbeWorker(None, fabric, tmp_path / "x.duckdb", window_s=0)
    with pytest.raises(ConfigError, match="retain 5 s >= the window"):
        ProbeWorker(None, fabric, tmp_path / "x.duckdb", window_s=30, retain_s=5)
    with pytest.raises(ConfigError, match="method must be map or 007"):
        ProbeWorker(None, fabric, tmp_path / "x.duckdb", method="bayes")
    r = subprocess.run([*CLI, "worker", "--role", "probes", "--nats", "nats://127.0.0.1:1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--inventory" in r.stderr, r.stderr
    r = subprocess.run([*CLI, "probe", "agent", "-i", "x.json", "--self", "h", "--nats", "ftp://x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_real_agents_publish_and_the_worker_cli_stores_every_sample(nats_server: NatsServer,  # noqa: F811
                                                                     tmp_path: Path) -> None:
    inv, _ = _loopback_inventory(tmp_path)
    pdb = tmp_path / "probes.duckdb"
    worker = subprocess.Popen([*CLI, "worker", "--role", "probes", "--nats", nats_server.url, "-i", str(inv),
                               "--probe-db", str(pdb), "--window", "2", "--lateness", "1", "--json-stats"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = [tmp_path / f"agent{k}.log" for k in range(2)]
    agents = []
    for h, lg in zip(("host0000", "host0001"), logs, strict=True):
        with lg.open("w") as fh:
            agents.append(subprocess.Popen([*CLI, "probe", "agent", "-i", str(inv), "--self", h, "--nats",
                                            nats_server.url, "--rate", "200", "--epoch", "3600",
                                            "--stats-interval", "1"], stdout=subprocess.PIPE, stderr=fh, text=True))

    def sent(lg: Path) -> int:
        lines = [ln for ln in lg.read_text().splitlines() if ln.startswith("probe agent: sent ")]
        return int(lines[-1].split()[3]) if lines else 0

    try:
        # every agent probing for about 6 s (start-up takes seconds on a busy machine)
        end = time.monotonic() + 90
        while time.monotonic() < end and min(sent(lg) for lg in logs) < 6 * 200:
            assert all(a.poll() is None for a in agents), [lg.read_text()[-1000:] for lg in logs]
            time.sleep(0.5)
        for a in agents:
            a.send_signal(signal.SIGTERM)
        outs = [(a.communicate(timeout=30)[0], lg.read_text()) for a, lg in zip(agents, logs, strict=True)]
        time.sleep(3.0)  # the worker takes the last flushes
        worker.send_signal(signal.SIGTERM)
        w_out, w_err = worker.communicate(timeout=30)
    finally:
        for p in (*agents, worker):
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [a.returncode for a in agents] == [143, 143], [e for _, e in outs]
    assert worker.returncode == 143, w_err
    total = 0
    for out, err in outs:
        final = json.loads(out.strip().splitlines()[-1])
        line = next(ln for ln in err.splitlines() if " published " in ln)
        published = int(line.split(" published ")[1].split()[0])
        assert published == final["samples_stored"] == final["probes_sent"] > 0, err
        assert ", lost 0" in line and "Traceback" not in err
        total += published
    stats = json.loads(w_out.strip().splitlines()[-1])
    assert stats["probe_samples"] == total and stats["decode_errors"] == 0, stats
    assert stats["windows"] >= 2, stats
    # agents start and stop at different moments: their probes to a peer not yet (no
    # longer) running are left out, so a healthy loopback gives no finding
    assert stats["probes_not_running"] > 0 and stats["findings_published"] == 0, stats
    st = ProbeStore(pdb)
    assert st.count() == total
    st.close()
    assert "Traceback" not in w_err


def test_probe_findings_become_an_incident_naming_the_gray_link_and_a_restart_rebuilds_it(
        nats_server: NatsServer, tmp_path: Path, twin: tuple[Path, list[ProbeSample], list[int], Path]) -> None:  # noqa: F811
    """The loop over the bus: twin probes -> probe worker -> fs.findings -> incident worker ->
    fs.incidents and a DiagnosisStore, with the root cause on the injected cable."""
    inv, samples, statuses, _ = twin
    fabric = read_fabric(inv)
    cfg = BusConfig(url=nats_server.url)
    _publish(nats_server.url, samples, statuses)
    pw = ProbeWorker(cfg, fabric, tmp_path / "p.duckdb", window_s=WINDOW_S, lateness_s=LATENESS_S)
    asyncio.run(pw.run(until=lambda s: pw.windows >= len(_expected_windows(samples)), duration_s=60))
    assert pw.findings

    def run_incidents(db: Path | None) -> IncidentWorker:
        iw: IncidentWorker
        # judged on the findings' own (twin) clock, one second after the newest
        iw = IncidentWorker(cfg, fabric, db=db, tick_s=0.0, clock=lambda: iw.latest_ns + 1_000_000_000)
        asyncio.run(iw.run(until=lambda s: iw.findings >= len(pw.findings) and bool(iw.incidents), duration_s=60))
        return iw

    iw = run_incidents(tmp_path / "diag.duckdb")
    assert iw.findings == len(pw.findings) and iw.unknown == 0
    # live probes do not know the flows' ECMP choices: the probe analysis names the two links
    # into leaf-002 as one ambiguous set (the injected one among them), and the incident must
    # not be more certain than that evidence
    candidates = {frozenset(link.split("->")) for f in pw.findings for link in f.subject.split(" | ")}
    assert frozenset({"spine-01:eth3", "leaf-002:eth4"}) in candidates, candidates
    tops = [inc.root_causes[0] for inc in iw.incidents.values() if inc.root_causes]
    assert tops and all(rc.fault == "gray-link" and frozenset(rc.resource.split("|")) in candidates
                        and rc.probability <= 0.5 + 1e-9 for rc in tops), tops
    with DiagnosisStore(tmp_path / "diag.duckdb", read_only=True) as st:
        assert {i.id for i in st.incidents()} == set(iw.incidents)
        assert len(st.findings()) == len(pw.findings)
    # a restarted incident worker rebuilds the same incidents from the findings stream
    again = run_incidents(None)
    assert {i.id: [(rc.resource, rc.fault) for rc in i.root_causes] for i in again.incidents.values()} == \
        {i.id: [(rc.resource, rc.fault) for rc in i.root_causes] for i in iw.incidents.values()}

    async def incident_messages() -> list[dict[str, object]]:
        nc = await connect(cfg)
        sub = await nc.jetstream().pull_subscribe("fs.incidents.>", durable="check", stream="FS_INCIDENTS")
        got: list[dict[str, object]] = []
        try:
            while True:
                for m in await sub.fetch(batch=50, timeout=1.0):
                    got.append(json.loads(m.data))
                    await m.ack()
        except Exception:  # the timeout once the stream is read
            pass
        await nc.close()
        return got
    msgs = asyncio.run(incident_messages())
    assert {m["id"] for m in msgs} == set(iw.incidents)
