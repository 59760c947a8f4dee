"""RoCE checks on parsed real samples: each verdict, the fix command, Findings and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricscope.roce.checks import (
    CheckResult,
    Evidence,
    Expectations,
    check_roce,
    exit_code,
    findings,
    merge_ports,
)
from fabricscope.roce.parsers import (
    EcnState,
    IbPort,
    parse_iblinkinfo,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_mlnx_qos,
    parse_perftest,
    parse_show_gids,
)

DATA = Path(__file__).parent / "data" / "roce"


def _t(name: str) -> str:
    return (DATA / name).read_text()


def _by(results: list[CheckResult], name: str, subject: str | None = None) -> list[CheckResult]:
    return [r for r in results if r.name == name and (subject is None or r.subject == subject)]


def test_down_and_disabled_port_fail_with_kind_and_fix() -> None:
    res = check_roce(Evidence(ports=parse_ibstat(_t("ibstat-roce-dgx-spark.txt"))),
                     expect=Expectations(rate_gbps=200))
    (st,) = _by(res, "port-state", "roceP2p1s0f1")
    assert (st.status, st.expected, st.seen, st.kind) == ("fail", "Active", "Down", "roce-port-down")
    (ph,) = _by(res, "phys-state", "roceP2p1s0f1")
    assert ph.status == "fail" and "ip link set dev" in ph.fix
    # rate of a Down port is not judged (40 is what a dark port reports)
    assert _by(res, "rate", "roceP2p1s0f1")[0].status == "skip"
    assert {r.status for r in _by(res, "rate") if r.subject != "roceP2p1s0f1"} == {"pass"}


def test_polling_port_fix_points_at_the_cable() -> None:
    res = check_roce(Evidence(ports=parse_ibstat(_t("ibstat-ib-polling.txt"))),
                     expect=Expectations(link_layer="InfiniBand"))
    (ph,) = _by(res, "phys-state")
    assert ph.status == "fail" and "cable" in ph.fix
    assert _by(res, "link-layer")[0].status == "pass"


def test_rate_low_fails_and_higher_warns() -> None:
    ports = parse_ibstat(_t("ibstat-ib-edr.txt"))
    low = _by(check_roce(Evidence(ports=ports), expect=Expectations(rate_gbps=200,
                                                                   link_layer="InfiniBand")), "rate")[0]
    assert (low.status, low.kind, low.expected, low.seen) == ("fail", "roce-rate-low", "200 Gb/s", "100 Gb/s")
    hi = _by(check_roce(Evidence(ports=ports), expect=Expectations(rate_gbps=50)), "rate")[0]
    assert hi.status == "warn"
    # no expectation at all: skip, with what would give one
    none = _by(check_roce(Evidence(ports=ports)), "rate")[0]
    assert none.status == "skip" and "--expect-rate" in none.seen


def test_rate_from_inventory_when_no_flag() -> None:
    ports = parse_ibstat(_t("ibstat-ib-edr.txt"))
    r = _by(check_roce(Evidence(ports=ports), rate_of={"mlx5_0": 100.0},
                       nic_of={"mlx5_0": "n01/nic0"}), "rate")[0]
    assert (r.status, r.subject) == ("pass", "n01/nic0")


def test_infiniband_port_on_a_roce_fabric_warns() -> None:
    res = check_roce(Evidence(ports=parse_ibstat(_t("ibstat-ib-edr.txt"))))
    assert _by(res, "link-layer")[0].status == "warn"


def test_mtu_checks() -> None:
    ports, _ = parse_ibv_devinfo(_t("ibv_devinfo-port-down.txt"))
    run = parse_perftest(_t("ib_read_lat-roce-gid12.txt"), source="lat.txt")
    res = check_roce(Evidence(ports=ports, runs=(run,), netdev_mtu={"ens1": 1500, "ens2": 4200}))
    am = _by(res, "active-mtu", "mlx5_12")[0]
    assert (am.status, am.kind, am.seen) == ("fail", "roce-mtu", "1024")
    assert "mtu 4200" in am.fix
    assert _by(res, "perftest-mtu")[0].status == "fail"
    assert {r.subject: r.status for r in _by(res, "netdev-mtu")} == {"ens1": "fail", "ens2": "pass"}


def test_gid_at_the_index_used_must_be_v2() -> None:
    gids = parse_show_gids(_t("show_gids-bond-vxlan.txt"))
    ok = parse_perftest(_t("ib_write_bw-roce400-client.txt").replace("mlx5_0", "mlx5_bond_0"))
    bad = parse_perftest(_t("ib_write_bw-postlist-gbps.txt").replace("ib0", "mlx5_bond_0"))
    r_ok = _by(check_roce(Evidence(gids=gids, runs=(ok,))), "gid-v2")
    assert [(r.expected, r.status) for r in r_ok] == [("RoCE v2 GID at index 3", "pass")]
    r_bad = _by(check_roce(Evidence(gids=gids, runs=(bad,))), "gid-v2")[0]
    assert (r_bad.status, r_bad.kind) == ("fail", "roce-gid-mismatch")
    assert r_bad.seen.startswith("v1 ") and "-x 3" in r_bad.fix  # first v2 index with IPv4


def test_gid_table_without_any_v2_ipv4_fails() -> None:
    gids = tuple(g for g in parse_show_gids(_t("show_gids-macvlan-pod.txt")) if g.version == "v1")
    res = _by(check_roce(Evidence(gids=gids)), "gid-v2")
    assert {r.status for r in res} == {"fail"} and len(res) == 2


def test_gid_index_must_match_at_both_ends() -> None:
    srv = parse_perftest(_t("gid-mismatch/ib_write_bw.server.txt"), source="srv")
    cli = parse_perftest(_t("gid-mismatch/ib_write_bw.client.txt"), source="cli")
    (r,) = _by(check_roce(Evidence(runs=(srv, cli))), "gid-index-ends")
    assert (r.status, r.kind) == ("fail", "roce-gid-mismatch")
    assert "server 3" in r.seen and "client 1" in r.seen
    # the same pair with equal indices passes
    cli3 = parse_perftest(_t("gid-mismatch/ib_write_bw.client.txt").replace("GID index       : 1",
                                                                           "GID index       : 3"))
    assert _by(check_roce(Evidence(runs=(srv, cli3))), "gid-index-ends")[0].status == "pass"


def test_runs_of_different_tests_are_not_paired() -> None:
    a = parse_perftest(_t("ib_read_lat-roce-gid12.txt"), source="a")
    b = parse_perftest(_t("ib_read_lat-roce-gid2.txt"), source="b")
    (r,) = _by(check_roce(Evidence(runs=(a, b))), "gid-index-ends")
    assert r.status == "skip"  # 12 vs 2, but their GIDs show they are different tests


def test_bandwidth_against_line_rate() -> None:
    run = parse_perftest(_t("ib_write_bw-roce400-client.txt"))
    ok = _by(check_roce(Evidence(runs=(run,)), expect=Expectations(rate_gbps=400)), "perftest-bw")[0]
    assert ok.status == "pass" and ok.expected.startswith(">= 360 Gb/s")
    low = _by(check_roce(Evidence(runs=(run,)), expect=Expectations(rate_gbps=400, bw_fraction=0.95)),
              "perftest-bw")[0]
    assert (low.status, low.kind) == ("fail", "roce-bw-low")
    # more than the port can carry: the run is probably not this port's
    over = _by(check_roce(Evidence(runs=(run,)), expect=Expectations(rate_gbps=200)), "perftest-bw")[0]
    assert over.status == "warn"
    post = parse_perftest(_t("ib_write_bw-postlist-gbps.txt"))
    assert _by(check_roce(Evidence(runs=(post,)), expect=Expectations(rate_gbps=100)),
               "perftest-bw")[0].status == "fail"


def test_latency_against_expectation() -> None:
    run = parse_perftest(_t("ib_read_lat-roce-gid12.txt"))
    r = _by(check_roce(Evidence(runs=(run,))), "perftest-lat")[0]
    assert (r.status, r.kind) == ("fail", "roce-lat-high") and "7.04" in r.seen
    loose = _by(check_roce(Evidence(runs=(run,)), expect=Expectations(lat_us=5.0)), "perftest-lat")[0]
    assert loose.status == "pass"  # 7.04 <= 5 x 1.5


def test_perftest_errors_become_one_fail_per_run() -> None:
    run = parse_perftest(_t("ib_write_bw-error-rtr.txt"), source="x/ib_write_bw.txt")
    (r,) = _by(check_roce(Evidence(runs=(run,))), "perftest-error")
    assert r.status == "fail" and r.kind == "roce-perftest-error" and r.subject == "ib_write_bw.txt"
    assert r.seen.count("Failed to modify QP") == 2  # two QPs, duplicates folded


def test_pfc_trust_and_ecn() -> None:
    bad = parse_mlnx_qos(_t("mlnx_qos-eth2.txt"))
    good = parse_mlnx_qos(_t("mlnx_qos-eth2-prio3.txt"), interface="eth3")
    ecn = (EcnState("eth2", {3: False}, {3: True}),)
    res = check_roce(Evidence(qos=(bad, good), ecn=ecn))
    pfc = {r.subject: r for r in _by(res, "pfc")}
    assert pfc["eth2"].status == "fail" and pfc["eth2"].fix == "`mlnx_qos -i eth2 --pfc 0,0,0,1,0,0,0,0`"
    assert pfc["eth3"].status == "pass"
    assert {r.subject: r.status for r in _by(res, "trust")} == {"eth2": "pass", "eth3": "skip"}
    assert _by(res, "ecn-np")[0].status == "fail" and _by(res, "ecn-rp")[0].status == "pass"
    assert "roce_np/enable/3" in _by(res, "ecn-np")[0].fix
    # trust pcp is a fail with the command
    pcp = parse_mlnx_qos(_t("mlnx_qos-eth2.txt").replace("state: dscp", "state: pcp"))
    t = _by(check_roce(Evidence(qos=(pcp,))), "trust")[0]
    assert t.status == "fail" and t.fix == "`mlnx_qos -i eth2 --trust dscp`"


def test_neighbour_against_inventory_peer_port() -> None:
    ports = parse_ibstat(_t("ibstat-ib-edr.txt"))
    links = parse_iblinkinfo(_t("iblinkinfo-edr.txt"))
    ev = Evidence(ports=ports, links=links)
    ok = _by(check_roce(ev, peer_of={"mlx5_0": "SB7700:eth18"}), "neighbour")[0]
    assert ok.status == "pass" and "port 18" in ok.seen
    bad = _by(check_roce(ev, peer_of={"mlx5_0": "SB7700:eth17"}), "neighbour")[0]
    assert (bad.status, bad.kind) == ("fail", "roce-neighbour-mismatch")
    other = _by(check_roce(ev, peer_of={"mlx5_0": "leaf-000:eth18"}), "neighbour")[0]
    assert other.status == "fail"
    assert _by(check_roce(ev), "neighbour")[0].status == "skip"  # no inventory


def test_merge_ports_combines_sources() -> None:
    a = IbPort("mlx5_0", 1, state="Active", rate_gbps=200.0, source="ibstat")
    b = IbPort("mlx5_0", 1, state="Down", active_mtu=4096, source="ibv_devinfo")
    (m,) = merge_ports([a, b])
    assert (m.state, m.rate_gbps, m.active_mtu) == ("Active", 200.0, 4096)


def test_findings_and_exit_codes() -> None:
    res = check_roce(Evidence(ports=parse_ibstat(_t("ibstat-roce-dgx-spark.txt"))),
                     expect=Expectations(rate_gbps=200), nic_of={"roceP2p1s0f1": "host0001/nic1"})
    f = findings(res, at_ns=123, host="host0001")
    assert {x.kind for x in f} == {"roce-port-down"} and {x.subject for x in f} == {"host0001/nic1"}
    assert all(x.window == (123, 123) and x.score == 1.0 and x.action for x in f)
    assert exit_code(res) == 1
    assert exit_code([r for r in res if r.status != "fail"]) == 0
    assert exit_code([CheckResult("x", "-", "skip", "a", "b")]) == 2
    assert exit_code([]) == 2


def test_no_data_is_all_skip() -> None:
    res = check_roce(Evidence(skips=(("ibstat", "ibstat not found on PATH"),)))
    assert res and {r.status for r in res} == {"skip"} and exit_code(res) == 2


@pytest.mark.parametrize("kind", ["roce-bw-low", "roce-lat-high"])
def test_single_perftest_findings_score_below_certainty(kind: str) -> None:
    r = CheckResult("perftest", "mlx5_0", "fail", "a", "b", kind=kind)
    assert findings([r], at_ns=0)[0].score < 1.0


def test_roce_neighbour_from_lldp_on_the_devices_netdev() -> None:
    from fabricscope.roce.parsers import parse_lldpctl_json

    # lldpctl -f json layout (lldpd documentation); the netdev is tied to the device by show_gids
    gids = parse_show_gids(_t("show_gids-macvlan-pod.txt"))
    lldp = parse_lldpctl_json('{"lldp": {"interface": {"net1": {"chassis": {"leaf-01": {}},'
                              ' "port": {"id": {"type": "ifname", "value": "eth3"}}}}}}')
    ev = Evidence(gids=gids, lldp=lldp)
    ok = _by(check_roce(ev, peer_of={"mlx5_0": "leaf-01:eth3"}), "neighbour")
    assert [r.status for r in ok] == ["pass"]
    bad = _by(check_roce(ev, peer_of={"mlx5_0": "leaf-02:eth3", "mlx5_1": "leaf-01:eth4"}), "neighbour")
    assert {r.subject: r.status for r in bad} == {"mlx5_0": "fail", "mlx5_1": "skip"}


def test_parsers_and_checks_are_pure() -> None:
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "fabricscope" / "roce"
    for mod in ("parsers.py", "checks.py"):
        tree = ast.parse((src / mod).read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not names & {"subprocess", "socket", "os", "shutil", "pathlib", "duckdb"}, mod
