"""Prometheus Remote-Write 1.0 protobuf messages (``remote.proto``; see :mod:`.remote_pb2`)."""

from fabricscope.telemetry.prompb.remote_pb2 import (
    FILE_DESCRIPTOR,
    Label,
    MetricMetadata,
    Sample,
    TimeSeries,
    WriteRequest,
)

__all__ = ["FILE_DESCRIPTOR", "Label", "MetricMetadata", "Sample", "TimeSeries", "WriteRequest"]
