"""Reader of nccl-tests text output (``all_reduce_perf`` and the other ``*_perf`` binaries).

Format, from NVIDIA/nccl-tests ``src/util.cu`` (2.19) and the outputs of older versions:

* header: ``# nThread 1 nGpus 8 minBytes 8 maxBytes ... step: 2(factor) warmup iters: 5 ...``,
  optionally preceded by ``# nccl-tests version ...`` and ``# Collective test starting: NAME``;
* the rank listing ``#  Rank  0 Group  0 Pid 123 on HOST device  0 [0000:04:00] NAME``
  (older: without ``Group``, without ``Pid``);
* the column header ``# size count type redop root time algbw busbw #wrong time ...``; older
  versions have no ``root`` column, ``error`` for ``#wrong``, and some tests print neither
  ``redop`` (all_gather) nor ``root``; ``-I 1`` adds ``i_min i_max i_p99 i_cv%`` after each
  placement; ``-T`` adds a timestamp;
* one line per size: preamble, then out-of-place and in-place groups (``N/A`` for ``#wrong``
  with ``-c 0``; values printed ``%.2f`` narrowing to ``%.1f``, ``%.0f``, ``%.1e`` to fit);
* the footer ``# Out of bounds values : 0 OK`` and ``# Avg bus bandwidth    : 68.4048`` (``%g``),
  the mean of busbw over every placement printed (``src/common.cu``: ``bw[0] += busBw;
  bw_count[0]++`` per BenchTime call, then ``bw[0] /= bw_count[0]``), whatever the data check.

Around it: NCCL_DEBUG lines (``host:pid:tid [d] NCCL INFO ...``), ``mpirun --tag-output``
prefixes (``[1,0]<stdout>:``), ``srun -l`` prefixes (``0: ``), failures (``Test NCCL failure
common.cu:777 '...'``) and, in pasted outputs, lines whose ``#`` was eaten by Markdown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from fabricscope.collective.model import COLLECTIVES, CollectiveRun, Placement, RankInfo, SizeRow
from fabricscope.model.errors import TraceFormatError

__all__ = ["collective_from_name", "parse_nccl_tests", "read_nccl_tests"]

_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<(?:stdout|stderr)>:|\s*\d+:\s)")
_NCCL_DEBUG = re.compile(r"\bNCCL (INFO|WARN|ERROR|TRACE|ABORT)\b")
_FAILURE = re.compile(
    r"(Test NCCL failure|NCCL failure|Test CUDA failure|CUDA failure|Test failure|"
    r"Test timeout|NCCL error|RCCL failure|HIP failure)", re.IGNORECASE)
_RANK = re.compile(
    r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?(?:Pid\s+(\d+)\s+)?on\s+(\S+)\s+device\s+(\d+)"
    r"(?:\s+\[([^\]]*)\])?\s*(.*)$")
_NTHREAD = re.compile(r"^#?\s*nThread\s+\d+")
_STARTING = re.compile(r"^#?\s*Collective test (starting|concluded):\s*(\S+)")
_VERSION = re.compile(r"^#?\s*nccl-tests version\s+(\S+)")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\S*)?$|^\d{1,2}:\d{2}:\d{2}(\.\d+)?$")
_NUM = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\*?$")
_INT = re.compile(r"^-?\d+$")
_PERF_NAME = re.compile(r"\b(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True)) + r")_perf")
_NA = {"n/a", "na", "-"}


def collective_from_name(text: str) -> str | None:
    """The canonical collective a name mentions (``all_reduce_perf``, ``nccl_allreduce.log``,
    ``AllReduce``, ``ReduceScatter``...), longest name first; None when none matches."""
    m = _PERF_NAME.search(text)
    if m:
        return m.group(1)
    squashed = re.sub(r"[^a-z]", "", text.lower())
    for name in sorted(COLLECTIVES, key=len, reverse=True):
        if name.replace("_", "") in squashed:
            return name
    return None


def _half_unit(tok: str) -> float:
    """Half of the last printed digit of a number as nccl-tests prints it."""
    t = tok.rstrip("*")
    mant, _, exp = t.lower().partition("e")
    decimals = len(mant.partition(".")[2])
    half = 0.5 * 10.0 ** (-decimals)
    return half * 10.0 ** int(exp) if exp else half


def _float(tok: str) -> float:
    if tok.lower() in _NA:
        return math.nan
    return float(tok.rstrip("*"))


class _Segment:
    """The lines of one run while it is being read."""

    def __init__(self) -> None:
        self.header: dict[str, str] = {}
        self.columns: list[str] = []
        self.ranks: list[RankInfo] = []
        self.rows: list[SizeRow] = []
        self.partial: list[int] = []
        self.avg: float | None = None
        self.oob: int | None = None
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.info = 0
        self.warn_lines: list[str] = []
        self.name: str | None = None
        self.concluded = False
        self.cut_line = False
        self.half_units: list[float] = []

    def has_results(self) -> bool:
        return bool(self.rows or self.partial or self.avg is not None)


def _parse_header(line: str) -> dict[str, str]:
    """``nThread 1 nGpus 8 minBytes 8 ... step: 2(factor) warmup iters: 5`` -> key -> value."""
    out: dict[str, str] = {}
    key: list[str] = []
    for tok in line.lstrip("#").split():
        if re.match(r"^[-+]?\d", tok):
            if key:
                out.setdefault("_".join(key), tok)
            key = []
        else:
            key.append(tok.rstrip(":"))
    return out


def _columns(line: str) -> list[str] | None:
    """The column names of a ``# size count type ...`` line (None when it is not one)."""
    toks = line.lstrip("#").split()
    if len(toks) >= 5 and toks[0] in {"size", "bytes"} and toks[1] in {"count", "N"}:
        return [t.lower() for t in toks]
    return None


