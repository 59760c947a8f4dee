"""Optics: the streaming DOM detector and the optics instrument on the twin."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import port_device
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import DomReading
from fabricscope.optics import KP4_BER_LIMIT, DomDetector, DomThresholds
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.optics import OpticsInstrument
from fabricscope.sim.faults import Fault

NS = 1_000_000_000
LANES = 4


def _rounds(n: int, *, seed: int = 0, ports: tuple[str, ...] = ("a", "b"), noise: float = 0.1):
    """n rounds of seeded DOM arrays (rx, tx, ber) for ``ports``, healthy optics."""
    rng = np.random.default_rng(seed)
    shape = (n, len(ports), LANES)
    rx = -2.0 + rng.normal(0, noise, shape)
    tx = 1.0 + rng.normal(0, noise, shape)
    ber = np.full(shape, 1e-8)
    return rx, tx, ber


def _feed(det: DomDetector, ports: tuple[str, ...], rx, tx, ber):
    out = []
    for i in range(rx.shape[0]):
        out += [(i, f) for f in det.observe(i * 60 * NS, ports, rx[i], tx[i], ber[i])]
    return out


def test_a_drop_for_k_readings_is_found_once_with_lane_baseline_and_threshold() -> None:
    ports = ("a", "b")
    rx, tx, ber = _rounds(12, seed=1)
    rx[5:, 0, 2] -= 2.0  # lane 2 of port a loses 2 dB from round 5 on
    th = DomThresholds(k=3, baseline_n=3)
    found = _feed(DomDetector(th), ports, rx, tx, ber)
    assert [(i, f.kind, f.subject) for i, f in found] == [(7, "optic-degrading", "a")]
    f = found[0][1]
    assert f.details["lane"] == 2 and f.details["threshold"] == 1.5
    assert f.details["baseline"] == pytest.approx(np.median(rx[:3, 0, 2]))
    assert f.details["current"] == pytest.approx(rx[7, 0, 2])
    assert f.window == (5 * 60 * NS, 7 * 60 * NS)
    assert 0.5 < f.score < 1.0


def test_noise_and_small_drops_give_nothing() -> None:
    # 0.1 dB reading noise (3-reading median baseline: ~0.07 dB): a 1 dB drop is 0.5 dB, about
    # 3.5 sigma of (reading - baseline), below the 1.5 dB threshold; k=2 in a row over 150
    # rounds x 8 lanes has a false-alarm chance below 1e-3
    rx, tx, ber = _rounds(200, seed=2, noise=0.1)
    rx[50:, 1, 0] -= 1.0
    assert _feed(DomDetector(), ("a", "b"), rx, tx, ber) == []


def test_an_interrupted_drop_needs_k_consecutive_readings() -> None:
    rx, tx, ber = _rounds(12, seed=3)
    rx[[4, 5, 7, 8, 10], 0, 1] -= 3.0  # never 3 in a row
    assert _feed(DomDetector(DomThresholds(k=3)), ("a", "b"), rx, tx, ber) == []


def test_the_far_end_transmitter_explains_the_rx_drop_so_the_receiver_is_not_blamed() -> None:
    ports = ("a", "b")
    rx, tx, ber = _rounds(10, seed=4)
    tx[4:, 0, :] -= 2.5  # a's laser fades...
    rx[4:, 1, :] -= 2.5  # ...so b receives 2.5 dB less on every lane
    with_peers = _feed(DomDetector(peers={"a": "b", "b": "a"}), ports, rx, tx, ber)
    assert [(f.kind, f.subject, f.details["metric"]) for _, f in with_peers] == [
        ("optic-degrading", "a", "tx_power_dbm")]
    blind = _feed(DomDetector(), ports, rx, tx, ber)
    assert {f.subject for _, f in blind} == {"a", "b"}  # without the cable map, b looks bad too


def test_pre_fec_ber_near_the_kp4_limit_and_rx_below_the_low_warning() -> None:
    rx, tx, ber = _rounds(8, seed=5)
    ber[4:, 0, 3] = 0.2 * KP4_BER_LIMIT
    rx[4:, 1, 0] = -10.0
    found = _feed(DomDetector(), ("a", "b"), rx, tx, ber)
    kinds = {(f.kind, f.subject) for _, f in found}
    assert ("optic-degrading", "a") in kinds and ("optic-rx-low", "b") in kinds
    (ber_f,) = [f for _, f in found if f.subject == "a"]
    assert ber_f.details["pre_fec_ber"] == pytest.approx(0.2 * KP4_BER_LIMIT)
    assert "KP4" in ber_f.evidence[0]


def test_an_episode_is_reported_once_and_rearms_after_k_clean_readings() -> None:
    rx, tx, ber = _rounds(20, seed=6)
    rx[4:9, 0, 0] -= 3.0
    rx[14:, 0, 0] -= 3.0
    found = _feed(DomDetector(), ("a", "b"), rx, tx, ber)
    assert [i for i, _ in found] == [5, 15]


def test_records_and_arrays_give_the_same_findings() -> None:
    ports = ("x:eth1", "y:eth2")
    rx, tx, ber = _rounds(8, seed=7, ports=ports)
    rx[3:, 1, 3] -= 4.0
    arrays = [f for _, f in _feed(DomDetector(), ports, rx, tx, ber)]
    readings = [DomReading(p, lane, i * 60 * NS, 40.0, 3.3, 7.0, float(tx[i, j, lane]),
                           float(rx[i, j, lane]), float(ber[i, j, lane]))
                for i in range(8) for j, p in enumerate(ports) for lane in range(LANES)]
    assert DomDetector()(readings[::-1]) == arrays and arrays


def test_bad_thresholds_and_lanes_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="drop_db"):
        DomThresholds(drop_db=0)
    with pytest.raises(ConfigError, match="baseline_n"):
        DomThresholds(baseline_n=0)
    with pytest.raises(ConfigError, match="lane 9"):
        DomDetector()([DomReading("a", 9, 0, 40.0, 3.3, 7.0, 1.0, -2.0, 1e-8)])
    with pytest.raises(ConfigError, match="interval_s"):
        OpticsInstrument(interval_s=-1)


FAB = rail_optimized_fabric(16)
UPLINKS = sorted(p for p in FAB.peer_port if FAB.devices[port_device(p)].role == "leaf"
                 and FAB.devices[port_device(FAB.peer_port[p])].role == "spine")


@pytest.mark.parametrize("port", [UPLINKS[3], FAB.peer_port[UPLINKS[11]], "leaf-p0-r2-00:eth1"])
def test_the_degrading_port_is_found_and_its_peer_and_the_others_are_not(port: str) -> None:
    start = 30 * NS
    fault = Fault("optic-degrading", port, start, None, {"rate": 1.0, "accel": 6000})
    obs = OpticsInstrument().run(ScenarioSpec(FAB, [fault], 180.0, seed=2))
    assert {o.subject for o in obs} == {port}
    first = min(o.reported_ns for o in obs if o.kind == "optic-degrading")
    assert start < first <= start + 3 * 60 * NS  # within a few simulated minutes of the onset


def test_fault_free_hour_gives_nothing_and_runs_are_deterministic() -> None:
    inst = OpticsInstrument()
    assert inst.run(ScenarioSpec(FAB, [], 3600.0, seed=9)) == []
    assert inst.stats["rounds"] == 61 + 3 and inst.stats["ports"] == len(FAB.peer_port)
    fault = Fault("optic-degrading", UPLINKS[5], 0, None, {"accel": 6000})
    a = inst.run(ScenarioSpec(FAB, [fault], 300.0, seed=4))
    assert a == inst.run(ScenarioSpec(FAB, [fault], 300.0, seed=4)) and a
