"""The one exception tree of fabricscope; edges translate foreign errors into it.

::

    FabricscopeError
    ├── ConfigError          a config / scenario / CLI value is wrong (names file, field, value)
    ├── InventoryError       an inventory file or builder parameter is invalid
    ├── RoutingError         no route exists
    │   └── UnroutableError  a flow's endpoints are partitioned (e.g. by a failed link)
    ├── WorkloadError        an empty or impossible workload
    ├── TraceFormatError     a trace file cannot be parsed (names file and position)
    └── TransportError       a socket / gRPC / process problem at the edge

Messages always say *where* the bad value came from so a user can fix it without a traceback.
"""

from __future__ import annotations


class FabricscopeError(Exception):
    """Base of every error fabricscope raises on purpose."""


class ConfigError(FabricscopeError):
    """A configuration value is invalid; the message names the source, field and value."""


class InventoryError(ConfigError):
    """An inventory (file or builder parameters) is invalid."""


class RoutingError(FabricscopeError):
    """Routing could not be computed."""


class UnroutableError(RoutingError):
    """A flow's endpoints have no path (the fabric is partitioned)."""


class WorkloadError(ConfigError):
    """A workload is empty or cannot be placed on the fabric."""


class TraceFormatError(FabricscopeError):
    """A trace file (or a part of it) cannot be parsed; names the file and position."""


class TransportError(FabricscopeError):
    """A network / RPC / process failure at the edge."""