def _group(toks: Sequence[str], width: int) -> Placement:
    time_us, algbw, busbw = _float(toks[0]), _float(toks[1]), _float(toks[2])
    wrong_tok = toks[3] if len(toks) > 3 else "N/A"
    wrong = None if wrong_tok.lower() in _NA else float(wrong_tok.rstrip("*"))
    kind = "count" if _INT.match(wrong_tok.rstrip("*")) or wrong is None else "error"
    stats: dict[str, float] = {}
    if width == 8:
        for key, tok in zip(("i_min_us", "i_max_us", "i_p99_us", "i_cv_pct"), toks[4:8], strict=False):
            stats[key] = _float(tok)
    if not all(math.isfinite(v) for v in (time_us, algbw, busbw)):
        raise ValueError("N/A, nan or inf in time / algbw / busbw")
    return Placement(time_us=time_us, algbw_gbs=algbw, busbw_gbs=busbw, wrong=wrong,
                     wrong_kind=kind, over_threshold=wrong_tok.endswith("*"),
                     busbw_half_unit=_half_unit(toks[2]), iter_stats=stats)


def _data_row(toks: list[str], seg: _Segment, lineno: int, where: str) -> bool:
    """Parse a table line into ``seg``; False when the line is not a table line."""
    if len(toks) < 3 or not (_INT.match(toks[0]) and _INT.match(toks[1])):
        return False
    if _NUM.match(toks[2]) or not re.match(r"^[A-Za-z_][\w.]*$", toks[2]):
        return False
    toks = [t for t in toks if not _DATE.match(t)]
    size, count = int(toks[0]), int(toks[1])
    cols = seg.columns
    i = 2
    dtype = toks[i]
    i += 1
    redop = "none"
    if cols:
        has_redop = "redop" in cols or "op" in cols
        has_root = "root" in cols
    else:
        has_redop = i < len(toks) and not _NUM.match(toks[i])
        has_root = False
    if has_redop and i < len(toks) and not _NUM.match(toks[i]):
        redop = toks[i]
        i += 1
    width = 8 if "i_min" in cols else 4
    rest = toks[i:]
    if not cols:
        has_root = len(rest) in (2 * width + 1, width + 1) and bool(rest) and _INT.match(rest[0]) is not None
    root: int | None = None
    if has_root and rest and _INT.match(rest[0]):
        root = int(rest[0])
        rest = rest[1:]
    n_full = len(rest) // width
    if n_full == 0 or len(rest) not in (width, 2 * width):
        if len(rest) > 2 * width:
            seg.warnings.append(f"{where}: line {lineno}: {len(rest)} values after the size "
                                f"columns, expected {2 * width}; line skipped")
        else:
            seg.partial.append(size)
            seg.cut_line = True
        return True
    try:
        groups = [_group(rest[k * width:(k + 1) * width], width) for k in range(n_full)]
    except ValueError as exc:
        seg.warnings.append(f"{where}: line {lineno}: bad value ({exc}); line skipped")
        return True
    oop = groups[0]
    ip = groups[1] if len(groups) > 1 else None
    if ip is None:
        # Only one group: nccl-tests prints out-of-place first, so a run killed mid-line
        # leaves it; trace replay (in-place only) is not told apart here.
        seg.cut_line = True
    seg.rows.append(SizeRow(size_bytes=size, count=count, dtype=dtype, redop=redop, root=root,
                            out_of_place=oop, in_place=ip, line=lineno))
    return True


