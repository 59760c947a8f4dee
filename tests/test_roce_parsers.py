"""Parsers of RoCE / IB tool outputs, on the real samples of tests/data/roce (README names each source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricscope.model.errors import TraceFormatError
from fabricscope.roce.parsers import (
    detect_format,
    parse_iblinkinfo,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_lldpctl_json,
    parse_mlnx_qos,
    parse_perftest,
    parse_show_gids,
    parse_sysfs_gid,
    parse_sysfs_port,
    parse_text,
)

DATA = Path(__file__).parent / "data" / "roce"


def _t(name: str) -> str:
    return (DATA / name).read_text()


def test_ibstat_multi_port_roce_with_a_disabled_port() -> None:
    ports = parse_ibstat(_t("ibstat-roce-dgx-spark.txt"), source="s")
    assert [(p.device, p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("roceP2p1s0f0", "Active", "LinkUp", 200.0, "Ethernet"),
        ("roceP2p1s0f1", "Down", "Disabled", 40.0, "Ethernet"),
        ("rocep1s0f0", "Active", "LinkUp", 200.0, "Ethernet"),
    ]
    assert ports[0].port_guid == "0xfe4ceafffef94234"
    assert not any(p.truncated for p in ports)


def test_ibstat_infiniband_polling_and_edr() -> None:
    (p,) = parse_ibstat(_t("ibstat-ib-polling.txt"))
    assert (p.state, p.phys_state, p.rate_gbps, p.link_layer) == ("Down", "Polling", 10.0, "InfiniBand")
    (q,) = parse_ibstat(_t("ibstat-ib-edr.txt"))
    assert (q.state, q.rate_gbps, q.port_guid) == ("Active", 100.0, "0xec0d9a03003d677a")


def test_ibstat_truncated_output_is_flagged_on_the_cut_port_only() -> None:
    ports = parse_ibstat(_t("ibstat-roce-truncated.txt"))
    assert [p.device for p in ports] == ["mlx5_0", "mlx5_1", "mlx5_10"]
    assert [p.truncated for p in ports] == [False, False, True]
    assert ports[2].state == "Down" and ports[2].rate_gbps is None


def test_ibstat_bad_rate_names_file_and_line() -> None:
    text = _t("ibstat-ib-edr.txt").replace("Rate: 100", "Rate: fast")
    with pytest.raises(TraceFormatError) as e:
        parse_ibstat(text, source="host.txt")
    msg = str(e.value)
    assert msg.startswith("host.txt: line 11: Rate") and "'fast'" in msg and "\n" not in msg


def test_ibv_devinfo_mtu_state_and_truncated_device() -> None:
    ports, gids = parse_ibv_devinfo(_t("ibv_devinfo-port-down.txt"))
    assert (ports[0].device, ports[0].state, ports[0].active_mtu, ports[0].max_mtu) == (
        "mlx5_12", "Down", 1024, 4096)
    assert ports[1].device == "mlx5_13" and ports[1].truncated  # phys_port_cnt 1, no port block
    assert gids == ()
    (ok,), _ = parse_ibv_devinfo(_t("ibv_devinfo-roce.txt"))
    assert (ok.state, ok.active_mtu, ok.link_layer, ok.truncated) == ("Active", 4096, "Ethernet", False)


def test_ibv_devinfo_verbose_gid_lines_give_versions() -> None:
    # GID line layout of `ibv_devinfo -v` (rdma-core PR #682), as quoted in openucx/ucx#10317
    text = ("hca_id: mlx5_1\n\tphys_port_cnt: 1\n\t\tport:\t1\n\t\t\tstate:\tPORT_DOWN (1)\n"
            "\t\t\tactive_mtu:\t1024 (3)\n\t\t\tlink_layer:\tEthernet\n"
            "\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:3a7c:76ff:fe7c:ab4f, RoCE v1\n"
            "\t\t\tGID[  1]:\t\tfe80::3a7c:76ff:fe7c:ab4f, RoCE v2\n")
    _, gids = parse_ibv_devinfo(text)
    assert [(g.index, g.version) for g in gids] == [(0, "v1"), (1, "v2")]


def test_show_gids_tab_and_space_layouts() -> None:
    rows = parse_show_gids(_t("show_gids-macvlan-pod.txt"))
    assert len(rows) == 8
    r7 = next(g for g in rows if g.device == "mlx5_0" and g.index == 7)
    assert (r7.version, r7.ipv4, r7.netdev) == ("v2", "10.152.0.12", "net1")
    assert next(g for g in rows if g.index == 5).ipv4 is None
    bond = parse_show_gids(_t("show_gids-bond-vxlan.txt"))
    assert [(g.index, g.version, g.netdev) for g in bond if g.ipv4] == [
        (2, "v1", "b3.vxlan.30100"), (3, "v2", "b3.vxlan.30100"), (4, "v1", "bond1"),
        (5, "v2", "bond1")]
    assert parse_show_gids(_t("show_gids-empty.txt")) == ()


def test_iblinkinfo_lines_and_nominal_rate() -> None:
    links = parse_iblinkinfo(_t("iblinkinfo-edr.txt"))
    assert len(links) == 6
    me = next(ln for ln in links if ln.local_guid == "0xec0d9a03003d677a")
    assert (me.local_port, me.peer_lid, me.peer_port, me.peer_name) == (1, 2, 18, "MF0;SB7700:MSB7700/U1")
    assert me.rate_gbps == 100.0  # 4X 25.78125 Gbps signalling = EDR 100G
    sw = next(ln for ln in links if ln.local_guid is None and ln.local_port == 18)
    assert sw.peer_name == "n01 HCA-1"


def test_iblinkinfo_down_port_line() -> None:
    # iblinkinfo(8) layout of a port with no peer (as in infiniband-diags man page examples)
    text = ('Switch: 0x0002c9020046c588 Infiniscale-IV Mellanox Technologies:\n'
            '           2    5[  ] ==(                Down/ Polling)==>             [  ] "" ( )\n')
    (ln,) = parse_iblinkinfo(text)
    assert (ln.state, ln.phys_state, ln.peer_port, ln.local_guid) == ("Down", "Polling", None,
                                                                       "0x0002c9020046c588")
    assert ln.rate_gbps is None


def test_perftest_bw_units_are_converted_with_perftest_factors() -> None:
    gb = parse_perftest(_t("ib_write_bw-roce400-client.txt"))
    assert (gb.test, gb.role, gb.gid_index, gb.mtu, gb.link_type) == (
        "RDMA_Write BW Test", "client", 3, 4096, "Ethernet")
    assert gb.bw_rows[0].avg_gbps == pytest.approx(368.48)
    assert gb.local_gid and gb.local_gid.endswith("10:00:01:11")
    # MB/sec is 2**20 B/s (perftest format_factor 0x100000): 1000 MB/s = 8.388608 Gb/s
    mb = parse_perftest(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
                        " 65536      5000             1000.00             1000.00 \t\t   0.1\n")
    assert mb.bw_rows[0].avg_gbps == pytest.approx(8.388608)
    post = parse_perftest(_t("ib_write_bw-postlist-gbps.txt"))
    assert post.bw_rows[0].avg_gbps == pytest.approx(0.48) and post.gid_index == 2


def test_perftest_latency_table_ignores_cpu_frequency_warnings() -> None:
    run = parse_perftest(_t("ib_read_lat-roce-gid12.txt"))
    (row,) = run.lat_rows
    assert (row.bytes, row.t_min, row.t_typical, row.t_avg, row.p99, row.p999) == (
        2, 6.88, 7.04, 7.06, 7.38, 16.81)
    assert run.kind == "lat" and run.gid_index == 12 and run.mtu == 1024


def test_perftest_server_banner_and_truncated_row() -> None:
    run = parse_perftest(_t("ib_write_bw-server-truncated.txt"))
    assert run.role == "server" and run.gid_index == 3 and run.truncated and run.bw_rows == ()


@pytest.mark.parametrize(("name", "first"), [
    ("ib_write_bw-error-rtr.txt", "Failed to modify QP 122273 to RTR"),
    ("ib_send_lat-port-down.txt", "Port number 1 state is Down"),
    ("ib_send_lat-create-qp.txt", "Unable to create QP."),
])
def test_perftest_errors(name: str, first: str) -> None:
    run = parse_text(_t(name), source=name).runs[0]
    assert run.errors[0] == first and not run.bw_rows


def test_perftest_socket_error_line() -> None:
    # the client message of perftest when no server listens (perftest_communication.c)
    run = parse_text(" Unable to init the socket connection\n", source="x").runs[0]
    assert run.errors == ("Unable to init the socket connection",)


def test_mlnx_qos_trust_and_pfc() -> None:
    q = parse_mlnx_qos(_t("mlnx_qos-eth2.txt"), source="a")
    assert (q.interface, q.trust, q.pfc_priorities) == ("eth2", "dscp", (0, 2, 6, 7))
    q3 = parse_mlnx_qos(_t("mlnx_qos-eth2-prio3.txt"))
    assert (q3.trust, q3.pfc_priorities) == (None, (3,))
    with pytest.raises(TraceFormatError, match=r"^q: line 4: PFC"):
        parse_mlnx_qos("# mlnx_qos -i eth2\nPFC configuration:\npriority 0 1 2 3 4 5 6 7\n"
                       "enabled 0 0 0 1\n", source="q")


def test_lldpctl_json_dict_and_list_layouts() -> None:
    # lldpctl -f json layout (lldpd docs): interface keyed by name, chassis keyed by system name
    one = ('{"lldp": {"interface": {"ens1f0np0": {"chassis": {"leaf-01": {"id": {}}},'
           ' "port": {"id": {"type": "ifname", "value": "Ethernet12"}}}}}}')
    many = ('{"lldp": {"interface": [{"eth0": {"chassis": {"sw1": {}}, "port": {"id": '
            '{"value": "swp3"}}}}, {"eth1": {"chassis": {"sw2": {}}, "port": {"id": {"value": "swp4"}}}}]}}')
    assert [(n.interface, n.system, n.port) for n in parse_lldpctl_json(one)] == [
        ("ens1f0np0", "leaf-01", "Ethernet12")]
    assert [n.port for n in parse_lldpctl_json(many)] == ["swp3", "swp4"]
    assert detect_format(one) == "lldpctl"


def test_sysfs_values() -> None:
    p = parse_sysfs_port("mlx5_0", 1, {"state": "4: ACTIVE\n", "phys_state": "5: LinkUp\n",
                                       "rate": "200 Gb/sec (4X HDR)\n", "link_layer": "Ethernet\n"},
                         source="/sys/x")
    assert (p.state, p.phys_state, p.rate_gbps, p.link_layer, p.truncated) == (
        "Active", "LinkUp", 200.0, "Ethernet", False)
    g = parse_sysfs_gid("mlx5_0", 1, 3, "0000:0000:0000:0000:0000:ffff:0a98:000c\n", "RoCE v2\n",
                        netdev="ens1", source="s")
    assert g is not None and (g.version, g.ipv4) == ("v2", "10.152.0.12")
    assert parse_sysfs_gid("mlx5_0", 1, 9, "0000:0000:0000:0000:0000:0000:0000:0000", None,
                           netdev=None, source="s") is None
    with pytest.raises(TraceFormatError, match="rate"):
        parse_sysfs_port("mlx5_0", 1, {"rate": "fast"}, source="/sys/x")


def test_garbage_file_is_one_line_error_naming_file_and_line() -> None:
    with pytest.raises(TraceFormatError) as e:
        parse_text(_t("synthetic-garbage.txt"), source="junk.txt")
    assert str(e.value).startswith("junk.txt: line 1: not the output of") and "\n" not in str(e.value)


def test_unknown_lines_are_ignored() -> None:
    text = "some banner the tool never prints\n" + _t("ibstat-ib-edr.txt") + "\nrandom: trailer\n"
    assert parse_ibstat(text)[0].rate_gbps == 100.0


def test_every_sample_in_the_folder_has_a_known_format() -> None:
    # the README lists each file; every real sample parses (the garbage one is the exception)
    for f in sorted(DATA.glob("*.txt")):
        if f.name == "synthetic-garbage.txt":
            continue
        assert detect_format(f.read_text()) is not None, f.name
        parse_text(f.read_text(), source=f.name)
    readme = (DATA / "README.md").read_text()
    for f in sorted(DATA.rglob("*.txt")):
        assert f.name in readme, f"{f.name} not named in tests/data/roce/README.md"
