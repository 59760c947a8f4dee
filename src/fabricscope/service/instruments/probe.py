"""The mesh prober as an instrument of the closed loop: twin probe transport -> localizer.

Every NIC runs its probe plan (:func:`~fabricscope.probe.plan.plan_mesh`) through the twin's
probe transport; every ``step_s`` the production analysis
(:func:`~fabricscope.probe.analysis.analyze`, sparse MAP tomography) runs on a sliding window
of the probes whose outcome is known, and the hysteresis
:class:`~fabricscope.probe.localize.FindingTracker` decides what is open. Design, causality
and costs: ``docs/design/diagnosis-instruments-probe-straggler.md``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from fabricscope.diagnosis.model import Observed, finding_id
from fabricscope.diagnosis.suspicions import suspicion
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.probe.analysis import Baseline, Observations, analyze, host_findings
from fabricscope.probe.localize import FindingTracker
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.probe_twin import (
    TwinMesh,
    learn_baseline,
    probe_visible,
    to_observations,
)
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.twin.probe_transport import FlowTable

I64 = npt.NDArray[np.int64]

#: Probes per NIC and plan epoch that keep one rail peer in every NIC's plan (the flows
#: that cross the spines): 20 probes/s over a 30 s epoch, 2 probes per flow
#: (:func:`~fabricscope.probe.plan.plan_probes` drops rail peers below it).
_PLAN_PROBES = 600.0
_CACHE_SIZE = 2


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A fabric's probe mesh and the baseline learned on its fault-free warm-up."""

    fabric: Fabric
    mesh: TwinMesh
    baseline: Baseline


# Meshes are expensive (paths of every planned flow) and large: a small LRU keyed by the
# fabric's identity (the entry keeps the fabric alive, so the id cannot be reused).
_MESHES: OrderedDict[tuple[object, ...], _Prepared] = OrderedDict()


