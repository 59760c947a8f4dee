"""Remote-Write 1.0 message classes (``remote.proto``), built at import from a descriptor.

Why not protoc's generated module: generated code pins the protobuf runtime to the protoc
that made it (``ValidateProtobufRuntimeVersion``: 7.35 gencode refuses a 5.x or 6.x runtime,
while fabricscope accepts ``protobuf>=4.25``), and it registers ``prometheus.*`` in the
process-wide default pool, where another copy of the same proto (a Prometheus client, an
exporter library) would clash. Here the descriptor is declared once in Python, added to a
private pool, and the classes come from ``message_factory.GetMessageClass`` (protobuf >= 4.21);
``tests/test_remote_write.py`` compiles ``remote.proto`` with protoc and checks both agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["FILE_DESCRIPTOR", "Label", "MetricMetadata", "Sample", "TimeSeries", "WriteRequest"]

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _field(name: str, number: int, ftype: int, label: int = _OPT, type_name: str = "") -> Any:
    json = name.split("_")[0] + "".join(p.title() for p in name.split("_")[1:])
    f = _F(name=name, number=number, type=ftype, label=label, json_name=json)
    if type_name:
        f.type_name = type_name
    return f


def _file() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(name="fabricscope/telemetry/prompb/remote.proto",
                                            package="prometheus", syntax="proto3")
    wr = fd.message_type.add(name="WriteRequest")
    wr.field.extend([_field("timeseries", 1, _F.TYPE_MESSAGE, _REP, ".prometheus.TimeSeries"),
                     _field("metadata", 3, _F.TYPE_MESSAGE, _REP, ".prometheus.MetricMetadata")])
    wr.reserved_range.add(start=2, end=3)
    md = fd.message_type.add(name="MetricMetadata")
    enum = md.enum_type.add(name="MetricType")
    for i, n in enumerate(("UNKNOWN", "COUNTER", "GAUGE", "HISTOGRAM", "GAUGEHISTOGRAM", "SUMMARY", "INFO",
                           "STATESET")):
        enum.value.add(name=n, number=i)
    md.field.extend([_field("type", 1, _F.TYPE_ENUM, type_name=".prometheus.MetricMetadata.MetricType"),
                     _field("metric_family_name", 2, _F.TYPE_STRING),
                     _field("help", 4, _F.TYPE_STRING), _field("unit", 5, _F.TYPE_STRING)])
    ts = fd.message_type.add(name="TimeSeries")
    ts.field.extend([_field("labels", 1, _F.TYPE_MESSAGE, _REP, ".prometheus.Label"),
                     _field("samples", 2, _F.TYPE_MESSAGE, _REP, ".prometheus.Sample")])
    lab = fd.message_type.add(name="Label")
    lab.field.extend([_field("name", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_STRING)])
    smp = fd.message_type.add(name="Sample")
    smp.field.extend([_field("value", 1, _F.TYPE_DOUBLE), _field("timestamp", 2, _F.TYPE_INT64)])
    return fd


#: The ``FileDescriptorProto`` of ``remote.proto`` (what protoc would produce, without comments).
FILE_DESCRIPTOR: Any = _file()
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(FILE_DESCRIPTOR)


def _cls(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName("prometheus." + name))


if TYPE_CHECKING:
    # protobuf ships no type information: these declare the attributes the code relies on.
    class _Repeated(Sequence[Any]):
        def add(self, **kw: Any) -> Any: ...
        def extend(self, items: Iterable[Any]) -> None: ...

    class Label:
        name: str
        value: str
        def __init__(self, *, name: str = ..., value: str = ...) -> None: ...

    class Sample:
        value: float
        timestamp: int
        def __init__(self, *, value: float = ..., timestamp: int = ...) -> None: ...

    class TimeSeries:
        labels: _Repeated
        samples: _Repeated
        def __init__(self, *, labels: Iterable[Label] = ..., samples: Iterable[Sample] = ...) -> None: ...

    class MetricMetadata:
        type: int
        metric_family_name: str
        help: str
        unit: str

    class WriteRequest:
        timeseries: _Repeated
        metadata: _Repeated
        def __init__(self, *, timeseries: Iterable[TimeSeries] = ...) -> None: ...
        def SerializeToString(self) -> bytes: ...
        def ParseFromString(self, data: bytes) -> int: ...
        def ByteSize(self) -> int: ...
else:
    WriteRequest = _cls("WriteRequest")
    MetricMetadata = _cls("MetricMetadata")
    TimeSeries = _cls("TimeSeries")
    Label = _cls("Label")
    Sample = _cls("Sample")
