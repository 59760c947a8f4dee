"""A cluster collector: collect the devices this member owns and publish them to the NATS bus.

Composition (service layer): a :class:`~fabricscope.cluster.membership.MembershipThread`
shares the config's device names (each device is one cluster target) over the live members;
``on_acquire`` adds the device to one *dynamic* :class:`~fabricscope.telemetry.collector.Collector`
(its stream loop, stale watchdog, bounded buffer and drain-at-deadline, unchanged and covered
by their own tests), ``on_release`` removes it and waits until its streams are closed, so a
handover never streams one device twice. The collector writes to a
:class:`~fabricscope.cluster.bus.BusPublisher` (``fs.telemetry.<device>``). Detection runs in
the workers (``fabricscope worker``), not here. Each device keeps its own gRPC channel (a
switch is its own address). Measured in ``docs/benchmarks/cluster.md``. Design:
``docs/design/cluster-bus.md``, ``docs/design/cluster-membership.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fabricscope.cluster.bus import BusConfig, BusPublisher
from fabricscope.cluster.membership import LeaseSettings, MembershipThread, NatsAuth
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.collector import Collector, spill_path
from fabricscope.telemetry.config import ClusterConfig, CollectorConfig, TargetConfig
from fabricscope.telemetry.detectors import DetectorSet

__all__ = [
    "ClusterCollector",
    "ClusterCollectorStats",
    "bus_config",
    "nats_auth",
    "run_cluster_collector",
]

log = logging.getLogger(__name__)


def _env(name: str | None, where: str) -> str | None:
    if name is None:
        return None
    v = os.environ.get(name)
    if not v:
        raise ConfigError(f"{where}: environment variable {name!r} is not set or empty")
    return v


def bus_config(cl: ClusterConfig, *, source: str = "<config>") -> BusConfig:
    """The :class:`BusConfig` of a ``cluster:`` section (secrets read from their env variables)."""
    return BusConfig(
        url=cl.nats, user=cl.user, password_env=cl.password_env,
        token=_env(cl.token_env, f"{source}: cluster.token-env"), creds_file=cl.creds,
        tls_ca=cl.tls_ca, tls_cert=cl.tls_cert, tls_key=cl.tls_key,
        client_name=f"fabricscope-collector-{cl.member}", max_bytes=cl.max_bytes,
        max_age_s=cl.max_age_ns / 1e9, duplicate_window_s=min(120.0, cl.max_age_ns / 1e9),
        storage="memory" if cl.storage == "memory" else "file")


def nats_auth(cl: ClusterConfig, *, source: str = "<config>") -> NatsAuth:
    """The membership's :class:`NatsAuth` of a ``cluster:`` section."""
    return NatsAuth(
        user=cl.user, password=_env(cl.password_env, f"{source}: cluster.password-env"),
        token=_env(cl.token_env, f"{source}: cluster.token-env"),
        creds=Path(cl.creds) if cl.creds else None, tls_ca=Path(cl.tls_ca) if cl.tls_ca else None,
        tls_cert=Path(cl.tls_cert) if cl.tls_cert else None, tls_key=Path(cl.tls_key) if cl.tls_key else None)


class _SharedSink:
    """The bus publisher as the member's collector sink: its ``close`` is not the publisher's.

    ``never_blocks``: :meth:`BusPublisher.write` only queues (bounded, drop-oldest), so the
    Collector writes it inline rather than in a thread of its own.
    """

    never_blocks = True

    def __init__(self, pub: BusPublisher) -> None:
        self.pub = pub

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        self.pub.write(events, findings)

    def close(self) -> None:
        """Closed once, by :class:`ClusterCollector`, after its collector stopped."""


