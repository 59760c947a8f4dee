"""The runner: fixture /sys trees and fake tools on a temporary PATH.

This machine has no RDMA hardware and none of the tools (ibstat, ibv_devinfo, show_gids,
iblinkinfo, mlnx_qos). The fake tools below are shell scripts that print the real sample
outputs of tests/data/roce; they stand in for the hardware tools so that discovery on PATH,
the subprocess call, timeouts and the skip reasons are tested for real.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.roce.checks import check_roce, exit_code
from fabricscope.roce.runner import collect_live, collect_saved, read_sysfs

DATA = Path(__file__).parent / "data" / "roce"


def _w(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def _sys_tree(root: Path, *, state: str = "4: ACTIVE", mtu: int = 4200) -> None:
    """A /sys tree as Documentation/ABI/stable/sysfs-class-infiniband describes it."""
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    _w(port / "state", f"{state}\n")
    _w(port / "phys_state", "5: LinkUp\n")
    _w(port / "rate", "200 Gb/sec (4X HDR)\n")
    _w(port / "link_layer", "Ethernet\n")
    gids = {0: ("fe80:0000:0000:0000:5aa2:e1ff:feda:e626", "IB/RoCE v1"),
            1: ("fe80:0000:0000:0000:5aa2:e1ff:feda:e626", "RoCE v2"),
            2: ("0000:0000:0000:0000:0000:ffff:c612:0001", "IB/RoCE v1"),
            3: ("0000:0000:0000:0000:0000:ffff:c612:0001", "RoCE v2"),
            4: ("0000:0000:0000:0000:0000:0000:0000:0000", None)}
    for i, (g, t) in gids.items():
        _w(port / "gids" / str(i), g + "\n")
        if t is not None:
            _w(port / "gid_attrs/types" / str(i), t + "\n")
            _w(port / "gid_attrs/ndevs" / str(i), "ens1f0np0\n")
    net = root / "sys/class/net"
    _w(net / "ens1f0np0/mtu", f"{mtu}\n")
    _w(net / "eno1/mtu", "1500\n")  # a management NIC: not RDMA, not judged
    for p in range(8):
        _w(net / f"ens1f0np0/ecn/roce_np/enable/{p}", "1\n" if p == 3 else "0\n")
        _w(net / f"ens1f0np0/ecn/roce_rp/enable/{p}", "1\n" if p == 3 else "0\n")


def test_sysfs_tree_is_read(tmp_path: Path) -> None:
    _sys_tree(tmp_path)
    ev = read_sysfs(tmp_path)
    (p,) = ev.ports
    assert (p.device, p.state, p.phys_state, p.rate_gbps, p.netdev) == (
        "mlx5_0", "Active", "LinkUp", 200.0, "ens1f0np0")
    assert [(g.index, g.version, g.ipv4) for g in ev.gids] == [
        (0, "v1", None), (1, "v2", None), (2, "v1", "198.18.0.1"), (3, "v2", "198.18.0.1")]
    assert dict(ev.netdev_mtu) == {"ens1f0np0": 4200}
    assert ev.ecn[0].np[3] and not ev.ecn[0].np[0]
    res = check_roce(ev)
    assert exit_code(res) == 0, [r for r in res if r.status == "fail"]


def test_sysfs_fail_cases(tmp_path: Path) -> None:
    _sys_tree(tmp_path, state="1: DOWN", mtu=1500)
    res = check_roce(read_sysfs(tmp_path))
    failed = {(r.name, r.kind) for r in res if r.status == "fail"}
    assert ("port-state", "roce-port-down") in failed and ("netdev-mtu", "roce-mtu") in failed


def test_absent_sysfs_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    ev = read_sysfs(tmp_path)
    assert (("sysfs", f"{tmp_path}/sys/class/infiniband absent")) in ev.skips
    assert ev.empty


def _fake_tool(bin_dir: Path, name: str, sample: str | None, *, body: str | None = None) -> None:
    p = bin_dir / name
    script = body if body is not None else f"#!/bin/sh\ncat '{DATA / sample}'\n"  # type: ignore[operator]
    p.write_text(script)
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_fake_tools_on_path_are_run(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "ibstat", "ibstat-roce-dgx-spark.txt")
    _fake_tool(bin_dir, "show_gids", "show_gids-bond-vxlan.txt")
    _fake_tool(bin_dir, "mlnx_qos", "mlnx_qos-eth2-prio3.txt")
    ev = collect_live(root=tmp_path, path=str(bin_dir), timeout_s=5)
    assert [p.device for p in ev.ports] == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0"]
    assert len(ev.gids) == 6
    # mlnx_qos ran once per netdev that carries a GID, with -i
    assert sorted(q.interface for q in ev.qos) == ["b3.vxlan.30100", "bond1"]
    why = dict(ev.skips)
    assert why["ibv_devinfo"] == "ibv_devinfo not found on PATH"
    assert why["iblinkinfo"] == "iblinkinfo not found on PATH"
    assert why["sysfs"].endswith("/sys/class/infiniband absent")
    assert "perftest" in why


def test_failing_and_hanging_tools_are_skips(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "ibstat", None, body="#!/bin/sh\necho 'ibpanic: no umad' >&2\nexit 3\n")
    _fake_tool(bin_dir, "ibv_devinfo", None, body="#!/bin/sh\nsleep 5\n")
    ev = collect_live(root=tmp_path, path=str(bin_dir), timeout_s=0.5)
    why = dict(ev.skips)
    assert why["ibstat"] == "ibstat exited 3: ibpanic: no umad"
    assert why["ibv_devinfo"] == "ibv_devinfo -v timed out after 0.5 s"


def test_nothing_on_this_machine_means_all_skip(tmp_path: Path) -> None:
    ev = collect_live(root=tmp_path, path=str(tmp_path / "empty-bin"))
    res = check_roce(ev)
    assert {r.status for r in res} == {"skip"} and exit_code(res) == 2
    assert ("ibstat", "ibstat not found on PATH") in ev.skips


@pytest.mark.skipif(any((Path(d) / "ibstat").exists() for d in os.environ.get("PATH", "").split(":")),
                    reason="this machine has ibstat (the test is about a machine without it)")
def test_real_path_of_this_machine_has_no_tools() -> None:
    ev = collect_live(root=Path("/nonexistent-root"))
    assert ("ibstat", "ibstat not found on PATH") in ev.skips


def test_saved_folder_with_sys_tree() -> None:
    ev = collect_saved(DATA / "healthy")
    assert {p.device for p in ev.ports} == {"mlx5_0", "mlx5_1"}
    assert dict(ev.netdev_mtu) == {"ens1f0np0": 4200, "ens1f1np1": 4200}
    assert {q.interface for q in ev.qos} == {"ens1f0np0", "ens1f1np1"}
    assert len(ev.ecn) == 2


def test_saved_folder_warns_on_unknown_files_and_rejects_bad_known_ones(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("call the vendor on monday\n")
    (tmp_path / "ibstat.txt").write_text((DATA / "ibstat-ib-edr.txt").read_text())
    ev = collect_saved(tmp_path)
    assert len(ev.ports) == 1 and any("notes.txt" in w for w in ev.warnings)
    (tmp_path / "ibstat.txt").write_text((DATA / "ibstat-ib-edr.txt").read_text().replace(
        "Rate: 100", "Rate: ???"))
    from fabricscope.model.errors import TraceFormatError
    with pytest.raises(TraceFormatError, match=r"ibstat.txt: line 11: Rate"):
        collect_saved(tmp_path)
    with pytest.raises(ConfigError, match="not a folder"):
        collect_saved(tmp_path / "missing")
