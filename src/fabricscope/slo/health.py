"""grpc.health.v1 probing: ask each endpoint ``Check`` with a deadline and record its liveness.

Protocol: the gRPC Health Checking Protocol (https://github.com/grpc/grpc/blob/master/doc/health-checking.md),
``grpc.health.v1.Health/Check``; answers SERVING / NOT_SERVING / UNKNOWN / SERVICE_UNKNOWN, and
transport failures (unreachable, deadline exceeded) are recorded as ``UNREACHABLE`` with the gRPC code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fabricscope.model.records import Finding

__all__ = ["Liveness", "liveness_findings", "probe_all", "probe_health"]


@dataclass(frozen=True)
class Liveness:
    """One probe: endpoint, service name asked, status name, round-trip ms, the time (ns) and any error."""

    endpoint: str
    service: str
    status: str
    rtt_ms: float
    at_ns: int
    error: str = ""

    @property
    def alive(self) -> bool:
        return self.status == "SERVING"


def probe_health(endpoint: str, *, service: str = "", timeout_s: float = 1.0,
                 clock: Callable[[], int] = time.time_ns) -> Liveness:
    """Probe one ``host:port`` (plaintext) once."""
    t0 = time.perf_counter()
    with grpc.insecure_channel(endpoint) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            err = ""
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            status = "SERVICE_UNKNOWN" if code == grpc.StatusCode.NOT_FOUND else "UNREACHABLE"
            err = code.name if code is not None else type(exc).__name__
    return Liveness(endpoint, service, status, round((time.perf_counter() - t0) * 1e3, 3), clock(), err)


def probe_all(endpoints: Sequence[str], *, service: str = "", timeout_s: float = 1.0) -> list[Liveness]:
    """Probe every endpoint once, one after another (each bounded by ``timeout_s``)."""
    return [probe_health(e, service=service, timeout_s=timeout_s) for e in endpoints]


def liveness_findings(probes: Sequence[Liveness]) -> list[Finding]:
    """A ``health-not-serving`` finding for each probe that did not answer SERVING."""
    return [Finding(kind="health-not-serving", subject=p.endpoint, score=1.0, window=(p.at_ns, p.at_ns),
                    evidence=(f"grpc.health.v1 Check{f' {p.service!r}' if p.service else ''}: {p.status}"
                              + (f" ({p.error})" if p.error else ""),),
                    action=f"take {p.endpoint} out of rotation until it answers SERVING")
            for p in probes if not p.alive]
