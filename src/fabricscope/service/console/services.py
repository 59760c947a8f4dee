"""What the console's API can call besides the state: the twin, what-if runs, the advisor,
the telemetry store. Built by ``fabricscope serve`` (:func:`build_twin_console`) or a test."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from fabricscope.diagnosis.knowledge import KnowledgeBase, load_kb
from fabricscope.fabric.inventory import Fabric
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.console.store_source import LiveConfig, StoreSupervisor
from fabricscope.service.console.twin_source import TwinSettings, TwinSupervisor
from fabricscope.service.console.whatif import WhatIfRunner


@dataclass
class ConsoleServices:
    """Optional collaborators of the API (each None when not running)."""

    kb: KnowledgeBase = field(default_factory=load_kb)
    supervisor: TwinSupervisor | StoreSupervisor | None = None
    whatif: WhatIfRunner | None = None
    telemetry: duckdb.DuckDBPyConnection | None = None  # twin: the reader connection
    telemetry_open: Callable[[], duckdb.DuckDBPyConnection] | None = None  # live: per query
    telemetry_lock: threading.Lock = field(default_factory=threading.Lock)
    sinks: dict[str, Any] = field(default_factory=dict)  # alert sinks by receiver name
    closers: list[Callable[[], None]] = field(default_factory=list)

    def open_telemetry(self) -> duckdb.DuckDBPyConnection | None:
        """A connection to the telemetry store for one query (the caller closes it), or
        None when this console has none."""
        if self.telemetry_open is not None:
            return self.telemetry_open()
        if self.telemetry is not None:
            with self.telemetry_lock:
                return self.telemetry.cursor()
        return None

    def close(self) -> None:
        """Stop what runs (supervisor, what-if worker, sinks) and close the store."""
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.whatif is not None:
            self.whatif.close()
        for fn in self.closers:
            fn()
        if self.telemetry is not None:
            with self.telemetry_lock:
                self.telemetry.close()
            self.telemetry = None


def build_twin_console(fabric: Fabric, *, settings: TwinSettings | None = None,
                       kb: KnowledgeBase | None = None, telemetry_db: Path | None = None,
                       views: bool = True) -> tuple[ConsoleState, ConsoleServices]:
    """The state and services of ``serve`` on the embedded twin (not started: call
    ``services.supervisor.start()``). Telemetry the twin's switches report goes into
    ``telemetry_db`` (a DuckDB file; in memory when None)."""
    from fabricscope.service.console.views import TwinViews
    from fabricscope.store.telemetry import TelemetryStore

    kb = kb or load_kb()
    state = ConsoleState(fabric, mode="twin")
    store = TelemetryStore(telemetry_db if telemetry_db is not None else ":memory:")
    tv = TwinViews(fabric, telemetry_store=store) if views else None
    sup = TwinSupervisor(state, fabric, settings=settings, kb=kb, views=tv)
    # The API reads through cursors of its own connection (made here, before the supervisor
    # thread writes), never the writer's: DuckDB connections are not shared across threads.
    svc = ConsoleServices(kb=kb, supervisor=sup, whatif=WhatIfRunner(),
                          telemetry=store.con.cursor())
    svc.closers.append(store.close)
    return state, svc


def build_live_console(cfg: LiveConfig, *, kb: KnowledgeBase | None = None
                       ) -> tuple[ConsoleState, ConsoleServices]:
    """The state and services of ``serve --config`` (live sources; not started)."""
    from fabricscope.fabric.io import read_fabric

    kb = kb or load_kb()
    fabric = read_fabric(cfg.inventory)
    state = ConsoleState(fabric, mode="live")
    sup = StoreSupervisor(state, fabric, cfg, kb=kb)
    return state, ConsoleServices(
        kb=kb, supervisor=sup, whatif=WhatIfRunner(),
        telemetry_open=sup.open_telemetry if cfg.telemetry_db is not None else None)
