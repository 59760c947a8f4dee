"""The supervisor's correlation on the NATS bus: findings in, incidents out.

A :class:`IncidentWorker` (``fabricscope worker --role incidents``) consumes
``fs.findings.>``, which holds the detector workers' and the probe workers' findings, each with
its source in the ``Fs-Source`` header. It runs the console's correlator and diagnosis over the
inventory: :class:`~fabricscope.diagnosis.incidents.Correlator`, with the specialists and the
coordinator of ``docs/design/diagnosis.md``. Every incident that opens, changes or closes is
published as JSON (``diagnosis.serialize.incident_to_json``) to ``fs.incidents.<id>``. The
message id is ``<id>:<updated_ns>:<status>``, so a repeat within the stream's duplicate window
is dropped. With ``db``, the findings and incidents also go to a DiagnosisStore file, which
``fabricscope incidents list --db`` reads once the worker has stopped.

The correlator's state lives in memory. A restarted worker therefore rebuilds it from the
findings stream (its durable consumer is deleted at start: ``replay``), and the stream's
``max-age`` bounds that history. Incidents are judged on this worker's wall clock, like
``serve --config``. Correlation is global, so run one incident worker per fabric: two would
each see every finding and publish the same incidents twice.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nats.js.client import JetStreamContext

from fabricscope.cluster.bus import BusConfig, incidents_subject
from fabricscope.cluster.encoding import BatchFormatError, decode_findings
from fabricscope.cluster.worker import Worker
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator
from fabricscope.diagnosis.knowledge import KnowledgeBase, load_kb
from fabricscope.diagnosis.model import Incident, Observed
from fabricscope.diagnosis.serialize import incident_to_json
from fabricscope.fabric.inventory import Fabric
from fabricscope.service.console.store_source import live_coverage
from fabricscope.telemetry.detectors import DetectorSet

__all__ = ["IncidentWorker"]

log = logging.getLogger(__name__)


class IncidentWorker(Worker):
    """Findings from the bus -> incidents to the bus (see the module docstring).

    ``tick_s``: seconds between correlator ticks; ``clock``: ns wall clock (a parameter for
    tests); ``on_incident``: called with each changed incident after it was published;
    ``db``: a DiagnosisStore file for the findings and incidents (optional).
    """

    def __init__(self, config: BusConfig | None, fabric: Fabric, *, durable: str = "fs-incidents",
                 kb: KnowledgeBase | None = None, tick_s: float = 1.0, telemetry_latency_s: float = 10.0,
                 clock: Callable[[], int] = time.time_ns, on_incident: Callable[[Incident], None] | None = None,
                 db: str | Path | None = None, **kw: Any) -> None:
        cfg = config or BusConfig()
        super().__init__(cfg, durable=durable, detectors=DetectorSet([]), filter_subject=f"{cfg.findings_prefix}.>",
                         **kw)
        self.stream = cfg.findings_stream
        self.replay = True
        self.rmap = ResourceMap(fabric)
        self.corr = Correlator(self.rmap, kb or load_kb(), live_coverage(fabric, {"telemetry": telemetry_latency_s}))
        self.tick_ns = int(tick_s * 1e9)
        self.clock = clock
        self.on_incident = on_incident
        self._next_tick = 0
        self.findings = 0
        self.latest_ns = 0  # the newest finding's report time
        self.unknown = 0
        self.published = 0
        self.incidents: dict[str, Incident] = {}
        self.store = None
        if db is not None:
            from fabricscope.store.findings import DiagnosisStore

            self.store = DiagnosisStore(db)

    async def _handle(self, js: JetStreamContext, msg: Any) -> None:
        self._stats.batches += 1
        try:
            found = decode_findings(msg.data)
        except BatchFormatError as exc:
            self._stats.decode_errors += 1
            self._ratelog.log(logging.WARNING, self.durable, "decode",
                              f"incident worker: dropped an undecodable message on {msg.subject}: {exc}",
                              time.monotonic())
            await msg.term()
            return
        source = (msg.headers or {}).get("Fs-Source", "bus")
        known = []
        for f in found:
            o = Observed(source, f, int(f.window[1]))
            if self.rmap.known(o.subject.split("->")[0].split("|")[0]):
                known.append(o)
            else:
                self.unknown += 1
        if known:
            known.sort(key=lambda o: (o.reported_ns, o.source, o.id))
            self.corr.add(known)
            self.findings += len(known)
            self.latest_ns = max(self.latest_ns, known[-1].reported_ns)
            if self.store is not None:
                self.store.add_findings(known)
        self._stats.events += len(found)
        await msg.ack()

    async def _tick(self, js: JetStreamContext) -> None:
        now = self.clock()
        if now < self._next_tick:
            return
        self._next_tick = now + self.tick_ns
        changed = self.corr.tick(now)
        for inc in changed:
            payload = json.dumps(incident_to_json(inc), sort_keys=True).encode()
            await js.publish(incidents_subject(self.config, inc.id), payload,
                             headers={"Nats-Msg-Id": f"{inc.id}:{inc.updated_ns}:{inc.status}"})
            self.published += 1
            self.incidents[inc.id] = inc
            if self.on_incident is not None:
                self.on_incident(inc)
        if changed and self.store is not None:
            self.store.upsert_incidents(changed)

    async def _finish(self, js: JetStreamContext) -> None:
        try:
            self._next_tick = 0
            await self._tick(js)
        finally:
            if self.store is not None:
                self.store.close()
