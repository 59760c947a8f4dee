"""Collector shards: the targets of one config split over worker processes, one DuckDB writer.

One Python process decodes at most ~one core's worth of updates (GIL). ``ShardedCollector``
runs ``workers`` :class:`Collector` processes (spawned, never forked: gRPC forbids fork after
init), each owning a share of the (connection, device) streams with its own processors and
detectors (series and ports never cross shards because a device lives in one shard). Workers
ship each batch to the parent as an Arrow IPC stream in the DuckDB ``telemetry`` schema, so the
parent's only per-event work is DuckDB's columnar insert; findings travel pickled.

In the parent, one reader thread per worker moves batches into a bounded queue and one writer
thread writes them to the sinks, retrying a failing sink with backoff (never rewriting a sink
that took the batch). While the sink is down the queue fills, the readers stop reading, the
pipes fill and each worker's own buffer pushes back on its targets: nothing that fits the
buffers is lost, and writing resumes when the sink does. Shutdown is bounded like
:class:`Collector`'s: past ``shutdown.deadline`` the parent spills what the sinks have not
taken (and everything the workers still send) to the spill file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry import selfmetrics
from fabricscope.telemetry.collector import (
    STALE_MARK,
    Collector,
    CollectorStats,
    TargetStats,
    auth_metadata,
    spill_path,
)
from fabricscope.telemetry.config import CollectorConfig, TargetConfig
from fabricscope.telemetry.spill import SpillBatch, append_spill, read_spill

log = logging.getLogger(__name__)

# Workers wait this much longer than the parent's deadline: the parent spills for them.
_WORKER_GRACE_NS = 30_000_000_000


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
        out.append(replace(cfg, targets=targets, sinks=(),
                           shutdown_deadline_ns=cfg.shutdown_deadline_ns + _WORKER_GRACE_NS))
    return out


class _PipeSink:
    """Worker side: batches -> Arrow IPC bytes (events) / pickle (findings) on a pipe."""

    def __init__(self, conn: Connection) -> None:
        from fabricscope.store.telemetry import EventTable

        self.conn = conn
        self.table = EventTable()
        self.lock = threading.Lock()  # the metrics sender shares the pipe

    def send(self, msg: bytes) -> None:
        try:
            with self.lock:
                self.conn.send_bytes(msg)
        except OSError as exc:  # the parent is gone
            raise TransportError(f"collector shard: pipe to the parent: {exc}") from exc

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        if events:
            t = self.table(events)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            self.send(b"E" + sink.getvalue().to_pybytes())
        if findings:
            self.send(b"F" + pickle.dumps(list(findings)))

    def close(self) -> None:
        pass


def _worker(cfg: CollectorConfig, conn: Connection, duration_s: float | None, stop: Any) -> None:
    """Worker process entry point: run one shard until ``duration_s`` or the stop event."""
    # Ctrl-C reaches the whole process group and systemd may signal the whole cgroup: the
    # parent alone decides when to stop (through ``stop``) so buffered data is never dropped.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipe = _PipeSink(conn)

    async def main() -> CollectorStats:
        col = Collector(cfg, sinks=[pipe], spill=False)

        async def watch() -> None:
            last = 0.0
            while not stop.is_set():
                await asyncio.sleep(0.1)
                if time.monotonic() - last >= 1.0:  # per-stream state for the parent's metrics
                    last = time.monotonic()
                    msg = b"M" + pickle.dumps((col.stats.received, col.stats.targets))
                    with contextlib.suppress(TransportError):
                        await asyncio.to_thread(pipe.send, msg)
            col.stop()

        w = asyncio.create_task(watch())
        try:
            return await col.run(duration_s=duration_s)
        finally:
            w.cancel()

    try:
        stats = asyncio.run(main())
        pipe.send(b"S" + pickle.dumps(stats))
    except Exception as exc:  # report, never hang the parent
        with contextlib.suppress(Exception):
            pipe.send(b"X" + pickle.dumps(f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class _Queue:
    """The parent's bounded queue of batches (rows counted), shared by readers and the writer."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.rows = 0
        self.high_water = 0
        self._q: deque[tuple[pa.Table | None, list[Finding]]] = deque()
        self._cv = threading.Condition()

    def put(self, item: tuple[pa.Table | None, list[Finding]], spilling: Callable[[], bool]) -> bool:
        """Queue ``item`` (waiting while full); False if the parent started spilling meanwhile."""
        n = item[0].num_rows if item[0] is not None else 0
        with self._cv:
            while self.rows > 0 and self.rows + n > self.max_rows:
                if spilling():
                    return False
                self._cv.wait(0.1)
            self._q.append(item)
            self.rows += n
            self.high_water = max(self.high_water, self.rows)
            self._cv.notify_all()
        return True

    def get(self, timeout: float) -> tuple[pa.Table | None, list[Finding]] | None:
        with self._cv:
            if not self._q:
                self._cv.wait(timeout)
            if not self._q:
                return None
            item = self._q.popleft()
            self.rows -= item[0].num_rows if item[0] is not None else 0
            self._cv.notify_all()
            return item

    def __len__(self) -> int:
        return len(self._q)


