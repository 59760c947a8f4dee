"""``running_mask``: probes to or from an agent that was not running are left out, for agents
that start, stop and restart at any time (the streaming worker's form of the steady window)."""

from __future__ import annotations

import numpy as np

from fabricscope.model.records import FiveTuple
from fabricscope.probe.analysis import Observations, running_mask

S = 1_000_000_000
RATE = 20  # probes per second per agent


def _obs(runs: dict[str, list[tuple[float, float]]], responders: tuple[str, ...] = ("D",)) -> Observations:
    """Every agent probes every other agent and responder round robin while it runs."""
    agents = sorted(runs)
    peers = {a: [b for b in [*agents, *responders] if b != a] for a in agents}
    flows = [(a, b, FiveTuple(f"198.18.0.{i}", f"198.18.1.{j}", 40000 + j, 4791))
             for i, a in enumerate(agents) for j, b in enumerate(peers[a])]
    fid = {(a, b): k for k, (a, b, _) in enumerate(flows)}
    flow, t = [], []
    for a in agents:
        for t0, t1 in runs[a]:
            for k, ts in enumerate(np.arange(t0 * S, t1 * S, S // RATE, dtype=np.int64)):
                flow.append(fid[(a, peers[a][k % len(peers[a])])])
                t.append(int(ts))
    order = np.argsort(t, kind="stable")
    f = np.asarray(flow, dtype=np.int64)[order]
    ts = np.asarray(t, dtype=np.int64)[order]
    return Observations(flows, f, ts, ts + 1000, ts + 2000, ts + 5000)


def _kept(obs: Observations, keep: np.ndarray, src: str, dst: str, t0: float, t1: float) -> tuple[int, int]:
    """(kept, all) probes from src to dst sent in [t0, t1) seconds."""
    m = np.array([obs.flows[i][0] == src and obs.flows[i][1] == dst for i in obs.flow])
    m &= (obs.t_send_ns >= t0 * S) & (obs.t_send_ns < t1 * S)
    return int((keep & m).sum()), int(m.sum())


def test_late_start_stop_and_restart_are_left_out_and_the_rest_kept() -> None:
    obs = _obs({"A": [(0, 60)], "B": [(20, 60)], "C": [(0, 40), (50, 60)]})
    keep = running_mask(obs, margin_ns=2 * S)
    # A's own start-up, then steady
    assert _kept(obs, keep, "A", "B", 0, 2)[0] == 0
    # to B before it started (and its first 2 s): out; after: in
    k, n = _kept(obs, keep, "A", "B", 2, 22)
    assert k == 0 and n > 0
    k, n = _kept(obs, keep, "A", "B", 22.5, 59)
    assert k == n > 0
    # B's own first 2 s: out
    k, n = _kept(obs, keep, "B", "A", 20, 22)
    assert k == 0 and n > 0
    # to C: kept while it runs, out from 2 s before it stops to 2 s after it restarts
    k, n = _kept(obs, keep, "A", "C", 3, 37.5)
    assert k == n > 0
    k, n = _kept(obs, keep, "A", "C", 38.5, 51.5)
    assert k == 0 and n > 0
    k, n = _kept(obs, keep, "A", "C", 52.5, 60)
    assert k == n > 0  # C's last run is still going at the end of the data: open
    # a responder that never probes is trusted
    k, n = _kept(obs, keep, "A", "D", 2.5, 60)
    assert k == n > 0


def test_all_agents_running_keeps_everything_after_start_up() -> None:
    obs = _obs({"A": [(0, 30)], "B": [(0, 30)], "C": [(0, 30)]})
    keep = running_mask(obs, margin_ns=2 * S)
    late = obs.t_send_ns >= int(2.1 * S)
    assert keep[late].all() and not keep[obs.t_send_ns < int(1.9 * S)].any()


def test_a_named_prober_that_sent_nothing_is_not_running() -> None:
    obs = _obs({"A": [(0, 30)]}, responders=("D", "E"))
    keep = running_mask(obs, margin_ns=2 * S, probers=["E"])
    assert _kept(obs, keep, "A", "E", 3, 30)[0] == 0
    k, n = _kept(obs, keep, "A", "D", 3, 30)
    assert k == n > 0


def test_empty() -> None:
    obs = _obs({})
    assert running_mask(obs).shape == (0,)
