"""The JetStream bus against a real nats-server: delivery, de-dup, restarts, findings, hostile input."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricscope.cluster.bus import BusConfig, BusPublisher, connect, telemetry_subject
from fabricscope.cluster.encoding import batch_id, decode_findings, encode_events
from fabricscope.cluster.worker import Deduplicator, Worker
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent

NATS = shutil.which("nats-server") or ("/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None)
pytestmark = pytest.mark.skipif(NATS is None, reason="nats-server binary not installed (CI installs it: .ci/run)")

IN_OCTETS = "/interfaces/interface/state/counters/in-octets"
IN_ERRORS = "/interfaces/interface/state/counters/in-errors"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """A real ``nats-server -js`` on loopback; ``kill``/``start`` keep the store dir and port."""

    def __init__(self, store: Path, *extra: str) -> None:
        self.store = store
        self.port = free_port()
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = store / "nats.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert NATS is not None
        n_ready = self.log.read_text().count("Server is ready") if self.log.exists() else 0
        self.proc = subprocess.Popen([NATS, "-js", "-sd", str(self.store / "js"), "-a", "127.0.0.1",
                                      "-p", str(self.port), "-l", str(self.log), *self.extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if self.log.exists() and self.log.read_text().count("Server is ready") > n_ready:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)
        raise RuntimeError("nats-server did not become ready in 10 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    srv = NatsServer(tmp_path)
    srv.start()
    yield srv
    srv.kill()


def make_events(n: int, targets: int, *, seed: int, t0: int = 1_700_000_000_000_000_000) -> list[TelemetryEvent]:
    """n distinct counter samples over ``targets`` switches, 4 ports each, in seeded random order."""
    rng = random.Random(seed)
    out = [TelemetryEvent(IN_OCTETS, t0 + i * 1000, f"leaf-{i % targets:03d}", {"interface_name": f"eth{i % 4}"},
                          rng.randrange(1 << 40)) for i in range(n)]
    rng.shuffle(out)
    return out


def key(e: TelemetryEvent) -> tuple[str, str, tuple[tuple[str, str], ...], int]:
    return (e.target, e.name, tuple(sorted(e.tags.items())), e.ts_ns)


def run_worker(cfg: BusConfig, n_expected: int, *, timeout_s: float = 15.0, **kw: object) -> tuple[Worker, list[TelemetryEvent]]:
    got: list[TelemetryEvent] = []
    w = Worker(cfg, on_events=got.extend, **kw)  # type: ignore[arg-type]
    asyncio.run(w.run(until=lambda s: s.unique_events >= n_expected, duration_s=timeout_s))
    return w, got


def test_every_event_arrives_exactly_once(nats_server: NatsServer) -> None:
    cfg = BusConfig(url=nats_server.url)
    events = make_events(20_000, 50, seed=1)
    pub = BusPublisher(cfg, batch_events=250)
    for i in range(0, len(events), 1000):  # as the collector's writer would, batch by batch
        pub.write(events[i:i + 1000], [])
    assert pub.flush(10)
    st = pub.stats()
    assert (st.published_events, st.dropped_events, st.buffered_events) == (20_000, 0, 0)
    pub.close(2)
    assert pub.stats().lost_events == 0
    w, got = run_worker(cfg, len(events))
    assert len(got) == len(events)
    assert {key(e) for e in got} == {key(e) for e in events}
    ws = w.stats()
    assert ws.duplicate_events == 0 and ws.decode_errors == 0 and ws.lag == 0
    # per target, the order of publication survives (one subject per target)
    by_target: dict[str, list[int]] = {}
    for e in got:
        by_target.setdefault(e.target, []).append(e.ts_ns)
    sent: dict[str, list[int]] = {}
    for e in events:
        sent.setdefault(e.target, []).append(e.ts_ns)
    assert by_target == sent


def test_resent_batches_are_dropped_by_the_server_and_the_worker(nats_server: NatsServer) -> None:
    cfg = BusConfig(url=nats_server.url)
    events = make_events(3000, 6, seed=2)
    pub = BusPublisher(cfg, batch_events=100)
    pub.write(events, [])
    assert pub.flush(10)
    first = pub.stats()
    pub.write(events, [])  # a retry of the same write: same batches, same Nats-Msg-Id
    assert pub.flush(10)
    st = pub.stats()
    assert st.duplicate_batches == first.published_batches > 0
    pub.close(2)

    async def republish() -> None:
        # the same events batched differently (a restarted collector): new ids, so the
        # server stores them; the worker must drop them
        nc = await connect(cfg)
        js = nc.jetstream()
        by_target: dict[str, list[TelemetryEvent]] = {}
        for e in events:
            by_target.setdefault(e.target, []).append(e)
        for t, evs in by_target.items():
            payload = encode_events(evs[:333])
            ack = await js.publish(telemetry_subject(cfg, t), payload, headers={"Nats-Msg-Id": batch_id(payload)})
            assert not ack.duplicate
        await nc.close()

    asyncio.run(republish())
    got: list[TelemetryEvent] = []
    w = Worker(cfg, on_events=got.extend)
    asyncio.run(w.run(until=lambda s: s.events >= 3000 + 6 * 333, duration_s=15))
    ws = w.stats()
    assert ws.events == 3000 + 6 * 333  # the server kept one copy of the retried batches
    assert len(got) == ws.unique_events == 3000
    assert ws.duplicate_events == 6 * 333
    assert {key(e) for e in got} == {key(e) for e in events}


WORKER_PROGRAM = textwrap.dedent("""
    import asyncio, sys, time
    from fabricscope.cluster.bus import BusConfig
    from fabricscope.cluster.worker import Worker
    url, durable, out_path = sys.argv[1:4]
    out = open(out_path, "a", buffering=1)
    def seen(events):
        for e in events:
            out.write(f"{e.target}|{e.ts_ns}\\n")
        out.flush()
        time.sleep(0.02)  # slow enough that a kill lands mid-stream
    w = Worker(BusConfig(url=url), durable=durable, on_events=seen, fetch_batch=2, max_ack_pending=4,
               ack_wait_s=2.0)
    asyncio.run(w.run(duration_s=60))
