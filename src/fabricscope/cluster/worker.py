"""The analysis worker: a durable JetStream pull consumer that runs the detectors on the bus.

It fetches telemetry batches, decodes them, drops duplicates (:class:`Deduplicator`, bounded
memory), runs a :class:`~fabricscope.telemetry.detectors.DetectorSet`, publishes the findings
to ``fs.findings.<kind>`` and only then acks the batch (explicit ack after processing:
at-least-once). A restarted worker with the same durable name resumes where the acked
position is; ``max_ack_pending`` bounds the un-acked work (the back-pressure), and the lag
(``num_pending`` of the consumer) is exported in :class:`WorkerStats`.
Consumer semantics follow the NATS JetStream documentation ("Consumers": AckExplicit,
AckWait, MaxAckPending, durable pull consumers). See ``docs/design/cluster-bus.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from fabricscope.cluster.bus import BusConfig, connect, ensure_streams, findings_subject
from fabricscope.cluster.encoding import BatchFormatError, batch_id, decode_events, encode_findings
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.detectors import DetectorSet, default_detectors
from fabricscope.telemetry.selfmetrics import RateLimitedLog

__all__ = ["Deduplicator", "Worker", "WorkerStats"]

log = logging.getLogger(__name__)

_Series = tuple[str, str, tuple[tuple[str, str], ...]]


class Deduplicator:
    """Exact de-duplication of events by ``(target, name, tags, ts_ns)`` in bounded memory.

    The ``max_recent`` most recent keys are held exactly (insertion order, oldest evicted).
    For every series ``(target, name, tags)`` it keeps the newest ``ts_ns`` ever evicted (its
    *floor*). An event is a duplicate when its key is held, or when its ``ts_ns`` is at or
    below its series' floor: such an event was either seen (and evicted) or arrives later
    than ``max_recent`` newer keys — the worker cannot tell, drops it and counts it in
    ``late``. An event above the floor and not held has never been seen, so nothing new is
    ever dropped while the stream is replayed within ``max_recent`` keys. ``max_series``
    bounds the floors (the oldest series' floor is forgotten first).
    """

    def __init__(self, *, max_recent: int = 200_000, max_series: int = 1_000_000) -> None:
        if max_recent < 1 or max_series < 1:
            raise ConfigError(f"dedup: max_recent={max_recent} and max_series={max_series} must be >= 1")
        self.max_recent = max_recent
        self.max_series = max_series
        self._recent: dict[tuple[str, str, tuple[tuple[str, str], ...], int], None] = {}
        self._floor: dict[_Series, int] = {}
        self.duplicates = 0
        self.late = 0

    def __len__(self) -> int:
        return len(self._recent)

    def filter(self, events: Sequence[TelemetryEvent]) -> list[TelemetryEvent]:
        """The events of ``events`` not seen before, in order (and remembers them)."""
        recent = self._recent
        floor = self._floor
        memo: dict[int, tuple[tuple[str, str], ...]] = {}
        out: list[TelemetryEvent] = []
        for e in events:
            tags: Mapping[str, str] = e.tags
            tk = memo.get(id(tags))
            if tk is None:
                tk = memo[id(tags)] = tuple(sorted(tags.items()))
            key = (e.target, e.name, tk, e.ts_ns)
            if key in recent:
                self.duplicates += 1
                continue
            fl = floor.get((e.target, e.name, tk))
            if fl is not None and e.ts_ns <= fl:
                self.duplicates += 1
                self.late += 1
                continue
            recent[key] = None
            out.append(e)
        over = len(recent) - self.max_recent
        if over > 0:
            it = iter(recent)
            old = [next(it) for _ in range(over)]
            for k in old:
                del recent[k]
                s: _Series = (k[0], k[1], k[2])
                prev = floor.pop(s, None)
                floor[s] = k[3] if prev is None or k[3] > prev else prev
            extra = len(floor) - self.max_series
            if extra > 0:
                it2 = iter(floor)
                for s in [next(it2) for _ in range(extra)]:
                    del floor[s]
        return out


@dataclass
class WorkerStats:
    """Counters of a :class:`Worker` since start; ``lag`` / ``ack_pending`` from consumer info."""

    batches: int = 0
    redelivered_batches: int = 0
    events: int = 0
    unique_events: int = 0
    duplicate_events: int = 0
    late_events: int = 0
    decode_errors: int = 0
    findings_published: int = 0
    publish_retries: int = 0
    lag: int = 0
    ack_pending: int = 0
    connected: bool = False

    def metric_samples(self, prefix: str = "fabricscope_bus_worker") -> list[tuple[str, str, dict[str, str], float]]:
        """As Prometheus samples ``(name, "counter" | "gauge", labels, value)``."""
        gauges = {"lag", "ack_pending", "connected"}
        return [(f"{prefix}_{k}" + ("" if k in gauges else "_total"), "gauge" if k in gauges else "counter", {},
                 float(v)) for k, v in asdict(self).items()]


class Worker:
    """A durable detector worker on the telemetry stream.

    ``durable``: the consumer name (workers sharing it share the work; a restart resumes it).
    ``on_events``: called with each batch's new (de-duplicated) events before the detectors.
    ``fetch_batch``: messages per pull; ``ack_wait_s``: redelivery after this long un-acked;
    ``max_ack_pending``: the most un-acked messages the server hands this consumer.
    """

    def __init__(self, config: BusConfig | None = None, *, durable: str = "fs-detectors",
                 detectors: DetectorSet | None = None,
                 on_events: Callable[[list[TelemetryEvent]], None] | None = None,
                 filter_subject: str | None = None, fetch_batch: int = 16, fetch_timeout_s: float = 0.5,
                 ack_wait_s: float = 30.0, max_ack_pending: int = 256, dedup: Deduplicator | None = None,
                 create_streams: bool = True, lag_interval_s: float = 1.0, compress: bool = True,
                 on_stats: Callable[[WorkerStats], None] | None = None) -> None:
        if not durable or any(c in durable for c in " .*>\t"):
            raise ConfigError(f"worker: durable: {durable!r} is not a valid consumer name")
        if fetch_batch < 1 or max_ack_pending < 1 or ack_wait_s <= 0:
            raise ConfigError(f"worker: fetch_batch={fetch_batch}, max_ack_pending={max_ack_pending}, "
                              f"ack_wait_s={ack_wait_s} must be positive")
        self.config = config or BusConfig()
        self.durable = durable
        self.detectors = detectors if detectors is not None else default_detectors()
        self.on_events = on_events
        self.filter_subject = filter_subject or f"{self.config.telemetry_prefix}.>"
        self.stream = self.config.telemetry_stream  # a subclass consumes another stream
        self.finding_source = "telemetry"  # the Fs-Source header of the findings it publishes
        self.replay = False  # True: start over from the stream's first message on every run
        self.fetch_batch = fetch_batch
        self.fetch_timeout_s = fetch_timeout_s
        self.ack_wait_s = ack_wait_s
        self.max_ack_pending = max_ack_pending
        self.dedup = dedup or Deduplicator()
        self.create_streams = create_streams
        self.lag_interval_s = lag_interval_s
        self.on_stats = on_stats  # called after every lag read (lag_interval_s) and at the end
        self.compress = compress
        self._stats = WorkerStats()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ratelog = RateLimitedLog(log, 30.0)

    def stats(self) -> WorkerStats:
        """The counters now (dedup counts folded in)."""
        self._stats.duplicate_events = self.dedup.duplicates
        self._stats.late_events = self.dedup.late
        return self._stats

    def stop(self) -> None:
        """Ask :meth:`run` to finish the batch in hand, ack it and return (thread-safe)."""
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)

    async def run(self, *, until: Callable[[WorkerStats], bool] | None = None,
                  duration_s: float | None = None) -> WorkerStats:
        """Consume until :meth:`stop`, ``until(stats)`` is true, or ``duration_s`` passed."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        end = time.monotonic() + duration_s if duration_s is not None else float("inf")

        async def _down() -> None:
            self._stats.connected = False

        async def _up() -> None:
            self._stats.connected = True

        nc = await connect(self.config, disconnected_cb=_down, reconnected_cb=_up)
        self._stats.connected = True
        try:
            js = nc.jetstream(timeout=max(2.0, self.config.connect_timeout_s))
            cc = ConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT,
                                deliver_policy=DeliverPolicy.ALL, ack_wait=self.ack_wait_s,
                                max_ack_pending=self.max_ack_pending, filter_subject=self.filter_subject)
            try:
                if self.create_streams:
                    await ensure_streams(js, self.config)
                if self.replay:  # a worker whose state is in memory rebuilds it from the stream
                    with contextlib.suppress(nats.js.errors.NotFoundError):
                        await js.delete_consumer(self.stream, self.durable)
                psub = await js.pull_subscribe(self.filter_subject, durable=self.durable,
                                               stream=self.stream, config=cc)
                await self._update_consumer(js, psub, cc)
            except nats.errors.Error as exc:
                raise TransportError(f"worker {self.durable}: cannot set up the consumer on stream "
                                     f"{self.stream!r} at {self.config.url}: {exc}") from exc
            next_lag = 0.0
            while not self._stop.is_set() and time.monotonic() < end:
                if until is not None and until(self.stats()):
                    break
                if time.monotonic() >= next_lag:
                    next_lag = time.monotonic() + self.lag_interval_s
                    await self._update_lag(psub)
                    if self.on_stats is not None:
                        self.on_stats(self.stats())
                await self._tick(js)
                try:
                    msgs = await psub.fetch(batch=self.fetch_batch, timeout=self.fetch_timeout_s)
                except nats.errors.TimeoutError:
                    continue
                except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
                        nats.errors.NoRespondersError, TransportError, OSError) as exc:
                    self._ratelog.log(logging.WARNING, self.durable, "fetch",
                                      f"worker {self.durable}: fetch failed ({type(exc).__name__}); retrying",
                                      time.monotonic())
                    await asyncio.sleep(0.2)
                    continue
                for msg in msgs:
                    await self._handle(js, msg)
            await self._finish(js)
            await self._update_lag(psub)
            if self.on_stats is not None:
                self.on_stats(self.stats())
        finally:
            # acks are fire-and-forget: a PING round trip makes sure the server has them
            with contextlib.suppress(Exception):
                await nc.flush(timeout=2)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=2.0)
            self._stats.connected = False
        return self.stats()

    async def _tick(self, js: JetStreamContext) -> None:
        """Called between fetches (a subclass's periodic work); nothing here."""

    async def _finish(self, js: JetStreamContext) -> None:
        """Called once at a clean stop, before the last lag read; nothing here."""

    async def _update_consumer(self, js: JetStreamContext, psub: Any, cc: ConsumerConfig) -> None:
        """An existing durable keeps its old settings on bind: bring ack_wait and
        max_ack_pending to this worker's (the server updates these in place)."""
        info = await psub.consumer_info()
        have = info.config
        if have.max_ack_pending == cc.max_ack_pending and abs((have.ack_wait or 0) - (cc.ack_wait or 0)) < 1e-3:
            return
        try:
            await js.add_consumer(self.stream, cc)
        except Exception as exc:
            log.warning("worker %s: consumer keeps max_ack_pending=%s ack_wait=%s s (update refused: %s)",
                        self.durable, have.max_ack_pending, have.ack_wait, exc)

    async def _update_lag(self, psub: Any) -> None:
        try:
            info = await psub.consumer_info()
        except Exception as exc:  # the lag is a metric: a failed read keeps the last value
            log.debug("worker: consumer info failed: %s", exc)
            return
        self._stats.lag = int(info.num_pending or 0)
        self._stats.ack_pending = int(info.num_ack_pending or 0)

    async def _handle(self, js: JetStreamContext, msg: Any) -> None:
        st = self._stats
        st.batches += 1
        with contextlib.suppress(Exception):
            if msg.metadata.num_delivered > 1:
                st.redelivered_batches += 1
        try:
            events = decode_events(msg.data)
        except BatchFormatError as exc:
            st.decode_errors += 1
            self._ratelog.log(logging.WARNING, self.durable, "decode",
                              f"worker {self.durable}: dropped an undecodable message on {msg.subject}: {exc}",
                              time.monotonic())
            await msg.term()  # never redeliver what can never decode
            return
        st.events += len(events)
        fresh = self.dedup.filter(events)
        st.unique_events += len(fresh)
        if fresh:
            if self.on_events is not None:
                self.on_events(fresh)
            findings = self.detectors(fresh)
            if findings:
                await self._publish_findings(js, msg, findings)
        await msg.ack()

    async def _publish_findings(self, js: JetStreamContext, msg: Any | None, findings: list[Finding]) -> None:
        """Publish ``findings`` to ``fs.findings.<kind>`` (content-addressed ids: a re-publish
        within the stream's duplicate window is dropped), retrying until stored; ``msg``, the
        batch they came from, is kept ours meanwhile."""
        by_kind: dict[str, list[Finding]] = {}
        for f in findings:
            by_kind.setdefault(f.kind, []).append(f)
        for kind, fs in by_kind.items():
            payload = encode_findings(fs, compress=self.compress)
            subject = findings_subject(self.config, kind)
            delay = 0.05
            # the telemetry batch stays un-acked until its findings are stored; keep it ours
            # meanwhile (in_progress resets ack_wait) rather than let it go to another worker
            while True:
                try:
                    await js.publish(subject, payload, headers={"Nats-Msg-Id": batch_id(payload),
                                                                "Fs-Source": self.finding_source})
                    self._stats.findings_published += len(fs)
                    break
                except Exception as exc:
                    self._stats.publish_retries += 1
                    self._ratelog.log(logging.WARNING, self.durable, "findings",
                                      f"worker {self.durable}: publishing findings failed ({exc}); retrying",
                                      time.monotonic())
                    if msg is not None:
                        with contextlib.suppress(Exception):
                            await msg.in_progress()
                    assert self._stop is not None
                    if self._stop.is_set() and delay > 1.0:
                        raise TransportError(f"worker {self.durable}: findings not stored at stop: {exc}") from exc
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