def _continuation(toks: list[str], seg: _Segment) -> None:
    """The in-place half of the last row, on its own line: an NCCL INFO / WARN line printed
    between the two halves (nccl-tests prints out-of-place, then in-place, with no newline)."""
    width = 8 if "i_min" in seg.columns else 4
    if not (seg.rows and seg.cut_line and seg.rows[-1].in_place is None and len(toks) == width):
        return
    if not all(_NUM.match(t) or t.lower() in _NA for t in toks):
        return
    try:
        ip = _group(toks, width)
    except ValueError:
        return
    last = seg.rows[-1]
    seg.rows[-1] = SizeRow(size_bytes=last.size_bytes, count=last.count, dtype=last.dtype,
                           redop=last.redop, root=last.root, out_of_place=last.out_of_place,
                           in_place=ip, line=last.line)
    seg.cut_line = bool(seg.partial)


def _finish(seg: _Segment, source: str, collective_hint: str | None) -> CollectiveRun:
    collective = seg.name or collective_hint or "unknown"
    busbw = [p.busbw_gbs for r in seg.rows for _, p in r.placements()]
    halves = [p.busbw_half_unit for r in seg.rows for _, p in r.placements()]
    recomputed = sum(busbw) / len(busbw) if busbw else None
    tol = 0.0
    if recomputed is not None:
        # the mean of the printed values is off by at most the mean half-unit; the footer's
        # %g keeps 6 significant digits
        tol = sum(halves) / len(halves) + 5e-6 * abs(seg.avg or recomputed) + 1e-12
    warnings = list(seg.warnings)
    if seg.avg is not None and recomputed is not None and abs(seg.avg - recomputed) > tol:
        warnings.append(f"{source}: Avg bus bandwidth {seg.avg:g} != mean of the "
                        f"{len(busbw)} printed busbw {recomputed:.6g} (tolerance {tol:.3g}): "
                        "the table is incomplete or was edited")
    if collective == "unknown":
        warnings.append(f"{source}: collective not named (no '*_perf' name in the file or its "
                        "name); pass it explicitly")
    ranks: int | None = None
    hosts: list[str] = []
    for r in seg.ranks:
        if r.host not in hosts:
            hosts.append(r.host)
    if seg.ranks:
        ranks = max(len({r.rank for r in seg.ranks}), max(r.rank for r in seg.ranks) + 1)
    elif "nThread" in seg.header and "nGpus" in seg.header:
        try:
            ranks = int(seg.header["nThread"]) * int(seg.header["nGpus"])
        except ValueError:
            ranks = None
    truncated = seg.cut_line or (seg.avg is None and bool(seg.rows or seg.partial)) or (
        seg.avg is None and bool(seg.errors))
    return CollectiveRun(
        source=source, collective=collective, ranks=ranks, rows=tuple(seg.rows),
        rank_list=tuple(seg.ranks), hosts=tuple(hosts), header=dict(seg.header),
        partial_sizes=tuple(seg.partial), avg_busbw_file=seg.avg,
        avg_busbw_recomputed=recomputed, avg_tolerance=tol, out_of_bounds=seg.oob,
        truncated=truncated, errors=tuple(seg.errors), warnings=tuple(warnings),
        nccl_info_lines=seg.info, nccl_warn_lines=tuple(seg.warn_lines[:50]))


