"""The probe agent as a service: bounded shutdown on signals, nothing lost, one owner per port,
oversize datagrams, kernel drops, self-metrics. Real UDP sockets on loopback (127.0.0.0/8)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabricscope.fabric import leaf_spine_fabric
from fabricscope.fabric.io import write_fabric
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import FiveTuple
from fabricscope.probe import wire
from fabricscope.probe.agent import Prober, Responder
from fabricscope.service.probe_live import ProbeAgent
from fabricscope.store.probes import read_jsonl

CLI = [sys.executable, "-c", "from fabricscope.cli import main; main()"]


def _loopback_inventory(tmp: Path) -> tuple[Path, list[str]]:
    """One leaf, two hosts, NIC addresses on 127/8 (unique per test process: no clash with
    other tests binding the probe port)."""
    f = leaf_spine_fabric(leaves=1, hosts_per_leaf=2, spines=1)
    text = write_fabric(f, tmp / "inv0.json").read_text()
    base = f"127.{100 + os.getpid() % 100}.{os.getpid() // 100 % 250}"
    addrs = []
    for k, n in enumerate(f.nics):
        assert n.address is not None
        addrs.append(f"{base}.{k + 1}")
        text = text.replace(f'"{n.address}"', f'"{addrs[-1]}"')
    inv = tmp / "inv.json"
    inv.write_text(text)
    return inv, addrs


def _agent(inv: Path, host: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "probe", "agent", "-i", str(inv), "--self", host, "--jsonl", str(out),
                             "--rate", "200", "--epoch", "3600", "--stats-interval", "1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_samples(path: Path, procs: list[subprocess.Popen[str]], timeout: float = 40.0) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        if path.exists() and path.stat().st_size > 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"no samples in {path} after {timeout} s")


def test_cli_signals_store_every_probe_print_counters_and_exit_130_143(tmp_path: Path) -> None:
    inv, _addrs = _loopback_inventory(tmp_path)
    a_out, b_out = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = _agent(inv, "host0000", a_out)
    b = _agent(inv, "host0001", b_out)
    try:
        _wait_for_samples(a_out, [a, b])
        _wait_for_samples(b_out, [a, b])
        # A second agent on host0000's address must fail loudly, not share the port.
        dup = subprocess.run([*CLI, "probe", "agent", "-i", str(inv), "--self", "host0000", "--jsonl",
                              str(tmp_path / "dup.jsonl"), "--duration", "1"],
                             capture_output=True, text=True, timeout=60)
        assert dup.returncode == 2, dup.stderr
        assert dup.stderr.count("\n") == 1 and "already holds it" in dup.stderr, dup.stderr
        assert "Traceback" not in dup.stderr
        time.sleep(1.5)  # probes in flight at the signal are the point of the test
        a.send_signal(signal.SIGTERM)
        b.send_signal(signal.SIGINT)
        a_stdout, a_err = a.communicate(timeout=30)
        b_stdout, b_err = b.communicate(timeout=30)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert (a.returncode, b.returncode) == (143, 130), (a_err, b_err)
    for stdout, err, out, sig in ((a_stdout, a_err, a_out, "SIGTERM"), (b_stdout, b_err, b_out, "SIGINT")):
        final = json.loads(stdout.strip().splitlines()[-1])
        assert final["stopped_by"] == sig and final["flows"] > 0
        rows = list(read_jsonl(out))
        # Every probe the kernel accepted was stored exactly once, answered or lost.
        assert len(rows) == final["probes_sent"] == final["samples_stored"] > 0
        assert final["probes_answered"] + final["probes_lost"] == final["probes_sent"]
        assert final["probes_pending"] == 0 and final["samples_buffered"] == 0
        assert len({(s.flow.src_port, s.seq) for s, _ in rows}) == len(rows)
        assert final["probes_answered"] > 0.5 * final["probes_sent"]
        # Self-metrics while running (interval 1 s), not only at exit.
        periodic = [ln for ln in err.splitlines() if ln.startswith("probe agent: sent ")]
        assert len(periodic) >= 3, err
        assert f"{sig}: stopping" in err
        assert "Traceback" not in err


def test_cli_bad_output_path_is_one_line_exit_2(tmp_path: Path) -> None:
    inv, _ = _loopback_inventory(tmp_path)
    r = subprocess.run([*CLI, "probe", "agent", "-i", str(inv), "--self", "host0000", "--jsonl",
                        "/nonexistent/x.jsonl", "--duration", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: probe agent: --jsonl /nonexistent/x.jsonl") and r.stderr.count("\n") == 1


def test_responder_rejects_oversize_never_truncates() -> None:
    async def run() -> tuple[Responder, list[int]]:
        resp = await Responder("127.0.0.1", 0).start()
        got: list[int] = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.setblocking(False)
            for size in (wire.SIZE, 2048, 3000, wire.MAX_SIZE, wire.MAX_SIZE + 1, 20_000, 65_000):
                req = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 1, size, 1), size=min(size, wire.MAX_SIZE))
                c.sendto(req + bytes(size - len(req)), ("127.0.0.1", resp.port))
            await asyncio.sleep(0.3)
            while True:
                try:
                    data = c.recv(70_000)
                except BlockingIOError:
                    break
                p = wire.decode(data)
                assert len(data) == p.seq  # the reply is as long as the request: nothing cut
                got.append(p.seq)
        await resp.stop()
        return resp, got

    resp, got = asyncio.run(run())
    assert sorted(got) == [wire.SIZE, 2048, 3000, wire.MAX_SIZE]
    assert resp.counters.rejected == {"oversize": 3}
    assert resp.counters.sent == 4


def test_kernel_receive_drops_are_counted_exactly() -> None:
    n = 400

    async def run() -> Responder:
        resp = await Responder("127.0.0.1", 0, rcvbuf=4096).start()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            req = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 1, 1, 1))
            for _ in range(n):  # no await: the responder cannot drain, its buffer overflows
                c.sendto(req, ("127.0.0.1", resp.port))
        await asyncio.sleep(0.3)
        await resp.stop()
        return resp

    resp = asyncio.run(run())
    c = resp.counters
    assert c.kernel_drops > 0
    assert c.received + c.kernel_drops == n  # every datagram is either seen or counted dropped


def test_bind_conflict_and_send_errors_are_not_probes() -> None:
    async def run() -> None:
        first = await Responder("127.0.0.1", 0).start()
        with pytest.raises(TransportError, match="already holds it"):
            await Responder("127.0.0.1", first.port).start()
        await first.stop()
        # Sends the kernel refuses (here: a broadcast without SO_BROADCAST) are send errors,
        # never samples or losses.
        got: list[int] = []
        pr = Prober("me", [("x", FiveTuple("127.0.0.1", "255.255.255.255", 0, 9))],
                    lambda _s, st: got.append(st), rate_pps=200)
        await pr.start()
        await asyncio.sleep(0.3)
        await pr.stop()
        assert pr.counters.sent == 0 and pr.counters.send_errors > 10 and got == []

    asyncio.run(run())


def test_agent_snapshot_while_running_and_bounded_stop(tmp_path: Path) -> None:
    inv, _ = _loopback_inventory(tmp_path)
    from fabricscope.fabric.io import read_fabric

    fabric = read_fabric(inv)
    lines: list[str] = []

    async def run() -> None:
        b = ProbeAgent(fabric, "host0001", rate_pps=200, epoch_s=3600, jsonl=tmp_path / "b.jsonl",
                       log=lines.append, stats_every_s=0)
        a = ProbeAgent(fabric, "host0000", rate_pps=200, epoch_s=3600, jsonl=tmp_path / "a.jsonl",
                       log=lines.append, stats_every_s=0.4, shutdown_timeout_s=0.5)
        tb, ta = asyncio.create_task(b.run()), asyncio.create_task(a.run())
        await asyncio.sleep(1.5)
        mid = a.snapshot()
        assert mid.probes_sent > 100 and mid.probes_answered > 50 and mid.responder_received > 50
        names = {name for name, _labels, _v in mid.prometheus()}
        assert {"fabricscope_probe_sent_total", "fabricscope_probe_kernel_drops_total"} <= names
        b.stop("SIGTERM")
        await asyncio.sleep(0.5)  # host0001 gone: host0000's probes now go unanswered
        t0 = time.monotonic()
        a.stop("SIGTERM")
        snap = await ta
        assert time.monotonic() - t0 < 0.5 + 1.0  # the shutdown deadline, plus flush
        await tb
        assert snap.probes_sent == snap.samples_stored == len(list(read_jsonl(tmp_path / "a.jsonl")))
        assert snap.probes_lost > 0

    asyncio.run(run())
    assert sum(ln.startswith("probe agent: sent ") for ln in lines) >= 3


def test_agent_refuses_bad_outputs_before_binding(tmp_path: Path) -> None:
    inv, _ = _loopback_inventory(tmp_path)
    from fabricscope.fabric.io import read_fabric

    for kw in ({"jsonl": tmp_path / "no" / "x.jsonl"}, {"db": tmp_path / "no" / "x.duckdb"},
               {"jsonl": tmp_path}):  # a folder, not a file
        agent = ProbeAgent(read_fabric(inv), "host0000", **kw)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"does not exist|cannot open"):
            asyncio.run(agent.run())


def test_second_stop_cuts_the_wait_for_replies_short(tmp_path: Path) -> None:
    inv, _ = _loopback_inventory(tmp_path)
    from fabricscope.fabric.io import read_fabric

    async def run() -> float:
        # No peer agent: every probe stays in flight until its timeout, so the first stop
        # would wait the full drain (1 s); the second must end it at once.
        a = ProbeAgent(read_fabric(inv), "host0000", rate_pps=200, epoch_s=3600,
                       jsonl=tmp_path / "a.jsonl", log=lambda _m: None, stats_every_s=0, shutdown_timeout_s=5)
        task = asyncio.create_task(a.run())
        await asyncio.sleep(0.8)
        t0 = time.monotonic()
        a.stop("SIGTERM")
        await asyncio.sleep(0.05)
        a.stop("SIGTERM")
        snap = await task
        assert snap.probes_sent == snap.samples_stored == len(list(read_jsonl(tmp_path / "a.jsonl")))
        return time.monotonic() - t0

    assert asyncio.run(run()) < 0.6
