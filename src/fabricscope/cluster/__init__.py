"""Scale-out over NATS JetStream: batch encoding (pure), publisher and durable workers (edge).

The embedded single-process mode stays the default and needs none of this. See
``docs/design/cluster-bus.md``. Modules: :mod:`~fabricscope.cluster.encoding` (the versioned
wire format, pure), :mod:`~fabricscope.cluster.bus` (connection, streams, ``BusPublisher``),
:mod:`~fabricscope.cluster.worker` (the durable detector worker). Nothing heavy is imported here.
"""
