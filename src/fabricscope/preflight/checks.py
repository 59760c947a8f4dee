"""Judge a host's facts against a profile: pure, ``(HostFacts, Profile) -> [CheckResult]``.

Each result says the current and recommended value, the status
(``pass | warn | fail | skip | unknown``), the exact command that fixes it, why (with the
source of the recommendation) and, for reversible settings, the machine form of the fix
(:class:`FixAction`: a file write with the previous value, or a command with its undo) that
:mod:`fabricscope.preflight.fix` applies. ``skip``: the host has no such thing (no cpufreq in a
container); ``unknown``: it exists but could not be read or judged.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from fabricscope.preflight.probe import HostFacts, NicFacts, format_cpulist
from fabricscope.preflight.profiles import CheckSpec, Profile

STATUSES = ("pass", "warn", "fail", "skip", "unknown")


@dataclass(frozen=True)
class FixAction:
    """One reversible change: write ``value`` to ``path`` (under root; ``previous`` restores
    it), or run ``command`` (``undo`` restores)."""

    path: str = ""
    value: str = ""
    previous: str = ""
    command: tuple[str, ...] = ()
    undo: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckResult:
    """The verdict of one check on one subject (host, ``host/IF``, ``host/cpuN``)."""

    check: str
    subject: str
    status: str
    current: str
    recommended: str
    fix: str = ""
    why: str = ""
    source: str = ""
    severity: str = "warn"
    reversible: bool = False
    actions: tuple[FixAction, ...] = field(default=())
    reason: str = ""  # why skip / unknown, or what the status rests on

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``actions`` as lists)."""
        d = asdict(self)
        d["actions"] = [asdict(a) for a in self.actions]
        return d


def _mismatch(spec: CheckSpec) -> str:
    """The status of a mismatch: the check's severity (fail or warn)."""
    return spec.severity


def compare_value(current: str, spec: CheckSpec) -> bool:
    """Whether ``current`` satisfies ``spec`` (``eq``/``ge``/``le``/``range_covers``)."""
    cur = " ".join(current.split())
    rec = " ".join(spec.recommended.split())
    if spec.compare == "eq":
        return cur == rec
    if spec.compare in ("ge", "le"):
        try:
            a, b = int(cur.split()[0]), int(rec.split()[0])
        except (ValueError, IndexError):
            return False
        return a >= b if spec.compare == "ge" else a <= b
    if spec.compare == "range_covers":
        try:
            lo, hi = (int(x) for x in cur.split())
            rlo, rhi = (int(x) for x in rec.split())
        except ValueError:
            return False
        return lo <= rlo and hi >= rhi
    return True


def _result(spec: CheckSpec, subject: str, status: str, current: str, recommended: str,
            fix: str = "", actions: tuple[FixAction, ...] = (), reason: str = "") -> CheckResult:
    return CheckResult(check=spec.id, subject=subject, status=status, current=current,
                       recommended=recommended, fix=fix if status in ("warn", "fail") else "",
                       why=spec.why, source=spec.source, severity=spec.severity,
                       reversible=spec.reversible,
                       actions=actions if status in ("warn", "fail") else (), reason=reason)


def _sysctl(spec: CheckSpec, facts: HostFacts) -> CheckResult:
    name = spec.path.removeprefix("proc/sys/").replace("/", ".")
    raw = facts.sysctls.get(spec.path)
    if raw is None:
        return _result(spec, facts.hostname, "skip", "", spec.recommended,
                       reason=f"{spec.path} not present (module not loaded or not this kernel)")
    cur = " ".join(raw.split())
    ok = compare_value(cur, spec)
    rec = value = spec.recommended
    reason = ""
    if (name == "net.ipv4.tcp_congestion_control" and facts.congestion_available is not None
            and rec not in facts.congestion_available and not ok):
        reason = f"{rec} not in tcp_available_congestion_control (modprobe tcp_{rec} first)"
    fix = f"sysctl -w {name}={shlex.quote(value)}"
    action = FixAction(path=spec.path, value=value, previous=raw)
    return _result(spec, facts.hostname, "pass" if ok else _mismatch(spec), cur,
                   _rec_text(spec), fix, (action,), reason)


