"""Incidents to the systems that page people: Alertmanager (API v2) and a generic webhook.

Both sinks are :class:`~fabricscope.service.console.state.ConsoleState` listeners:
``sink(("incident", incident))`` records the change and returns at once (the supervisor's
thread never waits on the network); one background thread per sink delivers. Other events
(``finding``, ``tick``, ``ack``...) are ignored.

:class:`AlertmanagerSink` keeps Alertmanager's *state* in step with the console, the way
Prometheus does (``prometheus/notifier``): ``POST {url}/api/v2/alerts`` with a JSON list of
``postableAlert`` objects (Alertmanager API v2, ``api/v2/openapi.yaml``). Each open incident
is one alert, re-posted every ``resend_s`` with ``endsAt = now + 4 * resend_s`` so that
Alertmanager neither resolves it while the console runs nor keeps it firing for ever if the
console dies. A change of status, severity or top root cause is posted at once; an unchanged
upsert (a refresh) is not posted again before ``resend_s``. A closed incident is posted with
``endsAt`` in the past: the resolve notification.

:class:`WebhookSink` posts one JSON document per change::

    {"event": "opened" | "updated" | "resolved", "incident": <incident_to_json>,
     "url": "<console>/#/incident/<id>"}

deduplicated by content (the incident JSON without its ``updated_ns``): a refresh that
changes nothing is not sent again.

Both retry a failed POST (connection error, 408, 429, 5xx) ``retries`` times with
exponential backoff (``backoff_s``, doubling, at most 30 s); a 4xx answer is not retried.
Counters: ``sent`` (notifications the receiver accepted), ``failed`` (given up after the
retries), ``dropped`` (refused because ``max_queue`` was reached, or offered after
:meth:`close`). Memory is bounded by ``max_queue`` (pending notifications and tracked
incidents). :meth:`close` delivers what is queued within a deadline and returns a
:class:`FlushReport` naming what was not delivered (also logged, one line): nothing is lost
silently. Logs name the receiver by scheme, host and port only: a URL's user info, path and
query may hold a secret (Slack-style webhook paths do) and never reach a log line.

Time: incident times are nanoseconds, simulated in twin mode. ``time_base_s`` maps them to
wall time, ``wall = time_base_s + ns / 1e9``: give ``state.started_s`` in twin mode (sim
t = 0 is when ``serve`` started) and ``0.0`` in live mode (ns since the epoch). A mapped time
later than now (a twin running faster than real time) is clamped to now, so ``startsAt`` is
never in the future and a resolve's ``endsAt`` is never after the moment it is posted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from fabricscope.diagnosis.model import Incident
from fabricscope.diagnosis.serialize import incident_to_json
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.state import Event, incident_kind

__all__ = [
    "ALERTNAME",
    "AlertmanagerSink",
    "DeliveryCounts",
    "FlushReport",
    "WebhookSink",
    "incident_link",
    "postable_alert",
    "validate_url",
]

log = logging.getLogger(__name__)

#: The ``alertname`` label of every alert fabricscope posts.
ALERTNAME = "FabricscopeIncident"
_MAX_ANNOTATION = 1000
_MAX_BACKOFF_S = 30.0
_BATCH = 256  # alerts per POST (Prometheus's notifier uses the same batch size)


class DeliveryCounts(Protocol):
    """What the metrics exposition reads from a sink."""

    name: str

    @property
    def sent(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def dropped(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FlushReport:
    """What :meth:`close` achieved: notifications delivered while closing, and the
    incidents whose notification was not delivered (queued at the deadline or failed)."""

    delivered: int
    undelivered: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.undelivered


def validate_url(url: str, flag: str) -> str:
    """``url`` without a trailing slash when it is an absolute http(s) URL with a host,
    else a :class:`ConfigError` naming ``flag`` (``--alertmanager``, ``--webhook``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"{flag}: not a valid URL ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = parts.scheme or "no scheme"
        raise ConfigError(f"{flag}: expected an http:// or https:// URL with a host, "
                          f"got {shown}://{parts.hostname or ''}")
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"{flag}: port {port} out of range")
    return url.rstrip("/")


