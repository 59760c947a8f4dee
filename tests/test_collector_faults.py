"""The gNMI collector under faults, end to end through ``fabricscope gnmi collect`` (issue 8).

The target is a real gRPC gNMI server on 127.0.0.1 in its own process (this file run as a
script, see ``_serve``) whose output is known exactly: every device sends one notification of
``UPDATES`` double values per interval, numbered by a per-device sequence that is also its
timestamp, and logs each message after handing it to gRPC. SIGUSR1 pauses sending, SIGUSR2
resumes; the tests pause before every kill, freeze and stop so nothing is in flight, then
assert the EXACT numbers: updates sent (the target's log) == stored (the DuckDB file, each
(device, timestamp, leaf) once) + spilled, malformed messages == decode errors.

The sink outage is a real write failure of the real DuckDB file: the test lowers the
collector's RLIMIT_FSIZE (``prlimit``) to the current size of DuckDB's write-ahead log, so
every commit fails with EFBIG ("File too large") like on a full disk, then lifts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

UPDATES = 20
STALE_MARK = "/fabricscope/collector/stale"
CLI = [sys.executable, "-c", "from fabricscope.cli import main; main()"]

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- the target (subprocess)
def _serve(argv: list[str]) -> None:
    import argparse
    import asyncio

    import grpc
    from gnmi_pb import gnmi_pb2

    from fabricscope.telemetry.codec import encode_notification, path_bytes, prefix_bytes
    from fabricscope.telemetry.paths import parse_path

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--start", default="{}", help="JSON {device: last seq sent} (a restarted target)")
    ap.add_argument("--bad", default="", help="DEVICE:N: every Nth message of DEVICE has its last value cut short")
    a = ap.parse_args(argv)
    seq: Counter[str] = Counter(json.loads(a.start))
    bad_dev, _, bad_n = a.bad.partition(":")
    leaves = [path_bytes(parse_path(f"/t/leaf[i={k}]")) for k in range(UPDATES)]
    out = open(a.log, "a", buffering=1)  # noqa: SIM115 - line-buffered for the test to read
    paused = [False]

    async def subscribe(requests, context):  # type: ignore[no-untyped-def]
        req = await anext(aiter(requests))
        dev = req.subscribe.prefix.target
        out.write(f"sub {dev}\n")
        while True:
            await asyncio.sleep(a.interval)
            if paused[0]:
                continue
            n = seq[dev] + 1
            msg = encode_notification(n, prefix_bytes(dev), [(pb, float(n)) for pb in leaves])
            bad = dev == bad_dev and n % int(bad_n) == 0
            if bad:
                msg = msg[:-4]  # the last double loses 4 of its 8 bytes; every length still claims them
            yield msg
            seq[dev] = n
            out.write(f"{'bad' if bad else 'sent'} {dev} {n}\n")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: paused.__setitem__(0, True))
        loop.add_signal_handler(signal.SIGUSR2, lambda: paused.__setitem__(0, False))
        done = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, done.set)
        server = grpc.aio.server(options=[
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.min_ping_interval_without_data_ms", 100),
            ("grpc.http2.max_ping_strikes", 0)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("gnmi.gNMI", {
            "Subscribe": grpc.stream_stream_rpc_method_handler(
                subscribe, request_deserializer=gnmi_pb2.SubscribeRequest.FromString, response_serializer=None)}),))
        server.add_insecure_port(f"127.0.0.1:{a.port}")
        await server.start()
        out.write(f"listening {a.port}\n")
        await done.wait()
        await server.stop(0.5)

    asyncio.run(main())


# ---------------------------------------------------------------- helpers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Target:
    def __init__(self, tmp: Path, port: int, *, bad: str = "", start: dict[str, int] | None = None,
                 interval: float = 0.1, tag: str = "a") -> None:
        self.log = tmp / f"target-{tag}.log"
        self.proc = subprocess.Popen([sys.executable, __file__, "--port", str(port), "--log", str(self.log),
                                      "--interval", str(interval), "--start", json.dumps(start or {}),
                                      "--bad", bad])
        _wait(lambda: "listening" in self.text(), 30, "target start")

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def counts(self) -> tuple[Counter[str], Counter[str], dict[str, int]]:
        """(updates sent per device, malformed messages per device, last seq per device)."""
        sent: Counter[str] = Counter()
        bad: Counter[str] = Counter()
        last: dict[str, int] = {}
        for line in self.text().splitlines():
            kind, _, rest = line.partition(" ")
            if kind in ("sent", "bad"):
                dev, n = rest.split()
                (sent if kind == "sent" else bad)[dev] += UPDATES if kind == "sent" else 1
                last[dev] = max(last.get(dev, 0), int(n))
        return sent, bad, last

    def subs(self, dev: str) -> int:
        return self.text().count(f"sub {dev}\n")

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGUSR2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    t_end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > t_end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _config(tmp: Path, port: int, devices: list[str], *, workers: int = 1, deadline: str = "5s",
            extra: str = "") -> Path:
    cfg = tmp / "collector.yaml"
    cfg.write_text(f"""
