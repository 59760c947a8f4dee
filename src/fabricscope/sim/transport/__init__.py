"""The transport layer of the simulator: a time-stepped fluid model of switch queues, ECN,
PFC (with its watchdog), DCQCN, HPCC and NSCC, on the routes of the flow-level engine
(docs/design/sim-transport.md)."""

from fabricscope.sim.transport.config import (
    CC_NAMES,
    BufferConfig,
    EcnConfig,
    HpccConfig,
    PfcConfig,
    TransportConfig,
    parse_ecn,
    transport_config_from_flags,
)
from fabricscope.sim.transport.dcqcn import (
    NIC_DEFAULT,
    PAPER,
    PARAM_SETS,
    DcqcnParams,
    dcqcn_fixed_point,
    marking_probability,
)
from fabricscope.sim.transport.fluid import FluidTransport, simulate_transport
from fabricscope.sim.transport.nscc import NsccConfig
from fabricscope.sim.transport.results import TransportResult, TransportStats

__all__ = [
    "CC_NAMES",
    "NIC_DEFAULT",
    "PAPER",
    "PARAM_SETS",
    "BufferConfig",
    "DcqcnParams",
    "EcnConfig",
    "FluidTransport",
    "HpccConfig",
    "NsccConfig",
    "PfcConfig",
    "TransportConfig",
    "TransportResult",
    "TransportStats",
    "dcqcn_fixed_point",
    "marking_probability",
    "parse_ecn",
    "simulate_transport",
    "transport_config_from_flags",
]
