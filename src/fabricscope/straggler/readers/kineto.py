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
from fabricscope.straggler.readers.common import ReadResult
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


def _ranks(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return tuple(int(v) for v in value)


def _salvage(text: str, source: str, warnings: list[str]) -> dict[str, Any]:
    """Recover the events of a truncated/corrupt trace one object at a time."""
    start = text.find('"traceEvents"')
    if start < 0:
        raise TraceFormatError(f"{source}: not a Chrome trace (no traceEvents)")
    pos = text.find("[", start) + 1
    dec = json.JSONDecoder()
    events: list[Any] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            warnings.append(f"{source}: trace cut or corrupt at byte {pos}; kept the "
                            f"{len(events)} events before it")
            break
        events.append(obj)
    head: dict[str, Any] = {"traceEvents": events}
    rest = text[:start] + text[pos:]
    # The clock base sits outside traceEvents (before it in our writer, after it in
    # PyTorch's): keep it when it survived, else the rank looks clock-shifted.
    b = re.search(r'"baseTimeNanoseconds"\s*:\s*(\d+)', rest)
    if b:
        head["baseTimeNanoseconds"] = int(b.group(1))
    m = re.search(r'"distributedInfo"\s*:\s*(\{.*?\})\s*,\s*"', rest,
                  re.DOTALL)
    if m:
        with contextlib.suppress(json.JSONDecodeError):
            head["distributedInfo"] = json.loads(m.group(1))
    return head


def load_chrome_trace(data: bytes, *, source: str, warnings: list[str]) -> dict[str, Any]:
    """Decode (gunzip if needed) and parse a Chrome trace, salvaging a truncated one."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
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
    if isinstance(obj, list):
        return {"traceEvents": obj}
    if not isinstance(obj, dict) or "traceEvents" not in obj:
        raise TraceFormatError(f"{source}: not a Chrome trace (no traceEvents)")
    return obj


def _rank_of(obj: dict[str, Any], source: str) -> int:
    info = obj.get("distributedInfo") or {}
    if "rank" in info:
        return int(info["rank"])
    m = _RANK_IN_NAME.search(Path(source).name)
    if m:
        return int(m.group(1))
    raise TraceFormatError(f"{source}: cannot tell the rank (no distributedInfo.rank and no "
                           f"'rank<N>' in the file name)")


def parse_kineto(
    obj: dict[str, Any], *, source: str = "<trace>", warnings: list[str] | None = None
) -> ReadResult:
    """Parse one rank's Kineto trace object into operator timings."""
    warns = [] if warnings is None else warnings
    rank = _rank_of(obj, source)
    info = obj.get("distributedInfo") or {}
    world = int(info.get("world_size", 0) or 0)
    stage = int(info.get("pp_rank", info.get("stage", -1)))
    pgs: dict[str, tuple[int, ...]] = {}
    for pg in info.get("pg_config") or []:
        try:
            pgs[str(pg["pg_name"])] = _ranks(pg["ranks"])
        except (KeyError, TypeError, ValueError):
            warns.append(f"{source}: distributedInfo.pg_config entry unreadable: {pg!r}")
    default_group = pgs.get("0") or tuple(range(world))
    base = int(obj.get("baseTimeNanoseconds", 0) or 0)
    events = obj.get("traceEvents") or []

    steps: list[tuple[int, int, int]] = []
    kernels: list[tuple[int, int, dict[str, Any], str]] = []
    gloo: list[tuple[int, int, str]] = []
    params: list[tuple[int, int, dict[str, Any]]] = []
    annotations: list[tuple[int, int, str]] = []
    busy: list[tuple[int, int]] = []
    groups_ann: list[tuple[int, int, tuple[int, ...]]] = []
    for idx, ev in enumerate(events):
        try:
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            name = str(ev.get("name", ""))
            cat = str(ev.get("cat", ""))
            t0 = base + round(float(ev["ts"]) * 1000)
            t1 = t0 + round(float(ev.get("dur", 0)) * 1000)
            args = ev.get("args") or {}
            low = name.lower()
            m = _STEP.match(name)
            if m and cat in ("user_annotation", "cpu_op", ""):
                steps.append((t0, t1, int(m.group(1))))
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
                groups_ann.append((t0, t1, _ranks("[" + name[3:] + "]")))
            elif cat == "user_annotation" and not low.startswith(_COMM_PREFIXES):
                annotations.append((t0, t1, name))
            elif cat == "kernel":
                busy.append((t0, t1))
        except (KeyError, TypeError, ValueError) as exc:
            warns.append(f"{source}: event {idx}: skipped ({exc!r})")
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
        if "Process Group Ranks" in args:
            group = _ranks(args["Process Group Ranks"])
        elif str(args.get("Process Group Name", "")) in pgs:
            group = pgs[str(args["Process Group Name"])]
        for peer_key, sender in (("Dst Rank", True), ("Src Rank", False), ("Peer rank", None)):
            if peer_key in args and int(args[peer_key]) >= 0:
                peer = int(args[peer_key])
                group = (rank, peer) if sender in (True, None) else (peer, rank)
        nel = max(int(args.get("In msg nelems", 0) or 0), int(args.get("Out msg nelems", 0) or 0))
        width = _DTYPE_BYTES.get(str(args.get("dtype", "float")).lower(), 4)
        return group, nel * width

    if kernels:
        for t0, t1, args, kname in kernels:
            try:
                group, nbytes = comm_fields(args)
            except (TypeError, ValueError, json.JSONDecodeError) as exc:
                warns.append(f"{source}: kernel {kname[:40]!r} at ts {t0}: bad args ({exc})")
                continue
            add_comm(t0, t1, _norm_op(str(args["Collective name"])), group, nbytes)
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
                    with contextlib.suppress(TypeError, ValueError, json.JSONDecodeError):
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
            b.add(rank=rank, iteration=it, op="gpu-compute", group=(), seq=0, start=first,
                  end=first + total, stage=stage, kind=COMPUTE)
    if outside:
        warns.append(f"{source}: {outside} communication event(s) outside any ProfilerStep "
                     f"window; not used")
    if not kernels and not gloo:
        warns.append(f"{source}: no NCCL collective kernels or gloo events found")
    meta: dict[str, object] = {"rank": rank, "world_size": world,
                               "backend": str(info.get("backend", ""))}
    return ReadResult(b.build(), warns, [], meta)


def read_kineto(path: str | Path) -> ReadResult:
    """Read one rank's Kineto trace file (``.json`` or ``.json.gz``)."""
    p = Path(path)
    warnings: list[str] = []
    obj = load_chrome_trace(p.read_bytes(), source=str(p), warnings=warnings)
    return parse_kineto(obj, source=str(p), warnings=warnings)
