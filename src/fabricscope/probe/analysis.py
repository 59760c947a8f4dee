"""Probe analysis: per-flow loss and RTT over windows, a learned baseline, host vs network.

Input is columnar (:class:`Observations`: one row per probe, flows by index) so a million
samples cost a few numpy passes; :func:`observations_from_samples` converts records.
Host versus network follows Pingmesh / R-Pingmesh practice:

* the responder's processing time ``t_resp_tx - t_resp_rx`` is measured on the responder's
  own clock and subtracted from the RTT, so a CPU-starved responder raises its *processing*
  time, never the network RTT; :func:`host_findings` flags responders whose median
  processing time is far above the fleet's learned baseline (and such hosts are excluded
  from the network verdicts of the same window);
* "every path to this NIC is bad" and "every path through this switch is bad" are
  components of the localizer's dictionary (:mod:`fabricscope.probe.localize`), so a NIC or
  switch fault is named as the device rather than as many links.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, FiveTuple, ProbeSample
from fabricscope.probe.localize import (
    LossCounts,
    PathModel,
    estimate_label,
    estimates_to_findings,
    localize_map,
    set_details,
    vote_007,
)

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
LOST = -1

FlowKey = tuple[str, str, FiveTuple]


ANSWERED, REQUEST_LOST, REPLY_LOST, LOST_UNKNOWN = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Observations:
    """Probes as columns. ``flows[flow[i]]`` is probe ``i``'s (src NIC, dst NIC, 5-tuple);
    ``t_recv_ns[i] == -1`` means lost (responder times are then ignored).

    ``status`` (optional) says where a lost probe was lost: :data:`REQUEST_LOST`,
    :data:`REPLY_LOST` (from the responder's ``rx_count``, see :mod:`~fabricscope.probe.wire`)
    or :data:`LOST_UNKNOWN`; None means unknown for every lost probe.
    """

    flows: Sequence[FlowKey]
    flow: I64
    t_send_ns: I64
    t_resp_rx_ns: I64
    t_resp_tx_ns: I64
    t_recv_ns: I64
    status: I64 | None = None

    def __len__(self) -> int:
        return int(self.flow.shape[0])

    def window(self, t0_ns: int, t1_ns: int) -> Observations:
        """Probes sent in ``[t0, t1)``."""
        m = (self.t_send_ns >= t0_ns) & (self.t_send_ns < t1_ns)
        return Observations(self.flows, self.flow[m], self.t_send_ns[m], self.t_resp_rx_ns[m],
                            self.t_resp_tx_ns[m], self.t_recv_ns[m],
                            None if self.status is None else self.status[m])

    def select(self, mask: npt.NDArray[np.bool_]) -> Observations:
        """The probes where ``mask`` is true (same flows)."""
        return Observations(self.flows, self.flow[mask], self.t_send_ns[mask], self.t_resp_rx_ns[mask],
                            self.t_resp_tx_ns[mask], self.t_recv_ns[mask],
                            None if self.status is None else self.status[mask])

    def lost_status(self) -> I64:
        """Per probe: ANSWERED, REQUEST_LOST, REPLY_LOST or LOST_UNKNOWN."""
        lost = self.t_recv_ns == LOST
        if self.status is None:
            return np.where(lost, LOST_UNKNOWN, ANSWERED).astype(np.int64)
        return np.where(lost, np.where(self.status == ANSWERED, LOST_UNKNOWN, self.status),
                        ANSWERED).astype(np.int64)


def observations_from_samples(samples: Iterable[ProbeSample],
                              statuses: Iterable[int] | None = None) -> Observations:
    """Columns from records (lost probes have ``t_recv_ns`` None); ``statuses`` optionally
    says where each lost probe was lost (ANSWERED / REQUEST_LOST / REPLY_LOST / LOST_UNKNOWN)."""
    index: dict[FlowKey, int] = {}
    flows: list[FlowKey] = []
    cols: list[tuple[int, int, int, int, int]] = []
    for s in samples:
        key = (s.src, s.dst, s.flow)
        j = index.get(key)
        if j is None:
            j = index[key] = len(flows)
            flows.append(key)
        lost = s.t_recv_ns is None
        cols.append((j, s.t_send_ns,
                     LOST if lost or s.t_resp_rx_ns is None else s.t_resp_rx_ns,
                     LOST if lost or s.t_resp_tx_ns is None else s.t_resp_tx_ns,
                     LOST if s.t_recv_ns is None else s.t_recv_ns))
    arr = np.asarray(cols, dtype=np.int64).reshape(-1, 5)
    st = None if statuses is None else np.fromiter(statuses, dtype=np.int64, count=arr.shape[0])
    return Observations(flows, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4], st)


def _group_median(keys: I64, values: F64, n_groups: int) -> F64:
    """Median of ``values`` per key (NaN for empty groups), by one lexsort."""
    out = np.full(n_groups, np.nan)
    if keys.shape[0] == 0:
        return out
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    ends = np.r_[starts[1:], k.shape[0]]
    lo = starts + (ends - starts - 1) // 2
    hi = starts + (ends - starts) // 2
    out[k[starts]] = (v[lo] + v[hi]) / 2.0
    return out


@dataclass(frozen=True, slots=True)
class FlowStats:
    """Per registered flow over one window (NaN where no answer came back)."""

    sent: I64
    lost: I64
    lost_req: I64  # lost on the request path
    lost_unknown: I64  # lost, direction unknown
    rtt_ns: F64  # median network RTT (responder processing removed)
    proc_ns: F64  # median responder processing time


def flow_stats(obs: Observations, *, medians: bool = True) -> FlowStats:
    """Loss counts and median RTT / processing time per (pair, 5-tuple).

    ``medians=False`` skips the (sorting) medians when only loss counts are needed.
    """
    n = len(obs.flows)
    ok = obs.t_recv_ns != LOST
    sent = np.bincount(obs.flow, minlength=n).astype(np.int64)
    lost = np.bincount(obs.flow[~ok], minlength=n).astype(np.int64)
    status = obs.lost_status()
    lreq = np.bincount(obs.flow[status == REQUEST_LOST], minlength=n).astype(np.int64)
    lunk = np.bincount(obs.flow[status == LOST_UNKNOWN], minlength=n).astype(np.int64)
    if not medians:
        nan = np.full(n, np.nan)
        return FlowStats(sent, lost, lreq, lunk, nan, nan)
    proc = (obs.t_resp_tx_ns[ok] - obs.t_resp_rx_ns[ok]).astype(np.float64)
    rtt = (obs.t_recv_ns[ok] - obs.t_send_ns[ok]).astype(np.float64) - proc
    return FlowStats(sent, lost, lreq, lunk, _group_median(obs.flow[ok], rtt, n),
                     _group_median(obs.flow[ok], proc, n))


@dataclass(frozen=True, slots=True)
class WindowTotals:
    """One window of probes reduced to what loss localization and the responder check read,
    with no per-probe rows: per-flow :class:`FlowStats` (RTT / processing medians NaN), the
    send-time span, the probe count and the median responder time over answered probes
    (NaN when none was answered). A store builds it by one GROUP BY
    (``ProbeStore.window_totals``), so a window of millions of probes never becomes Python
    or numpy rows; :meth:`of` computes the same from columns.
    """

    flows: Sequence[FlowKey]
    stats: FlowStats
    window: tuple[int, int]
    n_probes: int
    proc_median: float

    @classmethod
    def of(cls, obs: Observations) -> WindowTotals:
        ok = obs.t_recv_ns != LOST
        proc = (obs.t_resp_tx_ns[ok] - obs.t_resp_rx_ns[ok]).astype(np.float64)
        span = (int(obs.t_send_ns.min()), int(obs.t_send_ns.max())) if len(obs) else (0, 0)
        return cls(obs.flows, flow_stats(obs, medians=False), span, len(obs),
                   float(np.median(proc)) if proc.size else float("nan"))


class ResponderTimes(Protocol):
    """Responder processing times of a window's answered probes, by responder NIC, read on
    demand (what :func:`host_findings_of` needs when the probes are not in memory)."""

    def above(self, threshold_ns: float) -> tuple[Sequence[str], I64, I64]:
        """(responder NIC ids, answered probes, answered probes whose time > threshold)."""
        ...

    def times(self, nics: Sequence[str]) -> F64:
        """Every answered probe's responder time at any of ``nics``."""
        ...


@dataclass
class Baseline:
    """What normal looks like, learned from fault-free (or mostly fault-free) windows.

    ``loss_per_hop``: background drop probability per directed-link traversal;
    ``proc_ns``: the fleet's typical responder processing time; ``rtt_ns``: per-flow median
    network RTT. :meth:`learn` blends a window in with weight ``alpha`` (an EWMA), using
    robust statistics so one bad host or link in the learning window does not move it.
    """

    loss_per_hop: float = 1e-5
    proc_ns: float = 10_000.0
    rtt_ns: dict[FlowKey, float] = field(default_factory=dict)
    windows: int = 0

    def learn(self, obs: Observations, *, hops: F64 | None = None, alpha: float = 0.3,
              track_rtt: bool = True) -> None:
        st = flow_stats(obs, medians=track_rtt)
        a = 1.0 if self.windows == 0 else alpha
        self._learn_loss(st, hops, a)
        ok = obs.t_recv_ns != LOST
        proc = (obs.t_resp_tx_ns[ok] - obs.t_resp_rx_ns[ok]).astype(np.float64)
        self._learn_proc(float(np.median(proc)) if proc.size else float("nan"), a)
        if track_rtt:
            for j in np.flatnonzero(np.isfinite(st.rtt_ns)):
                key = obs.flows[int(j)]
                old = self.rtt_ns.get(key)
                self.rtt_ns[key] = float(st.rtt_ns[j]) if old is None else (1 - a) * old + a * float(st.rtt_ns[j])
        self.windows += 1

    def learn_totals(self, totals: WindowTotals, *, hops: F64 | None = None,
                     alpha: float = 0.3) -> None:
        """:meth:`learn` from a window's totals (no per-flow RTT baselines)."""
        a = 1.0 if self.windows == 0 else alpha
        self._learn_loss(totals.stats, hops, a)
        self._learn_proc(totals.proc_median, a)
        self.windows += 1

    def _learn_proc(self, median_ns: float, a: float) -> None:
        med = median_ns if np.isfinite(median_ns) else self.proc_ns
        self.proc_ns = (1 - a) * self.proc_ns + a * med

    def _learn_loss(self, st: FlowStats, hops: F64 | None, a: float) -> None:
        good = st.sent > 0
        if good.any():
            h = hops[good] if hops is not None else np.full(int(good.sum()), 8.0)
            # Median of per-flow rates is robust to a few faulty flows; the floor keeps the
            # localizer's likelihood finite when the fleet had no loss at all.
            lost, sent = st.lost[good], st.sent[good] * h
            # Drop flows whose losses are implausible at the fleet-wide rate (more than ~5
            # sigma above their Poisson mean) so one bad link in the learning window does not
            # become "normal"; the floor keeps the localizer's likelihood finite.
            rate0 = float(lost.sum() / max(1.0, float(sent.sum())))
            mu = rate0 * sent
            keep = lost <= mu + 5.0 * np.sqrt(mu) + 3.0
            robust = float(lost[keep].sum() / max(1.0, float(sent[keep].sum())))
            self.loss_per_hop = max(1e-7, (1 - a) * self.loss_per_hop + a * robust)


def _host_of_flows(fabric: Fabric, flows: Sequence[FlowKey]) -> I64:
    """Per flow, the index (into ``fabric.hosts``) of the responder's host.

    Vectorized when ``flows`` carries ``dst_node`` (``fabric.index`` node indices), as the
    twin's flow table does; otherwise one dictionary lookup per flow.
    """
    ix = fabric.index
    host_pos = {h.id: i for i, h in enumerate(fabric.hosts)}
    node_host = np.array([host_pos.get(fabric.devices[n].host or "", -1) for n in ix.node_ids],
                         dtype=np.int64)
    dst_node = getattr(flows, "dst_node", None)
    if dst_node is not None:
        out: I64 = node_host[np.asarray(dst_node, dtype=np.int64)]
        return out
    return np.array([node_host[ix.node_of[d]] for _, d, _ in flows], dtype=np.int64)


def host_findings(
    fabric: Fabric,
    obs: Observations,
    baseline: Baseline,
    *,
    factor: float = 5.0,
    min_extra_ns: float = 100_000.0,
    min_samples: int = 10,
    q0: float = 0.05,
) -> list[Finding]:
    """CPU-starved responders: median processing time > max(factor x baseline,
    baseline + min_extra_ns) over at least ``min_samples`` answered probes.

    Grouped per host (a starved CPU slows every NIC's responder on it). The score is
    one minus the Bonferroni-corrected sign-test p-value (see :func:`_host_verdicts`).
    """
    ok = obs.t_recv_ns != LOST
    if not ok.any():
        return []
    host = _host_of_flows(fabric, obs.flows)[obs.flow[ok]]
    proc = (obs.t_resp_tx_ns[ok] - obs.t_resp_rx_ns[ok]).astype(np.float64)
    known = host >= 0
    host, proc = host[known], proc[known]
    n_hosts = len(fabric.hosts)
    thr = _starved_threshold(baseline, factor, min_extra_ns)
    cnt = np.bincount(host, minlength=n_hosts)
    above = np.bincount(host, weights=(proc > thr).astype(np.float64), minlength=n_hosts)
    window = (int(obs.t_send_ns.min()), int(obs.t_send_ns.max()))
    return _host_verdicts(fabric, cnt, above, lambda i: float(np.median(proc[host == i])),
                          baseline, window, min_samples=min_samples, q0=q0)


def host_findings_of(
    fabric: Fabric,
    responders: ResponderTimes,
    baseline: Baseline,
    window: tuple[int, int],
    *,
    factor: float = 5.0,
    min_extra_ns: float = 100_000.0,
    min_samples: int = 10,
    q0: float = 0.05,
) -> list[Finding]:
    """:func:`host_findings` from responder times read on demand: counts per responder NIC
    at the threshold, then the times of the candidate hosts' NICs only."""
    thr = _starved_threshold(baseline, factor, min_extra_ns)
    nics, n_ans, n_above = responders.above(thr)
    host_pos = {h.id: i for i, h in enumerate(fabric.hosts)}
    devs = fabric.devices
    hidx = np.array([host_pos.get((devs[n].host or "") if n in devs else "", -1) for n in nics],
                    dtype=np.int64)
    known = hidx >= 0
    n_hosts = len(fabric.hosts)
    cnt = np.bincount(hidx[known], weights=np.asarray(n_ans, dtype=np.float64)[known],
                      minlength=n_hosts).astype(np.int64)
    above = np.bincount(hidx[known], weights=np.asarray(n_above, dtype=np.float64)[known],
                        minlength=n_hosts)
    nics_of: dict[int, list[str]] = {}
    for n, h in zip(nics, hidx.tolist(), strict=True):
        if h >= 0:
            nics_of.setdefault(h, []).append(n)
    return _host_verdicts(fabric, cnt, above,
                          lambda i: float(np.median(responders.times(nics_of[i]))),
                          baseline, window, min_samples=min_samples, q0=q0)


def _starved_threshold(baseline: Baseline, factor: float, min_extra_ns: float) -> float:
    return max(factor * baseline.proc_ns, baseline.proc_ns + min_extra_ns)


def _host_verdicts(fabric: Fabric, cnt: npt.NDArray[Any], above: npt.NDArray[Any], median_of: Callable[[int], float],
                   baseline: Baseline, window: tuple[int, int], *, min_samples: int,
                   q0: float) -> list[Finding]:
    """The starved hosts among per-host counts: more than half of at least ``min_samples``
    answers above the threshold (so the median is above it, no sort needed)."""
    cand = np.flatnonzero((above * 2 > cnt) & (cnt >= min_samples))
    if not cand.size:
        return []
    from scipy.stats import binom  # only with a suspect host: scipy.stats costs ~1 s to import

    t0, t1 = window
    out: list[Finding] = []
    n_seen = int(np.count_nonzero(cnt))
    for i in cand:
        med = median_of(int(i))
        # Sign test: on a healthy responder fewer than ``q0`` of answers exceed the threshold
        # (it is many times the typical time), so k of n above it has binomial tail
        # P(X >= k); Bonferroni over the hosts seen.
        p_value = float(binom.sf(int(above[i]) - 1, int(cnt[i]), q0))
        score = max(0.0, 1.0 - n_seen * p_value)
        out.append(Finding(
            kind="cpu-starved",
            subject=fabric.hosts[int(i)].id,
            score=round(score, 6),
            window=(t0, t1),
            evidence=(f"{int(cnt[i])} replies, median responder time {med / 1e3:.0f} us "
                      f"vs baseline {baseline.proc_ns / 1e3:.0f} us",),
            action="check the host's CPU load / IRQ affinity of the probe responder; not a network fault",
            details={"added_delay_ns": float(med - baseline.proc_ns), "samples": int(cnt[i]),
                     "strength": float(cnt[i]) * float(np.log(med / baseline.proc_ns))},
        ))
    return out


_SLOW_KIND = {"gray-link": "slow-link", "switch-fault": "slow-switch", "nic-fault": "slow-nic"}


def delay_findings(
    fabric: Fabric,
    model: PathModel,
    obs: Observations,
    baseline: Baseline,
    *,
    min_delay_ns: float = 20_000.0,
    min_answers: int = 3,
    alpha: float = 1e-4,
    exclude: npt.NDArray[np.bool_] | None = None,
) -> list[Finding]:
    """Links / devices that add latency: flows whose median network RTT exceeds their
    learned baseline by ``min_delay_ns`` are "slow"; the same sparse MAP localizer explains
    the set of slow flows (one Bernoulli trial per flow, round trip), and the added delay is
    the median excess of the slow flows through the chosen component.

    Needs per-flow RTT baselines (``Baseline.learn(track_rtt=True)``); responder time is
    already removed from RTT, so a CPU-starved host never shows up here.
    """
    st = flow_stats(obs)
    base = np.array([baseline.rtt_ns.get(k, np.nan) for k in obs.flows])
    answered = st.sent - st.lost
    excess = st.rtt_ns - base
    valid = np.isfinite(excess) & (answered >= min_answers)
    if exclude is not None:
        valid &= ~exclude
    slow = valid & (excess > min_delay_ns)
    if not slow.any():
        return []
    counts = LossCounts(obs.flows, valid.astype(np.int64), slow.astype(np.int64))
    # A healthy flow looks "slow" rarely (jitter); 1e-3 per hop is that rate's prior.
    est = localize_map(model, counts, loss_per_hop=1e-3, alpha=alpha, min_loss=0.3)
    if not est:
        return []
    rows = model.rows(obs.flows)
    AF, AR = model.matrices
    window = (int(obs.t_send_ns.min()), int(obs.t_send_ns.max()))
    out: list[Finding] = []
    for e in est:
        through = (np.asarray(AF[rows][:, e.component].todense()).ravel()
                   + np.asarray(AR[rows][:, e.component].todense()).ravel()) > 0
        sel = through & slow
        added = float(np.median(excess[sel])) if sel.any() else 0.0
        kind, subject = estimate_label(e)
        extra = set_details(fabric, e)
        out.append(Finding(
            kind=_SLOW_KIND.get(kind, kind), subject=subject, score=round(e.score, 6),
            window=window,
            evidence=(f"{int(sel.sum())} of {int((through & valid).sum())} probe flows through it "
                      f"are slower than their baseline by > {min_delay_ns / 1e3:.0f} us",
                      *((f"ambiguous: {extra['candidates']} candidates "
                         f"(posterior {extra['posterior']})",) if extra else ())),
            action=("check this link/device for congestion, a flapping optic or a slow path"
                    if not extra else f"not yet localized to one candidate; to separate them: "
                    f"{extra.get('separate_by', '')}"),
            details={"added_delay_ns": added, "slow_fraction": e.loss, "strength": e.llr,
                     "method": "map", **extra},
        ))
    return out


def rtt_excess(obs: Observations, baseline: Baseline) -> F64:
    """Per-flow median network RTT minus its learned baseline (NaN where unknown)."""
    st = flow_stats(obs)
    base = np.array([baseline.rtt_ns.get(k, np.nan) for k in obs.flows])
    out: F64 = st.rtt_ns - base
    return out


def analyze(
    fabric: Fabric,
    model: PathModel,
    obs: Observations,
    baseline: Baseline,
    *,
    method: str = "map",
    alpha: float = 1e-4,
    min_loss: float = 1e-3,
) -> list[Finding]:
    """Everything one window says: CPU-starved hosts, then lossy links / switches / NICs.

    Flows answered by a CPU-starved host are left out of the network localization of that
    window, so a slow responder is never blamed on the network. ``method`` is ``"map"``
    (default, :func:`~fabricscope.probe.localize.localize_map`) or ``"007"``
    (:func:`~fabricscope.probe.localize.vote_007`). Findings are sorted strongest first.
    """
    if len(obs) == 0:
        return []
    window = (int(obs.t_send_ns.min()), int(obs.t_send_ns.max()))
    hosts = host_findings(fabric, obs, baseline)

    def slow(bad: npt.NDArray[np.bool_] | None) -> list[Finding]:
        return delay_findings(fabric, model, obs, baseline, exclude=bad) \
            if baseline.rtt_ns and method == "map" else []

    return _network_findings(fabric, model, obs.flows, flow_stats(obs, medians=False), window,
                             hosts, slow, loss_per_hop=baseline.loss_per_hop, method=method,
                             alpha=alpha, min_loss=min_loss)


def analyze_totals(
    fabric: Fabric,
    model: PathModel,
    totals: WindowTotals,
    responders: ResponderTimes,
    baseline: Baseline,
    *,
    method: str = "map",
    alpha: float = 1e-4,
    min_loss: float = 1e-3,
) -> list[Finding]:
    """:func:`analyze` of a window given as totals (a store's GROUP BY) and responder times
    read on demand: the same findings as :func:`analyze` on the window's probes when the
    baseline has no per-flow RTTs (stored probes: no delay localization)."""
    if totals.n_probes == 0:
        return []
    hosts = host_findings_of(fabric, responders, baseline, totals.window)
    return _network_findings(fabric, model, totals.flows, totals.stats, totals.window, hosts,
                             lambda _bad: [], loss_per_hop=baseline.loss_per_hop,
                             method=method, alpha=alpha, min_loss=min_loss)


def _network_findings(
    fabric: Fabric, model: PathModel, flows: Sequence[FlowKey], st: FlowStats,
    window: tuple[int, int], hosts: list[Finding],
    slow: Callable[[npt.NDArray[np.bool_] | None], list[Finding]], *,
    loss_per_hop: float, method: str, alpha: float, min_loss: float,
) -> list[Finding]:
    """Lossy links / switches / NICs of a window's per-flow counts, the flows answered by
    the starved ``hosts`` left out; ``slow`` adds the delay findings (given those flows)."""
    sent, lost, lreq, lunk = st.sent, st.lost, st.lost_req, st.lost_unknown
    bad = None
    if hosts:
        pos = {h.id: i for i, h in enumerate(fabric.hosts)}
        starved = np.array([pos[h.subject] for h in hosts], dtype=np.int64)
        bad = np.isin(_host_of_flows(fabric, flows), starved)
        sent, lost, lreq, lunk = (np.where(bad, 0, a) for a in (sent, lost, lreq, lunk))
    counts = LossCounts(flows, sent, lost, lreq, lunk, window)
    delayed = slow(bad)
    if method == "007":
        est = vote_007(model, counts)
    elif method == "map":
        est = localize_map(model, counts, loss_per_hop=loss_per_hop, alpha=alpha,
                           min_loss=min_loss)
    else:
        raise ConfigError(f"probe analyze: --method must be 'map' or '007', got {method!r}")
    out = hosts + estimates_to_findings(est, window, method=method, fabric=fabric) + delayed
    out.sort(key=lambda f: -float(f.details.get("strength", 0.0)))
    return out


def check_inputs(fabric: Fabric, obs: Observations, *, source: str) -> None:
    """Refuse probes that cannot be analysed against ``fabric``: none at all, or flows whose
    endpoints are not NICs of the inventory or whose addresses differ from the inventory's
    (another cluster's inventory, or another cluster's samples). Raises ConfigError naming
    ``source``, what was found and what was expected."""
    if len(obs) == 0:
        raise ConfigError(f"{source}: no probe samples (expected probes written by `probe agent` "
                          f"or `probe twin` for inventory {fabric.name!r})")
    devs = fabric.devices
    bad: list[str] = []
    n_bad = 0
    for src, dst, ft in obs.flows:
        problem = None
        for nic, ip, end in ((src, ft.src_ip, "source"), (dst, ft.dst_ip, "destination")):
            d = devs.get(nic)
            if d is None or d.role != "nic":
                problem = f"{end} {nic!r} is not a NIC of the inventory"
            elif d.address is not None and d.address != ip:
                problem = f"{end} {nic} has address {ip} in the probes but {d.address} in the inventory"
            if problem:
                break
        if problem:
            n_bad += 1
            if len(bad) < 2:
                bad.append(problem)
    if n_bad:
        raise ConfigError(f"{source}: {n_bad} of {len(obs.flows)} probe flows do not match inventory "
                          f"{fabric.name!r} ({'; '.join(bad)}): expected samples of this fabric "
                          f"(wrong --inventory?)")


def common_window(obs: Observations, *, margin_ns: int = 2_000_000_000) -> tuple[int, int]:
    """The send-time range in which every prober was running, shrunk by ``margin_ns`` at
    both ends: agents that start or stop at different times make probes to a responder that
    is not (or no longer) there look lost, which is not a network fault."""
    if len(obs) == 0:
        return (0, 0)
    src_of_flow = np.unique(np.array([s for s, _, _ in obs.flows], dtype=object), return_inverse=True)[1]
    src = src_of_flow.reshape(-1)[obs.flow]
    n = int(src.max()) + 1
    first = np.full(n, np.iinfo(np.int64).max)
    last = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(first, src, obs.t_send_ns)
    np.maximum.at(last, src, obs.t_send_ns)
    return int(first.max()) + margin_ns, int(last.min()) - margin_ns


def running_mask(obs: Observations, *, margin_ns: int = 2_000_000_000,
                 probers: Iterable[str] = (), min_gap_ns: int = 1_000_000_000) -> npt.NDArray[np.bool_]:
    """Per probe: whether both of its ends were running when it was sent, for a stream of
    probes where agents start, stop and restart at any time (``common_window`` assumes one
    run of every agent; a continuous worker cannot).

    An agent's *runs* are read from its own sends: a gap longer than ``max(min_gap_ns, 10 x
    its median send interval)`` ends a run. A probe at ``t`` from ``s`` to ``d`` is kept when
    ``t`` is at least ``margin_ns`` into a run of ``s`` (start-up: ARP and the responder's
    socket are not ready), and, when ``d`` is a prober too (it sends in ``obs`` or is named in
    ``probers``), ``t`` lies inside a run of ``d`` with ``margin_ns`` on both sides: a probe to
    an agent that had not started, had stopped or was restarting looks lost, and that is not
    a network fault. A destination that never probes (a responder only) is trusted.
    The last run of an agent that is still sending at the end of ``obs`` is open (no end
    margin). ``obs`` should start ``margin_ns`` plus a gap before the probes to judge."""
    n = len(obs)
    keep = np.ones(n, dtype=bool)
    if n == 0:
        return keep
    names = sorted({s for s, _, _ in obs.flows} | {d for _, d, _ in obs.flows} | set(probers))
    idx = {x: i for i, x in enumerate(names)}
    src_of = np.array([idx[s] for s, _, _ in obs.flows], dtype=np.int64)
    dst_of = np.array([idx[d] for _, d, _ in obs.flows], dtype=np.int64)
    src, dst, t = src_of[obs.flow], dst_of[obs.flow], obs.t_send_ns
    # runs per agent: [start, end] of each stretch of its own sends
    # (a run still going at the end of the data, within its gap and the margin of the newest
    # send of any agent, is open: agents flush at different moments)
    newest = int(t.max())
    runs: dict[int, tuple[I64, I64]] = {}
    for a in np.unique(src):
        ts = np.sort(t[src == a])
        d = np.diff(ts)
        gap = max(min_gap_ns, 10 * int(np.median(d))) if len(d) else min_gap_ns
        cut = np.flatnonzero(d > gap)
        ends = ts[np.r_[cut, len(ts) - 1]].copy()
        if ends[-1] >= newest - gap - margin_ns:
            ends[-1] = np.iinfo(np.int64).max // 2
        runs[int(a)] = (ts[np.r_[0, cut + 1]], ends)
    prober = np.zeros(len(names), dtype=bool)
    prober[list(runs)] = True
    for p in probers:
        prober[idx[p]] = True
    for a, (starts, _) in runs.items():
        m = src == a
        k = np.searchsorted(starts, t[m], side="right") - 1
        keep[m] &= t[m] >= starts[k] + margin_ns
    for a in np.flatnonzero(prober):
        m = dst == a
        if not m.any():
            continue
        if int(a) not in runs:  # a prober that sent nothing here: not running
            keep[m] = False
            continue
        starts, ends = runs[int(a)]
        k = np.searchsorted(starts, t[m], side="right") - 1
        ok = k >= 0
        kk = np.maximum(k, 0)
        ok &= (t[m] >= starts[kk] + margin_ns) & (t[m] <= ends[kk] - margin_ns)
        keep[m] &= ok
    return keep
