"""Streamed grading / prediction (fabricscope.optics.stream) equals the in-memory path exactly.

The fleets are synthetic (``write_fleet``, seeded): no public fleet history of this size and
shape exists; the readers' real-sample tests are in test_optics_readers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from fabricscope.cli.optics import register
from fabricscope.model.errors import ConfigError
from fabricscope.optics.features import HOUR_NS, LaneFeatures, lane_features
from fabricscope.optics.grade import grade_fleet
from fabricscope.optics.history import ALL_METRICS, FleetHistory, module_table
from fabricscope.optics.predict import predict_fleet
from fabricscope.optics.readers.links import read_links
from fabricscope.optics.readers.table import (
    HistoryChunks,
    UnorderedHistoryError,
    read_history,
    write_history,
)
from fabricscope.optics.stream import stream_features, stream_grade, stream_predict
from fabricscope.twin.optics_fleet import FleetConfig, write_fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 29 days: the 28-day grid gives lane chunks of 297 lanes, so ~750 lanes make 3 chunks;
    # row groups of 16 modules and read batches of 40,000 rows split modules across batches
    d = tmp_path_factory.mktemp("stream") / "fleet"
    write_fleet(FleetConfig(modules=110, days=29, sample_s=1800, fail_fraction=0.2), d,
                seed=11, chunk_modules=16)
    return d


def _same_features(fa: LaneFeatures, fb: LaneFeatures) -> None:
    """Every feature column equal bit for bit (NaN where NaN)."""
    assert fa.names == fb.names
    np.testing.assert_array_equal(fa.module, fb.module)
    np.testing.assert_array_equal(fa.lane, fb.lane)
    for k in fa.names:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def _same_history(a: FleetHistory, b: FleetHistory) -> None:
    np.testing.assert_array_equal(a.ts, b.ts)
    np.testing.assert_array_equal(a.module, b.module)
    np.testing.assert_array_equal(a.lane, b.lane)
    for m in ALL_METRICS:
        np.testing.assert_array_equal(a.metrics[m], b.metrics[m], err_msg=m)
    for c in ("device", "port", "vendor", "part_number", "serial", "media"):
        assert getattr(a.modules, c) == getattr(b.modules, c), c
    np.testing.assert_array_equal(a.modules.lanes, b.modules.lanes)
    for c, v in b.modules.thresholds.items():
        np.testing.assert_array_equal(a.modules.thresholds[c], v, err_msg=c)
    assert a.warnings == b.warnings


@pytest.mark.parametrize("at_hours_before_end", [None, 30])
def test_stream_equals_in_memory(fleet: Path, at_hours_before_end: int | None) -> None:
    path = fleet / "history.parquet"
    peers, _ = read_links(fleet / "links.csv")
    h = read_history(path, chunked=False)  # the whole-table reader, independent of the chunks
    at = int(h.ts.max())
    if at_hours_before_end is not None:  # an earlier evaluation time, whole hour
        at = (at // HOUR_NS - at_hours_before_end) * HOUR_NS
    if at_hours_before_end is None:
        _same_history(read_history(path), h)
    ref = lane_features(h, at_ns=at, peers=peers)
    assert len(ref) > 2 * (200_000 // (28 * 24))  # more than two lane chunks
    seen: list[int] = []
    sf = stream_features(str(path), at_ns=None if at_hours_before_end is None else at,
                         peers=peers, batch_rows=40_000,
                         workers=1 if at_hours_before_end is None else 2,
                         progress=lambda done, total: seen.append(done))
    assert sf.features.at_ns == at
    assert sf.rows == len(h)
    assert len(seen) > 3 and seen == sorted(seen) and seen[-1] == pq.ParquetFile(
        path).metadata.num_rows
    _same_features(sf.features, ref)
    assert sf.history.warnings == h.warnings
    assert any("duplicated samples" in w for w in h.warnings)
    assert sf.history.modules.serial == h.modules.serial
    np.testing.assert_array_equal(sf.history.modules.lanes, h.modules.lanes)
    g_ref = grade_fleet(h, at_ns=at, peers=peers, features=ref)
    g = stream_grade(str(path), at_ns=at, peers=peers, workers=2)
    assert g.to_json() == g_ref.to_json()
    assert {"bad", "needs-attention"} & set(g.grade)  # the fleet has failing modules
    p_ref = predict_fleet(h, at_ns=at, peers=peers, grades=g_ref)
    p = stream_predict(str(path), at_ns=at, peers=peers)
    assert p.to_json() == p_ref.to_json()


def _small(rng: np.random.Generator, n_mod: int, n_lane: int, n_t: int) -> FleetHistory:
    ts = np.tile(1_700_000_000 * 10**9 + np.arange(n_t, dtype=np.int64) * 600 * 10**9,
                 n_mod * n_lane)
    module = np.repeat(np.arange(n_mod, dtype=np.int32), n_lane * n_t)
    lane = np.tile(np.repeat(np.arange(n_lane, dtype=np.int32), n_t), n_mod)
    n = ts.shape[0]
    met = {m: np.asarray(rng.normal(3.0, 0.1, n), dtype=np.float32) for m in ALL_METRICS}
    met["fec_uncorrectable"] = np.tile(np.arange(n_t, dtype=np.float64), n_mod * n_lane)
    met["crc_errors"] = met["fec_uncorrectable"].copy()
    rows = [{"device": f"leaf{i % 3}", "port": f"Ethernet{i}", "vendor": "V",
             "part_number": "P", "serial": f"S{i}", "media": "400GBASE-DR4"}
            for i in range(n_mod)]
    return FleetHistory(ts=ts, module=module, lane=lane, metrics=met,
                        modules=module_table(rows, lanes=[n_lane] * n_mod))


def test_repairs_counted_like_read_history_without_ts_statistics(tmp_path: Path) -> None:
    h = _small(np.random.default_rng(5), n_mod=12, n_lane=2, n_t=300)
    p = tmp_path / "h.parquet"
    write_history(h, p)
    t = pq.read_table(p)
    n = t.num_rows
    idx = list(range(n))
    idx[1000], idx[1001] = idx[1001], idx[1000]  # a clock jump in module 1
    idx[5000], idx[5001] = idx[5001], idx[5000]  # one in module 8
    idx[4200:4200] = [4200, 4200]  # module 7: one sample three times
    t = t.take(pa.array(idx))
    fec = t.column("fec_uncorrectable").to_numpy().copy()
    fec[6500] = 0.0  # a counter reset (module 10)
    t = t.set_column(t.schema.get_field_index("fec_uncorrectable"), "fec_uncorrectable",
                     pa.array(fec))
    q = tmp_path / "h2.parquet"
    pq.write_table(t, q, write_statistics=False, row_group_size=2_000)
    ref = read_history(q, chunked=False)
    text = "\n".join(ref.warnings)
    assert "2 samples go back in time" in text and "2 duplicated samples" in text
    assert "fec_uncorrectable: 1 counter resets" in text
    reader = HistoryChunks(q, batch_rows=700, min_rows=700)
    assert reader.ts_range() == (int(ref.ts.min()), int(ref.ts.max()))
    chunks = list(reader)
    assert len(chunks) > 5
    assert reader.warnings == ref.warnings
    np.testing.assert_array_equal(np.concatenate([c.ts for c in chunks]), ref.ts)
    np.testing.assert_array_equal(np.concatenate([c.module for c in chunks]), ref.module)
    for m in ALL_METRICS:
        np.testing.assert_array_equal(np.concatenate([c.metrics[m] for c in chunks]),
                                      ref.metrics[m])
    _same_history(read_history(q), ref)  # read_history's chunked path
    at = int(ref.ts.max()) // HOUR_NS * HOUR_NS
    sf = stream_features(str(q), at_ns=at, batch_rows=700)
    _same_features(sf.features, lane_features(ref, at_ns=at))


def test_unordered_file_names_row_and_module(tmp_path: Path) -> None:
    h = _small(np.random.default_rng(6), n_mod=4, n_lane=1, n_t=50)
    p = tmp_path / "h.parquet"
    write_history(h, p)
    t = pq.read_table(p)
    # module 0's rows, then module 1's, then module 0 again
    t = t.take(pa.array([*range(0, 25), *range(50, 100), *range(25, 50), *range(100, 200)]))
    q = tmp_path / "mixed.parquet"
    pq.write_table(t, q)
    with pytest.raises(UnorderedHistoryError, match=r"mixed.parquet: row 75 \(0-based\): "
                       r"module leaf0:Ethernet0 reappears"):
        stream_features(str(q), batch_rows=30)
    assert len(read_history(q)) == 200  # the in-memory reader sorts it


def test_no_rows_and_missing_file(tmp_path: Path) -> None:
    h = _small(np.random.default_rng(1), n_mod=1, n_lane=1, n_t=3)
    p = tmp_path / "empty.parquet"
    write_history(FleetHistory(ts=h.ts[:0], module=h.module[:0], lane=h.lane[:0],
                               metrics={k: v[:0] for k, v in h.metrics.items()},
                               modules=module_table([])), p)
    with pytest.raises(ConfigError, match=r"empty.parquet: the history table holds no"):
        stream_features(str(p))
    with pytest.raises(ConfigError, match=r"nope.parquet: cannot read"):
        stream_features(str(tmp_path / "nope.parquet"))


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.mark.parametrize("command", ["grade", "predict"])
def test_cli_stream_flag_same_json(fleet: Path, command: str) -> None:
    hist, links = str(fleet / "history.parquet"), str(fleet / "links.csv")
    runner = CliRunner()
    whole = runner.invoke(_app(), ["optics", command, hist, "--links", links, "--json",
                                   "--no-stream"])
    assert whole.exit_code == 0, whole.output
    streamed = runner.invoke(_app(), ["optics", command, hist, "--links", links, "--json",
                                      "--stream"])
    assert streamed.exit_code == 0, streamed.output
    assert "streamed" in streamed.stderr and "(100 %)" in streamed.stderr
    assert json.loads(streamed.stdout) == json.loads(whole.stdout)


def test_cli_help_examples_with_stream(fleet: Path) -> None:
    runner = CliRunner()
    hist, links = str(fleet / "history.parquet"), str(fleet / "links.csv")
    for args in (["optics", "grade", hist, "--links", links, "--stream"],
                 ["optics", "predict", hist, "--links", links, "--stream", "--top", "10"]):
        r = runner.invoke(_app(), args)
        assert r.exit_code == 0, r.output
        assert "leaf-" in r.stdout
    bad = runner.invoke(_app(), ["optics", "grade", hist, links, "--stream"])
    assert bad.exit_code != 0
    assert "--stream: needs exactly one Parquet history table" in str(bad.exception or
                                                                      bad.output)

