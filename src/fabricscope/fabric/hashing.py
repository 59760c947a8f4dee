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

import numpy as np
import numpy.typing as npt

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

    # ------------------------------------------------------------------ vectorized form
    # Every supported function is affine over GF(2) in (seed, key): CRCs are linear shift
    # registers (zlib's pre/post inversion cancels out in the difference) and the xor fold is
    # linear. So h(key, seed) = h(key, 0) ^ T(seed, len(key)) with T independent of the key:
    # hash each flow once, then each hop is one xor with the switch's precomputed term. This
    # is what lets Routing.route_many route a million flows without a Python loop per hop.

    def seed_term(self, device_seed: int, key_len: int) -> int:
        """``T`` with ``h(key, device_seed) == h(key, 0) ^ T`` for every key of ``key_len`` bytes."""
        f = _FUNCS[self.function]
        zeros = bytes(key_len)
        return f(zeros, device_seed) ^ f(zeros, 0)

    def base_hashes(self, keys: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
        """``h(key, 0)`` for each row of ``keys`` (shape ``(n, key_len)``), vectorized."""
        keys = np.asarray(keys, dtype=np.uint8)
        if keys.ndim != 2:
            raise ConfigError(f"hash keys: expected a 2-D byte array, got shape {keys.shape}")
        n, length = keys.shape
        if self.function == "crc32":
            c = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
            for j in range(length):
                c = _CRC32_TABLE[(c ^ keys[:, j]) & 0xFF] ^ (c >> np.uint32(8))
            return (c ^ np.uint32(0xFFFFFFFF)).astype(np.int64)
        if self.function == "crc16":
            c16 = np.zeros(n, dtype=np.uint32)
            for j in range(length):
                c16 = (_CRC16_TABLE[((c16 >> np.uint32(8)) ^ keys[:, j]) & 0xFF]
                       ^ (c16 << np.uint32(8))) & np.uint32(0xFFFF)
            return c16.astype(np.int64)
        padded = np.zeros((n, length + (-length % 4)), dtype=np.uint8)
        padded[:, :length] = keys
        words = padded.reshape(n, -1, 4).astype(np.uint32)
        w = (words[:, :, 0] << 24) | (words[:, :, 1] << 16) | (words[:, :, 2] << 8) | words[:, :, 3]
        h = np.bitwise_xor.reduce(w, axis=1) if w.shape[1] else np.zeros(n, dtype=np.uint32)
        return ((h ^ (h >> np.uint32(16))) & np.uint32(0xFFFF)).astype(np.int64)

    @staticmethod
    def buckets(hashes: npt.NDArray[np.int64], n: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Vectorized :meth:`bucket` from full hashes ``h(key, seed)`` and group sizes ``n``."""
        n = np.maximum(n, 1)
        return np.asarray((hashes ^ (hashes >> 16)) % n, dtype=np.int64)


def _crc32_table() -> npt.NDArray[np.uint32]:
    t = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[i] = c
    return t


def _crc16_table() -> npt.NDArray[np.uint32]:
    t = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x1021) & 0xFFFF if c & 0x8000 else (c << 1) & 0xFFFF
        t[i] = c
    return t


_CRC32_TABLE = _crc32_table()
_CRC16_TABLE = _crc16_table()
