"""The console's instrument views: the twin's instruments with observers, on a small twin.

Each view must show a fault where it is (the faulted NIC's probes lose, the slow rank stands
out, the fading optic is graded worse, the lossy cable is on the loss overlay) and nowhere
else, the telemetry store must hold the switch ports' rows at absolute simulated times, and
an observer must not change any instrument's findings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from fabricscope.diagnosis.model import Observed
from fabricscope.fabric.catalog import build_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.console.twin_source import TwinSettings, TwinSupervisor
from fabricscope.service.console.views import TwinViews, matrix_groups
from fabricscope.service.instruments import Instrument, ScenarioSpec
from fabricscope.service.instruments.optics import OpticsInstrument
from fabricscope.service.instruments.probe import ProbeInstrument
from fabricscope.service.instruments.straggler import StragglerInstrument
from fabricscope.service.instruments.telemetry import TelemetryInstrument
from fabricscope.sim.faults import Fault
from fabricscope.store.telemetry import TelemetryStore

S = 1_000_000_000
ONSET = 20 * S
DURATION_S = 90.0
GRAY_NIC = "host0002/nic3"
SLOW_GPU = "host0001/gpu2"
FADING = "leaf-p0-r1-00:eth3"


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return build_fabric("rail-optimized", {"servers": "8"})  # 64 NICs, 9 switches


def gray_link(fabric: Fabric) -> str:
    return fabric.link_of_port[fabric.ports_of[GRAY_NIC][0]].id


def instruments() -> list[Instrument]:
    # optics every 30 s: the drift below confirms (k = 2 readings) within 90 s
    return [TelemetryInstrument(), ProbeInstrument(), StragglerInstrument(),
            OpticsInstrument(interval_s=30.0)]


def faults(fabric: Fabric) -> list[Fault]:
    return [Fault("gray-loss", gray_link(fabric), ONSET, params={"loss": 0.05}),
            Fault("slow-gpu", SLOW_GPU, ONSET, params={"factor": 1.3}),
            Fault("optic-degrading", FADING, 0, None, {"rate": 1.0, "accel": 6000.0})]


@dataclass
class Run:
    views: TwinViews
    state: ConsoleState
    store: TelemetryStore
    found: dict[str, list[Observed]]

    def view(self, name: str) -> Any:
        return self.state.view(name)


def observe(fabric: Fabric, fs: list[Fault], *, offset_ns: int = 0) -> Run:
    store = TelemetryStore()
    views = TwinViews(fabric, telemetry_store=store)
    state = ConsoleState(fabric)
    spec = ScenarioSpec(fabric, fs, DURATION_S, seed=1)
    found = {}
    for ins in instruments():
        ins.observer = views.observer(offset_ns, offset_ns - 1)  # type: ignore[attr-defined]
        found[ins.name] = ins.run(spec)
    state.add_findings([o for obs in found.values() for o in obs])
    views.publish(state)
    return Run(views, state, store, found)


@pytest.fixture(scope="module")
def faulted(fabric: Fabric) -> Run:
    return observe(fabric, faults(fabric))


@pytest.fixture(scope="module")
def clean(fabric: Fabric) -> Run:
    return observe(fabric, [])


def matrix(body: dict[str, Any], key: str) -> np.ndarray:
    return np.array([[np.nan if x is None else x for x in row] for row in body[key]])


def test_an_observer_changes_no_finding(fabric: Fabric, faulted: Run) -> None:
    spec = ScenarioSpec(fabric, faults(fabric), DURATION_S, seed=1)
    for ins in instruments():
        assert getattr(ins, "observer", "missing") is None
        plain = [(o.id, o.reported_ns) for o in ins.run(spec)]
        assert plain, f"{ins.name}: the faulted scenario should give findings"
        assert plain == [(o.id, o.reported_ns) for o in faulted.found[ins.name]], ins.name


def test_probe_matrix_shows_loss_on_the_faulted_nic_only(faulted: Run, clean: Run) -> None:
    body = faulted.view("probes")
    assert body["group"] == "nic" and body["window_s"] == 30.0
    nodes = body["nodes"]
    assert len(nodes) == 64 and len(body["loss"]) == 64 and len(body["loss"][0]) == 64
    loss, rtt = matrix(body, "loss"), matrix(body, "rtt_us")
    i = nodes.index(GRAY_NIC)
    mine = np.concatenate([np.delete(loss[i], i), np.delete(loss[:, i], i)])
    mine = mine[~np.isnan(mine)]
    others = np.delete(np.delete(loss, i, axis=0), i, axis=1)
    others = others[~np.isnan(others)]
    # 5 % on each direction of the NIC's cable: a probe and its reply cross it, ~10 % lost
    assert mine.size >= 8 and 0.05 < mine.mean() < 0.2, mine
    assert others.size > 300
    assert others.mean() < 0.1 * mine.mean(), (others.mean(), mine.mean())
    per_node = np.nanmean(np.where(np.isnan(loss), np.nan, loss), axis=1) + \
        np.nanmean(loss, axis=0)
    assert int(np.nanargmax(per_node)) == i
    # probed pairs have a round trip; a NIC does not probe itself
    probed = ~np.isnan(loss)
    assert (rtt[probed] > 0).all() and np.isnan(np.diag(loss)).all()
    # the clean twin: the same NIC loses nothing more than the background
    cl = matrix(clean.view("probes"), "loss")
    assert np.nanmean(cl) < 0.01 and np.nanmean(np.r_[cl[i], cl[:, i]]) < 0.01


def test_straggler_windows_single_out_the_slow_rank_after_onset(faulted: Run,
                                                                clean: Run) -> None:
    body = faulted.view("stragglers")
    ranks = {r["gpu"]: r["rank"] for r in body["ranks"]}
    assert body["job"]["ranks"] == len(ranks) == 32
    slow = ranks[SLOW_GPU]
    windows = body["windows"]
    assert len(windows) >= 8 and body["job"]["iterations"] >= 8 * len(windows)
    t = [w["t_ns"] for w in windows]
    assert t == sorted(t) and t[-1] <= DURATION_S * S
    before = [w for w in windows if w["t_ns"] < ONSET]
    after = [w for w in windows if w["t_ns"] > ONSET + 15 * S]  # its 8 iterations all slow
    assert before and len(after) >= 4
    for w in before:
        assert max(w["values"]) < 1.05, w
    for w in after:
        v = np.array(w["values"])
        assert int(np.argmax(v)) == slow and v[slow] > 1.25
        assert np.median(np.delete(v, slow)) == pytest.approx(1.0, abs=0.02)
    assert any(f["subject"] == SLOW_GPU for f in body["findings"])
    for w in clean.view("stragglers")["windows"]:
        assert max(w["values"]) < 1.05


def test_the_fading_optic_is_graded_worse_and_has_a_history(faulted: Run, clean: Run) -> None:
    body = faulted.view("optics")
    n = sum(body["counts"].values())
    assert n == len(body["ports"]) == 256
    top = body["ports"][0]
    assert top["port"] == FADING and top["grade"] == "degrading" and top["lanes"] == 4
    assert [p["port"] for p in body["ports"] if p["grade"] in ("degrading", "failing")] == [FADING]
    assert body["counts"]["good"] >= n - 2
    assert clean.view("optics")["counts"] == {"good": 256, "watch": 0, "degrading": 0,
                                              "failing": 0}
    hist = faulted.view("optics_history")[FADING]
    assert hist["t_ns"] == [0, 30 * S, 60 * S, 90 * S]
    lanes = hist["lanes"]
    assert [ln["lane"] for ln in lanes] == [0, 1, 2, 3]
    for ln in lanes:  # 1 dB/day x 6000: ~6 dB of rx over 90 s
        assert ln["rx_dbm"][-1] < ln["rx_dbm"][0] - 4.0
    assert len(faulted.view("optics_history")) <= 256


def test_an_unconfirmed_drop_is_watch_before_it_is_degrading(fabric: Fabric) -> None:
    # at 30 s the drift (~2 dB) is one bad reading: the detector wants k = 2 in a row
    views = TwinViews(fabric)
    ins = OpticsInstrument(interval_s=30.0, observer=views.observer(0, -1))
    found = ins.run(ScenarioSpec(fabric, faults(fabric)[2:], 30.0, seed=1))
    assert found == []
    body = views.optics_view()
    assert body is not None and body["ports"][0] == {**body["ports"][0], "port": FADING,
                                                    "grade": "watch"}
    assert body["counts"]["watch"] == 1 and body["counts"]["good"] == 255


def test_overlay_and_link_states(fabric: Fabric, faulted: Run, clean: Run) -> None:
    ov = faulted.view("overlay")
    assert set(ov) == {"utilization", "loss", "pfc", "state", "optics"}
    assert list(ov["loss"]) == [gray_link(fabric)] and 0.02 < ov["loss"][gray_link(fabric)] < 0.1
    fading_link = fabric.link_of_port[FADING].id
    assert ov["optics"] == {fading_link: 2}
    assert ov["state"] == {} and ov["pfc"] == {}
    util = np.array(list(ov["utilization"].values()))
    assert len(util) == len(fabric.links) and 0.1 < util.mean() < 0.5  # background load 0.3
    links = faulted.view("links")
    assert links == {"up": len(fabric.links) - 2, "down": 0, "degraded": 2}
    assert clean.view("links") == {"up": len(fabric.links), "down": 0, "degraded": 0}
    assert clean.view("overlay")["loss"] == {} and clean.view("overlay")["optics"] == {}


def test_telemetry_rows_are_switch_ports_at_absolute_times(fabric: Fabric, faulted: Run) -> None:
    con = faulted.store.con
    targets = {r[0] for r in con.execute("SELECT DISTINCT target FROM telemetry").fetchall()}
    assert targets == {d.id for d in fabric.switches}
    # the gray cable's switch end counts the FCS errors, from the onset on
    leaf_port = fabric.peer_port[fabric.ports_of[GRAY_NIC][0]]
    leaf, ifname = leaf_port.split(":")
    rows = con.execute(
        "SELECT ts_ns, value_num FROM telemetry WHERE target = ? AND name LIKE '%in-fcs-errors' "
        "AND json_extract_string(tags, '$.interface_name') = ? ORDER BY ts_ns",
        [leaf, ifname]).fetchall()
    assert rows and rows[0][0] == 0
    assert all(v == 0 for t, v in rows if t <= ONSET) and rows[-1][1] > 0
    # shifted: the same run with its t = 0 at 1000 s, warm-up up to 1030 s dropped
    store = TelemetryStore()
    views = TwinViews(fabric, telemetry_store=store)
    ins = TelemetryInstrument(observer=views.observer(1000 * S, 1030 * S))
    ins.run(ScenarioSpec(fabric, [], 60.0, seed=1))
    ts = [r[0] for r in store.con.execute("SELECT DISTINCT ts_ns FROM telemetry ORDER BY 1")
          .fetchall()]
    assert ts == [s * S for s in (1040, 1050, 1060)]


def test_segments_keep_each_sample_once_and_a_recomputed_segment_replaces(
        fabric: Fabric) -> None:
    store = TelemetryStore()
    views = TwinViews(fabric, telemetry_store=store)

    def segment(offset_s: int, keep_s: int, duration_s: float) -> None:
        ins = TelemetryInstrument(observer=views.observer(offset_s * S, keep_s * S))
        ins.run(ScenarioSpec(fabric, [], duration_s, seed=offset_s))

    def by_ts() -> dict[int, int]:
        q = "SELECT ts_ns, count(*) FROM telemetry GROUP BY 1 ORDER BY 1"
        return {t // S: n for t, n in store.con.execute(q).fetchall()}

    segment(0, -1, 40.0)  # (-1, 40]
    first = by_ts()
    assert list(first) == [0, 10, 20, 30, 40]
    segment(20, 40, 40.0)  # runs 20..60, keeps (40, 60]
    second = by_ts()
    assert list(second) == [0, 10, 20, 30, 40, 50, 60]
    assert {t: second[t] for t in first} == first  # the warm-up's samples were not stored
    segment(10, 30, 40.0)  # recomputes (30, 50]: what came after 30 is replaced
    third = by_ts()
    assert list(third) == [0, 10, 20, 30, 40, 50]
    assert {t: third[t] for t in (0, 10, 20, 30)} == {t: first[t] for t in (0, 10, 20, 30)}
    assert views.stats["telemetry_rows"] == store.count()


def test_the_live_supervisor_fills_the_views_across_segments(fabric: Fabric) -> None:
    store = TelemetryStore()
    views = TwinViews(fabric, telemetry_store=store)
    state = ConsoleState(fabric)
    sup = TwinSupervisor(state, fabric, settings=TwinSettings(segment_s=15.0, warmup_s=30.0),
                         instruments=("telemetry", "probe"), views=views)
    sup.advance_to(35 * S)  # computed up to 45 s: the injection recomputes (35, 50]
    sup.inject(f"gray-loss:{gray_link(fabric)},loss=0.05")
    sup.advance_to(90 * S)
    views.publish(state)
    loss = matrix(state.view("probes"), "loss")
    i = state.view("probes")["nodes"].index(GRAY_NIC)
    assert np.nanmean(np.r_[loss[i], loss[:, i]]) > 10 * np.nanmean(np.delete(
        np.delete(loss, i, 0), i, 1))
    assert list(state.view("overlay")["loss"]) == [gray_link(fabric)]
    dup = store.con.execute(
        "SELECT count(*) - count(DISTINCT (ts_ns, target, name, tags)) FROM telemetry"
    ).fetchone()
    assert dup == (0,)
    ts = {r[0] for r in store.con.execute("SELECT DISTINCT ts_ns FROM telemetry").fetchall()}
    # (30, 45] was sampled at 40 s from t = 0 at 0 s; its recomputation after the injection
    # starts at 5 s (35 s - warm-up) and samples 45 s: the 40 s rows went with the rewind
    assert 40 * S not in ts and 45 * S in ts
    assert views.stats["telemetry_rows"] == sum(1 for _ in store.con.execute(
        "SELECT ts_ns FROM telemetry").fetchall())
    lo, hi = min(ts), max(ts)
    # segment k samples every 10 s from its own t = 0; the first's t = 0 is its keep_from
    assert lo == 10 * S and 75 * S < hi <= 90 * S


def test_old_telemetry_rows_are_pruned(fabric: Fabric) -> None:
    store = TelemetryStore()
    views = TwinViews(fabric, telemetry_store=store, telemetry_retention_s=20.0)
    TelemetryInstrument(observer=views.observer(0, -1)).run(ScenarioSpec(fabric, [], 60.0))
    lo = store.con.execute("SELECT min(ts_ns) FROM telemetry").fetchall()[0][0]
    assert 30 * S <= lo <= 40 * S  # newest 60 s - 20 s, pruned in 2 s steps
    assert views.stats["telemetry_pruned"] > 0
    assert views.stats["telemetry_rows"] == sum(
        1 for _ in store.con.execute("SELECT 1 FROM telemetry").fetchall())


def test_views_publish_json_and_nothing_before_data(fabric: Fabric, faulted: Run) -> None:
    for name in ("probes", "stragglers", "optics", "optics_history", "overlay", "links"):
        json.dumps(faulted.view(name), allow_nan=False)
    empty = ConsoleState(fabric)
    TwinViews(fabric).publish(empty)
    assert all(empty.view(n) is None for n in ("probes", "stragglers", "optics", "overlay"))


def test_matrix_groups_by_host_above_256_nics() -> None:
    small = build_fabric("rail-optimized", {"servers": "8"})
    assert matrix_groups(small)[0] == "nic"
    big = build_fabric("rail-optimized", {"servers": "40"})  # 320 NICs
    level, names, of = matrix_groups(big)
    assert level == "host" and len(names) == 40 and names[of["host0039/nic7"]] == "host0039"
    assert matrix_groups(big, max_nodes=4)[0] in ("leaf", "pod")


def test_bad_bounds_are_config_errors(fabric: Fabric) -> None:
    with pytest.raises(ConfigError, match="history_samples"):
        TwinViews(fabric, history_samples=0)
    with pytest.raises(ConfigError, match="telemetry_retention_s"):
        TwinViews(fabric, telemetry_retention_s=-1.0)