def pair_counts(obs: Observations, flows: FlowTable, nodes: Sequence[str], *, t_ns: int,
                t0_ns: int, t1_ns: int, window_ns: int) -> dict[str, object]:
    """Probes of ``obs`` counted per (source NIC, destination NIC): the probe observer's payload.

    ::

        {"t_ns": t, "t0_ns": t0, "t1_ns": t1, "window_ns": w, "nodes": node ids,
         "src": I64[p], "dst": I64[p], "sent": I64[p], "lost": I64[p], "rtt_us": F64[p]}

    ``src`` / ``dst`` index ``nodes`` (``fabric.index.node_ids``, what the flow table's
    node columns index); the probes were sent in
    ``[t0, t1)`` and their outcome is known at ``t``; ``w`` is the analysis window the
    instrument uses. ``rtt_us`` is the mean network round trip of the answered probes
    (receive - send minus the responder's own delay, ``t_resp_tx - t_resp_rx``, the split
    the responder timestamps exist for), NaN when none was answered.
    """
    n = max(len(nodes), 1)
    pair, inv = np.unique(flows.src_node[obs.flow] * n + flows.dst_node[obs.flow],
                          return_inverse=True)
    answered = obs.t_recv_ns >= 0
    rtt = np.where(answered, (obs.t_recv_ns - obs.t_send_ns)
                   - (obs.t_resp_tx_ns - obs.t_resp_rx_ns), 0).astype(np.float64) / 1e3
    sent = np.bincount(inv, minlength=pair.size).astype(np.int64)
    ok = np.bincount(inv, weights=answered, minlength=pair.size)
    rsum = np.bincount(inv, weights=rtt, minlength=pair.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok > 0, rsum / np.maximum(ok, 1), np.nan)
    return {"t_ns": int(t_ns), "t0_ns": int(t0_ns), "t1_ns": int(t1_ns),
            "window_ns": int(window_ns), "nodes": nodes,
            "src": (pair // n).astype(np.int64), "dst": (pair % n).astype(np.int64),
            "sent": sent, "lost": sent - ok.astype(np.int64), "rtt_us": mean}


def probe_faults(faults: Sequence[Fault]) -> list[Fault]:
    """The faults the twin's probe transport models (:func:`probe_visible`); others dropped."""
    return [f for f in faults if probe_visible(f)]


class _Agents:
    """Every NIC cycling through its plan's flows at ``rate_pps``, produced window by window.

    The same agents as :func:`~fabricscope.twin.probe_transport.round_robin_schedule` (a
    random phase and a random start in its flow list per agent), generated for one time range
    at a time so memory stays bounded by the analysis window, not the scenario.
    """

    def __init__(self, groups: Sequence[I64], *, rate_pps: float,
                 rng: np.random.Generator) -> None:
        self.gap = 1e9 / rate_pps
        groups = [g for g in groups if len(g)]
        n = len(groups)
        self.lens = np.array([len(g) for g in groups], dtype=np.int64)
        width = int(self.lens.max()) if n else 0
        self.table = np.zeros((n, width), dtype=np.int64)
        for i, g in enumerate(groups):
            self.table[i, : len(g)] = g
        self.phase = np.empty(n)
        self.offset = np.empty(n, dtype=np.int64)
        for i, g in enumerate(groups):  # draw order as round_robin_schedule
            self.phase[i] = rng.random() * self.gap
            self.offset[i] = int(rng.integers(len(g)))

    def between(self, t0_ns: int, t1_ns: int) -> tuple[I64, I64]:
        """(flow indices, send times) of the probes sent in ``[t0, t1)``, sorted by time."""
        if t1_ns <= t0_ns or self.lens.size == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        k0 = np.ceil((t0_ns - self.phase) / self.gap).astype(np.int64)
        k0 = np.maximum(k0, 0)
        span = int(np.ceil((t1_ns - t0_ns) / self.gap)) + 1
        k = k0[:, None] + np.arange(span, dtype=np.int64)[None, :]
        t = (self.phase[:, None] + k * self.gap).astype(np.int64)
        keep = (t >= t0_ns) & (t < t1_ns)
        rows = np.broadcast_to(np.arange(self.lens.size)[:, None], k.shape)
        col = (self.offset[:, None] + k) % self.lens[:, None]
        flow = self.table[rows[keep], col[keep]]
        ts = t[keep]
        order = np.argsort(ts, kind="stable")
        return flow[order], ts[order]


def _concat(parts: Sequence[Observations], t0_ns: int, t1_ns: int) -> Observations:
    """The probes of ``parts`` (time-ordered chunks) sent in ``[t0, t1)``."""
    def cat(name: str) -> I64:
        return np.concatenate([getattr(p, name) for p in parts])

    t = cat("t_send_ns")
    a, b = np.searchsorted(t, [t0_ns, t1_ns])
    cols = {k: cat(k)[a:b] for k in ("flow", "t_resp_rx_ns", "t_resp_tx_ns", "t_recv_ns",
                                     "status")}
    return Observations(parts[0].flows, cols["flow"], t[a:b], cols["t_resp_rx_ns"],
                        cols["t_resp_tx_ns"], cols["t_recv_ns"], cols["status"])


class ProbeInstrument:
    """The mesh prober on the twin, reporting what the hysteresis tracker opens.

    Parameters
    ----------
    rate_pps:
        Probes per second per NIC. Default 20: the cost of the twin is per probe, and at
        2,048 GPUs 100/s costs ~25 s of probing per 180 s scenario (measured in the design
        page); 20/s keeps every NIC's rail peer (spine coverage) at about a quarter of that.
    step_s:
        How often the analysis runs (simulated seconds).
    background_loss:
        Healthy per-hop drop probability of the twin (and of the learned baseline).
    window_s:
        Sliding analysis window: each step analyses the probes sent in the last ``window_s``
        whose outcome is known (sent at least the transport's reply timeout ago). A growing
        window costs O(t) per step and never forgets a fault that ended.
    epoch_s:
        Plan epoch; default ``max(30, 600 / rate_pps)`` so the plan keeps a rail peer.
    mesh_seed:
        Seed of the probe plans and the baseline warm-up. The mesh and the baseline are
        deployment state, built once per (fabric, mesh options) and reused across
        scenarios; the scenario's own seed drives drops, jitter and agent phases.
    method, open_after, close_after:
        The localizer (``"map"`` or ``"007"``) and the tracker's hysteresis.
    observer:
        Optional ``observer(kind, payload)`` (also settable as the attribute): at every
        step that carried probes, ``("probes", payload)`` with the per (source NIC,
        destination NIC) counts of the probes whose outcome became known since the last
        step (see :func:`pair_counts`); each probe is counted once. None (the default)
        costs nothing.
    suspicions:
        Also publish a suspicion (:mod:`fabricscope.diagnosis.suspicions`) for every finding
        the analysis makes in a window that the tracker has not opened (yet): the first
        window that blames a link, before ``open_after`` windows have confirmed it (or with
        a score below the tracker's ``open_score``), anticipating that finding's kind; and
        for a host whose responders are slow in the newest step's probes alone (the CPU
        starvation rule of :func:`~fabricscope.probe.analysis.host_findings` on ``step_s``
        of probes, before the sliding window's median has moved). Default off.
    """

    name = "probe"

    def __init__(self, rate_pps: float = 20.0, step_s: float = 5.0,
                 background_loss: float = 1e-5, *, window_s: float = 30.0,
                 epoch_s: float | None = None, mesh_seed: int = 0, warmup_s: float = 10.0,
                 method: str = "map", open_after: int = 2, close_after: int = 3,
                 refresh_s: float = 30.0, suspicions: bool = False,
                 observer: Callable[[str, object], None] | None = None) -> None:
        for field_name, value in (("rate_pps", rate_pps), ("step_s", step_s),
                                  ("window_s", window_s), ("warmup_s", warmup_s)):
            if not value > 0:
                raise ConfigError(f"probe instrument: {field_name} must be > 0, got {value}")
        if not 0.0 <= background_loss < 1.0:
            raise ConfigError(f"probe instrument: background_loss must be in [0, 1), "
                              f"got {background_loss}")
        if method not in ("map", "007"):
            raise ConfigError(f"probe instrument: method must be 'map' or '007', got {method!r}")
        self.rate_pps = float(rate_pps)
        self.step_s = float(step_s)
        self.background_loss = float(background_loss)
        self.window_s = float(window_s)
        self.epoch_s = float(epoch_s) if epoch_s is not None else max(30.0,
                                                                      _PLAN_PROBES / rate_pps)
        self.mesh_seed = int(mesh_seed)
        self.warmup_s = float(warmup_s)
        self.method = method
        self.open_after = int(open_after)
        self.close_after = int(close_after)
        self.refresh_s = float(refresh_s)
        self.suspicions = suspicions
        self.observer = observer

    def prepared(self, fabric: Fabric) -> tuple[TwinMesh, Baseline]:
        """The mesh and baseline for ``fabric`` (built on first use, then cached)."""
        key = (id(fabric), self.mesh_seed, self.rate_pps, self.epoch_s, self.background_loss,
               self.warmup_s)
        hit = _MESHES.get(key)
        if hit is not None and hit.fabric is fabric:
            _MESHES.move_to_end(key)
            return hit.mesh, hit.baseline
        mesh = TwinMesh(fabric, seed=self.mesh_seed, budget_pps=self.rate_pps,
                        epoch_s=self.epoch_s)
        base = learn_baseline(mesh, seed=self.mesh_seed, warmup_s=self.warmup_s,
                              background_loss=self.background_loss)
        _MESHES[key] = _Prepared(fabric, mesh, base)
        while len(_MESHES) > _CACHE_SIZE:
            _MESHES.popitem(last=False)
        return mesh, base

    def run(self, spec: ScenarioSpec) -> list[Observed]:
        """Probe ``spec``'s twin for its duration; every finding the tracker opened, once.

        A finding is reported at the step ``t`` its (kind, subject) opens, from probes sent
        before ``t`` minus the reply timeout (their outcome is known at ``t``); it is reported
        once per run (a later change of kind or subject is a new finding), then refreshed every
        ``refresh_s`` while the tracker keeps it open (same id, the window grown to ``t``), so
        the correlator can tell a persisting symptom from one that cleared. Faults the probe
        transport does not model are ignored.
        """
        mesh, baseline = self.prepared(spec.fabric)
        transport = mesh.transport_for(FaultSchedule.of(probe_faults(spec.faults)), spec.seed,
                                       background_loss=self.background_loss)
        agents = _Agents(mesh.groups, rate_pps=self.rate_pps,
                         rng=np.random.default_rng(spec.seed + 3))
        s = 1_000_000_000
        duration_ns = round(spec.duration_s * s)
        step_ns, window_ns = round(self.step_s * s), round(self.window_s * s)
        timeout_ns = transport.timeout_ns
        tracker = FindingTracker(open_after=self.open_after, close_after=self.close_after)
        chunks: deque[Observations] = deque()
        sent_to = 0  # probes sent before this time have been carried
        reported: dict[tuple[str, str], Finding] = {}
        last_refresh: dict[tuple[str, str], int] = {}
        refresh_ns = round(self.refresh_s * s)
        out: list[Observed] = []
        observer = self.observer
        nodes = spec.fabric.index.node_ids
        t = step_ns
        while t <= duration_ns:
            known = t - timeout_ns  # a probe sent before this has its outcome by t
            fresh: Observations | None = None
            if known > sent_to:
                flow, ts = agents.between(sent_to, known)
                if flow.size:
                    chunks.append(to_observations(transport.carry(flow, ts), mesh.flows))
                    fresh = chunks[-1]
                    if observer is not None:
                        observer("probes", pair_counts(chunks[-1], mesh.flows, nodes, t_ns=t,
                                                       t0_ns=sent_to, t1_ns=known,
                                                       window_ns=window_ns))
                sent_to = known
            lo = max(0, known - window_ns)
            while chunks and len(chunks[0]) and int(chunks[0].t_send_ns[-1]) < lo:
                chunks.popleft()
            window = _concat(chunks, lo, known) if chunks else None
            findings = analyze(spec.fabric, mesh.model, window, baseline, method=self.method) \
                if window is not None and len(window) else []
            opened = tracker.update(findings, t)
            if self.suspicions:
                out.extend(self._suspicions(findings, tracker, reported, t, lo))
                if fresh is not None:
                    out.extend(self._starved_now(spec.fabric, fresh, baseline, findings,
                                                 tracker, reported, t))
            for f in opened:
                key = (f.kind, f.subject)
                if key in reported:
                    # still open: refresh it every refresh_s under the same id (same kind,
                    # subject and window start), so the incident knows its symptom persists
                    if t - last_refresh[key] >= refresh_ns:
                        last_refresh[key] = t
                        first = reported[key]
                        out.append(Observed("probe", replace(first, window=(first.window[0], t)),
                                            t, id=finding_id("probe", first)))
                    continue
                details = {**f.details, "window_s": self.window_s, "rate_pps": self.rate_pps}
                reported[key] = replace(f, details=details)
                last_refresh[key] = t
                out.append(Observed("probe", reported[key], t))
            t += step_ns
        return out

    def _starved_now(self, fabric: Fabric, fresh: Observations, baseline: Baseline,
                     findings: Sequence[Finding], tracker: FindingTracker,
                     reported: dict[tuple[str, str], Finding], t: int) -> list[Observed]:
        """Suspicions at step ``t``: hosts CPU-starved in the newest step's probes alone
        that neither the window's analysis nor the tracker names yet."""
        named = {(f.kind, f.subject) for f in findings}
        out: list[Observed] = []
        for f in host_findings(fabric, fresh, baseline):
            key = (f.kind, f.subject)
            if key in named or key in tracker.open or key in reported:
                continue
            out.append(suspicion(
                "probe", f.kind, f.subject, t, f.window, statistic="newest step's responder times",
                value=float(f.score), early=0.0, alarm=float(tracker.open_score),
                evidence=f"{f.kind} on {f.subject} in the last {self.step_s:g} s of probes "
                f"({'; '.join(f.evidence)}); the {self.window_s:g} s window's median has not "
                f"moved yet"))
        return out

    def _suspicions(self, findings: Sequence[Finding], tracker: FindingTracker,
                    reported: dict[tuple[str, str], Finding], t: int, lo: int) -> list[Observed]:
        """Suspicions at step ``t``: what this window's analysis blames that the tracker
        has not opened."""
        out: list[Observed] = []
        for f in findings:
            key = (f.kind, f.subject)
            if key in tracker.open or key in reported:
                continue
            out.append(suspicion(
                "probe", f.kind, f.subject, t, (lo, t), statistic="window localization",
                value=float(f.score), early=0.0, alarm=float(tracker.open_score),
                evidence=f"{f.kind} on {f.subject} in one window (score {f.score:.2f}); the "
                f"tracker opens after {tracker.open_after} windows at >= {tracker.open_score}"))
        return out