def _rec_text(spec: CheckSpec) -> str:
    return {"ge": ">= ", "le": "<= "}.get(spec.compare, "") + spec.recommended


def _thp(spec: CheckSpec, facts: HostFacts) -> CheckResult:
    if facts.thp is None:
        return _result(spec, facts.hostname, "skip", "", spec.recommended,
                       reason=facts.notes.get("thp", ""))
    ok = facts.thp == spec.recommended
    path = "sys/kernel/mm/transparent_hugepage/enabled"
    return _result(spec, facts.hostname, "pass" if ok else _mismatch(spec), facts.thp,
                   spec.recommended, f"echo {spec.recommended} > /{path}",
                   (FixAction(path=path, value=spec.recommended, previous=facts.thp),))


def _governor(spec: CheckSpec, facts: HostFacts) -> CheckResult:
    if not facts.governors:
        return _result(spec, facts.hostname, "skip", "", spec.recommended,
                       reason=facts.notes.get("governor", ""))
    counts: dict[str, int] = {}
    for g in facts.governors.values():
        counts[g] = counts.get(g, 0) + 1
    cur = ", ".join(f"{g} x{n}" for g, n in sorted(counts.items()))
    bad = sorted(c for c, g in facts.governors.items() if g != spec.recommended)
    if not bad:
        return _result(spec, facts.hostname, "pass", cur, spec.recommended)
    if facts.available_governors is not None and spec.recommended not in facts.available_governors:
        return _result(spec, facts.hostname, _mismatch(spec), cur, spec.recommended,
                       reason=f"{spec.recommended} not in scaling_available_governors "
                       f"({' '.join(sorted(facts.available_governors))})")
    actions = tuple(FixAction(path=f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor",
                              value=spec.recommended, previous=facts.governors[c]) for c in bad)
    fix = ("for g in /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor; do echo "
           f"{spec.recommended} > $g; done")
    return _result(spec, facts.hostname, _mismatch(spec), cur, spec.recommended, fix, actions,
                   reason=f"CPUs {format_cpulist(bad)} not {spec.recommended}")


def _irqbalance(spec: CheckSpec, facts: HostFacts) -> CheckResult:
    if facts.irqbalance is None:
        return _result(spec, facts.hostname, "unknown", "", spec.recommended,
                       reason="cannot list proc/*/comm")
    cur = "running" if facts.irqbalance else "not running"
    return _result(spec, facts.hostname, _mismatch(spec) if facts.irqbalance else "pass", cur,
                   spec.recommended, "systemctl disable --now irqbalance")


def _irq_affinity(spec: CheckSpec, facts: HostFacts, nic: NicFacts) -> CheckResult:
    subject = f"{facts.hostname}/{nic.name}"
    if not nic.queue_irqs:
        return _result(spec, subject, "skip", "", spec.recommended,
                       reason=nic.notes.get("irq_affinity", ""))
    if nic.numa_node is None or nic.numa_node not in facts.node_cpus:
        return _result(spec, subject, "unknown", f"{len(nic.queue_irqs)} queue IRQs", "",
                       reason=nic.notes.get("numa_node", "NIC's NUMA node has no cpulist"))
    node = facts.node_cpus[nic.numa_node]
    node_text = format_cpulist(node)
    unread = [q for q in nic.queue_irqs if q.affinity is None]
    outside = [q for q in nic.queue_irqs if q.affinity is not None and not q.affinity <= node]
    rec = f"within node{nic.numa_node} CPUs {node_text}"
    cur = (f"{len(outside)} of {len(nic.queue_irqs)} queue IRQs outside node{nic.numa_node}"
           + (": " + ", ".join(f"{q.irq}->{q.affinity_text}" for q in outside[:6])
              + (" ..." if len(outside) > 6 else "") if outside else ""))
    if not outside:
        status = "unknown" if unread else "pass"
        return _result(spec, subject, status, cur, rec,
                       reason=f"{len(unread)} IRQs' smp_affinity_list unreadable" if unread else "")
    # Spread every queue of the NIC over the node's CPUs, one CPU per queue round-robin
    # (what set_irq_affinity_cpulist.sh does), so the pinned queues do not pile on one core.
    cpus = sorted(node)
    actions = tuple(FixAction(path=f"proc/irq/{q.irq}/smp_affinity_list",
                              value=str(cpus[i % len(cpus)]), previous=q.affinity_text)
                    for i, q in enumerate(nic.queue_irqs))
    fix = "; ".join(f"echo {a.value} > /{a.path}" for a in actions[:4]) + (
        f"; ... ({len(actions)} IRQs)" if len(actions) > 4 else "")
    return _result(spec, subject, _mismatch(spec), cur, rec, fix, actions)


