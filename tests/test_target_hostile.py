"""The gNMI target under hostile clients (issue 8, defects 5 and 6): every cache and request is
bounded, one client cannot hold more than its share, and the others keep their schedule.

Real gRPC on 127.0.0.1; the twin is the data source.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
from gnmi_pb import gnmi_pb2, gnmi_pb2_grpc

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.clock import WallClock
from fabricscope.telemetry.codec import to_proto_path
from fabricscope.telemetry.limits import BoundedCache, TargetLimits
from fabricscope.telemetry.paths import parse_path
from fabricscope.telemetry.target import GnmiTarget
from fabricscope.twin.state import Twin, background_load

FAB = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
COUNTERS = "/interfaces/interface[name=*]/state/counters"


def _twin() -> Twin:
    return Twin(FAB, clock=WallClock(), load_bps=background_load(FAB, utilization=0.3, seed=1), rng=1)


def _p(text: str) -> gnmi_pb2.Path:
    return to_proto_path(parse_path(text))


def _sub_req(paths: Sequence[gnmi_pb2.Path], *, mode: int = gnmi_pb2.SubscriptionList.STREAM,
             interval_ns: int = 100_000_000, target: str = "leaf-000") -> gnmi_pb2.SubscribeRequest:
    return gnmi_pb2.SubscribeRequest(subscribe=gnmi_pb2.SubscriptionList(
        prefix=gnmi_pb2.Path(target=target), mode=mode, encoding=gnmi_pb2.PROTO,
        subscription=[gnmi_pb2.Subscription(path=p, mode=gnmi_pb2.SAMPLE, sample_interval=interval_ns)
                      for p in paths]))


async def _one(req: gnmi_pb2.SubscribeRequest) -> AsyncIterator[gnmi_pb2.SubscribeRequest]:
    yield req
    await asyncio.sleep(3600)  # keep the request side open, as a streaming client does


def _code(exc: BaseException) -> grpc.StatusCode:
    assert isinstance(exc, grpc.aio.AioRpcError), exc
    return exc.code()


# ---------------------------------------------------------------- pure pieces
def test_bounded_cache_caps_entries_and_bytes_lru_first() -> None:
    c: BoundedCache[str, int] = BoundedCache(3, 100, lambda k, v: len(k) + v)
    for k in ("a", "b", "c"):
        c.put(k, 10)
    assert c.get("a") == 10  # a is now most recent
    c.put("d", 10)
    assert c.get("b") is None and len(c) == 3  # b was least recently used
    c.put("e", 60)
    assert c.bytes <= 100 and len(c) <= 3
    c.put("huge", 1000)  # larger than the cap: never stored, nothing flushed for it
    assert c.get("huge") is None and c.get("e") == 60


def test_limits_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"limits\.sessions_per_client: expected an integer >= 1, got 0"):
        TargetLimits(sessions_per_client=0)


# ---------------------------------------------------------------- defect 5: memory
def test_unique_long_paths_keep_the_match_cache_within_its_caps() -> None:
    """600 Gets with unique long paths: the cache (88 -> 782 MB before) stays within its caps."""
    limits = TargetLimits(match_cache_entries=50, match_cache_bytes=200_000)

    async def go() -> tuple[GnmiTarget, list[str]]:
        tgt = GnmiTarget(_twin(), limits=limits)
        port = await tgt.start()
        details = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = gnmi_pb2_grpc.gNMIStub(ch)
                for k in range(600):
                    junk = f"k{k}" + "x" * 2000
                    # half match (a wildcard key the leaf lacks matches), half are NOT_FOUND
                    text = (f"/interfaces/interface[name=*][{junk}=*]/state/counters/in-octets" if k % 2 else
                            f"/interfaces/interface[name=eth{k}{'y' * 2000}]/state")
                    req = gnmi_pb2.GetRequest(prefix=gnmi_pb2.Path(target="leaf-000"), path=[_p(text)],
                                              encoding=gnmi_pb2.PROTO)
                    try:
                        r = await stub.Get(req)
                        assert r.notification[0].update
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.NOT_FOUND
                        details.append(exc.details() or "")
                    assert len(tgt.match_cache) <= limits.match_cache_entries
                    assert tgt.match_cache.bytes <= limits.match_cache_bytes
        finally:
            await tgt.stop()
        return tgt, details

    tgt, details = asyncio.run(go())
    assert len(details) == 300
    assert tgt.match_cache.evictions > 0  # the caps were reached and held, not merely unreached
    assert all(len(d) < 400 for d in details)  # NOT_FOUND no longer echoes a 2 kB path whole


def test_requests_over_the_size_caps_are_refused_cheaply() -> None:
    limits = TargetLimits(receive_message_bytes=64 << 10, path_elems=16, paths_per_request=4,
                          subscriptions_per_session=4, leaves_per_request=50)

    async def go() -> dict[str, grpc.StatusCode]:
        tgt = GnmiTarget(_twin(), limits=limits)
        port = await tgt.start()
        out: dict[str, grpc.StatusCode] = {}
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = gnmi_pb2_grpc.gNMIStub(ch)

                async def get(name: str, paths: list[gnmi_pb2.Path]) -> None:
                    try:
                        await stub.Get(gnmi_pb2.GetRequest(prefix=gnmi_pb2.Path(target="leaf-000"), path=paths,
                                                           encoding=gnmi_pb2.PROTO))
                        out[name] = grpc.StatusCode.OK
                    except grpc.aio.AioRpcError as exc:
                        out[name] = exc.code()

                await get("huge message", [_p("/interfaces/interface[name=" + "z" * 100_000 + "]")])
                await get("deep path", [_p("/" + "/".join(["a"] * 17))])
                await get("many paths", [_p(COUNTERS)] * 5)
                await get("many leaves", [_p("/interfaces")])
                await get("fine", [_p("/interfaces/interface[name=eth1]/state/counters/in-octets")])
                await get("other origin", [gnmi_pb2.Path(origin="cli", elem=[gnmi_pb2.PathElem(name="interfaces")])])
                call = stub.Subscribe(_one(_sub_req([_p(COUNTERS)] * 5)))
                try:
                    async for _ in call:
                        pass
                except grpc.aio.AioRpcError as exc:
                    out["many subscriptions"] = exc.code()
        finally:
            await tgt.stop()
        return out

    got = asyncio.run(go())
    assert got == {
        "huge message": grpc.StatusCode.RESOURCE_EXHAUSTED,  # grpc's max_receive_message_length
        "deep path": grpc.StatusCode.INVALID_ARGUMENT,
        "many paths": grpc.StatusCode.INVALID_ARGUMENT,
        "many leaves": grpc.StatusCode.RESOURCE_EXHAUSTED,
        "fine": grpc.StatusCode.OK,
        "other origin": grpc.StatusCode.INVALID_ARGUMENT,
        "many subscriptions": grpc.StatusCode.INVALID_ARGUMENT,
    }


def test_a_client_holds_at_most_its_sessions_and_closed_ones_are_released() -> None:
    limits = TargetLimits(sessions_per_client=3)

    async def go() -> None:
        tgt = GnmiTarget(_twin(), limits=limits)
        port = await tgt.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = gnmi_pb2_grpc.gNMIStub(ch)
                calls = [stub.Subscribe(_one(_sub_req([_p(COUNTERS)]))) for _ in range(3)]
                for c in calls:
                    await c.read()  # first update: the session is open
                assert tgt.sessions == {("127.0.0.1", "leaf-000"): 3}
                extra = stub.Subscribe(_one(_sub_req([_p(COUNTERS)])))
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await extra.read()
                assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "per-client limit" in (ei.value.details() or "")
                other = stub.Subscribe(_one(_sub_req([_p(COUNTERS)], target="leaf-001")))
                await other.read()  # another device is another switch: its own allowance
                calls[0].cancel()
                for _ in range(100):
                    if tgt.sessions.get(("127.0.0.1", "leaf-000")) == 2:
                        break
                    await asyncio.sleep(0.02)
                again = stub.Subscribe(_one(_sub_req([_p(COUNTERS)])))
                await again.read()
                for c in (*calls[1:], other, again):
                    c.cancel()
                for _ in range(100):
                    if not tgt.sessions:
                        break
                    await asyncio.sleep(0.02)
                assert tgt.sessions == {} and tgt.sessions_open == 0  # nothing leaks
        finally:
            await tgt.stop()

    asyncio.run(go())


def test_notifications_hold_at_most_the_configured_updates() -> None:
    limits = TargetLimits(updates_per_message=7)

    async def go() -> list[int]:
        tgt = GnmiTarget(_twin(), limits=limits)
        port = await tgt.start()
        sizes = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = gnmi_pb2_grpc.gNMIStub(ch).Subscribe(
                    _one(_sub_req([_p(COUNTERS)], mode=gnmi_pb2.SubscriptionList.ONCE)))
                async for r in call:
                    if r.HasField("update"):
                        sizes.append(len(r.update.update))
        finally:
            await tgt.stop()
        return sizes

    sizes = asyncio.run(go())
    assert sum(sizes) > 7 and max(sizes) == 7


# ---------------------------------------------------------------- defect 6: one client freezes the rest
def test_thousands_of_origins_are_refused_and_do_not_stall_a_stream() -> None:
    """5 ONCE requests x 1000 origins stalled other subscribers 2.4 s; now refused up front."""

    async def go() -> tuple[float, list[grpc.StatusCode], GnmiTarget]:
        tgt = GnmiTarget(_twin())
        port = await tgt.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = gnmi_pb2_grpc.gNMIStub(ch)
                normal = stub.Subscribe(_one(_sub_req([_p(COUNTERS)], interval_ns=100_000_000)))
                await normal.read()

                async def hostile(k: int, n: int) -> grpc.StatusCode:
                    paths = [gnmi_pb2.Path(origin=f"o{k}-{i}", elem=[gnmi_pb2.PathElem(name="interfaces")])
                             for i in range(n)]
                    call = stub.Subscribe(_one(_sub_req(paths, mode=gnmi_pb2.SubscriptionList.ONCE)))
                    try:
                        async for _ in call:
                            pass
                    except grpc.aio.AioRpcError as exc:
                        return exc.code()
                    return grpc.StatusCode.OK

                # 1000 origins (over the subscription cap) and 200 (under it, each origin refused)
                codes = await asyncio.gather(*(hostile(k, 1000 if k % 2 else 200) for k in range(5)))
                # the normal stream's updates kept coming while the hostile ones were refused
                t0 = time.monotonic()
                got = 0
                while got < 3:
                    r = await normal.read()
                    got += r.HasField("update")
                took = time.monotonic() - t0
                normal.cancel()
        finally:
            await tgt.stop()
        return took, list(codes), tgt

    took, codes, tgt = asyncio.run(go())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 5
    assert tgt.match_cache.misses == 1  # the normal stream's path; no hostile path was resolved at all
    assert took < 3.0  # 3 samples at 100 ms; generous for a loaded CI core, it was the 2.4 s stall


# ---------------------------------------------------------------- load test
_CHILD = textwrap.dedent("""
    import asyncio, json, resource, sys
    from fabricscope.fabric.builders import leaf_spine_fabric
    from fabricscope.sim.clock import WallClock
    from fabricscope.telemetry.limits import TargetLimits
    from fabricscope.telemetry.target import GnmiTarget
    from fabricscope.twin.state import Twin, background_load

    async def main():
        fab = leaf_spine_fabric(leaves=8, hosts_per_leaf=4, spines=2)
        tw = Twin(fab, clock=WallClock(), load_bps=background_load(fab, utilization=0.3, seed=1), rng=1)
        limits = TargetLimits(**json.loads(sys.argv[1]))
        tgt = GnmiTarget(tw, limits=limits)
        port = await tgt.start()
        print(json.dumps({"port": port, "targets": sorted(tw.targets())}), flush=True)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = {}
        async def watch():
            while True:
                for k, n in tgt.sessions.items():
                    peak[k[1]] = max(peak.get(k[1], 0), n)
                await asyncio.sleep(0.05)
        w = asyncio.ensure_future(watch())
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        w.cancel()
        print(json.dumps({"cache_entries": len(tgt.match_cache), "cache_bytes": tgt.match_cache.bytes,
                          "evictions": tgt.match_cache.evictions, "refused": tgt.stats.refused,
                          "sessions_peak_per_device": peak, "max_message_bytes": tgt.stats.max_message_bytes,
                          "rss0_kb": rss0, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}),
              flush=True)
        await tgt.stop(0)

    asyncio.run(main())
