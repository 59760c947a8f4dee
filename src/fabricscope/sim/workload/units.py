"""Parse human quantities: byte sizes (``2MiB``, ``32MB``) and durations (``1.5ms``)."""

from __future__ import annotations

import re

from fabricscope.model.errors import ConfigError

_SIZE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,  # nccl-tests style (-b 8 -e 128M) means binary
}
_TIME_UNITS: dict[str, float] = {"": 1.0, "ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-zµ]*)\s*$")


def _quantity(
    value: object, units: dict[str, float] | dict[str, int], *, field: str, source: str,
    example: str, examples: str,
) -> float:
    """A number, or a string of a number and one of ``units``; errors name source and field."""
    if isinstance(value, bool):
        raise ConfigError(f"{source}: {field}: expected {example}, got {value!r}")
    if isinstance(value, int | float):
        out = float(value)
    elif isinstance(value, str):
        m = _NUM.match(value)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in units:
            raise ConfigError(f"{source}: {field}: expected {examples}, got {value!r}")
        out = float(m.group(1)) * units[unit]
    else:
        raise ConfigError(f"{source}: {field}: expected {example}, got {value!r}")
    if out != out or out == float("inf"):
        raise ConfigError(f"{source}: {field}: must be finite, got {value!r}")
    return out


def parse_size(value: object, *, field: str = "size", source: str = "<spec>") -> float:
    """Bytes from an int/float or a string with a unit.

    Decimal units (``KB``, ``MB``, ``GB``) are powers of 1000, binary units (``KiB``, ``MiB``,
    ``GiB``) and the bare nccl-tests letters (``K``, ``M``, ``G``) are powers of 1024.
    Raises :class:`ConfigError` naming ``source``, ``field`` and the value.
    """
    out = _quantity(value, _SIZE_UNITS, field=field, source=source,
                    example="a size like '2MiB'", examples="a size like '2MiB' or '32MB'")
    if not out > 0:
        raise ConfigError(f"{source}: {field}: must be > 0, got {value!r}")
    return out


def parse_duration_ns(value: object, *, field: str = "time", source: str = "<spec>") -> int:
    """Integer nanoseconds from an int (ns) or a string with a unit (``ns``, ``us``, ``ms``, ``s``)."""
    out = _quantity(value, _TIME_UNITS, field=field, source=source,
                    example="a duration like '10us'", examples="a duration like '10us' or '1.5ms'")
    if out < 0:
        raise ConfigError(f"{source}: {field}: must be >= 0, got {value!r}")
    return round(out)
