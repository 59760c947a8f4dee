"""A twin trace as the analysis' operator table (what a reader would build from its files).

The twin may not import the straggler capability (pure-core contract), so the conversion
lives with the tests that feed twin traces to the analysis directly.
"""

from __future__ import annotations

from fabricscope.straggler.table import OpTable, from_columns
from fabricscope.twin.tracegen import TwinTrace


def to_table(tr: TwinTrace) -> OpTable:
    """The operator table of ``tr``, column for column."""
    return from_columns(job=tr.job, rank=tr.rank, iteration=tr.iteration, op=tr.op,
                        group=tr.group, seq=tr.seq, start=tr.start, end=tr.end,
                        nbytes=tr.nbytes, stage=tr.stage, mb=tr.mb, op_names=tr.op_names,
                        groups=tr.groups)
