"""The twin's device state: port counters, queues, oper-status and optics, advanced in time.

One :class:`Twin` per fabric. It holds per-directed-link state (a directed link ``a->b`` is the
egress of port ``a`` and the ingress of port ``b``), follows the offered load on every link
(bytes/s, indexed like ``Fabric.index`` edges: from a routed traffic matrix, see
:func:`background_load`, or from the flow engine's utilization), and applies the faults of a
:class:`~fabricscope.sim.faults.FaultSchedule` analytically over each time step, so a 1 ms
micro-burst is seen even when the twin is advanced in 1 s or 60 s steps.

Model (deliberately simple, documented in docs/telemetry.md):

* carried = min(offered, capacity x degradation); the excess is tail-dropped (out-discards,
  or trimmed packets when ``trimming``) after the queue has filled to ``buffer_bytes``;
* an overloaded egress keeps a standing queue between the ECN thresholds (DCQCN's operating
  point, Zhu et al., SIGCOMM'15) and marks packets RED-style between ``kmin`` and ``kmax``;
  an unloaded one shows M/D/1-like occupancy noise and rare marks;
* ``micro-burst`` raises the queue to ``depth_bytes`` for its window (watermark, ECN marks);
* ``gray-loss`` corrupts a fraction of packets: FCS/in-errors at the receiver (``fcs=1``,
  default) or out-discards at the sender (``fcs=0``);
* ``link-flap``/``link-down`` take oper-status DOWN (first half of every ``period_ns``),
  counting carrier transitions and carrying nothing while down;
* ``pfc-storm`` makes a port emit pause frames at ``rate``/s; its peer stops sending;
* ``optic-degrading`` drifts the transceiver. ``mode`` ``generic`` (the default): tx/rx power
  down ``rate`` dB/day (times ``accel``), laser bias and temperature up, pre-FEC BER up an
  order of magnitude per 3 dB, readings only. ``aging-laser`` / ``dirty-connector`` /
  ``bent-fiber`` / ``hot-module``: the physics of :mod:`fabricscope.twin.optics_physics` at
  this end and the peer's (the cable's other end), and the frame loss of RS(544,514) at each
  receiver's BER on the directed link into it: in-errors / in-fcs-errors / in-crc-errors up,
  in-pkts / in-octets down (docs/design/optics-twin.md).

Every port also serves ``ethernet/state/port-speed`` and ``negotiated-port-speed`` (OpenConfig
speed identities): a ``link-degraded`` link negotiates the fastest standard speed its remaining
capacity sustains (what an active check reads, docs/design/diagnosis.md). :meth:`Twin.drain`
routes a share of a link's load away (a cost-out, a shifted load-balancing weight).

Pure: the clock is handed in, randomness is a numpy Generator; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import DomReading
from fabricscope.sim.clock import Clock
from fabricscope.sim.faults import Fault, FaultSchedule, optic_mode
from fabricscope.twin.optics_physics import (
    LOS_DBM,
    EndDelta,
    end_deltas,
    frame_loss,
    mode_code,
    receiver_ber,
)
from fabricscope.twin.transport_replay import (
    EpisodeCounters,
    TransportEpisode,
    depth_at,
    episode_counters,
    int_md_hex,
    sink_of,
)

F64 = npt.NDArray[np.float64]
_ENABLED = re.compile(r"/interfaces/interface\[name=([^\]/]+)\]/config/enabled")

NS = 1_000_000_000
DAY_NS = 86_400 * NS
# Fault kinds the twin models, by what their subject must name.
_PORT_KINDS = frozenset({"pfc-storm", "optic-degrading"})
_LINK_KINDS = frozenset({"link-degraded", "gray-loss", "congestion", "link-flap", "link-down", "micro-burst"})

# Counter fields kept per directed link (egress side "out_*" belongs to from_port, ingress
# side "in_*" to to_port).
EDGE_COUNTERS: tuple[str, ...] = (
    "out_octets", "out_pkts", "out_discards", "out_errors", "ecn_marked", "trimmed",
    "in_octets", "in_pkts", "in_errors", "in_fcs", "in_discards",
    "out_pause", "in_pause", "carrier", "in_pause_us", "llr_retried",
)
# Points per step at which a degrading optic's frame loss is sampled (midpoint rule): the loss
# grows with time, steeply near the FEC cliff, so a coarse step must not use one end point.
_OPTIC_SUBSTEPS = 4
LANE_FIELDS: tuple[str, ...] = (
    "temperature_c", "vcc_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm", "pre_fec_ber",
)


@dataclass(frozen=True, slots=True)
class TwinLeaf:
    """One gNMI leaf the twin serves: full path string, the state field and the index into it.

    ``field`` names an array of :meth:`Twin.field`; ``index`` is a directed-link index for
    counters and queues, a port row for optics (``lane`` then selects the lane).
    """

    path: str
    field: str
    index: int
    lane: int = 0


@dataclass(frozen=True, slots=True)
class TwinConfig:
    """Physical constants of the twin (defaults: 400G-class RoCE switch, 4-lane optics)."""

    mtu_bytes: int = 4096
    buffer_bytes: float = 32e6
    kmin_bytes: float = 100e3
    kmax_bytes: float = 400e3
    pmax: float = 0.2
    watermark_period_ns: int = NS
    lanes: int = 4
    trimming: bool = False
    queues: tuple[str, ...] = ("0", "3")  # "3": the RoCE class that carries the load
    noise: float = 0.01
    bg_mark_prob: float = 2e-6  # ECN mark probability per packet at 100% load without faults

    def __post_init__(self) -> None:
        for name in ("mtu_bytes", "buffer_bytes", "kmin_bytes", "kmax_bytes", "watermark_period_ns", "lanes"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"TwinConfig.{name}: must be > 0, got {getattr(self, name)!r}")
        if self.kmax_bytes <= self.kmin_bytes:
            raise ConfigError(
                f"TwinConfig.kmax_bytes: must exceed kmin_bytes ({self.kmin_bytes}), got {self.kmax_bytes}"
            )
        if not self.queues:
            raise ConfigError("TwinConfig.queues: at least one queue")


def background_load(
    fabric: Fabric,
    *,
    utilization: float = 0.3,
    seed: int | np.random.Generator = 0,
    routing: Routing | None = None,
) -> F64:
    """Offered bytes/s per directed link for a random permutation traffic matrix.

    Every NIC sends ``utilization`` x its link rate to one other NIC (a random derangement),
    spread over all ECMP paths (:meth:`Routing.spray_weights`: the expected load of many
    hashed flows). A common stand-in for all-to-all-ish training traffic.
    """
    if not 0 <= utilization <= 1:
        raise ConfigError(f"background_load.utilization: must be in [0, 1], got {utilization!r}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    ix = fabric.index
    load = np.zeros(ix.n_edges)
    nics = [n.id for n in fabric.nics]
    if len(nics) < 2:
        return load
    perm = rng.permutation(len(nics))
    dst = np.roll(perm, 1)  # a cyclic shift of a permutation: nobody sends to itself
    r = routing or Routing(fabric)
    for s_i, d_i in zip(perm.tolist(), dst.tolist(), strict=True):
        s, d = nics[s_i], nics[d_i]
        out = ix.out_edges[ix.node_of[s]]
        rate = utilization * float(ix.capacity_bps[out[0]]) / 8.0 if out else 0.0
        for e, w in r.spray_weights(s, d).items():
            load[e] += rate * w
    return load


class Twin:
    """Time-advancing device state of a whole fabric.

    Parameters
    ----------
    fabric:
        The inventory; every switch becomes a gNMI target (:meth:`targets`).
    clock:
        A :class:`~fabricscope.sim.clock.Clock`; :meth:`sync` advances state to its time.
    faults:
        The scenario; read at every step (the ground truth stays with the caller).
    load_bps:
        Offered bytes/s per directed link (``Fabric.index`` order); see :meth:`set_load`.
    rng:
        Seed or numpy Generator for counter / queue / optics noise.
    """

    def __init__(
        self,
        fabric: Fabric,
        *,
        clock: Clock,
        faults: FaultSchedule | None = None,
        load_bps: Sequence[float] | F64 | None = None,
        rng: int | np.random.Generator = 0,
        config: TwinConfig | None = None,
    ) -> None:
        self.fabric = fabric
        self.clock = clock
        self.faults = faults or FaultSchedule()
        self.cfg = config or TwinConfig()
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        ix = fabric.index
        self._ix = ix
        m = ix.n_edges
        self._cap = ix.capacity_bps / 8.0  # bytes/s
        self._load = np.zeros(m)
        if load_bps is not None:
            self.set_load(load_bps)
        self._c: dict[str, F64] = {k: np.zeros(m) for k in EDGE_COUNTERS}
        self._depth = np.zeros(m)
        self._wm_cur = np.zeros(m)
        self._wm_prev = np.zeros(m)
        self._wm_period = 0
        self._up = np.ones(m, dtype=bool)
        self._t = int(clock.now_ns())
        self._t0 = self._t
        # ports: every cabled port, row p; lanes per port for optics
        self.port_ids: tuple[str, ...] = tuple(sorted(fabric.peer_port))
        self.port_row: Mapping[str, int] = {p: i for i, p in enumerate(self.port_ids)}
        self._egress_of_port = np.empty(len(self.port_ids), dtype=np.int64)
        self._ingress_of_port = np.empty(len(self.port_ids), dtype=np.int64)
        for e in range(m):
            self._egress_of_port[self.port_row[ix.from_port[e]]] = e
            self._ingress_of_port[self.port_row[ix.to_port[e]]] = e
        n_p, lanes = len(self.port_ids), self.cfg.lanes
        lane_rng = self.rng
        self._optic_base: dict[str, F64] = {
            "temperature_c": 38.0 + lane_rng.normal(0, 2.0, (n_p, 1)) + np.zeros((n_p, lanes)),
            "vcc_v": 3.3 + lane_rng.normal(0, 0.02, (n_p, 1)) + np.zeros((n_p, lanes)),
            "tx_bias_ma": 7.0 + lane_rng.normal(0, 0.3, (n_p, lanes)),
            "tx_power_dbm": 1.0 + lane_rng.normal(0, 0.3, (n_p, lanes)),
            "rx_power_dbm": -1.5 + lane_rng.normal(0, 0.4, (n_p, lanes)),
            "pre_fec_ber": 10 ** (-8.0 + lane_rng.normal(0, 0.3, (n_p, lanes))),
        }
        self._optics: dict[str, F64] = {k: v.copy() for k, v in self._optic_base.items()}
        self._leaves: dict[str, tuple[TwinLeaf, ...]] = {}
        self._queue_bg = np.zeros(m)
        self._speed = self._cap * 8.0  # negotiated bit/s per directed link (link-degraded lowers it)
        self._drain = np.zeros(m)  # fraction of the offered load routed away (cost-out: 1)
        # egress links of ports set administratively down (gNMI Set of config/enabled)
        self._admin_down = np.zeros(m, dtype=bool)
        self._episodes: list[tuple[TransportEpisode, EpisodeCounters]] = []
        self._node_ids = {d.id: i + 1 for i, d in enumerate(fabric.switches)}
        self._check_faults(self.faults)

    # ------------------------------------------------------------------ inputs
    def set_load(self, load_bps: Sequence[float] | F64) -> None:
        """Replace the offered load (bytes/s per directed link) from now on."""
        arr = np.asarray(load_bps, dtype=np.float64)
        if arr.shape != (self._ix.n_edges,):
            raise ConfigError(
                f"Twin.set_load: expected {self._ix.n_edges} directed links, got shape {arr.shape}"
            )
        if (arr < 0).any() or not np.isfinite(arr).all():
            raise ConfigError("Twin.set_load: loads must be finite and >= 0")
        self._load = arr.copy()

    def set_utilization(self, utilization: Sequence[float] | F64) -> None:
        """Offered load as a fraction of each directed link's capacity, e.g. the flow engine's
        ``SimResult.utilization.mean_utilization()`` (same ``Fabric.index`` order)."""
        u = np.asarray(utilization, dtype=np.float64)
        if u.shape != (self._ix.n_edges,):
            raise ConfigError(
                f"Twin.set_utilization: expected {self._ix.n_edges} directed links, got shape {u.shape}"
            )
        self.set_load(np.clip(u, 0.0, None) * self._cap)

    def add_transport(self, episode: TransportEpisode) -> None:
        """Play a transport engine run into the counters from ``episode.start_ns`` on (see
        :mod:`fabricscope.twin.transport_replay`): marks, drops, trims, pause frames and
        duration, link-level retries, watermarks and traffic follow the engine's physics.
        A run on another fabric is refused (ConfigError)."""
        ix = self._ix
        ids = tuple(ix.edge_id(e) for e in range(ix.n_edges))
        self._episodes.append((episode, episode_counters(episode, ids, self.cfg.mtu_bytes,
                                                         speed_bps=self._cap * 8.0)))
        if episode.paths:
            self._leaves.clear()  # its flows' INT sinks serve new leaves

    def set_faults(self, faults: FaultSchedule) -> None:
        """Replace the scenario from now on (e.g. inject once a collector is listening)."""
        self._check_faults(faults)
        self.faults = faults

    def _check_faults(self, faults: FaultSchedule) -> None:
        # A fault the twin models but whose subject names no port or link of this fabric
        # would silently do nothing; kinds the twin does not model (stragglers, slow GPUs)
        # belong to other capabilities and are left alone.
        for f in faults.faults:
            if f.kind == "optic-degrading":
                code = mode_code(optic_mode(f))
                lane = f.param("lane", 0.0)
                if code == 1 and not (lane.is_integer() and 0 <= lane < self.cfg.lanes):
                    raise ConfigError(f"twin: fault {f.kind} on {f.subject}: lane: must be an "
                                      f"integer in 0..{self.cfg.lanes - 1}, got {lane!r}")
            if f.kind in _PORT_KINDS:
                ok = f.subject in self.port_row
            elif f.kind in _LINK_KINDS:
                ok = bool(self._edges_of(f.subject))
            else:
                continue
            if not ok:
                what, forms = ("port", "'switch:ethN'") if f.kind in _PORT_KINDS else (
                    "port or link", "'switch:ethN', 'a:ethX->b:ethY' or 'a:ethX|b:ethY'")
                raise ConfigError(f"twin: fault {f.kind}: subject: no such {what} {f.subject!r} "
                                  f"in {self.fabric.name} (expected {forms})")

    def drain(self, subject: str, fraction: float) -> list[int]:
        """Route ``fraction`` of the offered load of ``subject``'s directed links (a cable:
        both directions) away from now on: a cost-out (1.0) or a shifted load-balancing
        weight (a part). The drained traffic is carried by the link's ECMP siblings, which
        this per-link model does not add to (at the twin's background utilization they have
        the headroom); the link keeps its oper-status and optics. 0 undoes it. Returns the
        directed links changed (none: no such link)."""
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"Twin.drain: fraction must be in [0, 1], got {fraction!r}")
        edges = self._edges_of(subject)
        if "|" not in subject and "->" not in subject:
            edges = edges + [e ^ 1 for e in edges]  # a port: its cable
        for e in edges:
            self._drain[e] = fraction
        return sorted(set(edges))

    def set_admin(self, port: str, enabled: bool) -> bool:
        """Set ``port``'s administrative state (OpenConfig ``config/enabled``) from now on
        (advance the twin to now first). Disabled, its cable carries nothing either way and
        both ends report oper-status DOWN (the peer loses the carrier), with one carrier
        transition each; ``admin-status`` DOWN at this end only. Enabled again undoes it.
        Returns whether anything changed."""
        row = self.port_row.get(port)
        if row is None:
            raise ConfigError(f"Twin.set_admin: no cabled port {port!r} in {self.fabric.name}")
        eg = int(self._egress_of_port[row])
        if bool(self._admin_down[eg]) != enabled:
            return False
        was = bool(self._admin_down[eg] or self._admin_down[eg ^ 1])
        self._admin_down[eg] = not enabled
        now = bool(self._admin_down[eg] or self._admin_down[eg ^ 1])
        if was != now:
            for e in (eg, eg ^ 1):
                self._c["carrier"][e] += 1
                self._up[e] = not now
        return True

    def set_config(self, target: str, path: str, value: int | float | str | bool, *,
                   apply: bool = True) -> str:
        """A gNMI Set of one leaf on ``target`` (the twin's ``Configurable`` side): only
        ``/interfaces/interface[name=NAME]/config/enabled`` (a boolean) is settable.
        ``apply`` False only validates. Returns what was done."""
        m = _ENABLED.fullmatch(path)
        if m is None:
            raise ConfigError(f"{path}: not settable on the twin (settable: "
                              "/interfaces/interface[name=NAME]/config/enabled)")
        port = f"{target}:{m[1]}"
        if port not in self.port_row:
            raise ConfigError(f"{path}: {target} has no cabled port {m[1]!r}")
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected a boolean, got {value!r}")
        if not apply:
            return ""
        changed = self.set_admin(port, value)
        state = "enabled" if value else "disabled"
        return f"{port} {state}" + ("" if changed else " (already)")

    @property
    def now_ns(self) -> int:
        return self._t

    # ------------------------------------------------------------------ time
    def sync(self) -> int:
        """Advance to the clock's current time; return it."""
        self.advance_to(int(self.clock.now_ns()))
        return self._t

    def advance_to(self, t_ns: int) -> None:
        """Integrate counters, queues and optics from the last step to ``t_ns``."""
        if t_ns <= self._t:
            return
        # Step at watermark-period boundaries so a period's max never leaks into the next,
        # however coarsely the caller advances (a 60 s poller must not see 60 s of bursts).
        per = self.cfg.watermark_period_ns
        t, t1 = self._t, int(t_ns)
        while t < t1:
            boundary = (t // per + 1) * per
            tn = min(boundary, t1)
            self._step(t, tn)
            if tn == boundary:
                self._wm_prev = self._wm_cur
                self._wm_cur = np.zeros_like(self._wm_cur)
            t = tn
        self._t = t1

    def _edges_of(self, subject: str) -> list[int]:
        """Directed links a fault subject denotes: ``a->b`` one, ``a|b`` both, a port: its egress."""
        fab = self.fabric
        try:
            if "->" in subject:
                return [fab.edge_index(subject)]
            if "|" in subject:
                e = fab.edge_index(subject.replace("|", "->"))
                return [e, e ^ 1]
        except Exception:
            return []
        row = self.port_row.get(subject)
        if row is not None:
            return [int(self._egress_of_port[row])]
        return []

    def _step(self, t0: int, t1: int) -> None:
        cfg = self.cfg
        dt = (t1 - t0) / NS
        m = self._ix.n_edges
        cap = self._cap.copy()
        offered = self._load.copy()
        loss = np.zeros(m)
        fcs_mode = np.ones(m, dtype=bool)
        down_frac = np.zeros(m)
        transitions = np.zeros(m)
        pause_tx_rate = np.zeros(len(self.port_ids))
        paused_frac = np.zeros(m)
        burst_depth = np.zeros(m)
        burst_time = np.zeros(m)
        burst_now = np.zeros(m)
        optic_days: dict[int, float] = {}
        optic_modes: list[Fault] = []
        for f in self.faults.faults:
            ov = _overlap(f, t0, t1)
            if ov <= 0:
                continue
            frac = ov / (t1 - t0)
            edges = self._edges_of(f.subject)
            if f.kind == "link-degraded":
                for e in edges:
                    cap[e] *= 1 - frac * (1 - f.param("factor", 0.5))
            elif f.kind == "gray-loss":
                for e in edges:
                    loss[e] = 1 - (1 - loss[e]) * (1 - frac * f.param("loss", 0.01))
                    fcs_mode[e] = f.param("fcs", 1.0) >= 0.5
            elif f.kind == "congestion":
                for e in edges:
                    offered[e] += frac * f.param("load", 1.0) * self._cap[e]
            elif f.kind in ("link-flap", "link-down"):
                for e in set(edges) | {x ^ 1 for x in edges}:
                    d, tr = _down_time(f, t0, t1)
                    down_frac[e] = max(down_frac[e], d / (t1 - t0))
                    transitions[e] += tr
            elif f.kind == "micro-burst":
                for e in edges:
                    burst_depth[e] = max(burst_depth[e], f.param("depth_bytes", 2e6))
                    burst_time[e] += ov / NS
                    if f.active(t1 - 1):
                        burst_now[e] = max(burst_now[e], f.param("depth_bytes", 2e6))
            elif f.kind == "pfc-storm":
                row = self.port_row.get(f.subject)
                if row is not None:
                    pause_tx_rate[row] += frac * f.param("rate", 50_000.0)
                    ing = int(self._ingress_of_port[row])  # peer -> subject: paused
                    paused_frac[ing] = max(paused_frac[ing], frac * f.param("pause_fraction", 0.9))
            elif f.kind == "optic-degrading":
                row = self.port_row.get(f.subject)
                if row is not None and f.param("mode", 0.0) != 0.0:
                    optic_modes.append(f)
                elif row is not None:
                    t_end = min(t1, f.end_ns) if f.end_ns is not None else t1
                    days = (t_end - f.start_ns) / DAY_NS * f.param("accel", 1.0)
                    optic_days[row] = max(optic_days.get(row, 0.0), days * f.param("rate", 1.0))
        self._speed = cap * 8.0
        offered *= 1.0 - self._drain
        admin = self._admin_down | self._admin_down[np.arange(m) ^ 1]
        down_frac = np.where(admin, 1.0, down_frac)
        up_frac = 1.0 - down_frac
        cap_eff = cap * (1.0 - paused_frac) * up_frac
        offered_eff = offered * up_frac
        carried = np.minimum(offered_eff, cap_eff)
        excess = np.maximum(offered_eff - cap_eff, 0.0)
        rho = np.divide(offered_eff, cap_eff, out=np.ones(m) * 2.0, where=cap_eff > 0)
        over = rho > 1.0
        # queue: standing DCQCN queue when overloaded, M/D/1-ish noise otherwise
        rho_c = np.clip(rho, 0.0, 0.95)
        mean_bg = rho_c**2 / (2 * (1 - rho_c)) * cfg.mtu_bytes
        bg = self.rng.exponential(1.0, m) * mean_bg
        standing = cfg.kmin_bytes + (cfg.kmax_bytes - cfg.kmin_bytes) * np.clip(rho - 1.0, 0.0, 1.0)
        depth_end = np.where(over, standing, bg)
        depth_end = np.maximum(depth_end, burst_now)
        wm = np.maximum(np.where(over, standing, bg * 2.0), burst_depth)
        self._queue_bg = bg
        self._depth = np.minimum(depth_end, cfg.buffer_bytes)
        self._wm_cur = np.maximum(self._wm_cur, np.minimum(wm, cfg.buffer_bytes))
        # packets
        noise = 1.0 + self.rng.normal(0.0, cfg.noise, m) if cfg.noise > 0 else np.ones(m)
        tx_bytes = carried * dt * np.clip(noise, 0.0, None)
        tx_pkts = tx_bytes / cfg.mtu_bytes
        lost = tx_pkts * loss
        # frames that arrive but fail their FCS after an uncorrectable codeword (degrading optic)
        phys = self._optic_frame_loss(optic_modes, t0, t1)
        corrupt = (tx_pkts - lost) * phys
        c = self._c
        c["out_octets"] += tx_bytes
        c["out_pkts"] += tx_pkts
        c["in_octets"] += tx_bytes * (1 - loss) * (1 - phys)
        c["in_pkts"] += tx_pkts - lost - corrupt
        c["in_errors"] += np.where(fcs_mode, lost, 0.0) + corrupt
        c["in_fcs"] += np.where(fcs_mode, lost, 0.0) + corrupt
        c["out_discards"] += np.where(fcs_mode, 0.0, lost)
        dropped = excess * dt / cfg.mtu_bytes
        if cfg.trimming:
            c["trimmed"] += dropped
        else:
            c["out_discards"] += dropped
        # ECN: RED between kmin/kmax on the standing queue; bursts mark what they carry
        p_mark = np.where(
            over,
            cfg.pmax * np.clip((standing - cfg.kmin_bytes) / (cfg.kmax_bytes - cfg.kmin_bytes), 0.05, 1.0),
            0.0,
        )
        marks = tx_pkts * p_mark
        bg_marks = self.rng.poisson(np.maximum(tx_pkts * cfg.bg_mark_prob * rho_c**4, 0.0))
        p_burst = cfg.pmax * np.clip(
            (burst_depth - cfg.kmin_bytes) / (cfg.kmax_bytes - cfg.kmin_bytes), 0.0, 1.0
        ) + (burst_depth > cfg.kmax_bytes) * (1 - cfg.pmax)
        burst_marks = self._cap * burst_time / cfg.mtu_bytes * p_burst * 0.5
        c["ecn_marked"] += marks + bg_marks + burst_marks
        for ep, inc in self._episodes:
            self._play(ep, inc, t0, t1)
        # flaps
        c["carrier"] += transitions
        self._up[:] = True
        for f in self.faults.of_kind("link-flap", "link-down"):
            if _is_down(f, t1):
                for e in self._edges_of(f.subject):
                    self._up[e] = self._up[e ^ 1] = False
        self._up[admin] = False
        # pause frames: the storming port sends, its peer receives
        if pause_tx_rate.any():
            rows = np.flatnonzero(pause_tx_rate)
            eg = self._egress_of_port[rows]  # subject -> peer
            c["out_pause"][eg] += pause_tx_rate[rows] * dt
            c["in_pause"][eg] += pause_tx_rate[rows] * dt
            # the peer's egress (toward the storming port) held for the paused share of the step
            c["in_pause_us"][eg] += paused_frac[self._ingress_of_port[rows]] * dt * 1e6
        # optics
        for k, base in self._optic_base.items():
            cur = self._optics[k]
            cur[:] = base
        for row, drift_db in optic_days.items():
            self._optics["tx_power_dbm"][row] -= drift_db * 0.5
            self._optics["rx_power_dbm"][row] -= drift_db
            self._optics["tx_bias_ma"][row] += drift_db * 1.5
            self._optics["temperature_c"][row] += drift_db * 2.0
            self._optics["pre_fec_ber"][row] *= 10 ** (drift_db / 3.0)
            peer = self.port_row.get(self.fabric.peer_port[self.port_ids[row]])
            if peer is not None:  # the far end receives less light too
                self._optics["rx_power_dbm"][peer] -= drift_db * 0.5
                self._optics["pre_fec_ber"][peer] *= 10 ** (drift_db / 6.0)
        if optic_modes:
            o = self._optics
            for row, od in self._optic_deltas(optic_modes, [t1], at_end=True).items():
                o["temperature_c"][row] += od.temperature_c[0]
                o["tx_bias_ma"][row] += od.tx_bias_ma[0]
                for k, dv in (("tx_power_dbm", od.tx_power_db), ("rx_power_dbm", od.rx_power_db)):
                    o[k][row] = np.maximum(o[k][row] + dv[0], LOS_DBM)
                # the per-lane baselines are calibration offsets: BER follows the true power,
                # over the lane's own floor (which a generic drift may have raised)
                o["pre_fec_ber"][row] = receiver_ber(od, floor=o["pre_fec_ber"][row])[0]
        jitter = self.rng.normal(0.0, 0.02, self._optics["rx_power_dbm"].shape)
        self._optics["rx_power_dbm"] += jitter
        self._optics["temperature_c"] += jitter * 5

    def _play(self, ep: TransportEpisode, inc: EpisodeCounters, t0: int, t1: int) -> None:
        """Add the occurrences of ``ep`` that start in ``[t0, t1)``; the queue depth at ``t1``
        follows its trace when ``t1`` falls inside one."""
        c = self._c
        k = ep.starts_in(t0, t1)
        if k:
            served = k * inc.served_bytes
            c["out_octets"] += served
            c["in_octets"] += served
            c["out_pkts"] += served / self.cfg.mtu_bytes
            c["in_pkts"] += served / self.cfg.mtu_bytes
            c["ecn_marked"] += k * inc.marked
            c["out_discards"] += k * inc.dropped_pkts
            c["trimmed"] += k * inc.trimmed_pkts
            c["out_pause"] += k * inc.pause_frames_rev
            c["in_pause"] += k * inc.pause_frames_rev
            c["in_pause_us"] += k * inc.paused_us_rev
            c["llr_retried"] += k * inc.llr_retried
            np.maximum(self._wm_cur, np.minimum(inc.max_queue_bytes, self.cfg.buffer_bytes), out=self._wm_cur)
        off = ep.offset_at(t1)
        if off is not None:
            edges, depth = depth_at(ep, off, self._ix.n_edges)
            self._depth[edges] = np.maximum(self._depth[edges], depth)

    def _optic_deltas(self, faults: Sequence[Fault], t: Sequence[int], *, at_end: bool = False
                      ) -> dict[int, EndDelta]:
        """Summed per-port changes of the mode-``faults`` at times ``t``: arrays of shape
        ``(len(t), lanes)`` (each fault at this end and at its peer's). ``at_end``: a fault that
        ended before a time counts at its end (the readings of the step it ends in); otherwise
        a fault counts only where it is active."""
        lanes = self.cfg.lanes
        ts = np.asarray(t, dtype=np.int64)
        acc: dict[int, list[F64]] = {}
        for f in faults:
            if at_end:
                te = ts if f.end_ns is None else np.minimum(ts, f.end_ns)
                on = np.ones(ts.shape[0])
            else:
                te = ts
                end = f.end_ns if f.end_ns is not None else 2**62
                on = ((ts >= f.start_ns) & (ts < end)).astype(np.float64)
            if not on.any():
                continue
            row = self.port_row[f.subject]
            days = (te - f.start_ns) / DAY_NS * f.param("accel", 1.0)
            near, far = end_deltas(mode_code(f.param("mode", 0.0)), days, rate=f.param("rate", 1.0),
                                   lanes=lanes, lane=int(f.param("lane", 0.0)))
            peer = self.port_row.get(self.fabric.peer_port[f.subject])
            for r, d in ((row, near), (peer, far)):
                if r is None:
                    continue
                parts = [x * on[:, None] for x in
                         (d.temperature_c, d.tx_bias_ma, d.tx_power_db, d.rx_power_db)]
                cur = acc.get(r)
                acc[r] = parts if cur is None else [x + y for x, y in zip(cur, parts, strict=True)]
        return {r: EndDelta(*v) for r, v in acc.items()}

    def _optic_frame_loss(self, faults: Sequence[Fault], t0: int, t1: int) -> F64:
        """Per directed link: the fraction of ``mtu_bytes`` frames lost to uncorrectable
        codewords at the receiver it enters, averaged over the step (midpoint rule)."""
        phys = np.zeros(self._ix.n_edges)
        if not faults:
            return phys
        k = _OPTIC_SUBSTEPS
        ts = [t0 + (t1 - t0) * (2 * i + 1) // (2 * k) for i in range(k)]
        deltas = self._optic_deltas(faults, ts)
        if not deltas:
            return phys
        rows = list(deltas)
        stacked = EndDelta(*(np.stack([getattr(deltas[r], n) for r in rows]) for n in
                             ("temperature_c", "tx_bias_ma", "tx_power_db", "rx_power_db")))
        ber = receiver_ber(stacked).mean(axis=-1)  # (rows, k): a codeword meets every lane
        fl = frame_loss(ber, frame_bytes=self.cfg.mtu_bytes).mean(axis=-1)
        phys[self._ingress_of_port[rows]] = fl
        return phys

    # ------------------------------------------------------------------ reading
    def field(self, name: str) -> F64:
        """A state array by name (read-only view; counters are float accumulators).

        Per directed link: the :data:`EDGE_COUNTERS`, ``depth`` (bytes), ``watermark``
        (bytes, max over the current and previous watermark period), ``oper_up`` (1/0).
        Per port row and lane: the :data:`LANE_FIELDS`.
        """
        if name in self._c:
            return self._c[name]
        if name == "depth":
            return self._depth
        if name == "watermark":
            return np.maximum(self._wm_cur, self._wm_prev)
        if name == "oper_up":
            return self._up.astype(np.float64)
        if name == "admin_up":
            return (~self._admin_down).astype(np.float64)
        if name == "speed_bps":
            return self._speed
        if name == "port_speed_bps":
            return self._cap * 8.0
        if name in self._optics:
            return self._optics[name]
        if name == "zero":
            return np.zeros(self._ix.n_edges)
        raise KeyError(name)

    def targets(self) -> tuple[str, ...]:
        """Switch ids: the gNMI targets the twin serves."""
        return tuple(d.id for d in self.fabric.switches)

    def dom(self, port_id: str) -> tuple[DomReading, ...]:
        """Transceiver readings of one port, one per lane."""
        row = self.port_row[port_id]
        o = self._optics
        return tuple(
            DomReading(
                port_id, lane, self._t,
                float(o["temperature_c"][row, lane]), float(o["vcc_v"][row, lane]),
                float(o["tx_bias_ma"][row, lane]), float(o["tx_power_dbm"][row, lane]),
                float(o["rx_power_dbm"][row, lane]), float(o["pre_fec_ber"][row, lane]),
            )
            for lane in range(self.cfg.lanes)
        )

    def leaves(self, target: str) -> tuple[TwinLeaf, ...]:
        """Every leaf of ``target`` with its OpenConfig (or documented native) path."""
        cached = self._leaves.get(target)
        if cached is None:
            if target not in self.fabric.devices:
                raise KeyError(target)
            cached = tuple(self._build_leaves(target))
            self._leaves[target] = cached
        return cached

    def _build_leaves(self, target: str) -> Iterable[TwinLeaf]:
        yield from self._port_leaves(target)
        for i, (ep, _) in enumerate(self._episodes):
            for j, path in enumerate(ep.paths):
                if path and sink_of(self.fabric, path) == target:
                    fid = int(ep.result.sim.flow_ids[j])
                    yield TwinLeaf(f"/fabricscope/int/flows/flow[id={i}.{fid}]/state/int-md", "int_md", i, j)

    def _port_leaves(self, target: str) -> Iterable[TwinLeaf]:
        for pid in self.fabric.ports_of.get(target, ()):
            row = self.port_row.get(pid)
            if row is None:
                continue  # uncabled port
            eg, ing = int(self._egress_of_port[row]), int(self._ingress_of_port[row])
            name = pid.rsplit(":", 1)[1]
            ifc = f"/interfaces/interface[name={name}]"
            yield TwinLeaf(f"{ifc}/state/oper-status", "oper_up", eg)
            yield TwinLeaf(f"{ifc}/state/admin-status", "admin_up", eg)
            cnt = f"{ifc}/state/counters"
            for leaf, fld, e in (
                ("in-octets", "in_octets", ing), ("in-pkts", "in_pkts", ing),
                ("in-errors", "in_errors", ing), ("in-discards", "in_discards", ing),
                ("in-fcs-errors", "in_fcs", ing),
                ("out-octets", "out_octets", eg), ("out-pkts", "out_pkts", eg),
                ("out-errors", "out_errors", eg), ("out-discards", "out_discards", eg),
                ("carrier-transitions", "carrier", eg),
            ):
                yield TwinLeaf(f"{cnt}/{leaf}", fld, e)
            yield TwinLeaf(f"{ifc}/ethernet/state/port-speed", "port_speed_bps", eg)
            yield TwinLeaf(f"{ifc}/ethernet/state/negotiated-port-speed", "speed_bps", eg)
            eth = f"{ifc}/ethernet/state/counters"
            yield TwinLeaf(f"{eth}/in-mac-pause-frames", "in_pause", ing)
            yield TwinLeaf(f"{eth}/out-mac-pause-frames", "out_pause", eg)
            yield TwinLeaf(f"{eth}/in-crc-errors", "in_fcs", ing)
            q = f"/qos/interfaces/interface[interface-id={name}]/output/queues"
            for qn in self.cfg.queues:
                carries = qn == self.cfg.queues[-1]
                qp = f"{q}/queue[name={qn}]/state"
                for leaf, fld in (("transmit-octets", "out_octets"), ("transmit-pkts", "out_pkts"),
                                  ("dropped-pkts", "out_discards")):
                    yield TwinLeaf(f"{qp}/{leaf}", fld if carries else "zero", eg)
                nq = f"/fabricscope/qos/interfaces/interface[interface-id={name}]/queues/queue[name={qn}]/state"
                for leaf, fld in (("depth-bytes", "depth"), ("watermark-bytes", "watermark"),
                                  ("ecn-marked-pkts", "ecn_marked"), ("trimmed-pkts", "trimmed")):
                    yield TwinLeaf(f"{nq}/{leaf}", fld if carries else "zero", eg)
            pfc = f"/fabricscope/interfaces/interface[name={name}]/pfc/priority[id=3]/state"
            yield TwinLeaf(f"{pfc}/in-pause-frames", "in_pause", ing)
            yield TwinLeaf(f"{pfc}/out-pause-frames", "out_pause", eg)
            yield TwinLeaf(f"{pfc}/in-pause-duration-us", "in_pause_us", ing)
            yield TwinLeaf(f"/fabricscope/interfaces/interface[name={name}]/llr/state/retried-frames",
                           "llr_retried", eg)
            comp = f"/components/component[name={name}]"
            yield TwinLeaf(f"{comp}/state/temperature/instant", "temperature_c", row, 0)
            yield TwinLeaf(f"{comp}/transceiver/state/supply-voltage/instant", "vcc_v", row, 0)
            yield TwinLeaf(f"{comp}/transceiver/state/pre-fec-ber/instant", "pre_fec_ber", row, 0)
            for lane in range(self.cfg.lanes):
                ch = f"{comp}/transceiver/physical-channels/channel[index={lane}]/state"
                yield TwinLeaf(f"{ch}/laser-bias-current/instant", "tx_bias_ma", row, lane)
                yield TwinLeaf(f"{ch}/output-power/instant", "tx_power_dbm", row, lane)
                yield TwinLeaf(f"{ch}/input-power/instant", "rx_power_dbm", row, lane)
                yield TwinLeaf(f"{ch}/pre-fec-ber/instant", "pre_fec_ber", row, lane)

    def read(self, leaves: Sequence[TwinLeaf]) -> list[int | float | str]:
        """Current values of ``leaves`` (counters as ints, oper-status as ``UP``/``DOWN``)."""
        out: list[int | float | str] = []
        cache: dict[str, F64] = {}
        for lf in leaves:
            if lf.field == "int_md":
                out.append(int_md_hex(self._episodes[lf.index][0], lf.lane, self.fabric, now_ns=self._t,
                                      node_ids=self._node_ids))
                continue
            arr = cache.get(lf.field)
            if arr is None:
                arr = self.field(lf.field)
                cache[lf.field] = arr
            if lf.field in ("oper_up", "admin_up"):
                out.append("UP" if arr[lf.index] > 0 else "DOWN")
            elif lf.field in ("speed_bps", "port_speed_bps"):
                out.append(speed_identity(float(arr[lf.index])))
            elif arr.ndim == 2:
                out.append(float(arr[lf.index, lf.lane]))
            elif lf.field in ("depth", "watermark"):
                out.append(int(arr[lf.index]))
            else:
                out.append(int(arr[lf.index]))
        return out

    def switch_of_port(self, port_id: str) -> str:
        return port_device(port_id)


#: OpenConfig ETHERNET_SPEED identities (openconfig-if-ethernet), in bit/s.
SPEEDS: tuple[tuple[float, str], ...] = tuple(
    (g * 1e9, f"SPEED_{g}GB") for g in (1, 2.5, 5, 10, 25, 40, 50, 100, 200, 400, 800))


def speed_identity(bps: float) -> str:
    """The OpenConfig speed identity a port running at ``bps`` reports: the fastest standard
    speed it sustains (a link that lost lanes negotiates a lower standard speed;
    ``SPEED_UNKNOWN`` below 1 Gb/s)."""
    best = "SPEED_UNKNOWN"
    for v, name in SPEEDS:
        if bps >= v * 0.999:
            best = name
    return best.replace("2.5GB", "2500MB")


def _overlap(f: Fault, t0: int, t1: int) -> int:
    end = t1 if f.end_ns is None else min(t1, f.end_ns)
    return max(0, end - max(t0, f.start_ns))


def _is_down(f: Fault, t: int) -> bool:
    if not f.active(t):
        return False
    if f.kind == "link-down":
        return True
    period = int(f.param("period_ns", NS))
    return ((t - f.start_ns) % period) < period // 2


def _down_time(f: Fault, t0: int, t1: int) -> tuple[int, int]:
    """(ns down within [t0, t1), number of up/down transitions) for a flap/down fault."""
    a = max(t0, f.start_ns)
    b = t1 if f.end_ns is None else min(t1, f.end_ns)
    if b <= a:
        return 0, 0
    if f.kind == "link-down":
        tr = int(t0 <= f.start_ns < t1) + int(f.end_ns is not None and t0 <= f.end_ns < t1)
        return b - a, tr
    period = int(f.param("period_ns", NS))
    half = period // 2

    def down_until(t: int) -> int:  # ns down in [start, t)
        k, r = divmod(t - f.start_ns, period)
        return k * half + min(r, half)

    def edges_until(t: int) -> int:  # transitions in [start, t)
        k, r = divmod(t - f.start_ns, period)
        return 2 * k + (1 if r > 0 else 0) + (1 if r > half else 0)

    down = down_until(b) - down_until(a)
    tr = edges_until(b) - edges_until(a)
    if f.end_ns is not None and t0 <= f.end_ns < t1 and _is_down(f, f.end_ns - 1):
        tr += 1  # comes back up when the fault ends
    return down, tr
