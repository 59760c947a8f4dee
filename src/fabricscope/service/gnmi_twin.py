"""Compose a twin and a gNMI target: what ``fabricscope gnmi serve-twin`` and the demo run.

Kept apart from :mod:`fabricscope.telemetry.target`, which never imports the simulator:
this module is the one place where the twin becomes a gNMI source.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.sim.clock import Clock, WallClock
from fabricscope.sim.faults import Fault, FaultSchedule, param_value
from fabricscope.telemetry.limits import TargetLimits
from fabricscope.telemetry.target import Credentials, GnmiTarget, TLSFiles
from fabricscope.twin.state import Twin, TwinConfig, background_load


def twin_for(
    fabric: Fabric,
    *,
    faults: Sequence[Fault] = (),
    utilization: float = 0.3,
    seed: int = 0,
    clock: Clock | None = None,
    config: TwinConfig | None = None,
) -> Twin:
    """A twin of ``fabric`` under random-permutation background load (see :func:`background_load`)."""
    return Twin(
        fabric,
        clock=clock or WallClock(),
        faults=FaultSchedule.of(faults),
        load_bps=background_load(fabric, utilization=utilization, seed=seed),
        rng=seed,
        config=config,
    )


log = logging.getLogger(__name__)


class FaultFile:
    """Faults injected while ``serve-twin`` runs: a file of fault lines, re-read on SIGHUP.

    One fault per line in :func:`parse_fault` form (``#`` starts a comment). A line's
    ``start=``/``end=`` count from the (re)load that first saw it; a line still there at the
    next reload keeps its fault unchanged; a line removed ends its fault at that reload. A
    signal, not a socket: nobody who cannot signal the process (its user, root) can inject.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._live: dict[str, Fault] = {}
        self._ended: list[Fault] = []

    def load(self, now_ns: int) -> list[Fault]:
        """Re-read the file; return every fault it implies (raise ConfigError naming file:line)."""
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise ConfigError(f"--fault-file: {self.path}: {exc.strerror}") from None
        live: dict[str, Fault] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            key = " ".join(line.split())
            if key in live:
                continue
            live[key] = self._live.get(key) or parse_fault(line, t0_ns=now_ns, source=f"{self.path}:{n}")
        ended = [f for k, f in self._live.items() if k not in live]
        for f in ended:
            end = now_ns if f.end_ns is None else min(f.end_ns, max(now_ns, f.start_ns))
            self._ended.append(Fault(f.kind, f.subject, f.start_ns, end, f.params))
        self._live = live
        return [*self._ended, *live.values()]

    def snapshot(self) -> tuple[dict[str, Fault], list[Fault]]:
        return dict(self._live), list(self._ended)

    def restore(self, snap: tuple[dict[str, Fault], list[Fault]]) -> None:
        """Undo a :meth:`load` whose faults the twin refused (a reload is all or nothing)."""
        self._live, self._ended = dict(snap[0]), list(snap[1])


@dataclass
class ServeSummary:
    """How a ``serve_twin`` run ended: the stopped target, the signal and the exit code."""

    target: GnmiTarget
    uptime_s: float
    signal: str = ""  # "" when --duration ran out
    exit_code: int = 0
    reloads: int = 0
    reload_errors: list[str] = field(default_factory=list)
    stop_timed_out: bool = False


_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


async def serve_twin(
    twin: Twin,
    *,
    address: str = "127.0.0.1:9339",
    credentials: Credentials | None = None,
    tls: TLSFiles | None = None,
    encoding: str = "request",
    on_ready: Callable[[GnmiTarget], None] | None = None,
    duration_s: float | None = None,
    limits: TargetLimits | None = None,
    grace_s: float = 2.0,
    faults: Sequence[Fault] = (),
    fault_file: FaultFile | None = None,
    on_reload: Callable[[int, str], None] | None = None,
    allow_set: bool = False,
) -> ServeSummary:
    """Serve ``twin`` until SIGINT/SIGTERM (or ``duration_s``); stop within ``grace_s`` (+1 s).

    SIGHUP re-reads ``fault_file``; the twin then runs ``faults`` plus the file's faults. A
    bad reload is logged and reported to ``on_reload`` and the previous faults stay.
    ``allow_set``: accept gNMI Set of ``config/enabled`` (:meth:`Twin.set_config`) from an
    authenticated client. Exit code 0 (duration over), 130 (SIGINT), 143 (SIGTERM).
    """
    target = GnmiTarget(twin, address=address, credentials=credentials, tls=tls, encoding=encoding,
                        limits=limits, allow_set=allow_set)
    await target.start()
    t0 = time.monotonic()
    summary = ServeSummary(target, 0.0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not summary.signal:
            summary.signal, summary.exit_code = sig.name, _EXIT[sig]
        stop.set()

    def on_hup() -> None:
        assert fault_file is not None
        snap = fault_file.snapshot()
        try:
            more = fault_file.load(twin.clock.now_ns())
            twin.set_faults(FaultSchedule.of([*faults, *more]))
        except FabricscopeError as exc:
            fault_file.restore(snap)
            summary.reload_errors.append(str(exc))
            if on_reload is not None:
                on_reload(-1, str(exc))
            else:
                log.error("fault reload failed, previous faults kept: %s", exc)
            return
        summary.reloads += 1
        if on_reload is not None:
            on_reload(len(twin.faults.faults), "")
        else:
            log.info("fault file reloaded: %d fault(s)", len(twin.faults.faults))

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
    if fault_file is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, on_hup)
    # ready only once the handlers are in: a signal sent on the "serving" line is handled
    if on_ready is not None:
        on_ready(target)
    try:
        if duration_s is None:
            await stop.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), duration_s)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        # gRPC cancels what is still running when the grace ends; the extra second bounds
        # the cancellation itself, so a stuck handler cannot hold the process up
        try:
            await asyncio.wait_for(target.stop(grace_s), grace_s + 1.0)
        except TimeoutError:
            summary.stop_timed_out = True
        summary.uptime_s = time.monotonic() - t0
    return summary


def parse_fault(text: str, *, t0_ns: int = 0, source: str = "--fault") -> Fault:
    """``"KIND SUBJECT [start=5s] [end=6s] [param=value ...]"`` -> a Fault, times relative to ``t0_ns``.

    >>> parse_fault("micro-burst leaf-000:eth3 start=2s end=2.01s depth_bytes=3e6").params
    {'depth_bytes': 3000000.0}
    """
    from fabricscope.model.errors import ConfigError
    from fabricscope.telemetry.config import parse_duration_ns

    parts = text.split()
    if len(parts) < 2:
        raise ConfigError(f"{source}: {text!r}: expected 'KIND SUBJECT [start=..] [end=..] [k=v ...]'")
    kind, subject = parts[0], parts[1]
    start, end = t0_ns, None
    params: dict[str, float] = {}
    for kv in parts[2:]:
        k, sep, v = kv.partition("=")
        if not sep:
            raise ConfigError(f"{source}: {text!r}: expected key=value, got {kv!r}")
        if k == "start":
            start = t0_ns + parse_duration_ns(v, f"{source}: start")
        elif k == "end":
            end = t0_ns + parse_duration_ns(v, f"{source}: end")
        else:
            # a number, or a documented name (optic-degrading mode=aging-laser)
            params[k] = param_value(kind, k, v, source=f"{source}: {text!r}")
    return Fault(kind, subject, start, end, params)  # type: ignore[arg-type]
