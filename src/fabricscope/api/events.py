"""Server-sent events (the WHATWG HTML "server-sent events" stream) for the live console.

The :class:`EventHub` listens to the :class:`~fabricscope.service.console.state.ConsoleState`
(called in the supervisor's thread), serialises each change once, and hands it to every
connected client's bounded queue through the event loop (``call_soon_threadsafe``). A slow
client loses its oldest events (counted in ``dropped``), never the server's memory; ``tick``
events are coalesced to at most ``tick_hz`` per second. Each stream sends a comment
heartbeat every ``heartbeat_s`` so proxies keep it open and a dead client is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fabricscope.diagnosis.serialize import observed_to_json
from fabricscope.service.console.state import ConsoleState, Event, incident_kind


def incident_item(inc: Any, acked: bool = False) -> dict[str, Any]:
    """The list form of an incident (``GET /incidents`` items and ``incident`` events)."""
    top = inc.root_causes[0] if inc.root_causes else None
    return {
        "id": inc.id, "status": inc.status, "severity": inc.severity, "title": inc.title,
        "kind": incident_kind(inc), "resource": top.resource if top else None,
        "probability": top.probability if top else None, "opened_ns": inc.opened_ns,
        "updated_ns": inc.updated_ns, "first_symptom_ns": inc.first_symptom_ns,
        "detected_ns": inc.detected_ns, "root_cause_ns": inc.root_cause_ns,
        "closed_ns": inc.closed_ns, "acked": acked, "findings": len(inc.findings),
    }


def sse(event: str, data: Any) -> str:
    """One SSE message (``data`` as one line of JSON)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class EventHub:
    """Fans state changes out to SSE clients (see module doc)."""

    def __init__(self, state: ConsoleState, *, queue_size: int = 1000, tick_hz: float = 2.0,
                 heartbeat_s: float = 15.0, max_clients: int = 1000) -> None:
        self.state = state
        self.queue_size = queue_size
        self.tick_gap_s = 1.0 / tick_hz
        self.heartbeat_s = heartbeat_s
        self.max_clients = max_clients
        self._clients: set[asyncio.Queue[str]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_tick = 0.0
        self._cancel: Any = None
        self.sent = 0
        self.dropped = 0

    @property
    def clients(self) -> int:
        return len(self._clients)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cancel = self.state.subscribe(self._on_event)

    def detach(self) -> None:
        if self._cancel is not None:
            self._cancel()
        self._loop = None

    def _on_event(self, ev: Event) -> None:
        kind, obj = ev
        if kind == "tick":
            now = time.monotonic()
            if now - self._last_tick < self.tick_gap_s:
                return
            self._last_tick = now
            msg = sse("tick", {"sim_ns": obj})
        elif kind == "incident":
            msg = sse("incident", incident_item(obj, self.state.ack_of(obj.id) is not None))
        elif kind == "finding":
            msg = sse("finding", observed_to_json(obj))
        elif kind in ("ack", "approve"):
            msg = sse(kind, {"id": obj})
        else:
            msg = sse(kind, {"name": obj})
        loop = self._loop
        if loop is not None and self._clients:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(self._fan_out, msg)

    def _fan_out(self, msg: str) -> None:
        for q in list(self._clients):
            if q.full():
                q.get_nowait()
                self.dropped += 1
            q.put_nowait(msg)

    def full(self) -> bool:
        return len(self._clients) >= self.max_clients

    async def stream(self, first: str = "") -> AsyncIterator[str]:
        """One client's stream: ``first`` (a snapshot), then changes and heartbeats."""
        q: asyncio.Queue[str] = asyncio.Queue(self.queue_size)
        self._clients.add(q)
        try:
            yield "retry: 3000\n\n" + first
            while True:
                try:
                    msg = await asyncio.wait_for(q.get(), self.heartbeat_s)
                except TimeoutError:
                    msg = ": ping\n\n"
                self.sent += 1
                yield msg
        finally:
            self._clients.discard(q)