def _ring(spec: CheckSpec, facts: HostFacts, nic: NicFacts) -> CheckResult:
    subject = f"{facts.hostname}/{nic.name}"
    if nic.rings is None:
        return _result(spec, subject, "skip", "", spec.recommended,
                       reason=nic.notes.get("ring", ""))
    cur = " ".join(f"{k} {c}/{m}" for k, (c, m) in sorted(nic.rings.items()))
    low = {k: (c, m) for k, (c, m) in nic.rings.items() if c < m}
    if not low:
        return _result(spec, subject, "pass", cur, "current = pre-set maximum")
    args = [x for k, (_, m) in sorted(low.items()) for x in (k, str(m))]
    undo = [x for k, (c, _) in sorted(low.items()) for x in (k, str(c))]
    cmd = ("ethtool", "-G", nic.name, *args)
    action = FixAction(command=cmd, undo=("ethtool", "-G", nic.name, *undo))
    return _result(spec, subject, _mismatch(spec), cur, "current = pre-set maximum",
                   " ".join(cmd), (action,))


def _nic_scalar(spec: CheckSpec, facts: HostFacts, nic: NicFacts) -> CheckResult:
    subject = f"{facts.hostname}/{nic.name}"
    value: int | str | None = {"mtu": nic.mtu, "speed": nic.speed_mbps,
                               "operstate": nic.operstate}[spec.kind]
    if value is None:
        return _result(spec, subject, "unknown", "", _rec_text(spec),
                       reason=nic.notes.get(spec.kind, f"{spec.kind} unreadable"))
    ok = compare_value(str(value), spec)
    fix = {"mtu": f"ip link set dev {nic.name} mtu {spec.recommended}  # and on the switch port",
           "speed": f"ethtool {nic.name}; check cable, optics and switch port "
                    f"(expected >= {spec.recommended} Mb/s)",
           "operstate": f"ip link set dev {nic.name} up; check cable and switch port"}[spec.kind]
    return _result(spec, subject, "pass" if ok else _mismatch(spec), str(value),
                   _rec_text(spec), fix)


