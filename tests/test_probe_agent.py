"""The probe agent over real UDP sockets on loopback, and the probe CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path

from typer.testing import CliRunner

from fabricscope.cli import app
from fabricscope.fabric import leaf_spine_fabric
from fabricscope.fabric.io import write_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.probe import wire
from fabricscope.probe.agent import Prober, Responder
from fabricscope.probe.analysis import ANSWERED, LOST_UNKNOWN, REQUEST_LOST
from fabricscope.service.probe_twin import TwinMesh
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.store.probes import ProbeStore


def test_responder_and_prober_over_loopback() -> None:
    got: list[tuple[ProbeSample, int]] = []

    async def run() -> tuple[Responder, Prober]:
        resp = await Responder("127.0.0.1", 0).start()
        # A foreign datagram and a malformed probe: dropped and counted, never answered.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"hello", ("127.0.0.1", resp.port))
            s.sendto(b"FSPB" + b"\x09" * 60, ("127.0.0.1", resp.port))
        flows = [("peer", FiveTuple("127.0.0.1", "127.0.0.1", 0, resp.port)) for _ in range(4)]
        # One flow to a port nobody answers on: its probes are lost.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed:
            closed.bind(("127.0.0.1", 0))
            dead_port = closed.getsockname()[1]
        flows.append(("dead", FiveTuple("127.0.0.1", "127.0.0.1", 0, dead_port)))
        pr = await Prober("me", flows, lambda s, st: got.append((s, st)), rate_pps=200,
                          timeout_s=0.2).start()
        await asyncio.sleep(1.0)
        await pr.stop(drain_s=0.3)
        await resp.stop()
        return resp, pr

    resp, _pr = asyncio.run(run())
    assert resp.counters.rejected == {"short": 1, "version": 1}
    ok = [s for s, st in got if st == ANSWERED]
    lost = [(s, st) for s, st in got if st != ANSWERED]
    assert len(ok) >= 100
    assert all(s.dst == "peer" for s in ok)
    assert all(s.dst == "dead" for s, _ in lost) and lost
    # Nothing ever reached the dead port's responder, so no rx_count can classify them.
    assert {st for _, st in lost} <= {LOST_UNKNOWN, REQUEST_LOST}
    for s in ok:
        assert s.t_send_ns < s.t_recv_ns  # type: ignore[operator]
        assert s.t_resp_rx_ns <= s.t_resp_tx_ns  # type: ignore[operator]
        assert s.network_rtt_ns is not None and 0 < s.network_rtt_ns < 1e9
    assert len({s.seq for s, _ in got}) == len(got)


def test_rx_count_classifies_request_losses() -> None:
    got: list[tuple[ProbeSample, int]] = []

    async def run() -> None:
        resp = await Responder("127.0.0.1", 0).start()
        pr = Prober("me", [("peer", FiveTuple("127.0.0.1", "127.0.0.1", 0, resp.port))],
                    lambda s, st: got.append((s, st)), rate_pps=50, timeout_s=0.1)
        await pr.start()
        await asyncio.sleep(0.3)
        # Drop requests at the responder for a while (as a lossy request path would).
        assert resp._sock is not None
        loop = asyncio.get_running_loop()
        loop.remove_reader(resp._sock.fileno())
        resp_sock = resp._sock

        def swallow() -> None:
            with contextlib.suppress(BlockingIOError):
                resp_sock.recv(2048)

        loop.add_reader(resp_sock.fileno(), swallow)
        await asyncio.sleep(0.3)
        loop.remove_reader(resp_sock.fileno())
        loop.add_reader(resp_sock.fileno(), resp._drain)
        await asyncio.sleep(0.5)
        await pr.stop(drain_s=0.2)
        await resp.stop()

    asyncio.run(run())
    statuses = [st for _, st in got]
    assert statuses.count(REQUEST_LOST) >= 5


def test_wire_constant_port_is_the_plan_port() -> None:
    from fabricscope.probe.plan import PROBE_PORT

    assert Responder().port == PROBE_PORT
    assert wire.SIZE == 48


def test_cli_probe_analyze_finds_injected_link(tmp_path: Path) -> None:
    f = leaf_spine_fabric(leaves=3, hosts_per_leaf=2, spines=2)
    inv = write_fabric(f, tmp_path / "inv.json")
    mesh = TwinMesh(f, seed=1, plan_kw={"rail_peers_per_leaf": 2})
    ix = f.index
    up = [e for e in range(ix.n_edges)
          if ix.node_ids[int(ix.src[e])] == "leaf-001" and ix.node_ids[int(ix.dst[e])] == "spine-01"]
    subject = ix.edge_id(up[0])
    tr = mesh.transport_for(FaultSchedule.of([Fault("gray-loss", subject, params={"loss": 0.1})]), 3)
    obs = mesh.probe(tr, start_ns=0, duration_ns=20 * 10**9, seed=4)
    b = tr.carry(obs.flow, obs.t_send_ns)
    db = tmp_path / "p.duckdb"
    st = ProbeStore(db)
    st.insert(tr.samples(b), [ANSWERED if x >= 0 else REQUEST_LOST if not a else 2
                              for x, a in zip(b.t_recv_ns, b.req_arrived, strict=True)])
    st.close()
    # The twin hash is the inventory's hash, so pass the paths as a traceroute cache would.
    paths = []
    for i in range(len(mesh.flows)):
        _s, _d, ft = mesh.flows[i]
        fwd, rev = tr.path_edges(i)
        paths.append({"src_ip": ft.src_ip, "dst_ip": ft.dst_ip, "src_port": ft.src_port,
                      "dst_port": ft.dst_port, "links": [f.index.edge_id(e) for e in fwd]})
        paths.append({"src_ip": ft.dst_ip, "dst_ip": ft.src_ip, "src_port": ft.dst_port,
                      "dst_port": ft.src_port, "links": [f.index.edge_id(e) for e in rev]})
    (tmp_path / "paths.json").write_text(json.dumps(paths))
    r = CliRunner().invoke(app, ["probe", "analyze", "-i", str(inv), "--db", str(db), "--json",
                                 "--paths", str(tmp_path / "paths.json")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out[0]["subject"] == subject and out[0]["kind"] == "gray-link"
    # One DuckDB and one path file per agent (as on real hosts): the same findings.
    rows = list(zip(tr.samples(b), [ANSWERED if x >= 0 else REQUEST_LOST if not a else 2
                                    for x, a in zip(b.t_recv_ns, b.req_arrived, strict=True)], strict=True))
    args = ["probe", "analyze", "-i", str(inv), "--json"]
    for k, src in enumerate(sorted({s.src for s, _ in rows})):
        part = [(s, x) for s, x in rows if s.src == src]
        st = ProbeStore(tmp_path / f"h{k}.duckdb")
        st.insert([s for s, _ in part], [x for _, x in part])
        st.close()
        mine = [p for p in paths if p["src_ip"] == f.devices[src].address
                or p["dst_ip"] == f.devices[src].address]
        (tmp_path / f"p{k}.json").write_text(json.dumps(mine))
        args += ["--db", str(tmp_path / f"h{k}.duckdb"), "--paths", str(tmp_path / f"p{k}.json")]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert [(x["kind"], x["subject"]) for x in json.loads(r.output)] == [(x["kind"], x["subject"]) for x in out]
    # Without paths the candidate sets still point at a link of the right switch pair.
    r = CliRunner().invoke(app, ["probe", "analyze", "-i", str(inv), "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    f = leaf_spine_fabric(leaves=2, hosts_per_leaf=1, spines=1)
    inv = write_fabric(f, tmp_path / "inv.json")
    r = CliRunner().invoke(app, ["probe", "analyze", "-i", str(inv), "--db", str(tmp_path / "no.duckdb")])
    assert isinstance(r.exception, ConfigError) and "no such file" in str(r.exception)
    r = CliRunner().invoke(app, ["probe", "agent", "-i", str(inv), "--self", "host0000"])
    assert isinstance(r.exception, ConfigError) and "--db" in str(r.exception)