targets:
  t1: {{address: "127.0.0.1:{port}", names: {json.dumps(devices)}}}
subscriptions:
  s: {{paths: [/t], sample-interval: 100ms}}
sinks:
  - {{type: duckdb, path: "{tmp / 'telemetry.duckdb'}", roll-interval: 0}}
buffer: {{max-events: 200000, batch: 2000, flush-interval: 50ms}}
backoff: {{initial: 100ms, max: 1s}}
workers: {workers}
stale-after: 10
keepalive: 1s
stats-interval: 1s
shutdown: {{deadline: {deadline}}}
{extra}""")
    return cfg


class Collect:
    """``fabricscope gnmi collect`` as a subprocess (stderr/stdout read at the end)."""

    def __init__(self, cfg: Path) -> None:
        env = {**os.environ, "COLUMNS": "250"}
        self.proc = subprocess.Popen([*CLI, "gnmi", "collect", "--config", str(cfg)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.out = self.err = ""

    def terminate(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        self.out, self.err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def row(self, stream: str) -> list[str]:
        """The summary table's cells for ``stream``: state, connects, updates, decode errors, stale."""
        for line in self.out.splitlines():
            cells = [c.strip() for c in line.split("│")]
            if len(cells) > 2 and cells[1] == stream:
                return cells[2:]
        raise AssertionError(f"no row for {stream} in:\n{self.out}")


