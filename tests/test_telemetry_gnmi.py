"""Our gNMI collector against our gNMI target over real loopback gRPC: every mode, bad input, outages."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
from gnmi_pb import gnmi_pb2, gnmi_pb2_grpc

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.sim.clock import WallClock
from fabricscope.telemetry.codec import Flattener, to_proto_path
from fabricscope.telemetry.collector import Collector, gnmi_subscribe
from fabricscope.telemetry.config import parse_config
from fabricscope.telemetry.detectors import DetectorSet
from fabricscope.telemetry.paths import match, parse_path
from fabricscope.telemetry.sinks import MemorySink
from fabricscope.telemetry.target import Credentials, GnmiTarget, TLSFiles
from fabricscope.twin.state import Twin, background_load

FAB = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
COUNTERS = "/interfaces/interface[name=*]/state/counters"


def _twin() -> Twin:
    return Twin(FAB, clock=WallClock(), load_bps=background_load(FAB, utilization=0.3, seed=1), rng=1)


def _config(port: int, sub: dict[str, Any], **target: Any) -> Any:
    return parse_config({
        "targets": {"twin": {"address": f"127.0.0.1:{port}", "names": ["leaf-000", "spine-01"], **target}},
        "subscriptions": {"s": sub},
        "buffer": {"flush-interval": "20ms"},
        "backoff": {"initial": "50ms", "max": "200ms"},
    }, source="test.yaml")


async def _collect(target: GnmiTarget, sub: dict[str, Any], duration: float, **kw: Any) -> tuple[MemorySink, Collector]:
    port = await target.start()
    sink = MemorySink()
    col = Collector(_config(port, sub, **kw), sinks=[sink], detectors=DetectorSet([]))
    try:
        await col.run(duration_s=duration)
    finally:
        await target.stop()
    return sink, col


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _names(sink: MemorySink) -> set[str]:
    return {e.name for e in sink.events}


def test_once_returns_each_leaf_once_per_target() -> None:
    tw = _twin()
    sink, col = asyncio.run(_collect(GnmiTarget(tw), {"paths": [COUNTERS], "mode": "once"}, 5.0))
    n_ports = {t: len([p for p in FAB.ports_of[t] if p in FAB.peer_port]) for t in ("leaf-000", "spine-01")}
    # 10 interface counters per cabled port, once each
    assert len(sink.events) == 10 * sum(n_ports.values())
    assert {e.target for e in sink.events} == {"leaf-000", "spine-01"}
    assert all(isinstance(e.value, int) for e in sink.events)
    assert all(st.syncs == 1 for st in col.stats.targets.values())


def test_stream_sample_follows_the_schedule() -> None:
    tw = _twin()
    sub = {"paths": ["/interfaces/interface[name=eth1]/state/counters/out-octets"], "mode": "stream",
           "stream-mode": "sample", "sample-interval": "100ms"}
    sink, _ = asyncio.run(_collect(GnmiTarget(tw), sub, 1.05))
    ev = [e for e in sink.events if e.target == "leaf-000"]
    # initial sync + one sample per 100 ms over ~1 s; grpc start-up eats part of the window,
    # so allow a few missing samples but never more than the schedule allows.
    assert 6 <= len(ev) <= 12
    vals = [e.value for e in ev]
    assert vals == sorted(vals) and vals[-1] > vals[0]  # a counter following the load


def test_stream_on_change_suppresses_unchanged_and_heartbeats() -> None:
    tw = _twin()
    sub = {"paths": ["/interfaces/interface[name=*]/state/oper-status"], "mode": "stream",
           "stream-mode": "on-change", "heartbeat-interval": "300ms"}
    sink, _ = asyncio.run(_collect(GnmiTarget(tw), sub, 1.0))
    ev = [e for e in sink.events if e.target == "leaf-000"]
    ports = len([p for p in FAB.ports_of["leaf-000"] if p in FAB.peer_port])
    # oper-status never changes: initial sync + 2-3 heartbeats of every port, nothing else
    assert len(ev) % ports == 0
    assert 2 * ports <= len(ev) <= 4 * ports
    assert {e.value for e in ev} == {"UP"}


def test_stream_updates_only_and_suppress_redundant() -> None:
    tw = _twin()
    sub = {"paths": ["/interfaces/interface[name=*]/state/counters/in-fcs-errors"], "mode": "stream",
           "sample-interval": "50ms", "suppress-redundant": True, "updates-only": True}
    sink, col = asyncio.run(_collect(GnmiTarget(tw), sub, 0.6))
    # no initial dump (updates_only) and FCS errors never change without a fault: nothing sent
    assert sink.events == []
    assert all(st.syncs == 1 for st in col.stats.targets.values())


def test_target_defined_splits_state_and_counters() -> None:
    tw = _twin()
    sub = {"paths": ["/interfaces/interface[name=eth1]"], "mode": "stream", "stream-mode": "target-defined",
           "sample-interval": "100ms"}
    sink, _ = asyncio.run(_collect(GnmiTarget(tw), sub, 0.8))
    ev = [e for e in sink.events if e.target == "leaf-000"]
    oper = [e for e in ev if e.name.endswith("oper-status")]
    octets = [e for e in ev if e.name.endswith("/out-octets")]
    assert len(oper) == 1  # on-change: only the initial value
    assert len(octets) >= 4  # sampled


def test_poll_mode_answers_each_poll() -> None:
    tw = _twin()
    sub = {"paths": ["/interfaces/interface[name=eth1]/state/counters/out-octets"], "mode": "poll",
           "poll-interval": "200ms"}
    sink, col = asyncio.run(_collect(GnmiTarget(tw), sub, 0.9))
    syncs = [st.syncs for st in col.stats.targets.values()]
    ev = [e for e in sink.events if e.target == "leaf-000"]
    key = next(k for k in col.stats.targets if "leaf-000" in k)
    assert len(ev) == col.stats.targets[key].syncs  # one value per poll (+ the initial one)
    assert min(syncs) >= 3


def test_json_ietf_encoding_decodes_to_the_same_types() -> None:
    tw = _twin()
    sub = {"paths": ["/components/component[name=eth1]/transceiver"], "mode": "once", "encoding": "json_ietf"}
    sink, _ = asyncio.run(_collect(GnmiTarget(tw), sub, 5.0))
    assert sink.events and all(isinstance(e.value, float) for e in sink.events)


# ---------------------------------------------------------------- errors and security
async def _raw_get(target: GnmiTarget, tname: str, path: str | gnmi_pb2.Path,
                   md: tuple[tuple[str, str], ...] = (), dtype: int = 0) -> gnmi_pb2.GetResponse:
    port = await target.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = gnmi_pb2_grpc.gNMIStub(ch)
            # a raw split: lets a test send element names no parser would produce
            p = gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name=x) for x in path.split("/") if x]) \
                if isinstance(path, str) else path
            return await stub.Get(gnmi_pb2.GetRequest(prefix=gnmi_pb2.Path(target=tname), path=[p],
                                                      encoding=gnmi_pb2.PROTO, type=dtype), metadata=md)
    finally:
        await target.stop()


@pytest.mark.parametrize(("tname", "path", "code"), [
    ("leaf-999", "/interfaces", grpc.StatusCode.NOT_FOUND),
    ("", "/interfaces", grpc.StatusCode.INVALID_ARGUMENT),
    ("leaf-000", "/no/such/tree", grpc.StatusCode.NOT_FOUND),
    ("leaf-000", "/interfaces/bad[name/x", grpc.StatusCode.INVALID_ARGUMENT),
])
def test_get_errors_carry_proper_status_codes(tname: str, path: str, code: grpc.StatusCode) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        asyncio.run(_raw_get(GnmiTarget(_twin()), tname, path))
    assert ei.value.code() == code
    assert ei.value.details()


def test_get_with_wildcards_and_keys() -> None:
    path = to_proto_path(parse_path(
        "/qos/interfaces/interface[interface-id=*]/output/queues/queue[name=3]/state/transmit-pkts"))
    r = asyncio.run(_raw_get(GnmiTarget(_twin()), "leaf-000", path))
    ev = Flattener().flatten(r.notification[0])
    ports = len([p for p in FAB.ports_of["leaf-000"] if p in FAB.peer_port])
    assert len(ev) == ports
    assert {e.tags["queue_name"] for e in ev} == {"3"}


def test_get_type_config_is_not_found_and_state_types_serve_everything() -> None:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        asyncio.run(_raw_get(GnmiTarget(_twin()), "leaf-000", "/interfaces", dtype=gnmi_pb2.GetRequest.CONFIG))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "CONFIG" in ei.value.details()
    n = {t: len(asyncio.run(_raw_get(GnmiTarget(_twin()), "leaf-000", "/interfaces", dtype=t)).notification[0].update)
         for t in (gnmi_pb2.GetRequest.ALL, gnmi_pb2.GetRequest.STATE, gnmi_pb2.GetRequest.OPERATIONAL)}
    assert len(set(n.values())) == 1 and n[gnmi_pb2.GetRequest.ALL] > 0, n


def test_cli_subscribe_fails_fast_on_errors_a_retry_cannot_fix() -> None:
    async def go(tname: str, path: str, **kw: Any) -> float:
        target = GnmiTarget(_twin(), credentials=Credentials("admin", "pw"))
        port = await target.start()
        t0 = asyncio.get_running_loop().time()
        try:
            with pytest.raises(TransportError) as ei:
                # no duration: without fail-fast this would retry forever
                await asyncio.wait_for(gnmi_subscribe(f"127.0.0.1:{port}", tname, [path], on_events=lambda e: None,
                                                      username="admin", **kw), 10)
            assert f"target {tname!r}" in str(ei.value)
            return asyncio.get_running_loop().time() - t0
        finally:
            await target.stop()

    assert asyncio.run(go("leaf-999", COUNTERS, password="pw")) < 5
    assert asyncio.run(go("leaf-000", "/no/such/tree", password="pw")) < 5
    assert asyncio.run(go("leaf-000", COUNTERS, password="nope")) < 5


def test_missing_password_env_fails_before_any_sink_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICSCOPE_TEST_NO_SUCH_PW", raising=False)
    db = tmp_path / "t.duckdb"
    cfg = parse_config({"targets": {"t": {"address": "127.0.0.1:1", "username": "u",
                                          "password-env": "FABRICSCOPE_TEST_NO_SUCH_PW"}},
                        "subscriptions": {"s": {"paths": [COUNTERS]}},
                        "sinks": [{"type": "duckdb", "path": str(db)}]}, source="t.yaml")
    with pytest.raises(ConfigError, match=r"t\.yaml: targets\.t\.password-env"):
        Collector(cfg)
    assert not db.exists()


def test_wrong_credentials_are_unauthenticated_and_the_password_is_never_echoed() -> None:
    creds = Credentials("admin", "s3cret-pw")
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        asyncio.run(_raw_get(GnmiTarget(_twin(), credentials=creds), "leaf-000", "/interfaces",
                             (("username", "admin"), ("password", "wrong-pw"))))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "wrong-pw" not in ei.value.details() and "s3cret" not in ei.value.details()
    assert "s3cret" not in repr(creds)
    ok = asyncio.run(_raw_get(GnmiTarget(_twin(), credentials=creds), "leaf-000", "/interfaces",
                              (("username", "admin"), ("password", "s3cret-pw"))))
    assert len(ok.notification[0].update) > 0


def test_collector_reports_auth_failure_and_keeps_running() -> None:
    tw = _twin()
    target = GnmiTarget(tw, credentials=Credentials("admin", "pw"))
    sink, col = asyncio.run(_collect(target, {"paths": [COUNTERS]}, 0.5, username="admin", password="nope"))
    assert sink.events == []
    st = next(iter(col.stats.targets.values()))
    assert st.errors >= 2 and st.last_error.startswith("UNAUTHENTICATED")  # retried with backoff


def _self_signed(tmp: Path) -> tuple[bytes, bytes]:
    try:
        from cryptography import x509
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither cryptography nor openssl available to make a test certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem")],
                       check=True, capture_output=True)
        return (tmp / "cert.pem").read_bytes(), (tmp / "key.pem").read_bytes()
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def test_tls_stream(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    (tmp_path / "ca.pem").write_bytes(cert)
    target = GnmiTarget(_twin(), tls=TLSFiles(cert, key))
    sink, _ = asyncio.run(_collect(target, {"paths": [COUNTERS], "mode": "once"}, 5.0,
                                   tls={"ca-file": str(tmp_path / "ca.pem"), "server-name": "localhost"}))
    assert len(sink.events) > 0


def test_plaintext_client_cannot_talk_to_tls_target(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    sink, col = asyncio.run(_collect(GnmiTarget(_twin(), tls=TLSFiles(cert, key)), {"paths": [COUNTERS]}, 0.5))
    assert sink.events == [] and all(st.errors >= 1 for st in col.stats.targets.values())


# ---------------------------------------------------------------- outages
def test_target_dies_mid_stream_collector_reconnects_and_loses_nothing() -> None:
    async def scenario() -> tuple[MemorySink, Collector, int, int]:
        tw = _twin()
        t1 = GnmiTarget(tw)
        port = await t1.start()
        sink = MemorySink()
        cfg = _config(port, {"paths": ["/interfaces/interface[name=eth1]/state/counters/out-octets"],
                             "sample-interval": "50ms"})
        col = Collector(cfg, sinks=[sink], detectors=DetectorSet([]))
        run = asyncio.create_task(col.run(duration_s=2.5))
        await asyncio.sleep(0.6)
        await t1.stop(grace=None)  # the target dies mid-stream
        sent_before = t1.updates_sent
        sink.fail = True  # ... and the store is down for a while too
        await asyncio.sleep(0.4)
        t2 = GnmiTarget(tw, address=f"127.0.0.1:{port}")
        await t2.start()
        await asyncio.sleep(0.8)
        sink.fail = False
        await run
        await t2.stop()
        return sink, col, sent_before, t2.updates_sent

    sink, col, before, after = asyncio.run(scenario())
    # every update the targets sent arrived in the sink exactly once (none lost in the
    # buffer while the target was gone and the store refused writes)
    assert col.stats.received == col.stats.written == len(sink.events)
    # the only updates allowed to be missing are those on the wire when the target was killed
    # (at most one 1-update notification per stream: 2 streams)
    assert before + after - 2 <= len(sink.events) <= before + after
    assert col.stats.sink_retries >= 1
    st = [s for s in col.stats.targets.values()]
    assert all(s.connects >= 2 and s.errors >= 1 for s in st)
    leaf = sorted((e.ts_ns, e.value) for e in sink.events if e.target == "leaf-000")
    assert [v for _, v in leaf] == sorted(v for _, v in leaf)


def test_collector_collects_garbage_less_often_while_running_and_restores_after() -> None:
    import gc

    seen: list[int] = []

    class Probe(MemorySink):
        def write(self, events: Any, findings: Any) -> None:
            seen.append(gc.get_threshold()[0])
            super().write(events, findings)

    async def go() -> None:
        target = GnmiTarget(_twin())
        port = await target.start()
        try:
            await Collector(_config(port, {"paths": [COUNTERS], "mode": "once"}), sinks=[Probe()],
                            detectors=DetectorSet([])).run(duration_s=3)
        finally:
            await target.stop()

    before = gc.get_threshold()
    asyncio.run(go())
    assert seen and min(seen) >= 100_000
    assert gc.get_threshold() == before


def test_subscribe_errors_reach_the_collector_as_status_codes() -> None:
    tw = _twin()
    _, col = asyncio.run(_collect(GnmiTarget(tw), {"paths": ["/no/such/tree"], "mode": "once"}, 0.4))
    st = next(iter(col.stats.targets.values()))
    assert st.last_error.startswith("NOT_FOUND") and "/no/such/tree" in st.last_error
    _, col = asyncio.run(_collect(GnmiTarget(tw), {"paths": [COUNTERS], "sample-interval": "1ms",
                                                    "stream-mode": "sample"}, 0.3))
    assert all(s.syncs >= 1 for s in col.stats.targets.values())  # 1 ms is the minimum, accepted


@pytest.mark.slow
def test_sharded_collector_splits_targets_over_processes_and_loses_nothing(tmp_path: Path) -> None:
    from fabricscope.sim.faults import Fault, FaultSchedule
    from fabricscope.telemetry.shards import ShardedCollector, shard_config
    from fabricscope.telemetry.sinks import DuckDBSink

    names = [d.id for d in FAB.switches]
    tw = _twin()
    now = WallClock().now_ns()
    tw.set_faults(FaultSchedule.of([Fault("link-flap", "leaf-000:eth3|spine-00:eth1", now, None,
                                          {"period_ns": 400_000_000})]))

    async def scenario() -> tuple[ShardedCollector, int]:
        target = GnmiTarget(tw)
        port = _free_port()
        cfg = parse_config({"targets": {"twin": {"address": f"127.0.0.1:{port}", "names": names}},
                            "subscriptions": {"s": {"paths": ["/interfaces/interface[name=*]/state"],
                                                    "sample-interval": "100ms"}},
                            "detectors": {"link-flap": {}}, "workers": 2}, source="t.yaml")
        assert [c.targets[0].names for c in shard_config(cfg, 2)] == [tuple(names[0::2]), tuple(names[1::2])]
        col = ShardedCollector(cfg, workers=2, sinks=[DuckDBSink(str(tmp_path / "s.duckdb")), MemorySink()])
        target.address = f"127.0.0.1:{port}"
        await target.start()
        try:
            await col.run(duration_s=4.0)
        finally:
            await target.stop()
        return col, target.updates_sent

    col, sent = asyncio.run(scenario())
    duck, mem = col.sinks
    assert col.stats.written == duck.store.count() == len(mem.events)  # every received update, once
    # only the last notification of each stream may still be on the wire when the workers stop
    pat = parse_path("/interfaces/interface[name=*]/state")
    per_note = max(sum(match(pat, parse_path(lf.path)) for lf in tw.leaves(n)) for n in names)
    assert sent - len(names) * per_note <= col.stats.written <= sent
    assert {k.split("/")[1] for k in col.stats.targets} == set(names)
    assert ("link-flap", "leaf-000:eth3") in {(f.kind, f.subject) for f in duck.store.findings()}
    col.close()


def test_a_malformed_notification_is_skipped_and_counted() -> None:
    """A hand-made target sends garbage between two good notifications."""
    from fabricscope.telemetry.codec import encode_notification, path_bytes, prefix_bytes

    good = encode_notification(1, prefix_bytes("leaf-000"),
                               [(path_bytes(parse_path("/interfaces/interface[name=eth1]/state/oper-status")), "UP")])
    garbage = b"\x0a\x07\x22\x05\x0a\xff\xff\xff\x01"  # an update whose path length runs off the end

    async def subscribe(requests, context):  # type: ignore[no-untyped-def]
        await anext(aiter(requests))
        for m in (good, garbage, good, gnmi_pb2.SubscribeResponse(sync_response=True).SerializeToString()):
            yield m

    async def scenario() -> tuple[MemorySink, Collector]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("gnmi.gNMI", {
            "Subscribe": grpc.stream_stream_rpc_method_handler(
                subscribe, request_deserializer=gnmi_pb2.SubscribeRequest.FromString, response_serializer=None)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        sink = MemorySink()
        cfg = parse_config({"targets": {"t": {"address": f"127.0.0.1:{port}", "names": ["leaf-000"]}},
                            "subscriptions": {"s": {"paths": ["/interfaces"], "mode": "once"}}}, source="t.yaml")
        col = Collector(cfg, sinks=[sink], detectors=DetectorSet([]))
        try:
            await col.run(duration_s=5)
        finally:
            await server.stop(None)
        return sink, col

    sink, col = asyncio.run(scenario())
    st = next(iter(col.stats.targets.values()))
    assert [e.value for e in sink.events] == ["UP", "UP"]
    assert st.errors == 1 and st.last_error.startswith("bad notification skipped") and st.syncs == 1
