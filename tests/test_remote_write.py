"""Remote-Write 1.0 output: into a real Prometheus (remote-write receiver), and against a tiny
local HTTP server for the retry / reject / overflow / auth / TLS rules (real sockets, 127.0.0.1)."""

from __future__ import annotations

import http.server
import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.prompb import FILE_DESCRIPTOR, WriteRequest
from fabricscope.telemetry.remote_write import (
    USER_AGENT,
    RemoteWriteSink,
    build_remote_write_sink,
    encode_write_request,
    parse_remote_write_options,
    series_labels,
    snappy_block,
)
from fabricscope.telemetry.sinks import Sink
from fuzzing import fuzz_settings

PROM_BIN = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
OCT = "/interfaces/interface/state/counters/in-octets"
OUT = "/interfaces/interface/state/counters/out-octets"
OCT_M = "gnmi_interfaces_interface_state_counters_in_octets"
OUT_M = "gnmi_interfaces_interface_state_counters_out_octets"
MS = 1_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(every_s)


def ev(name: str, ts_ms: int, value: object, target: str = "leaf-1", port: str = "eth1") -> TelemetryEvent:
    return TelemetryEvent(name, ts_ms * MS, target, {"interface_name": port}, value)  # type: ignore[arg-type]


def decode(body: bytes) -> dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]:
    req = WriteRequest()
    req.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
    return {tuple((lb.name, lb.value) for lb in ts.labels): [(s.timestamp, s.value) for s in ts.samples]
            for ts in req.timeseries}


# -- a real Prometheus -----------------------------------------------------------------------

