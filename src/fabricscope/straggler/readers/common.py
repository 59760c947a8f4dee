"""What every trace reader returns: the table plus the warnings about what it could not use."""

from __future__ import annotations

from dataclasses import dataclass, field

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
