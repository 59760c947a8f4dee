"""``fabricscope sim --cc ... --out``: queues.png, pauses.png and the pause-by-hop summary.

PFC (IEEE 802.1Qbb) pauses a link when the ingress queue its bytes form in the next switch
passes XOFF, so in an incast the links into the receiver's leaf pause first, then the spine
uplinks feeding them, then the senders' NICs: hop by hop upstream, each later than the one
before. The watched runs that record this must give the same results as unwatched ones and
keep their queue trace within its row bound.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_inprocess import run_main
from fabricscope.service.sim_plots_transport import pause_hops, watch_run
from fabricscope.sim.scenario import prepare, scenario_from_flags
from fabricscope.sim.transport import BufferConfig, FluidTransport, PfcConfig, TransportConfig
from fabricscope.sim.transport.config import transport_config_from_flags
from test_transport_pfc import _storm_setup

_INCAST = ("--topo", "leaf-spine:leaves=4,hosts_per_leaf=4,spines=2", "--workload", "incast:size=2MB,senders=12")
_PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data[:8] == _PNG and len(data) > 10_000


@pytest.fixture(scope="module")
def pfc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DCQCN + PFC incast through the CLI with --out (shared by the tests below)."""
    from fabricscope.cli import main

    out = tmp_path_factory.mktemp("pfc")
    mp = pytest.MonkeyPatch()
    mp.setattr(sys, "argv", ["fabricscope", "sim", *_INCAST, "--cc", "dcqcn", "--buffer", "2MiB", "--out", str(out)])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        mp.undo()
    assert code == 0
    return out


def test_pfc_incast_writes_valid_queue_and_pause_plots(pfc_run: Path) -> None:
    assert _is_png(pfc_run / "queues.png")
    assert _is_png(pfc_run / "pauses.png")
    assert _is_png(pfc_run / "slowdown.png")
    data = json.loads((pfc_run / "sim.json").read_text())
    q = data["hottest_queues"]["ecmp"][0]
    assert 1 <= len(q["ports"]) <= 6
    # The hottest port is the one into the receiver, and its watermark is the run's.
    assert q["ports"][0]["tier"] == "leaf-nic"
    assert q["ports"][0]["max_queue_KB"] == pytest.approx(data["runs"][0]["max_queue_KB"], rel=1e-6)
    maxima = [p["max_queue_KB"] for p in q["ports"]]
    assert maxima == sorted(maxima, reverse=True)
    assert q["ecn_kmin_KB"] == 5.0 and q["ecn_kmax_KB"] == 200.0  # DCQCN reacts to ECN: drawn
    assert all(p["xoff_KB"] > 0 for p in q["ports"])  # PFC on: XOFF drawn


def test_pause_spreads_upstream_hop_by_hop(pfc_run: Path) -> None:
    data = json.loads((pfc_run / "sim.json").read_text())
    p = data["pauses"]["ecmp"][0]
    run = data["runs"][0]
    assert p["pfc"] is True
    hops = p["by_hop"]
    assert [h["hop"] for h in hops] == [1, 2, 3]  # no cycle (-1), nothing unexplained
    assert sum(h["links"] for h in hops) == p["paused_links"] >= run["paused_links"] > 0
    assert sum(h["pause_frames"] for h in hops) == run["pause_frames"]
    # Hop 1: the links into the receiver's leaf (from its spines and its own senders), and
    # they pause first; every later hop's first pause is later.
    assert set(hops[0]["tiers"]) == {"spine-leaf", "nic-leaf"}
    assert set(hops[1]["tiers"]) == {"leaf-spine"}
    assert set(hops[2]["tiers"]) == {"nic-leaf"}
    firsts = [h["first_pause_us"] for h in hops]
    assert firsts[0] < firsts[1] < firsts[2]
    # Per tier, the same links and frames as per hop.
    tiers = p["by_tier"]
    assert sum(t["links"] for t in tiers.values()) == p["paused_links"]
    assert tiers["spine-leaf"]["hops"] == [1] and tiers["leaf-spine"]["hops"] == [2]
    assert tiers["nic-leaf"]["hops"] == [1, 3]
    listed = p["links"]
    assert len(listed) == p["paused_links"]
    assert all(x["first_pause_within_us"] <= max(0.5, 0.01 * x["first_pause_us"]) for x in listed)


