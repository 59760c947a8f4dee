"""Collector shards: the targets of one config split over worker processes, one DuckDB writer.

One Python process decodes at most ~one core's worth of updates (GIL). ``ShardedCollector``
runs ``workers`` :class:`Collector` processes (spawned, never forked: gRPC forbids fork after
init), each owning a share of the (connection, device) streams with its own processors and
detectors (series and ports never cross shards because a device lives in one shard). Workers
ship each batch to the parent as an Arrow IPC stream in the DuckDB ``telemetry`` schema, so the
parent's only per-event work is DuckDB's columnar insert; findings travel pickled.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.collector import Collector, CollectorStats, TargetStats, auth_metadata
from fabricscope.telemetry.config import CollectorConfig, TargetConfig


def shard_config(cfg: CollectorConfig, workers: int) -> list[CollectorConfig]:
    """Round-robin the (connection, device name) pairs of ``cfg`` into ``workers`` configs."""
    if workers < 1:
        raise ConfigError(f"{cfg.source}: workers: must be >= 1, got {workers!r}")
    pairs = [(t, n) for t in cfg.targets for n in t.names]
    shards: list[list[tuple[TargetConfig, str]]] = [[] for _ in range(min(workers, len(pairs)))]
    for i, p in enumerate(pairs):
        shards[i % len(shards)].append(p)
    out = []
    for sh in shards:
        by_conn: dict[str, tuple[TargetConfig, list[str]]] = {}
        for t, n in sh:
            by_conn.setdefault(t.name, (t, []))[1].append(n)
        targets = tuple(replace(t, names=tuple(ns)) for t, ns in by_conn.values())
        out.append(replace(cfg, targets=targets, sinks=()))
    return out


class _PipeSink:
    """Worker side: batches -> Arrow IPC bytes (events) / pickle (findings) on a pipe."""

    def __init__(self, conn: Connection) -> None:
        from fabricscope.store.telemetry import EventTable

        self.conn = conn
        self.table = EventTable()

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        if events:
            t = self.table(events)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            self.conn.send_bytes(b"E" + sink.getvalue().to_pybytes())
        if findings:
            self.conn.send_bytes(b"F" + pickle.dumps(list(findings)))

    def close(self) -> None:
        pass


def _worker(cfg: CollectorConfig, conn: Connection, duration_s: float | None, stop: Any) -> None:
    """Worker process entry point: run one shard until ``duration_s`` or the stop event."""

    async def main() -> CollectorStats:
        col = Collector(cfg, sinks=[_PipeSink(conn)])

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.1)
            col.stop()

        w = asyncio.create_task(watch())
        try:
            return await col.run(duration_s=duration_s)
        finally:
            w.cancel()

    try:
        stats = asyncio.run(main())
        conn.send_bytes(b"S" + pickle.dumps(stats))
    except Exception as exc:  # report, never hang the parent
        conn.send_bytes(b"X" + pickle.dumps(f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class ShardedCollector:
    """Run ``config`` over ``workers`` processes; the parent writes to ``sinks``.

    Sinks with ``write_table`` (DuckDB) receive the workers' Arrow batches as they are; other
    sinks receive events rebuilt from them.
    """

    def __init__(self, config: CollectorConfig, *, workers: int, sinks: Sequence[Any] | None = None,
                 on_findings: Callable[[list[Finding]], None] | None = None) -> None:
        from fabricscope.telemetry.sinks import build_sink

        self.cfg = config
        for t in config.targets:
            auth_metadata(config, t)  # a missing password-env fails here, not in a worker
        self.shards = shard_config(config, workers)
        self.sinks = list(sinks) if sinks is not None else [build_sink(s.type, s.options) for s in config.sinks]
        self.on_findings = on_findings
        self.stats = CollectorStats()
        self._lock = threading.Lock()
        self._ctx = mp.get_context("spawn")
        self._stop = self._ctx.Event()
        self.pids: list[int] = []

    def _write_table(self, table: pa.Table) -> None:
        for s in self.sinks:
            if hasattr(s, "store"):
                s.store.write_table(table)
            elif hasattr(s, "write_table"):
                s.write_table(table)
            else:
                s.write(_events(table), [])

    def _reader(self, conn: Connection, errors: list[str]) -> None:
        while True:
            try:
                msg = conn.recv_bytes()
            except (EOFError, OSError):
                return
            kind, body = msg[:1], msg[1:]
            with self._lock:  # one writer: DuckDB and the stats
                if kind == b"E":
                    table = pa.ipc.open_stream(body).read_all()
                    self.stats.received += table.num_rows
                    self._write_table(table)
                    self.stats.written += table.num_rows
                elif kind == b"F":
                    findings: list[Finding] = pickle.loads(body)
                    self.stats.findings += len(findings)
                    for s in self.sinks:
                        s.write([], findings)
                    if self.on_findings is not None:
                        self.on_findings(findings)
                elif kind == b"S":
                    st: CollectorStats = pickle.loads(body)
                    self.stats.sink_retries += st.sink_retries
                    for k, v in st.targets.items():
                        self.stats.targets[k] = v
                elif kind == b"X":
                    errors.append(pickle.loads(body))

    async def run(self, *, duration_s: float | None = None) -> CollectorStats:
        procs = []
        threads = []
        errors: list[str] = []
        for cfg in self.shards:
            parent, child = self._ctx.Pipe(duplex=False)
            p = self._ctx.Process(target=_worker, args=(cfg, child, duration_s, self._stop), daemon=True)
            p.start()
            self.pids.append(p.pid or 0)
            child.close()
            th = threading.Thread(target=self._reader, args=(parent, errors), daemon=True)
            th.start()
            procs.append(p)
            threads.append(th)
        try:
            while any(p.is_alive() for p in procs) and not self._stop.is_set():
                await asyncio.sleep(0.1)
        finally:
            self._stop.set()
            for p in procs:
                await asyncio.to_thread(p.join, 30)
            for th in threads:
                await asyncio.to_thread(th.join, 30)
            for p in procs:
                if p.is_alive():
                    p.kill()
        if errors:
            raise TransportError(f"collector shard failed: {errors[0]}")
        bad = [p.exitcode for p in procs if p.exitcode not in (0, None)]
        if bad:
            raise TransportError(f"collector shard process exited with code {bad[0]}")
        return self.stats

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        for s in self.sinks:
            with contextlib.suppress(Exception):
                s.close()


def _events(table: pa.Table) -> list[TelemetryEvent]:
    import json

    cols = table.to_pydict()
    out = []
    for ts, tgt, name, tags, num, txt in zip(cols["ts_ns"], cols["target"], cols["name"], cols["tags"],
                                             cols["value_num"], cols["value_str"], strict=True):
        out.append(TelemetryEvent(name, ts, tgt, json.loads(tags), txt if num is None else num))
    return out


__all__ = ["ShardedCollector", "TargetStats", "shard_config"]