def _stored(db: Path) -> tuple[Counter[str], int, list[tuple[str, float]]]:
    """(telemetry rows per device, duplicate rows, stale marks in order) of the DuckDB file."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT target, count(*) FROM telemetry WHERE name <> ? GROUP BY target",
                           [STALE_MARK]).fetchall()
        dup = con.execute("SELECT count(*) - count(DISTINCT (target, ts_ns, tags)) FROM telemetry WHERE name <> ?",
                          [STALE_MARK]).fetchone()
        marks = con.execute("SELECT target, value_num FROM telemetry WHERE name = ? ORDER BY ts_ns",
                            [STALE_MARK]).fetchall()
    finally:
        con.close()
    return Counter({t: int(n) for t, n in rows}), int(dup[0]) if dup else 0, [(t, float(v)) for t, v in marks]


def _wal_size(db: Path) -> int:
    wal = db.with_name(db.name + ".wal")
    return wal.stat().st_size if wal.exists() else 0


def _limit_file_size(pid: int, size: int | None) -> None:
    """RLIMIT_FSIZE of ``pid``: writes past ``size`` bytes fail with EFBIG (None: lift)."""
    lim = resource.RLIM_INFINITY if size is None else size
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (lim, resource.RLIM_INFINITY))


def _spilled(path: Path) -> Counter[str]:
    n: Counter[str] = Counter()
    if not path.exists():
        return n
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if "spill" not in d and "name" in d and d["name"] != STALE_MARK:
            n[d["target"]] += 1
    return n


@pytest.fixture
def lab(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[Target | Collect] = []
    yield tmp_path, made
    for m in made:
        if isinstance(m, Target):
            m.stop()
        else:
            m.kill()


# ---------------------------------------------------------------- tests
def test_target_killed_and_restarted_loses_nothing(lab) -> None:  # type: ignore[no-untyped-def]
    tmp, made = lab
    port = _free_port()
    a = Target(tmp, port, tag="a")
    made.append(a)
    col = Collect(_config(tmp, port, ["dev-a"]))
    made.append(col)
    _wait(lambda: a.subs("dev-a") >= 1 and a.counts()[0]["dev-a"] >= 10 * UPDATES, 60, "first data")
    a.pause()
    time.sleep(0.3)
    a.proc.kill()  # SIGKILL: no goodbye on the stream
    a.proc.wait()
    time.sleep(1.0)
    sent_a, _, last = a.counts()
    b = Target(tmp, port, start=last, tag="b")
    made.append(b)
    _wait(lambda: b.counts()[0]["dev-a"] >= 10 * UPDATES, 30, "data after restart")
    b.pause()
    time.sleep(0.5)
    assert col.terminate() == 143, col.err
    sent = sent_a + b.counts()[0]
    stored, dup, _ = _stored(tmp / "telemetry.duckdb")
    assert dup == 0
    assert stored == sent, (stored, sent)
    _, connects, updates, *_ = col.row("t1/dev-a/s")
    assert int(connects) >= 2 and int(updates) == sent["dev-a"]
    assert f"received {sent['dev-a']}, written {sent['dev-a']}, spilled 0" in col.out


def test_frozen_target_is_marked_stale_reconnected_and_loses_nothing(lab) -> None:  # type: ignore[no-untyped-def]
    tmp, made = lab
    port = _free_port()
    a = Target(tmp, port)
    made.append(a)
    col = Collect(_config(tmp, port, ["dev-a"]))
    made.append(col)
    _wait(lambda: a.counts()[0]["dev-a"] >= 10 * UPDATES, 60, "first data")
    a.pause()
    time.sleep(0.3)
    a.proc.send_signal(signal.SIGSTOP)  # frozen: TCP stays open, nothing answers
    time.sleep(4.0)
    a.proc.send_signal(signal.SIGCONT)
    time.sleep(0.5)
    before = a.counts()[0]["dev-a"]
    a.resume()
    _wait(lambda: a.counts()[0]["dev-a"] >= before + 10 * UPDATES, 30, "data after the freeze")
    a.pause()
    time.sleep(0.5)
    assert col.terminate() == 143, col.err
    sent = a.counts()[0]
    stored, dup, marks = _stored(tmp / "telemetry.duckdb")
    assert dup == 0 and stored == sent, (stored, sent)
    # stale once (logged once, limit 10 x 100 ms), marked 1 then 0 in the store, and reconnected
    stale_lines = [ln for ln in col.err.splitlines() if "t1/dev-a/s: stale" in ln]
    assert len(stale_lines) == 1, col.err
    assert marks[:1] == [("dev-a", 1.0)] and marks[-1] == ("dev-a", 0.0), marks
    assert any("1 stale" in ln for ln in col.err.splitlines() if "collector: streams" in ln), col.err
    _, connects, updates, _, stale, *_ = col.row("t1/dev-a/s")
    assert int(stale) == 1 and int(connects) >= 2 and int(updates) == sent["dev-a"]


@pytest.mark.parametrize("workers", [1, 2])
def test_sink_outage_10s_loses_nothing_and_recovers(lab, workers: int) -> None:  # type: ignore[no-untyped-def]
    tmp, made = lab
    port = _free_port()
    a = Target(tmp, port)
    made.append(a)
    db = tmp / "telemetry.duckdb"
    col = Collect(_config(tmp, port, ["dev-a", "dev-b"], workers=workers))
    made.append(col)
    _wait(lambda: min(a.counts()[0][d] for d in ("dev-a", "dev-b")) >= 10 * UPDATES and _wal_size(db) > 0,
          60, "first data stored")
    _limit_file_size(col.proc.pid, _wal_size(db))  # the disk is full for DuckDB from now on
    during = a.counts()[0]
    time.sleep(10.0)
    during = a.counts()[0] - during
    _limit_file_size(col.proc.pid, None)
    time.sleep(2.0)
    a.pause()
    time.sleep(1.5)
    assert col.terminate() == 143, col.err
    sent = a.counts()[0]
    stored, dup, _ = _stored(db)
    assert sum(during.values()) >= 2 * 50 * UPDATES  # the outage really held data back
    assert dup == 0 and stored == sent, (stored, sent)
    assert "File too large" in col.err
    # one line per condition per minute, not one per retry
    assert len([ln for ln in col.err.splitlines() if "sink write failed" in ln]) == 1, col.err
    assert "spilled 0" in col.out and "lost 0" in col.out


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_during_sink_outage_spills_and_next_start_replays(lab, workers: int) -> None:  # type: ignore[no-untyped-def]
    tmp, made = lab
    port = _free_port()
    a = Target(tmp, port)
    made.append(a)
    db = tmp / "telemetry.duckdb"
    spill = tmp / "collector.spill.jsonl"
    cfg = _config(tmp, port, ["dev-a", "dev-b"], deadline="1s", workers=workers)
    col = Collect(cfg)
    made.append(col)
    _wait(lambda: min(a.counts()[0][d] for d in ("dev-a", "dev-b")) >= 30 * UPDATES and _wal_size(db) > 0,
          60, "first data stored")
    # the limit sits at the write-ahead log's size: DuckDB's next commit fails, while the
    # spill file (a new file, smaller than that) can still be written
    _limit_file_size(col.proc.pid, _wal_size(db))
    time.sleep(1.0)
    a.pause()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert col.terminate() == 143, col.err
    assert time.monotonic() - t0 < 1 + 10  # the deadline, plus start-up of nothing: bounded
    sent1 = a.counts()[0]
    stored1, dup1, _ = _stored(db)
    spilled = _spilled(spill)
    assert dup1 == 0 and sum(spilled.values()) > 0
    assert stored1 + spilled == sent1, (stored1, spilled, sent1)
    assert str(spill) in col.err and f"spilled {sum(spilled.values())} to {spill}" in col.out
    # next start: the spill file goes into the store first, then collection goes on
    col2 = Collect(cfg)
    made.append(col2)
    before = a.counts()[0]
    a.resume()
    _wait(lambda: min((a.counts()[0] - before)[d] for d in ("dev-a", "dev-b")) >= 10 * UPDATES, 60,
          "data in the second run")
    a.pause()
    time.sleep(0.5)
    assert col2.terminate() == 143, col2.err
    stored2, dup2, _ = _stored(db)
    assert dup2 == 0 and stored2 == a.counts()[0], (stored2, a.counts()[0])
    assert not spill.exists() and f"replayed {sum(spilled.values())}" in col2.out


def test_malformed_notifications_on_one_of_two_targets(lab) -> None:  # type: ignore[no-untyped-def]
    tmp, made = lab
    port = _free_port()
    a = Target(tmp, port, bad="dev-b:7")
    made.append(a)
    col = Collect(_config(tmp, port, ["dev-a", "dev-b"]))
    made.append(col)
    _wait(lambda: a.counts()[1]["dev-b"] >= 4, 60, "malformed messages sent")
    a.pause()
    time.sleep(0.5)
    assert col.terminate() == 143, col.err
    sent, bad, _ = a.counts()
    stored, dup, _ = _stored(tmp / "telemetry.duckdb")
    assert dup == 0 and stored == sent, (stored, sent)
    _, connects_b, updates_b, decode_b, *_ = col.row("t1/dev-b/s")
    _, connects_a, updates_a, decode_a, *_ = col.row("t1/dev-a/s")
    assert (int(decode_b), int(decode_a)) == (bad["dev-b"], 0)
    assert connects_b == connects_a == "1"  # neither stream was dropped
    assert int(updates_b) == sent["dev-b"] and int(updates_a) == sent["dev-a"]
    lines = [ln for ln in col.err.splitlines() if "bad notification skipped" in ln]
    assert len(lines) == 1 and "t1/dev-b/s" in lines[0] and "/t" in lines[0], col.err
    assert "struct.error" not in col.err and "Traceback" not in col.err


def test_unreachable_target_exits_nonzero_with_one_line(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    cfg = _config(tmp_path, port, ["dev-a"])
    p = subprocess.run([*CLI, "gnmi", "collect", "--config", str(cfg), "--duration", "2"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert p.returncode == 2
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"no updates received from 127.0.0.1:{port}" in errors[0], p.stderr
    assert "expected updates" in errors[0]
    assert "Traceback" not in p.stderr
    # one retry line per condition per minute, no gRPC C-core lines
    assert len([ln for ln in p.stderr.splitlines() if "UNAVAILABLE" in ln and "WARNING" in ln]) == 1, p.stderr
    assert not re.search(r"^[EWI]\d{4} ", p.stderr, re.M), p.stderr


def test_ctrl_c_while_retrying_exits_130_with_one_retry_line(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens: the stream keeps retrying
    col = Collect(_config(tmp_path, port, ["dev-a"]))
    try:
        time.sleep(6.0)  # start-up plus several backoff rounds (initial 100 ms, max 1 s)
        col.proc.send_signal(signal.SIGINT)
        col.out, col.err = col.proc.communicate(timeout=30)
    finally:
        col.kill()
    assert col.proc.returncode == 130, col.err
    assert "Traceback" not in col.err and "KeyboardInterrupt" not in col.err
    assert len([ln for ln in col.err.splitlines() if "UNAVAILABLE" in ln]) == 1, col.err
    assert not re.search(r"^[EWI]\d{4} ", col.err, re.M), col.err
    _, connects, *_ = col.row("t1/dev-a/s")
    assert int(connects) >= 3  # it did retry, quietly


# ---------------------------------------------------------------- in-process units of the above
def test_spill_file_round_trip_and_a_batch_cut_short_is_skipped(tmp_path: Path) -> None:
    from fabricscope.model.records import Finding, TelemetryEvent
    from fabricscope.telemetry.spill import SpillBatch, append_spill, read_spill

    evs = [TelemetryEvent("/a", i, "d", {"k": str(i)}, v) for i, v in enumerate([1, 2.5, "UP", True])]
    f = Finding("micro-burst", "d:eth1", 0.9, (1, 2), ("q=3",), "look", {"x": 1})
    path = tmp_path / "s.jsonl"
    assert append_spill(path, [SpillBatch((0, 1), evs, [f]), SpillBatch((1,), evs[:2], [])]) == 6
    batches, bad = read_spill(path)
    assert bad == 0 and [b.sinks for b in batches] == [(0, 1), (1,)]
    assert batches[0].events == evs and batches[0].findings == [f] and batches[1].events == evs[:2]
    # the process died while spilling: the last batch is incomplete and must not be half-replayed
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")
    batches, bad = read_spill(path)
    assert [len(b.events) for b in batches] == [4] and bad == 2


def test_rate_limited_log_one_line_per_condition_per_interval() -> None:
    import logging

    from fabricscope.telemetry.selfmetrics import RateLimitedLog

    seen: list[str] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    lg = logging.getLogger("test.ratelog")
    lg.addHandler(H())
    lg.propagate = False
    rl = RateLimitedLog(lg, 60.0)
    for i in range(100):
        rl.log(logging.WARNING, "s1", "rpc", "down", now=float(i) / 10)
    rl.log(logging.WARNING, "s2", "rpc", "down too", now=1.0)
    rl.log(logging.WARNING, "s1", "rpc", "still down", now=61.0)
    assert seen == ["down", "down too", "still down (and 99 more in the last 60s)"]
    rl.reset("s1", "rpc")
    assert rl.log(logging.WARNING, "s1", "rpc", "again", now=62.0)


def test_stale_rule_follows_the_promised_interval() -> None:
    from fabricscope.telemetry.collector import stale_after_s
    from fabricscope.telemetry.config import parse_config

    def cfg(sub: dict[str, object], k: float = 3) -> float | None:
        c = parse_config({"targets": {"t": {"address": "127.0.0.1:1"}}, "subscriptions": {"s": sub},
                          "stale-after": k}, source="t.yaml")
        return stale_after_s(c, c.subscriptions["s"])

    assert cfg({"paths": ["/a"], "sample-interval": "2s"}) == 6.0
    assert cfg({"paths": ["/a"], "sample-interval": "10ms"}) == 1.0  # never under 1 s
    assert cfg({"paths": ["/a"], "stream-mode": "on-change"}) is None  # nothing promised
    assert cfg({"paths": ["/a"], "stream-mode": "on-change", "heartbeat-interval": "10s"}) == 30.0
    assert cfg({"paths": ["/a"], "mode": "poll", "poll-interval": "5s"}) == 15.0
    assert cfg({"paths": ["/a"], "mode": "once"}) is None
    assert cfg({"paths": ["/a"]}, k=0) is None


def _writer_only(tmp_path: Path, deadline: str) -> tuple[object, object]:
    """A Collector with no targets to dial, fed through its buffer directly."""
    from fabricscope.telemetry.collector import Collector
    from fabricscope.telemetry.config import parse_config
    from fabricscope.telemetry.detectors import DetectorSet
    from fabricscope.telemetry.sinks import MemorySink

    cfg = parse_config({"targets": {"t": {"address": "127.0.0.1:1"}},
                        "subscriptions": {"s": {"paths": ["/a"], "mode": "once"}},
                        "buffer": {"batch": 100, "flush-interval": "10ms"}, "backoff": {"initial": "10ms", "max": "50ms"},
                        "shutdown": {"deadline": deadline, "spill-file": str(tmp_path / "spill.jsonl")}},
                       source="t.yaml")
    a, b = MemorySink(), MemorySink()
    return Collector(cfg, sinks=[a, b], detectors=DetectorSet([])), (a, b)


def test_writer_holds_batches_through_an_outage_and_never_rewrites_a_sink(tmp_path: Path) -> None:
    import asyncio

    from fabricscope.model.records import TelemetryEvent
    from fabricscope.telemetry.collector import EventBuffer

    col, (a, b) = _writer_only(tmp_path, "5s")

    async def main() -> None:
        col.buffer = EventBuffer(10_000)
        done = asyncio.Event()
        w = asyncio.create_task(col._writer(done))
        b.fail = True  # the second sink is down, the first takes every batch once
        for i in range(10):
            await col.buffer.put([TelemetryEvent("/a", i * 100 + j, "d", {}, j) for j in range(100)])
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert len(b.events) == 0 and col.stats.sink_retries > 0
        b.fail = False  # the sink is back: everything held is written, once
        done.set()
        await asyncio.wait_for(w, 10)

    asyncio.run(main())
    assert len(a.events) == len(b.events) == 1000
    assert len({e.ts_ns for e in a.events}) == len({e.ts_ns for e in b.events}) == 1000
    assert col.stats.written == 1000 and col.stats.spilled == 0


def test_writer_spills_what_the_sinks_refuse_by_the_deadline(tmp_path: Path) -> None:
    import asyncio

    from fabricscope.model.records import TelemetryEvent
    from fabricscope.telemetry.collector import EventBuffer
    from fabricscope.telemetry.spill import read_spill

    col, (a, b) = _writer_only(tmp_path, "200ms")

    async def main() -> None:
        col.buffer = EventBuffer(10_000)
        done = asyncio.Event()
        a.fail = b.fail = True
        w = asyncio.create_task(col._writer(done))
        for i in range(5):
            await col.buffer.put([TelemetryEvent("/a", i * 100 + j, "d", {}, j) for j in range(100)])
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        col.stop()
        done.set()
        await asyncio.wait_for(w, 10)
        assert time.monotonic() - t0 < 2.0  # bounded by the deadline, not by the outage

    asyncio.run(main())
    batches, bad = read_spill(tmp_path / "spill.jsonl")
    assert bad == 0 and sum(len(x.events) for x in batches) == 500 == col.stats.spilled
    assert len({e.ts_ns for x in batches for e in x.events}) == 500 and not a.events and not b.events


def test_a_hung_sink_write_does_not_hold_shutdown_past_the_deadline(tmp_path: Path) -> None:
    import asyncio
    import threading

    from fabricscope.model.records import TelemetryEvent
    from fabricscope.telemetry.collector import EventBuffer
    from fabricscope.telemetry.spill import read_spill

    col, (a, _) = _writer_only(tmp_path, "300ms")
    release = threading.Event()

    def hang(events, findings):  # type: ignore[no-untyped-def]
        release.wait(20)  # an NFS mount gone away: the write neither fails nor returns

    a.write = hang  # type: ignore[method-assign]

    async def main() -> None:
        col.buffer = EventBuffer(10_000)
        done = asyncio.Event()
        w = asyncio.create_task(col._writer(done))
        await col.buffer.put([TelemetryEvent("/a", j, "d", {}, j) for j in range(100)])
        await asyncio.sleep(0.2)  # the write is in progress (and hangs) when the stop comes
        t0 = time.monotonic()
        col.stop()
        done.set()
        await asyncio.wait_for(w, 10)
        assert time.monotonic() - t0 < 2.0

    try:
        asyncio.run(main())
    finally:
        release.set()
    batches, _ = read_spill(tmp_path / "spill.jsonl")
    assert sum(len(x.events) for x in batches) == 100 == col.stats.spilled


def test_self_metrics_are_a_plain_dict_and_the_prometheus_sink_exports_them() -> None:
    import urllib.request

    from fabricscope.telemetry.collector import Collector
    from fabricscope.telemetry.config import parse_config
    from fabricscope.telemetry.selfmetrics import STALE

    cfg = parse_config({"targets": {"t1": {"address": "127.0.0.1:1", "names": ["dev-a"]}},
                        "subscriptions": {"s": {"paths": ["/a"]}},
                        "sinks": [{"type": "prometheus", "listen": "127.0.0.1:0"}]}, source="t.yaml")
    col = Collector(cfg)
    try:
        from fabricscope.telemetry.collector import TargetStats

        col.stats.targets["t1/dev-a/s"] = TargetStats("t1/dev-a/s", state=STALE, stale=2, decode_errors=3)
        m = col.self_metrics()
        assert m["streams"]["t1/dev-a/s"]["state"] == "stale" and m["states"]["stale"] == 1
        assert m["decode_errors"] == 3 and m["buffer"]["max_events"] == 1_000_000
        json.dumps(m)  # plain data only
        port = col.sinks[0].port  # type: ignore[attr-defined]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        col.close()
    assert 'fabricscope_collector_stream_stale{stream="t1/dev-a/s"} 1.0' in body, body
    assert 'fabricscope_collector_decode_errors_total{stream="t1/dev-a/s"} 3.0' in body, body
    assert "fabricscope_collector_buffer_fill_ratio" in body


if __name__ == "__main__":
    _serve(sys.argv[1:])
