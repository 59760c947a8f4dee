"""grpc.health.v1 probing against a real health servicer: SERVING, NOT_SERVING, unknown, unreachable."""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fabricscope.slo.health import liveness_findings, probe_all, probe_health


def test_probe_states() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        hs.set("", health_pb2.HealthCheckResponse.SERVING)
        hs.set("llm", health_pb2.HealthCheckResponse.NOT_SERVING)
        ep = f"127.0.0.1:{port}"
        assert probe_health(ep).status == "SERVING"
        assert probe_health(ep, service="llm").status == "NOT_SERVING"
        assert probe_health(ep, service="nope").status == "SERVICE_UNKNOWN"
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        res = probe_all([ep, dead], timeout_s=0.5)
        assert [r.status for r in res] == ["SERVING", "UNREACHABLE"]
        assert res[1].error in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        f = liveness_findings(res)
        assert [x.subject for x in f] == [dead] and f[0].kind == "health-not-serving"
    finally:
        server.stop(0)