class ShardedCollector:
    """Run ``config`` over ``workers`` processes; the parent writes to ``sinks``.

    Sinks with ``write_table`` (DuckDB) receive the workers' Arrow batches as they are; other
    sinks receive events rebuilt from them.
    """

    def __init__(self, config: CollectorConfig, *, workers: int, sinks: Sequence[Any] | None = None,
                 on_findings: Callable[[list[Finding]], None] | None = None,
                 spill: Path | bool | None = None) -> None:
        from fabricscope.telemetry.sinks import build_sink

        self.cfg = config
        for t in config.targets:
            auth_metadata(config, t)  # a missing password-env fails here, not in a worker
        self.shards = shard_config(config, workers)
        self.stats = CollectorStats()
        self._queue = _Queue(config.buffer_max_events)
        self._received: dict[int, int] = {}
        self._timing = selfmetrics.SinkTiming()
        self._rate: deque[tuple[float, int]] = deque(maxlen=64)
        self.sinks = list(sinks) if sinks is not None else [
            build_sink(s.type, s.options, self_metrics=self.metric_samples) for s in config.sinks]
        self.on_findings = on_findings
        self.spill_file = spill_path(config) if spill is None or spill is True else (spill or None)
        self.stats.spill_file = str(self.spill_file or "")
        self._ctx = mp.get_context("spawn")
        self._stop = self._ctx.Event()
        self._deadline: float | None = None
        self._wake = threading.Event()
        self._ratelog = selfmetrics.RateLimitedLog(log)
        self._slock = threading.Lock()  # spill file and spill counters
        self.pids: list[int] = []

    # ------------------------------------------------------------------ health
    def self_metrics(self) -> dict[str, Any]:
        """The same snapshot as :meth:`Collector.self_metrics`, over all workers."""
        now = time.monotonic()
        received = sum(self._received.values())
        self.stats.received = received
        self._rate.append((now, received))
        t0, n0 = self._rate[0]
        return selfmetrics.snapshot(
            dict(self.stats.targets), received=received, written=self.stats.written,
            spilled=self.stats.spilled, buffer_events=self._queue.rows, buffer_max=self._queue.max_rows,
            buffer_high_water=self._queue.high_water, sink=self._timing,
            updates_per_s=(received - n0) / (now - t0) if now - t0 > 0.05 else 0.0)

    def metric_samples(self) -> list[tuple[str, str, Any, float]]:
        return selfmetrics.metric_samples(self.self_metrics())

    # ------------------------------------------------------------------ writing (threads)
    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _write_one(self, i: int, table: pa.Table | None, findings: list[Finding]) -> None:
        s = self.sinks[i]
        if table is not None and table.num_rows:
            if hasattr(s, "store"):
                s.store.write_table(table)
            elif hasattr(s, "write_table"):
                s.write_table(table)
            else:
                s.write(_events(table), [])
        if findings:
            s.write([], findings)

    def _spill(self, sinks: Sequence[int], table: pa.Table | None, findings: list[Finding]) -> None:
        events = _events(table) if table is not None and table.num_rows else []
        n = len(events)
        with self._slock:
            if self.spill_file is None:
                self.stats.lost += n
                self._ratelog.log(logging.ERROR, "spill", "none", "collector: shutdown deadline passed with events "
                                  "unwritten and no spill file configured (shutdown.spill-file): they are lost",
                                  time.monotonic())
                return
            try:
                append_spill(self.spill_file, [SpillBatch(tuple(sinks), events, findings)])
            except TransportError as exc:
                self.stats.lost += n
                log.error("collector: %d events could not be written or spilled: %s", n, exc)
                return
            self.stats.spilled += n
            self._ratelog.log(logging.WARNING, "spill", "spilled", f"collector: sinks did not take every batch by "
                              f"the shutdown deadline; spilling to {self.spill_file} (replayed on the next start)",
                              time.monotonic())

    def _deliver(self, table: pa.Table | None, findings: list[Finding], pending: Sequence[int] | None = None) -> bool:
        """Write one batch to every sink that has not taken it; spill past the deadline."""
        todo = list(range(len(self.sinks))) if pending is None else [i for i in pending if i < len(self.sinks)]
        delay = self.cfg.backoff_initial_ns / 1e9
        while todo:
            if self._past_deadline():
                self._spill(todo, table, findings)
                return False
            failed, err = selfmetrics.write_sinks(todo, lambda i: self._write_one(i, table, findings), self._timing)
            if not failed:
                break
            todo = failed
            self.stats.sink_retries += 1
            self._ratelog.log(logging.WARNING, "sink", "write", f"sink write failed ({err}); holding the batch, "
                              f"retrying with backoff up to {self.cfg.backoff_max_ns / 1e9:g}s", time.monotonic())
            self._wake.clear()
            wait = delay if self._deadline is None else min(delay, max(0.0, self._deadline - time.monotonic()))
            self._wake.wait(wait)
            delay = min(delay * 2, self.cfg.backoff_max_ns / 1e9)
        self._ratelog.reset("sink", "write")
        return True

    def _writer(self, readers_done: threading.Event) -> None:
        q = self._queue
        while True:
            item = q.get(0.1)
            if item is None:
                if readers_done.is_set() and not len(q):
                    return
                continue
            table, findings = item
            if self._deliver(table, findings) and table is not None:
                marks = int(pc.sum(pc.equal(table["name"], STALE_MARK)).as_py() or 0)
                self.stats.written += table.num_rows - marks

    def _reader(self, wid: int, conn: Connection, errors: list[str]) -> None:
        while True:
            try:
                msg = conn.recv_bytes()
            except (EOFError, OSError):
                return
            kind, body = msg[:1], msg[1:]
            if kind in (b"E", b"F"):
                item: tuple[pa.Table | None, list[Finding]]
                if kind == b"E":
                    item = (pa.ipc.open_stream(body).read_all(), [])
                else:
                    findings: list[Finding] = pickle.loads(body)
                    self.stats.findings += len(findings)
                    if self.on_findings is not None:
                        self.on_findings(findings)
                    item = (None, findings)
                if not self._queue.put(item, self._past_deadline):
                    self._spill(range(len(self.sinks)), *item)  # past the deadline: straight to the spill file
            elif kind == b"M":
                received, targets = pickle.loads(body)
                self._received[wid] = received
                self.stats.targets.update(targets)
            elif kind == b"S":
                st: CollectorStats = pickle.loads(body)
                self._received[wid] = st.received
                self.stats.sink_retries += st.sink_retries
                self.stats.targets.update(st.targets)
            elif kind == b"X":
                errors.append(pickle.loads(body))

    def _replay(self) -> None:
        """Write a previous run's spill file into the sinks (before the workers start)."""
        path = self.spill_file
        if path is None or not path.exists():
            return
        work = path.with_name(path.name + ".replay")
        if not work.exists():
            path.replace(work)
        batches, bad = read_spill(work)
        if path.exists():  # an earlier replay was cut short and a later run spilled again
            more, bad2 = read_spill(path)
            batches += more
            bad += bad2
            path.unlink()
        if bad:
            log.warning("collector: spill file %s: %d damaged line(s) skipped", path, bad)
        log.info("collector: replaying %d events from spill file %s", sum(len(b.events) for b in batches), path)
        from fabricscope.store.telemetry import EventTable

        to_table = EventTable()
        for k, b in enumerate(batches):
            table = to_table(b.events) if b.events else None
            if not self._deliver(table, b.findings, b.sinks):  # stopped again: it went back to ``path``
                for rest in batches[k + 1 :]:
                    self._spill(rest.sinks, to_table(rest.events) if rest.events else None, rest.findings)
                break
            self.stats.replayed += len(b.events)
            self.stats.written += len(b.events)
        work.unlink(missing_ok=True)

    # ------------------------------------------------------------------ run
    async def run(self, *, duration_s: float | None = None) -> CollectorStats:
        await asyncio.to_thread(self._replay)
        procs = []
        readers = []
        errors: list[str] = []
        t_end = None if duration_s is None else time.monotonic() + duration_s
        for wid, cfg in enumerate(self.shards):
            parent, child = self._ctx.Pipe(duplex=False)
            p = self._ctx.Process(target=_worker, args=(cfg, child, None, self._stop), daemon=True)
            p.start()
            self.pids.append(p.pid or 0)
            child.close()
            th = threading.Thread(target=self._reader, args=(wid, parent, errors), daemon=True)
            th.start()
            procs.append(p)
            readers.append(th)
        readers_done = threading.Event()
        writer = threading.Thread(target=self._writer, args=(readers_done,), daemon=True, name="shard-writer")
        writer.start()
        every = self.cfg.stats_interval_ns / 1e9
        next_stats = time.monotonic() + every if every > 0 else None
        try:
            while any(p.is_alive() for p in procs) and not self._stop.is_set():
                await asyncio.sleep(0.1)
                now = time.monotonic()
                if t_end is not None and now >= t_end:
                    break
                if next_stats is not None and now >= next_stats:
                    next_stats = now + every
                    log.info("%s", selfmetrics.summary_line(self.self_metrics()))
        finally:
            if not self._stop.is_set():
                self.stop()
            grace = self.cfg.shutdown_deadline_ns / 1e9 + _WORKER_GRACE_NS / 1e9 + 10
            for p in procs:
                await asyncio.to_thread(p.join, grace)
            for p in procs:
                if p.is_alive():
                    p.kill()
            for th in readers:
                await asyncio.to_thread(th.join, 30)
            readers_done.set()
            while writer.is_alive():
                await asyncio.to_thread(writer.join, 0.5)
                if writer.is_alive() and self._past_deadline():
                    # a sink write hangs past the deadline: spill what is queued and go
                    log.error("collector: a sink write is still running at the shutdown deadline; the "
                              "batches still queued are spilled (the one being written may land twice)")
                    while (item := self._queue.get(0)) is not None:
                        self._spill(range(len(self.sinks)), *item)
                    break
        self.stats.received = sum(self._received.values())
        if errors:
            raise TransportError(f"collector shard failed: {errors[0]}")
        bad = [p.exitcode for p in procs if p.exitcode not in (0, None)]
        if bad:
            raise TransportError(f"collector shard process exited with code {bad[0]}")
        return self.stats

    def stop(self, *, now: bool = False) -> None:
        """Like :meth:`Collector.stop`: a deadline to drain, a second call makes it now."""
        t = time.monotonic()
        if self._deadline is None and not now:
            self._deadline = t + self.cfg.shutdown_deadline_ns / 1e9
        elif self._stop.is_set() or now:
            self._deadline = t
        self._stop.set()
        self._wake.set()

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