""")


@pytest.mark.slow
def test_load_200_subscribers_and_5_hostile_clients() -> None:
    """200 STREAM SAMPLE subscribers at 1 s + 5 hostile clients against a target in its own process.

    Normal subscribers' p99 inter-update gap stays within 2x the interval; the target's caches
    and per-client sessions stay within the configured caps (the bound asserted is the cap).
    """
    interval = 1.0
    run_s = float(os.environ.get("FABRICSCOPE_LOAD_SECONDS", "12"))
    # all clients share 127.0.0.1, and the per-client session cap is per (host, device): the normal
    # subscribers use targets 1-9 and the never-reading clients target 0, so which side reaches a
    # device first cannot decide who is refused (it did once, under CI load, when both shared one)
    limits = {"sessions_per_client": 40, "match_cache_entries": 64, "match_cache_bytes": 1 << 20,
              "subscriptions_per_session": 64, "updates_per_message": 500}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(limits)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        hello = json.loads(child.stdout.readline())
        port, targets = hello["port"], hello["targets"]
        gaps, per_sub, hostile_codes = asyncio.run(_load(port, targets, interval, run_s))
        child.stdin.write("\n")
        child.stdin.flush()
        st = json.loads(child.stdout.readline())
        child.wait(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    gaps.sort()
    p99 = gaps[int(0.99 * (len(gaps) - 1))]
    print(f"\nload: {len(gaps)} gaps, p50 {gaps[len(gaps) // 2]:.3f} s, p99 {p99:.3f} s, max {gaps[-1]:.3f} s; "
          f"target rss {st['rss0_kb'] / 1024:.0f} -> {st['rss_kb'] / 1024:.0f} MB; {st}; hostile codes {collections.Counter(hostile_codes)}")
    # every subscriber streamed after the warm-up, and the pooled sample holds >= 1,000 gaps, so that
    # ~10 of them lie above the p99 it is judged by. A count tied to the wall clock (200 x (run_s - 4))
    # failed once under CI load with a healthy p99 (1.45 s): the subscribers' own process started late.
    assert len(per_sub) == 200 and min(per_sub.values()) >= 2, sorted(per_sub.values())[:5]
    assert len(gaps) >= 1000, len(gaps)
    assert p99 <= 2 * interval, (p99, gaps[-10:])
    assert st["cache_entries"] <= limits["match_cache_entries"] and st["cache_bytes"] <= limits["match_cache_bytes"]
    assert st["evictions"] > 0  # the hostile huge-path client did push against the cache cap
    assert max(st["sessions_peak_per_device"].values()) <= limits["sessions_per_client"]
    assert st["refused"] > 0 and set(hostile_codes) <= {"RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "NOT_FOUND"}
    # every notification obeyed the per-message update cap: 500 updates of short twin paths
    assert st["max_message_bytes"] <= limits["updates_per_message"] * 300


async def _load(port: int, targets: list[str], interval: float,
                run_s: float) -> tuple[list[float], dict[int, int], list[str]]:
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    per_sub: dict[int, int] = {}
    codes: list[str] = []
    stop = loop.time() + run_s
    warm = loop.time() + 2.0
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(4)]

    async def subscriber(k: int) -> None:
        stub = gnmi_pb2_grpc.gNMIStub(chans[k % len(chans)])
        leaf = f"/interfaces/interface[name=eth{1 + k % 4}]/state/counters/in-octets"
        device = targets[1 + k % (len(targets) - 1)]
        call = stub.Subscribe(_one(_sub_req([_p(leaf)], interval_ns=int(interval * 1e9), target=device)))
        last = None
        try:
            while loop.time() < stop:
                r = await asyncio.wait_for(call.read(), timeout=stop - loop.time() + 0.1)
                if not r.HasField("update"):
                    continue
                now = loop.time()
                if last is not None and now > warm:
                    gaps.append(now - last)
                    per_sub[k] = per_sub.get(k, 0) + 1
                last = now
        except TimeoutError:
            pass
        finally:
            call.cancel()

    async def huge_paths() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = gnmi_pb2_grpc.gNMIStub(ch)
            k = 0
            while loop.time() < stop:
                k += 1
                p = _p(f"/interfaces/interface[name=*][j{k}{'x' * 20_000}=*]/state/counters")
                try:
                    await stub.Get(gnmi_pb2.GetRequest(prefix=gnmi_pb2.Path(target=targets[0]), path=[p],
                                                       encoding=gnmi_pb2.PROTO))
                except grpc.aio.AioRpcError as exc:
                    codes.append(exc.code().name)
                await asyncio.sleep(0.01)

    async def origins() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = gnmi_pb2_grpc.gNMIStub(ch)
            while loop.time() < stop:
                paths = [gnmi_pb2.Path(origin=f"o{i}", elem=[gnmi_pb2.PathElem(name="interfaces")]) for i in range(2000)]
                try:
                    async for _ in stub.Subscribe(_one(_sub_req(paths, mode=gnmi_pb2.SubscriptionList.ONCE))):
                        pass
                except grpc.aio.AioRpcError as exc:
                    codes.append(exc.code().name)
                await asyncio.sleep(0.05)

    async def never_reads(n: int) -> None:
        # subscribe to everything at 1 ms, read nothing, and open more sessions than allowed
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = gnmi_pb2_grpc.gNMIStub(ch)
        calls = [stub.Subscribe(_one(_sub_req([_p("/")], interval_ns=1_000_000, target=targets[n])))
                 for _ in range(60)]
        await asyncio.sleep(max(0.0, stop - loop.time()))
        for c in calls:
            c.cancel()
        await ch.close()

    try:
        await asyncio.gather(*(subscriber(k) for k in range(200)), huge_paths(), origins(),
                             never_reads(0), never_reads(0), never_reads(0))
    finally:
        for ch in chans:
            await ch.close()
    return gaps, per_sub, codes
