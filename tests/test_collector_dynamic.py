"""A dynamic Collector (the cluster member's): devices added and removed while it runs, over
real loopback gRPC against our gNMI target on a twin."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.clock import WallClock
from fabricscope.telemetry.collector import Collector
from fabricscope.telemetry.config import CollectorConfig, parse_config
from fabricscope.telemetry.detectors import DetectorSet
from fabricscope.telemetry.sinks import MemorySink
from fabricscope.telemetry.target import GnmiTarget
from fabricscope.twin.state import Twin, background_load

FAB = leaf_spine_fabric(leaves=3, hosts_per_leaf=1, spines=1)
PATH = "/interfaces/interface[name=eth1]/state/counters/in-octets"


def _config(port: int) -> CollectorConfig:
    return parse_config({
        "targets": {"twin": {"address": f"127.0.0.1:{port}", "names": ["leaf-000", "leaf-001", "leaf-002"]}},
        "subscriptions": {"s": {"paths": [PATH], "mode": "stream", "stream-mode": "sample",
                                "sample-interval": "50ms"}},
        "buffer": {"flush-interval": "20ms"},
    }, source="test.yaml")


async def _scenario() -> tuple[MemorySink, dict[str, list[int]], dict[str, int]]:
    tw = Twin(FAB, clock=WallClock(), load_bps=background_load(FAB, utilization=0.3, seed=1), rng=1)
    target = GnmiTarget(tw)
    sessions: dict[str, int] = {}
    open_, close_ = target._open_session, target._close_session

    def counting_open(host: str, device: str) -> tuple[str, str]:
        sessions[device] = sessions.get(device, 0) + 1
        return open_(host, device)

    def counting_close(key: tuple[str, str]) -> None:
        sessions[key[1]] -= 1
        close_(key)

    target._open_session = counting_open  # type: ignore[method-assign]
    target._close_session = counting_close  # type: ignore[method-assign]
    port = await target.start()
    cfg = _config(port)
    entry = cfg.targets[0]
    sink = MemorySink()
    col = Collector(replace(cfg, targets=()), sinks=[sink], detectors=DetectorSet([]), dynamic=True)
    run = asyncio.create_task(col.run())
    open_at: dict[str, list[int]] = {}
    try:
        await asyncio.sleep(0.3)  # running with no device: it does not end by itself
        assert not run.done() and sink.events == []
        await col.add_device(entry, "leaf-000")
        await col.add_device(entry, "leaf-001")
        await col.add_device(entry, "leaf-001")  # twice: one stream
        await asyncio.sleep(0.6)
        open_at["both"] = [sessions.get("leaf-000", 0), sessions.get("leaf-001", 0), sessions.get("leaf-002", 0)]
        await col.remove_device("leaf-000")
        n_after_remove = sum(e.target == "leaf-000" for e in sink.events)
        for _ in range(50):  # the target sees the cancelled call a moment later
            if sessions.get("leaf-000", 0) == 0:
                break
            await asyncio.sleep(0.02)
        open_at["removed"] = [sessions.get("leaf-000", 0), sessions.get("leaf-001", 0)]
        await col.add_device(entry, "leaf-002")
        await asyncio.sleep(0.6)
        open_at["later"] = [sum(e.target == "leaf-000" for e in sink.events) - n_after_remove]
        assert sorted(col.devices()) == ["leaf-001", "leaf-002"]
    finally:
        col.stop()
        await run
        await target.stop()
    return sink, open_at, sessions


def test_devices_come_and_go_while_it_runs() -> None:
    sink, seen, sessions = asyncio.run(_scenario())
    assert seen["both"] == [1, 1, 0]  # one Subscribe per added device, none for the third
    assert seen["removed"] == [0, 1]  # removal ended its stream at the target (within 1 s)
    assert seen["later"] == [0]  # nothing of a removed device afterwards
    by = {d: [e.ts_ns for e in sink.events if e.target == d] for d in ("leaf-000", "leaf-001", "leaf-002")}
    assert len(by["leaf-000"]) >= 5 and len(by["leaf-001"]) >= 15 and len(by["leaf-002"]) >= 5, \
        {d: len(v) for d, v in by.items()}
    assert all(len(v) == len(set(v)) for v in by.values())  # no sample twice
    assert sessions == {"leaf-000": 0, "leaf-001": 0, "leaf-002": 0}  # every stream closed at stop


def test_add_device_needs_a_dynamic_collector() -> None:
    cfg = _config(1)
    col = Collector(cfg, sinks=[MemorySink()], detectors=DetectorSet([]))
    with pytest.raises(ConfigError, match="dynamic"):
        asyncio.run(col.add_device(cfg.targets[0], "leaf-000"))
