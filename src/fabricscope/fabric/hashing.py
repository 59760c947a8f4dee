"""Switch-like ECMP hashing of the 5-tuple.

Real switch ASICs hash a fixed-layout key built from the 5-tuple with a CRC (CRC-32 or
CRC-16 variants) and take the result modulo the number of next hops. When every tier uses
the same function *and* seed, a flow that took bucket ``i`` at one tier lands in a correlated
bucket at the next tier: this is *hash polarization* (Cisco, "ECMP polarization"; Zhang et
al., "Hashing Linearity Enables Relative Path Control", 2021). Per-switch seeds decorrelate
tiers. The path of a 5-tuple is a pure function of (tuple, fabric, hash config): the prober
relies on this in twin mode.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple

HashFunction = Literal["crc32", "crc16", "xor"]
HASH_FUNCTIONS: tuple[HashFunction, ...] = ("crc32", "crc16", "xor")


def _crc16_ccitt(data: bytes, init: int) -> int:
    crc = init & 0xFFFF
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def _xor_fold(data: bytes, init: int) -> int:
    h = init & 0xFFFFFFFF
    for (word,) in struct.iter_unpack(">I", data + b"\0" * (-len(data) % 4)):
        h ^= word
    return (h ^ (h >> 16)) & 0xFFFF


def _crc32(data: bytes, init: int) -> int:
    return zlib.crc32(data, init & 0xFFFFFFFF)


_FUNCS: dict[str, Callable[[bytes, int], int]] = {
    "crc32": _crc32,
    "crc16": _crc16_ccitt,
    "xor": _xor_fold,
}


def _ip_bytes(addr: str) -> bytes:
    try:
        return ipaddress.ip_address(addr).packed
    except ValueError:
        # Non-IP endpoint names still hash deterministically.
        return zlib.crc32(addr.encode()).to_bytes(4, "big")


def hash_key(flow: FiveTuple) -> bytes:
    """The fixed-layout hash key: src ip, dst ip, proto, src port, dst port."""
    return (
        _ip_bytes(flow.src_ip)
        + _ip_bytes(flow.dst_ip)
        + struct.pack(">BHH", flow.proto & 0xFF, flow.src_port & 0xFFFF, flow.dst_port & 0xFFFF)
    )


@dataclass(frozen=True, slots=True)
class HashConfig:
    """How switches hash. ``per_switch_seed=False`` gives every switch the same seed
    (polarization); otherwise each switch's seed is derived from its id and ``seed``."""

    function: HashFunction = "crc32"
    seed: int = 0
    per_switch_seed: bool = True

    def __post_init__(self) -> None:
        if self.function not in _FUNCS:
            raise ConfigError(
                f"hash.function: unknown {self.function!r}; choose one of {', '.join(HASH_FUNCTIONS)}"
            )

    def device_seed(self, device_id: str) -> int:
        """The seed a given switch (or NIC) uses."""
        if not self.per_switch_seed:
            return self.seed & 0xFFFFFFFF
        return zlib.crc32(device_id.encode(), self.seed & 0xFFFFFFFF)

    def bucket(self, key: bytes, device_seed: int, n: int) -> int:
        """Next-hop index in ``range(n)`` for a hash key at a device with ``device_seed``."""
        if n <= 1:
            return 0
        h = _FUNCS[self.function](key, device_seed)
        # Switches use the low bits of the CRC, folded, modulo the group size.
        return (h ^ (h >> 16)) % n
