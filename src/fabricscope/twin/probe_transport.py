"""The twin's probe transport: carries probe requests and replies through simulated forwarding.

The ECMP hash of each 5-tuple decides the path (``Routing.path``: the request takes the path of
its tuple, the reply the path of the swapped tuple), faults from the one fault model act on
what they cover, and responders stamp receive/send times on their own (offset) clocks:

* ``gray-loss`` (``loss``) on a directed link ``a->b`` or a cable ``a|b``: random drop;
* ``link-down``: drops everything on the cable (a black hole before routers reconverge);
* ``link-delay`` (``delay_ns``) on a link: added one-way delay;
* ``congestion`` (``load``) on a link: exponential queueing delay with mean
  ``queue_unit_ns * load / (1 - load)`` (M/M/1 waiting time in units of a packet time);
* ``switch-fault`` (``loss``, ``delay_ns``): every packet entering the switch;
* ``nic-fault`` (``loss``, ``delay_ns``): every packet sent or received by the NIC;
* ``cpu-starved`` (``delay_ns``) on a host or NIC: responder processing delay (exponential
  with that mean), never network loss;
* ``optic-degrading`` on a port ``P`` with a physical ``mode`` (aging-laser, dirty-connector,
  bent-fiber, hot-module): probes entering ``P`` (``peer->P``) and entering its peer
  (``P->peer``) are lost with the RS(544,514) frame loss of that receiver's BER at the probe's
  send time (:func:`fabricscope.twin.optics_physics.mode_frame_loss`, the function the twin's
  counters use, for a frame of ``probe_frame_bytes``); ``generic`` stays invisible to probes.

Everything is vectorized over probes: a batch of a million probes costs a few numpy passes.
Paths are computed once per registered flow. Time enters as arrays of send times (or a
clock for :meth:`ProbeTransport.send_one`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.routing import PathTable, Routing
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.sim.clock import Clock
from fabricscope.sim.faults import Fault, FaultSchedule, optic_mode
from fabricscope.twin.optics_physics import mode_code, mode_frame_loss

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
LOST = -1
NS_PER_DAY = 86_400 * 1_000_000_000
#: A probe on the wire: 48-byte payload + UDP 8 + IPv4 20 + Ethernet 14 + FCS 4.
PROBE_FRAME_BYTES = 94


class FlowTable(Sequence[tuple[str, str, FiveTuple]]):
    """Registered probe flows as columns (node indices, ports); items are built on demand.

    Indexing gives ``(src NIC id, dst NIC id, FiveTuple)`` like a list of flows would, so the
    analysis reads it as any sequence; ``src_node`` / ``dst_node`` (``fabric.index`` node
    indices) let it vectorize.
    """

    def __init__(self, fabric: Fabric) -> None:
        self._ids = fabric.index.node_ids
        devs = fabric.devices
        self._ip = [devs[n].address or n for n in self._ids]
        self.src_node = np.zeros(0, dtype=np.int64)
        self.dst_node = np.zeros(0, dtype=np.int64)
        self.src_port = np.zeros(0, dtype=np.int64)
        self.dst_port = np.zeros(0, dtype=np.int64)

    @property
    def size(self) -> int:
        return int(self.src_node.shape[0])

    def extend(self, s: I64, t: I64, sp: I64, dp: I64) -> None:
        self.src_node = np.r_[self.src_node, s].astype(np.int64)
        self.dst_node = np.r_[self.dst_node, t].astype(np.int64)
        self.src_port = np.r_[self.src_port, sp].astype(np.int64)
        self.dst_port = np.r_[self.dst_port, dp].astype(np.int64)

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, i: int) -> tuple[str, str, FiveTuple]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, str, FiveTuple]]: ...
    def __getitem__(self, i: int | slice) -> tuple[str, str, FiveTuple] | list[tuple[str, str, FiveTuple]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.size))]
        s, t = int(self.src_node[i]), int(self.dst_node[i])
        return (self._ids[s], self._ids[t],
                FiveTuple(self._ip[s], self._ip[t], int(self.src_port[i]), int(self.dst_port[i]), 17))


def padded(table: PathTable) -> I64:
    """A CSR path table as a (flows x longest path) array padded with -1."""
    lens = np.diff(table.offsets)
    n = lens.shape[0]
    w = int(lens.max()) if n else 1
    out = np.full((n, max(w, 1)), -1, dtype=np.int64)
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(table.edges.shape[0]) - np.repeat(table.offsets[:-1], lens)
    out[rows, cols] = table.edges
    return out


@dataclass(frozen=True, slots=True)
class ProbeBatch:
    """Columnar probe results: ``t_recv_ns == -1`` (and responder times -1) means lost."""

    flow: I64  # index into the transport's registered flows
    seq: I64
    t_send_ns: I64
    t_resp_rx_ns: I64
    t_resp_tx_ns: I64
    t_recv_ns: I64
    req_arrived: npt.NDArray[np.bool_]  # ground truth a live prober learns from rx_count

    def __len__(self) -> int:
        return int(self.flow.shape[0])


@dataclass(frozen=True, slots=True)
class _Effect:
    fault: Fault
    edges: npt.NDArray[np.bool_]  # per directed edge: does the fault act on it?
    loss: float
    delay_ns: float
    kind: str
    # per-probe loss from send times (a degrading optic: loss grows with time), else None
    loss_at: Callable[[I64], F64] | None = None


class ProbeTransport:
    """Carry probes through a twin fabric with faults.

    Parameters
    ----------
    fabric, routing:
        The inventory and its ECMP routing (hash config) that decide paths.
    faults:
        The fault schedule (ground truth; the analysis never sees it).
    seed:
        Seed for drops, jitter and clock offsets.
    timeout_ns:
        A reply slower than this counts as lost (the prober gave up).
    optic_lanes, probe_frame_bytes:
        Lanes of the twin's optics (``TwinConfig.lanes``) and a probe's size on the wire, for
        the frame loss of a degrading optic (:mod:`fabricscope.twin.optics_physics`).
    """

    def __init__(
        self,
        fabric: Fabric,
        *,
        routing: Routing | None = None,
        faults: FaultSchedule | None = None,
        seed: int = 0,
        timeout_ns: int = 1_000_000_000,
        jitter_ns: float = 2_000.0,
        responder_ns: float = 8_000.0,
        queue_unit_ns: float = 1_000.0,
        background_loss: float = 0.0,
        optic_lanes: int = 4,
        probe_frame_bytes: int = PROBE_FRAME_BYTES,
    ) -> None:
        self.fabric = fabric
        self.routing = routing or Routing(fabric)
        self.faults = faults or FaultSchedule()
        self.rng = np.random.default_rng(seed)
        self.timeout_ns = int(timeout_ns)
        self.jitter_ns = float(jitter_ns)
        self.responder_ns = float(responder_ns)
        self.queue_unit_ns = float(queue_unit_ns)
        self.background_loss = float(background_loss)
        if optic_lanes < 1 or probe_frame_bytes < 1:
            raise ConfigError(f"ProbeTransport: optic_lanes ({optic_lanes!r}) and "
                              f"probe_frame_bytes ({probe_frame_bytes!r}) must be >= 1")
        self.optic_lanes = int(optic_lanes)
        self.probe_frame_bytes = int(probe_frame_bytes)
        ix = fabric.index
        self._ix = ix
        # Responders stamp on their own clocks: a per-NIC offset (seconds apart) so nothing
        # downstream may compare absolute times across hosts.
        self._offset = self.rng.integers(-10**9, 10**9, size=ix.n_nodes)
        self.flows = FlowTable(fabric)
        self._flow_of: dict[tuple[int, int, int, int], int] = {}
        self._tables: list[tuple[PathTable, PathTable]] = []
        self._flow_cache: dict[object, tuple[I64, I64]] = {}
        self._arrays: tuple[I64, I64, I64, I64, I64, I64] | None = None
        self._effects = [e for f in self.faults.faults for e in self._effects_of(f)]

    # ------------------------------------------------------------------ faults
    def _edges_of_link(self, subject: str) -> npt.NDArray[np.bool_]:
        m = np.zeros(self._ix.n_edges, dtype=bool)
        if "->" in subject:
            m[self.fabric.edge_index(subject)] = True
        elif "|" in subject:
            e = self.fabric.edge_index(subject.replace("|", "->"))
            m[e] = m[e ^ 1] = True
        else:
            raise ConfigError(f"fault subject {subject!r}: expected a link 'a->b' or 'a|b'")
        return m

    def _effects_of(self, f: Fault) -> list[_Effect]:
        if f.kind == "optic-degrading" and mode_code(optic_mode(f)) != 0:
            return self._optic_effects(f)
        return [self._effect(f)]

    def _optic_effects(self, f: Fault) -> list[_Effect]:
        """Two effects of a degrading optic on port ``P``: loss into ``P`` and into its peer."""
        peer = self.fabric.peer_port.get(f.subject)
        if peer is None:
            raise ConfigError(f"fault {f.kind}: subject: no such cabled port {f.subject!r} in "
                              f"{self.fabric.name} (expected 'switch:ethN')")
        code = mode_code(f.param("mode", 0.0))
        rate, accel, lane = f.param("rate", 1.0), f.param("accel", 1.0), f.param("lane", 0.0)
        if code == 1 and not (lane.is_integer() and 0 <= lane < self.optic_lanes):
            raise ConfigError(f"fault {f.kind} on {f.subject}: lane: must be an integer in "
                              f"0..{self.optic_lanes - 1}, got {lane!r}")
        lanes, size = self.optic_lanes, self.probe_frame_bytes

        def at(end: int) -> Callable[[I64], F64]:
            def loss(t_send: I64) -> F64:
                days = (np.asarray(t_send, dtype=np.float64) - f.start_ns) / NS_PER_DAY * accel
                return mode_frame_loss(code, days, rate=rate, lanes=lanes, lane=int(lane),
                                       frame_bytes=size)[end]
            return loss

        out = []
        for end, edge in ((0, f"{peer}->{f.subject}"), (1, f"{f.subject}->{peer}")):
            m = np.zeros(self._ix.n_edges, dtype=bool)
            m[self.fabric.edge_index(edge)] = True
            out.append(_Effect(f, m, 0.0, 0.0, f.kind, at(end)))
        return out

    def _effect(self, f: Fault) -> _Effect:
        ix = self._ix
        m: npt.NDArray[np.bool_]
        if f.kind in ("gray-loss", "link-down", "link-delay", "congestion"):
            m = self._edges_of_link(f.subject)
        elif f.kind == "switch-fault":
            node = self._node(f.subject)
            m = ix.dst == node
        elif f.kind in ("nic-fault", "cpu-starved"):
            nics = self._nics_of(f.subject)
            m = np.isin(ix.dst, nics) | np.isin(ix.src, nics)
        else:
            m = np.zeros(ix.n_edges, dtype=bool)  # not a probe-visible fault
        loss = {"gray-loss": f.param("loss", 0.01), "link-down": 1.0,
                "switch-fault": f.param("loss", 0.1), "nic-fault": f.param("loss", 0.1)}.get(f.kind, 0.0)
        delay = f.param("delay_ns", 0.0)
        if f.kind == "congestion":
            load = min(f.param("load", 0.8), 0.99)
            delay = self.queue_unit_ns * load / (1.0 - load)
        if f.kind == "cpu-starved":
            delay = f.param("delay_ns", 2_000_000.0)
        if not 0.0 <= loss <= 1.0:
            raise ConfigError(f"fault {f.kind} on {f.subject}: loss must be in [0, 1], got {loss}")
        return _Effect(f, m, loss, delay, f.kind)

    def _node(self, dev: str) -> int:
        try:
            return self._ix.node_of[dev]
        except KeyError:
            raise ConfigError(f"fault subject {dev!r}: not a NIC or switch of {self.fabric.name}") from None

    def _nics_of(self, subject: str) -> list[int]:
        d = self.fabric.devices.get(subject)
        if d is None:
            raise ConfigError(f"fault subject {subject!r}: not a device of {self.fabric.name}")
        if d.role == "host":
            return [self._ix.node_of[n.id] for n in self.fabric.nics_of_host[subject]]
        return [self._node(subject)]

    # ------------------------------------------------------------------ flows
    def register(self, flows: Sequence[tuple[str, str, FiveTuple]]) -> I64:
        """Register (src NIC, dst NIC, 5-tuple) flows; returns their indices (idempotent)."""
        node = self.routing.node
        out = np.empty(len(flows), dtype=np.int64)
        new: list[int] = []
        for i, (src, dst, ft) in enumerate(flows):
            key = (node(src), node(dst), ft.src_port, ft.dst_port)
            j = self._flow_of.get(key)
            if j is None:
                j = self._flow_of[key] = self.flows.size + len(new)
                new.append(i)
            out[i] = j
        if new:
            self.register_arrays(
                np.array([node(flows[i][0]) for i in new], dtype=np.int64),
                np.array([node(flows[i][1]) for i in new], dtype=np.int64),
                np.array([flows[i][2].src_port for i in new], dtype=np.int64),
                np.array([flows[i][2].dst_port for i in new], dtype=np.int64),
            )
        return out

    def register_arrays(self, src_node: I64, dst_node: I64, src_port: I64, dst_port: I64) -> I64:
        """Bulk registration by node indices and ports; paths by ``Routing.route_many``.

        (IPv4 addresses of the inventory; no deduplication against earlier flows.)
        """
        n0 = self.flows.size
        fwd = self.routing.route_many(src_node, dst_node, src_port, dst_ports=dst_port, strict=False)
        rev = self.routing.route_many(dst_node, src_node, dst_port, dst_ports=src_port, strict=False)
        self.flows.extend(src_node, dst_node, src_port, dst_port)
        self._tables.append((fwd, rev))
        self._arrays = None
        return np.arange(n0, self.flows.size, dtype=np.int64)

    def path_tables(self) -> tuple[PathTable, PathTable]:
        """Request and reply paths of every registered flow (CSR, in registration order)."""
        if len(self._tables) != 1:
            fo, fe, fk, ro, re_, rk = [], [], [], [], [], []
            offf = offr = 0
            for f, r in self._tables:
                fo.append(f.offsets[:-1] + offf)
                ro.append(r.offsets[:-1] + offr)
                fe.append(f.edges)
                re_.append(r.edges)
                fk.append(f.ok)
                rk.append(r.ok)
                offf += int(f.offsets[-1])
                offr += int(r.offsets[-1])
            fwd = PathTable(np.r_[np.concatenate(fo or [np.zeros(0, np.int64)]), offf].astype(np.int64),
                            np.concatenate(fe or [np.zeros(0, np.int64)]),
                            np.concatenate(fk or [np.zeros(0, bool)]))
            rev = PathTable(np.r_[np.concatenate(ro or [np.zeros(0, np.int64)]), offr].astype(np.int64),
                            np.concatenate(re_ or [np.zeros(0, np.int64)]),
                            np.concatenate(rk or [np.zeros(0, bool)]))
            self._tables = [(fwd, rev)]
        return self._tables[0]

    def _padded(self) -> tuple[I64, I64, I64, I64, I64, I64]:
        if self._arrays is None:
            fwd_t, rev_t = self.path_tables()
            fwd, rev = padded(fwd_t), padded(rev_t)
            w = max(fwd.shape[1], rev.shape[1])
            fwd = np.pad(fwd, ((0, 0), (0, w - fwd.shape[1])), constant_values=-1)
            rev = np.pad(rev, ((0, 0), (0, w - rev.shape[1])), constant_values=-1)
            fwd[~fwd_t.ok, 0] = -1
            lat = self._ix.latency_ns
            lf = np.where(fwd >= 0, lat[np.maximum(fwd, 0)], 0).sum(1)
            lr = np.where(rev >= 0, lat[np.maximum(rev, 0)], 0).sum(1)
            self._arrays = (fwd, rev, lf, lr, self.flows.src_node, self.flows.dst_node)
        return self._arrays

    def _per_flow(self, key: object, hits: Callable[[], tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]],
                  ) -> tuple[I64, I64]:
        """Per registered flow, how often its request / reply path crosses something
        (cached: per-probe work is then one gather instead of a path scan)."""
        hit = self._flow_cache.get(key)
        if hit is None or hit[0].shape[0] != self.flows.size:
            fwd_hit, rev_hit = hits()
            hit = (fwd_hit.sum(1).astype(np.int64), rev_hit.sum(1).astype(np.int64))
            self._flow_cache[key] = hit
        return hit

    def path_edges(self, flow: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(request edges, reply edges) of a registered flow (for tests and plots)."""
        f, r = self.path_tables()
        return f.path(flow), r.path(flow)

    # ------------------------------------------------------------------ carrying
    def carry(self, flow: I64, t_send_ns: I64, seq: I64 | None = None) -> ProbeBatch:
        """Send one probe per element (flow index, send time) and return what comes back."""
        flow = np.asarray(flow, dtype=np.int64)
        t_send = np.asarray(t_send_ns, dtype=np.int64)
        n = flow.shape[0]
        fwd_all, rev_all, lat_f, lat_r, _src_n, dst_n = self._padded()
        unroutable = ((fwd_all[:, 0] < 0) | (rev_all[:, 0] < 0))[flow]
        hf, hr = self._per_flow("hops", lambda: (fwd_all >= 0, rev_all >= 0))
        p_fwd = (1.0 - self.background_loss) ** hf[flow]
        p_rev = (1.0 - self.background_loss) ** hr[flow]
        d_fwd = lat_f[flow].astype(np.float64) + self.rng.exponential(self.jitter_ns, n)
        d_rev = lat_r[flow].astype(np.float64) + self.rng.exponential(self.jitter_ns, n)
        proc = np.asarray(self.rng.exponential(self.responder_ns / 4.0, n), dtype=np.float64) + self.responder_ns
        for k, eff in enumerate(self._effects):
            f = eff.fault
            active = (t_send >= f.start_ns) & (t_send < (f.end_ns if f.end_ns is not None else 2**62))
            if not active.any():
                continue
            if eff.kind == "cpu-starved":
                resp_nodes = self._nics_of(f.subject)
                hit = active & np.isin(dst_n[flow], resp_nodes)
                proc = proc + np.where(hit, self.rng.exponential(eff.delay_ns, n), 0.0)
                continue
            if not eff.edges.any():
                continue
            m = eff.edges
            def crossings(m: npt.NDArray[np.bool_] = m) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
                return (np.where(fwd_all >= 0, m[np.maximum(fwd_all, 0)], False),
                        np.where(rev_all >= 0, m[np.maximum(rev_all, 0)], False))

            cf_flow, cr_flow = self._per_flow(k, crossings)
            cf = cf_flow[flow] * active
            cr = cr_flow[flow] * active
            if eff.loss > 0:
                p_fwd = p_fwd * (1.0 - eff.loss) ** cf
                p_rev = p_rev * (1.0 - eff.loss) ** cr
            if eff.loss_at is not None:
                hit = (cf > 0) | (cr > 0)
                if hit.any():
                    keep = np.ones(n)
                    keep[hit] = 1.0 - eff.loss_at(t_send[hit])
                    p_fwd = p_fwd * keep ** cf
                    p_rev = p_rev * keep ** cr
            if eff.delay_ns > 0:
                if eff.kind == "congestion":
                    d_fwd += np.where(cf > 0, self.rng.exponential(eff.delay_ns, n) * cf, 0.0)
                    d_rev += np.where(cr > 0, self.rng.exponential(eff.delay_ns, n) * cr, 0.0)
                else:
                    d_fwd += eff.delay_ns * cf
                    d_rev += eff.delay_ns * cr
        ok_fwd = (self.rng.random(n) < p_fwd) & ~unroutable
        ok_rev = self.rng.random(n) < p_rev
        t_rx = t_send + d_fwd.astype(np.int64)
        t_tx = t_rx + proc.astype(np.int64)
        t_recv = t_tx + d_rev.astype(np.int64)
        ok = ok_fwd & ok_rev & (t_recv - t_send <= self.timeout_ns)
        off = self._offset[dst_n[flow]]
        lost = np.int64(LOST)
        return ProbeBatch(
            flow=flow,
            seq=np.arange(n, dtype=np.int64) if seq is None else np.asarray(seq, dtype=np.int64),
            t_send_ns=t_send,
            t_resp_rx_ns=np.where(ok, t_rx + off, lost),
            t_resp_tx_ns=np.where(ok, t_tx + off, lost),
            t_recv_ns=np.where(ok, t_recv, lost),
            req_arrived=ok_fwd,
        )

    def send_one(self, src: str, dst: str, flow: FiveTuple, seq: int, clock: Clock) -> ProbeSample:
        """One probe sent now (``clock``), as a :class:`ProbeSample`."""
        j = self.register([(src, dst, flow)])
        b = self.carry(j, np.array([clock.now_ns()], dtype=np.int64), np.array([seq]))
        return self.samples(b)[0]

    def samples(self, batch: ProbeBatch) -> list[ProbeSample]:
        """Convert a batch to records (small batches; analysis prefers the columns)."""
        out: list[ProbeSample] = []
        for i in range(len(batch)):
            src, dst, ft = self.flows[int(batch.flow[i])]
            rx, tx, rc = int(batch.t_resp_rx_ns[i]), int(batch.t_resp_tx_ns[i]), int(batch.t_recv_ns[i])
            out.append(ProbeSample(src, dst, ft, int(batch.seq[i]), int(batch.t_send_ns[i]),
                                   None if rc == LOST else rx, None if rc == LOST else tx,
                                   None if rc == LOST else rc))
        return out


def round_robin_schedule(
    flow_groups: Sequence[I64],
    *,
    rate_pps: float,
    start_ns: int,
    duration_ns: int,
    rng: np.random.Generator,
) -> tuple[I64, I64]:
    """Send times of agents that each cycle through their flows at ``rate_pps``.

    ``flow_groups[a]`` are agent ``a``'s flow indices. Each agent starts at a random phase
    and a random offset in its flow list (agents are not synchronized). Returns
    (flow indices, send times) sorted by time.
    """
    per = int(rate_pps * duration_ns / 1e9)
    if per <= 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    gap = 1e9 / rate_pps
    flows: list[I64] = []
    times: list[I64] = []
    k = np.arange(per)
    for g in flow_groups:
        if len(g) == 0:
            continue
        phase = rng.random() * gap
        off = int(rng.integers(len(g)))
        flows.append(g[(off + k) % len(g)])
        times.append((start_ns + phase + k * gap).astype(np.int64))
    if not flows:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    f, t = np.concatenate(flows), np.concatenate(times)
    order = np.argsort(t, kind="stable")
    return f[order], t[order]
