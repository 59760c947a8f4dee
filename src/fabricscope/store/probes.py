"""DuckDB storage of probe samples (batch inserts through Arrow) and optional JSON lines.

Table ``probes`` (one row per probe)::

    src, dst          VARCHAR  NIC ids
    src_ip, dst_ip    VARCHAR  the 5-tuple ...
    src_port, dst_port INTEGER
    proto             SMALLINT
    seq               BIGINT   prober sequence number
    t_send_ns         BIGINT   prober clock
    t_resp_rx_ns      BIGINT   responder clock (NULL when lost)
    t_resp_tx_ns      BIGINT   responder clock (NULL when lost)
    t_recv_ns         BIGINT   prober clock (NULL when lost)
    status            SMALLINT 0 answered, 1 request lost, 2 reply lost, 3 lost (unknown)
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, overload

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from fabricscope.model.errors import TraceFormatError, TransportError
from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.probe.analysis import (
    ANSWERED,
    LOST_UNKNOWN,
    REQUEST_LOST,
    FlowKey,
    FlowStats,
    Observations,
    ResponderTimes,
    WindowTotals,
)
from fabricscope.store.db import open_db

SCHEMA = """
CREATE TABLE IF NOT EXISTS probes (
    src VARCHAR NOT NULL, dst VARCHAR NOT NULL,
    src_ip VARCHAR NOT NULL, dst_ip VARCHAR NOT NULL,
    src_port INTEGER NOT NULL, dst_port INTEGER NOT NULL, proto SMALLINT NOT NULL,
    seq BIGINT NOT NULL, t_send_ns BIGINT NOT NULL,
    t_resp_rx_ns BIGINT, t_resp_tx_ns BIGINT, t_recv_ns BIGINT,
    status SMALLINT NOT NULL
);
"""
_COLS = ("src", "dst", "src_ip", "dst_ip", "src_port", "dst_port", "proto", "seq", "t_send_ns",
         "t_resp_rx_ns", "t_resp_tx_ns", "t_recv_ns", "status")
_KEY_NAMES = ("src", "dst", "src_ip", "dst_ip", "src_port", "dst_port", "proto")
_KEYS = ", ".join(_KEY_NAMES)
_ARROW = pa.schema([
    ("src", pa.string()), ("dst", pa.string()), ("src_ip", pa.string()), ("dst_ip", pa.string()),
    ("src_port", pa.int32()), ("dst_port", pa.int32()), ("proto", pa.int16()), ("seq", pa.int64()),
    ("t_send_ns", pa.int64()), ("t_resp_rx_ns", pa.int64()), ("t_resp_tx_ns", pa.int64()),
    ("t_recv_ns", pa.int64()), ("status", pa.int16()),
])


def _status(s: ProbeSample, status: int | None) -> int:
    if status is not None:
        return status
    return ANSWERED if s.t_recv_ns is not None else LOST_UNKNOWN


class ProbeStore:
    """One DuckDB file (``":memory:"`` for tests) holding the ``probes`` table."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        self.con = open_db(self.path, SCHEMA)

    def insert(self, samples: Sequence[ProbeSample], statuses: Sequence[int | None] | None = None) -> int:
        """Insert a batch (one Arrow insert); returns the number of rows."""
        if not samples:
            return 0
        st = statuses if statuses is not None else [None] * len(samples)
        table = pa.Table.from_pydict({
            "src": [s.src for s in samples], "dst": [s.dst for s in samples],
            "src_ip": [s.flow.src_ip for s in samples], "dst_ip": [s.flow.dst_ip for s in samples],
            "src_port": [s.flow.src_port for s in samples], "dst_port": [s.flow.dst_port for s in samples],
            "proto": [s.flow.proto for s in samples], "seq": [s.seq for s in samples],
            "t_send_ns": [s.t_send_ns for s in samples],
            "t_resp_rx_ns": [s.t_resp_rx_ns for s in samples],
            "t_resp_tx_ns": [s.t_resp_tx_ns for s in samples],
            "t_recv_ns": [s.t_recv_ns for s in samples],
            "status": [_status(s, x) for s, x in zip(samples, st, strict=True)],
        }, schema=_ARROW)
        self._insert_arrow(table)
        return len(samples)

    def insert_observations(self, obs: Observations) -> int:
        """Insert columnar observations (the twin's probes) in one Arrow insert; lost probes
        get NULL times, ``seq`` counts each flow's probes (in the order of ``obs``).

        The flow-key columns are made once per flow and gathered per probe in Arrow
        (``take`` by ``obs.flow``), so no per-probe Python object is made. Plain strings, not
        dictionary arrays: DuckDB inserts them ~30 % faster.
        """
        n = len(obs)
        if n == 0:
            return 0
        flow = np.asarray(obs.flow, dtype=np.int64)
        order = np.argsort(flow, kind="stable")
        seq = np.empty(n, dtype=np.int64)
        sorted_flow = flow[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_flow)) + 1]
        seq[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        idx = pa.array(flow.astype(np.int32))
        src, dst, src_ip, dst_ip, sport, dport, proto = _key_columns(obs.flows)

        def keyed(values: Sequence[str]) -> pa.Array:
            return pa.array(values, type=pa.string()).take(idx)

        def ints(values: Sequence[int], dtype: type[np.signedinteger[Any]]) -> pa.Array:
            return pa.array(np.asarray(values, dtype=dtype).reshape(-1)[flow])

        lost = obs.t_recv_ns < 0
        status = obs.status if obs.status is not None else np.where(lost, LOST_UNKNOWN, ANSWERED)
        table = pa.Table.from_arrays([
            keyed(src), keyed(dst), keyed(src_ip), keyed(dst_ip),
            ints(sport, np.int32), ints(dport, np.int32), ints(proto, np.int16), pa.array(seq),
            pa.array(np.asarray(obs.t_send_ns, dtype=np.int64)),
            pa.array(np.asarray(obs.t_resp_rx_ns, dtype=np.int64), mask=lost),
            pa.array(np.asarray(obs.t_resp_tx_ns, dtype=np.int64), mask=lost),
            pa.array(np.asarray(obs.t_recv_ns, dtype=np.int64), mask=lost),
            pa.array(np.asarray(status, dtype=np.int16)),
        ], names=list(_COLS))
        self._insert_arrow(table)
        return n

    @classmethod
    def merged(cls, paths: Sequence[str | Path]) -> ProbeStore:
        """An in-memory store holding the ``probes`` rows of several files (one per agent),
        each attached read-only: analysis never writes to (or creates tables in) the inputs."""
        store = cls(":memory:")
        for i, p in enumerate(paths):
            alias = f"src{i}"
            try:
                store.con.execute(f"ATTACH '{str(p).replace(chr(39), chr(39) * 2)}' AS {alias} (READ_ONLY)")
                tables = [str(r[0]) for r in store.con.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_catalog = ?",
                    [alias]).fetchall()]
                if "probes" not in tables:
                    store.close()
                    raise TransportError(
                        f"duckdb {p}: no table 'probes' (expected a file written by `probe agent "
                        f"--db` or `probe twin --db`; it has {', '.join(sorted(tables)) or 'no tables'})")
                store.con.execute(f"INSERT INTO probes SELECT {', '.join(_COLS)} FROM {alias}.probes")
                store.con.execute(f"DETACH {alias}")
            except duckdb.Error as exc:
                store.close()
                raise TransportError(f"duckdb {p}: cannot read table probes: {exc}") from exc
        return store

    def _insert_arrow(self, table: pa.Table) -> None:
        try:
            self.con.register("_probe_batch", table)
            self.con.execute(f"INSERT INTO probes SELECT {', '.join(_COLS)} FROM _probe_batch")
            self.con.unregister("_probe_batch")
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: insert into probes: {exc}") from exc

    def count(self) -> int:
        row = self.con.execute("SELECT count(*) FROM probes").fetchone()
        return int(row[0]) if row else 0

    def samples(self) -> list[ProbeSample]:
        """Every stored sample as records (small tables; prefer :meth:`observations`)."""
        rows = self.con.execute(f"SELECT {', '.join(_COLS)} FROM probes ORDER BY t_send_ns").fetchall()
        return [ProbeSample(r[0], r[1], FiveTuple(r[2], r[3], r[4], r[5], r[6]), r[7], r[8], r[9], r[10], r[11])
                for r in rows]

    def observations(self, *, t0_ns: int | None = None, t1_ns: int | None = None) -> Observations:
        """The probes sent in ``[t0_ns, t1_ns)`` (either bound optional) as the analysis'
        columns.

        ``flows`` holds the distinct flows of the window in key order (src, dst, src_ip,
        dst_ip, src_port, dst_port, proto), ``flow[i]`` indexes it; probes are in send-time
        order (ties by flow, then ``seq``); lost probes have -1 times. An empty window gives
        empty columns.

        Cost: the distinct flows are numbered first and every probe gets its number by a
        hash join on the keys, so only the flows, never the probes, become Python objects
        (a 4.9 M-probe window: see docs/benchmarks/diagnosis-advisor.md).
        """
        w, params = _window_clause(t0_ns, t1_ns)
        name = f"_probe_flows_{id(self):x}"
        try:
            keys = self._arrow(
                f"SELECT {_KEYS} FROM (SELECT DISTINCT {_KEYS} FROM probes {w}) ORDER BY {_KEYS}",
                params)
            fid = pa.array(np.arange(keys.num_rows, dtype=np.int64))
            self.con.register(name, keys.append_column("fid", fid))
            try:
                t = self._arrow(f"""
                    SELECT k.fid, p.t_send_ns, coalesce(p.t_resp_rx_ns, -1) AS rx,
                           coalesce(p.t_resp_tx_ns, -1) AS tx, coalesce(p.t_recv_ns, -1) AS rv,
                           p.status, p.seq
                    FROM probes p JOIN {name} k USING ({_KEYS}) {w}""", params)
            finally:
                self.con.unregister(name)
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: cannot read table probes: {exc}") from exc
        cols = {c: np.asarray(t.column(c).to_numpy(), dtype=np.int64) for c in t.column_names}
        order = _send_order(cols["t_send_ns"], cols["fid"], cols["seq"])
        c = {k: v[order] for k, v in cols.items()}
        return Observations(_flow_keys(keys), c["fid"], c["t_send_ns"], c["rx"], c["tx"], c["rv"],
                            c["status"])

    def window_totals(self, *, t0_ns: int | None = None, t1_ns: int | None = None) -> WindowTotals:
        """The probes sent in ``[t0_ns, t1_ns)`` as per-flow totals (one GROUP BY): equal to
        ``WindowTotals.of(self.observations(...))`` without moving a probe into Python.

        Flows are in the same key order as :meth:`observations`.
        """
        w, params = _window_clause(t0_ns, t1_ns)
        try:
            t = self._arrow(f"""
                SELECT {_KEYS}, count(*) AS sent,
                       count(*) FILTER (WHERE t_recv_ns IS NULL) AS lost,
                       count(*) FILTER (WHERE t_recv_ns IS NULL AND status = {REQUEST_LOST}) AS lreq,
                       count(*) FILTER (WHERE t_recv_ns IS NULL
                                        AND status IN ({ANSWERED}, {LOST_UNKNOWN})) AS lunk
                FROM probes {w} GROUP BY {_KEYS} ORDER BY {_KEYS}""", params)
            row = self.con.execute(f"""
                SELECT count(*), min(t_send_ns), max(t_send_ns),
                       median({_PROC}) FILTER (WHERE t_recv_ns IS NOT NULL)
                FROM probes {w}""", params).fetchall()
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: cannot read table probes: {exc}") from exc
        n, lo, hi, med = row[0] if row else (0, None, None, None)
        n_flows = t.num_rows
        cnt = {c: np.asarray(t.column(c).to_numpy(), dtype=np.int64) for c in ("sent", "lost", "lreq", "lunk")}
        nan = np.full(n_flows, np.nan)
        stats = FlowStats(cnt["sent"], cnt["lost"], cnt["lreq"], cnt["lunk"], nan, nan.copy())
        return WindowTotals(StoredFlows(t.select(list(_KEY_NAMES))), stats,
                            (int(lo), int(hi)) if n else (0, 0), int(n or 0),
                            float(med) if med is not None else float("nan"))

    def responder_times(self, *, t0_ns: int | None = None, t1_ns: int | None = None) -> ResponderTimes:
        """Responder processing times of the window's answered probes, read on demand
        (:class:`~fabricscope.probe.analysis.ResponderTimes`)."""
        return _StoredResponders(self, *_window_clause(t0_ns, t1_ns))

    def _arrow(self, query: str, params: Sequence[object]) -> pa.Table:
        t = self.con.sql(query, params=list(params)).to_arrow_table()
        if t is None:
            raise TransportError(f"duckdb {self.path}: no result reading probes")
        return t

    def close(self) -> None:
        self.con.close()


