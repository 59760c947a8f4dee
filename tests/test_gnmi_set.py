"""gNMI Set on the twin's target over real gRPC: ``config/enabled`` takes a port down (both
ends oper DOWN, the cable carries nothing, admin-status DOWN at this end) and back up; Set is
off unless asked, needs credentials, is one transaction, and names what it refuses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc
import pytest
from gnmi_pb import gnmi_pb2, gnmi_pb2_grpc

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.sim.clock import WallClock
from fabricscope.telemetry.codec import decode_value
from fabricscope.telemetry.target import Credentials, GnmiTarget
from fabricscope.twin.state import Twin, background_load

FAB = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
MD = (("username", "ops"), ("password", "s3cret-pw"))


def _twin() -> Twin:
    return Twin(FAB, clock=WallClock(), load_bps=background_load(FAB, utilization=0.3, seed=1), rng=1)


def _p(text: str) -> gnmi_pb2.Path:
    elems = []
    for part in text.strip("/").split("/"):
        name, _, key = part.partition("[")
        keys = dict([key.rstrip("]").split("=", 1)]) if key else {}
        elems.append(gnmi_pb2.PathElem(name=name, key=keys))
    return gnmi_pb2.Path(elem=elems)


def _set(target: str, name: str, value: bool | str) -> gnmi_pb2.SetRequest:
    val = (gnmi_pb2.TypedValue(bool_val=value) if isinstance(value, bool)
           else gnmi_pb2.TypedValue(string_val=value))
    return gnmi_pb2.SetRequest(prefix=gnmi_pb2.Path(target=target), update=[gnmi_pb2.Update(
        path=_p(f"/interfaces/interface[name={name}]/config/enabled"), val=val)])


def _spine_end() -> tuple[str, str]:
    """A leaf uplink port and the spine port at its other end."""
    link = next(lk for lk in FAB.links
                if lk.a.startswith("leaf-000:") and lk.b.startswith("spine-"))
    return link.a, link.b


async def _state(stub: gnmi_pb2_grpc.gNMIStub, port: str) -> dict[str, object]:
    dev, name = port.split(":")
    r = await stub.Get(gnmi_pb2.GetRequest(
        prefix=gnmi_pb2.Path(target=dev), encoding=gnmi_pb2.PROTO, path=[
            _p(f"/interfaces/interface[name={name}]/state/oper-status"),
            _p(f"/interfaces/interface[name={name}]/state/admin-status"),
            _p(f"/interfaces/interface[name={name}]/state/counters/out-octets"),
            _p(f"/interfaces/interface[name={name}]/state/counters/carrier-transitions")]),
        metadata=MD)
    out: dict[str, object] = {}
    for n in r.notification:
        for u in n.update:
            out[u.path.elem[-1].name] = decode_value(u.val)
    return out


def _run(tgt: GnmiTarget, body: Callable[[gnmi_pb2_grpc.gNMIStub], Awaitable[None]]) -> None:
    async def go() -> None:
        port = await tgt.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await body(gnmi_pb2_grpc.gNMIStub(ch))
        finally:
            await tgt.stop()
    asyncio.run(go())


def test_disable_takes_the_cable_down_and_enable_brings_it_back() -> None:
    a, b = _spine_end()
    tgt = GnmiTarget(_twin(), credentials=Credentials("ops", "s3cret-pw"), allow_set=True)

    async def body(stub: gnmi_pb2_grpc.gNMIStub) -> None:
        before_a, before_b = await _state(stub, a), await _state(stub, b)
        assert before_a["oper-status"] == "UP" and before_a["admin-status"] == "UP"
        dev, name = a.split(":")
        r = await stub.Set(_set(dev, name, False), metadata=MD)
        assert [u.op for u in r.response] == [gnmi_pb2.UpdateResult.UPDATE]
        down_a, down_b = await _state(stub, a), await _state(stub, b)
        assert down_a["oper-status"] == "DOWN" and down_a["admin-status"] == "DOWN"
        assert down_b["oper-status"] == "DOWN" and down_b["admin-status"] == "UP"
        assert down_b["carrier-transitions"] == int(before_b["carrier-transitions"]) + 1  # type: ignore[call-overload]
        await asyncio.sleep(0.5)
        later_a, later_b = await _state(stub, a), await _state(stub, b)
        assert later_a["out-octets"] == down_a["out-octets"]  # nothing carried either way
        assert later_b["out-octets"] == down_b["out-octets"]
        await stub.Set(_set(dev, name, True), metadata=MD)
        await asyncio.sleep(0.3)
        up_a = await _state(stub, a)
        assert up_a["oper-status"] == "UP" and up_a["admin-status"] == "UP"
        assert int(up_a["out-octets"]) > int(later_a["out-octets"])  # type: ignore[call-overload]

    _run(tgt, body)


def test_set_is_refused_unless_allowed_and_authenticated() -> None:
    a, _ = _spine_end()
    dev, name = a.split(":")

    async def read_only(stub: gnmi_pb2_grpc.gNMIStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await stub.Set(_set(dev, name, False), metadata=MD)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED and "read-only" in (ei.value.details() or "")

    _run(GnmiTarget(_twin(), credentials=Credentials("ops", "s3cret-pw")), read_only)

    async def no_creds(stub: gnmi_pb2_grpc.gNMIStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await stub.Set(_set(dev, name, False))
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED

    _run(GnmiTarget(_twin(), allow_set=True), no_creds)

    async def wrong_pw(stub: gnmi_pb2_grpc.gNMIStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await stub.Set(_set(dev, name, False), metadata=(("username", "ops"), ("password", "x")))
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED

    twin = _twin()
    _run(GnmiTarget(twin, credentials=Credentials("ops", "s3cret-pw"), allow_set=True), wrong_pw)
    adm = [lf for lf in twin.leaves(dev) if lf.path == f"/interfaces/interface[name={name}]/state/admin-status"]
    assert len(adm) == 1 and twin.read(adm) == ["UP"]  # untouched


def test_bad_sets_name_the_path_and_change_nothing() -> None:
    a, _ = _spine_end()
    dev, name = a.split(":")
    twin = _twin()
    tgt = GnmiTarget(twin, credentials=Credentials("ops", "s3cret-pw"), allow_set=True)

    async def body(stub: gnmi_pb2_grpc.gNMIStub) -> None:
        async def refused(req: gnmi_pb2.SetRequest) -> str:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Set(req, metadata=MD)
            assert ei.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
            return ei.value.details() or ""

        assert "expected a boolean, got 'false'" in await refused(_set(dev, name, "false"))
        assert "has no cabled port 'eth99'" in await refused(_set(dev, "eth99", False))
        assert "no such device 'nowhere'" in await refused(_set("nowhere", name, False))
        bad = gnmi_pb2.SetRequest(prefix=gnmi_pb2.Path(target=dev), update=[gnmi_pb2.Update(
            path=_p(f"/interfaces/interface[name={name}]/config/mtu"),
            val=gnmi_pb2.TypedValue(uint_val=9000))])
        assert "config/mtu: not settable on the twin" in await refused(bad)
        assert "delete: not supported" in await refused(gnmi_pb2.SetRequest(
            prefix=gnmi_pb2.Path(target=dev), delete=[_p(f"/interfaces/interface[name={name}]")]))
        # one transaction: a good update beside a bad one is not applied
        both = _set(dev, name, False)
        both.update.append(bad.update[0])
        assert "not settable" in await refused(both)
        st = await _state(stub, a)
        assert st["admin-status"] == "UP" and st["oper-status"] == "UP"

    t0 = time.monotonic()
    _run(tgt, body)
    assert time.monotonic() - t0 < 60
