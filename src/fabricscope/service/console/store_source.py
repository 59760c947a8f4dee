"""The console on live sources: follow the stores the live tools write, diagnose as they grow.

``fabricscope serve --config console.yaml`` does not run instruments itself. The collectors
run as their own processes (``gnmi collect`` writing a rolling telemetry store, queryable
while it writes: docs/design/telemetry-query-while-collecting.md; ``supervise --db`` or any
writer of a diagnosis store). Every ``poll`` seconds, :class:`StoreSupervisor` opens each
store read-only for a moment, takes the findings it has not seen, feeds them to the same
:class:`~fabricscope.diagnosis.incidents.Correlator` ``supervise`` uses (on the wall clock,
nanoseconds since the epoch), and publishes new and changed incidents to the console state.
It never holds a store open between polls, so the collector's folds are not blocked.

After an executed ``cost-out-link`` (:meth:`ConsoleState.costed_out`), the link-down and
link-flap findings of that cable that begin after it are the action's own effect: they are
counted (``findings_after_cost_out`` in ``/api/v1/status``) and not correlated, so the console
does not open an incident for the link it took down itself.

The config file::

    inventory: fabric.yaml          # the fabric the sources report on (required)
    sources:
      telemetry: telemetry.duckdb   # a `gnmi collect` store: its detector findings + series
      findings: incidents.duckdb    # a diagnosis store (`supervise --db`)
    poll: 5s                        # optional, default 5 s
    actions:                        # optional: what `serve --actions approve|auto` acts through
      gnmi: collector.yaml          # a `gnmi collect` config: targets, credentials, TLS

Paths are relative to the config file. At least one source is required. A store that does
not exist yet is accepted with a note (a console may start before its collector). Every mistake is one
:class:`~fabricscope.model.errors.ConfigError` naming the file, the field and the value.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import yaml

from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator
from fabricscope.diagnosis.knowledge import KnowledgeBase, load_kb
from fabricscope.diagnosis.model import Observed
from fabricscope.diagnosis.specialists import Coverage
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.service.console.background import BackgroundLoop
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.supervise_twin import NS, parse_time_s, switch_telemetry_sees

log = logging.getLogger("fabricscope.serve.live")

_KEYS = {"inventory", "sources", "poll", "actions"}
_EXPECTED_AFTER_COST_OUT = frozenset({"link-down", "link-flap"})
_SOURCES = {"telemetry", "findings"}


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """A validated ``serve --config`` file."""

    path: Path
    inventory: Path
    telemetry_db: Path | None
    findings_db: Path | None
    poll_s: float = 5.0
    notes: tuple[str, ...] = ()  # warnings for the operator (a store not written yet)
    actions_gnmi: Path | None = None  # collector config the gNMI executor acts through


def read_live_config(path: Path) -> LiveConfig:
    """Read and validate ``path`` (see the module doc for the schema)."""
    src = f"--config {path}"
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{src}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{src}: not a text file (byte {exc.start} is not UTF-8)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{src}:{where}: not valid YAML") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{src}: expected a mapping with inventory and sources, got "
                          f"{type(doc).__name__}")
    unknown = sorted(set(map(str, doc)) - _KEYS)
    if unknown:
        raise ConfigError(f"{src}: {unknown[0]!r}: unknown key (known: {', '.join(sorted(_KEYS))})")
    base = path.parent

    def file(field: str, value: object, must_exist: bool = True) -> Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{src}: {field}: expected a file path, got {value!r}")
        p = Path(value) if Path(value).is_absolute() else base / value
        if must_exist and not p.exists():
            raise ConfigError(f"{src}: {field}: {value!r}: no such file")
        return p

    if "inventory" not in doc:
        raise ConfigError(f"{src}: inventory: required (the fabric the sources report on)")
    inv = file("inventory", doc["inventory"])
    sources = doc.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise ConfigError(f"{src}: sources: expected a mapping with telemetry and/or findings, "
                          f"got {sources!r}")
    bad = sorted(set(map(str, sources)) - _SOURCES)
    if bad:
        raise ConfigError(f"{src}: sources.{bad[0]!r}: unknown source (known: "
                          f"{', '.join(sorted(_SOURCES))})")
    notes: list[str] = []

    def store(field: str) -> Path | None:
        if field not in sources:
            return None
        p = file(f"sources.{field}", sources[field], must_exist=False)
        if not p.parent.is_dir():
            raise ConfigError(f"{src}: sources.{field}: {sources[field]!r}: no such directory "
                              f"{str(p.parent)!r}")
        if not p.exists() and not Path(f"{p}.parts").is_dir():
            # a console may start before its collector: say so, and read it once it exists
            notes.append(f"sources.{field}: {p} does not exist yet; it is read once its "
                         "writer creates it (until then /api/v1/status shows the error)")
        return p

    tel = store("telemetry")
    fnd = store("findings")
    poll = doc.get("poll", "5s")
    poll_s = parse_time_s(str(poll), source=f"{src}: poll")
    if not 0.2 <= poll_s <= 3600:
        raise ConfigError(f"{src}: poll: expected 0.2 s .. 1 h, got {poll!r}")
    actions = doc.get("actions")
    gnmi: Path | None = None
    if actions is not None:
        if not isinstance(actions, dict) or set(map(str, actions)) != {"gnmi"}:
            raise ConfigError(f"{src}: actions: expected a mapping with gnmi: COLLECTOR.yaml, "
                              f"got {actions!r}")
        gnmi = file("actions.gnmi", actions["gnmi"])
    return LiveConfig(path, inv, tel, fnd, poll_s, tuple(notes), gnmi)


def live_coverage(fabric: Fabric, sources: Mapping[str, float]) -> Coverage:
    """Switch telemetry sees switch ports and switches (and so every cable); a diagnosis
    store's findings come from instruments whose coverage this console does not know, so
    their silence is never taken as absence."""

    def sees(signal: str, resource: str) -> bool:
        return signal == "telemetry" and switch_telemetry_sees(fabric, resource)
    return Coverage({s: int(lat * NS) for s, lat in sources.items()}, sees)


class StoreSupervisor(BackgroundLoop):
    """Follows the configured stores and diagnoses their findings (see module doc)."""

    thread_name = "live-supervisor"

    def __init__(self, state: ConsoleState, fabric: Fabric, cfg: LiveConfig, *,
                 kb: KnowledgeBase | None = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        super().__init__()
        self.state = state
        self.fabric = fabric
        self.cfg = cfg
        self.kb = kb or load_kb()
        self.clock = clock
        self.rmap = ResourceMap(fabric)
        lat = {"telemetry": 3 * cfg.poll_s} if cfg.telemetry_db is not None else {}
        self.corr = Correlator(self.rmap, self.kb, live_coverage(fabric, lat))
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.polls = 0
        self.unknown = 0
        self.after_cost_out = 0
        self.errors = 0
        self.error = ""
        state.info["sources"] = {k: str(v) for k, v in (("telemetry", cfg.telemetry_db),
                                                         ("findings", cfg.findings_db)) if v}

    # -- reading ----------------------------------------------------------------------------
    def open_telemetry(self) -> duckdb.DuckDBPyConnection:
        """A short-lived read-only connection to the telemetry store (close it)."""
        from fabricscope.store.rolling import open_readonly

        assert self.cfg.telemetry_db is not None
        return open_readonly(self.cfg.telemetry_db, wait_s=2.0)

    def _telemetry_findings(self) -> list[Observed]:
        from fabricscope.store.telemetry import FINDINGS_SQL, finding_of

        con = self.open_telemetry()
        try:
            rows = con.execute(FINDINGS_SQL + " ORDER BY end_ns").fetchall()
        finally:
            con.close()
        return [Observed("telemetry", f, int(f.window[1])) for f in map(finding_of, rows)]

    def _store_findings(self) -> list[Observed]:
        from fabricscope.store.findings import DiagnosisStore

        assert self.cfg.findings_db is not None
        with DiagnosisStore(self.cfg.findings_db, read_only=True) as st:
            return st.findings()

    def poll_once(self) -> int:
        """Read every source once, correlate what is new, tick; returns new findings."""
        new: list[Observed] = []
        if self.cfg.telemetry_db is not None:
            new.extend(self._telemetry_findings())
        if self.cfg.findings_db is not None:
            new.extend(self._store_findings())
        fresh = [o for o in new if o.id not in self._seen]
        known = []
        out = self.state.costed_out()
        for o in fresh:
            self._seen.add(o.id)
            head = o.subject.split("->")[0].split("|")[0]
            if not self.rmap.known(head):
                self.unknown += 1
            elif out and self._after_cost_out(o, out):
                self.after_cost_out += 1
            else:
                known.append(o)
        known.sort(key=lambda o: (o.reported_ns, o.source, o.id))
        now = self.clock()
        with self._lock:
            if known:
                self.corr.add(known)
            changed = self.corr.tick(now)
        if known:
            self.state.add_findings(known)
        for inc in changed:
            self.state.upsert_incident(inc)
        self.polls += 1
        self.state.info["polls"] = self.polls
        self.state.info["findings_unknown_resource"] = self.unknown
        self.state.info["findings_after_cost_out"] = self.after_cost_out
        self.state.set_time(now)
        return len(known)

    def _after_cost_out(self, o: Observed, out: Mapping[str, int]) -> bool:
        """Whether ``o`` is a link going down that the console's own cost-out caused."""
        if o.kind not in _EXPECTED_AFTER_COST_OUT:
            return False
        cables = self.rmap.resources(o.subject, "cable") if self.rmap.ports_of_subject(o.subject) else ()
        # the finding's window may open up to one poll before the Set's effect is read
        slack = int(self.cfg.poll_s * NS)
        return any(c in out and o.finding.window[1] >= out[c] - slack for c in cables)

    # -- running ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            c0 = time.thread_time()
            try:
                self.poll_once()
                self.error = ""
                self.state.info.pop("supervisor_error", None)
            except (FabricscopeError, OSError, duckdb.Error) as exc:
                self.errors += 1
                self.error = str(exc)
                self.state.info["supervisor_error"] = self.error
                if self.errors == 1 or self.errors % 100 == 0:
                    log.warning("live sources: poll failed (%d so far): %s", self.errors, exc)
            self.state.counters.segments += 1
            self.state.counters.supervisor_cpu_s += time.thread_time() - c0
            self._stop.wait(self.cfg.poll_s)


    def status(self) -> dict[str, Any]:
        return {"polls": self.polls, "errors": self.errors, "error": self.error,
                "unknown": self.unknown}
