"""Fuzz every trace reader: records or ONE TraceFormatError naming the file, nothing else.

Each target runs ``fuzz_settings()`` (10,000 examples, fixed seed) on the pure
parse-from-bytes functions. Two kinds of input per format:

- structured: a valid document, then 0-4 of its fields replaced by a hostile value
  (Infinity, NaN, 1e400, 2**64, a 5,000-digit integer, negative numbers, wrong types,
  nulls, deep nesting, huge strings) or deleted;
- mutated bytes: a valid file with bytes flipped, inserted, deleted, duplicated or cut.

A result must be a table whose every operator ends at or after it starts (the readers
validate ranges, so nothing can overflow the int32/int64 columns); an error must be a
:class:`TraceFormatError` whose message starts with the source name.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import random
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.readers import (
    ReadResult,
    load_chrome_trace,
    parse_bytedance,
    parse_compact_parquet,
    parse_kineto,
)
from fabricscope.straggler.readers.compact import parse_compact_bytes
from fuzzing import fuzz_settings

# 10,000 examples x 6 targets: each target takes tens of seconds on a loaded machine.
pytestmark = pytest.mark.slow


class Raw:
    """JSON text inserted verbatim (what ``json.dumps`` cannot write: 1e400, deep nesting)."""

    def __init__(self, text: str) -> None:
        self.text = text


DELETE = object()  # a mutation that removes the field

RAW = [Raw("Infinity"), Raw("-Infinity"), Raw("NaN"), Raw("1e400"), Raw("-1e400"),
       Raw("9" * 5000), Raw("[" * 3000 + "]" * 3000), Raw('{"a":' * 3000 + "1" + "}" * 3000)]
hostile = st.one_of(
    st.sampled_from(RAW),
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**30, -1, 0, 1, True, False, None, "",
                     "12", "[0, 1]", "[[[", [], {}, [1, 2], [-1, 2**64], {"a": 1}, 1.5, -0.0,
                     "x" * 100_000, [0] * 2000, DELETE]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.one_of(st.integers(), st.none(), st.text(max_size=3)), max_size=4),
)


def dumps(obj: Any) -> str:
    raws: list[str] = []

    def default(o: object) -> str:
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"@@RAW{len(raws) - 1}@@"
        raise TypeError(type(o).__name__)

    text = json.dumps(obj, default=default, separators=(",", ":"))
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', raw)
    return text


def mutate(doc: Any, path: tuple[Any, ...], value: object) -> None:
    """Set (or delete) ``doc[path]`` where the path exists; indexes wrap around."""
    node = doc
    for key in path[:-1]:
        if isinstance(node, list) and isinstance(key, int) and node:
            node = node[key % len(node)]
        elif isinstance(node, dict) and isinstance(key, str) and key in node:
            node = node[key]
        else:
            return
    last = path[-1]
    if isinstance(node, list) and isinstance(last, int) and node:
        if value is DELETE:
            del node[last % len(node)]
        else:
            node[last % len(node)] = value
    elif isinstance(node, dict) and isinstance(last, str):
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value


def check(result: Callable[[], ReadResult], source: str) -> None:
    try:
        res = result()
    except TraceFormatError as exc:
        assert str(exc).startswith(source), str(exc)
        return
    t = res.table
    assert len(t) == 0 or bool((t.end >= t.start).all())
    assert all(isinstance(w, str) for w in res.warnings)


# --------------------------------------------------------------------------- Kineto (JSON/gz)

def kineto_doc(rank: int = 1) -> dict[str, Any]:
    ev: list[dict[str, Any]] = []
    for step in range(2):
        t = 1000 + step * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                   "ts": t, "dur": 900})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "forward", "ts": t + 10,
                   "dur": 200})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32",
                   "ts": t + 300, "dur": 100.5,
                   "args": {"Collective name": "allreduce", "In msg nelems": 1024,
                            "Out msg nelems": 1024, "dtype": "Float", "Group size": 2,
                            "Process Group Ranks": "[0, 1]", "Process Group Name": "0"}})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv",
                   "ts": t + 500, "dur": 50,
                   "args": {"Collective name": "send", "Dst Rank": 0, "In msg nelems": 8,
                            "dtype": "BFloat16"}})
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": t + 600, "dur": 80})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "ts": t + 700,
                   "dur": 30})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "pg:0,1", "ts": t + 690,
                   "dur": 50})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": t + 695,
                   "dur": 40, "args": {"Process Group Ranks": [0, 1], "In msg nelems": 4}})
        ev.append({"ph": "i", "name": "marker", "ts": t})
    return {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2,
                                "pp_rank": 0,
                                "pg_config": [{"pg_name": "0", "ranks": [0, 1]}]},
            "traceEvents": ev}


_HEAD_FIELDS = ["distributedInfo", "baseTimeNanoseconds", "traceEvents", "schemaVersion"]
_INFO_FIELDS = ["rank", "world_size", "pp_rank", "stage", "backend", "pg_config"]
_EVENT_FIELDS = ["ph", "name", "cat", "ts", "dur", "args"]
_ARG_FIELDS = ["Collective name", "In msg nelems", "Out msg nelems", "dtype",
               "Process Group Ranks", "Process Group Name", "Dst Rank", "Src Rank",
               "Peer rank"]
kineto_paths = st.one_of(
    st.sampled_from(_HEAD_FIELDS).map(lambda k: (k,)),
    st.sampled_from(_INFO_FIELDS).map(lambda k: ("distributedInfo", k)),
    st.tuples(st.just("distributedInfo"), st.just("pg_config"), st.integers(0, 3),
              st.sampled_from(["pg_name", "ranks"])),
    st.integers(0, 40).map(lambda i: ("traceEvents", i)),
    st.tuples(st.just("traceEvents"), st.integers(0, 40), st.sampled_from(_EVENT_FIELDS)),
    st.tuples(st.just("traceEvents"), st.integers(0, 40), st.just("args"),
              st.sampled_from(_ARG_FIELDS)),
)
KINETO_BASE = kineto_doc()


@fuzz_settings()
@given(st.lists(st.tuples(kineto_paths, hostile), max_size=4), st.booleans(), st.booleans())
def test_kineto_structured(muts: list[tuple[tuple[Any, ...], object]], gz: bool,
                           top_list: bool) -> None:
    doc: Any = copy.deepcopy(KINETO_BASE)
    for path, value in muts:
        # A copy: the sampled hostile values are shared objects; inserting one list twice
        # would build a cycle (and change the sample for later examples).
        mutate(doc, path, value if value is DELETE else copy.deepcopy(value))
    if top_list:  # the bare-list flavour of the Chrome trace format
        doc = doc.get("traceEvents", [])
    data = dumps(doc).encode()
    source = "/t/rank1.json.gz" if gz else "/t/rank1.json"
    if gz:
        data = gzip.compress(data, mtime=0)

    def run() -> ReadResult:
        warnings: list[str] = []
        obj = load_chrome_trace(data, source=source, warnings=warnings)
        return parse_kineto(obj, source=source, warnings=warnings)

    check(run, source)


# One seed per example drives the byte mutations (a classic mutation fuzzer): drawing each
# mutation through Hypothesis costs more than the parse it feeds.
mutations = st.integers(0, 2**63)


def apply_bytes(data: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        if not buf:
            break
        op, i = rng.randrange(5), rng.randrange(len(buf))
        length, byte = rng.randint(1, 64), rng.randrange(256)
        if op == 0:
            buf[i] ^= byte or 1
        elif op == 1:
            buf[i:i] = bytes([byte]) * length
        elif op == 2:
            del buf[i:i + length]
        elif op == 3:
            buf[i:i] = buf[i:i + length]
        else:
            del buf[i:]
    return bytes(buf)


KINETO_BYTES = dumps(KINETO_BASE).encode()
KINETO_GZ = gzip.compress(KINETO_BYTES, mtime=0)


@fuzz_settings()
@given(mutations, st.booleans())
def test_kineto_mutated_bytes(seed: int, gz: bool) -> None:
    data = apply_bytes(KINETO_GZ if gz else KINETO_BYTES, seed)
    source = "/t/rank1.json.gz"

    def run() -> ReadResult:
        warnings: list[str] = []
        obj = load_chrome_trace(data, source=source, warnings=warnings)
        return parse_kineto(obj, source=source, warnings=warnings)

    check(run, source)


# --------------------------------------------------------------------------- compact JSON lines

def compact_rows() -> list[dict[str, Any]]:
    head: dict[str, Any] = {"format": "fabricscope-optiming", "version": 1, "job": "j",
                            "world_size": 4}
    rows: list[dict[str, Any]] = [head]
    for r in range(4):
        for it in range(2):
            t = 1_700_000_000_000_000_000 + it * 10_000 + r
            rows.append({"rank": r, "iteration": it, "op": "allreduce", "group": [0, 1, 2, 3],
                         "seq": 0, "t_start_ns": t, "t_end_ns": t + 500, "bytes": 1 << 20,
                         "stage": 0, "mb": -1})
            rows.append({"rank": r, "iteration": it, "op": "forward-compute", "seq": 0,
                         "t_start_ns": t + 600, "t_end_ns": t + 900, "mb": 0})
    return rows


_COMPACT_FIELDS = ["format", "version", "job", "world_size", "rank", "iteration", "op",
                   "group", "seq", "t_start_ns", "t_end_ns", "bytes", "stage", "mb"]
compact_paths = st.one_of(
    st.integers(0, 20).map(lambda i: (i,)),
    st.tuples(st.integers(0, 20), st.sampled_from(_COMPACT_FIELDS)),
    st.tuples(st.integers(0, 20), st.just("group"), st.integers(0, 3)),
)
COMPACT_BASE = compact_rows()


@fuzz_settings()
@given(st.lists(st.tuples(compact_paths, hostile), max_size=4), st.booleans())
def test_compact_lines_structured(muts: list[tuple[tuple[Any, ...], object]], gz: bool) -> None:
    rows: Any = copy.deepcopy(COMPACT_BASE)
    for path, value in muts:
        mutate(rows, path, value if value is DELETE else copy.deepcopy(value))
    data = "\n".join(dumps(r) for r in rows).encode()
    source = "/t/trace.jsonl.gz" if gz else "/t/trace.jsonl"
    if gz:
        data = gzip.compress(data, mtime=0)
    check(lambda: parse_compact_bytes(data, source=source), source)


COMPACT_BYTES = "\n".join(dumps(r) for r in COMPACT_BASE).encode()
COMPACT_GZ = gzip.compress(COMPACT_BYTES, mtime=0)


@fuzz_settings()
@given(mutations, st.booleans())
def test_compact_lines_mutated_bytes(seed: int, gz: bool) -> None:
    data = apply_bytes(COMPACT_GZ if gz else COMPACT_BYTES, seed)
    source = "/t/trace.jsonl.gz" if gz else "/t/trace.jsonl"
    check(lambda: parse_compact_bytes(data, source=source), source)


# --------------------------------------------------------------------------- Parquet (both)

_BYTEDANCE_COLS = ["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration",
                   "seq_id", "mb_id"]
_COMPACT_COLS = ["rank", "iteration", "op", "group", "seq", "t_start_ns", "t_end_ns", "bytes",
                 "stage", "mb"]
_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "float64": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "float32": (pa.float32(), st.floats(width=32, allow_nan=True, allow_infinity=True)),
    "string": (pa.string(), st.text(max_size=6)),
    "bool": (pa.bool_(), st.booleans()),
    "ints": (pa.list_(pa.int32()), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3)),
    "timestamp": (pa.timestamp("ns"), st.integers(-(2**62), 2**62)),
}


def _valid_bytedance(n: int) -> dict[str, list[Any]]:
    ops = ["forward-compute", "forward-send", "forward-recv", "backward-send",
           "backward-recv", "grads-reduce-scatter", "embedding-grads-all-reduce"]
    return {"dp_rank": [k % 2 for k in range(n)], "stage": [(k // 2) % 2 for k in range(n)],
            "rank": [k % 4 for k in range(n)], "step": [k // 4 for k in range(n)],
            "optype": [ops[k % len(ops)] for k in range(n)],
            "start_ts": [0.001 * k for k in range(n)], "duration": [0.0005] * n,
            "seq_id": list(range(n)), "mb_id": [k % 3 - 1 for k in range(n)]}


def _valid_columns(n: int) -> tuple[dict[str, pa.Array], dict[str, pa.Array]]:
    """Valid ByteDance columns (the real files' types) and valid compact columns, n rows."""
    valid = _valid_bytedance(n)
    types = {"optype": pa.dictionary(pa.int8(), pa.string()), "start_ts": pa.float32(),
             "duration": pa.float32(), "rank": pa.int16(), "step": pa.int64()}
    bytedance = {k: pa.array(valid[k], type=types.get(k, pa.int8())) for k in _BYTEDANCE_COLS}
    compact = {"rank": pa.array([k % 4 for k in range(n)]),
               "iteration": pa.array([k // 4 for k in range(n)]),
               "op": pa.array(["allreduce"] * n).dictionary_encode(),
               "group": pa.array([[0, 1, 2, 3]] * n, type=pa.list_(pa.int32())),
               "seq": pa.array([0] * n), "t_start_ns": pa.array([10 * k for k in range(n)]),
               "t_end_ns": pa.array([10 * k + 5 for k in range(n)]),
               "bytes": pa.array([8] * n), "stage": pa.array([0] * n), "mb": pa.array([-1] * n)}
    return bytedance, compact


VALID_COLUMNS = [_valid_columns(n) for n in range(7)]
column_spec = st.tuples(st.sampled_from(sorted(_TYPES)), st.booleans(), st.booleans())


@st.composite
def parquet_tables(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A small Parquet file: valid columns of either schema, some replaced by hostile ones;
    with whether it started as the compact schema (the parser it is fed to)."""
    n = draw(st.integers(0, 6))
    compact = draw(st.booleans())
    cols = dict(VALID_COLUMNS[n][compact])
    names = _BYTEDANCE_COLS + _COMPACT_COLS
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(names))
        kind, nulls, drop = draw(column_spec)
        if drop:
            cols.pop(name, None)
            continue
        typ, values = _TYPES[kind]
        item = st.one_of(st.none(), values) if nulls else values
        cols[name] = pa.array(draw(st.lists(item, min_size=n, max_size=n)), type=typ)
    names, arrays = list(cols), list(cols.values())
    if names and draw(st.integers(0, 9)) == 0:  # a column named twice
        k = draw(st.integers(0, len(names) - 1))
        names.append(names[k])
        arrays.append(arrays[k])
    table = pa.Table.from_arrays(arrays, names=names) if names else pa.table(
        {"x": pa.array([], pa.int8())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes()), compact


@fuzz_settings()
@given(parquet_tables())
def test_parquet_structured(doc: tuple[bytes, bool]) -> None:
    data, compact = doc
    if compact:
        check(lambda: parse_compact_parquet(data, source="/t/c.parquet"), "/t/c.parquet")
    else:
        check(lambda: parse_bytedance(data, source="/t/trace-X.parquet"), "/t/trace-X.parquet")


def _parquet_base() -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(_valid_bytedance(12)), sink)
    return sink.getvalue()


PARQUET_BYTES = _parquet_base()


@fuzz_settings()
@given(mutations)
def test_parquet_mutated_bytes(seed: int) -> None:
    data = apply_bytes(PARQUET_BYTES, seed)
    check(lambda: parse_bytedance(data, source="/t/trace-X.parquet"), "/t/trace-X.parquet")
    check(lambda: parse_compact_parquet(data, source="/t/c.parquet"), "/t/c.parquet")
