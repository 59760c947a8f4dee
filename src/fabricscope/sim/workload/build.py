"""Accumulate FlowSpecs with dense ids and stable per-connection ECMP source ports."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from fabricscope.sim.flows import FlowSpec

# RoCEv2 NICs pick the UDP source port per queue pair from the dynamic range.
SPORT_BASE = 49152
SPORT_SPAN = 16384


def connection_port(*key: object) -> int:
    """A stable UDP source port for one connection (queue pair).

    NCCL keeps one QP per (peer, channel) for the whole collective, so every step of a ring
    hop carries the same 5-tuple and ECMP pins it to one path: a collision lasts the whole
    collective. Deriving the port from the connection key (not the flow id) models that.
    """
    text = "|".join(str(k) for k in key).encode()
    return SPORT_BASE + zlib.crc32(text) % SPORT_SPAN


class FlowList:
    """A growing list of flows; ``add`` returns the new flow's id (its position)."""

    __slots__ = ("_flows",)

    def __init__(self) -> None:
        self._flows: list[FlowSpec] = []

    def __len__(self) -> int:
        return len(self._flows)

    def add(
        self,
        src: str,
        dst: str,
        size_bytes: float,
        *,
        deps: Iterable[int] = (),
        gap_ns: int = 0,
        start_ns: int = 0,
        tag: str = "",
        src_port: int | None = None,
    ) -> int:
        fid = len(self._flows)
        self._flows.append(
            FlowSpec(fid, src, dst, size_bytes, start_ns, tuple(deps), gap_ns, tag, src_port)
        )
        return fid

    def flows(self) -> tuple[FlowSpec, ...]:
        return tuple(self._flows)
