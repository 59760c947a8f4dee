"""Pure pipeline: processors, detectors on twin output, config validation, and the DuckDB store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.store.telemetry import TelemetryStore
from fabricscope.telemetry.config import load_config, parse_config, parse_duration_ns
from fabricscope.telemetry.detectors import (
    DetectorSet,
    ErrorIncreaseDetector,
    FlapDetector,
    MicroBurstDetector,
    PauseStormDetector,
    default_detectors,
)
from fabricscope.telemetry.paths import parse_path, schema_name, tags_of
from fabricscope.telemetry.processors import (
    Aggregate,
    Delta,
    Downsample,
    Filter,
    Pipeline,
    Rate,
    Rename,
)
from fabricscope.twin.state import NS, Twin, background_load

OCT = "/interfaces/interface/state/counters/in-octets"


def ev(name: str, ts_s: float, value: object, target: str = "leaf-1", **tags: str) -> TelemetryEvent:
    return TelemetryEvent(name, int(ts_s * NS), target, tags or {"interface_name": "eth1"}, value)  # type: ignore[arg-type]


def test_rate_and_delta_handle_resets() -> None:
    evs = [ev(OCT, 0, 100), ev(OCT, 1, 300), ev(OCT, 3, 700), ev(OCT, 4, 50)]  # counter cleared at t=4
    assert [e.value for e in Delta()(evs)] == [200, 400, 50]
    assert [e.value for e in Rate()(evs)] == [200.0, 200.0, 50.0]
    # state carries across batches
    r = Rate()
    assert r(evs[:2])[0].value == 200.0 and r(evs[2:3])[0].value == 200.0
    # non-numeric and unselected pass through
    s = ev("/interfaces/interface/state/oper-status", 1, "UP")
    assert Rate(names=["*octets"])([s]) == [s]


def test_filter_rename_downsample_aggregate() -> None:
    evs = [ev(OCT, 0, 1), ev(OCT, 0, 2, interface_name="eth2"), ev("/x/in-discards", 0, 3)]
    assert len(Filter(action="drop", names=["*discards"])(evs)) == 2
    assert [e.tags["interface_name"] for e in Filter(tags={"interface_name": "eth2"})(evs)] == ["eth2"]
    assert Rename(pattern=r"^/interfaces/interface/state/counters/", replacement="if.")(evs[:1])[0].name == "if.in-octets"
    ds = Downsample(window_ns=10 * NS, funcs=["min", "max", "mean", "last"])
    out = ds([ev(OCT, t, float(t)) for t in range(0, 25)])
    w0 = {e.tags["agg"]: e.value for e in out if e.ts_ns == 10 * NS}
    assert w0 == {"min": 0.0, "max": 9.0, "mean": 4.5, "last": 9.0}
    assert {e.ts_ns for e in out} == {10 * NS, 20 * NS}
    assert {e.ts_ns for e in ds.flush()} == {30 * NS}
    agg = Aggregate(by="rail", group_of={"leaf-1": "0", "leaf-2": "0", "leaf-3": "1"})
    got = agg([ev(OCT, 1, 5, "leaf-1"), ev(OCT, 1, 7, "leaf-2"), ev(OCT, 1, 1, "leaf-3")])
    assert sorted((e.target, e.value) for e in got) == [("rail:0", 12.0), ("rail:1", 1.0)]
    assert Pipeline([Filter(names=[OCT]), Delta()])(evs) == []  # first sample of a counter has no delta


def _twin_events(faults: list[Fault], seconds: int, step_ns: int = NS) -> list[list[TelemetryEvent]]:
    """Sample every leaf of every switch each step: what a 1 s SAMPLE subscription sees."""
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
    clock = SimClock()
    tw = Twin(fab, clock=clock, faults=FaultSchedule.of(faults), load_bps=background_load(fab, utilization=0.3), rng=5)
    parsed = {t: [(lf, parse_path(lf.path)) for lf in tw.leaves(t)] for t in tw.targets()}
    batches = []
    for _ in range(seconds * NS // step_ns):
        clock.advance(step_ns)
        tw.sync()
        batch = []
        for t, lv in parsed.items():
            for (_lf, p), v in zip(lv, tw.read([lf for lf, _ in lv]), strict=True):
                batch.append(TelemetryEvent(schema_name(p), clock.now_ns(), t, tags_of(p), v))
        batches.append(batch)
    return batches


def test_detectors_find_each_injected_fault_and_nothing_else() -> None:
    faults = [
        Fault("micro-burst", "leaf-000:eth3", int(2.3 * NS), int(2.3 * NS) + 5_000_000, {"depth_bytes": 3e6}),
        Fault("gray-loss", "leaf-001:eth3->spine-00:eth2", 4 * NS, None, {"loss": 0.001}),
        Fault("link-flap", "leaf-001:eth4|spine-01:eth2", 3 * NS, 7 * NS, {"period_ns": 2 * NS}),
        Fault("pfc-storm", "spine-01:eth1", 5 * NS, 8 * NS, {"rate": 50_000}),
    ]
    det = default_detectors()
    found: list[Finding] = []
    for b in _twin_events(faults, 10):
        found += det(b)
    kinds = {(f.kind, f.subject) for f in found}
    assert ("micro-burst", "leaf-000:eth3") in kinds
    assert ("error-counter-increase", "spine-00:eth2") in kinds  # FCS at the receiving end
    assert ("link-flap", "leaf-001:eth4") in kinds and ("link-flap", "spine-01:eth2") in kinds
    assert ("pause-storm", "spine-01:eth1") in kinds
    # the pause storm pauses leaf-000:eth4's egress (its peer): evidence there is expected too
    expected_ports = {"leaf-000:eth3", "spine-00:eth2", "leaf-001:eth4", "spine-01:eth2", "spine-01:eth1",
                      "leaf-000:eth4", "leaf-001:eth3"}
    assert {f.subject for f in found} <= expected_ports, kinds
    burst = next(f for f in found if f.kind == "micro-burst" and f.subject == "leaf-000:eth3")
    assert 2.3 * NS < burst.window[0] <= 3 * NS  # found at the first sample after the burst
    assert all(0 <= f.score <= 1 for f in found)


def test_detector_set_prefilter_keeps_what_each_detector_needs() -> None:
    faults = [Fault("micro-burst", "leaf-000:eth3", int(2.3 * NS), int(2.3 * NS) + 5_000_000, {"depth_bytes": 3e6})]
    batches = _twin_events(faults, 4)
    seen: list[int] = []

    def custom(events: Sequence[TelemetryEvent]) -> list[Finding]:  # a user's own: no _names
        seen.append(len(events))
        return []

    # the set's one-pass prefilter finds exactly what each detector finds on the whole stream
    each = [MicroBurstDetector(), ErrorIncreaseDetector(), FlapDetector(), PauseStormDetector()]
    alone = [f for b in batches for d in each for f in d(b)]
    together = [f for b in batches for f in default_detectors()(b)]
    assert sorted(map(repr, alone)) == sorted(map(repr, together)) and together
    mixed = DetectorSet([custom, MicroBurstDetector()])
    for b in batches:
        mixed(b)
    assert seen == [len(b) for b in batches]


def test_no_findings_on_a_healthy_fabric() -> None:
    det = default_detectors()
    found = [f for b in _twin_events([], 8) for f in det(b)]
    assert found == []


def test_config_errors_name_file_field_and_value(tmp_path: Path) -> None:
    good = {"targets": {"t": {"address": "127.0.0.1:9339"}}, "subscriptions": {"s": {"paths": ["/interfaces"]}}}
    cfg = parse_config(good, source="c.yaml")
    assert cfg.targets[0].names == ("t",) and cfg.subscriptions["s"].sample_interval_ns == NS
    cases = [
        ({"subscriptions": {"s": {"paths": ["/interfaces"], "mode": "streem"}}}, "subscriptions.s.mode", "'streem'"),
        ({"subscriptions": {"s": {"paths": ["/a[b"]}}}, "subscriptions.s.paths[0]", "'/a[b'"),
        ({"subscriptions": {"s": {"paths": ["/a"], "sample-interval": "fast"}}}, "sample-interval", "'fast'"),
        ({"targets": {"t": {"address": "localhost"}}}, "targets.t.address", "'localhost'"),
        ({"targets": {"t": {"address": "127.0.0.1:1", "tls": {"ca": "x"}}}}, "targets.t.tls.ca", "unknown field"),
        ({"processors": [{"type": "ratee"}]}, "processors[0].type", "'ratee'"),
        ({"processors": [{"type": "downsample", "window": "0s"}]}, "downsample.window", "0"),
        ({"sinks": [{"type": "kafka"}]}, "sinks[0].type", "'kafka'"),
        ({"detectors": {"micro-burst": {"bogus": 1}}}, "micro-burst", "bogus"),
        ({"detectors": {"micro-burst": {"watermark-bytes": "abc"}}}, "micro-burst.watermark-bytes", "'abc'"),
        ({"detectors": {"pause-storm": {"rate": -5}}}, "pause-storm.rate", "-5"),
        ({"buffer": {"max-events": -5}}, "buffer.max-events", "-5"),
    ]
    for patch, field, value in cases:
        with pytest.raises(ConfigError) as ei:
            parse_config({**good, **patch}, source="c.yaml")
        msg = str(ei.value)
        assert "c.yaml" in msg and field in msg and value in msg, msg
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        load_config(bad)
    assert parse_duration_ns("250ms") == 250_000_000 and parse_duration_ns(2) == 2 * NS


def test_duckdb_store_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    st = TelemetryStore(db)
    evs = [ev(OCT, i, i * 10) for i in range(1000)] + [ev("/interfaces/interface/state/oper-status", 1, "UP")]
    st.write_events(evs)
    f = Finding("micro-burst", "leaf-1:eth1", 0.8, (1, 2), ("watermark 3e6",), "look", {"watermark_bytes": 3e6})
    st.write_findings([f])
    st.close()
    st2 = TelemetryStore(db)
    assert st2.count() == 1001 and st2.findings() == [f]
    row = st2.con.execute("SELECT sum(value_num), count(value_str), any_value(tags) FROM telemetry").fetchone()
    assert row is not None and row[0] == sum(i * 10 for i in range(1000)) and row[1] == 1
    assert json.loads(row[2]) == {"interface_name": "eth1"}


def test_one_link_down_is_not_a_flap_but_two_transitions_are() -> None:
    from fabricscope.telemetry.detectors import FlapDetector

    oper = "/interfaces/interface/state/oper-status"
    car = "/interfaces/interface/state/counters/carrier-transitions"
    det = FlapDetector()
    # one transition seen by both leaves of the same port: still one transition, so no flap;
    # the transition to down is reported as such (a link that stays down is never a flap)
    got = det([ev(oper, 0, "UP"), ev(car, 0, 4), ev(oper, 1, "DOWN"), ev(car, 1, 5)])
    assert [(f.kind, f.subject, f.window) for f in got] == [("link-down", "leaf-1:eth1", (NS, NS))]
    assert det.down_ports() == ["leaf-1:eth1"]
    got = det([ev(oper, 2, "UP"), ev(car, 2, 6)])
    assert [(f.kind, f.subject) for f in got] == [("link-flap", "leaf-1:eth1")]
    assert got[0].window == (1 * NS, 2 * NS)
    assert det.down_ports() == []
    # down again: a new link-down, once (a repeated DOWN sample is no new transition)
    got = det([ev(oper, 3, "DOWN"), ev(oper, 4, "DOWN")])
    assert [f.kind for f in got].count("link-down") == 1


def test_prometheus_sink_serves_exposition_on_loopback() -> None:
    import urllib.request

    from fabricscope.telemetry.sinks import PrometheusSink

    sink = PrometheusSink("127.0.0.1:0")
    try:
        sink.write([ev(OCT, 1, 10), ev(OCT, 2, 25), ev("/interfaces/interface/state/oper-status", 2, "UP")], [])
        body = urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=10).read().decode()
    finally:
        sink.close()
    assert sink.host == "127.0.0.1"
    # counters are Prometheus counters (tests/test_prometheus_sink.py covers types and bounds)
    assert "# TYPE gnmi_interfaces_interface_state_counters_in_octets_total counter" in body
    assert 'gnmi_interfaces_interface_state_counters_in_octets_total{interface_name="eth1",target="leaf-1"} 25.0' in body
    assert "oper_status" not in body  # strings are not Prometheus samples


def test_jsonl_sink_writes_events_and_findings(tmp_path: Path) -> None:
    from fabricscope.telemetry.sinks import JsonLinesSink

    p = tmp_path / "out.jsonl"
    sink = JsonLinesSink(str(p))
    sink.write([ev(OCT, 1, 10)], [Finding("link-flap", "leaf-1:eth1", 0.7, (1, 2))])
    sink.close()
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    assert rows[0] == {"ts_ns": NS, "target": "leaf-1", "name": OCT, "tags": {"interface_name": "eth1"}, "value": 10}
    assert rows[1]["finding"] == "link-flap" and rows[1]["subject"] == "leaf-1:eth1"


def test_aggregate_per_rail_from_the_inventory(tmp_path: Path) -> None:
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.fabric.io import write_fabric
    from fabricscope.telemetry.collector import Collector
    from fabricscope.telemetry.processors import group_labels

    fab = rail_optimized_fabric(servers=4)
    rails = group_labels(fab.switches, "rail")
    assert rails["leaf-p0-r3-00"] == "3" and "spine-p0-00" not in rails
    inv = tmp_path / "fabric.yaml"
    write_fabric(fab, inv)
    base = {"targets": {"t": {"address": "127.0.0.1:1"}}, "subscriptions": {"s": {"paths": ["/a"]}},
            "processors": [{"type": "aggregate", "by": "rail", "names": [OCT]}]}
    with pytest.raises(ConfigError, match=r"processors\[0\]\.groups"):
        parse_config(base, source="c.yaml")
    col = Collector(parse_config({**base, "inventory": str(inv)}, source="c.yaml"))
    got = col.pipeline([ev(OCT, 1, 5, "leaf-p0-r3-00"), ev(OCT, 1, 7, "leaf-p0-r3-00", interface_name="eth2"),
                        ev(OCT, 1, 1, "leaf-p0-r0-00")])
    assert sorted((e.target, e.value) for e in got) == [("rail:0", 1.0), ("rail:3", 12.0)]


def test_suppressed_counter_rate_is_over_the_last_interval_not_the_silence() -> None:
    """Under suppress-redundant sampling an idle counter is sent once, then nothing until it
    changes: a pause storm that starts in the last 10 s interval is 200,000 frames/s over
    that interval, not 50,000/s over the 40 s of silence."""
    name = "/interfaces/interface/ethernet/state/counters/out-mac-pause-frames"
    evs = [ev(name, 0, 0.0), ev(name, 40, 2e6)]  # nothing sent at 10, 20, 30 s: unchanged
    plain = DetectorSet([PauseStormDetector()])
    (f,) = plain(evs)
    assert f.details["pause_per_s"] == pytest.approx(5e4)  # every sample sent: 40 s of it
    supp = DetectorSet([PauseStormDetector()])
    supp.suppressed_sampling(10 * NS)
    (g,) = supp(evs)
    assert g.details["pause_per_s"] == pytest.approx(2e5)


def test_collector_tells_its_detectors_when_sampling_suppresses_redundant_values() -> None:
    from fabricscope.telemetry.collector import Collector

    def col(**sub: object) -> Collector:
        cfg = {"targets": {"t": {"address": "127.0.0.1:1"}},
               "subscriptions": {"s": {"paths": ["/a"], "sample-interval": "10s", **sub}},
               "detectors": {"pause-storm": {}}}
        return Collector(parse_config(cfg, source="c.yaml"), sinks=[])

    name = "/interfaces/interface/ethernet/state/counters/out-mac-pause-frames"
    evs = [ev(name, 0, 0.0), ev(name, 40, 2e6)]  # silent 10-30 s: unchanged, not sent
    (f,) = col(**{"suppress-redundant": True}).detectors(evs)
    assert f.details["pause_per_s"] == pytest.approx(2e5)
    (g,) = col().detectors(evs)  # every sample sent: the 40 s gap is real
    assert g.details["pause_per_s"] == pytest.approx(5e4)


def test_per_queue_counters_of_one_port_are_separate_series() -> None:
    """A port reports ECN marks per queue: an idle queue 0 beside a marking queue 3 must not
    read as a counter reset of queue 3 at every sample (it did: no ECN rate was ever seen)."""
    name = "/fabricscope/qos/interfaces/interface/queues/queue/state/ecn-marked-pkts"
    det = MicroBurstDetector(ecn_rate=500.0)
    found: list[Finding] = []
    for s in range(4):
        found += det([TelemetryEvent(name, s * NS, "leaf-1", {"interface_interface-id": "eth1", "queue_name": q}, v)
                      for q, v in (("0", 0), ("3", 2000 * s))])
    assert [(f.kind, f.subject) for f in found] == [("micro-burst", "leaf-1:eth1")]
    assert found[0].details["ecn_marks_per_s"] == 2000.0
