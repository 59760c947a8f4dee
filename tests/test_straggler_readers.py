"""Trace readers: compact round trip, Kineto (twin + real HTA NCCL sample), bad input."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.model.errors import TraceFormatError
from fabricscope.model.records import OpTiming
from fabricscope.straggler.readers import (
    format_compact_lines,
    load_chrome_trace,
    parse_compact_lines,
    parse_kineto,
    read_kineto,
    read_paths,
)
from fabricscope.straggler.readers.compact import compact_parquet_bytes, parse_compact_parquet
from fabricscope.straggler.table import COLLECTIVE, COMPUTE, P2P, op_kind, table_from_records

ROOT = Path(__file__).resolve().parents[1]


def shared() -> Path:
    return Path(os.environ.get("FABRICSCOPE_SHARED") or ROOT.parent / "shared")


ops = st.builds(
    OpTiming,
    job=st.just("j"),
    rank=st.integers(0, 63),
    iteration=st.integers(0, 1000),
    op=st.sampled_from(["allreduce", "forward-compute", "forward-send", "optimizer"]),
    group=st.lists(st.integers(0, 63), max_size=4).map(tuple),
    seq=st.integers(0, 100),
    t_start_ns=st.integers(0, 10**15),
    t_end_ns=st.just(0),
    bytes=st.integers(0, 2**40),
).map(lambda o: OpTiming(o.job, o.rank, o.iteration, o.op, o.group, o.seq, o.t_start_ns,
                         o.t_start_ns + o.seq * 1000, o.bytes))


@settings(max_examples=40, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30))
def test_compact_jsonl_round_trip(records: list[OpTiming]) -> None:
    table = table_from_records(records)
    back = parse_compact_lines(format_compact_lines(table).splitlines(), source="x.jsonl")
    assert back.warnings == []
    assert back.table.to_records() == records


def test_compact_parquet_round_trip() -> None:
    recs = [OpTiming("j", r, i, "allreduce", (0, 1), 0, 100 * i, 100 * i + 50, 8)
            for r in range(2) for i in range(3)]
    table = table_from_records(recs)
    back = parse_compact_parquet(compact_parquet_bytes(table), source="x.parquet")
    assert back.table.to_records() == recs


def test_compact_bad_lines_are_skipped_with_position() -> None:
    lines = [
        '{"format": "fabricscope-optiming", "version": 1, "job": "j"}',
        '{"rank": 0, "iteration": 0, "op": "fwd-compute", "seq": 0, "t_start_ns": 0, "t_end_ns": 5}',
        '{"rank": 1, "iteration": 0, "op": "x"',  # cut
        '{"rank": 2, "iteration": 0, "op": "x", "seq": 0, "t_start_ns": 9, "t_end_ns": 3}',
        '{"rank": 3, "iteration": 0, "op": "x", "seq": 0}',
        '{"rank": 4, "iteration": 0, "op": "fwd-compute", "seq": 0, "t_start_ns": 1, "t_end_ns": 2}',
    ]
    res = parse_compact_lines(lines, source="t.jsonl")
    assert sorted(res.table.rank.tolist()) == [0, 4]
    assert [w.split(":")[1] for w in res.warnings] == ["3", "4", "5"]
    assert "t_end_ns 3 < t_start_ns 9" in res.warnings[1]
    assert "missing field(s) t_start_ns, t_end_ns" in res.warnings[2]


def test_op_kinds() -> None:
    assert op_kind("forward-compute", 0) == COMPUTE
    assert op_kind("allreduce", 4) == COLLECTIVE
    assert op_kind("backward-recv", 2) == P2P
    assert op_kind("optimizer-clip-main-grad", 0) not in (COMPUTE, COLLECTIVE, P2P)


def test_hta_nccl_sample_parses() -> None:
    path = shared() / "datasets" / "hta-nccl-sample" / "nccl_data.json.gz"
    if not path.exists():
        pytest.skip(f"shared dataset absent: {path}")
    res = read_kineto(path)
    t = res.table
    coll = t.kind == COLLECTIVE
    names = {t.op_names[o] for o in t.op[coll].tolist()}
    assert names == {"allreduce", "broadcast"}
    assert {t.groups[g] for g in t.group[coll].tolist()} == {(0, 1)}
    # Sizes come from "In msg nelems" x dtype width (Float = 4 bytes); the sample's
    # all-reduces carry 6,637,568 elements among others.
    assert 6637568 * 4 in set(t.nbytes[coll].tolist())
    assert res.meta["world_size"] == 2 and res.meta["backend"] == "nccl"
    # Iterations are the file's ProfilerStep#N numbers.
    steps = {int(e["name"].split("#")[1]) for e in json.loads(gzip.decompress(path.read_bytes()))
             ["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert set(t.iteration[coll].tolist()) <= steps and len(steps) >= 1


def _twin_kineto(tmp_path: Path) -> Path:
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.twin.tracegen import TwinJob, generate_trace, write_twin_traces

    fab = rail_optimized_fabric(4, gpus_per_server=4, radix=16)
    tr = generate_trace(fab, TwinJob(dp=2, tp=2, pp=2, iterations=4), comm="alpha-beta", seed=3)
    write_twin_traces(tr, tmp_path)
    return tmp_path


def test_twin_kineto_and_compact_agree(tmp_path: Path) -> None:
    d = _twin_kineto(tmp_path)
    k = read_paths([d / "kineto"])
    c = read_paths([d / "trace.jsonl"])
    assert k.warnings == [] and c.warnings == []
    assert len(k.table) == len(c.table)
    # Same per-rank op counts and the same comm byte totals (Kineto via nelems x bf16).
    assert np.array_equal(np.bincount(k.table.rank), np.bincount(c.table.rank))
    assert k.table.nbytes.sum() == c.table.nbytes.sum()
    assert k.table.stage.min() == 0 and k.table.stage.max() == 1


def test_truncated_and_missing_rank(tmp_path: Path) -> None:
    d = _twin_kineto(tmp_path)
    f3 = d / "kineto" / "rank3.json.gz"
    f3.unlink()
    f1 = d / "kineto" / "rank1.json.gz"
    raw = gzip.decompress(f1.read_bytes())
    f1.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    res = read_paths([d / "kineto"])
    assert any("rank1.json.gz" in w and "cut or corrupt at byte" in w for w in res.warnings)
    assert any("missing rank(s) 3" in w for w in res.warnings)
    # Events before the cut still count.
    n1 = int((res.table.rank == 1).sum())
    n0 = int((res.table.rank == 0).sum())
    assert 0 < n1 < n0


def test_corrupt_file_is_unused_not_fatal(tmp_path: Path) -> None:
    d = _twin_kineto(tmp_path)
    (d / "kineto" / "rank2.json.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    res = read_paths([d / "kineto"])
    assert any("rank2.json.gz" in u for u in res.unused)
    assert set(res.table.rank.tolist()) == set(range(8)) - {2}


def test_not_a_trace_raises_naming_file(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(TraceFormatError, match=r"x\.json: not a Chrome trace"):
        read_paths([p])
    with pytest.raises(TraceFormatError, match="no such file"):
        read_paths([tmp_path / "nope"])


def test_kineto_rank_from_file_name_and_bad_event() -> None:
    obj: dict[str, object] = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": 1, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "ts": 2, "dur": 5,
         "args": ["not", "an", "object"]},
    ]}
    res = parse_kineto(obj, source="/x/rank7.json")
    assert res.meta["rank"] == 7
    assert any("event 2: skipped" in w and "args" in w for w in res.warnings)
    with pytest.raises(TraceFormatError, match="cannot tell the rank"):
        parse_kineto(obj, source="/x/trace.json")
    # A time that is not a time makes the whole file unusable (one message, event named):
    # dropping the event would shift this rank's collective numbering against its peers'.
    obj["traceEvents"][2]["ts"] = "bad"  # type: ignore[index]
    with pytest.raises(TraceFormatError, match=r"rank7\.json: event 2: ts 'bad' is not a number"):
        parse_kineto(obj, source="/x/rank7.json")


def test_two_whole_jobs_are_refused(tmp_path: Path) -> None:
    for job in ("a", "b"):
        recs = [OpTiming(job, 0, 0, "forward-compute", (), 0, 0, 10)]
        (tmp_path / f"{job}.jsonl").write_text(format_compact_lines(table_from_records(recs)))
    with pytest.raises(TraceFormatError, match="several jobs"):
        read_paths([tmp_path])


def test_corrupt_parquet_in_a_folder_is_unused_once_named(tmp_path: Path) -> None:
    d = _twin_kineto(tmp_path)
    bad = d / "kineto" / "extra.parquet"
    bad.write_bytes(b"PAR1" + b"garbage" * 20)  # pyarrow raises ArrowInvalid (a ValueError)
    res = read_paths([d / "kineto"])
    msgs = [u for u in res.unused if "extra.parquet" in u]
    assert len(msgs) == 1 and msgs[0].count(str(bad)) == 1, msgs
    assert "not a readable Parquet file" in msgs[0]
    assert set(res.table.rank.tolist()) == set(range(8))


def test_truncated_trace_keeps_its_clock_base(tmp_path: Path) -> None:
    d = _twin_kineto(tmp_path)
    f1 = d / "kineto" / "rank1.json.gz"
    whole = read_kineto(f1)
    raw = gzip.decompress(f1.read_bytes())
    assert b'"baseTimeNanoseconds": 0' not in raw[:200]  # the twin writes a non-zero base
    f1.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    cut = read_kineto(f1)
    assert any("cut or corrupt" in w for w in cut.warnings)
    n = len(cut.table)
    assert 0 < n < len(whole.table)
    # Same events, same absolute times: the salvaged file is not clock-shifted.
    assert int(cut.table.start.min()) == int(whole.table.start.min())


def test_one_job_in_two_formats_is_read_once(tmp_path: Path) -> None:
    d = _twin_kineto(tmp_path)  # kineto/ + trace.jsonl of the same job, truth.json beside
    (d / "inventory.json").write_text(json.dumps({"devices": []}))  # not a trace: skipped
    k = read_paths([d / "kineto"])
    both = read_paths([d])
    assert len(both.table) == len(k.table)
    assert len(both.unused) == 1 and "read once" in both.unused[0], both.unused
    assert "trace.jsonl" in both.unused[0]


def _rewrite(path: Path, edit: object) -> None:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    edit(doc)  # type: ignore[operator]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


@pytest.mark.parametrize(("label", "edit", "needle"), [
    ("ts-infinity", lambda d: d["traceEvents"][5].__setitem__("ts", float("inf")),
     "event 5: ts inf is not a finite number"),
    ("ts-1e400", lambda d: d["traceEvents"][5].__setitem__("ts", 1e400),
     "ts inf is not a finite number"),
    ("dur-nan", lambda d: d["traceEvents"][5].__setitem__("dur", float("nan")),
     "dur nan is not a finite number"),
    ("ts-2**64", lambda d: d["traceEvents"][5].__setitem__("ts", 2**64),
     "out of range"),
    ("rank-above-2**63", lambda d: d["distributedInfo"].__setitem__("rank", 2**63 + 1),
     "distributedInfo.rank 9223372036854775809 is outside"),
    ("rank-string", lambda d: d["distributedInfo"].__setitem__("rank", "2"),
     "distributedInfo.rank '2' is not an integer"),
    ("world-size-list", lambda d: d["distributedInfo"].__setitem__("world_size", [8]),
     "distributedInfo.world_size [8] is not an integer"),
    ("pp-rank-float", lambda d: d["distributedInfo"].__setitem__("pp_rank", 0.5),
     "distributedInfo.pp_rank 0.5 is not an integer"),
    ("distributed-info-list", lambda d: d.__setitem__("distributedInfo", [1]),
     "distributedInfo [1] is not an object"),
    ("base-time-string", lambda d: d.__setitem__("baseTimeNanoseconds", "now"),
     "baseTimeNanoseconds 'now' is not an integer"),
    ("trace-events-object", lambda d: d.__setitem__("traceEvents", {"a": 1}),
     "traceEvents {'a': 1} is not a list"),
])
def test_one_bad_value_makes_that_file_unused_not_a_crash(
    tmp_path: Path, label: str, edit: object, needle: str
) -> None:
    d = _twin_kineto(tmp_path)
    bad = d / "kineto" / "rank2.json.gz"
    _rewrite(bad, edit)
    res = read_paths([d / "kineto"])
    assert len(res.unused) == 1 and res.unused[0].startswith(str(bad)), res.unused
    assert needle in res.unused[0], res.unused[0]
    assert set(res.table.rank.tolist()) == set(range(8)) - {2}
    assert any("missing rank(s) 2" in w for w in res.warnings)


def test_compact_hostile_values_are_skipped_lines_naming_the_field() -> None:
    row = {"rank": 0, "iteration": 0, "op": "x-compute", "seq": 0, "t_start_ns": 0,
           "t_end_ns": 5}
    lines = [json.dumps(row)]
    for field, value in [("t_end_ns", "Infinity"), ("t_start_ns", "1e400"),
                         ("rank", str(2**64)), ("iteration", "null"), ("op", "7"),
                         ("group", '"0123"'), ("seq", "true"), ("bytes", "-1"),
                         ("t_end_ns", "9" * 5000)]:
        lines.append(json.dumps(row)[:-1] + f', "{field}": {value}}}'.replace(
            f'"{field}": {json.dumps(row.get(field))}, ', ""))
    lines.append('{"format": "fabricscope-optiming", "version": Infinity, "world_size": 1e400}')
    res = parse_compact_lines(lines, source="t.jsonl")
    assert res.table.rank.tolist() == [0]
    skipped = [w for w in res.warnings if "skipped line" in w]
    assert len(skipped) == 9, res.warnings
    for w, field in zip(skipped, ["t_end_ns", "t_start_ns", "rank", "iteration", "op", "group",
                                  "seq", "bytes", "t_end_ns"], strict=True):
        assert field in w or "4300" in w or "digits" in w, w
    assert "world_size" not in res.meta
    assert any("version" in w for w in res.warnings)


def test_bytedance_nulls_nan_and_wrong_types(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fabricscope.straggler.readers import parse_bytedance

    def table(**over: pa.Array) -> bytes:
        n = 4
        cols = {"dp_rank": pa.array([0, 0, 0, 0], pa.int8()), "stage": pa.array([0] * n),
                "rank": pa.array([0] * n), "step": pa.array([0, 0, 1, 1]),
                "optype": pa.array(["forward-compute"] * n),
                "start_ts": pa.array([0.0, 0.1, 1.0, 1.1]),
                "duration": pa.array([0.05] * n), "mb_id": pa.array([0, 1, 0, 1])}
        cols.update(over)
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table(cols), sink)
        return bytes(sink.getvalue().to_pybytes())

    res = parse_bytedance(table(rank=pa.array([0, None, 0, 0]),
                                start_ts=pa.array([0.0, 0.1, float("nan"), 1.1]),
                                step=pa.array([0, 0, 1, 2**40]),
                                mb_id=pa.array([0, None, 0, 1])), source="t.parquet")
    assert len(res.table) == 1  # rows 1 (null rank), 2 (NaN start), 3 (step > int32) skipped
    text = "\n".join(res.warnings)
    assert "row 1: rank not an integer" in text and "row 2: bad start_ts/duration" in text
    assert "row 3: step not an integer" in text
    with pytest.raises(TraceFormatError, match="column rank holds string, expected numbers"):
        parse_bytedance(table(rank=pa.array(["a"] * 4)), source="t.parquet")
    with pytest.raises(TraceFormatError, match="column optype holds int64, expected strings"):
        parse_bytedance(table(optype=pa.array([1] * 4)), source="t.parquet")


def test_bytedance_invalid_utf8_optype_is_one_error() -> None:
    # Found by the long fuzz run: pyarrow raised UnicodeDecodeError from to_pylist().
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fabricscope.straggler.readers import parse_bytedance

    n = 3
    tb = pa.table({"dp_rank": [0] * n, "stage": [0] * n, "rank": [0] * n, "step": [0, 1, 2],
                   "optype": ["forward-compute"] * n, "start_ts": [0.0, 1.0, 2.0],
                   "duration": [0.5] * n})
    sink = io.BytesIO()
    pq.write_table(tb, sink, use_dictionary=False, compression="none", write_statistics=False)
    data = sink.getvalue().replace(b"forward-compute", b"forward\x93compute")
    with pytest.raises(TraceFormatError, match=r"t\.parquet: column optype: cannot read as text"):
        parse_bytedance(data, source="t.parquet")


def test_deep_nesting_is_a_warning_or_one_error_not_a_recursion_error() -> None:
    from fabricscope.straggler.readers.compact import parse_compact_bytes

    deep = b"[" * 100_000 + b"]" * 100_000
    warnings: list[str] = []
    obj = load_chrome_trace(b'{"traceEvents": [' + deep + b"]}", source="rank0.json",
                            warnings=warnings)
    assert obj["traceEvents"] == [] and any("salvaging" in w for w in warnings), warnings
    assert len(parse_kineto(obj, source="rank0.json", warnings=warnings).table) == 0
    res = parse_compact_bytes(b'{"rank": ' + deep + b"}\n", source="t.jsonl")
    assert len(res.table) == 0 and res.warnings[0].startswith("t.jsonl:1: skipped line")
    with pytest.raises(TraceFormatError, match=r"rank1\.json: not a Chrome trace"):
        load_chrome_trace(deep, source="rank1.json", warnings=[])