""")


def test_killed_worker_resumes_from_its_durable_position(nats_server: NatsServer, tmp_path: Path) -> None:
    cfg = BusConfig(url=nats_server.url)
    events = make_events(6000, 10, seed=3)
    pub = BusPublisher(cfg, batch_events=50)  # 120 messages
    pub.write(events, [])
    assert pub.flush(10)
    pub.close(2)
    prog = tmp_path / "worker_prog.py"
    prog.write_text(WORKER_PROGRAM)
    out = tmp_path / "seen.txt"
    want = {f"{e.target}|{e.ts_ns}" for e in events}

    def lines() -> list[str]:
        return out.read_text().splitlines() if out.exists() else []

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(prog), cfg.url, "resume-test", str(out)])

    p = spawn()
    try:
        end = time.monotonic() + 20
        while len(lines()) < 1500 and time.monotonic() < end:
            time.sleep(0.01)
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        before = lines()
        assert 1500 <= len(before) < len(events), "the kill must land mid-stream"
        p = spawn()
        end = time.monotonic() + 25
        while set(lines()) != want and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(5)
    after = lines()
    assert set(after) == want, f"{len(want - set(after))} events lost"
    dups = len(after) - len(want)
    # only the un-acked tail is redelivered: at most max_ack_pending (4) messages of 50 events
    assert 0 <= dups <= 4 * 50
    counts: dict[str, int] = {}
    for line in after:
        counts[line] = counts.get(line, 0) + 1
    assert {k for k, n in counts.items() if n > 1} <= set(before[-4 * 50:])  # the tail, nothing else
    # the restarted worker started where the first one's acks ended, not from the beginning
    assert len(after) - len(before) <= len(want) - len(before) + 4 * 50


def test_publisher_buffers_across_a_server_restart(nats_server: NatsServer) -> None:
    cfg = BusConfig(url=nats_server.url, reconnect_wait_s=0.1)
    pub = BusPublisher(cfg, batch_events=100, linger_s=0.02, publish_timeout_s=0.5)
    written: list[TelemetryEvent] = []
    stop = threading.Event()

    def collector() -> None:
        i = 0
        while not stop.is_set():
            batch = [TelemetryEvent(IN_OCTETS, 10_000 + i + j, f"leaf-{(i + j) % 8}", {"interface_name": "eth1"},
                                    i + j) for j in range(200)]
            pub.write(batch, [])
            written.extend(batch)
            i += 200
            time.sleep(0.01)

    th = threading.Thread(target=collector)
    th.start()
    try:
        time.sleep(0.7)
        nats_server.kill()
        time.sleep(1.0)
        assert pub.stats().buffered_events > 0  # the collector kept writing into the buffer
        nats_server.start()  # same store dir, same port
        time.sleep(1.0)
    finally:
        stop.set()
        th.join()
    assert pub.flush(15)
    st = pub.stats()
    pub.close(2)
    assert st.reconnects >= 1 and st.disconnects >= 1
    assert st.dropped_events == 0
    _, got = run_worker(cfg, len(written), timeout_s=20)
    assert {key(e) for e in got} == {key(e) for e in written}
    assert len(got) == len(written)



def test_lag_is_exported_and_max_ack_pending_bounds_the_work_in_hand(nats_server: NatsServer) -> None:
    cfg = BusConfig(url=nats_server.url)
    events = make_events(2000, 4, seed=4)
    pub = BusPublisher(cfg, batch_events=50)
    pub.write(events, [])
    assert pub.flush(10)
    n_msgs = pub.stats().published_batches
    pub.close(2)
    # fetch asks for 16, but the server hands out at most max_ack_pending=4 un-acked messages
    # a long fetch wait: on a loaded machine a short one can return before all 4 have arrived
    w = Worker(cfg, durable="laggy", fetch_batch=16, max_ack_pending=4, fetch_timeout_s=3.0)
    st = asyncio.run(w.run(until=lambda s: s.batches >= 1, duration_s=10))
    assert st.batches == 4
    assert st.lag == n_msgs - 4  # num_pending: not yet delivered to the consumer
    samples = {name: v for name, _, _, v in st.metric_samples()}
    assert samples["fabricscope_bus_worker_lag"] == n_msgs - 4
    w2 = Worker(cfg, durable="laggy", lag_interval_s=0.1)  # max_ack_pending 256: the consumer is updated
    st2 = asyncio.run(w2.run(until=lambda s: s.lag == 0 and s.unique_events >= 2000 - 4 * 50, duration_s=10))
    assert st2.unique_events == 2000 - 4 * 50 and st2.lag == 0


def test_worker_rides_out_a_server_restart(nats_server: NatsServer) -> None:
    cfg = BusConfig(url=nats_server.url, reconnect_wait_s=0.1)
    got: list[TelemetryEvent] = []
    w = Worker(cfg, durable="rider", on_events=got.extend, fetch_timeout_s=0.2)
    th = threading.Thread(target=lambda: asyncio.run(w.run(duration_s=30)))
    th.start()
    try:
        first, second = make_events(1000, 4, seed=5), make_events(1000, 4, seed=5, t0=1)
        pub = BusPublisher(cfg, batch_events=100, publish_timeout_s=0.5)
        pub.write(first, [])
        assert pub.flush(10)
        end = time.monotonic() + 10
        while len(got) < 1000 and time.monotonic() < end:
            time.sleep(0.02)
        nats_server.kill()
        time.sleep(0.5)
        nats_server.start()
        pub.write(second, [])
        assert pub.flush(15)
        pub.close(2)
        end = time.monotonic() + 15
        while len(got) < 2000 and time.monotonic() < end:
            time.sleep(0.02)
    finally:
        w.stop()
        th.join(10)
    assert {key(e) for e in got} == {key(e) for e in first + second}
    assert len(got) == 2000


def test_full_buffer_drops_oldest_and_close_spills_the_rest(tmp_path: Path) -> None:
    srv = NatsServer(tmp_path)  # not started yet: NATS is unreachable
    cfg = BusConfig(url=srv.url, reconnect_wait_s=0.1, connect_timeout_s=0.5)
    spill = tmp_path / "bus.spill"
    pub = BusPublisher(cfg, batch_events=100, linger_s=0.01, max_buffer_bytes=20_000, compress=False, spill_path=spill)
    events = [TelemetryEvent(IN_OCTETS, i, "leaf-0", {"interface_name": "eth1"}, i) for i in range(5000)]
    for i in range(0, 5000, 100):
        pub.write(events[i:i + 100], [])
    time.sleep(0.1)
    st = pub.stats()
    assert st.dropped_events > 0 and st.buffered_bytes <= 20_000
    kept = st.buffered_events
    assert kept + st.dropped_events == 5000
    t = time.monotonic()
    pub.close(0.3)
    assert time.monotonic() - t < 3.0  # the deadline holds while the server is away
    assert pub.stats().spilled_events == kept and pub.stats().lost_events == 0
    assert spill.exists()
    srv.start()
    try:
        pub2 = BusPublisher(cfg, spill_path=spill)
        assert pub2.stats().replayed_events == kept and not spill.exists()
        assert pub2.flush(10)
        pub2.close(2)
        _, got = run_worker(cfg, kept)
        # the newest events survive (oldest dropped first)
        assert sorted(e.ts_ns for e in got) == list(range(5000 - kept, 5000))
    finally:
        srv.kill()



def test_close_without_spill_counts_what_it_loses(tmp_path: Path) -> None:
    cfg = BusConfig(url=f"nats://127.0.0.1:{free_port()}", connect_timeout_s=0.2)  # nobody listens
    pub = BusPublisher(cfg, batch_events=10)
    pub.write(make_events(95, 3, seed=8), [])
    pub.close(0.2)
    st = pub.stats()
    assert st.lost_events == 95 and st.published_events == 0 and not st.connected
    with pytest.raises(TransportError, match="after close"):
        pub.write(make_events(1, 1, seed=8), [])
    with pytest.raises(TransportError, match=r"cannot connect to nats://127\.0\.0\.1:\d+ within"):
        asyncio.run(Worker(cfg).run(duration_s=1))


def test_detector_findings_reach_the_findings_stream(nats_server: NatsServer) -> None:
    cfg = BusConfig(url=nats_server.url)
    t0 = 1_000_000_000
    ev = [TelemetryEvent(IN_ERRORS, t0 + k * 1_000_000_000, "leaf-7", {"interface_name": "eth3"}, v)
          for k, v in enumerate([0, 0, 25])]  # +25 CRC errors: a gray link
    ev += [TelemetryEvent(IN_ERRORS, t0 + k * 1_000_000_000, "leaf-8", {"interface_name": "eth1"}, 4)
           for k in range(3)]  # a constant counter: no finding
    pub = BusPublisher(cfg, batch_events=2)
    pub.write(ev, [])
    assert pub.flush(10)
    pub.close(2)
    w, _ = run_worker(cfg, len(ev))
    assert w.stats().findings_published == 1

    async def read_findings() -> list[Finding]:
        nc = await connect(cfg)
        js = nc.jetstream()
        sub = await js.pull_subscribe("fs.findings.>", stream=cfg.findings_stream)
        msgs = await sub.fetch(10, timeout=2)
        out: list[Finding] = []
        for m in msgs:
            assert m.subject == "fs.findings.error-counter-increase"
            out += decode_findings(m.data)
            await m.ack()
        await nc.close()
        return out

    found = asyncio.run(read_findings())
    assert len(found) == 1
    f = found[0]
    assert f.kind == "error-counter-increase" and f.subject == "leaf-7:eth3"
    assert f.details["increase"] == 25.0


def test_hostile_bytes_are_counted_terminated_and_skipped(nats_server: NatsServer) -> None:
    cfg = BusConfig(url=nats_server.url)
    rng = random.Random(6)
    good = make_events(500, 2, seed=6)
    valid = encode_events(good[:250])
    hostile = [bytes(rng.randrange(256) for _ in range(200)), valid[:len(valid) // 2],
               b"FSB\x01\x01\x00\x00\x00" + b"\xff\xff\xff\xff", b""]

    async def publish() -> None:
        nc = await connect(cfg)
        js = nc.jetstream()
        await js.add_stream(name=cfg.telemetry_stream, subjects=[f"{cfg.telemetry_prefix}.>"])
        for i, payload in enumerate([hostile[0], valid, *hostile[1:], encode_events(good[250:])]):
            await js.publish(f"{cfg.telemetry_prefix}.x", payload, headers={"Nats-Msg-Id": f"m{i}"})
        await nc.close()

    asyncio.run(publish())
    w, got = run_worker(cfg, 500, ack_wait_s=1.0, durable="hostile")
    assert len(got) == 500 and w.stats().decode_errors == len(hostile)
    # terminated, not left to redeliver after ack_wait: a second run sees nothing
    time.sleep(1.2)
    w2 = Worker(cfg, durable="hostile", ack_wait_s=1.0)
    st = asyncio.run(w2.run(duration_s=1.0))
    assert st.batches == 0 and st.lag == 0 and st.ack_pending == 0


def test_deduplicator_is_exact_within_its_bound() -> None:
    d = Deduplicator(max_recent=100)
    ev = [TelemetryEvent(IN_OCTETS, ts, "t", {"interface_name": f"e{ts % 3}"}, 0) for ts in range(300)]
    assert d.filter(ev) == ev and len(d) == 100
    assert d.filter(ev) == [] and d.duplicates == 300 and d.late == 200
    late_new = [TelemetryEvent(IN_OCTETS, 1000, "t", {"interface_name": "new"}, 0)]
    assert d.filter(late_new) == late_new  # an unseen series is never dropped


def test_credentials_are_required_and_never_shown(tmp_path: Path) -> None:
    srv = NatsServer(tmp_path, "--user", "fsuser", "--pass", "s3cret-pw")
    srv.start()
    try:
        good = BusConfig(url=srv.url, user="fsuser", password="s3cret-pw")
        assert "s3cret-pw" not in repr(good)
        bad = BusConfig(url=srv.url, user="fsuser", password="wrong", connect_timeout_s=1.0)

        async def attempt(cfg: BusConfig) -> None:
            nc = await connect(cfg)
            await nc.close()

        asyncio.run(attempt(good))
        with pytest.raises(TransportError) as ei:
            asyncio.run(attempt(bad))
        assert "wrong" not in str(ei.value)
    finally:
        srv.kill()


def _certs(d: Path) -> dict[str, str]:
    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=fs-test-ca",
         "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}", "-keyout", str(d / f"{who}.key"),
             "-out", str(d / f"{who}.csr"))
        ossl("x509", "-req", "-in", str(d / f"{who}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "1", "-extfile", str(d / "ext.cnf"), "-out", str(d / f"{who}.pem"))
    return {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed (needed to make test certs)")
def test_mutual_tls(tmp_path: Path) -> None:
    c = _certs(tmp_path)
    srv = NatsServer(tmp_path, "--tls", "--tlscert", c["server.pem"], "--tlskey", c["server.key"],
                     "--tlsverify", "--tlscacert", c["ca.pem"])
    srv.start()
    try:
        url = f"tls://127.0.0.1:{srv.port}"
        cfg = BusConfig(url=url, tls_ca=c["ca.pem"], tls_cert=c["client.pem"], tls_key=c["client.key"])
        pub = BusPublisher(cfg, batch_events=10)
        ev = make_events(50, 2, seed=9)
        pub.write(ev, [])
        assert pub.flush(10)
        pub.close(2)
        _, got = run_worker(cfg, 50)
        assert len(got) == 50

        async def attempt(cfg: BusConfig) -> None:
            nc = await connect(cfg)
            await nc.close()

        with pytest.raises(TransportError):  # no client certificate: refused
            asyncio.run(attempt(BusConfig(url=url, tls_ca=c["ca.pem"], connect_timeout_s=1.0)))
    finally:
        srv.kill()


@pytest.mark.parametrize(("kw", "msg"), [
    ({"url": "http://x:1"}, "url"),
    ({"password": "p"}, "without a user"),
    ({"user": "u", "token": "t"}, "choose one"),
    ({"tls_cert": "/nonexistent.pem", "tls_key": "/nonexistent.key"}, "no such file"),
    ({"max_bytes": 0}, "max_bytes"),
    ({"duplicate_window_s": 10, "max_age_s": 5}, "duplicate_window_s"),
])
def test_bad_config_is_one_clear_error(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        BusConfig(**kw)  # type: ignore[arg-type]