@dataclass
class ClusterCollectorStats:
    """A snapshot of one cluster collector."""

    member: str = ""
    targets: int = 0
    held: int = 0
    acquired: int = 0
    released: int = 0
    release_max_s: float = 0.0
    release_total_s: float = 0.0
    received: int = 0
    published_events: int = 0
    buffered_events: int = 0
    dropped_events: int = 0
    lost_events: int = 0
    spilled_events: int = 0
    connected: bool = False


class ClusterCollector:
    """One member of a collector cluster (see the module docstring).

    ``publisher``: injected for tests; by default a :class:`BusPublisher` for the config's
    ``cluster:`` section, spilling what the close deadline leaves to
    ``<config stem>.<member>.bus-spill`` beside the config file.
    """

    def __init__(self, cfg: CollectorConfig, *, publisher: BusPublisher | None = None) -> None:
        if cfg.cluster is None:
            raise ConfigError(f"{cfg.source}: cluster: this config has no cluster: section (needed for --cluster)")
        self.cfg = cfg
        self.cluster = cfg.cluster
        self._device: dict[str, TargetConfig] = {}
        for t in cfg.targets:
            for n in t.names:
                if n in self._device:
                    raise ConfigError(f"{cfg.source}: targets.{t.name}.names: device {n!r} is also served by "
                                      f"targets.{self._device[n].name}; a cluster target must be unique")
                self._device[n] = t
        self.lease = LeaseSettings(lease_s=self.cluster.lease_ns / 1e9).validate()
        auth = nats_auth(self.cluster, source=cfg.source)
        if publisher is None:
            sp = spill_path(cfg)
            spill = sp.with_name(f"{sp.stem.removesuffix('.spill')}.{self.cluster.member}.bus-spill") if sp else None
            publisher = BusPublisher(bus_config(self.cluster, source=cfg.source), spill_path=spill)
        self.publisher = publisher
        # one dynamic collector for every owned device: no spill of its own (its only sink never
        # blocks; the publisher spills), detection in the workers
        sub = replace(cfg, targets=(), sinks=(), workers=1, cluster=None)
        self._col = Collector(sub, sinks=[_SharedSink(self.publisher)], detectors=DetectorSet([]), spill=False,
                              dynamic=True)
        self._col_fut: concurrent.futures.Future[object] | None = None
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stats = ClusterCollectorStats(member=self.cluster.member, targets=len(self._device))
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="cluster-collect", daemon=True)
        self._membership = MembershipThread(self.cluster.nats, self.cluster.member, sorted(self._device),
                                            on_acquire=self._acquire, on_release=self._release,
                                            lease=self.lease, auth=auth)
        self._closed = False
        self._timeout_s = cfg.shutdown_deadline_ns / 1e9 + 5.0

    # ---- membership callbacks (one dedicated thread; they may block)

    def _acquire(self, device: str) -> None:
        if self._closed:
            return
        # not waited for: the membership thread claims the next device at once (a takeover
        # of hundreds of devices is not a round trip per device through a busy loop); the
        # loop runs adds and removes in the order they were scheduled
        fut = asyncio.run_coroutine_threadsafe(self._col.add_device(self._device[device], device), self._loop)
        def failed(f: concurrent.futures.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.error("cluster %s: cannot collect %s: %s", self.cluster.member, device, f.exception())

        fut.add_done_callback(failed)
        with self._lock:
            self._held.add(device)
            self._stats.acquired += 1
        log.debug("cluster %s: collecting %s", self.cluster.member, device)

    def _release(self, device: str) -> None:
        with self._lock:
            if device not in self._held:
                return
            self._held.discard(device)
        t0 = time.monotonic()
        if self._col_fut is not None and not self._col_fut.done():
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                asyncio.run_coroutine_threadsafe(self._col.remove_device(device), self._loop).result(self._timeout_s)
        dt = time.monotonic() - t0
        with self._lock:
            self._stats.released += 1
            self._stats.release_total_s += dt
            self._stats.release_max_s = max(self._stats.release_max_s, dt)
        log.debug("cluster %s: released %s", self.cluster.member, device)

    # ---- lifecycle

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the loop and the collector, join the cluster (raises the join error: NATS
        away, a name clash)."""
        self._loop_thread.start()
        self._col_fut = asyncio.run_coroutine_threadsafe(self._col.run(), self._loop)
        self._membership.start(timeout_s=timeout_s)
        log.info("cluster %s: joined %s (lease %g s) with %d devices", self.cluster.member, self.cluster.nats,
                 self.lease.lease_s, len(self._device))

    def held(self) -> frozenset[str]:
        """The devices collected now."""
        with self._lock:
            return frozenset(self._held)

    def stats(self) -> ClusterCollectorStats:
        """Held devices, acquisitions, events received and published, the publisher's health."""
        p = self.publisher.stats()
        with self._lock:
            s = replace(self._stats)
            s.held = len(self._held)
        s.received = self._col.stats.received
        s.published_events, s.buffered_events = p.published_events, p.buffered_events
        s.dropped_events, s.lost_events, s.spilled_events = p.dropped_events, p.lost_events, p.spilled_events
        s.connected = p.connected
        return s

    def close(self, *, deadline_s: float | None = None) -> ClusterCollectorStats:
        """Stop the collector, leave the cluster, flush the publisher.

        The collector stops first (every stream ends, its buffer goes to the publisher), then
        the member leaves (its claims are deleted only after that, so the next owner never
        overlaps this one), then the publisher gets what is left of ``deadline_s`` (default
        ``shutdown.deadline``) and spills the rest.
        """
        if self._closed:
            return self.stats()
        self._closed = True
        deadline = self.cfg.shutdown_deadline_ns / 1e9 if deadline_s is None else deadline_s
        end = time.monotonic() + deadline
        if self._col_fut is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._col.stop)
            try:
                self._col_fut.result(timeout=deadline + 5.0)
            except Exception as exc:  # a failed stream was logged by the collector; report, go on
                log.warning("cluster %s: collector ended with %s: %s", self.cluster.member, type(exc).__name__, exc)
        self._membership.stop(deadline_s=max(1.0, end - time.monotonic()))
        self.publisher.close(deadline_s=max(0.5, end - time.monotonic()))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(2.0)
        st = self.stats()
        log.info("cluster %s: stopped; received %d, published %d, spilled %d, lost %d; %d releases took %.2f s "
                 "(max %.3f s)", st.member, st.received, st.published_events, st.spilled_events, st.lost_events,
                 st.released, st.release_total_s, st.release_max_s)
        return st


