"""Compose a twin and a gNMI target: what ``fabricscope gnmi serve-twin`` and the demo run.

Kept apart from :mod:`fabricscope.telemetry.target`, which never imports the simulator:
this module is the one place where the twin becomes a gNMI source.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence

from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.clock import Clock, WallClock
from fabricscope.sim.faults import Fault, FaultSchedule
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


async def serve_twin(
    twin: Twin,
    *,
    address: str = "127.0.0.1:9339",
    credentials: Credentials | None = None,
    tls: TLSFiles | None = None,
    encoding: str = "request",
    on_ready: Callable[[GnmiTarget], None] | None = None,
    duration_s: float | None = None,
) -> GnmiTarget:
    """Serve ``twin`` until SIGINT/SIGTERM (or ``duration_s``); return the stopped target."""
    target = GnmiTarget(twin, address=address, credentials=credentials, tls=tls, encoding=encoding)
    await target.start()
    if on_ready is not None:
        on_ready(target)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        if duration_s is None:
            await stop.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), duration_s)
    finally:
        await target.stop()
    return target


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
            try:
                params[k] = float(v)
            except ValueError:
                raise ConfigError(f"{source}: {text!r}: {k}: expected a number, got {v!r}") from None
    return Fault(kind, subject, start, end, params)  # type: ignore[arg-type]
