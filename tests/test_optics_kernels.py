"""The compiled kernels of the optics history equal the numpy code they replace, bit for bit.

``grid_pieces`` (numba) against ``grid_chunk_numpy`` (the former numpy segment sums) on
seeded random lanes: regular and irregular sampling, missing samples in gauges and counters
(the masked counter path), counter resets, lanes that start before or inside the grid, a
lane chunk cut into pieces; and the streaming reader's fast path (repeated samples dropped
while the batches are appended) against the whole-table reader, including a switch to the
general path late in the file. Synthetic data: the property is an identity, no sample size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fabricscope.optics.features import (
    HOUR_NS,
    GridPiece,
    LaneGrid,
    first_after,
    grid_chunk,
    grid_chunk_numpy,
    grid_pieces,
)
from fabricscope.optics.history import ALL_METRICS, FleetHistory, module_table
from fabricscope.optics.readers.table import HistoryChunks, read_history, write_history

S = 10**9


def _history(seed: int, *, step_s: int, nanp: float, cnan: float, reset: float,
             n_lanes: int = 40, days: int = 10) -> FleetHistory:
    rng = np.random.default_rng(seed)
    ts_l, mod_l, lane_l = [], [], []
    for k in range(n_lanes):
        n = int(days * 86400 / step_s * rng.uniform(0.3, 1.0))
        t0 = int(rng.integers(0, 5 * 86400)) * S
        # irregular steps of 0.5 to 1.5 sampling intervals
        ts_l.append(t0 + np.cumsum(rng.integers(1, 4, size=n) * step_s * S // 2))
        mod_l.append(np.full(n, k // 4))
        lane_l.append(np.full(n, k % 4))
    ts = np.concatenate(ts_l).astype(np.int64)
    n = ts.shape[0]
    met: dict[str, np.ndarray] = {}
    for m in ("temperature_c", "vcc_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm",
              "pre_fec_ber"):
        x = (rng.normal(size=n) * 10 + 40).astype(np.float32)
        x[rng.random(n) < nanp] = np.nan
        met[m] = x
    met["pre_fec_ber"] = np.abs(met["pre_fec_ber"]) * np.float32(1e-7)
    met["laser_temp_c"] = np.full(n, np.nan, dtype=np.float32)  # an absent optional column
    for m in ("fec_uncorrectable", "crc_errors"):
        c = np.cumsum(rng.poisson(3, size=n)).astype(np.float64) * 1e7
        r = rng.random(n) < reset
        c[r] = rng.integers(0, 5, size=int(r.sum()))
        c[rng.random(n) < cnan] = np.nan
        met[m] = c
    return FleetHistory(ts=ts, module=np.concatenate(mod_l).astype(np.int32),
                        lane=np.concatenate(lane_l).astype(np.int32), metrics=met,
                        modules=module_table([{}] * (n_lanes // 4 + 1)))


def _same_grid(a: LaneGrid, b: LaneGrid) -> None:
    for part in ("mean", "count", "sumsq", "inc", "last"):
        da, db = getattr(a, part), getattr(b, part)
        assert set(da) == set(db), part
        for k in da:
            np.testing.assert_array_equal(da[k], db[k], err_msg=f"{part}.{k}")
            np.testing.assert_array_equal(np.signbit(da[k]), np.signbit(db[k]),
                                          err_msg=f"{part}.{k} sign")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("step_s", [60, 600, 1800])
@pytest.mark.parametrize(("nanp", "cnan", "reset"), [(0.0, 0.0, 0.0), (0.05, 0.0, 0.01),
                                                     (0.02, 0.01, 0.02)])
def test_grid_kernel_equals_numpy_segment_sums(seed: int, step_s: int, nanp: float,
                                               cnan: float, reset: float) -> None:
    h = _history(seed, step_s=step_s, nanp=nanp, cnan=cnan, reset=reset)
    key = h.module.astype(np.int64) * 64 + h.lane
    cut = np.flatnonzero(np.diff(key)) + 1
    starts = np.concatenate([[0], cut]).astype(np.int64)
    ends = np.concatenate([cut, [key.shape[0]]]).astype(np.int64)
    rng = np.random.default_rng(100 + seed)
    at = int(h.ts.max()) - int(rng.integers(0, 2 * 86400)) * S
    nb = int(rng.choice([24 * 7, 24 * 10, 24 * 12]))
    g0 = first_after(h.ts, starts, ends, at - nb * HOUR_NS)
    g1 = first_after(h.ts, g0, ends, at)
    assert (g1 > g0).sum() > 10
    ref = grid_chunk_numpy(h, 0, len(h), starts, g0, g1, at, nb, 168, 72)
    _same_grid(grid_chunk(h, 0, len(h), starts, g0, g1, at, nb, 168, 72), ref)
    # the same chunk in three pieces (the streaming reader's read chunks)
    cuts = sorted(rng.choice(np.arange(1, starts.shape[0]), size=2, replace=False).tolist())
    pieces = []
    for a, b in zip([0, *cuts], [*cuts, starts.shape[0]], strict=True):
        r0, r1 = int(starts[a]), int(ends[b - 1])
        pieces.append(GridPiece(ts=h.ts[r0:r1], metrics={m: v[r0:r1] for m, v in
                                                         h.metrics.items()},
                                starts=starts[a:b] - r0, g0=g0[a:b] - r0, g1=g1[a:b] - r0))
    _same_grid(grid_pieces(pieces, at, nb, 168, 72), ref)
    if cnan:
        assert "crc_errors" in ref.inc  # the masked counter path was taken and matched


def _fleet_file(tmp_path: Path, *, jump_row: int | None) -> Path:
    rng = np.random.default_rng(3)
    n_mod, n_lane, n_t = 40, 2, 200
    ts = np.tile(1_700_000_000 * S + np.arange(n_t, dtype=np.int64) * 600 * S, n_mod * n_lane)
    module = np.repeat(np.arange(n_mod, dtype=np.int32), n_lane * n_t)
    lane = np.tile(np.repeat(np.arange(n_lane, dtype=np.int32), n_t), n_mod)
    n = ts.shape[0]
    met = {m: np.asarray(rng.normal(3.0, 0.1, n), dtype=np.float32) for m in ALL_METRICS}
    met["fec_uncorrectable"] = np.tile(np.arange(n_t, dtype=np.float64), n_mod * n_lane)
    met["crc_errors"] = met["fec_uncorrectable"].copy()
    rows = [{"device": f"leaf{i % 3}", "port": f"Ethernet{i}", "vendor": "V",
             "part_number": "P", "serial": f"S{i}", "media": "400GBASE-DR4"}
            for i in range(n_mod)]
    h = FleetHistory(ts=ts, module=module, lane=lane, metrics=met,
                     modules=module_table(rows, lanes=[n_lane] * n_mod))
    p = tmp_path / "h.parquet"
    write_history(h, p)
    t = pq.read_table(p)
    idx = list(range(t.num_rows))
    for r in range(37, t.num_rows, 611):  # a repeated sample every few batches
        idx.insert(idx.index(r) + 1, r)
    if jump_row is not None:  # a clock jump late in the file: the general path from there
        i = idx.index(jump_row)
        idx[i], idx[i + 1] = idx[i + 1], idx[i]
    t = t.take(pa.array(idx))
    fec = t.column("fec_uncorrectable").to_numpy().copy()
    fec[[2222, 9001]] = 0.0  # counter resets
    t = t.set_column(t.schema.get_field_index("fec_uncorrectable"), "fec_uncorrectable",
                     pa.array(fec))
    q = tmp_path / "h2.parquet"
    pq.write_table(t, q, row_group_size=1_500)
    return q


@pytest.mark.parametrize("jump_row", [None, 12_345])
def test_fast_reader_path_equals_whole_table(tmp_path: Path, jump_row: int | None) -> None:
    q = _fleet_file(tmp_path, jump_row=jump_row)
    ref = read_history(q, chunked=False)
    text = "\n".join(ref.warnings)
    assert "duplicated samples" in text and "fec_uncorrectable: 2 counter resets" in text
    assert ("go back in time" in text) == (jump_row is not None)
    reader = HistoryChunks(q, batch_rows=500, min_rows=2_000)
    got = []
    for c in reader:  # copied and dropped one by one, so the reader's buffers are reused
        got.append((c.ts.copy(), c.module.copy(), {m: v.copy() for m, v in c.metrics.items()}))
    assert len(got) > 4
    assert reader.warnings == ref.warnings
    np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), ref.ts)
    np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), ref.module)
    for m in ALL_METRICS:
        np.testing.assert_array_equal(np.concatenate([g[2][m] for g in got]), ref.metrics[m])
    np.testing.assert_array_equal(reader.modules.lanes, ref.modules.lanes)
