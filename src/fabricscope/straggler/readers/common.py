"""What every trace reader returns: the table plus the warnings about what it could not use."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.table import OpTable


@dataclass(slots=True)
class ReadResult:
    """A parsed trace: ``table`` of operators, ``warnings`` naming file and position of every
    part that was skipped, ``unused`` listing whole inputs that could not be used, and
    ``meta`` with what the source said about the job (world size, stages, ...)."""

    table: OpTable
    warnings: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)


# Bounds every reader enforces before a value reaches the int32/int64 columns of OpTable, so
# a hostile or corrupt value is one message naming it, never an OverflowError deep in numpy.
# Ranks: a million is beyond any job of the 100k-GPU class and keeps rank-indexed arrays small.
MAX_RANK = (1 << 20) - 1
MAX_I32 = (1 << 31) - 1
# Times in ns: epoch nanoseconds are ~2**60.6 today; +-2**61 (year 2043) leaves room for
# end = start + duration (duration <= 2**60) without leaving int64.
MAX_TIME_NS = 1 << 61
MAX_DURATION_NS = 1 << 60
MAX_COUNT = 1 << 62
# Per file, the warnings about skipped parts are capped (a file of a million bad lines must
# not become a million strings); the rest is one count.
MAX_WARNINGS = 20


def show(value: object, limit: int = 40) -> str:
    """A short, always-computable rendering of a hostile value for an error message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<integer of {value.bit_length()} bits>"
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[: limit - 12]!r}... ({len(value)} chars)"
    if isinstance(value, list | dict | tuple) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip(text: str, limit: int = 100) -> str:
    """``text`` cut to ``limit`` characters (an exception message quoting a hostile value)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_int(value: object, what: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]`` (an integral float counts), else ``ValueError``.

    Booleans and strings are wrong types, not numbers: a trace writer that emits them has a
    bug we should name, not guess around.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} {show(value)} is not an integer")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise ValueError(f"{what} {show(value)} is not an integer")
        value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{what} {show(value)} is outside [{lo}, {hi}]")
    return value


def as_float(value: object, what: str, bound: float) -> float:
    """``value`` as a finite float with ``|value| <= bound``, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} {show(value)} is not a number")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"{what} {show(value)} is out of range") from None
    if not math.isfinite(out):
        raise ValueError(f"{what} {show(value)} is not a finite number")
    if abs(out) > bound:
        raise ValueError(f"{what} {show(value)} is out of range (more than {bound:g})")
    return out


def as_ranks(value: object, what: str) -> tuple[int, ...]:
    """A list of ranks (each in ``[0, MAX_RANK]``), else ``ValueError``."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what} {show(value)} is not a list of ranks")
    if len(value) > MAX_RANK + 1:
        raise ValueError(f"{what}: {len(value)} members, more than {MAX_RANK + 1} ranks")
    return tuple(as_int(v, what, 0, MAX_RANK) for v in value)


def duplicate_columns(names: list[str], source: str) -> None:
    """Refuse a table that names a column twice (which of the two would be the data?)."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise TraceFormatError(f"{source}: column {n!r} appears more than once")
        seen.add(n)


class WarningLog:
    """Warnings of one file, the first ``MAX_WARNINGS`` verbatim and then only counted."""

    def __init__(self, out: list[str], source: str) -> None:
        self.out = out
        self.source = source
        self.dropped = 0
        self._start = len(out)

    def add(self, msg: str) -> None:
        if len(self.out) - self._start < MAX_WARNINGS:
            self.out.append(msg)
        else:
            self.dropped += 1

    def close(self) -> None:
        if self.dropped:
            self.out.append(f"{self.source}: {self.dropped} more warnings like these not shown")
            self.dropped = 0
