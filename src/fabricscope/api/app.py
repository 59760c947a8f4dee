"""The console's HTTP API (FastAPI, OpenAPI at ``/api/openapi.json``), web UI and ``/metrics``.

Parses requests and calls the state and services, nothing else (ARCHITECTURE.md: entry
points). Every ``/api/*`` and ``/metrics`` request is authenticated (:mod:`.auth`); ``/`` and
``/static/*`` (the page itself, which asks for the token) are public. Bad parameters are 400
with one line naming the parameter and the value; unknown ids 404; nothing returns a
traceback. The endpoints are listed in docs/console.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import Body, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.base import BaseHTTPMiddleware

from fabricscope import __version__
from fabricscope.api.auth import Authenticator
from fabricscope.api.events import EventHub, incident_item, sse
from fabricscope.diagnosis.serialize import incident_to_json, observed_to_json
from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.service.console.services import ConsoleServices
from fabricscope.service.console.state import SEVERITIES, ConsoleState

log = logging.getLogger("fabricscope.serve.http")

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """Credentials and limits of the API."""

    token: str
    user: str = "fabricscope"
    public_url: str = "http://127.0.0.1:8765"
    max_failures: int = 5  # consecutive failed logins before an address is locked out
    lockout_s: float = 30.0
    max_sse_clients: int = 1000


#: Largest request body accepted (a what-if scenario, an advisor question): 1 MiB.
MAX_BODY = 1 << 20


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes`` (by Content-Length, or
    counted as it streams in), so no request can make the server buffer without bound. The
    body is read here (at most ``max_bytes`` held) and replayed to the app."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cl = dict(scope.get("headers") or ()).get(b"content-length")
        if cl is not None and (not cl.isdigit() or int(cl) > self.max_bytes):
            await self._refuse(send)
            return
        held: list[Any] = []
        seen = 0
        while True:
            msg = await receive()
            held.append(msg)
            if msg["type"] != "http.request":
                break
            seen += len(msg.get("body", b""))
            if seen > self.max_bytes:
                await self._refuse(send)
                return
            if not msg.get("more_body", False):
                break

        async def replay() -> Any:
            return held.pop(0) if held else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        body = (b'{"detail":"request body: larger than %d bytes"}' % self.max_bytes)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _bad(param: str, value: object, why: str) -> HTTPException:
    return HTTPException(400, f"{param}: {why}, got {value!r}")


class _Stats:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()

    def total(self) -> int:
        return sum(self.requests.values())


def _fabric_doc(state: ConsoleState) -> dict[str, Any]:
    fab = state.fabric
    devs = sorted(fab.devices.values(), key=lambda d: (-d.tier, d.id))
    index = {d.id: i for i, d in enumerate(devs)}
    hosts = [d for d in devs if d.role == "host"]
    links_a, links_b, ids, gbps = [], [], [], []
    for lk in fab.links:
        a = lk.a.rsplit(":", 1)[0]
        b = lk.b.rsplit(":", 1)[0]
        links_a.append(index[a])
        links_b.append(index[b])
        ids.append(lk.id)
        gbps.append(lk.capacity_gbps)
    return {
        "name": fab.name,
        "counts": {"hosts": len(hosts), "gpus": sum(d.gpus for d in hosts),
                   "nics": sum(1 for d in devs if d.role == "nic"),
                   "switches": sum(1 for d in devs if d.is_switch), "links": len(ids)},
        "devices": {"id": [d.id for d in devs], "role": [d.role for d in devs],
                    "tier": [_tier(d) for d in devs], "pod": [d.pod for d in devs],
                    "plane": [d.plane for d in devs], "rail": [d.rail for d in devs]},
        "links": {"id": ids, "a": links_a, "b": links_b, "gbps": gbps},
    }


def _tier(d: Any) -> int:
    """0 hosts, 1 NICs, 2 leaves, 3 spines, 4 core (the page draws bottom to top)."""
    order = {"host": 0, "nic": 1, "leaf": 2, "spine": 3, "core": 4, "superspine": 4}
    return order.get(str(d.role), 2 + int(getattr(d, "tier", 0) or 0))


def create_app(state: ConsoleState, settings: ApiSettings,
               services: ConsoleServices | None = None) -> FastAPI:
    """The ASGI app of ``fabricscope serve`` over ``state`` (see module doc)."""
    svc = services or ConsoleServices()
    auth = Authenticator(settings.token, user=settings.user,
                         max_failures=settings.max_failures, lockout_s=settings.lockout_s)
    hub = EventHub(state, max_clients=settings.max_sse_clients)
    stats = _Stats()
    fabric_cache: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        hub.attach(asyncio.get_running_loop())
        try:
            yield
        finally:
            hub.detach()

    app = FastAPI(title="fabricscope console API", version=__version__,
                  description="Incidents, findings, telemetry, probes, stragglers, optics and "
                              "what-if runs of a fabricscope supervisor. Every /api/* and "
                              "/metrics request needs `Authorization: Bearer TOKEN`.",
                  openapi_url="/api/openapi.json", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.console = state
    app.state.services = svc
    app.state.auth = auth
    app.state.hub = hub
    app.state.stats = stats

    class AuthMiddleware(BaseHTTPMiddleware):
        async def dispatch(self, request: Request,
                           call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            path = request.url.path
            if path.startswith("/api/") or path == "/metrics":
                client = request.client.host if request.client else "?"
                v = auth.check(request.headers.get("authorization"), client)
                if not v.ok:
                    stats.requests[("auth", v.status)] += 1
                    headers = {"WWW-Authenticate": 'Bearer realm="fabricscope"'}
                    if v.status == 429:
                        headers["Retry-After"] = str(v.retry_after_s)
                    return JSONResponse({"detail": v.reason}, status_code=v.status,
                                        headers=headers)
            try:
                resp = await call_next(request)
            except Exception:
                log.exception("%s %s failed", request.method, path)
                resp = JSONResponse({"detail": "internal error (see the server log)"}, 500)
            route = request.scope.get("route")
            stats.requests[(getattr(route, "path", "other"), resp.status_code)] += 1
            resp.headers.setdefault("Cache-Control", "no-store")
            resp.headers.setdefault("X-Content-Type-Options", "nosniff")
            return resp

    app.add_middleware(AuthMiddleware)
    app.add_middleware(BodyLimit)  # outermost: counts the bytes before anything reads them

    @app.exception_handler(FabricscopeError)
    async def _fs_error(_request: Request, exc: FabricscopeError) -> JSONResponse:
        # a bad value in the request is the client's (400); a store or socket problem is
        # the server's, and may pass (503)
        return JSONResponse({"detail": str(exc)},
                            status_code=400 if isinstance(exc, ConfigError) else 503)

    # -- status and fabric --------------------------------------------------------------
    @app.get("/api/v1/status", tags=["fabric"])
    def status() -> dict[str, Any]:
        """Headline numbers: mode, fabric, simulated time, open incidents."""
        return {**state.snapshot(), "version": __version__, "sse_clients": hub.clients}

    @app.get("/api/v1/fabric", tags=["fabric"])
    def fabric() -> Response:
        """The inventory, columnar: devices (id, role, tier, pod, plane, rail) and links
        (id, device indices a / b, capacity)."""
        if "body" not in fabric_cache:
            import json

            fabric_cache["body"] = json.dumps(_fabric_doc(state), separators=(",", ":"))
        return Response(fabric_cache["body"], media_type="application/json")

    @app.get("/api/v1/fabric/overlay", tags=["fabric"])
    def overlay(metric: str = Query("utilization", description="utilization, loss, pfc, "
                                    "optics or state")) -> dict[str, Any]:
        """Per-link values of one metric (sparse: links without a value are healthy / idle)."""
        if metric not in ("utilization", "loss", "pfc", "optics", "state"):
            raise _bad("metric", metric, "expected utilization, loss, pfc, optics or state")
        ov = state.view("overlay") or {}
        values = dict(ov.get(metric, {}))
        if metric == "state":
            for inc in state.incidents(status="open", limit=10_000)[1]:
                for rc in inc.root_causes:
                    if rc.fault == "link-down" and "|" in rc.resource:
                        values[rc.resource] = 1.0
        return {"metric": metric, "sim_ns": state.sim_ns, "values": values,
                "max": max(values.values(), default=0.0)}

    @app.get("/api/v1/fabric/links", tags=["fabric"])
    def links(state_: str | None = Query(None, alias="state"),
              limit: int = Query(1000, ge=1, le=100_000)) -> dict[str, Any]:
        """Links with their state (down when an open incident says so) and overlay values."""
        ov = state.view("overlay") or {}
        down = {rc.resource for inc in state.incidents(status="open", limit=10_000)[1]
                for rc in inc.root_causes if rc.fault == "link-down"}
        out = []
        for lk in state.fabric.links:
            st = "down" if lk.id in down else "up"
            if state_ and st != state_:
                continue
            out.append({"id": lk.id, "a": lk.a, "b": lk.b, "gbps": lk.capacity_gbps,
                        "state": st, **{m: ov.get(m, {}).get(lk.id) for m in
                                        ("utilization", "loss", "pfc")}})
            if len(out) >= limit:
                break
        return {"items": out, "counts": state.view("links")}

    # -- incidents ----------------------------------------------------------------------
    @app.get("/api/v1/incidents", tags=["incidents"])
    def incidents(status_: str | None = Query(None, alias="status"),
                  severity: str | None = None, kind: str | None = None,
                  q: str | None = Query(None, max_length=200),
                  limit: int = Query(100, ge=1, le=1000),
                  offset: int = Query(0, ge=0)) -> dict[str, Any]:
        """Incidents, newest first, filtered by status, severity, kind (the top root cause's
        fault type) and a search string."""
        if status_ not in (None, "", "open", "closed"):
            raise _bad("status", status_, "expected open or closed")
        if severity not in (None, "", *SEVERITIES):
            raise _bad("severity", severity, f"expected one of {', '.join(SEVERITIES)}")
        total, items = state.incidents(status=status_ or None, severity=severity or None,
                                       kind=kind or None, q=q or None, limit=limit,
                                       offset=offset)
        return {"total": total, "offset": offset,
                "items": [incident_item(i, state.ack_of(i.id) is not None) for i in items]}

    def _incident_or_404(id: str) -> Any:
        inc = state.incident(id)
        if inc is None:
            raise HTTPException(404, f"incident {id!r}: not found")
        return inc

    @app.get("/api/v1/incidents/{id}", tags=["incidents"])
    def incident(id: str) -> dict[str, Any]:
        """One incident with its evidence (the findings), history, ack and approvals."""
        inc = _incident_or_404(id)
        ack = state.ack_of(id)
        return {
            "incident": incident_to_json(inc), "kind": incident_item(inc)["kind"],
            "findings": [observed_to_json(o) for o in state.findings(ids=list(inc.findings))],
            "history": [{"sim_ns": t, "what": w} for t, w in state.history(id)],
            "ack": None if ack is None else {"by": ack.by, "at_s": ack.at_s, "note": ack.note},
            "approvals": [{"by": a.by, "at_s": a.at_s, "action": a.action,
                           "executed": a.executed, "note": a.note, "result": a.result}
                          for a in state.approvals_of(id)],
            "undoable": state.undoable(id),
        }

    @app.post("/api/v1/incidents/{id}/ack", tags=["incidents"])
    def ack(id: str, body: dict[str, Any] = Body(default={})) -> dict[str, Any]:
        """Acknowledge an incident (``{"note": "..."}`` optional)."""
        _incident_or_404(id)
        note = body.get("note", "")
        if not isinstance(note, str):
            raise _bad("note", note, "expected a string")
        a = state.acknowledge(id, settings.user, note)
        assert a is not None
        return {"ack": {"by": a.by, "at_s": a.at_s, "note": a.note}}

    @app.post("/api/v1/incidents/{id}/approve", tags=["incidents"])
    def approve(id: str, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """Approve one of the incident's proposed actions (``{"action": "..."}``). Executed
        when the console runs with actions on (``approve`` / ``auto``), an executor is
        configured and the action is on the allow-list of reversible ones; otherwise
        recorded only. Either way the answer and the incident's history say which."""
        inc = _incident_or_404(id)
        action = body.get("action")
        note = body.get("note", "")
        if not isinstance(action, str) or not isinstance(note, str):
            raise _bad("action", action, "expected a string")
        a = state.approve(id, action, settings.user, note)
        if a is None:
            proposed = sorted({rc.action for rc in inc.root_causes if rc.action})
            raise HTTPException(400, f"action: not one of the incident's proposed actions "
                                     f"({'; '.join(proposed) or 'none'}), got {action!r}")
        return {"approval": {"by": a.by, "at_s": a.at_s, "action": a.action,
                             "executed": a.executed, "result": a.result},
                "detail": "approval recorded; " + a.result}

    @app.post("/api/v1/incidents/{id}/undo", tags=["incidents"])
    def undo(id: str, body: dict[str, Any] = Body(default={})) -> dict[str, Any]:
        """Undo the incident's last executed action (a cost-in after a cost-out,
        ``{"note": "..."}`` optional); recorded in its history. 400 when nothing was
        executed."""
        _incident_or_404(id)
        note = body.get("note", "")
        if not isinstance(note, str):
            raise _bad("note", note, "expected a string")
        r = state.undo(id, settings.user, note)
        if r is None:
            raise HTTPException(400, "undo: the incident has no executed action to undo")
        return {"undo": {"ok": r[0], "result": r[1]}}

    @app.get("/api/v1/findings", tags=["findings"])
    def findings(source: str | None = None, kind: str | None = None,
                 subject: str | None = None, since_ns: int | None = None,
                 limit: int = Query(200, ge=1, le=10_000)) -> dict[str, Any]:
        """Findings of every instrument, newest first."""
        items = state.findings(source=source, kind=kind, subject=subject, since_ns=since_ns,
                               limit=limit)
        return {"items": [observed_to_json(o) for o in items]}

    # -- telemetry ----------------------------------------------------------------------
    @app.get("/api/v1/findings/{id}/counters", tags=["findings"])
    def finding_counters(id: str, points: int = Query(120, ge=2, le=2000)) -> dict[str, Any]:
        """The counters behind a telemetry finding on a port: every series of that port from
        a minute before its evidence window to 30 s after (clamped to now), those that moved
        first (counters as per-second rates, gauges as maxima). Another finding: no series,
        and the reason."""
        from fabricscope.store.series import port_series

        found = state.findings(ids=[id])
        if not found:
            raise HTTPException(404, f"finding {id!r}: not found")
        o = found[0]
        port = o.subject.split("->")[0].split("|")[0]
        dev, sep, ifname = port.rpartition(":")
        if o.source != "telemetry" or not sep or port not in state.fabric.ports:
            return {"finding": id, "series": [], "window": list(o.finding.window),
                    "reason": f"not a telemetry finding on a port ({o.source} on {o.subject})"}
        w0, w1 = o.finding.window
        start, end = max(0, w0 - 60 * NS), w1 + 30 * NS
        if state.mode == "twin":
            end = min(end, state.sim_ns)
        if end <= start:
            end = start + NS
        cur = _cursor()
        try:
            series = port_series(cur, target=dev, interface=ifname, start_ns=start,
                                 end_ns=end, points=points)
        finally:
            cur.close()
        return {"finding": id, "target": dev, "interface": ifname, "start_ns": start,
                "end_ns": end, "window": [w0, w1], "series": series}

    def _cursor() -> Any:
        try:
            con = svc.open_telemetry()
        except FabricscopeError as exc:  # the store is briefly held, or gone
            raise HTTPException(503, f"telemetry: {exc}") from None
        if con is None:
            raise HTTPException(404, "telemetry: no telemetry store in this console "
                                     "(serve --config with sources.telemetry, or the twin)")
        return con

    @app.get("/api/v1/telemetry/names", tags=["telemetry"])
    def telemetry_names() -> dict[str, Any]:
        """The series names in the telemetry store and how many devices report each."""
        from fabricscope.store.series import series_names

        cur = _cursor()
        try:
            return {"names": series_names(cur)}
        finally:
            cur.close()

    @app.get("/api/v1/telemetry/series", tags=["telemetry"])
    def telemetry_series(target: str, name: str, interface: str | None = None,
                         queue: str | None = None, start_ns: int | None = None,
                         end_ns: int | None = None, points: int = Query(600, ge=1, le=10_000),
                         agg: str = "mean") -> dict[str, Any]:
        """One series (device ``target``, schema path ``name``, optional interface / queue)
        over ``[start_ns, end_ns]`` (default: the last hour), downsampled server-side into at
        most ``points`` buckets (``agg``: mean, max, min, last or rate)."""
        from fabricscope.store.series import query_series

        end = end_ns if end_ns is not None else (state.sim_ns if state.mode == "twin"
                                                 else time.time_ns())
        start = start_ns if start_ns is not None else end - 3600 * NS
        if state.mode == "twin":
            end = min(end, state.sim_ns)  # nothing from the future the twin computed ahead
            start = max(0, start)
        if end <= start:
            raise _bad("end_ns", end, f"must be after start_ns ({start})")
        tags = {k: v for k, v in (("interface_name", interface), ("queue_name", queue)) if v}
        cur = _cursor()
        try:
            doc = query_series(cur, target=target, name=name, tags=tags, start_ns=start,
                               end_ns=end, points=points, agg=agg)
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from None
        finally:
            cur.close()
        if doc["instances"] > 1:
            raise HTTPException(400, f"{name} on {target}: matches {doc['instances']} series; "
                                     "give interface= (and queue=) to pick one")
        return doc

    # -- instrument views ---------------------------------------------------------------
    def _view(name: str, what: str) -> dict[str, Any]:
        v = state.view(name)
        if v is None:
            raise HTTPException(404, f"{what}: no data yet (no instrument has reported it)")
        return {"sim_ns": state.sim_ns, **v}

    @app.get("/api/v1/probes/matrix", tags=["probes"])
    def probes_matrix() -> dict[str, Any]:
        """The probe loss / latency matrix of the last analysis window."""
        return _view("probes", "probes")

    @app.get("/api/v1/stragglers", tags=["stragglers"])
    def stragglers() -> dict[str, Any]:
        """The training job's per-rank slowdown timeline and the straggler findings."""
        doc = _view("stragglers", "stragglers")
        doc["findings"] = [observed_to_json(o) for o in state.findings(source="straggler",
                                                                        limit=200)]
        return doc

    @app.get("/api/v1/optics", tags=["optics"])
    def optics() -> dict[str, Any]:
        """The optics fleet: each port's grade and latest DOM readings."""
        return _view("optics", "optics")

    @app.get("/api/v1/optics/{port:path}", tags=["optics"])
    def optics_port(port: str) -> dict[str, Any]:
        """One port's per-lane DOM history."""
        hist = state.view("optics_history") or {}
        if port not in hist:
            raise HTTPException(404, f"optics: no DOM history for port {port!r}")
        return {"port": port, **hist[port]}

    @app.get("/api/v1/health/checks", tags=["health"])
    def health_checks() -> dict[str, Any]:
        """Collective and host checks (not built in this release: issue 16)."""
        v = state.view("health")
        if v is not None:
            return {"available": True, **v}
        return {"available": False, "checks": [],
                "reason": "collective / host / service health checks are not built in this "
                          "release; nothing to show"}

    # -- what-if, advisor, twin faults ----------------------------------------------------
    @app.post("/api/v1/whatif", tags=["what-if"], status_code=202)
    def whatif_submit(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """Submit a simulator what-if (``{"scenario": {...}}``, the scenario file's schema:
        docs/sim.md); poll ``GET /api/v1/whatif/{id}``."""
        if svc.whatif is None:
            raise HTTPException(404, "what-if: not enabled in this console")
        if "scenario" not in body:
            raise _bad("scenario", None, "expected the scenario document")
        from fabricscope.service.console.whatif import QueueFull

        try:
            run = svc.whatif.submit(body["scenario"])
        except QueueFull as exc:
            raise HTTPException(429, str(exc)) from None
        return {"id": run.id, "status": run.status}

    @app.get("/api/v1/whatif", tags=["what-if"])
    def whatif_list() -> dict[str, Any]:
        """The kept what-if runs."""
        runs = svc.whatif.list() if svc.whatif is not None else []
        return {"items": [{"id": r.id, "status": r.status, "name": r.scenario.name}
                          for r in runs]}

    @app.get("/api/v1/whatif/{id}", tags=["what-if"])
    def whatif_get(id: str) -> dict[str, Any]:
        """A what-if run: status, then its comparison table and conclusions."""
        run = svc.whatif.get(id) if svc.whatif is not None else None
        if run is None:
            raise HTTPException(404, f"what-if {id!r}: not found")
        return run.to_json()

    @app.post("/api/v1/advise", tags=["advisor"])
    def advise(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """The advisor over the console's findings: ``{"symptom": "text", "subject": id}``
        (either optional) -> ranked root causes and a troubleshooting plan."""
        from fabricscope.service.advisor import advise_findings

        symptom, subject = body.get("symptom"), body.get("subject")
        for k, v in (("symptom", symptom), ("subject", subject)):
            if v is not None and (not isinstance(v, str) or len(v) > 2000):
                raise _bad(k, v, "expected a string of at most 2000 characters")
        found = state.findings(limit=50_000)
        found.sort(key=lambda o: (o.reported_ns, o.source, o.id))
        counts: dict[str, int] = dict(Counter(o.source for o in found))
        ans = advise_findings(state.fabric, found, counts or {"console": 0},
                              symptom=symptom or None, subject=subject or None, kb=svc.kb)
        return {"answer": ans.to_json()}

    def _supervisor() -> Any:
        if svc.supervisor is None or not hasattr(svc.supervisor, "inject"):
            raise HTTPException(404, "twin: this console does not run the twin")
        return svc.supervisor

    @app.post("/api/v1/twin/faults", tags=["twin"], status_code=201)
    def twin_inject(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """Inject a fault on the twin now: ``{"fault": "KIND:SUBJECT[@START[-END]][,K=V]"}``
        with START/END counted from the current simulated time."""
        sup = _supervisor()
        text = body.get("fault")
        if not isinstance(text, str) or len(text) > 500:
            raise _bad("fault", text, "expected KIND:SUBJECT[@START[-END]][,K=V]")
        inj = sup.inject(text)
        f = inj.fault
        return {"fault": {"kind": f.kind, "subject": f.subject, "start_ns": f.start_ns,
                          "end_ns": f.end_ns, "params": dict(f.params)},
                "start_ns": f.start_ns}

    @app.get("/api/v1/twin/faults", tags=["twin"])
    def twin_faults() -> dict[str, Any]:
        """The faults injected so far."""
        sup = _supervisor()
        return {"items": [{"text": i.text, "kind": i.fault.kind, "subject": i.fault.subject,
                           "start_ns": i.fault.start_ns, "end_ns": i.fault.end_ns,
                           "mitigated": i.mitigated}
                          for i in sup.faults()]}

    # -- live updates, metrics, the page ------------------------------------------------
    @app.get("/api/v1/events", tags=["live"])
    def events() -> StreamingResponse:
        """Server-sent events: ``incident``, ``finding``, ``tick``, ``ack``, ``approve``."""
        if hub.full():
            raise HTTPException(503, f"events: {hub.max_clients} clients already connected")
        first = sse("status", state.snapshot())
        return StreamingResponse(hub.stream(first), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})

    @app.get("/metrics", tags=["metrics"], include_in_schema=False)
    def metrics() -> Response:
        from fabricscope.service.console.metrics import CONTENT_TYPE, render_metrics

        extra = {"fabricscope_http_requests_total": float(stats.total()),
                 "fabricscope_http_login_failures_total": float(auth.failures),
                 "fabricscope_sse_clients": float(hub.clients)}
        return Response(render_metrics(state, extra, sinks=svc.sinks.values()),
                        media_type=CONTENT_TYPE)

    static_dir = resources.files("fabricscope.api") / "static"
    app.mount("/static", StaticFiles(directory=str(static_dir)), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        page = static_dir / "index.html"
        if not page.is_file():
            return Response("fabricscope console: the web UI is not installed", 503)
        return Response(page.read_bytes(), media_type="text/html; charset=utf-8",
                        headers={"Content-Security-Policy":
                                 "default-src 'self'; img-src 'self' data:; "
                                 "style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'; "
                                 "frame-ancestors 'none'"})

    return app