def parse_nccl_tests(text: str, *, source: str = "<text>",
                     collective: str | None = None) -> list[CollectiveRun]:
    """Every run in one nccl-tests output (a file may hold several, e.g. ``-d all`` logs
    concatenated); ``collective`` names the test when the text does not.

    Never raises on odd lines: they become warnings naming ``source`` and the line. Raises
    :class:`TraceFormatError` when the text holds nothing of nccl-tests at all.
    """
    hint = collective or collective_from_name(Path(source).name)
    text_name = collective_from_name(text[:20000]) if collective is None else None
    segs: list[_Segment] = [_Segment()]
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _PREFIX.sub("", raw, count=1).rstrip()
        # "[1,0]<stdout>:" may wrap an "srun -l" prefix or the reverse
        line = _PREFIX.sub("", line, count=1).rstrip()
        seg = segs[-1]
        if not line.strip():
            continue
        dbg = _NCCL_DEBUG.search(line)
        if dbg:
            if dbg.group(1) == "INFO" or dbg.group(1) == "TRACE":
                seg.info += 1
            else:
                seg.warn_lines.append(line.strip())
            continue
        stripped = line.strip()
        if _FAILURE.search(stripped) and not stripped.startswith("#"):
            seg.errors.append(f"line {lineno}: {stripped}")
            continue
        if _NTHREAD.match(stripped) or _VERSION.match(stripped) or (
                (m0 := _STARTING.match(stripped)) and m0.group(1) == "starting"):
            if seg.has_results():
                segs.append(_Segment())
                seg = segs[-1]
            if _NTHREAD.match(stripped):
                seg.header.update(_parse_header(stripped))
            elif (m1 := _STARTING.match(stripped)):
                seg.name = collective_from_name(m1.group(2))
            continue
        if (m := _STARTING.match(stripped)):
            seg.concluded = True
            seg.name = seg.name or collective_from_name(m.group(2))
            continue
        if (m := _RANK.match(stripped)):
            seg.ranks.append(RankInfo(
                rank=int(m.group(1)), group=int(m.group(2)) if m.group(2) else None,
                pid=int(m.group(3)) if m.group(3) else None, host=m.group(4),
                device=int(m.group(5)), bus_id=m.group(6) or "", gpu=m.group(7).strip()))
            continue
        if (m := _AVG.match(stripped)):
            try:
                avg = float(m.group(1))
                if not math.isfinite(avg):
                    raise ValueError(m.group(1))
                seg.avg = avg
            except ValueError:
                seg.warnings.append(f"{source}: line {lineno}: Avg bus bandwidth {m.group(1)!r} "
                                    "is not a number")
            continue
        if (m := _OOB.match(stripped)):
            seg.oob = int(m.group(1))
            continue
        if (cols := _columns(stripped)) is not None:
            seg.columns = cols
            continue
        if stripped.startswith("#"):
            continue
        toks = stripped.split()
        if not _data_row(toks, seg, lineno, source):
            _continuation(toks, seg)
    multi = sum(1 for s in segs if s.has_results() or s.errors) > 1
    runs: list[CollectiveRun] = []
    k = 0
    for seg in segs:
        if not (seg.has_results() or seg.errors or seg.ranks or seg.header):
            continue
        k += 1
        name = f"{source}#{k}" if multi else source
        runs.append(_finish(seg, name, hint or text_name))
    if not runs:
        raise TraceFormatError(f"{source}: no nccl-tests output (no size table, no 'Avg bus "
                               "bandwidth' line, no header and no failure line)")
    return runs


def read_nccl_tests(path: str | Path, *, collective: str | None = None) -> list[CollectiveRun]:
    """Read one nccl-tests output file; see :func:`parse_nccl_tests`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read ({exc.strerror})") from None
    return parse_nccl_tests(text, source=str(p), collective=collective)
