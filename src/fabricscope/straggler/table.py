"""Columnar operator timings (:class:`OpTable`): the one in-memory shape the analysis reads.

Readers produce it, the analysis consumes it. ``OpTiming`` records convert to and from it; the
columns exist because 8,192 ranks x 20 iterations is millions of operators, too many for
per-record Python objects on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from fabricscope.model.records import OpTiming

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

# Operator kinds. "other" ops (waits folded into host-side bookkeeping, e.g. Megatron's
# grad-norm clip) are kept for plots but ignored by the analysis: their duration mixes
# compute and waiting and would blame whoever waited.
COMPUTE: Final = 0
COLLECTIVE: Final = 1
P2P: Final = 2
OTHER: Final = 3
KIND_NAMES: Final = ("compute", "collective", "p2p", "other")

_OTHER_OPS = frozenset({"optimizer-clip-main-grad", "layernorm-grads-all-reduce"})
_COMPUTE_HINTS = ("compute", "forward", "backward", "optimizer", "gemm", "gc", "step")


def op_kind(op: str, group_size: int) -> int:
    """Classify an operator name: compute, collective, point-to-point or other.

    Rules (documented in docs/straggler.md): names in a small deny-list are ``other``; an op
    with a group of two or more ranks is ``p2p`` when its name says send/recv, else a
    ``collective``; an op without a group is ``compute`` when its name looks like compute
    (forward/backward/optimizer/...), else ``other``.
    """
    low = op.lower()
    if low in _OTHER_OPS:
        return OTHER
    if group_size >= 2:
        if "send" in low or "recv" in low:
            return P2P
        return COLLECTIVE
    if any(h in low for h in _COMPUTE_HINTS):
        return COMPUTE
    return OTHER


def p2p_key(op: str) -> str:
    """Name shared by both ends of a point-to-point transfer (``forward-send`` -> ``forward-p2p``)."""
    low = op.lower()
    for word in ("send", "recv"):
        if word in low:
            return low.replace(word, "p2p")
    return low


@dataclass(slots=True)
class OpTable:
    """Operator timings as parallel numpy columns (one row per operator on one rank).

    ``op``/``group`` are codes into ``op_names``/``groups``; ``stage`` is the pipeline stage
    (-1 unknown) and ``mb`` the micro-batch (-1 unknown), both optional hints the readers
    fill where the source has them. ``files`` maps a rank to the file it came from (errors
    and warnings name it).
    """

    job: str
    rank: I32
    iteration: I32
    op: I32
    kind: npt.NDArray[np.int8]
    group: I32
    seq: I64
    start: I64
    end: I64
    nbytes: I64
    stage: I32
    mb: I32
    op_names: list[str]
    groups: list[tuple[int, ...]]
    files: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.rank.shape[0])

    @property
    def ranks(self) -> I32:
        return np.unique(self.rank)

    def take(self, mask: npt.NDArray[np.bool_]) -> OpTable:
        """Rows where ``mask`` is true (names and groups are shared, not copied)."""
        return OpTable(
            self.job, self.rank[mask], self.iteration[mask], self.op[mask], self.kind[mask],
            self.group[mask], self.seq[mask], self.start[mask], self.end[mask],
            self.nbytes[mask], self.stage[mask], self.mb[mask], self.op_names, self.groups,
            dict(self.files),
        )

    def to_records(self) -> list[OpTiming]:
        """Back to ``OpTiming`` records (for small tables; the compact writer uses this)."""
        return [
            OpTiming(
                self.job, int(r), int(i), self.op_names[o], self.groups[g], int(s), int(a),
                int(b), int(n),
            )
            for r, i, o, g, s, a, b, n in zip(
                self.rank.tolist(), self.iteration.tolist(), self.op.tolist(),
                self.group.tolist(), self.seq.tolist(), self.start.tolist(), self.end.tolist(),
                self.nbytes.tolist(), strict=True,
            )
        ]


class TableBuilder:
    """Accumulates rows (interning op names and groups) and builds an :class:`OpTable`."""

    def __init__(self, job: str = "job") -> None:
        self.job = job
        self._op_code: dict[str, int] = {}
        self._group_code: dict[tuple[int, ...], int] = {}
        self.op_names: list[str] = []
        self.groups: list[tuple[int, ...]] = []
        self.cols: dict[str, list[int]] = {
            k: [] for k in ("rank", "iteration", "op", "kind", "group", "seq", "start", "end",
                            "nbytes", "stage", "mb")
        }
        self.files: dict[int, str] = {}

    def op_code(self, name: str) -> int:
        code = self._op_code.get(name)
        if code is None:
            code = self._op_code[name] = len(self.op_names)
            self.op_names.append(name)
        return code

    def group_code(self, group: tuple[int, ...]) -> int:
        code = self._group_code.get(group)
        if code is None:
            code = self._group_code[group] = len(self.groups)
            self.groups.append(group)
        return code

    def add(
        self, *, rank: int, iteration: int, op: str, group: tuple[int, ...], seq: int,
        start: int, end: int, nbytes: int = 0, stage: int = -1, mb: int = -1,
        kind: int | None = None,
    ) -> None:
        c = self.cols
        c["rank"].append(rank)
        c["iteration"].append(iteration)
        c["op"].append(self.op_code(op))
        c["kind"].append(op_kind(op, len(group)) if kind is None else kind)
        c["group"].append(self.group_code(group))
        c["seq"].append(seq)
        c["start"].append(start)
        c["end"].append(end)
        c["nbytes"].append(nbytes)
        c["stage"].append(stage)
        c["mb"].append(mb)

    def build(self) -> OpTable:
        c = self.cols
        return OpTable(
            self.job,
            np.asarray(c["rank"], dtype=np.int32), np.asarray(c["iteration"], dtype=np.int32),
            np.asarray(c["op"], dtype=np.int32), np.asarray(c["kind"], dtype=np.int8),
            np.asarray(c["group"], dtype=np.int32), np.asarray(c["seq"], dtype=np.int64),
            np.asarray(c["start"], dtype=np.int64), np.asarray(c["end"], dtype=np.int64),
            np.asarray(c["nbytes"], dtype=np.int64), np.asarray(c["stage"], dtype=np.int32),
            np.asarray(c["mb"], dtype=np.int32), self.op_names, self.groups, dict(self.files),
        )


def table_from_records(
    records: Iterable[OpTiming],
    *,
    stage: Mapping[int, int] | None = None,
    job: str | None = None,
) -> OpTable:
    """Build an :class:`OpTable` from ``OpTiming`` records (``stage``: optional rank -> stage)."""
    b = TableBuilder(job or "job")
    st = stage or {}
    first = True
    for r in records:
        if first and job is None:
            b.job = r.job
            first = False
        b.add(rank=r.rank, iteration=r.iteration, op=r.op, group=tuple(r.group), seq=r.seq,
              start=r.t_start_ns, end=r.t_end_ns, nbytes=r.bytes, stage=st.get(r.rank, -1))
    return b.build()


def concat(tables: Sequence[OpTable], job: str | None = None) -> OpTable:
    """Concatenate tables, re-coding op names and groups into one shared vocabulary."""
    if not tables:
        return TableBuilder(job or "job").build()
    names: dict[str, int] = {}
    groups: dict[tuple[int, ...], int] = {}
    parts_op: list[I32] = []
    parts_group: list[I32] = []
    for t in tables:
        op_map = np.array([names.setdefault(n, len(names)) for n in t.op_names] or [0],
                          dtype=np.int32)
        g_map = np.array([groups.setdefault(g, len(groups)) for g in t.groups] or [0],
                         dtype=np.int32)
        parts_op.append(op_map[t.op] if len(t) else t.op)
        parts_group.append(g_map[t.group] if len(t) else t.group)
    files: dict[int, str] = {}
    for t in tables:
        files.update(t.files)
    return OpTable(
        job or tables[0].job,
        np.concatenate([t.rank for t in tables]), np.concatenate([t.iteration for t in tables]),
        np.concatenate(parts_op), np.concatenate([t.kind for t in tables]),
        np.concatenate(parts_group), np.concatenate([t.seq for t in tables]),
        np.concatenate([t.start for t in tables]), np.concatenate([t.end for t in tables]),
        np.concatenate([t.nbytes for t in tables]), np.concatenate([t.stage for t in tables]),
        np.concatenate([t.mb for t in tables]), list(names), list(groups), files,
    )


def from_columns(
    *,
    job: str,
    rank: npt.ArrayLike,
    iteration: npt.ArrayLike,
    op: npt.ArrayLike,
    group: npt.ArrayLike,
    seq: npt.ArrayLike,
    start: npt.ArrayLike,
    end: npt.ArrayLike,
    nbytes: npt.ArrayLike,
    stage: npt.ArrayLike,
    mb: npt.ArrayLike,
    op_names: Sequence[str],
    groups: Sequence[tuple[int, ...]],
) -> OpTable:
    """Build an :class:`OpTable` from parallel columns (e.g. a twin trace), classifying ops."""
    gsize = np.array([len(g) for g in groups] or [0], dtype=np.int64)
    op_a = np.asarray(op, dtype=np.int32)
    group_a = np.asarray(group, dtype=np.int32)
    kinds_by = np.array([[op_kind(n, s) for s in range(3)] for n in op_names] or [[0, 0, 0]],
                        dtype=np.int8)
    kind = kinds_by[op_a, np.minimum(gsize[group_a], 2)] if op_a.size else np.zeros(0, np.int8)
    return OpTable(
        job, np.asarray(rank, dtype=np.int32), np.asarray(iteration, dtype=np.int32), op_a,
        kind.astype(np.int8), group_a, np.asarray(seq, dtype=np.int64),
        np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64),
        np.asarray(nbytes, dtype=np.int64), np.asarray(stage, dtype=np.int32),
        np.asarray(mb, dtype=np.int32), list(op_names), list(groups),
    )
