"""Write the fixture host trees ``tuned/`` and ``untuned/`` (run once; the trees are committed).

Both trees are the same 2-socket GPU training host (32 CPUs, node0 = 0-15, node1 = 16-31),
with a ConnectX-style NIC ``ens1f0np0`` (mlx5, 0000:3b:00.0, NUMA node 0, queue IRQs named
``mlx5_compN@pci:0000:3b:00.0``) and an Intel-style NIC ``eno1`` (i40e, 0000:af:00.0, NUMA
node 1, queue IRQs ``i40e-eno1-TxRx-N``). Values follow real kernels' defaults (untuned) and
the OPERATIONS.md s5 checklist (tuned). Usage: python tests/data/preflight/build_trees.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).parent
NCPU = 32
NODES = {0: "0-15", 1: "16-31"}
NICS = {
    "ens1f0np0": {"pci": "0000:3b:00.0", "driver": "mlx5_core", "node": 0, "queues": 8,
                  "irq0": 98, "fw": "28.39.1002"},
    "eno1": {"pci": "0000:af:00.0", "driver": "i40e", "node": 1, "queues": 4, "irq0": 140,
             "fw": "9.20 0x8000d95e 1.3146.0"},
}


def _w(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


def _irq_name(nic: str, spec: dict[str, object], q: int) -> str:
    if spec["driver"] == "mlx5_core":
        return f"mlx5_comp{q}@pci:{spec['pci']}"
    return f"i40e-{nic}-TxRx-{q}"


def _interrupts(root: Path, affinity: dict[int, str]) -> None:
    head = " " * 11 + "".join(f"CPU{c:<8}" for c in range(NCPU)).rstrip()
    rows = [head]

    def row(irq: str, chip: str, hw: str, name: str) -> str:
        counts = "".join(f"{(7 * int(irq) + c) % 97 if irq.isdigit() else 0:>11}"
                         for c in range(NCPU))
        return f"{irq:>4}:{counts}  {chip} {hw}      {name}"

    rows.append(row("0", "IR-IO-APIC", "2-edge", "timer"))
    rows.append(row("8", "IR-IO-APIC", "8-edge", "rtc0"))
    rows.append(row("96", "IR-PCI-MSI-0000:3b:00.0", "0-edge", "mlx5_async0@pci:0000:3b:00.0"))
    affinity[96] = "0-31"
    rows.append(row("97", "IR-PCI-MSI-0000:3b:00.0", "1-edge", "mlx5_async1@pci:0000:3b:00.0"))
    affinity[97] = "0-31"
    rows.append(row("139", "IR-PCI-MSI", "89653248-edge", "i40e-0000:af:00.0:misc"))
    affinity[139] = "0-31"
    for nic, spec in NICS.items():
        for q in range(int(spec["queues"])):  # type: ignore[call-overload]
            irq = int(spec["irq0"]) + q  # type: ignore[call-overload]
            chip = (f"IR-PCI-MSI-{spec['pci']}" if spec["driver"] == "mlx5_core"
                    else "IR-PCI-MSI")
            rows.append(row(str(irq), chip, f"{q + 2}-edge", _irq_name(nic, spec, q)))
    rows.append(row("170", "IR-PCI-MSI", "524288-edge", "nvme0q1"))
    affinity[170] = "0"
    rows.append(" NMI:" + "".join(f"{3:>11}" for _ in range(NCPU)) + "   Non-maskable interrupts")
    rows.append(" LOC:" + "".join(f"{9000 + c:>11}" for c in range(NCPU))
                + "   Local timer interrupts")
    _w(root, "proc/interrupts", "\n".join(rows))
    for irq, aff in affinity.items():
        _w(root, f"proc/irq/{irq}/smp_affinity_list", aff)


def build(root: Path, *, tuned: bool) -> None:
    """Write one host tree."""
    shutil.rmtree(root, ignore_errors=True)
    host = "gpu-train-07" if tuned else "gpu-train-12"
    _w(root, "proc/sys/kernel/hostname", host)
    sysctl = {
        "net/core/somaxconn": "65535" if tuned else "4096",
        "net/ipv4/tcp_tw_reuse": "1" if tuned else "2",
        "net/core/rmem_max": "134217728" if tuned else "212992",
        "net/core/wmem_max": "134217728" if tuned else "212992",
        "net/ipv4/tcp_congestion_control": "cubic",
        "net/ipv4/tcp_available_congestion_control": "reno cubic" + (" bbr" if tuned else ""),
        "net/ipv4/ip_local_port_range": "1024\t65535" if tuned else "32768\t60999",
        "net/ipv4/conf/all/arp_ignore": "1" if tuned else "0",
        "net/ipv4/conf/all/arp_announce": "2" if tuned else "0",
        "net/ipv4/tcp_fin_timeout": "30" if tuned else "60",
        "kernel/numa_balancing": "0" if tuned else "1",
        "vm/zone_reclaim_mode": "0",
    }
    for k, v in sysctl.items():
        _w(root, f"proc/sys/{k}", v)
    _w(root, "sys/kernel/mm/transparent_hugepage/enabled",
       "always madvise [never]" if tuned else "[always] madvise never")
    for c in range(NCPU):
        _w(root, f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor",
           "performance" if tuned else "powersave")
        _w(root, f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_available_governors",
           "performance powersave")
    free = {0: 512, 1: 512} if tuned else {0: 1024, 1: 0}
    for n, cpus in NODES.items():
        _w(root, f"sys/devices/system/node/node{n}/cpulist", cpus)
        _w(root, f"sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/free_hugepages",
           str(free[n]))
    _w(root, "proc/meminfo", "MemTotal:       2113389128 kB\nMemFree:        2004011220 kB\n"
       "HugePages_Total:    1024\nHugePages_Free:     1024\nHugePages_Rsvd:        0\n"
       "HugePages_Surp:        0\nHugepagesize:       2048 kB\n")
    _w(root, "proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.8.0-49-generic root=UUID=3f0e ro "
       + ("intel_iommu=on iommu=pt transparent_hugepage=never" if tuned else "quiet splash"))
    for u in ("dmar0", "dmar1"):
        (root / "sys/class/iommu" / u).mkdir(parents=True, exist_ok=True)
        # a file inside, as sysfs has (uevent), so git keeps the unit's directory
        (root / "sys/class/iommu" / u / "uevent").write_text("")
    _w(root, "proc/1/comm", "systemd")
    _w(root, "proc/812/comm", "sshd")
    if not tuned:
        _w(root, "proc/1377/comm", "irqbalance")
    affinity: dict[int, str] = {}
    for nic, spec in NICS.items():
        node = int(spec["node"])  # type: ignore[call-overload]
        lo = 0 if node == 0 else 16
        dev = f"sys/class/net/{nic}/device"
        # untuned: the ConnectX runs an older firmware than the rest of the fleet.
        fw = str(spec["fw"]) if tuned or spec["driver"] != "mlx5_core" else "28.36.1010"
        _w(root, f"{dev}/uevent", f"DRIVER={spec['driver']}\nPCI_SLOT_NAME={spec['pci']}")
        _w(root, f"{dev}/numa_node", str(node))
        if spec["driver"] == "mlx5_core":
            _w(root, f"{dev}/infiniband/mlx5_0/fw_ver", fw)
        _w(root, f"sys/class/net/{nic}/mtu", "9000" if tuned else "1500")
        _w(root, f"sys/class/net/{nic}/speed",
           ("200000" if tuned else "50000") if spec["driver"] == "mlx5_core" else "100000")
        _w(root, f"sys/class/net/{nic}/operstate", "up")
        for q in range(int(spec["queues"])):  # type: ignore[call-overload]
            irq = int(spec["irq0"]) + q  # type: ignore[call-overload]
            # untuned: mlx5 queues on the far node, i40e queues on every CPU (the default).
            far = 16 + q if node == 0 else q
            affinity[irq] = str(lo + q) if tuned else (str(far) if node == 0 else "0-31")
        rx_cur = 8192 if tuned else 1024
        mx = 8192 if spec["driver"] == "mlx5_core" else 4096
        cur = min(rx_cur, mx)
        _w(root, f"ethtool/{nic}.g.txt",
           f"Ring parameters for {nic}:\nPre-set maximums:\nRX:\t\t\t{mx}\nRX Mini:\t\tn/a\n"
           f"RX Jumbo:\t\tn/a\nTX:\t\t\t{mx}\nCurrent hardware settings:\nRX:\t\t\t{cur}\n"
           f"RX Mini:\t\tn/a\nRX Jumbo:\t\tn/a\nTX:\t\t\t{cur}\n")
        _w(root, f"ethtool/{nic}.i.txt",
           f"driver: {spec['driver']}\nversion: 6.8.0-49-generic\nfirmware-version: "
           f"{fw}\nbus-info: {spec['pci']}\nsupports-statistics: yes\n")
    # lo and a bridge: no device link, so not checked as NICs.
    _w(root, "sys/class/net/lo/mtu", "65536")
    _w(root, "sys/class/net/docker0/mtu", "1500")
    _interrupts(root, affinity)


if __name__ == "__main__":
    build(HERE / "tuned", tuned=True)
    build(HERE / "untuned", tuned=False)