def run_cluster_collector(cfg: CollectorConfig, *, duration_s: float | None = None,
                          stop_event: threading.Event | None = None,
                          stats_interval_s: float | None = None) -> ClusterCollectorStats:
    """Run one cluster member until ``duration_s`` passed or ``stop_event`` is set; then close.

    Returns the final :class:`ClusterCollectorStats`. A stats line is logged every
    ``stats_interval_s`` (default the config's ``stats-interval``; 0: never).
    """
    cc = ClusterCollector(cfg)
    stop = stop_event or threading.Event()
    every = cfg.stats_interval_ns / 1e9 if stats_interval_s is None else stats_interval_s
    end = time.monotonic() + duration_s if duration_s is not None else float("inf")
    try:
        cc.start()
        next_line = time.monotonic() + every if every > 0 else float("inf")
        while not stop.is_set() and time.monotonic() < end:
            stop.wait(min(0.2, max(0.0, end - time.monotonic())))
            if time.monotonic() >= next_line:
                next_line += every
                s = cc.stats()
                log.info("cluster %s: holding %d/%d devices; received %d, published %d, buffered %d, dropped %d%s",
                         s.member, s.held, s.targets, s.received, s.published_events, s.buffered_events,
                         s.dropped_events, "" if s.connected else " (bus disconnected)")
    finally:
        st = cc.close()
    return st
