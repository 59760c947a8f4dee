"""Per-client limits of the gNMI target and a cache bounded in entries and bytes (pure).

Switch gNMI servers bound what one client may hold (e.g. Arista EOS and Cisco NX-OS cap
concurrent Subscribe sessions per client and paths per request) so a runaway or hostile
collector cannot starve the others; :class:`TargetLimits` carries the same knobs with
defaults that a fleet collector never reaches. Nothing here knows gRPC.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

from fabricscope.model.errors import ConfigError

__all__ = ["BoundedCache", "TargetLimits"]

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class TargetLimits:
    """Caps of one :class:`~fabricscope.telemetry.target.GnmiTarget`; every one is >= 1.

    ``sessions_per_client``: concurrent Subscribe RPCs one client host may hold per device
    (``prefix.target``; the twin serves many devices, each counts as its own switch).
    ``sessions``: concurrent Subscribe RPCs in all. ``subscriptions_per_session``: entries of
    one SubscriptionList. ``paths_per_request``: paths of one GetRequest. ``path_elems``:
    elements of one path. ``leaves_per_request``: leaves one Get or Subscribe may resolve to.
    ``receive_message_bytes``: gRPC ``max_receive_message_length``. ``updates_per_message``:
    updates per notification sent. ``match_cache_entries`` / ``match_cache_bytes``: the
    path-resolution cache.
    """

    sessions_per_client: int = 32
    sessions: int = 4096
    subscriptions_per_session: int = 256
    paths_per_request: int = 256
    path_elems: int = 64
    leaves_per_request: int = 200_000
    receive_message_bytes: int = 1 << 20
    updates_per_message: int = 2000
    match_cache_entries: int = 4096
    match_cache_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"gnmi target: limits.{f.name}: expected an integer >= 1, got {v!r}")


class BoundedCache(Generic[K, V]):
    """An LRU map bounded in entries and in the summed ``size(key, value)`` of its entries.

    Least recently used entries are dropped first; an entry larger than the byte cap is
    never stored (a hostile request cannot flush the cache with one huge key).
    """

    def __init__(self, max_entries: int, max_bytes: int, size: Callable[[K, V], int]) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size = size
        self._d: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key: K) -> V | None:
        hit = self._d.get(key)
        if hit is None:
            self.misses += 1
            return None
        self._d.move_to_end(key)
        self.hits += 1
        return hit[0]

    def put(self, key: K, value: V) -> None:
        n = self._size(key, value)
        if n > self.max_bytes:
            return
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._d[key] = (value, n)
        self.bytes += n
        while len(self._d) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, m) = self._d.popitem(last=False)
            self.bytes -= m
            self.evictions += 1
