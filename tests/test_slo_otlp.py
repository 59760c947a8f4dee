"""OTLP JSON decoding: real samples, the file-exporter quirks, both decoders agree, errors name the place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fabricscope.model.errors import TraceFormatError
from fabricscope.slo import otlp
from fabricscope.slo.accesslog import AccessLogFormat, read_access_log
from fabricscope.slo.otlp import parse_otlp_json, read_spans
from fabricscope.twin.agent_traces import AgentTraceConfig, write_agent_traces

DATA = Path(__file__).parent / "data" / "slo"


def test_proto_example_uppercase_ids_numeric_times() -> None:
    t = read_spans([DATA / "otlp-proto-example-trace.json"])
    assert len(t) == 1
    assert t.trace_id[0] == b"5b8efff798038103d269b633813fc60c"
    assert t.parent_id[0] == b"eee19b7ec3c1b173"
    assert t.services[t.service[0]] == "my.service"
    assert t.names[t.name[0]] == "I'm a server span"
    assert int(t.kind[0]) == 2 and int(t.status[0]) == 0
    assert int(t.duration_ns[0]) == 1_000_000_000


def test_file_exporter_spec_example_status_error() -> None:
    t = read_spans([DATA / "file-exporter-spec-example.jsonl"])
    assert len(t) == 1
    assert int(t.status[0]) == 2
    assert int(t.start_ns[0]) == 1581452772000000321
    assert t.services[t.service[0]] == "unknown_service"  # the resource has no service.name


def test_arrow_and_walker_agree_on_generated_file(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    write_agent_traces(p, AgentTraceConfig(n_traces=300, slow_fraction=0.3, error_rate=0.05), seed=3)
    a, b = read_spans([p]), read_spans([p], fast=False)
    assert otlp._read_arrow(p) is not None  # the vectorized path really decoded it (no silent fallback)
    assert len(a) == len(b) == 300 * 8
    for f in ("trace_id", "span_id", "parent_id", "kind", "start_ns", "end_ns", "status", "out_tokens", "ttft_ns"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    for f, vals in (("service", "services"), ("name", "names"), ("endpoint", "endpoints")):
        assert [getattr(a, vals)[i] for i in getattr(a, f)] == [getattr(b, vals)[i] for i in getattr(b, f)]
    # quirks of the file exporter: roots carry no parentSpanId, unset status is {}
    first = json.loads(p.read_text().splitlines()[0])
    spans = [s for rs in first["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert any("parentSpanId" not in s for s in read_lines_spans(p))
    assert any(s["status"] == {} for s in spans)
    assert int((a.parent_id == b"").sum()) == 300


def read_lines_spans(p: Path) -> list[dict[str, object]]:
    return [s for line in p.read_text().splitlines() for rs in json.loads(line)["resourceSpans"]
            for ss in rs["scopeSpans"] for s in ss["spans"]]


def test_split_batches_of_one_service_are_one_service(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    write_agent_traces(p, AgentTraceConfig(n_traces=100, batch_spans=50), seed=1)
    assert len(p.read_text().splitlines()) > 10
    t = read_spans([p])
    assert len(set(t.services)) == len(t.services)


def test_base64_ids_and_enum_names_accepted() -> None:
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [{
        "traceId": "W47/95gDgQPSabYzgT/GDA==", "spanId": "7uGbfsPBsXQ=", "name": "x", "kind": "SPAN_KIND_CLIENT",
        "startTimeUnixNano": "1", "endTimeUnixNano": "5", "status": {"code": "STATUS_CODE_ERROR"}}]}]}]}
    t = parse_otlp_json(json.dumps(doc))
    assert t.trace_id[0] == b"5b8efff798038103d269b633813fc60c"
    assert int(t.kind[0]) == 3 and int(t.status[0]) == 2


def test_errors_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"resourceSpans": []}\n{not json\n')
    with pytest.raises(TraceFormatError, match=r"bad.jsonl: line 2: not JSON"):
        read_spans([p])
    p.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}\n')
    with pytest.raises(TraceFormatError, match=r"resourceSpans\[0\].scopeSpans\[0\].spans\[0\]: id 'zz'"):
        read_spans([p])
    p.write_text('{"resourceSpans": []}\n')
    with pytest.raises(TraceFormatError, match="no spans found"):
        read_spans([p])
    with pytest.raises(TraceFormatError, match="no such file"):
        read_spans([tmp_path / "missing.json"])


def test_envoy_and_nginx_access_logs() -> None:
    e = read_access_log(DATA / "envoy-default-format.log", AccessLogFormat(kind="envoy"))
    assert len(e) == 1 and int(e.duration_ns[0]) == 226_000_000
    assert e.services[e.service[0]] == "locations" and e.names[e.name[0]] == "POST /api/v1/locations"
    n = read_access_log(DATA / "nginx-combined-request-time.log",
                        AccessLogFormat(kind="nginx", latency_field="-1", latency_unit="s"))
    assert (n.duration_ns // 1_000_000).tolist() == [4, 31, 2]
    assert n.status.tolist() == [0, 0, 2]
    assert n.names[n.name[1]] == "POST /v1/chat/completions"


def test_json_access_log_bad_latency(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"time": 1700000000.5, "service": "api", "method": "GET /", "duration_ms": 12, "status": 200}\n'
                 '{"time": 1700000001, "service": "api", "method": "GET /", "duration_ms": "slow"}\n')
    with pytest.raises(TraceFormatError, match=r"a.jsonl: line 2: latency 'slow'"):
        read_access_log(p)