class Prometheus:
    def __init__(self, tmp: Path, port: int) -> None:
        assert PROM_BIN is not None
        self.tmp, self.port = tmp, port
        self.base = f"http://127.0.0.1:{port}"
        cfg = tmp / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1m\n")
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen([PROM_BIN, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                                      "--log.level=warn"],
                                     stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))
        try:
            wait_for(self.ready, 30, "Prometheus /-/ready", every_s=0.1)
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        with urllib.request.urlopen(f"{self.base}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


needs_prometheus = pytest.mark.skipif(PROM_BIN is None, reason="Prometheus not installed (apt-get install "
                                      "prometheus): the remote-write receiver tests need /usr/bin/prometheus")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    p = Prometheus(tmp_path, free_port())
    try:
        yield p
    finally:
        p.stop()


def fabric_events(t0_ms: int, n: int) -> tuple[list[TelemetryEvent], dict[tuple[str, str], list[tuple[int, float]]]]:
    """2 targets x 2 paths x n timestamps 15 s apart, values distinct per series and time."""
    events, want = [], {}
    for ti, target in enumerate(("leaf-1", "spine-2")):
        for pi, (path, m) in enumerate(((OCT, OCT_M), (OUT, OUT_M))):
            pts = [(t0_ms + 15_000 * i, float(1_000_000 * (ti + 1) + 1_000 * pi + i * 7.5)) for i in range(n)]
            want[(m, target)] = pts
            events += [ev(path, t, v, target=target, port="eth7") for t, v in pts]
    return events, want


@needs_prometheus
def test_samples_written_to_a_real_prometheus_come_back_from_promql(prometheus: Prometheus) -> None:
    n = 8
    t0 = (int(time.time()) - 300) * 1000  # recent: Prometheus rejects samples older than its head
    events, want = fabric_events(t0, n)
    extra = [ev("/interfaces/interface/state/oper-status", t0, "UP"),  # a string: skipped
             ev("/interfaces/interface/state/enabled", t0, True)]  # a bool: 1
    sink = build_remote_write_sink({"url": prometheus.base + "/api/v1/write", "batch-wait-s": 0.05,
                                    "max-samples-per-send": 7}, seed=1)
    sink.write(events[: len(events) // 2], [])
    sink.write(events[len(events) // 2:] + extra, [Finding("gray-link", "leaf-1:eth7", 0.93, (t0 * MS, t0 * MS))])
    sink.close(10)
    s = sink.stats()
    assert (s.samples_sent, s.rejected, s.dropped, s.skipped_non_numeric) == (4 * n + 2, 0, 0, 1), s
    assert s.requests >= (4 * n + 2) // 7 and s.queue_depth == 0

    t_end = (t0 + 15_000 * (n - 1)) / 1000
    res = prometheus.api("/api/v1/query", query="{__name__=~\"gnmi_.*_octets\"}", time=f"{t_end:.3f}")["result"]
    got = {(r["metric"]["__name__"], r["metric"]["target"]): (r["metric"], float(r["value"][1])) for r in res}
    assert set(got) == set(want)
    for (m, target), (labels, value) in got.items():
        assert labels == {"__name__": m, "target": target, "interface_name": "eth7"}
        assert value == want[(m, target)][-1][1]
    rng = prometheus.api("/api/v1/query_range", query="{__name__=~\"gnmi_.*_octets\"}", start=f"{t0 / 1000:.3f}",
                         end=f"{t_end:.3f}", step="15s")["result"]
    series = {(r["metric"]["__name__"], r["metric"]["target"]): [(round(float(t) * 1000), float(v))
                                                                  for t, v in r["values"]] for r in rng}
    assert series == want
    [en] = prometheus.api("/api/v1/query", query="gnmi_interfaces_interface_state_enabled",
                          time=f"{t0 / 1000:.3f}")["result"]
    assert en["value"][1] == "1" and en["metric"]["target"] == "leaf-1"
    [fs] = prometheus.api("/api/v1/query", query="fabricscope_finding_score", time=f"{t0 / 1000:.3f}")["result"]
    assert fs["metric"] == {"__name__": "fabricscope_finding_score", "kind": "gray-link", "subject": "leaf-1:eth7",
                            "severity": "critical"} and float(fs["value"][1]) == 0.93


@needs_prometheus
def test_prometheus_down_at_first_gets_everything_once_it_is_up(tmp_path: Path) -> None:
    port = free_port()
    n = 6
    t0 = (int(time.time()) - 240) * 1000
    events, want = fabric_events(t0, n)
    sink = build_remote_write_sink({"url": f"http://127.0.0.1:{port}/api/v1/write", "batch-wait-s": 0.05,
                                    "max-samples-per-send": 5, "min-backoff-s": 0.05, "max-backoff-s": 0.4}, seed=2)
    prom = None
    try:
        sink.write(events, [])
        wait_for(lambda: sink.stats().retries >= 3, 10, "retries while Prometheus is down")
        s = sink.stats()
        assert s.samples_sent == 0 and s.requests_failed == s.retries and "Connection" in s.last_error
        assert s.queue_depth + s.in_flight == len(events)  # nothing lost: all within the queue bound
        prom = Prometheus(tmp_path, port)
        wait_for(lambda: sink.stats().samples_sent == len(events), 20, "delivery after Prometheus came up")
        sink.close(5)
        assert sink.stats().dropped == sink.stats().lost_at_close == 0
        t_end = (t0 + 15_000 * (n - 1)) / 1000
        for m in (OCT_M, OUT_M):
            res = prom.api("/api/v1/query", query=f"count_over_time({m}[{15 * n}s])", time=f"{t_end:.3f}")["result"]
            assert sorted(float(r["value"][1]) for r in res) == [float(n)] * 2
        rng = prom.api("/api/v1/query_range", query=OCT_M, start=f"{t0 / 1000:.3f}", end=f"{t_end:.3f}",
                       step="15s")["result"]
        assert {r["metric"]["target"]: [float(v) for _, v in r["values"]] for r in rng} == {
            t: [v for _, v in want[(OCT_M, t)]] for t in ("leaf-1", "spine-2")}
    finally:
        sink.close(0.1)
        if prom is not None:
            prom.stop()


# -- a tiny local receiver ---------------------------------------------------------------------

class Receiver:
    """HTTP/1.1 keep-alive server answering the statuses in ``script`` in turn (then 204)."""

    def __init__(self, script: list[int | tuple[int, dict[str, str]]] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.script = list(script or [])
        self.requests: list[tuple[dict[str, str], bytes, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.gate.wait(10)
                step = outer.script.pop(0) if outer.script else 204
                code, hdrs = step if isinstance(step, tuple) else (step, {})
                outer.requests.append((dict(self.headers.items()), body, code))
                msg = b"" if code == 204 else f"status {code} from the test receiver".encode()
                self.send_response(code)
                for k, v in hdrs.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/api/v1/write"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(*args: Any, **kw: Any) -> Receiver:
        r = Receiver(*args, **kw)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


FAST = {"batch-wait-s": 0.02, "min-backoff-s": 0.02, "max-backoff-s": 0.1}


def test_a_request_follows_the_spec_headers_sorted_labels_sorted_samples(receiver_factory: Callable[..., Receiver]) -> None:
    rx = receiver_factory()
    sink = build_remote_write_sink({"url": rx.url, **FAST}, seed=3)
    tags = {"interface-name": "eth1", "0queue": "3", "__evil": "x", "target": "not-this", "empty": ""}
    times = [5_000, 1_000, 3_000, 1_000]  # out of order, and a same-millisecond repeat (the later wins)
    sink.write([TelemetryEvent(OCT, t * MS, "leaf-9", tags, float(i)) for i, t in enumerate(times)], [])
    sink.close(5)
    [(headers, body, _)] = rx.requests
    assert headers["Content-Encoding"] == "snappy" and headers["Content-Type"] == "application/x-protobuf"
    assert headers["X-Prometheus-Remote-Write-Version"] == "0.1.0" and headers["User-Agent"] == USER_AGENT
    assert "Authorization" not in headers
    [(labels, samples)] = decode(body).items()
    assert labels == (("__name__", OCT_M), ("interface_name", "eth1"), ("tag_0queue", "3"), ("tag___evil", "x"),
                      ("target", "leaf-9"))
    assert [k for k, _ in labels] == sorted(k for k, _ in labels)
    assert samples == [(1_000, 3.0), (3_000, 2.0), (5_000, 0.0)]
    s = sink.stats()
    assert (s.samples_sent, s.skipped_out_of_order, s.requests) == (3, 1, 1)


def test_400_is_rejected_once_and_503_429_are_retried(receiver_factory: Callable[..., Receiver],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "fabricscope.telemetry.remote_write")
    bad = receiver_factory([400, 400, 400])
    sink = build_remote_write_sink({"url": bad.url, **FAST}, seed=4)
    sink.write([ev(OCT, 1_000 + i, i) for i in range(10)], [])
    wait_for(lambda: sink.stats().rejected == 10, 5, "the 400")
    time.sleep(0.5)  # a retry storm would show up here
    sink.close(2)
    s = sink.stats()
    assert (len(bad.requests), s.requests, s.retries, s.rejected, s.samples_sent) == (1, 1, 0, 10, 0)
    assert "HTTP 400" in s.last_error and "status 400 from the test receiver" in caplog.text
    assert sum("rejected 10 samples" in r.getMessage() for r in caplog.records) == 1

    flaky = receiver_factory([503, 503, (429, {"Retry-After": "0"}), 502])
    sink = build_remote_write_sink({"url": flaky.url, **FAST}, seed=5)
    sink.write([ev(OCT, 1_000 + i, i) for i in range(10)], [])
    wait_for(lambda: sink.stats().samples_sent == 10, 5, "delivery after 5xx/429")
    sink.close(2)
    s = sink.stats()
    assert [code for _, _, code in flaky.requests] == [503, 503, 429, 502, 204]
    assert (s.requests, s.retries, s.requests_failed, s.rejected) == (5, 4, 4, 0)
    assert len({body for _, body, _ in flaky.requests}) == 1  # the same request each time
    # one warning line for the retry condition, not one per attempt
    assert sum("retrying 10 samples" in r.getMessage() for r in caplog.records) == 1


def test_backoff_grows_exponentially_with_jitter_and_respects_retry_after() -> None:
    sink = build_remote_write_sink({"url": "http://127.0.0.1:9/w", "min-backoff-s": 0.1, "max-backoff-s": 3.0},
                                   seed=6)
    try:
        ds = [sink._backoff(a, None) for a in range(8)]
        for a, d in enumerate(ds):
            full = min(3.0, 0.1 * 2 ** a)
            assert full / 2 <= d <= full
        assert len(set(ds)) == len(ds)  # jittered
        assert sink._backoff(0, 2.0) >= 2.0 and sink._backoff(0, 99.0) <= 3.0
    finally:
        sink.close(0)


def test_a_full_queue_drops_the_oldest_and_counts(receiver_factory: Callable[..., Receiver]) -> None:
    rx = receiver_factory()
    sink = build_remote_write_sink({"url": rx.url, "max-queue-samples": 100, "max-samples-per-send": 50,
                                    "batch-wait-s": 0.02}, seed=7)
    sink.write([ev(OCT, 10_000 + i, i) for i in range(250)], [])  # one write: trimmed before the sender runs
    s = sink.stats()
    assert s.dropped == 150 and s.queue_depth + s.in_flight == 100
    sink.close(5)
    got = sorted(t for _, body, _ in rx.requests for pts in decode(body).values() for t, _ in pts)
    assert got == list(range(10_150, 10_250))  # exactly the newest 100
    assert sink.stats().samples_sent == 100

    # the byte bound: each sample of this series is estimated at about 100 bytes
    rx.gate.clear()  # hold the receiver so the queue fills behind the batch in flight
    sink = build_remote_write_sink({"url": rx.url, "max-queue-bytes": 2_000, "max-samples-per-send": 10,
                                    "batch-wait-s": 0.01}, seed=8)
    sink.write([ev(OCT, 20_000 + i, i) for i in range(10)], [])
    wait_for(lambda: sink.stats().in_flight == 10, 5, "a batch in flight")
    sink.write([ev(OCT, 30_000 + i, i) for i in range(100)], [])
    s = sink.stats()
    assert 0 < s.queue_bytes <= 2_000 and s.dropped == 100 - s.queue_depth and s.queue_depth < 100
    rx.gate.set()
    sink.close(5)
    assert sink.stats().samples_sent == 10 + s.queue_depth


def test_bearer_token_is_sent_and_never_logged(receiver_factory: Callable[..., Receiver],
                                               caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.DEBUG)
    token = "s3cr3t-token-" + "x" * 20
    rx = receiver_factory([503, 401])
    sink = build_remote_write_sink({"url": rx.url, "bearer-token": token, "headers": {"X-Scope-OrgID": "fab"},
                                    **FAST}, seed=9)
    sink.write([ev(OCT, 1_000, 1)], [])
    wait_for(lambda: sink.stats().rejected == 1, 5, "the 401")
    sink.write([ev(OCT, 2_000, 2)], [])
    sink.close(5)
    assert [h["Authorization"] for h, _, _ in rx.requests] == [f"Bearer {token}"] * 3
    assert {h["X-Scope-OrgID"] for h, _, _ in rx.requests} == {"fab"}
    assert token not in caplog.text and "401" in caplog.text
    assert token not in repr(sink) + repr(sink.options) + repr(sink.stats()) + str(sink.metric_samples())

    (tmp_path / "pw").write_text("hunter2\n")
    rx2 = receiver_factory()
    sink = build_remote_write_sink({"url": rx2.url, "username": "fab", "password-file": str(tmp_path / "pw"), **FAST})
    sink.write([ev(OCT, 1_000, 1)], [])
    sink.close(5)
    [(h, _, _)] = rx2.requests
    assert h["Authorization"] == "Basic ZmFiOmh1bnRlcjI="  # base64("fab:hunter2")
    assert "hunter2" not in caplog.text + repr(sink.options)


def test_close_returns_by_its_deadline_and_counts_what_was_lost(caplog: pytest.LogCaptureFixture) -> None:
    sink = build_remote_write_sink({"url": f"http://127.0.0.1:{free_port()}/w", **FAST}, seed=10)
    sink.write([ev(OCT, 1_000 + i, i) for i in range(30)], [])
    t = time.monotonic()
    sink.close(0.5)
    assert time.monotonic() - t < 1.5
    s = sink.stats()
    assert s.lost_at_close == 30 and s.samples_sent == 0 and s.retries > 0
    assert "30 samples not delivered" in caplog.text
    with pytest.raises(TransportError, match="closed"):
        sink.write([ev(OCT, 5_000, 1)], [])


def test_a_series_never_goes_back_in_time_across_requests(receiver_factory: Callable[..., Receiver]) -> None:
    rx = receiver_factory()
    sink = build_remote_write_sink({"url": rx.url, **FAST}, seed=11)
    sink.write([ev(OCT, 2_000, 1), ev(OCT, 3_000, 2)], [])
    wait_for(lambda: sink.stats().samples_sent == 2, 5, "first request")
    sink.write([ev(OCT, 2_500, 9), ev(OCT, 3_000, 9), ev(OCT, 4_000, 3), ev(OUT, 1_000, 4)], [])
    sink.close(5)
    assert [decode(b) for _, b, _ in rx.requests][1] == {
        series_labels(OCT, "leaf-1", {"interface_name": "eth1"}): [(4_000, 3.0)],
        series_labels(OUT, "leaf-1", {"interface_name": "eth1"}): [(1_000, 4.0)]}
    assert sink.stats().skipped_out_of_order == 2


def _cert(tmp: Path, name: str, ca: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
    crt, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    if ca is None:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", crt, "-days", "2", "-subj", f"/CN={name}",
                        "-addext", "basicConstraints=critical,CA:TRUE"], check=True, capture_output=True)
    else:
        csr = tmp / f"{name}.csr"
        subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", csr, "-subj", f"/CN={name}"], check=True, capture_output=True)
        ext = tmp / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1\n")
        subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
                        "-out", crt, "-days", "2", "-extfile", ext], check=True, capture_output=True)
    return crt, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI needed to make test certificates")
def test_tls_verifies_the_server_by_default_and_does_mtls(receiver_factory: Callable[..., Receiver],
                                                          tmp_path: Path) -> None:
    ca = _cert(tmp_path, "ca")
    srv = _cert(tmp_path, "server", ca)
    cli = _cert(tmp_path, "client", ca)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(srv[0], srv[1])
    ctx.load_verify_locations(ca[0])
    ctx.verify_mode = ssl.CERT_REQUIRED  # mTLS: the client must show a certificate from the CA
    rx = receiver_factory(tls=ctx)
    # no CA given: the server's certificate is not trusted, nothing is sent, retries are counted
    untrusted = build_remote_write_sink({"url": rx.url, **FAST}, seed=12)
    untrusted.write([ev(OCT, 1_000, 1)], [])
    wait_for(lambda: untrusted.stats().retries >= 2, 5, "TLS failures")
    untrusted.close(0.2)
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stats().last_error and not rx.requests
    sink = build_remote_write_sink({"url": rx.url, "ca-file": str(ca[0]), "cert-file": str(cli[0]),
                                    "key-file": str(cli[1]), **FAST}, seed=13)
    sink.write([ev(OCT, 1_000, 1)], [])
    sink.close(5)
    assert sink.stats().samples_sent == 1 and len(rx.requests) == 1


@pytest.mark.parametrize(("opts", "field"), [
    ({}, "url: required"),
    ({"url": "ftp://x/y"}, "url: expected an http"),
    ({"url": "http://:9090/w"}, "url: no host"),
    ({"url": "http://bob:pw123@h/w"}, "url: credentials in the URL"),
    ({"url": "http://h:99999/w"}, "url: not a valid URL"),
    ({"url": "http://h/w", "max-samples-per-send": 0}, "max-samples-per-send: expected a positive integer"),
    ({"url": "http://h/w", "max-queue-samples": True}, "max-queue-samples: expected a positive integer"),
    ({"url": "http://h/w", "batch-wait-s": -1}, "batch-wait-s: expected a positive number"),
    ({"url": "http://h/w", "timeout-s": float("nan")}, "timeout-s: expected a positive number"),
    ({"url": "http://h/w", "min-backoff-s": 9, "max-backoff-s": 1}, "min-backoff-s: 9.0 is more than"),
    ({"url": "http://h/w", "max-queue-samples": 10}, "max-samples-per-send: 2000 is more than"),
    ({"url": "http://h/w", "prefix": "9bad"}, "prefix: expected a metric name prefix"),
    ({"url": "http://h/w", "colour": "red"}, "colour: unknown option"),
    ({"url": "https://h/w", "cert-file": __file__}, "cert-file: give cert-file and key-file together"),
    ({"url": "https://h/w", "ca-file": "/nonexistent/ca.pem"}, "ca-file: no such file"),
    ({"url": "https://h/w", "ca-file": __file__}, "ca-file: cannot load"),
    ({"url": "http://h/w", "insecure-skip-verify": True}, "url: TLS options are given but the URL is http"),
    ({"url": "http://h/w", "findings": "yes"}, "findings: expected true or false"),
    ({"url": "http://h/w", "password": "pw123"}, "username: a password is given but no username"),
    ({"url": "http://h/w", "bearer-token": "t", "username": "u"}, "bearer-token: give a bearer token or"),
    ({"url": "http://h/w", "bearer-token": "pw123", "bearer-token-env": "X"}, "bearer-token: give one of"),
    ({"url": "http://h/w", "bearer-token-env": "FABRICSCOPE_NO_SUCH_VAR"}, "bearer-token-env: environment variable"),
    ({"url": "http://h/w", "bearer-token-env": "pw123 oops"}, "bearer-token-env: expected the NAME"),
    ({"url": "http://h/w", "bearer-token-file": "/nonexistent/tok"}, "bearer-token-file: cannot read"),
    ({"url": "http://h/w", "headers": ["X-A"]}, "headers: expected a mapping"),
    ({"url": "http://h/w", "headers": {"Content-Encoding": "gzip"}}, "headers: Content-Encoding is set by the sink"),
    ({"url": "http://h/w", "headers": {"authorization": "pw123"}}, "headers: authorization is set by the sink"),
    ({"url": "http://h/w", "headers": {"X Bad": "1"}}, "headers: not a valid header name"),
    ({"url": "http://h/w", "headers": {"X-Tenant": "a\r\nX-Evil: pw123"}}, "headers.X-Tenant: expected a one-line"),
])
def test_bad_options_name_the_field(opts: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        build_remote_write_sink(opts)
    msg = str(ei.value)
    assert msg.startswith("remote_write sink: ") and field in msg, msg
    assert "pw123" not in msg and "\n" not in msg


def test_options_accept_dashes_or_underscores_and_resolve_env_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICSCOPE_RW_TOKEN", "tok-from-env")
    o = parse_remote_write_options({"url": "https://h/w", "bearer_token_env": "FABRICSCOPE_RW_TOKEN",
                                    "max-samples-per-send": 10, "max_queue_samples": 20, "findings": False})
    assert (o.bearer_token, o.max_samples_per_send, o.max_queue_samples, o.findings) == ("tok-from-env", 10, 20, False)
    assert "tok-from-env" not in repr(o)


def test_string_and_huge_values_are_skipped_and_findings_can_be_off(receiver_factory: Callable[..., Receiver]) -> None:
    rx = receiver_factory()
    sink: RemoteWriteSink = build_remote_write_sink({"url": rx.url, "findings": False, **FAST})
    as_sink: Sink = sink  # the collector's protocol (checked by mypy)
    as_sink.write([ev(OCT, 1_000, "UP"), ev(OCT, 2_000, 10 ** 400), ev(OCT, 3_000, False)],
                  [Finding("gray-link", "x", 0.5, (0, 0))])
    as_sink.close()
    s = sink.stats()
    assert (s.skipped_non_numeric, s.samples_sent) == (2, 1)
    [(_, body, _)] = rx.requests
    assert list(decode(body).values()) == [[(3_000, 0.0)]]


def test_the_message_classes_match_remote_proto_compiled_by_protoc(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (protoc) not installed")
    from google.protobuf import descriptor_pb2

    src = Path(__file__).parent.parent / "src"
    out = tmp_path / "set.pb"
    assert protoc.main(["protoc", f"-I{src}", f"--descriptor_set_out={out}",
                        str(src / "fabricscope/telemetry/prompb/remote.proto")]) == 0
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(out.read_bytes())
    assert fds.file[0] == FILE_DESCRIPTOR


_label_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)


@fuzz_settings(200)
@given(st.dictionaries(st.lists(st.tuples(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), _label_text),
                                min_size=1, max_size=4, unique_by=lambda kv: kv[0]).map(lambda x: tuple(sorted(x))),
                       st.dictionaries(st.integers(-2**62, 2**62), st.floats(allow_nan=False), min_size=1, max_size=6),
                       max_size=5))
def test_encode_then_decode_round_trips(series: dict[tuple[tuple[str, str], ...], dict[int, float]]) -> None:
    body = snappy_block(encode_write_request((k, list(v.items())) for k, v in series.items()))
    assert decode(body) == {k: sorted(v.items()) for k, v in series.items()}


def test_config_sink_remote_write_builds_through_build_sink(tmp_path: Path) -> None:
    """`sinks: - type: remote_write` passes the config loader and build_sink makes the real sink."""
    from fabricscope.telemetry.config import parse_config
    from fabricscope.telemetry.remote_write import RemoteWriteSink
    from fabricscope.telemetry.sinks import build_sink

    cfg = parse_config({
        "targets": {"t": {"address": "127.0.0.1:9339", "names": ["leaf-0"], "subscriptions": ["s"]}},
        "subscriptions": {"s": {"paths": ["/interfaces"], "mode": "stream", "stream-mode": "sample",
                                "sample-interval": "1s"}},
        "sinks": [{"type": "remote_write", "url": "http://127.0.0.1:9/api/v1/write", "max-queue-samples": 10000}],
    }, source="c.yaml")
    (sc,) = cfg.sinks
    sink = build_sink(sc.type, sc.options)
    try:
        assert isinstance(sink, RemoteWriteSink)
    finally:
        sink.close(deadline_s=0.1)
    with pytest.raises(ConfigError, match=r"c\.yaml: sinks\[0\].*ur1"):
        parse_config({"targets": {"t": {"address": "127.0.0.1:9339", "names": ["x"], "subscriptions": ["s"]}},
                      "subscriptions": {"s": {"paths": ["/interfaces"]}},
                      "sinks": [{"type": "remote_write", "ur1": "http://x"}]}, source="c.yaml")
