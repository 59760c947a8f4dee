"""Reader for PyTorch profiler (Kineto) Chrome-trace JSON, one file per rank, NCCL or gloo flavour.

NCCL flavour: collective kernels (``cat: kernel``) carry args ``Collective name``,
``In msg nelems``/``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Ranks``,
``Process Group Name`` (as in HolisticTraceAnalysis' sample). gloo flavour: CPU events named
``gloo:<op>``; their group comes from ``record_param_comms`` args when present, else from an
enclosing ``pg:<r0>,<r1>,...`` annotation (``record_function``; our gloo script writes it),
else from ``distributedInfo.pg_config`` / ``world_size``. Iterations are ``ProfilerStep#N`` windows.
Compute is the user annotations (``forward``, ``backward``, ...) or, without any, one
``gpu-compute`` op per iteration holding the summed busy time of non-communication kernels.

A truncated file is salvaged event by event: what parsed before the cut is used and a
warning names the byte offset; a bad event is skipped with its index.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.readers.common import (
    MAX_COUNT,
    MAX_DURATION_NS,
    MAX_I32,
    MAX_RANK,
    MAX_TIME_NS,
    ReadResult,
    WarningLog,
    as_float,
    as_int,
    as_ranks,
    clip,
    show,
)
from fabricscope.straggler.table import COMPUTE, TableBuilder

_DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8,
                "float64": 8, "int": 4, "int32": 4, "long": 8, "int64": 8, "byte": 1, "char": 1,
                "int8": 1, "uint8": 1, "bool": 1}
_STEP = re.compile(r"ProfilerStep#(\d+)")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_COMM_PREFIXES = ("nccl:", "gloo:", "record_param_comms", "c10d::", "ncclkernel", "nccldevkernel")
_NORMALIZE = {"all_reduce": "allreduce", "allreduce_coalesced": "allreduce",
              "all_gather": "allgather", "_allgather_base": "allgather",
              "all_gather_into_tensor": "allgather", "reduce_scatter": "reducescatter",
              "_reduce_scatter_base": "reducescatter", "reduce_scatter_tensor": "reducescatter",
              "all_to_all": "alltoall", "alltoall_base": "alltoall", "all_to_allv": "alltoall"}


def _norm_op(name: str) -> str:
    low = name.lower()
    return _NORMALIZE.get(low, low)


def _ranks(value: Any, what: str = "Process Group Ranks") -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except (ValueError, RecursionError):
            raise ValueError(f"{what} {show(value)} is not a JSON list of ranks") from None
    return as_ranks(value, what)


def _salvage(text: str, source: str, warnings: list[str]) -> dict[str, Any]:
    """Recover the events of a truncated/corrupt trace one object at a time."""
    start = text.find('"traceEvents"')
    if start < 0:
        raise TraceFormatError(f"{source}: not a Chrome trace (no traceEvents)")
    bracket = text.find("[", start)
    if bracket < 0:
        raise TraceFormatError(f"{source}: traceEvents at byte {start} is not followed by a list")
    pos = bracket + 1
    dec = json.JSONDecoder()
    events: list[Any] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            obj, pos = dec.raw_decode(text, pos)
        except (ValueError, RecursionError):  # JSONDecodeError, too-long ints, deep nesting
            warnings.append(f"{source}: trace cut or corrupt at byte {pos}; kept the "
                            f"{len(events)} events before it")
            break
        events.append(obj)
    head: dict[str, Any] = {"traceEvents": events}
    rest = text[:start] + text[pos:]
    # The clock base sits outside traceEvents (before it in our writer, after it in
    # PyTorch's): keep it when it survived, else the rank looks clock-shifted.
    b = re.search(r'"baseTimeNanoseconds"\s*:\s*(\d{1,20})', rest)
    if b:
        head["baseTimeNanoseconds"] = int(b.group(1))
    m = re.search(r'"distributedInfo"\s*:\s*(\{.*?\})\s*,\s*"', rest,
                  re.DOTALL)
    if m:
        with contextlib.suppress(ValueError, RecursionError):
            head["distributedInfo"] = json.loads(m.group(1))
    return head


def load_chrome_trace(data: bytes, *, source: str, warnings: list[str]) -> dict[str, Any]:
    """Decode (gunzip if needed) and parse a Chrome trace, salvaging a truncated one.

    Raises only :class:`TraceFormatError` (naming ``source`` and the position) on bad input.
    """
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            # A cut gzip stream: take what inflates.
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                data = d.decompress(data)
            except zlib.error as exc:
                raise TraceFormatError(f"{source}: corrupt gzip ({exc})") from exc
            warnings.append(f"{source}: gzip stream truncated; {len(data)} bytes recovered")
    text = data.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        warnings.append(f"{source}: JSON error at line {exc.lineno} column {exc.colno} "
                        f"({exc.msg}); salvaging events")
        return _salvage(text, source, warnings)
    except (ValueError, RecursionError) as exc:  # an int of > 4300 digits; nesting too deep
        warnings.append(f"{source}: JSON not decodable ({clip(str(exc), 60)}); salvaging events")
        return _salvage(text, source, warnings)
    if isinstance(obj, list):
        return {"traceEvents": obj}
    if not isinstance(obj, dict) or "traceEvents" not in obj:
        raise TraceFormatError(f"{source}: not a Chrome trace (no traceEvents)")
    return obj


def _rank_of(info: dict[str, Any], source: str) -> int:
    if "rank" in info:
        return as_int(info["rank"], "distributedInfo.rank", 0, MAX_RANK)
    m = _RANK_IN_NAME.search(Path(source).name)
    if m:
        return as_int(int(m.group(1)), "rank in the file name", 0, MAX_RANK)
    raise TraceFormatError(f"{source}: cannot tell the rank (no distributedInfo.rank and no "
                           f"'rank<N>' in the file name)")


class _Head:
    """What a Kineto trace says about its rank and clock, validated."""

    def __init__(self, obj: dict[str, Any], source: str, warns: WarningLog) -> None:
        info = obj.get("distributedInfo")
        if info is None:
            info = {}
        if not isinstance(info, dict):
            raise ValueError(f"distributedInfo {show(info)} is not an object")
        self.rank = _rank_of(info, source)
        self.world = as_int(info.get("world_size") or 0, "distributedInfo.world_size", 0,
                            MAX_RANK + 1)
        stage = info.get("pp_rank", info.get("stage", -1))
        self.stage = as_int(-1 if stage is None else stage, "distributedInfo.pp_rank", -1,
                            MAX_RANK)
        backend = info.get("backend", "")
        self.backend = backend if isinstance(backend, str) else ""
        self.pgs: dict[str, tuple[int, ...]] = {}
        cfg = info.get("pg_config") or []
        if not isinstance(cfg, list):
            warns.add(f"{source}: distributedInfo.pg_config {show(cfg)} is not a list; ignored")
            cfg = []
        for pg in cfg:
            try:
                name = pg["pg_name"]
                if not isinstance(name, str | int) or isinstance(name, bool):
                    raise ValueError(f"pg_name {show(name)} is not a name")
                self.pgs[str(name)] = _ranks(pg["ranks"], "pg_config ranks")
            except (KeyError, TypeError, ValueError):
                warns.add(f"{source}: distributedInfo.pg_config entry unreadable: {show(pg)}")
        self.default_group = self.pgs.get("0") or tuple(range(self.world))
        self.base = as_int(obj.get("baseTimeNanoseconds") or 0, "baseTimeNanoseconds", 0,
                           MAX_TIME_NS)
        events = obj.get("traceEvents")
        if not isinstance(events, list):
            raise ValueError(f"traceEvents {show(events)} is not a list")
        self.events: list[Any] = events


def _span(ev: dict[str, Any], base: int) -> tuple[int, int]:
    """Start and end (ns) of an ``X`` event; ``ValueError`` when its times are not times."""
    if "ts" not in ev:
        raise ValueError("no ts")
    ts = as_float(ev["ts"], "ts", MAX_TIME_NS / 1000)
    dur = as_float(ev.get("dur", 0), "dur", MAX_DURATION_NS / 1000)
    if dur < 0:
        raise ValueError(f"dur {show(ev.get('dur'))} is negative")
    t0 = base + round(ts * 1000)
    if abs(t0) > MAX_TIME_NS:
        raise ValueError(f"ts {show(ev['ts'])} plus baseTimeNanoseconds is out of range")
    return t0, t0 + round(dur * 1000)


def parse_kineto(
    obj: dict[str, Any], *, source: str = "<trace>", warnings: list[str] | None = None
) -> ReadResult:
    """Parse one rank's Kineto trace object into operator timings.

    A wrong-typed or out-of-range header field, or an event whose time is not a finite
    number, is one :class:`TraceFormatError` for the whole file: dropping one event from the
    middle would shift the k-th-instance matching of this rank's collectives against its
    peers'. Other unreadable events are skipped, each named by index in the warnings.
    """
    warns = [] if warnings is None else warnings
    log = WarningLog(warns, source)
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{source}: not a Chrome trace (top level is {type(obj).__name__})")
    try:
        head = _Head(obj, source, log)
    except ValueError as exc:
        raise TraceFormatError(f"{source}: {exc}") from None
    rank, world, stage, pgs = head.rank, head.world, head.stage, head.pgs
    default_group, base, events = head.default_group, head.base, head.events

    steps: list[tuple[int, int, int]] = []
    kernels: list[tuple[int, int, dict[str, Any], str]] = []
    gloo: list[tuple[int, int, str]] = []
    params: list[tuple[int, int, dict[str, Any]]] = []
    annotations: list[tuple[int, int, str]] = []
    busy: list[tuple[int, int]] = []
    groups_ann: list[tuple[int, int, tuple[int, ...]]] = []
    for idx, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            t0, t1 = _span(ev, base)
        except ValueError as exc:
            raise TraceFormatError(f"{source}: event {idx}: {exc}; a rank with a corrupt "
                                   f"time is not used") from None
        try:
            name, cat = ev.get("name", ""), ev.get("cat", "")
            if not isinstance(name, str) or not isinstance(cat, str):
                raise TypeError(f"name/cat {show(name)}/{show(cat)} not strings")
            args = ev.get("args") or {}
            if not isinstance(args, dict):
                raise TypeError(f"args {show(args)} is not an object")
            low = name.lower()
            m = _STEP.match(name)
            if m and cat in ("user_annotation", "cpu_op", ""):
                steps.append((t0, t1, as_int(int(m.group(1)), "step", 0, MAX_I32)))
            elif cat == "kernel" and "Collective name" in args:
                kernels.append((t0, t1, args, name))
            elif cat == "kernel" and low.startswith(("nccl", "nccldev")):
                kernels.append((t0, t1, {"Collective name": low.split("_")[1] if "_" in low
                                         else "unknown"}, name))
            elif low.startswith("gloo:"):
                gloo.append((t0, t1, _norm_op(name[5:])))
            elif name == "record_param_comms":
                params.append((t0, t1, args))
            elif low.startswith("pg:"):
                groups_ann.append((t0, t1, _ranks("[" + name[3:] + "]", "pg: annotation")))
            elif cat == "user_annotation" and not low.startswith(_COMM_PREFIXES):
                annotations.append((t0, t1, name))
            elif cat == "kernel":
                busy.append((t0, t1))
        except (KeyError, TypeError, ValueError) as exc:
            log.add(f"{source}: event {idx}: skipped ({clip(str(exc), 80)})")
    steps.sort()

    def iteration_of(t: int) -> int:
        for a, bnd, n in steps:
            if a <= t < bnd:
                return n
        return -1

    b = TableBuilder(Path(source).stem)
    b.files[rank] = source
    seqs: dict[tuple[int, tuple[int, ...], str], int] = defaultdict(int)
    outside = 0

    def add_comm(t0: int, t1: int, op: str, group: tuple[int, ...], nbytes: int) -> None:
        nonlocal outside
        it = iteration_of(t0) if steps else 0
        if it < 0:
            outside += 1
            return
        key = (it, group, op)
        seq = seqs[key]
        seqs[key] = seq + 1
        b.add(rank=rank, iteration=it, op=op, group=group, seq=seq, start=t0, end=t1,
              nbytes=nbytes, stage=stage)

    def comm_fields(args: dict[str, Any]) -> tuple[tuple[int, ...], int]:
        group = default_group
        pg_name = args.get("Process Group Name", "")
        if "Process Group Ranks" in args:
            group = _ranks(args["Process Group Ranks"])
        elif isinstance(pg_name, str | int) and str(pg_name) in pgs:
            group = pgs[str(pg_name)]
        for peer_key, sender in (("Dst Rank", True), ("Src Rank", False), ("Peer rank", None)):
            if peer_key in args:
                peer = as_int(args[peer_key], peer_key, -1, MAX_RANK)
                if peer >= 0:
                    group = (rank, peer) if sender in (True, None) else (peer, rank)
        nel = max(as_int(args.get("In msg nelems") or 0, "In msg nelems", 0, MAX_COUNT >> 4),
                  as_int(args.get("Out msg nelems") or 0, "Out msg nelems", 0, MAX_COUNT >> 4))
        dtype = args.get("dtype", "float")
        width = _DTYPE_BYTES.get(dtype.lower(), 4) if isinstance(dtype, str) else 4
        return group, nel * width

    if kernels:
        for t0, t1, args, kname in kernels:
            try:
                group, nbytes = comm_fields(args)
                op = args["Collective name"]
                if not isinstance(op, str):
                    raise TypeError(f"Collective name {show(op)} is not a string")
            except (TypeError, ValueError) as exc:
                log.add(f"{source}: kernel {kname[:40]!r} at ts {t0}: bad args "
                        f"({clip(str(exc), 80)})")
                continue
            add_comm(t0, t1, _norm_op(op), group, nbytes)
    elif gloo:
        params.sort(key=lambda p: p[0])
        for t0, t1, op in gloo:
            group, nbytes = default_group, 0
            # A "pg:<ranks>" annotation around the call names its group (gloo events don't).
            for a0, a1, members in groups_ann:
                if a0 <= t0 <= a1:
                    group = members
            # The record_param_comms that encloses (or immediately precedes) this gloo op.
            for p0, p1, pargs in params:
                if p0 <= t0 <= max(p1, t0):
                    with contextlib.suppress(TypeError, ValueError):
                        group, nbytes = comm_fields(pargs)
                if p0 > t0:
                    break
            add_comm(t0, t1, op, group, nbytes)
    if annotations:
        counts: dict[tuple[int, str], int] = defaultdict(int)
        for t0, t1, name in sorted(annotations):
            it = iteration_of(t0) if steps else 0
            if it < 0:
                continue
            seq = counts[(it, name)]
            counts[(it, name)] = seq + 1
            b.add(rank=rank, iteration=it, op=name, group=(), seq=seq, start=t0, end=t1,
                  stage=stage, kind=COMPUTE)
    elif busy and steps:
        per: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for t0, t1 in busy:
            it = iteration_of(t0)
            if it >= 0:
                per[it].append((t0, t1))
        for it, spans in per.items():
            total = sum(t1 - t0 for t0, t1 in spans)
            first = min(t0 for t0, _ in spans)
            if total > MAX_DURATION_NS:
                raise TraceFormatError(f"{source}: iteration {it}: kernels busy for {total} ns "
                                       f"in all, not a plausible duration")
            b.add(rank=rank, iteration=it, op="gpu-compute", group=(), seq=0, start=first,
                  end=first + total, stage=stage, kind=COMPUTE)
    log.close()
    if outside:
        warns.append(f"{source}: {outside} communication event(s) outside any ProfilerStep "
                     f"window; not used")
    if not kernels and not gloo:
        warns.append(f"{source}: no NCCL collective kernels or gloo events found")
    meta: dict[str, object] = {"rank": rank, "world_size": world,
                               "backend": head.backend}
    return ReadResult(b.build(), warns, [], meta)


def read_kineto(path: str | Path) -> ReadResult:
    """Read one rank's Kineto trace file (``.json`` or ``.json.gz``)."""
    p = Path(path)
    warnings: list[str] = []
    obj = load_chrome_trace(p.read_bytes(), source=str(p), warnings=warnings)
    return parse_kineto(obj, source=str(p), warnings=warnings)
