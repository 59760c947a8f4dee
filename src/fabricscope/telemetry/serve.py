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
from fabricscope.sim.twin import Twin, TwinConfig, background_load
from fabricscope.telemetry.target import Credentials, GnmiTarget, TLSFiles


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
