"""Active checks on the twin: gNMI Gets of a suspect's ports and on-demand DOM reads.

:class:`TwinChecks` is the twin backend of :class:`~fabricscope.diagnosis.checks.CheckRunner`.
It keeps its own :class:`~fabricscope.twin.state.Twin` of the scenario (the telemetry
instrument's: same fabric, load and faults), advanced on the simulated clock to each check's
start and end, and reads it only through the leaves a switch serves over gNMI
(:meth:`Twin.leaves` / :meth:`Twin.read`) and the transceiver readings ``ethtool -m`` returns
(:meth:`Twin.dom`); the injected faults are never consulted. Each check is judged with the
production detectors' thresholds:

* ``port-counters`` (two Gets, 1 s apart, of every switch port of the resource): an
  ``in-errors`` / ``in-fcs-errors`` increase is ``error-counter-increase``, an
  ``out-discards`` increase ``discard-increase`` (``ErrorIncreaseDetector``: >= 1), pause
  frames sent (or received from the peer) at >= 10,000/s ``pause-storm`` on the sender
  (``PauseStormDetector``), ECN marks at >= 500/s or a queue >= 1 MB at both reads
  ``queue-buildup`` (``MicroBurstDetector``), oper-status DOWN ``link-down``, >= 2 carrier
  transitions between the Gets ``link-flap`` (``FlapDetector``'s ``min_transitions``;
  present only: one second without a transition says nothing of a slower flap). A port that
  changed state during the check leaves ``link-down`` undecided. A cable with a host end
  decides only ``link-down`` (the host side's receiver and queue are not a gNMI target);
* ``port-speed`` (one Get): ``negotiated-port-speed`` below ``port-speed`` on a port of the
  resource is ``speed-degraded``;
* ``dom`` (both ends' modules): a lane's own light (tx, or rx not explained by the far end's
  transmitter) >= ``drop_db`` below the reading of the scenario's start (the optics store's
  history) is ``optic-degrading``, rx below ``rx_low_dbm`` ``optic-rx-low``
  (``DomDetector``'s rules, :mod:`fabricscope.optics.dom`);
* ``probe-burst``: probes over 500 ms along planned flows of the mesh, through the probe
  instrument's twin transport (its own random stream), judged alone by the production probe
  analysis (:func:`~fabricscope.probe.analysis.analyze`, with the instrument's baseline), as
  the passive instrument would report it. For a host, ``BURST_PROBES`` toward its NICs:
  ``cpu-starved`` on the host, decided with at least ``BURST_MIN_ANSWERS`` replies (the
  analysis' own ``min_samples``). For a NIC, ``BURST_PROBES_NIC``: half on flows to and
  from it, half on flows of the other NICs on its leaf (the controls: without them every
  probe crosses the NIC and the leaf alike and the analysis rightly calls it ambiguous):
  ``nic-fault`` on the NIC; left undecided when the analysis is ambiguous about the NIC or
  fewer than ``BURST_MIN_SENT`` probes crossed it. For a cable or a switch,
  ``BURST_PROBES_PATH``: half on planned flows whose request or reply crosses it, half on
  control flows through the devices at the cable's ends (a switch: its neighbours) but not
  through it, so the analysis can tell a link from its switches and a switch from one of
  its links: ``gray-link`` on a direction of the cable, ``switch-fault`` on the switch.
  These decide presence only: a loss of a few tenths of a percent leaves one or two of the
  ~500 probes through the suspect lost, so a clean burst is no evidence of absence;
* ``trace-window`` (a GPU or NIC of the job): the straggler instrument's production
  analysis run now on the job's last 32 iterations completed at the request time (the trace
  store's, shared with the instrument), instead of at its next scheduled analysis. It is a
  query of the whole job, so every slow GPU, NIC or switch it names is present (a ring's
  slow NIC need not be the NIC the suspicion named first); it decides ``slow-gpu`` on a GPU
  or ``slow-nic`` on a NIC the job uses, with >= 2 iterations done.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from scipy.sparse import csc_matrix

from fabricscope.diagnosis.checks import (
    CHECK_KINDS,
    PROBE_BURST_NS,
    PROBE_TIMEOUT_NS,
    CheckOutcome,
    CheckRequest,
)
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.model import Observed
from fabricscope.fabric.inventory import port_device
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.optics.dom import DomThresholds
from fabricscope.probe.analysis import Baseline, Observations, analyze
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.probe import ProbeInstrument, probe_faults
from fabricscope.service.instruments.straggler import StragglerInstrument
from fabricscope.service.instruments.telemetry import TelemetryInstrument
from fabricscope.service.probe_twin import TwinMesh, to_observations
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import FaultSchedule
from fabricscope.twin.probe_transport import ProbeTransport
from fabricscope.twin.state import Twin, TwinLeaf

__all__ = ["TwinChecks"]

I64 = npt.NDArray[np.int64]
NS = 1_000_000_000
ERROR_MIN = 1.0
PAUSE_RATE = 10_000.0
ECN_RATE = 500.0
QUEUE_BYTES = 1e6
#: A probe burst: this many probes over at most ``BURST_FLOWS`` of the suspect's planned flows
#: (a NIC: ``BURST_PROBES_NIC``, half on its own flows, half on its leaf-mates').
BURST_FLOWS = 64
BURST_PROBES = 256
BURST_PROBES_NIC = 512
BURST_PROBES_PATH = 1024
#: Least evidence for a decision: answered probes toward the host (``host_findings``'
#: ``min_samples``).
BURST_MIN_ANSWERS = 10
BURST_MIN_SENT = 64
#: Carrier transitions within one check that make a flap (``FlapDetector.min_transitions``).
FLAP_TRANSITIONS = 2
_COUNTER_LEAVES = ("in-errors", "in-fcs-errors", "out-discards", "out-mac-pause-frames",
                   "in-mac-pause-frames", "ecn-marked-pkts", "depth-bytes", "oper-status",
                   "carrier-transitions")


class TwinChecks:
    """Runs :class:`~fabricscope.diagnosis.checks.CheckRequest` s against a twin of ``spec``.

    Calls must come in non-decreasing simulated time (the :class:`CheckRunner` contract);
    ``self.log`` keeps (kind, resource, start, end) of every check run, for cost accounting.
    """

    def __init__(self, spec: ScenarioSpec, *, telemetry: TelemetryInstrument | None = None,
                 dom: DomThresholds | None = None, probe: ProbeInstrument | None = None,
                 straggler: StragglerInstrument | None = None) -> None:
        self.spec = spec
        self._straggler = straggler
        self.fabric = spec.fabric
        self._probe_ins = probe
        self._probe: tuple[TwinMesh, Baseline, ProbeTransport] | None = None
        self._burst: dict[CheckRequest, Observations] = {}
        self._csc: csc_matrix | None = None
        self._through_cache: dict[str, tuple[I64, I64]] = {}
        self.rmap = ResourceMap(spec.fabric)
        self.clock = SimClock(0)
        ins = telemetry or TelemetryInstrument()
        self.twin: Twin = ins.twin(spec.fabric, spec.faults, spec.seed, self.clock, spec.transport)
        self.th = dom or DomThresholds()
        # the optics store's history: every module's reading at the scenario's start
        self._ref_rx = self.twin.field("rx_power_dbm").copy()
        self._ref_tx = self.twin.field("tx_power_dbm").copy()
        self._first: dict[CheckRequest, dict[str, list[int | float | str]]] = {}
        self._done: dict[CheckRequest, int] = {}
        self._leaf_index: dict[str, dict[str, TwinLeaf]] = {}
        self.log: list[tuple[str, str, int, int]] = []

    # -- plumbing ----------------------------------------------------------------------------
    def _at(self, t_ns: int) -> None:
        if t_ns < self.twin.now_ns:
            raise ConfigError(f"checks: time went back ({t_ns} < {self.twin.now_ns} ns)")
        self.clock.set(t_ns)
        self.twin.advance_to(t_ns)

    def _leaves(self, port: str) -> dict[str, TwinLeaf]:
        """The port's leaves by last path element (the queue that carries the load)."""
        hit = self._leaf_index.get(port)
        if hit is None:
            name = port.rsplit(":", 1)[1]
            hit = {}
            for lf in self.twin.leaves(port_device(port)):
                p = lf.path
                own = (f"[name={name}]" in p or f"[interface-id={name}]" in p)
                if not own or "/queues/queue[name=0]" in p or "/priority[" in p:
                    continue
                hit.setdefault(p.rsplit("/", 1)[1], lf)
            self._leaf_index[port] = hit
        return hit

    def _get(self, port: str, names: Sequence[str]) -> dict[str, int | float | str]:
        lv = self._leaves(port)
        got = [lv[n] for n in names if n in lv]
        return dict(zip([n for n in names if n in lv], self.twin.read(got), strict=True))

    def _switch_ports(self, resource: str) -> tuple[str, ...]:
        return tuple(p for p in self._ports(resource)
                     if self.fabric.devices[port_device(p)].is_switch)

    def _ports(self, resource: str) -> tuple[str, ...]:
        if resource in self.fabric.link_by_id:
            return tuple(resource.split("|"))
        if resource in self.fabric.ports:
            return (resource,)
        return ()

    # -- the CheckRunner protocol -------------------------------------------------------------
    def start(self, request: CheckRequest) -> int:
        """First readings of ``request`` at its request time; its completion time."""
        kind = CHECK_KINDS.get(request.kind)
        if kind is None:
            raise ConfigError(f"checks: unknown check kind {request.kind!r}")
        self._at(request.requested_ns)
        if request.kind == "port-counters":
            self._first[request] = {p: list(self._get(p, _COUNTER_LEAVES).values())
                                    for p in self._switch_ports(request.resource)}
        elif request.kind == "probe-burst":
            self._burst[request] = self._send_burst(request)
        done = request.requested_ns + kind.latency_ns
        self._done[request] = done
        return done

    def finish(self, request: CheckRequest) -> CheckOutcome:
        """Last readings and the judgement of ``request`` at its completion time."""
        done = self._done.pop(request)
        self._at(done)
        self.log.append((request.kind, request.resource, request.requested_ns, done))
        if request.kind == "port-counters":
            return self._counters(request, done)
        if request.kind == "port-speed":
            return self._speed(request, done)
        if request.kind == "probe-burst":
            return self._judge_burst(request, done)
        if request.kind == "trace-window":
            return self._trace_window(request, done)
        return self._dom(request, done)

    # -- probe bursts -----------------------------------------------------------------------
    def _probes(self) -> tuple[TwinMesh, Baseline, ProbeTransport]:
        """The probe instrument's mesh and baseline, and a transport of this scenario's faults
        with its own random stream (built on the first burst)."""
        if self._probe is None:
            ins = self._probe_ins or ProbeInstrument()
            mesh, base = ins.prepared(self.fabric)
            tr = mesh.transport_for(FaultSchedule.of(probe_faults(self.spec.faults)),
                                    self.spec.seed + 7919, background_loss=ins.background_loss)
            if tr.timeout_ns != PROBE_TIMEOUT_NS:  # the check's modelled latency assumes it
                raise ConfigError(f"checks: the probe transport's reply timeout is "
                                  f"{tr.timeout_ns} ns, the probe-burst check models "
                                  f"{PROBE_TIMEOUT_NS} ns")
            self._probe = (mesh, base, tr)
        return self._probe

    def _host_nodes(self, resource: str) -> list[int]:
        """The node indices of host ``resource``'s NICs (none: not a host)."""
        ix = self.fabric.index
        return [ix.node_of[n.id] for n in self.fabric.nics_of_host.get(resource, ())]

    def _leaf_mates(self, nic: str) -> list[int]:
        """Node indices of the other NICs on ``nic``'s leaf (its first switch)."""
        leaves = self.fabric.leaves_of_nic.get(nic, ())
        if not leaves:
            return []
        devs, ix = self.fabric.devices, self.fabric.index
        mates = {port_device(p) for p in self.fabric.neighbors_ports(leaves[0])}
        return sorted(ix.node_of[m] for m in mates if m != nic and devs[m].role == "nic")

    def _pick(self, idx: I64, k: int, key: str) -> I64:
        if idx.size <= k:
            return idx
        rng = np.random.default_rng(zlib.crc32(key.encode()) + self.spec.seed)
        return np.sort(rng.choice(idx, k, replace=False))

    def _burst_plan(self, resource: str) -> tuple[str, I64, I64, int]:
        """(finding decided, the suspect's own planned flows, control flows, probes) of a
        burst for ``resource``: a NIC, flows to and from it plus its leaf-mates' flows; a
        cable or switch, flows through it plus flows through its end devices / neighbours
        (:meth:`_through`); a host, flows toward its NICs and no controls."""
        fl = self._probes()[0].flows
        r = resource
        if self._is_nic(r):
            node = self.fabric.index.node_of[r]
            own = np.flatnonzero((fl.src_node == node) | (fl.dst_node == node))
            mates = self._leaf_mates(r)
            ctl = np.flatnonzero(np.isin(fl.src_node, mates) | np.isin(fl.dst_node, mates))
            return "nic-fault", own, ctl, BURST_PROBES_NIC
        if self._is_switch(r) or r in self.fabric.link_by_id:
            own, ctl = self._through(r)
            return ("switch-fault" if self._is_switch(r) else "gray-link"), own, ctl, \
                BURST_PROBES_PATH
        own = np.flatnonzero(np.isin(fl.dst_node, self._host_nodes(r)))
        return "cpu-starved", own, own[:0], BURST_PROBES

    def _send_burst(self, request: CheckRequest) -> Observations:
        """Probes over planned flows, spread over ``PROBE_BURST_NS`` from the request: the
        suspect's own flows, half of them beside controls when it has any
        (:meth:`_burst_plan`); flows drawn deterministically per suspect."""
        mesh, _base, tr = self._probes()
        r = request.resource
        _want, own, ctl, total = self._burst_plan(r)
        idx = self._pick(own, BURST_FLOWS, r) if not ctl.size else np.sort(np.concatenate(
            [self._pick(own, BURST_FLOWS // 2, r), self._pick(ctl, BURST_FLOWS // 2, r + "/control")]))
        per = -(-total // max(idx.size, 1))
        n = idx.size * per
        flow = np.repeat(idx, per)
        ts = request.requested_ns + (np.arange(n, dtype=np.int64) * PROBE_BURST_NS) // max(n, 1)
        return to_observations(tr.carry(flow, ts), mesh.flows)

    def _is_nic(self, resource: str) -> bool:
        d = self.fabric.devices.get(resource)
        return d is not None and d.role == "nic"

    def _is_switch(self, resource: str) -> bool:
        d = self.fabric.devices.get(resource)
        return d is not None and d.is_switch

    def _components(self, resource: str) -> tuple[list[int], list[int]]:
        """Path-model components of a cable or switch suspect and of its controls: a cable's
        two directed links, and the two devices at its ends; a switch's node, and its
        neighbours' nodes (flows through them but not through the suspect separate it from
        the devices it shares paths with)."""
        ix = self.fabric.index
        E = ix.n_edges
        if resource in self.fabric.link_by_id:
            a, b = resource.split("|")
            own = [self.fabric.edge_index(f"{a}->{b}"), self.fabric.edge_index(f"{b}->{a}")]
            ctl = [E + ix.node_of[port_device(p)] for p in (a, b)]
            return own, ctl
        mates = {port_device(p) for p in self.fabric.neighbors_ports(resource)}
        return [E + ix.node_of[resource]], [E + ix.node_of[m] for m in sorted(mates)]

    def _through(self, resource: str) -> tuple[I64, I64]:
        """Planned flows whose request or reply crosses the suspect, and control flows that
        cross one of its control components but not the suspect (:meth:`_components`)."""
        hit = self._through_cache.get(resource)
        if hit is None:
            mesh, _base, _tr = self._probes()
            P, pf, pr = mesh.model.patterns
            csc = self._csc if self._csc is not None else P.tocsc()
            self._csc = csc
            own_c, ctl_c = self._components(resource)

            def crossing(cols: list[int]) -> npt.NDArray[np.bool_]:
                rows = np.asarray(csc[:, cols].sum(axis=1)).ravel() > 0
                out: npt.NDArray[np.bool_] = rows[pf] | rows[pr]
                return out

            own = crossing(own_c)
            ctl = crossing(ctl_c) & ~own
            hit = (np.flatnonzero(own), np.flatnonzero(ctl))
            self._through_cache[resource] = hit
        return hit

    def _judge_burst(self, request: CheckRequest, done: int) -> CheckOutcome:
        obs = self._burst.pop(request)
        mesh, base, _tr = self._probes()
        answered = int(np.count_nonzero(obs.t_recv_ns >= 0))
        r = request.resource
        present: list[Observed] = []
        want, own, _ctl, _total = self._burst_plan(r)
        path = want in ("gray-link", "switch-fault")
        if want == "cpu-starved":
            enough = answered >= BURST_MIN_ANSWERS
        else:  # enough probes crossed the suspect to judge it
            enough = int(np.count_nonzero(np.isin(obs.flow, own))) >= BURST_MIN_SENT
        found = analyze(self.fabric, mesh.model, obs, base) if enough else []
        if want == "nic-fault" and any(f.kind == "ambiguous" and r in f.subject.split(" | ")
                                       for f in found):
            enough = False  # the analysis cannot tell the NIC from a neighbour: undecided
        for f in found:
            # one subject only: a tie between the suspect and another link is not the suspect
            if f.kind == want and (f.subject == r or (want == "gray-link" and " | " not in
                                                      f.subject and r in
                                                      self.rmap.resources(f.subject, "cable"))):
                present.append(self._finding(request, want, f.subject, f.score,
                                             "; ".join(f.evidence) or want, done,
                                             {k: v for k, v in f.details.items()
                                              if isinstance(v, int | float | str)}, "probe"))
        detail = (f"{len(obs)} probes for {request.resource}, {answered} answered; analysis: "
                  + (", ".join(f"{f.kind} {f.subject}" for f in found[:4]) or "nothing"))
        # a cable's or switch's burst decides presence only: loss of a few tenths of a
        # percent leaves ~1 probe of 512 lost, so its absence is not evidence
        decided = (("probe", want),) if enough and not path else ()
        return CheckOutcome(request, done, tuple(present), decided, (request.resource,), detail)

    # -- the straggler analysis on demand --------------------------------------------------
    def _trace_window(self, request: CheckRequest, done: int) -> CheckOutcome:
        ins = self._straggler or StragglerInstrument()
        r = request.resource
        gpus = ins.job_gpus(self.spec)
        if r in set(gpus):
            want = "slow-gpu"
        elif self._is_nic(r) and r in set(ins.job_trace(self.spec).devices.nic.values()):
            want = "slow-nic"
        else:
            return CheckOutcome(request, done, (), (), (r,),
                                f"{r} is not a GPU or NIC of the traced job")
        k, found = ins.analysis_at(self.spec, request.requested_ns)
        # a query of the whole job's traces: everything the analysis names now is evidence
        # (a ring's slow NIC need not be the one the suspicion named first)
        present = [self._finding(request, f.kind, f.subject, f.score,
                                 "; ".join(f.evidence) or f.kind, done,
                                 {k2: v for k2, v in f.details.items()
                                  if isinstance(v, int | float | str)}, "straggler")
                   for f in found if f.kind in ("slow-gpu", "slow-nic", "slow-switch")]
        detail = (f"straggler analysis on {min(k, ins.window)} iterations to {k}: "
                  + (", ".join(f"{f.kind} {f.subject}" for f in found[:4]) or "nothing"))
        decided = (("straggler", want),) if k >= 2 else ()
        return CheckOutcome(request, done, tuple(present), decided, (r,), detail)

    # -- judgements ------------------------------------------------------------------------------
    def _finding(self, request: CheckRequest, kind: str, subject: str, score: float, ev: str,
                 done: int, details: Mapping[str, float | int | str], signal: str) -> Observed:
        d = {"check": request.kind, "target": subject, "active": 1, **details}
        f = Finding(kind, subject, score, (request.requested_ns, done),
                    (f"active check {request.kind}: {ev}",), "", d)
        return Observed(signal, f, done)

    def _counters(self, request: CheckRequest, done: int) -> CheckOutcome:
        before = self._first.pop(request, {})
        ports = self._switch_ports(request.resource)
        dt = (done - request.requested_ns) / NS
        present: list[Observed] = []
        read: list[str] = []
        unstable = False
        for p in ports:
            now = self._get(p, _COUNTER_LEAVES)
            a = dict(zip(_COUNTER_LEAVES, before.get(p, []), strict=False))

            def delta(name: str, a: Mapping[str, int | float | str] = a,
                      now: Mapping[str, int | float | str] = now) -> float:
                x, y = a.get(name), now.get(name)
                return float(y) - float(x) if isinstance(x, int | float) and \
                    isinstance(y, int | float) else 0.0

            err = max(delta("in-errors"), delta("in-fcs-errors"))
            disc = delta("out-discards")
            ecn = delta("ecn-marked-pkts") / dt
            depth_a, depth_b = a.get("depth-bytes", 0), now.get("depth-bytes", 0)
            read.append(f"{p}: in-errors +{err:.0f}, out-discards +{disc:.0f}, "
                        f"ECN {ecn:.0f}/s, oper {now.get('oper-status')}")
            if err >= ERROR_MIN:
                present.append(self._finding(request, "error-counter-increase", p,
                                             min(1.0, 0.6 + 0.1 * err), f"in-errors +{err:.0f} in "
                                             f"{dt:.2f} s", done, {"counter": "in-errors",
                                                                   "increase": err}, "telemetry"))
            if disc >= ERROR_MIN:
                present.append(self._finding(request, "discard-increase", p, min(1.0, 0.6 + 0.1 * disc),
                                             f"out-discards +{disc:.0f} in {dt:.2f} s", done,
                                             {"counter": "out-discards", "increase": disc},
                                             "telemetry"))
            for leaf, subject in (("out-mac-pause-frames", p),
                                  ("in-mac-pause-frames", self.fabric.peer_port.get(p, p))):
                r = delta(leaf) / dt
                if r >= PAUSE_RATE:
                    present.append(self._finding(request, "pause-storm", subject,
                                                 min(1.0, 0.6 + 0.4 * r / (10 * PAUSE_RATE)),
                                                 f"{leaf} {r:.0f}/s on {p}", done,
                                                 {"pause_per_s": r, "direction": "sends"},
                                                 "telemetry"))
            queued = isinstance(depth_a, int | float) and isinstance(depth_b, int | float) and \
                min(depth_a, depth_b) >= QUEUE_BYTES
            if ecn >= ECN_RATE or queued:
                present.append(self._finding(request, "queue-buildup", p, 0.9,
                                             f"ECN marks {ecn:.0f}/s, queue {depth_b} B", done,
                                             {"ecn_per_s": ecn}, "telemetry"))
            if now.get("oper-status") == "DOWN":
                present.append(self._finding(request, "link-down", p, 0.9, "oper-status DOWN", done,
                                             {}, "telemetry"))
            flips = delta("carrier-transitions")
            if flips > 0 or a.get("oper-status", now.get("oper-status")) != now.get("oper-status"):
                unstable = True
            if flips >= FLAP_TRANSITIONS:
                present.append(self._finding(request, "link-flap", p, 0.9,
                                             f"carrier-transitions +{flips:.0f} in {dt:.2f} s",
                                             done, {"transitions": flips}, "telemetry"))
        both = len(ports) == len(self._ports(request.resource)) and bool(ports)
        decides = CHECK_KINDS["port-counters"].decides if both else frozenset({"link-down"})
        if unstable:
            # a link that changed state during the check is not "not down": a flap's down
            # half may be the next second (its absence is undecided)
            decides = decides - {"link-down"}
        if not ports:
            decides = frozenset()
        decided = tuple(("telemetry", f) for f in sorted(decides))
        return CheckOutcome(request, done, tuple(present), decided, (request.resource, *ports),
                            "; ".join(read))

    def _speed(self, request: CheckRequest, done: int) -> CheckOutcome:
        ports = self._switch_ports(request.resource)
        present: list[Observed] = []
        read: list[str] = []
        for p in ports:
            v = self._get(p, ("port-speed", "negotiated-port-speed"))
            cfg, neg = v.get("port-speed"), v.get("negotiated-port-speed")
            read.append(f"{p}: negotiated {neg} of {cfg}")
            if cfg != neg:
                present.append(self._finding(request, "speed-degraded", p, 0.95,
                                             f"negotiated-port-speed {neg} < port-speed {cfg}",
                                             done, {"negotiated": str(neg), "configured": str(cfg)},
                                             "telemetry"))
        decided = (("telemetry", "speed-degraded"),) if ports else ()
        return CheckOutcome(request, done, tuple(present), decided, (request.resource, *ports),
                            "; ".join(read))

    def _dom(self, request: CheckRequest, done: int) -> CheckOutcome:
        ports = [p for p in self._ports(request.resource) if p in self.twin.port_row]
        present: list[Observed] = []
        read: list[str] = []
        for p in ports:
            dom = self.twin.dom(p)
            row = self.twin.port_row[p]
            peer = self.fabric.peer_port.get(p)
            prow = self.twin.port_row.get(peer) if peer is not None else None
            peer_drop = 0.0
            if prow is not None:
                peer_tx = [r.tx_power_dbm for r in self.twin.dom(peer)] if peer else []
                peer_drop = max(0.0, max(float(self._ref_tx[prow, i]) - v
                                         for i, v in enumerate(peer_tx))) if peer_tx else 0.0
            own = max(max(float(self._ref_tx[row, r.lane]) - r.tx_power_dbm,
                           float(self._ref_rx[row, r.lane]) - r.rx_power_dbm - peer_drop)
                      for r in dom)
            rx_min = min(r.rx_power_dbm for r in dom)
            read.append(f"{p}: own light -{own:.2f} dB, rx min {rx_min:.1f} dBm")
            if own >= self.th.drop_db:
                present.append(self._finding(request, "optic-degrading", p, min(1.0, own / 6.0 + 0.5),
                                             f"own light {own:.2f} dB below its history", done,
                                             {"drop_db": own}, "optics"))
            if rx_min < self.th.rx_low_dbm:
                present.append(self._finding(request, "optic-rx-low", p, 0.9,
                                             f"rx {rx_min:.1f} dBm < {self.th.rx_low_dbm} dBm",
                                             done, {"rx_dbm": rx_min}, "optics"))
        decided = tuple(("optics", f) for f in sorted(CHECK_KINDS["dom"].decides)) if ports else ()
        return CheckOutcome(request, done, tuple(present), decided, (request.resource, *ports),
                            "; ".join(read))
