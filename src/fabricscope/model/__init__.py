"""Records, ids and errors shared by every layer."""

from fabricscope.model.errors import (
    ConfigError,
    FabricscopeError,
    InventoryError,
    RoutingError,
    TraceFormatError,
    TransportError,
    UnroutableError,
    WorkloadError,
)
from fabricscope.model.records import (
    DomReading,
    Finding,
    FiveTuple,
    OpTiming,
    ProbeSample,
    TelemetryEvent,
)

__all__ = [
    "ConfigError",
    "DomReading",
    "FabricscopeError",
    "Finding",
    "FiveTuple",
    "InventoryError",
    "OpTiming",
    "ProbeSample",
    "RoutingError",
    "TelemetryEvent",
    "TraceFormatError",
    "TransportError",
    "UnroutableError",
    "WorkloadError",
]
