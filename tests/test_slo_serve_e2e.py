"""``fabricscope slo serve`` end to end: the real CLI process, real gRPC and HTTPS over TLS with a token.

Traces come from ``twin.agent_traces`` (a slow SQL tool call in 12% of the chains, 10 chains/s over
about four minutes of span time, so the 3-minute P99 rule can fire) and travel as official
opentelemetry-proto ``ExportTraceServiceRequest`` messages over a TLS gRPC channel carrying a bearer
token, plus one OTLP/HTTP JSON post over HTTPS. The test checks the breach line naming the slow hop,
the refusal of a wrong token (logged without the secret), the refusal of an unreadable span without
taking the server down, a silent TLS client not blocking the HTTP port, the grpc.health.v1 liveness
lines, and SIGTERM: exit 143 within the deadline with every accepted span in ``--out``.
"""

from __future__ import annotations

import base64
import os
import queue
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from fabricscope.slo.otlp import read_spans
from fabricscope.twin.agent_traces import AgentTraceConfig, generate_agent_traces

BIN = Path(sys.executable).parent
TOKEN = "tok-7f3a9c2e51d8"  # the real token; must never appear in the server's output
WRONG = "guess-5b8e0d4471aa"
SLOW_HOP = "tool-sql/tool.sql_query"
STOP_DEADLINE_S = 10.0  # the receiver's own stop deadline is 5 s


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make the test certificates")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=test-ca", "-days", "1", cwd=d)
    (d / "srv.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=localhost", cwd=d)
    _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "srv.pem", "-days", "1", "-extfile", "srv.ext", cwd=d)
    return d


