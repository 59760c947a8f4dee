"""What-if runs submitted over the API: a scenario dict in, the simulator's comparison out.

The scenario is the same document as a ``fabricscope sim --scenario`` file (docs/sim.md),
validated by :func:`~fabricscope.sim.scenario.parse_scenario` when it is submitted (a bad
field is a 400 naming the field, never a failed job later). Runs go through one worker
thread, in order, from a bounded queue (``max_queued``; more is refused, not buffered without
end); finished results are kept for the last ``keep`` runs. The flow count is capped
(``max_flows``) so one request cannot hold the console's CPU for an hour.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.service.sim_report import format_comparisons
from fabricscope.sim.scenario import Scenario, parse_scenario, prepare, run_scenario

log = logging.getLogger("fabricscope.serve.whatif")


@dataclass
class WhatIf:
    """One submitted run and, when done, its table."""

    id: str
    scenario: Scenario
    status: str = "queued"  # queued | running | done | failed
    submitted_s: float = field(default_factory=time.time)
    started_s: float | None = None
    finished_s: float | None = None
    table: list[dict[str, Any]] | None = None
    comparisons: list[str] = field(default_factory=list)
    error: str = ""
    progress: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "name": self.scenario.name,
                "schemes": [str(s) for s in self.scenario.schemes],
                "submitted_s": self.submitted_s, "started_s": self.started_s,
                "finished_s": self.finished_s, "table": self.table,
                "comparisons": self.comparisons, "error": self.error, "progress": self.progress}


class QueueFull(FabricscopeError):
    """Too many what-if runs are waiting."""


class WhatIfRunner:
    """Runs submitted scenarios one at a time in a worker thread (see module doc)."""

    def __init__(self, *, max_queued: int = 8, keep: int = 64, max_flows: int = 20_000) -> None:
        self.max_flows = max_flows
        self.keep = keep
        self._q: queue.Queue[WhatIf | None] = queue.Queue(maxsize=max_queued)
        self._runs: OrderedDict[str, WhatIf] = OrderedDict()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None

    def submit(self, doc: object) -> WhatIf:
        """Validate and queue; ConfigError (bad scenario) or QueueFull."""
        sc = parse_scenario(doc, source="what-if scenario")
        run = WhatIf(f"w-{next(self._ids):04d}", sc)
        try:
            self._q.put_nowait(run)
        except queue.Full:
            raise QueueFull(f"what-if: {self._q.maxsize} runs already queued; retry later") from None
        with self._lock:
            self._runs[run.id] = run
            while len(self._runs) > self.keep:
                old = next(iter(self._runs))
                if self._runs[old].status in ("queued", "running"):
                    break
                del self._runs[old]
        self._ensure_worker()
        return run

    def get(self, id: str) -> WhatIf | None:
        with self._lock:
            return self._runs.get(id)

    def list(self) -> list[WhatIf]:
        with self._lock:
            return list(self._runs.values())

    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="whatif", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            run = self._q.get()
            if run is None:
                return
            run.status, run.started_s = "running", time.time()
            def said(msg: str, r: WhatIf = run) -> None:
                r.progress = msg

            def step(label: str, r: WhatIf = run) -> Callable[[int, int], None]:
                r.progress = label

                def done(i: int, n: int) -> None:
                    r.progress = f"{label}: {i}/{n}"
                return done

            try:
                prep = prepare(run.scenario, max_flows=self.max_flows, progress=said)
                res = run_scenario(prep, record_utilization=False, progress=step)
                run.table = [{k: v for k, v in row.items()} for row in res.table()]
                run.comparisons = format_comparisons(res)
                run.status = "done"
            except (ConfigError, FabricscopeError) as exc:
                run.status, run.error = "failed", str(exc)
            except Exception as exc:
                run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
                log.exception("what-if %s failed", run.id)
            run.finished_s = time.time()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the worker after the current run (queued runs are dropped)."""
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(None)
        if self._thread is not None:
            self._thread.join(timeout_s)
