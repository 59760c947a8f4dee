"""Read a host's tuning facts from /proc and /sys (and ``ethtool``) under a root path.

Every reader takes ``root`` so a fixture tree (``tests/data/preflight/tuned``) reads like a
host. Nothing here needs root privileges; nothing here writes. A value that cannot be read is
``None`` with the reason in :attr:`HostFacts.notes`, never a guess.

Formats followed: ``proc(5)`` (``/proc/interrupts``, ``/proc/meminfo``, ``/proc/cmdline``,
``/proc/irq/N/smp_affinity_list``), ``Documentation/ABI/testing/sysfs-class-net`` (mtu,
speed, operstate, ``device/numa_node``), ``Documentation/ABI/stable/sysfs-devices-node``
(``nodeK/cpulist``), ``Documentation/admin-guide/cputopologies/cputopology.rst`` (cpulist
syntax ``0-3,8``) and ``ethtool(8)`` ``-g`` / ``-i`` output.

``ethtool`` only runs for ``root="/"``; for another root the outputs are read from
``ROOT/ethtool/IF.g.txt`` and ``ROOT/ethtool/IF.i.txt`` when a fixture provides them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.model.errors import ConfigError

#: Runs ``ethtool ARGS``; returns stdout, or None with no ethtool / an error.
EthtoolRunner = Callable[[Sequence[str]], "str | None"]


@dataclass(frozen=True)
class QueueIrq:
    """One NIC queue interrupt: number, name in /proc/interrupts, CPUs it may run on."""

    irq: int
    name: str
    affinity: frozenset[int] | None
    affinity_text: str


@dataclass
class NicFacts:
    """What a host says about one network interface."""

    name: str
    pci: str | None = None
    driver: str | None = None
    numa_node: int | None = None
    mtu: int | None = None
    speed_mbps: int | None = None
    operstate: str | None = None
    queue_irqs: list[QueueIrq] = field(default_factory=list)
    rings: dict[str, tuple[int, int]] | None = None  # "rx" -> (current, pre-set max)
    firmware: str | None = None
    notes: dict[str, str] = field(default_factory=dict)  # fact -> why it is missing


@dataclass
class HostFacts:
    """Everything one probe read (``None``: not readable; the reason is in ``notes``)."""

    hostname: str
    root: str
    sysctls: dict[str, str | None] = field(default_factory=dict)  # path under root -> raw
    thp: str | None = None
    governors: dict[int, str] = field(default_factory=dict)  # cpu -> governor
    available_governors: frozenset[str] | None = None
    irqbalance: bool | None = None
    node_cpus: dict[int, frozenset[int]] = field(default_factory=dict)
    hugepages_total: int | None = None
    hugepages_free_by_node: dict[int, int] = field(default_factory=dict)
    cmdline: str | None = None
    iommu_units: int | None = None
    congestion_available: frozenset[str] | None = None
    nics: list[NicFacts] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)


def parse_cpulist(text: str) -> frozenset[int]:
    """``0-3,8,10-11`` -> {0,1,2,3,8,10,11} (cputopology.rst list format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        hi, _, stride = hi.partition(":")
        a = int(lo)
        b = int(hi) if hi else a
        cpus.update(range(a, b + 1, int(stride) if stride else 1))
    return frozenset(cpus)


def format_cpulist(cpus: Sequence[int] | frozenset[int]) -> str:
    """{0,1,2,3,8} -> ``0-3,8``."""
    out: list[str] = []
    s = sorted(cpus)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


def parse_interrupts(text: str) -> dict[int, str]:
    """``/proc/interrupts`` -> {irq: name}; the name is the last column (proc(5)).

    Rows are ``N: count... chip hwirq-trigger name``; named rows (NMI, LOC) are skipped.
    """
    lines = text.splitlines()
    if not lines:
        return {}
    ncpu = len(lines[0].split())
    out: dict[int, str] = {}
    for line in lines[1:]:
        head, sep, rest = line.partition(":")
        if not sep or not head.strip().isdigit():
            continue
        cols = rest.split()
        tail = cols[ncpu:]
        if len(tail) >= 2:
            out[int(head)] = " ".join(tail[2:]) if len(tail) > 2 else tail[-1]
    return out


def parse_ethtool_g(text: str) -> dict[str, tuple[int, int]]:
    """``ethtool -g IF`` -> {"rx": (current, max), "tx": (current, max)} (ethtool(8))."""
    maxes: dict[str, int] = {}
    cur: dict[str, int] = {}
    target: dict[str, int] | None = None
    for line in text.splitlines():
        low = line.strip().lower()
        if low.startswith("pre-set maximums"):
            target = maxes
        elif low.startswith("current hardware settings"):
            target = cur
        elif target is not None and ":" in low:
            key, _, val = low.partition(":")
            if key in ("rx", "tx") and val.strip().isdigit():
                target[key] = int(val)
    return {k: (cur[k], maxes[k]) for k in ("rx", "tx") if k in cur and k in maxes}


def parse_ethtool_i(text: str) -> dict[str, str]:
    """``ethtool -i IF`` -> {"driver": .., "firmware-version": .., "bus-info": ..}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if sep:
            out[key.strip()] = val.strip()
    return out


def run_ethtool(args: Sequence[str], *, timeout_s: float = 2.0) -> str | None:
    """Run ``ethtool ARGS`` with a timeout; None when absent, failing or too slow."""
    exe = shutil.which("ethtool")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _thp_value(text: str) -> str:
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else text.strip()


def _irq_pattern(nic: str, pci: str | None, devname: str | None) -> re.Pattern[str]:
    """Queue IRQ names of one NIC: ``mlx5_comp3@pci:0000:3b:00.0``, ``eth0-TxRx-3``,
    ``i40e-enP1s15-TxRx-0``, ``ens1f0-3``, ``eth0-rx-0``, ``virtio2-input.0``."""
    alts = [rf"(?:^|[-_]){re.escape(nic)}-(?:TxRx-|Tx-Rx-|rx-|tx-|rxtx-)?\d+$"]
    if pci:
        alts.append(rf"^\w*comp\d+@pci:{re.escape(pci)}$")
    if devname and devname.startswith("virtio"):
        alts.append(rf"^{re.escape(devname)}-(?:input|output)\.\d+$")
    return re.compile("|".join(alts))


def _procs_named(root: Path, name: str) -> bool | None:
    proc = root / "proc"
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    if not entries:
        return None  # no process directories: not a /proc we can judge
    return any(_read(p / "comm") == name for p in entries)


def _nic_names(root: Path, wanted: Sequence[str]) -> list[str]:
    net = root / "sys/class/net"
    if wanted:
        missing = [n for n in wanted if not (net / n).exists()]
        if missing:
            raise ConfigError(f"--nic: {missing[0]!r}: no such interface under {net}")
        return list(wanted)
    try:
        names = sorted(p.name for p in net.iterdir())
    except OSError:
        return []
    # A NIC with a device link is hardware (or virtio); lo, bridges, ifb have none.
    return [n for n in names if (net / n / "device").exists()]


def _nic(root: Path, name: str, irq_names: dict[int, str], node_cpus: dict[int, frozenset[int]],
         outputs: tuple[str | None, str | None]) -> NicFacts:
    base = root / "sys/class/net" / name
    dev = base / "device"
    nic = NicFacts(name=name)
    uevent = _read(dev / "uevent") or ""
    kv = dict(line.split("=", 1) for line in uevent.splitlines() if "=" in line)
    nic.driver = kv.get("DRIVER")
    nic.pci = kv.get("PCI_SLOT_NAME")
    devname: str | None = None
    try:
        resolved = dev.resolve()
        devname = resolved.name
        parent = resolved.parent
    except OSError:
        parent = dev
    if nic.pci is None and re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d$", parent.name):
        nic.pci = parent.name
    node = _int(_read(dev / "numa_node"))
    if node is None:
        node = _int(_read(parent / "numa_node"))
    if node is not None and node < 0 and len(node_cpus) == 1:
        node = next(iter(node_cpus))  # no NUMA locality on a one-node host: node 0
    nic.numa_node = node if node is not None and node >= 0 else None
    if nic.numa_node is None:
        nic.notes["numa_node"] = f"{dev}/numa_node is -1 or unreadable on a multi-node host"
    nic.mtu = _int(_read(base / "mtu"))
    speed = _int(_read(base / "speed"))
    nic.speed_mbps = speed if speed is not None and speed > 0 else None
    if nic.speed_mbps is None:
        nic.notes["speed"] = f"{base}/speed unreadable or -1 (virtual NIC or link down)"
    nic.operstate = _read(base / "operstate")
    pat = _irq_pattern(name, nic.pci, devname)
    for irq, irq_name in sorted(irq_names.items()):
        if pat.search(irq_name):
            text = _read(root / f"proc/irq/{irq}/smp_affinity_list")
            aff = None
            if text is not None:
                try:
                    aff = parse_cpulist(text)
                except ValueError:
                    aff = None
            nic.queue_irqs.append(QueueIrq(irq, irq_name, aff, text or ""))
    if not nic.queue_irqs:
        nic.notes["irq_affinity"] = (f"no queue IRQ named after {name}"
                                     + (f" or {nic.pci}" if nic.pci else "")
                                     + " in /proc/interrupts")
    g_text, i_text = outputs
    if g_text is None:
        nic.notes["ring"] = ("ethtool not installed or `ethtool -g` failed" if str(root) == "/"
                             else f"no {root}/ethtool/{name}.g.txt")
    else:
        nic.rings = parse_ethtool_g(g_text) or None
        if nic.rings is None:
            nic.notes["ring"] = "`ethtool -g` output has no RX/TX ring sizes"
    info = parse_ethtool_i(i_text) if i_text else {}
    fw = info.get("firmware-version")
    if not fw:
        for p in sorted((dev / "infiniband").glob("*/fw_ver")):
            fw = _read(p)
            break
    nic.firmware = fw or None
    if nic.firmware is None:
        nic.notes["firmware"] = "no device/infiniband/*/fw_ver and no `ethtool -i` firmware"
    nic.driver = nic.driver or info.get("driver")
    return nic


def _ethtool_outputs(root: Path, name: str,
                     ethtool: EthtoolRunner | None) -> tuple[str | None, str | None]:
    if str(root) != "/":
        return _read(root / f"ethtool/{name}.g.txt"), _read(root / f"ethtool/{name}.i.txt")
    if ethtool is None:
        return None, None
    return ethtool(["-g", name]), ethtool(["-i", name])


def read_host(root: str | Path = "/", *, sysctl_paths: Sequence[str] = (),
              nics: Sequence[str] = (), ethtool: EthtoolRunner | None = run_ethtool,
              hostname: str | None = None) -> HostFacts:
    """Read the tuning facts of the host at ``root`` (``/`` or a fixture tree).

    ``sysctl_paths`` are paths under root (``proc/sys/net/core/somaxconn``) to read;
    ``nics`` restricts the NICs (default: every interface with a ``device`` link).
    Raises :class:`ConfigError` when root has neither ``proc`` nor ``sys``.
    """
    r = Path(root)
    if not (r / "proc").is_dir() and not (r / "sys").is_dir():
        raise ConfigError(f"--root: {str(root)!r}: holds neither proc/ nor sys/ (no host data)")
    name = hostname or _read(r / "proc/sys/kernel/hostname")
    if name is None:
        name = os.uname().nodename if str(r) == "/" else r.name
    facts = HostFacts(hostname=name, root=str(r))
    for p in sysctl_paths:
        val = _read(r / p)
        facts.sysctls[p] = val  # raw (tabs kept) so an undo restores it exactly
    thp = _read(r / "sys/kernel/mm/transparent_hugepage/enabled")
    facts.thp = _thp_value(thp) if thp else None
    if facts.thp is None:
        facts.notes["thp"] = "no sys/kernel/mm/transparent_hugepage/enabled"
    cpu_dir = r / "sys/devices/system/cpu"
    for g in sorted(cpu_dir.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        val = _read(g)
        if val:
            facts.governors[int(g.parent.parent.name[3:])] = val
    avail = _read(cpu_dir / "cpu0/cpufreq/scaling_available_governors")
    facts.available_governors = frozenset(avail.split()) if avail else None
    if not facts.governors:
        facts.notes["governor"] = "no cpufreq (container, VM or a driver without governors)"
    facts.irqbalance = _procs_named(r, "irqbalance")
    for nd in sorted((r / "sys/devices/system/node").glob("node[0-9]*")):
        text = _read(nd / "cpulist")
        if text:
            facts.node_cpus[int(nd.name[4:])] = parse_cpulist(text)
        free = _int(_read(nd / "hugepages/hugepages-2048kB/free_hugepages"))
        free_1g = _int(_read(nd / "hugepages/hugepages-1048576kB/free_hugepages"))
        if free is not None or free_1g is not None:
            facts.hugepages_free_by_node[int(nd.name[4:])] = (free or 0) + (free_1g or 0)
    meminfo = _read(r / "proc/meminfo") or ""
    m = re.search(r"^HugePages_Total:\s+(\d+)", meminfo, re.M)
    facts.hugepages_total = int(m.group(1)) if m else None
    facts.cmdline = _read(r / "proc/cmdline")
    iommu = r / "sys/class/iommu"
    facts.iommu_units = len(list(iommu.iterdir())) if iommu.is_dir() else None
    cc = _read(r / "proc/sys/net/ipv4/tcp_available_congestion_control")
    facts.congestion_available = frozenset(cc.split()) if cc else None
    irq_text = _read(r / "proc/interrupts")
    irq_names = parse_interrupts(irq_text) if irq_text else {}
    names = _nic_names(r, nics)
    if names and str(r) == "/" and ethtool is not None:
        # One thread per call: a hung driver costs one timeout, not one per NIC (< 5 s target).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(16, 2 * len(names))) as pool:
            got = list(pool.map(ethtool, [["-g", n] for n in names] + [["-i", n] for n in names]))
        outputs = list(zip(got[:len(names)], got[len(names):], strict=True))
    else:
        outputs = [_ethtool_outputs(r, n, None) for n in names]
    for nic_name, out in zip(names, outputs, strict=True):
        facts.nics.append(_nic(r, nic_name, irq_names, facts.node_cpus, out))
    return facts
