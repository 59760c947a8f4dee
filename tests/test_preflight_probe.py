"""Probe: parsers on real excerpts, fixture trees, and this machine's own /proc."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.preflight.probe import (
    _irq_pattern,
    format_cpulist,
    parse_cpulist,
    parse_ethtool_g,
    parse_interrupts,
    read_host,
)

DATA = Path(__file__).parent / "data" / "preflight"


def test_cpulist_round_trip() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("0-6:2") == {0, 2, 4, 6}
    assert format_cpulist(parse_cpulist("16-31,0,2-3")) == "0,2-3,16-31"


def test_interrupts_real_i40e_excerpt() -> None:
    names = parse_interrupts((DATA / "samples/interrupts_nemu_i40e.txt").read_text())
    assert names[10] == "i40e-enP1s15-TxRx-0"
    assert names[9] == "i40e-0001:00:0f.0:misc"
    assert names[1] == "ACPI:Ged"
    pat = _irq_pattern("enP1s15", "0001:00:0f.0", None)
    queues = sorted(i for i, n in names.items() if pat.search(n))
    assert queues == [10, 11, 12]  # misc vector and other devices are not queues


def test_irq_names_real_mlx5() -> None:
    rows = [ln.split() for ln in (DATA / "samples/irq_names_mlx5.txt").read_text().splitlines()
            if ln and not ln.startswith("#")]
    pat = _irq_pattern("ens1f0np0", "0000:08:00.0", None)
    assert [int(i) for i, n in rows if pat.search(n)] == [36, 40, 42]
    pat81 = _irq_pattern("enp129s0f0", "0000:81:00.0", None)
    assert [int(i) for i, n in rows if pat81.search(n)] == [298, 299, 319]
    assert not pat.search("mlx5_async0@pci:0000:08:00.0")


def test_ethtool_g_format() -> None:
    text = (DATA / "untuned/ethtool/ens1f0np0.g.txt").read_text()
    assert parse_ethtool_g(text) == {"rx": (1024, 8192), "tx": (1024, 8192)}


def test_fixture_tree_facts_match_its_files() -> None:
    root = DATA / "untuned"
    facts = read_host(root, sysctl_paths=["proc/sys/net/core/somaxconn"])
    assert facts.hostname == (root / "proc/sys/kernel/hostname").read_text().strip()
    assert facts.sysctls["proc/sys/net/core/somaxconn"] == \
        (root / "proc/sys/net/core/somaxconn").read_text().strip()
    facts = read_host(root, sysctl_paths=["proc/sys/net/ipv4/ip_local_port_range"])
    assert facts.sysctls["proc/sys/net/ipv4/ip_local_port_range"] == "32768\t60999"
    assert facts.thp == "always" and facts.irqbalance is True
    nics = {n.name: n for n in facts.nics}
    assert set(nics) == {"ens1f0np0", "eno1"}  # lo / docker0 have no device
    mlx = nics["ens1f0np0"]
    assert mlx.pci == "0000:3b:00.0" and mlx.numa_node == 0
    # queue IRQs only (not the async vectors 96, 97), each with its affinity file
    assert [q.irq for q in mlx.queue_irqs] == list(range(98, 106))
    for q in mlx.queue_irqs:
        text = (root / f"proc/irq/{q.irq}/smp_affinity_list").read_text()
        assert q.affinity == parse_cpulist(text)
    assert mlx.firmware == (root / "sys/class/net/ens1f0np0/device/infiniband/mlx5_0/fw_ver"
                            ).read_text().strip()


def test_bad_root_and_nic(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither proc/ nor sys/"):
        read_host(tmp_path)
    with pytest.raises(ConfigError, match="'eth9'"):
        read_host(DATA / "tuned", nics=["eth9"])


def _sysctl(name: str) -> str:
    return " ".join(Path("/proc/sys", *name.split(".")).read_text().split())


@pytest.mark.skipif(not Path("/proc/sys/net/core/somaxconn").exists(), reason="not Linux")
def test_this_machine_real() -> None:
    names = ["net.core.somaxconn", "net.ipv4.tcp_tw_reuse", "net.ipv4.ip_local_port_range"]
    paths = ["proc/sys/" + n.replace(".", "/") for n in names]
    facts = read_host("/", sysctl_paths=paths)
    for n, p in zip(names, paths, strict=True):
        assert " ".join(str(facts.sysctls[p]).split()) == _sysctl(n)
    # governors: either read per CPU or explained (a container has no cpufreq)
    assert facts.governors or "governor" in facts.notes
    for nic in facts.nics:
        assert nic.mtu == int(Path(f"/sys/class/net/{nic.name}/mtu").read_text())


@pytest.mark.skipif(not Path("/sys/class/net").exists(), reason="not Linux")
def test_this_machine_with_an_ethtool_runner() -> None:
    """On the real root, ethtool outputs (here from a stand-in runner) feed rings and firmware."""
    g = (DATA / "tuned/ethtool/ens1f0np0.g.txt").read_text()
    calls: list[tuple[str, ...]] = []

    def runner(args: Sequence[str]) -> str | None:
        calls.append(tuple(args))
        return g if args[0] == "-g" else "driver: x\nfirmware-version: 7.1\n"

    facts = read_host("/", ethtool=runner)
    assert len(calls) == 2 * len(facts.nics)
    for nic in facts.nics:
        assert nic.rings == {"rx": (8192, 8192), "tx": (8192, 8192)}
        assert nic.firmware is not None
    absent = read_host("/", ethtool=lambda args: None)
    assert all(n.rings is None and "ring" in n.notes for n in absent.nics)