def _split_auth(url: str) -> tuple[str, dict[str, str]]:
    """Move ``user:password@`` out of ``url`` into an ``Authorization: Basic`` header."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    user = urllib.parse.unquote(parts.username or "")
    pw = urllib.parse.unquote(parts.password or "")
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    bare = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    token = base64.b64encode(f"{user}:{pw}".encode()).decode()
    return bare, {"Authorization": f"Basic {token}"}


def _redacted(url: str) -> str:
    """scheme://host:port only: what a log line may say about a receiver."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def incident_link(console_url: str, incident_id: str) -> str:
    """The console page of one incident (the web UI's hash route)."""
    return f"{console_url.rstrip('/')}/#/incident/{urllib.parse.quote(incident_id, safe='')}"


def _rfc3339(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_ANNOTATION else text[: _MAX_ANNOTATION - 3] + "..."


def postable_alert(inc: Incident, *, console_url: str, now_s: float, time_base_s: float = 0.0,
                   resend_s: float = 60.0, fabric: str = "") -> dict[str, Any]:
    """The Alertmanager v2 ``postableAlert`` of one incident at wall time ``now_s``.

    Labels (what Alertmanager groups, routes and deduplicates on): ``alertname``,
    ``incident``, ``severity``, ``fault`` (the top root cause's fault type or
    ``unexplained``), ``resource`` (its resource or ``unknown``) and ``fabric`` (when given).
    Annotations: ``summary`` (title), ``description`` (ranked root causes and the top
    evidence), ``action`` and ``link`` (the incident page, also the ``generatorURL``).
    """
    top = inc.root_causes[0] if inc.root_causes else None
    labels = {"alertname": ALERTNAME, "incident": inc.id, "severity": inc.severity,
              "fault": incident_kind(inc), "resource": top.resource if top else "unknown"}
    if fabric:
        labels["fabric"] = fabric
    causes = "; ".join(f"{rc.fault} on {rc.resource} (p={rc.probability:.2f})"
                       for rc in inc.root_causes[:3]) or "no root cause named yet"
    evidence = " | ".join(top.evidence[:3]) if top else ""
    description = causes + (f". Evidence: {evidence}" if evidence else "") + \
        f". {len(inc.findings)} finding(s)."
    action = (top.action if top and top.action else inc.actions[-1] if inc.actions else "")
    link = incident_link(console_url, inc.id)
    starts = min(time_base_s + inc.opened_ns / 1e9, now_s)
    if inc.status == "closed":
        closed_ns = inc.closed_ns if inc.closed_ns is not None else inc.updated_ns
        ends = max(starts, min(time_base_s + closed_ns / 1e9, now_s))
    else:
        ends = now_s + 4 * resend_s
    annotations = {"summary": _clip(inc.title or f"{labels['fault']} on {labels['resource']}"),
                   "description": _clip(description), "link": link}
    if action:
        annotations["action"] = _clip(action)
    return {"labels": labels, "annotations": annotations, "generatorURL": link,
            "startsAt": _rfc3339(starts), "endsAt": _rfc3339(ends)}


class _LogOnce:
    """One log line per condition per interval, with the count of the ones held back."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, key: str, msg: str) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        self._last[key] = now
        log.warning("%s%s", msg, f" ({held} more like it in the last {self.interval_s:.0f} s)"
                    if held else "")


class _Sink:
    """Shared machinery: bounded state under one condition, a delivery thread, POST with
    retries and backoff, close with a deadline."""

    kind = "sink"

    def __init__(self, url: str, *, flag: str, name: str, console_url: str, timeout_s: float,
                 max_queue: int, retries: int, backoff_s: float,
                 headers: Mapping[str, str] | None, clock: Callable[[], float]) -> None:
        if max_queue < 1:
            raise ConfigError(f"{flag}: max_queue must be >= 1, got {max_queue}")
        if timeout_s <= 0:
            raise ConfigError(f"{flag}: timeout must be > 0 s, got {timeout_s}")
        self.url, auth = _split_auth(validate_url(url, flag))
        self.name = name
        self.console_url = console_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_queue = max_queue
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.clock = clock
        self._headers = {"Content-Type": "application/json", "User-Agent": "fabricscope",
                         **auth, **(headers or {})}
        self._sent = self._failed = self._dropped = 0
        self._sent_at_close = 0
        self._cond = threading.Condition()
        self._closing = False
        self._busy = False  # a POST is in flight
        self._wake = threading.Event()  # set by close(): ends a backoff pause
        self._deadline: float | None = None  # time.monotonic() deadline once closing
        self._logs = _LogOnce()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"alerts-{name}")
        self._thread.start()

    # -- counters -------------------------------------------------------------------------
    @property
    def sent(self) -> int:
        return self._sent

    @property
    def failed(self) -> int:
        return self._failed

    @property
    def dropped(self) -> int:
        return self._dropped

    def stats(self) -> dict[str, int]:
        """``sent``, ``failed``, ``dropped`` and ``queued`` (pending now)."""
        with self._cond:
            return {"sent": self._sent, "failed": self._failed, "dropped": self._dropped,
                    "queued": self._pending()}

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until nothing is queued and no POST is in flight; False on timeout."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._pending() or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    # -- the listener ---------------------------------------------------------------------
    def __call__(self, event: Event) -> None:
        """ConsoleState listener: record an ``("incident", Incident)`` change; never blocks
        on I/O (one lock, held for a dictionary update)."""
        if event[0] != "incident" or not isinstance(event[1], Incident):
            return
        with self._cond:
            if self._closing:
                self._dropped += 1
                return
            if self._offer(event[1]):
                self._cond.notify_all()  # all: wait_idle() callers wait on it too

    # -- subclass hooks (called with the lock held) -----------------------------------------
    def _offer(self, inc: Incident) -> bool:
        raise NotImplementedError

    def _pending(self) -> int:
        raise NotImplementedError

    def _deliver_some(self) -> bool:
        """Deliver what is due (releases the lock around the POST); False when nothing was."""
        raise NotImplementedError

    def _wait_s(self) -> float | None:
        return None

    def _undelivered(self) -> list[str]:
        raise NotImplementedError

    # -- the delivery thread --------------------------------------------------------------
    def _run(self) -> None:
        with self._cond:
            while True:
                try:
                    if self._deliver_some():
                        continue
                except Exception:  # a bug must not end delivery for the process's life
                    log.exception("%s %s: delivery failed", self.kind, self.name)
                    if self._closing:
                        return
                    self._cond.wait(1.0)
                    continue
                if self._closing:
                    return
                self._cond.wait(self._wait_s())

    def _remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def _post_unlocked(self, body: bytes, what: str) -> bool:
        """Release the lock, :meth:`_post`, take it back (called with the lock held)."""
        self._busy = True
        self._cond.release()
        try:
            return self._post(body, what)
        finally:
            self._cond.acquire()
            self._busy = False
            self._cond.notify_all()

    def _post(self, body: bytes, what: str) -> bool:
        """POST ``body``; retries with backoff; True when the receiver answered 2xx. Called
        WITHOUT the lock."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            left = self._remaining()
            if left is not None and left <= 0:
                break
            timeout = self.timeout_s if left is None else max(0.05, min(self.timeout_s, left))
            req = urllib.request.Request(self.url_for_post(), data=body, method="POST",
                                         headers=self._headers)
            retry = True
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    resp.read(65536)
                return True
            except urllib.error.HTTPError as exc:
                retry = exc.code in (408, 429) or exc.code >= 500
                reason = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                r = getattr(exc, "reason", exc)
                reason = getattr(r, "strerror", None) or type(r).__name__
            self._logs.warn(reason, f"{self.kind} {self.name}: {what} to "
                            f"{_redacted(self.url)} failed: {reason}"
                            + (f" (attempt {attempt + 1}/{self.retries + 1})" if retry else ""))
            if not retry or attempt == self.retries:
                break
            left = self._remaining()
            pause = min(delay, _MAX_BACKOFF_S) if left is None else min(delay, max(0.0, left))
            self._wake.wait(pause)  # a close() cuts the pause so the deadline is kept
            delay *= 2
        return False

    def url_for_post(self) -> str:
        return self.url

    # -- shutdown -------------------------------------------------------------------------
    def close(self, deadline_s: float = 5.0) -> FlushReport:
        """Stop accepting changes, deliver what is queued within ``deadline_s`` seconds,
        stop the thread; the report (and one log line) names what was not delivered."""
        with self._cond:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + max(0.0, deadline_s)
                self._sent_at_close = self._sent
            self._cond.notify_all()
        self._wake.set()
        self._thread.join(max(0.0, deadline_s) + 1.0)
        with self._cond:
            undelivered = tuple(self._undelivered())
            delivered = self._sent - self._sent_at_close
        if undelivered:
            shown = ", ".join(undelivered[:10]) + (" ..." if len(undelivered) > 10 else "")
            log.warning("%s %s: %d notification(s) not delivered at shutdown: %s", self.kind,
                        self.name, len(undelivered), shown)
        return FlushReport(delivered, undelivered)

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class _Tracked:
    inc: Incident
    key: tuple[str, str, str, str]  # (status, severity, fault, resource)
    delivered_key: tuple[str, str, str, str] | None = None
    posted_labels: dict[str, str] | None = None  # label set Alertmanager holds for it
    last_post_s: float | None = None  # clock() of the last delivery attempt


def _am_key(inc: Incident) -> tuple[str, str, str, str]:
    top = inc.root_causes[0] if inc.root_causes else None
    return (inc.status, inc.severity, incident_kind(inc), top.resource if top else "")


class AlertmanagerSink(_Sink):
    """Open incidents as firing Alertmanager alerts, closed ones as resolved (module doc).

    ``url`` is Alertmanager's base URL (``http://alertmanager:9093``); alerts go to
    ``{url}/api/v2/alerts``. ``max_queue`` bounds the incidents tracked (open ones and
    resolves not yet delivered); a new incident past it is counted in ``dropped``.

    Labels are an alert's identity in Alertmanager, and ``severity``, ``fault`` and
    ``resource`` change when the diagnosis changes its mind: the POST that carries the new
    label set also carries the old one resolved (``endsAt`` = now), as Prometheus does for
    an alert whose labels changed, so one incident is never two firing alerts.
    ``sent`` / ``failed`` count incidents notified, not alert objects.
    """

    kind = "alertmanager"

    def __init__(self, url: str, *, console_url: str, resend_s: float = 60.0,
                 timeout_s: float = 3.0, max_queue: int = 10_000,
                 clock: Callable[[], float] = time.time, time_base_s: float = 0.0,
                 fabric: str = "", name: str = "alertmanager", retries: int = 3,
                 backoff_s: float = 0.5, headers: Mapping[str, str] | None = None) -> None:
        if resend_s <= 0:
            raise ConfigError(f"--alertmanager: resend interval must be > 0 s, got {resend_s}")
        self.resend_s = resend_s
        self.time_base_s = time_base_s
        self.fabric = fabric
        self._tracked: OrderedDict[str, _Tracked] = OrderedDict()
        self._due: OrderedDict[str, None] = OrderedDict()  # changed: post at once
        self._tried_at_close: set[str] = set()
        super().__init__(url, flag="--alertmanager", name=name, console_url=console_url,
                         timeout_s=timeout_s, max_queue=max_queue, retries=retries,
                         backoff_s=backoff_s, headers=headers, clock=clock)

    def url_for_post(self) -> str:
        return self.url + "/api/v2/alerts"

    def _offer(self, inc: Incident) -> bool:
        key = _am_key(inc)
        t = self._tracked.get(inc.id)
        if t is None:
            if inc.status == "closed":
                return False  # never reported firing: nothing to resolve
            if len(self._tracked) >= self.max_queue:
                self._dropped += 1
                self._logs.warn("full", f"alertmanager {self.name}: {self.max_queue} incidents "
                                "tracked, new ones dropped")
                return False
            self._tracked[inc.id] = _Tracked(inc, key)
            self._due[inc.id] = None
            return True
        t.inc = inc  # newest annotations go out with the next (re)send
        if key == t.key:
            return False
        t.key = key
        self._due[inc.id] = None
        return True

    def _pending(self) -> int:
        return len(self._due)

    def _to_post(self, now: float) -> list[str]:
        ids = list(self._due)[:_BATCH]
        if len(ids) >= _BATCH:
            return ids
        if self._closing:
            # a last try for every incident whose current state Alertmanager has not got
            more = [i for i, t in self._tracked.items() if i not in self._due
                    and t.delivered_key != t.key and i not in self._tried_at_close]
        else:
            more = [i for i, t in self._tracked.items() if i not in self._due
                    and (t.last_post_s is None or now - t.last_post_s >= self.resend_s)
                    and (t.key[0] == "open" or t.delivered_key != t.key)]
        return ids + more[: _BATCH - len(ids)]

    def _wait_s(self) -> float | None:
        if self._due:
            return 0.0
        times = [t.last_post_s for t in self._tracked.values() if t.last_post_s is not None
                 and (t.key[0] == "open" or t.delivered_key != t.key)]
        if not times:
            return None
        return max(0.01, min(times) + self.resend_s - self.clock())

    def _deliver_some(self) -> bool:
        now = self.clock()
        ids = self._to_post(now)
        if not ids:
            return False
        sent: dict[str, tuple[tuple[str, str, str, str], dict[str, str]]] = {}
        alerts = []
        for i in ids:
            self._due.pop(i, None)
            if self._closing:
                self._tried_at_close.add(i)
            tr = self._tracked[i]
            tr.last_post_s = now
            alert = postable_alert(tr.inc, console_url=self.console_url, now_s=now,
                                   time_base_s=self.time_base_s, resend_s=self.resend_s,
                                   fabric=self.fabric)
            if tr.posted_labels is not None and tr.posted_labels != alert["labels"]:
                alerts.append({**alert, "labels": tr.posted_labels,
                               "endsAt": _rfc3339(now)})  # the old label set, resolved
            alerts.append(alert)
            sent[i] = (tr.key, alert["labels"])
        ok = self._post_unlocked(json.dumps(alerts).encode(), f"{len(alerts)} alert(s)")
        for i, (key, labels) in sent.items():
            t = self._tracked.get(i)
            if ok:
                self._sent += 1
                self._tried_at_close.discard(i)
                if t is not None:
                    t.delivered_key, t.posted_labels = key, labels
                    if key[0] == "closed" and t.key == key:
                        del self._tracked[i]  # resolved and told: forget it
            else:
                self._failed += 1
        return True

    def _undelivered(self) -> list[str]:
        return sorted(set(self._due) | {i for i, t in self._tracked.items()
                                        if t.delivered_key != t.key})


class WebhookSink(_Sink):
    """One JSON POST per incident change (``opened`` / ``updated`` / ``resolved``; module
    doc), deduplicated by content. ``max_queue`` bounds the pending notifications (past it
    a change is counted in ``dropped``) and the incidents remembered for deduplication."""

    kind = "webhook"

    def __init__(self, url: str, *, console_url: str, timeout_s: float = 3.0,
                 max_queue: int = 10_000, clock: Callable[[], float] = time.time,
                 name: str = "webhook", retries: int = 3, backoff_s: float = 0.5,
                 headers: Mapping[str, str] | None = None) -> None:
        self._seen: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (digest, status)
        self._queue: deque[tuple[str, bytes]] = deque()
        self._failed_at_close: list[str] = []
        super().__init__(url, flag="--webhook", name=name, console_url=console_url,
                         timeout_s=timeout_s, max_queue=max_queue, retries=retries,
                         backoff_s=backoff_s, headers=headers, clock=clock)

    def _offer(self, inc: Incident) -> bool:
        doc = incident_to_json(inc)
        content = {k: v for k, v in doc.items() if k != "updated_ns"}
        digest = hashlib.blake2s(json.dumps(content, sort_keys=True).encode(),
                                 digest_size=16).hexdigest()
        prev = self._seen.get(inc.id)
        if prev is not None and prev[0] == digest:
            return False
        if inc.status == "closed":
            if prev is None:
                return False  # never reported open: nothing to resolve
            event = "resolved"
        else:
            event = "opened" if prev is None or prev[1] == "closed" else "updated"
        if len(self._queue) >= self.max_queue:
            self._dropped += 1
            self._logs.warn("full", f"webhook {self.name}: {self.max_queue} notifications "
                            "queued, new ones dropped")
            return False
        body = json.dumps({"event": event, "incident": doc,
                           "url": incident_link(self.console_url, inc.id)}).encode()
        self._queue.append((inc.id, body))
        self._seen[inc.id] = (digest, inc.status)
        self._seen.move_to_end(inc.id)
        while len(self._seen) > self.max_queue:
            self._seen.popitem(last=False)
        return True

    def _pending(self) -> int:
        return len(self._queue)

    def _deliver_some(self) -> bool:
        if not self._queue:
            return False
        inc_id, body = self._queue.popleft()
        ok = self._post_unlocked(body, f"incident {inc_id}")
        if ok:
            self._sent += 1
        else:
            self._failed += 1
            if self._closing:
                self._failed_at_close.append(inc_id)
        return True

    def _undelivered(self) -> list[str]:
        return [i for i, _ in self._queue] + self._failed_at_close
