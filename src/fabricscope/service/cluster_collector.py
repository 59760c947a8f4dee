"""A cluster collector: collect the devices this member owns and publish them to the NATS bus.

Composition (service layer): a :class:`~fabricscope.cluster.membership.MembershipThread`
shares the config's device names (each device is one cluster target) over the live members;
``on_acquire`` starts a one-device :class:`~fabricscope.telemetry.collector.Collector` on one
shared asyncio loop, ``on_release`` stops it and waits until its streams are closed and its
buffer is handed to the publisher, so a handover never streams one device twice. All of them
write to one shared :class:`~fabricscope.cluster.bus.BusPublisher` (``fs.telemetry.<device>``).
Detection runs in the workers (``fabricscope worker``), not here.

Why one small Collector per device rather than a dynamic target API on Collector: the
Collector's stream loop, stale watchdog, bounded buffer and drain-at-deadline are reused
unchanged (and stay covered by their own tests); the price is one writer task and one gRPC
channel per device (gRPC shares the TCP connection of identical channels), measured in
``docs/benchmarks/cluster.md``. Design: ``docs/design/cluster-bus.md``,
``docs/design/cluster-membership.md``.
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
    """The shared publisher as one device collector's sink: its ``close`` is not the publisher's.

    ``never_blocks``: :meth:`BusPublisher.write` only queues (bounded, drop-oldest), so the
    Collector writes it inline rather than in a thread of its own.
    """

    never_blocks = True

    def __init__(self, pub: BusPublisher) -> None:
        self.pub = pub

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        self.pub.write(events, findings)

    def close(self) -> None:
        """Closed once, by :class:`ClusterCollector`, after every device collector stopped."""


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
        # the device collectors: no stats line each (one for the member), no spill of their own
        # (their only sink never blocks; the publisher spills), detection in the workers
        self._sub_base = replace(cfg, sinks=(), workers=1, cluster=None, stats_interval_ns=0)
        self._running: dict[str, tuple[Collector, concurrent.futures.Future[object]]] = {}
        self._closing: dict[str, threading.Event] = {}  # devices close() is stopping
        self._lock = threading.Lock()
        self._stats = ClusterCollectorStats(member=self.cluster.member, targets=len(self._device))
        self._received_done = 0
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="cluster-collect", daemon=True)
        self._membership = MembershipThread(self.cluster.nats, self.cluster.member, sorted(self._device),
                                            on_acquire=self._acquire, on_release=self._release,
                                            lease=self.lease, auth=auth)
        self._closed = False

    # ---- membership callbacks (one dedicated thread; they may block)

    def _acquire(self, device: str) -> None:
        t = self._device[device]
        sub = replace(self._sub_base, targets=(replace(t, names=(device,)),))
        col = Collector(sub, sinks=[_SharedSink(self.publisher)], detectors=DetectorSet([]), spill=False)
        fut: concurrent.futures.Future[object] = asyncio.run_coroutine_threadsafe(col.run(), self._loop)
        with self._lock:
            self._running[device] = (col, fut)
            self._stats.acquired += 1
        log.debug("cluster %s: collecting %s", self.cluster.member, device)

    def _release(self, device: str) -> None:
        with self._lock:
            item = self._running.pop(device, None)
            closing = self._closing.get(device)
        if item is None:
            if closing is not None:  # close() is stopping it: the claim goes only after that
                closing.wait(self.cfg.shutdown_deadline_ns / 1e9 + 5.0)
            return
        t0 = time.monotonic()
        self._stop_one(*item)
        dt = time.monotonic() - t0
        with self._lock:
            self._stats.released += 1
            self._stats.release_total_s += dt
            self._stats.release_max_s = max(self._stats.release_max_s, dt)
        log.debug("cluster %s: released %s", self.cluster.member, device)

    def _stop_one(self, col: Collector, fut: concurrent.futures.Future[object]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(col.stop)
        try:
            fut.result(timeout=self.cfg.shutdown_deadline_ns / 1e9 + 5.0)
        except Exception as exc:  # a failed stream was logged by the collector; report, go on
            log.warning("cluster %s: collector for %s ended with %s: %s", self.cluster.member,
                        ",".join(n for t in col.cfg.targets for n in t.names), type(exc).__name__, exc)
        with self._lock:
            self._received_done += col.stats.received

    # ---- lifecycle

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the loop and join the cluster (raises the join error: NATS away, a name clash)."""
        self._loop_thread.start()
        self._membership.start(timeout_s=timeout_s)
        log.info("cluster %s: joined %s (lease %g s) with %d devices", self.cluster.member, self.cluster.nats,
                 self.lease.lease_s, len(self._device))

    def held(self) -> frozenset[str]:
        """The devices collected now."""
        with self._lock:
            return frozenset(self._running)

    def stats(self) -> ClusterCollectorStats:
        """Held devices, acquisitions, events received and published, the publisher's health."""
        p = self.publisher.stats()
        with self._lock:
            s = replace(self._stats)
            s.held = len(self._running)
            s.received = self._received_done + sum(c.stats.received for c, _ in self._running.values())
        s.published_events, s.buffered_events = p.published_events, p.buffered_events
        s.dropped_events, s.lost_events, s.spilled_events = p.dropped_events, p.lost_events, p.spilled_events
        s.connected = p.connected
        return s

    def close(self, *, deadline_s: float | None = None) -> ClusterCollectorStats:
        """Stop every device collector at once, leave the cluster, flush the publisher.

        The collectors stop first (in parallel: their buffers go to the publisher), then the
        member leaves (its claims are deleted only after that, so the next owner never
        overlaps this one), then the publisher gets what is left of ``deadline_s``
        (default ``shutdown.deadline``) and spills the rest.
        """
        if self._closed:
            return self.stats()
        self._closed = True
        deadline = self.cfg.shutdown_deadline_ns / 1e9 if deadline_s is None else deadline_s
        end = time.monotonic() + deadline
        with self._lock:
            items = list(self._running.items())
            self._running.clear()
            self._closing = {d: threading.Event() for d, _ in items}

        def stop(kv: tuple[str, tuple[Collector, concurrent.futures.Future[object]]]) -> None:
            self._stop_one(*kv[1])
            self._closing[kv[0]].set()

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
            list(ex.map(stop, items))
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