_PROC = "coalesce(t_resp_tx_ns, -1) - coalesce(t_resp_rx_ns, -1)"


def _window_clause(t0_ns: int | None, t1_ns: int | None) -> tuple[str, list[object]]:
    where: list[str] = []
    params: list[object] = []
    if t0_ns is not None:
        where.append("t_send_ns >= ?")
        params.append(int(t0_ns))
    if t1_ns is not None:
        where.append("t_send_ns < ?")
        params.append(int(t1_ns))
    return (f"WHERE {' AND '.join(where)}" if where else ""), params


class _StoredResponders:
    """:class:`ResponderTimes` over one window of a probe store."""

    def __init__(self, store: ProbeStore, where: str, params: list[object]) -> None:
        self._store, self._params = store, params
        self._where = f"{where} AND t_recv_ns IS NOT NULL" if where else "WHERE t_recv_ns IS NOT NULL"

    def above(self, threshold_ns: float) -> tuple[Sequence[str], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        t = self._store._arrow(f"""
            SELECT dst, count(*) AS n, count(*) FILTER (WHERE {_PROC} > ?) AS k
            FROM probes {self._where} GROUP BY dst ORDER BY dst""",
            [float(threshold_ns), *self._params])
        return (t.column("dst").to_pylist(), np.asarray(t.column("n").to_numpy(), dtype=np.int64),
                np.asarray(t.column("k").to_numpy(), dtype=np.int64))

    def times(self, nics: Sequence[str]) -> npt.NDArray[np.float64]:
        if not nics:
            return np.zeros(0)
        marks = ", ".join("?" for _ in nics)
        t = self._store._arrow(f"SELECT {_PROC} AS p FROM probes {self._where} AND dst IN ({marks})",
                               [*self._params, *nics])
        return np.asarray(t.column("p").to_numpy(), dtype=np.float64)


def _send_order(t_send: npt.NDArray[np.int64], fid: npt.NDArray[np.int64],
                seq: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """The permutation sorting probes by (send time, flow, seq).

    The join hands rows back nearly in table (send-time) order, so one stable argsort of the
    send times (timsort: linear on long runs) does almost all of it; only runs of equal send
    times are then ordered by (flow, seq), which makes the result independent of the join's
    thread interleaving. Several times cheaper than a three-key lexsort over every probe.
    """
    order = np.argsort(t_send, kind="stable")
    ts = t_send[order]
    tie = ts[1:] == ts[:-1]
    if tie.any():
        # Whole groups of equal times, still contiguous in ``order``: sorting just them by
        # (time, flow, seq) leaves each group on the same positions.
        pos = np.flatnonzero(np.r_[tie, False] | np.r_[False, tie])
        sub = order[pos]
        order[pos] = sub[np.lexsort((seq[sub], fid[sub], t_send[sub]))]
    return order


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while ~10^6 flow tuples are made or taken apart.

    They hold only strings and ints (no cycles), and the collector's passes over a heap
    growing by that many tracked tuples take several times the work itself (measured 2.2 s
    against 0.3 s for 585,728 flows)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class StoredFlows(Sequence[FlowKey]):
    """The distinct flows of a window as Arrow columns; items are built on demand.

    Indexing gives ``(src NIC id, dst NIC id, FiveTuple)`` as a list of flows would (the
    whole list is built once, on the first iteration); :meth:`bind_nodes` sets ``src_node`` /
    ``dst_node`` (node indices, through the few distinct NIC ids) so the analysis vectorizes
    without touching 10^5-10^6 Python tuples (docs/benchmarks/diagnosis-advisor.md).
    """

    def __init__(self, keys: pa.Table) -> None:
        self._t = keys
        self._all: list[FlowKey] | None = None
        self.src_node: npt.NDArray[np.int64] | None = None
        self.dst_node: npt.NDArray[np.int64] | None = None

    def __len__(self) -> int:
        return int(self._t.num_rows)

    @overload
    def __getitem__(self, i: int) -> FlowKey: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[FlowKey]: ...

    def __getitem__(self, i: int | slice) -> FlowKey | Sequence[FlowKey]:
        if isinstance(i, slice) or self._all is not None:
            return self._items()[i]
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(i)
        v = [self._t.column(c)[j].as_py() for c in _KEY_NAMES]
        return v[0], v[1], FiveTuple(*v[2:])

    def __iter__(self) -> Iterator[FlowKey]:
        return iter(self._items())

    def _items(self) -> list[FlowKey]:
        if self._all is None:
            self._all = _flow_keys(self._t)
        return self._all

    def bind_nodes(self, node_of: Mapping[str, int]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(src_node, dst_node)`` of every flow through ``node_of`` (KeyError for an id it
        lacks), also kept as attributes."""
        out = []
        for c in ("src", "dst"):
            enc = pc.dictionary_encode(self._t.column(c)).combine_chunks()
            codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
            lut = np.array([node_of[x] for x in enc.dictionary.to_pylist()], dtype=np.int64)
            out.append(lut[codes] if codes.size else np.zeros(0, dtype=np.int64))
        self.src_node, self.dst_node = out
        return out[0], out[1]


def _flow_keys(keys: pa.Table) -> list[FlowKey]:
    """One (src, dst, FiveTuple) per row of the distinct-flow table."""
    strs = [keys.column(c).to_pylist() for c in ("src", "dst", "src_ip", "dst_ip")]
    ints = [np.asarray(keys.column(c).to_numpy()).tolist()
            for c in ("src_port", "dst_port", "proto")]
    with _gc_paused():
        fts = list(map(FiveTuple, strs[2], strs[3], *ints))
        return list(zip(strs[0], strs[1], fts, strict=True))


def _key_columns(flows: Sequence[FlowKey]) -> tuple[Sequence[Any], ...]:
    """The seven key columns of ``flows`` (src, dst, src_ip, dst_ip, src_port, dst_port,
    proto), one entry per flow."""
    if not flows:
        return ((),) * 7
    with _gc_paused():
        src, dst, fts = zip(*flows, strict=True)
        return (src, dst, *zip(*fts, strict=True))


def write_jsonl(samples: Iterable[tuple[ProbeSample, int]], fh: IO[str]) -> int:
    """Append samples as JSON lines (one object per probe); returns the count."""
    n = 0
    for s, status in samples:
        fh.write(json.dumps({
            "src": s.src, "dst": s.dst, "flow": list(s.flow), "seq": s.seq,
            "t_send_ns": s.t_send_ns, "t_resp_rx_ns": s.t_resp_rx_ns,
            "t_resp_tx_ns": s.t_resp_tx_ns, "t_recv_ns": s.t_recv_ns, "status": status,
        }) + "\n")
        n += 1
    return n


def read_jsonl(path: str | Path, *, errors: list[str] | None = None) -> Iterator[tuple[ProbeSample, int]]:
    """Samples from a JSON lines file; a malformed line is skipped and described in
    ``errors`` (file:line: reason) instead of aborting the rest."""
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 (closed below; the generator yields inside)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read probe samples: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                f = d["flow"]
                s = ProbeSample(str(d["src"]), str(d["dst"]),
                                FiveTuple(str(f[0]), str(f[1]), int(f[2]), int(f[3]), int(f[4])),
                                int(d["seq"]), int(d["t_send_ns"]), d.get("t_resp_rx_ns"),
                                d.get("t_resp_tx_ns"), d.get("t_recv_ns"))
                status = int(d.get("status", ANSWERED if s.t_recv_ns is not None else LOST_UNKNOWN))
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                msg = f"{path}:{lineno}: {type(exc).__name__}: {exc}"
                if errors is None:
                    raise TraceFormatError(msg) from exc
                errors.append(msg)
                continue
            yield s, status
