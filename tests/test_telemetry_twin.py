"""The twin's device state: counters follow the load, and each fault kind leaves its signature."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.twin.state import NS, Twin, TwinConfig, background_load

FAB = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
UP = "leaf-000:eth3->spine-00:eth1"  # a leaf uplink
CABLE = "leaf-000:eth3|spine-00:eth1"


def _twin(faults: list[Fault] = (), load: float = 0.3, seed: int = 7, **cfg: object) -> tuple[Twin, SimClock]:  # type: ignore[assignment]
    clock = SimClock()
    tw = Twin(FAB, clock=clock, faults=FaultSchedule.of(faults),
              load_bps=background_load(FAB, utilization=load, seed=1), rng=seed,
              config=TwinConfig(**cfg))  # type: ignore[arg-type]
    return tw, clock


def _val(tw: Twin, target: str, suffix: str) -> int | float | str:
    lv = [lf for lf in tw.leaves(target) if lf.path.endswith(suffix)]
    assert len(lv) == 1, (suffix, [lf.path for lf in lv])
    return tw.read(lv)[0]


def _run(tw: Twin, clock: SimClock, seconds: float, step_s: float = 1.0) -> None:
    for _ in range(round(seconds / step_s)):
        clock.advance(int(step_s * NS))
        tw.sync()


def test_counters_follow_the_offered_load() -> None:
    tw, clock = _twin(noise=0.01)
    e = FAB.edge_index(UP)
    steps = 20
    _run(tw, clock, steps)
    out = _val(tw, "leaf-000", "interface[name=eth3]/state/counters/out-octets")
    peer_in = _val(tw, "spine-00", "interface[name=eth1]/state/counters/in-octets")
    expected = tw._load[e] * steps
    # per-step noise is N(1, 0.01); the sum of 20 steps has relative sd 0.01/sqrt(20):
    # 5 sigma keeps a false failure below 1e-6.
    assert abs(out / expected - 1) < 5 * 0.01 / math.sqrt(steps)  # type: ignore[operator]
    assert out == peer_in  # no loss: what one end sends the other receives
    assert _val(tw, "leaf-000", "interface[name=eth3]/state/oper-status") == "UP"


def test_same_seed_same_state_and_step_size_does_not_change_totals() -> None:
    a, ca = _twin(noise=0.0)
    b, cb = _twin(noise=0.0)
    _run(a, ca, 6, 1.0)
    _run(b, cb, 6, 0.25)
    leaf = "interface[name=eth3]/state/counters/out-octets"
    # noise-free counters integrate the same whatever the step
    assert abs(_val(a, "leaf-000", leaf) - _val(b, "leaf-000", leaf)) <= 2  # type: ignore[operator]
    c, cc = _twin(noise=0.01)
    d, cd = _twin(noise=0.01)
    _run(c, cc, 3)
    _run(d, cd, 3)
    assert [c.read(c.leaves(t)) for t in c.targets()] == [d.read(d.leaves(t)) for t in d.targets()]


def test_gray_loss_raises_fcs_errors_at_the_receiver() -> None:
    tw, clock = _twin([Fault("gray-loss", UP, 0, None, {"loss": 0.02})], noise=0.0)
    _run(tw, clock, 5)
    sent = _val(tw, "leaf-000", "interface[name=eth3]/state/counters/out-pkts")
    fcs = _val(tw, "spine-00", "interface[name=eth1]/state/counters/in-fcs-errors")
    crc = _val(tw, "spine-00", "interface[name=eth1]/ethernet/state/counters/in-crc-errors")
    assert fcs == crc and abs(fcs / sent - 0.02) < 1e-3  # type: ignore[operator]
    # the other direction of the cable is clean
    assert _val(tw, "leaf-000", "interface[name=eth3]/state/counters/in-fcs-errors") == 0


def test_gray_loss_as_discards() -> None:
    tw, clock = _twin([Fault("gray-loss", UP, 0, None, {"loss": 0.01, "fcs": 0})], noise=0.0)
    _run(tw, clock, 3)
    assert _val(tw, "leaf-000", "interface[name=eth3]/state/counters/out-discards") > 0  # type: ignore[operator]
    assert _val(tw, "spine-00", "interface[name=eth1]/state/counters/in-fcs-errors") == 0


def test_congestion_builds_a_standing_queue_marks_ecn_and_drops_the_excess() -> None:
    tw, clock = _twin([Fault("congestion", UP, 2 * NS, 6 * NS, {"load": 1.0})])
    q = "queue[name=3]/state"
    _run(tw, clock, 2)
    ecn0 = _val(tw, "leaf-000", f"interface[interface-id=eth3]/queues/{q}/ecn-marked-pkts")
    _run(tw, clock, 3)
    depth = _val(tw, "leaf-000", f"interface[interface-id=eth3]/queues/{q}/depth-bytes")
    ecn1 = _val(tw, "leaf-000", f"interface[interface-id=eth3]/queues/{q}/ecn-marked-pkts")
    cfg = tw.cfg
    assert cfg.kmin_bytes <= depth <= cfg.kmax_bytes  # type: ignore[operator]
    assert ecn1 - ecn0 > 1000  # type: ignore[operator]
    assert _val(tw, "leaf-000", "interface[name=eth3]/state/counters/out-discards") > 0  # type: ignore[operator]
    _run(tw, clock, 3)
    assert _val(tw, "leaf-000", f"interface[interface-id=eth3]/queues/{q}/depth-bytes") < cfg.kmin_bytes  # type: ignore[operator]


@pytest.mark.parametrize("step_s", [1.0, 0.1])
def test_a_2ms_micro_burst_shows_in_the_watermark_whatever_the_step(step_s: float) -> None:
    burst = Fault("micro-burst", "leaf-000:eth3", int(3.5 * NS), int(3.5 * NS) + 2_000_000, {"depth_bytes": 4e6})
    tw, clock = _twin([burst])
    wm = "interface[interface-id=eth3]/queues/queue[name=3]/state/watermark-bytes"
    seen = []
    for _ in range(round(7 / step_s)):
        clock.advance(int(step_s * NS))
        tw.sync()
        seen.append((clock.now_ns() / NS, _val(tw, "leaf-000", wm)))
    high = [t for t, v in seen if v >= 4e6]  # type: ignore[operator]
    # visible from the burst to the end of the next watermark period, then gone
    first_after = min(t for t, _ in seen if t > 3.5)
    assert min(high) == first_after
    assert max(high) <= 5.0 + 1e-9
    assert all(v < 1e6 for t, v in seen if t > 5.0)  # type: ignore[operator]


def test_link_flap_toggles_oper_status_and_counts_transitions() -> None:
    tw, clock = _twin([Fault("link-flap", CABLE, 2 * NS, 6 * NS, {"period_ns": 1 * NS})])
    states = []
    for _ in range(16):
        clock.advance(NS // 4)
        tw.sync()
        states.append(_val(tw, "leaf-000", "interface[name=eth3]/state/oper-status"))
    # 0.25 s steps over 4 s: down in the first half of each 1 s period between t=2 and t=6
    assert states[:7] == ["UP"] * 7
    assert states[7:9] == ["DOWN", "DOWN"] and states[9:11] == ["UP", "UP"]
    _run(tw, clock, 3)
    trans = _val(tw, "spine-00", "interface[name=eth1]/state/counters/carrier-transitions")
    assert trans == 8  # 4 periods x (down + up)


def test_pfc_storm_pauses_the_peer() -> None:
    tw, clock = _twin([Fault("pfc-storm", "spine-00:eth1", 0, None, {"rate": 20000})])
    _run(tw, clock, 4)
    sent = _val(tw, "spine-00", "interface[name=eth1]/ethernet/state/counters/out-mac-pause-frames")
    got = _val(tw, "leaf-000", "interface[name=eth3]/pfc/priority[id=3]/state/in-pause-frames")
    assert sent == got == 80000
    # leaf-000 -> spine-00 is paused 90 % of the time: it carries at most 10 % of line rate.
    # Per-step noise N(1, 0.01) over 4 steps: relative sd 0.005, so 4 sd = 2 %.
    out = _val(tw, "leaf-000", "interface[name=eth3]/state/counters/out-octets")
    e = FAB.edge_index(UP)
    carried = min(tw._load[e], 0.1 * FAB.index.capacity_bps[e] / 8)
    assert carried < tw._load[e]
    assert out == pytest.approx(carried * 4, rel=0.02)


def test_degrading_optic_drifts_readings() -> None:
    tw, clock = _twin([Fault("optic-degrading", "leaf-000:eth3", 0, None, {"rate": 1.0, "accel": 86400.0})])
    clock.advance(NS // 100)
    tw.sync()
    rx0 = tw.dom("leaf-000:eth3")[0].rx_power_dbm
    _run(tw, clock, 4)  # accel 86400: 4 s = 4 days at 1 dB/day
    d = tw.dom("leaf-000:eth3")
    assert rx0 - d[0].rx_power_dbm == pytest.approx(4.0, abs=0.3)  # jitter sd 0.02 dB
    ber = _val(tw, "leaf-000", "component[name=eth3]/transceiver/state/pre-fec-ber/instant")
    assert isinstance(ber, float) and ber > 1e-7
    assert len(d) == tw.cfg.lanes


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        Twin(FAB, clock=SimClock(), load_bps=np.zeros(3))
    with pytest.raises(ConfigError, match="kmax_bytes"):
        TwinConfig(kmin_bytes=10, kmax_bytes=5)
    with pytest.raises(ConfigError, match="utilization"):
        background_load(FAB, utilization=2.0)
    with pytest.raises(KeyError):
        _twin()[0].leaves("nope")
    # a fault the twin models must name a port/link of this fabric (else it would do nothing)
    with pytest.raises(ConfigError, match=r"micro-burst: subject: .*'leaf-999:eth3'"):
        Twin(FAB, clock=SimClock(), faults=FaultSchedule.of([Fault("micro-burst", "leaf-999:eth3", 0, NS)]))
    with pytest.raises(ConfigError, match=r"pfc-storm: subject: no such port 'leaf-000:eth1->spine-00:eth1'"):
        _twin()[0].set_faults(FaultSchedule.of([Fault("pfc-storm", "leaf-000:eth1->spine-00:eth1", 0, NS)]))
    # kinds of other capabilities (a slow GPU rank) are not the twin's business
    Twin(FAB, clock=SimClock(), faults=FaultSchedule.of([Fault("slow-gpu", "rank7", 0, NS)]))


def test_trimming_switch_counts_trimmed_packets_instead_of_discards() -> None:
    tw, clock = _twin([Fault("congestion", UP, 0, None, {"load": 1.0})], trimming=True)
    _run(tw, clock, 3)
    q = "interface[interface-id=eth3]/queues/queue[name=3]/state"
    assert _val(tw, "leaf-000", f"{q}/trimmed-pkts") > 0  # type: ignore[operator]
    assert _val(tw, "leaf-000", "interface[name=eth3]/state/counters/out-discards") == 0


def test_utilization_from_the_flow_engine_drives_the_counters() -> None:
    from fabricscope.sim.engine import simulate
    from fabricscope.sim.workload.traffic import permutation

    res = simulate(FAB, permutation(FAB, 64e6, seed=1))
    assert res.utilization is not None
    util = res.utilization.mean_utilization()
    tw, clock = _twin(noise=0.0)
    tw.set_utilization(util)
    _run(tw, clock, 2)
    busy = int(np.argmax(util))
    port = FAB.index.from_port[busy]
    dev, ifname = port.rsplit(":", 1)
    out = _val(tw, dev, f"interface[name={ifname}]/state/counters/out-octets")
    # the busiest link's counter grows at the engine's utilization x line rate
    assert out == pytest.approx(util[busy] * FAB.index.capacity_bps[busy] / 8 * 2, rel=1e-6)
    with pytest.raises(ConfigError):
        tw.set_utilization([0.1])
