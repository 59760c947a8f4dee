"""OTLP receiver for real: official TraceServiceStub over gRPC, httpx over HTTP, auth, cap, flush."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fabricscope.service.otlp_receiver import JsonlSink, OtlpReceiver, ReceiverAuth
from fabricscope.slo.otlp import read_spans
from fabricscope.telemetry.auth import LoginThrottle


def _request(n: int, service: str = "svc") -> trace_service_pb2.ExportTraceServiceRequest:
    spans = [trace_pb2.Span(trace_id=bytes([1] * 16), span_id=(i + 1).to_bytes(8, "big"), name="op",
                            kind=trace_pb2.Span.SPAN_KIND_SERVER, start_time_unix_nano=1000 + i,
                            end_time_unix_nano=2000 + i) for i in range(n)]
    res = resource_pb2.Resource(attributes=[common_pb2.KeyValue(
        key="service.name", value=common_pb2.AnyValue(string_value=service))])
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(
        resource=res, scope_spans=[trace_pb2.ScopeSpans(spans=spans)])])


@pytest.fixture
def rx(tmp_path: Path) -> Any:
    r = OtlpReceiver(JsonlSink(tmp_path / "out.jsonl"), grpc_address="127.0.0.1:0", http_address="127.0.0.1:0",
                     max_buffered_spans=10, auth=ReceiverAuth(token="s3cret", username="otel", password="pw"),
                     throttle=LoginThrottle(free_failures=2, base_lockout_s=30.0), flush_interval_s=60.0)
    r.start()
    yield r
    r.stop(deadline_s=1.0)


def test_grpc_and_http_export_flushed_on_stop(rx: Any, tmp_path: Path) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        stub.Export(_request(3, "grpc-svc"), metadata=(("authorization", "Bearer s3cret"),), timeout=5)
    base = f"http://127.0.0.1:{rx.http_port}/v1/traces"
    basic = "Basic " + base64.b64encode(b"otel:pw").decode()
    r = httpx.post(base, content=_request(2, "http-pb").SerializeToString(),
                   headers={"Content-Type": "application/x-protobuf", "Authorization": basic})
    assert r.status_code == 200
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "http-js"}}]},
                              "scopeSpans": [{"spans": [{"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x",
                                                         "kind": 2, "startTimeUnixNano": "5", "endTimeUnixNano": "9"}]}]}]}
    r = httpx.post(base, json=doc, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200 and r.json() == {}
    assert rx.stats.buffered == 6
    st = rx.stop(deadline_s=1.0)
    assert st.spans_flushed == 6
    t = read_spans([tmp_path / "out.jsonl"])
    assert sorted(t.services[i] for i in t.service) == ["grpc-svc"] * 3 + ["http-js"] + ["http-pb"] * 2
    assert b"01010101010101010101010101010101" in t.trace_id.tolist()  # bytes ids became hex


def test_over_cap_refused(rx: Any) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        stub.Export(_request(8), metadata=(("authorization", "Bearer s3cret"),), timeout=5)
        with pytest.raises(grpc.RpcError) as exc:
            stub.Export(_request(3), metadata=(("authorization", "Bearer s3cret"),), timeout=5)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", content=_request(5).SerializeToString(),
                   headers={"Content-Type": "application/x-protobuf", "Authorization": "Bearer s3cret"})
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert rx.stats.spans_refused == 8
    rx.flush()
    r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", content=_request(5).SerializeToString(),
                   headers={"Content-Type": "application/x-protobuf", "Authorization": "Bearer s3cret"})
    assert r.status_code == 200


def test_wrong_credentials_refused_throttled_and_not_logged(rx: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as exc:
                stub.Export(_request(1), metadata=(("authorization", "Bearer guess-XYZ"),), timeout=5)
            assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # locked out now: even the right token is refused unchecked
        with pytest.raises(grpc.RpcError) as exc:
            stub.Export(_request(1), metadata=(("authorization", "Bearer s3cret"),), timeout=5)
        assert "too many failed logins" in (exc.value.details() or "")
    r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", json={"resourceSpans": []},
                   headers={"Authorization": "Basic " + base64.b64encode(b"otel:nope").decode()})
    assert r.status_code == 401
    # free_failures=2: two checked failures, then the host is locked out and refused unchecked
    assert rx.stats.auth_failures == 2 and rx.stats.auth_throttled == 3
    assert "guess-XYZ" not in caplog.text and "nope" not in caplog.text
    assert "login failed" in caplog.text


def test_bad_body_and_content_type(rx: Any) -> None:
    url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
    h = {"Authorization": "Bearer s3cret"}
    assert httpx.post(url, content=b"\xff\x00garbage", headers={**h, "Content-Type": "application/x-protobuf"}
                      ).status_code == 400
    assert httpx.post(url, content=b"x", headers={**h, "Content-Type": "text/plain"}).status_code == 415
    assert httpx.post(url.replace("/v1/traces", "/v1/logs"), json={}, headers=h).status_code == 404
    assert json.loads(httpx.post(url, content=b"[1]", headers={**h, "Content-Type": "application/json"}).text)["code"] == 400