def test_without_pfc_fewer_hops_pause_and_ideal_writes_no_transport_plots(
    pfc_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_pfc = json.loads((pfc_run / "sim.json").read_text())["pauses"]["ecmp"][0]
    code, _, err = run_main(capsys, monkeypatch, "sim", *_INCAST, "--cc", "dcqcn", "--buffer", "2MiB", "--no-pfc",
                            "--out", str(tmp_path / "lossy"))
    assert code == 0, err
    lossy = json.loads((tmp_path / "lossy" / "sim.json").read_text())
    p = lossy["pauses"]["ecmp"][0]
    assert p["pfc"] is False and p["hops_paused"] == 0 < with_pfc["hops_paused"]
    assert p["paused_links"] == 0 < with_pfc["paused_links"]
    assert _is_png(tmp_path / "lossy" / "pauses.png")  # says "PFC off" instead of a timeline
    assert lossy["hottest_queues"]["ecmp"][0]["ports"][0]["xoff_KB"] is None
    code, out, err = run_main(capsys, monkeypatch, "sim", *_INCAST, "--out", str(tmp_path / "ideal"))
    assert code == 0, err
    assert (tmp_path / "ideal" / "fct_cdf.png").exists()
    assert "queues:" not in out and "pauses:" not in out
    assert not (tmp_path / "ideal" / "queues.png").exists()
    assert not (tmp_path / "ideal" / "pauses.png").exists()
    ideal = json.loads((tmp_path / "ideal" / "sim.json").read_text())
    assert "pauses" not in ideal and "hottest_queues" not in ideal
    # --no-plot: the summaries still go to sim.json, no image.
    code, _, err = run_main(capsys, monkeypatch, "sim", *_INCAST, "--cc", "dcqcn", "--out", str(tmp_path / "np"),
                            "--no-plot")
    assert code == 0, err
    assert "pauses" in json.loads((tmp_path / "np" / "sim.json").read_text())
    assert not (tmp_path / "np" / "queues.png").exists()


def test_a_watched_run_gives_the_same_results_in_bounded_memory() -> None:
    sc = scenario_from_flags(topo="leaf-spine:leaves=4,hosts_per_leaf=4,spines=2",
                             workload="incast:size=4MB,senders=12", lb="ecmp", seeds=[0])
    prep = prepare(sc)
    cfg = transport_config_from_flags(cc="dcqcn", buffer="2MiB")
    assert cfg is not None
    w = prep.workloads[0]
    plain = FluidTransport(prep.fabric, w, config=cfg)
    plain.advance_to(cfg.max_time_ns)
    watched = FluidTransport(prep.fabric, w, config=cfg, watch=True)
    watched.advance_to(cfg.max_time_ns)
    a, b = plain.result(), watched.result()
    np.testing.assert_array_equal(a.sim.fct_ns, b.sim.fct_ns)
    np.testing.assert_array_equal(a.stats.max_queue_bytes, b.stats.max_queue_bytes)
    np.testing.assert_array_equal(a.stats.pause_frames, b.stats.pause_frames)
    assert a.watch is None and b.watch is not None
    # The trace was merged several times (the run is thousands of steps) and still spans it.
    rows = b.queue_trace_t_ns.shape[0]
    assert rows <= b.watch.max_rows and b.watch.trace_every_ns >= 8 * b.stats.dt_ns
    assert b.queue_trace_t_ns[-1] >= b.stats.sim_time_ns - 2 * b.watch.trace_every_ns
    assert np.all(np.diff(b.queue_trace_t_ns) > 0)
    # Every busy switch egress is traced; a merged row is a max of samples: never above the watermark.
    ix = prep.fabric.index
    assert all(ix.is_switch[ix.src[e]] for e in b.trace_edges.tolist())
    peak = b.queue_trace_bytes.max(axis=0)
    assert np.all(peak <= b.stats.max_queue_bytes[b.trace_edges] * (1 + 1e-9))
    hottest = int(np.argmax(b.stats.max_queue_bytes[b.trace_edges]))
    assert peak[hottest] >= 0.5 * b.stats.max_queue_bytes[b.trace_edges[hottest]]


def test_storm_hops_start_at_the_stuck_receiver_and_first_pauses_match_fine_stepping() -> None:
    fab, wl, stuck = _storm_setup()  # the stuck receiver and its victims, as test_transport_pfc
    cfg = TransportConfig(cc="none", pfc=PfcConfig(enabled=True), buffer=BufferConfig(size_bytes=4e6),
                          max_time_ns=0.4e6)
    # Reference: first pause seen when stepping 1 us at a time (as test_transport_pfc does).
    ref = FluidTransport(fab, wl, config=cfg, stuck_nics=[stuck])
    ix = fab.index
    first = np.full(ix.n_edges, np.nan)
    for step in range(1, 401):
        ref.advance_to(step * 1000.0)
        new = (ref.xoff > 0) & np.isnan(first)
        first[new] = step * 1000.0
    sim = FluidTransport(fab, wl, config=cfg, stuck_nics=[stuck], watch=True)
    sim.advance_to(cfg.max_time_ns)
    res = sim.result()
    assert res.watch is not None
    got = res.watch.first_pause_ns
    np.testing.assert_array_equal(np.isnan(got), np.isnan(first))
    seen = np.isfinite(first)
    assert seen.sum() > 6
    # The reference time is the end of its 1 us step; the watched one a chunk start.
    assert np.all(got[seen] <= first[seen] + 1e-6)
    assert np.all(got[seen] + res.watch.first_pause_window_ns[seen] >= first[seen] - 1000.0 - 1e-6)
    wr = watch_run(fab, res, label="ecmp", seed=0)
    by_link = {p.link: p for p in wr.paused}
    into_stuck = [ix.edge_id(int(e)) for e in np.flatnonzero(ix.dst == ix.node_of[stuck])]
    assert all(by_link[e].hop == 0 for e in into_stuck)
    assert all(p.hop >= 0 for p in wr.paused)
    hops = wr.pause_by_hop()
    assert [h["hop"] for h in hops] == list(range(len(hops))) and len(hops) >= 3
    fronts = [float(str(h["first_pause_us"])) for h in hops]
    assert fronts == sorted(fronts)
    # A paused link is one hop further than the nearest paused egress its bytes wait in.
    st = res.stats
    paused = (st.pause_frames > 0) | (st.paused_ns > 0)
    hop = pause_hops(fab, paused, st.max_queue_bytes > 0, res.watch.feeds)
    for g, e in res.watch.feeds.tolist():
        if paused[g] and hop[e] >= 0:
            assert hop[g] <= hop[e] + 1


def test_watched_scenario_runs_are_run_scenarios_runs() -> None:
    from fabricscope.service.sim_plots_transport import run_transport_watched
    from fabricscope.sim.scenario import run_scenario

    sc = scenario_from_flags(topo="leaf-spine:leaves=2,hosts_per_leaf=4,spines=2", workload="permutation:size=200KB",
                             lb="ecmp,spray", seeds=[0, 1], degrade=["leaf-000~spine-00=25%"])
    prep = prepare(sc)
    cfg = transport_config_from_flags(cc="dcqcn")
    assert cfg is not None
    plain = run_scenario(prep, record_utilization=False, transport=cfg)
    got, watched = run_transport_watched(prep, cfg)
    assert [(r.label, r.seed) for r in got.runs] == [(r.label, r.seed) for r in plain.runs]
    assert [(w.label, w.seed) for w in watched] == [(r.label, r.seed) for r in plain.runs]
    assert {r.label for r in got.runs} == {"ecmp", "spray", "ecmp (faults)", "spray (faults)"}
    for a, b in zip(plain.runs, got.runs, strict=True):
        np.testing.assert_array_equal(a.result.fct_ns, b.result.fct_ns)
        assert a.result.meta == b.result.meta