class _Proc:
    """The CLI as a child process, stdout and stderr read line by line on threads."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICSCOPE_")}
        self.p = subprocess.Popen([str(BIN / "fabricscope"), *args], cwd=cwd, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.out: list[str] = []
        self.err: list[str] = []
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.readers = [threading.Thread(target=self._read, args=(s, name, buf), daemon=True)
                        for s, name, buf in ((self.p.stdout, "out", self.out), (self.p.stderr, "err", self.err))]
        for t in self.readers:
            t.start()

    def _read(self, stream: Any, name: str, buf: list[str]) -> None:
        for line in stream:
            buf.append(line.rstrip("\n"))
            self.lines.put((name, line.rstrip("\n")))

    def wait_for(self, stream: str, text: str, timeout: float = 30.0) -> str:
        """The first line of ``stream`` (out / err) containing ``text``, waiting up to ``timeout`` s."""
        end = time.monotonic() + timeout
        for line in (self.out if stream == "out" else self.err):
            if text in line:
                return line
        while time.monotonic() < end:
            try:
                name, line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.p.poll() is not None and self.lines.empty():
                    break
                continue
            if name == stream and text in line:
                return line
        raise AssertionError(f"no {stream} line with {text!r} in {timeout} s; stdout={self.out} stderr={self.err}")

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


@pytest.fixture
def health_server() -> Iterator[tuple[int, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    hs.set("", health_pb2.HealthCheckResponse.SERVING)
    server.start()
    yield port, hs
    server.stop(0).wait(5)


def _to_proto(batch: dict[str, Any]) -> trace_service_pb2.ExportTraceServiceRequest:
    """OTLP JSON (hex ids, the OTLP/JSON rule) to the protobuf message (bytes ids)."""
    doc = {"resourceSpans": [dict(rs, scopeSpans=[dict(ss, spans=[
        {**sp, **{k: base64.b64encode(bytes.fromhex(sp[k])).decode() for k in ("traceId", "spanId", "parentSpanId")
                  if k in sp}} for sp in ss["spans"]]) for ss in rs["scopeSpans"]]) for rs in batch["resourceSpans"]]}
    req = trace_service_pb2.ExportTraceServiceRequest()
    json_format.ParseDict(doc, req)
    return req


def _n_spans(batch: dict[str, Any]) -> int:
    return sum(len(ss["spans"]) for rs in batch["resourceSpans"] for ss in rs["scopeSpans"])


def test_serve_end_to_end(tmp_path: Path, pki: Path, health_server: tuple[int, health.HealthServicer]) -> None:
    hport, hs = health_server
    (tmp_path / "token").write_text(TOKEN + "\n")
    out = tmp_path / "spans.jsonl"
    cfg = AgentTraceConfig(n_traces=2500, qps=10, slow_fraction=0.12, slow_hops=(SLOW_HOP,))
    batches, truth = generate_agent_traces(cfg, seed=21)
    assert {t.hop for t in truth if t.kind} == {SLOW_HOP}
    span_minutes = (max(int(sp["endTimeUnixNano"]) for b in batches for rs in b["resourceSpans"]
                        for ss in rs["scopeSpans"] for sp in ss["spans"]) - cfg.start_ns) / 60e9
    assert span_minutes > 4.0  # four full 1-minute windows: the 3-minute rule has room to fire

    proc = _Proc(["slo", "serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--out", str(out),
                  "--interval", "0.5s", "--token-file", str(tmp_path / "token"), "--tls-cert", str(pki / "srv.pem"),
                  "--tls-key", str(pki / "srv.key"), "--health", f"127.0.0.1:{hport}"], cwd=tmp_path)
    try:
        ports = proc.wait_for("err", "OTLP receiver: gRPC port")
        gport = int(ports.split("gRPC port ")[1].split(",")[0])
        wport = int(ports.split("HTTP port ")[1])
        proc.wait_for("out", f"health 127.0.0.1:{hport}: SERVING")

        creds = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
        sent = 0
        with grpc.secure_channel(f"127.0.0.1:{gport}", creds) as ch:
            stub = trace_service_pb2_grpc.TraceServiceStub(ch)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as exc:
                stub.Export(_to_proto(batches[0]), metadata=(("authorization", f"Bearer {WRONG}"),), timeout=10)
            assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # a span ending before it starts: refused as the client's error, the server keeps serving
            bad = _to_proto(batches[0])
            bad.resource_spans[0].scope_spans[0].spans[0].end_time_unix_nano = 1
            with pytest.raises(grpc.RpcError) as exc:
                stub.Export(bad, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "endTimeUnixNano" in (exc.value.details() or "")
            for b in batches[:-1]:
                stub.Export(_to_proto(b), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
                sent += _n_spans(b)

        # a client that opens a TCP connection to the HTTPS port and says nothing must not block the others
        with socket.create_connection(("127.0.0.1", wport), timeout=5), \
                httpx.Client(verify=ssl.create_default_context(cafile=str(pki / "ca.pem")), timeout=10) as http:
            url = f"https://127.0.0.1:{wport}/v1/traces"
            r = http.post(url, json=batches[-1], headers={"Authorization": f"Bearer {WRONG}"})
            assert r.status_code == 401
            r = http.post(url, json=batches[-1], headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200 and r.json() == {}
            sent += _n_spans(batches[-1])
        assert sent == 2500 * 8

        line = proc.wait_for("out", f"[slo-breach] {SLOW_HOP}:", timeout=60)
        assert f"the slow hop is {SLOW_HOP}" in line and "backup model" in line
        breaches = [ln for ln in proc.out if ln.startswith("[slo-breach]")]
        assert all(ln.startswith(f"[slo-breach] {SLOW_HOP}:") for ln in breaches), breaches

        hs.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        proc.wait_for("out", f"health 127.0.0.1:{hport}: NOT_SERVING")

        t0 = time.monotonic()
        proc.p.send_signal(signal.SIGTERM)
        rc = proc.p.wait(STOP_DEADLINE_S)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    for t in proc.readers:
        t.join(5)
    assert rc == 143 and took < STOP_DEADLINE_S, (rc, took)
    err = "\n".join(proc.err)
    stopped = proc.wait_for("err", "stopped:")
    assert f"stopped: {sent} spans accepted, 0 refused, {sent} flushed, 1 bad requests, 2 failed logins" in stopped
    assert err.count("OTLP login failed") == 2 and "from 127.0.0.1" in err
    assert TOKEN not in err and WRONG not in err and TOKEN not in "\n".join(proc.out)
    spans = read_spans([out])
    assert len(spans) == sent
    assert len(set(spans.trace_id.tolist())) == 2500


def test_horizon_is_span_time_not_wall_time(tmp_path: Path) -> None:
    """Four minutes of span time received within seconds, newest first, under a 50 s horizon.

    The rules see at most 50 s of span time (at most two aligned 1-minute windows), so the 3-minute rule cannot fire
    (the same spans under the default 10-minute horizon fire it, see the test above); a horizon
    measured on the wall clock would have kept everything, since everything arrived just now.
    """
    out = tmp_path / "spans.jsonl"
    batches, _ = generate_agent_traces(AgentTraceConfig(n_traces=2500, qps=10, slow_fraction=0.12,
                                                        slow_hops=(SLOW_HOP,)), seed=21)
    trace_end: dict[str, int] = {}
    for sp in (sp for b in batches for rs in b["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]):
        trace_end[sp["traceId"]] = max(trace_end.get(sp["traceId"], 0), int(sp["endTimeUnixNano"]))
    cutoff = max(trace_end.values()) - 50 * 10**9
    older = 8 * sum(e < cutoff for e in trace_end.values())  # 8 spans a trace
    proc = _Proc(["slo", "serve", "--grpc", "", "--http", "127.0.0.1:0", "--out", str(out), "--interval", "0.5s",
                  "--horizon", "50s"], cwd=tmp_path)
    try:
        wport = int(proc.wait_for("err", "OTLP receiver:").split("HTTP port ")[1])
        with httpx.Client(timeout=10) as http:
            for b in reversed(batches):
                assert http.post(f"http://127.0.0.1:{wport}/v1/traces", json=b).status_code == 200
        time.sleep(2.0)  # several 0.5 s rule passes over everything received
        proc.p.send_signal(signal.SIGINT)
        rc = proc.p.wait(STOP_DEADLINE_S)
    finally:
        proc.kill()
    for t in proc.readers:
        t.join(5)
    assert rc == 130
    assert not [ln for ln in proc.out if ln.startswith("[slo-breach]")], proc.out
    stopped = proc.wait_for("err", "stopped:")
    assert "stopped: 20000 spans accepted, 0 refused, 20000 flushed" in stopped
    # exactly the spans of the traces that ended over 50 s before the newest span: the last rule pass saw all
    assert f"; {older} spans left out of the rules (older than the horizon)" in stopped, (older, stopped)
    assert 20000 * 0.5 < older < 20000
    assert len(read_spans([out])) == 20000  # the horizon bounds what the rules see, not what is kept on disk


@pytest.mark.parametrize("args,want", [
    (["--token-file", "{d}/empty"], "--token-file {d}/empty: the file is empty"),
    (["--tls-cert", "{d}/junk.pem", "--tls-key", "{d}/junk.pem"], "--tls-cert {d}/junk.pem / --tls-key {d}/junk.pem: "
                                                                   "certificate: not a PEM certificate"),
    (["--grpc", "127.0.0.1:99999"], "--grpc '127.0.0.1:99999' is not host:port"),
    (["--user", "otel"], "--user and --password-file go together"),
])
def test_bad_flags_one_line_exit_2(tmp_path: Path, args: list[str], want: str) -> None:
    (tmp_path / "empty").write_text("")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    r = subprocess.run([str(BIN / "fabricscope"), "slo", "serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
                        "--duration", "0.5", *(a.format(d=tmp_path) for a in args)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and want.format(d=tmp_path) in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_receiver_refuses_gzip_bomb_and_bad_content_length(tmp_path: Path) -> None:
    import gzip

    from fabricscope.service.otlp_receiver import JsonlSink, OtlpReceiver

    rx = OtlpReceiver(JsonlSink(tmp_path / "o.jsonl"), grpc_address=None, http_address="127.0.0.1:0",
                      max_body_bytes=1 << 20)
    rx.start()
    try:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        bomb = gzip.compress(b"{" + b" " * (8 << 20) + b"}")  # 8 MiB of JSON in ~8 KiB
        assert len(bomb) < 1 << 20
        r = httpx.post(url, content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 400
        with socket.create_connection(("127.0.0.1", rx.http_port), timeout=5) as s:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
        ok = gzip.compress(b'{"resourceSpans": []}')
        r = httpx.post(url, content=ok, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 200
    finally:
        st = rx.stop(deadline_s=2.0)
    assert st.bad_requests == 1 and st.requests == 1
