"""Probe localization on the NATS bus: agents publish samples, a worker localizes each window.

``fabricscope probe agent --nats URL`` publishes every sample, with the prober's status
(answered / request lost / reply lost), to ``fs.probes.<src NIC>``. A :class:`ProbeWorker`
(``fabricscope worker --role probes``) is a durable consumer of ``fs.probes.>``: it appends
each batch to a DuckDB :class:`~fabricscope.store.probes.ProbeStore` file and acknowledges it
only then (a killed worker restarted on the same file and durable name loses nothing), and
every window of *sample* time (default 30 s, aligned to multiples of the window) it runs the
same localization as ``probe analyze`` (:func:`~fabricscope.service.probe_live.analyze_observations`,
MAP over the path model, Arzani et al. 007 / NetBouncer-style tomography: see
docs/design/probe-localization.md) and publishes the findings to ``fs.findings.<kind>``.

A window is analysed once the newest sample is ``lateness`` past its end, so that replies
and agents' later flushes are in. The windows done are recorded in the store (table
``fs_probe_windows``), so a restart neither skips nor repeats one; a repeat after a crash
between publishing and recording is dropped by the findings stream's duplicate window (the
findings' message id is their content hash). Samples older than ``retain`` are deleted from
the store after each window. Design: docs/design/cluster-bus.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nats.js.client import JetStreamContext

from fabricscope.cluster.bus import BusConfig
from fabricscope.cluster.encoding import BatchFormatError, decode_probe_batch
from fabricscope.cluster.worker import Worker
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.probe.analysis import check_inputs, running_mask
from fabricscope.service.probe_live import analyze_observations
from fabricscope.store.probes import ProbeStore
from fabricscope.telemetry.detectors import DetectorSet

__all__ = ["ProbeWorker"]

log = logging.getLogger(__name__)

_WINDOWS = "CREATE TABLE IF NOT EXISTS fs_probe_windows (end_ns BIGINT PRIMARY KEY, findings INTEGER, probes BIGINT)"


class ProbeWorker(Worker):
    """A durable consumer of ``fs.probes.>`` that localizes faults per window (module docstring).

    ``db``: the ProbeStore file (created if absent); ``window_s``, ``lateness_s``, ``retain_s``:
    seconds of sample time; ``method``: ``map`` or ``007``; ``on_findings``: called with each
    window's findings and its ``(start_ns, end_ns)`` after they were published.
    """

    def __init__(self, config: BusConfig | None, fabric: Fabric, db: str | Path, *, durable: str = "fs-probes",
                 window_s: float = 30.0, lateness_s: float = 5.0, retain_s: float = 600.0, method: str = "map",
                 margin_s: float = 2.0,
                 on_findings: Callable[[list[Finding], tuple[int, int]], None] | None = None,
                 **kw: Any) -> None:
        cfg = config or BusConfig()
        if not window_s > 0 or not lateness_s >= 0 or not retain_s >= window_s:
            raise ConfigError(f"probe worker: window {window_s:g} s must be > 0, lateness {lateness_s:g} s >= 0 "
                              f"and retain {retain_s:g} s >= the window")
        if method not in ("map", "007"):
            raise ConfigError(f"probe worker: method must be map or 007, got {method!r}")
        super().__init__(cfg, durable=durable, detectors=DetectorSet([]), filter_subject=f"{cfg.probes_prefix}.>",
                         **kw)
        self.stream = cfg.probes_stream
        self.finding_source = "probe"
        self.fabric = fabric
        self.method = method
        self.window_ns = int(window_s * 1e9)
        self.lateness_ns = int(lateness_s * 1e9)
        self.retain_ns = int(retain_s * 1e9)
        self.margin_ns = int(margin_s * 1e9)
        self.not_running = 0  # probes dropped because an end was not running
        self.on_findings = on_findings
        try:
            self.store = ProbeStore(db)
        except Exception as exc:  # duckdb's own types: name the file
            raise ConfigError(f"probe worker: --db {db}: cannot open: {exc}") from None
        self.store.con.execute(_WINDOWS).fetchall()
        self.done_end_ns: int | None = self._scalar("SELECT max(end_ns) FROM fs_probe_windows")
        self.newest_ns: int | None = self._scalar("SELECT max(t_send_ns) FROM probes")
        self.samples = 0
        self.windows = 0
        self.findings: list[Finding] = []

    def _scalar(self, sql: str) -> int | None:
        rows = self.store.con.execute(sql).fetchall()  # fetched whole: DuckDB refuses the next statement else
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    async def _handle(self, js: JetStreamContext, msg: Any) -> None:
        st = self._stats
        st.batches += 1
        try:
            samples, codes = decode_probe_batch(msg.data)
        except BatchFormatError as exc:
            st.decode_errors += 1
            self._ratelog.log(logging.WARNING, self.durable, "decode",
                              f"probe worker: dropped an undecodable message on {msg.subject}: {exc}",
                              time.monotonic())
            await msg.term()
            return
        if samples:
            self.store.insert(samples, codes)
            self.samples += len(samples)
            st.events += len(samples)
            newest = max(s.t_send_ns for s in samples)
            self.newest_ns = newest if self.newest_ns is None else max(self.newest_ns, newest)
        await msg.ack()

    async def _tick(self, js: JetStreamContext) -> None:
        await self._analyse_ready(js)

    async def _finish(self, js: JetStreamContext) -> None:
        try:
            await self._analyse_ready(js)
        finally:
            self.store.close()

    def _first_end(self) -> int | None:
        if self.done_end_ns is not None:
            return self.done_end_ns + self.window_ns
        first = self._scalar("SELECT min(t_send_ns) FROM probes")
        return None if first is None else (first // self.window_ns + 1) * self.window_ns

    async def _analyse_ready(self, js: JetStreamContext) -> None:
        """Analyse every window whose end is ``lateness`` behind the newest sample."""
        if self.newest_ns is None:
            return
        end = self._first_end()
        while end is not None and end + self.lateness_ns <= self.newest_ns:
            start = end - self.window_ns
            ext = 2 * self.margin_ns + 10_000_000_000  # room to see each agent's runs
            wide = self.store.observations(t0_ns=start - ext, t1_ns=end + ext)
            probers = [r[0] for r in self.store.con.execute("SELECT DISTINCT src FROM probes").fetchall()]
            keep = running_mask(wide, margin_ns=self.margin_ns, probers=probers)
            obs = wide.select(keep).window(start, end)
            self.not_running += len(wide.window(start, end)) - len(obs)
            found: list[Finding] = []
            if len(obs):
                try:
                    check_inputs(self.fabric, obs, source=f"probe worker: window ending {end}")
                    found = analyze_observations(self.fabric, obs, method=self.method)
                except ConfigError as exc:  # samples of another fabric: said, not analysed
                    self._ratelog.log(logging.WARNING, self.durable, "inputs", str(exc), time.monotonic())
                if found:
                    await self._publish_findings(js, None, found)
            self.store.con.execute("INSERT OR REPLACE INTO fs_probe_windows VALUES (?, ?, ?)",
                                   [end, len(found), len(obs)]).fetchall()
            self.store.con.execute("DELETE FROM probes WHERE t_send_ns < ?", [end - self.retain_ns]).fetchall()
            self.done_end_ns = end
            self.windows += 1
            self.findings.extend(found)
            if self.on_findings is not None:
                self.on_findings(found, (start, end))
            end += self.window_ns
