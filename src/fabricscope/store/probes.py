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

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from fabricscope.model.errors import TraceFormatError, TransportError
from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.probe.analysis import ANSWERED, LOST_UNKNOWN, Observations
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
        get NULL times, ``seq`` counts each flow's probes."""
        n = len(obs)
        if n == 0:
            return 0
        fl = obs.flows
        uniq, inv = np.unique(obs.flow, return_inverse=True)
        keys = [fl[int(j)] for j in uniq]
        order = np.argsort(obs.flow, kind="stable")
        seq = np.empty(n, dtype=np.int64)
        sorted_flow = obs.flow[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_flow)) + 1]
        seq[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))

        def pick(values: list[object]) -> list[object]:
            arr = np.asarray(values, dtype=object)
            out: list[object] = arr[inv].tolist()
            return out

        lost = obs.t_recv_ns < 0
        status = obs.status if obs.status is not None else np.where(lost, LOST_UNKNOWN, ANSWERED)
        table = pa.Table.from_pydict({
            "src": pick([k[0] for k in keys]), "dst": pick([k[1] for k in keys]),
            "src_ip": pick([k[2].src_ip for k in keys]), "dst_ip": pick([k[2].dst_ip for k in keys]),
            "src_port": pick([k[2].src_port for k in keys]), "dst_port": pick([k[2].dst_port for k in keys]),
            "proto": pick([k[2].proto for k in keys]), "seq": seq, "t_send_ns": obs.t_send_ns,
            "t_resp_rx_ns": pa.array(obs.t_resp_rx_ns, mask=lost),
            "t_resp_tx_ns": pa.array(obs.t_resp_tx_ns, mask=lost),
            "t_recv_ns": pa.array(obs.t_recv_ns, mask=lost),
            "status": np.asarray(status, dtype=np.int16),
        }, schema=_ARROW)
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
        """Stored probes as the analysis' columns (flows deduplicated in SQL)."""
        where = []
        if t0_ns is not None:
            where.append(f"t_send_ns >= {int(t0_ns)}")
        if t1_ns is not None:
            where.append(f"t_send_ns < {int(t1_ns)}")
        w = f"WHERE {' AND '.join(where)}" if where else ""
        q = f"""
            WITH p AS (SELECT *, dense_rank() OVER (ORDER BY src, dst, src_ip, dst_ip, src_port,
                       dst_port, proto) - 1 AS fid FROM probes {w})
            SELECT fid, src, dst, src_ip, dst_ip, src_port, dst_port, proto, t_send_ns,
                   coalesce(t_resp_rx_ns, -1), coalesce(t_resp_tx_ns, -1), coalesce(t_recv_ns, -1),
                   status
            FROM p ORDER BY t_send_ns
        """
        t = self.con.sql(q).to_arrow_table()
        if t is None:
            raise TransportError(f"duckdb {self.path}: no result reading probes")
        fid = t.column("fid").to_numpy().astype(np.int64)
        flows: list[tuple[str, str, FiveTuple]] = []
        if fid.size:
            _u, first = np.unique(fid, return_index=True)
            cols = {c: t.column(c).to_pylist() for c in ("src", "dst", "src_ip", "dst_ip", "src_port", "dst_port", "proto")}
            flows = [(cols["src"][i], cols["dst"][i],
                      FiveTuple(cols["src_ip"][i], cols["dst_ip"][i], cols["src_port"][i],
                                cols["dst_port"][i], cols["proto"][i])) for i in first.tolist()]

        def col(name: str) -> npt.NDArray[np.int64]:
            return np.asarray(t.column(name).to_numpy(), dtype=np.int64)

        return Observations(flows, fid, col("t_send_ns"), col(t.column_names[9]), col(t.column_names[10]),
                            col(t.column_names[11]), col("status"))

    def close(self) -> None:
        self.con.close()


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