def _firmware(spec: CheckSpec, facts: HostFacts, nic: NicFacts) -> CheckResult:
    subject = f"{facts.hostname}/{nic.name}"
    if nic.firmware is None:
        return _result(spec, subject, "unknown", "", spec.recommended or "fleet majority",
                       reason=nic.notes.get("firmware", ""))
    if spec.compare == "report" or not spec.recommended:
        return _result(spec, subject, "pass", nic.firmware, "fleet majority",
                       reason="recorded; `preflight fleet` flags hosts off the majority")
    ok = _version_key(nic.firmware) >= _version_key(spec.recommended) if spec.compare == "ge" \
        else nic.firmware == spec.recommended
    return _result(spec, subject, "pass" if ok else _mismatch(spec), nic.firmware,
                   _rec_text(spec), f"upgrade {nic.name} firmware (mlxfwmanager / vendor tool) "
                   f"to {spec.recommended}")


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _hugepages(spec: CheckSpec, facts: HostFacts) -> CheckResult:
    if facts.hugepages_total is None:
        return _result(spec, facts.hostname, "skip", "", spec.recommended,
                       reason="no HugePages_Total in proc/meminfo")
    if facts.hugepages_total == 0:
        return _result(spec, facts.hostname, "skip", "HugePages_Total 0", spec.recommended,
                       reason="no huge pages reserved on this host")
    empty = sorted(n for n, free in facts.hugepages_free_by_node.items() if free == 0)
    cur = f"total {facts.hugepages_total}; free by node " + ", ".join(
        f"node{n}={f}" for n, f in sorted(facts.hugepages_free_by_node.items()))
    if not facts.hugepages_free_by_node:
        return _result(spec, facts.hostname, "unknown", cur, spec.recommended,
                       reason="no per-node hugepages counts under sys/devices/system/node")
    fix = " ; ".join(f"echo N > /sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/"
                     "nr_hugepages" for n in empty)
    return _result(spec, facts.hostname, _mismatch(spec) if empty else "pass", cur,
                   spec.recommended, fix)


def _iommu(spec: CheckSpec, facts: HostFacts) -> CheckResult:
    cmd = facts.cmdline or ""
    words = cmd.split()
    opts = set(words)
    if "iommu=pt" in opts or "intel_iommu=off" in opts or "amd_iommu=off" in opts \
            or "iommu=off" in opts:
        return _result(spec, facts.hostname, "pass",
                       " ".join(o for o in words if "iommu" in o), spec.recommended)
    if facts.cmdline is None and facts.iommu_units is None:
        return _result(spec, facts.hostname, "unknown", "", spec.recommended,
                       reason="no proc/cmdline and no sys/class/iommu")
    if facts.iommu_units is None or facts.iommu_units == 0:
        return _result(spec, facts.hostname, "pass", "no IOMMU units in sys/class/iommu",
                       spec.recommended)
    cur = f"{facts.iommu_units} IOMMU units translating; cmdline has no iommu=pt"
    return _result(spec, facts.hostname, _mismatch(spec), cur, spec.recommended,
                   "add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX) and reboot")


_HOST = {"sysctl": _sysctl, "thp": _thp, "governor": _governor, "irqbalance": _irqbalance,
         "hugepages": _hugepages, "iommu": _iommu}
_PER_NIC = {"irq_affinity": _irq_affinity, "ring": _ring, "mtu": _nic_scalar,
            "speed": _nic_scalar, "operstate": _nic_scalar, "firmware": _firmware}


def evaluate(facts: HostFacts, profile: Profile) -> list[CheckResult]:
    """Every check of ``profile`` on ``facts``, host checks first, then per NIC.

    Per-NIC checks run on each NIC of ``facts.nics``; with no NIC they are one ``skip``.
    """
    out: list[CheckResult] = []
    for spec in profile.checks:
        if spec.kind in _HOST:
            out.append(_HOST[spec.kind](spec, facts))
        elif not facts.nics:
            out.append(_result(spec, facts.hostname, "skip", "", spec.recommended,
                               reason="no NIC with a device under sys/class/net"))
        else:
            out.extend(_PER_NIC[spec.kind](spec, facts, nic) for nic in facts.nics)
    return out


def summarize(results: list[CheckResult]) -> dict[str, int]:
    """Count of results per status (every status present, zeros included)."""
    counts = dict.fromkeys(STATUSES, 0)
    for r in results:
        counts[r.status] += 1
    return counts


def exit_code(results: list[CheckResult]) -> int:
    """0: nothing failed (warn / skip allowed); 1: any fail; 2: no check had data."""
    if not results or all(r.status in ("skip", "unknown") for r in results):
        return 2
    return 1 if any(r.status == "fail" for r in results) else 0
