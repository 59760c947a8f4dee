"""Host tuning profiles as data: which checks a training or inference host must pass.

A profile is a tuple of :class:`CheckSpec`: a check id, what it reads (``kind`` and, for file
checks, ``path`` relative to the host root), the recommended value, how the current value is
compared, the severity of a mismatch and *why*, with its source. Sources are the field host
checklist and troubleshooting table of ``OPERATIONS.md`` sections 4-5 ([F]), the Linux kernel
documentation (``Documentation/admin-guide/sysctl/{kernel,vm,net}.rst``,
``Documentation/admin-guide/mm/transhuge.rst``, ``Documentation/networking/ip-sysctl.rst``) and
the checks NVIDIA's ``mlnx_tune`` performs.

A user YAML file overrides or adds checks::

    base: training            # or inference (default: training)
    disable: [mtu]            # check ids to drop
    checks:
      - id: sysctl.net.core.somaxconn
        recommended: "4096"   # override fields of an existing check
      - id: sysctl.vm.swappiness    # a new check needs kind (and path for sysctl)
        kind: sysctl
        path: proc/sys/vm/swappiness
        recommended: "10"
        compare: le
        severity: warn
        why: fewer swap-outs of pinned buffers
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from fabricscope.model.errors import ConfigError

#: How a current value is compared with the recommended one.
#: eq: equal strings (whitespace collapsed); ge / le: integers; range_covers: "LO HI" covers
#: the recommended range; absent: the named thing must not be present; report: record only.
COMPARISONS = ("eq", "ge", "le", "range_covers", "absent", "report")
SEVERITIES = ("fail", "warn")
#: kinds a probe knows how to read (see :mod:`fabricscope.preflight.probe`).
KINDS = ("sysctl", "thp", "governor", "irqbalance", "irq_affinity", "ring", "mtu", "speed",
         "operstate", "hugepages", "firmware", "iommu")
#: kinds whose fix is reversible and that ``--fix`` may apply (fix.py).
REVERSIBLE_KINDS = ("sysctl", "thp", "governor", "irq_affinity", "ring")

_OPS = "OPERATIONS.md s5 host checklist [F]"
_IPS = "kernel Documentation/networking/ip-sysctl.rst"


@dataclass(frozen=True)
class CheckSpec:
    """One check of a profile.

    ``path`` is relative to the host root (``proc/sys/net/core/somaxconn``) for ``sysctl``
    checks and empty for the others (their probe knows where to read). ``recommended`` is a
    string so a profile is plain data (YAML / JSON round-trip).
    """

    id: str
    kind: str
    recommended: str
    compare: str = "eq"
    severity: str = "warn"
    why: str = ""
    source: str = ""
    path: str = ""

    @property
    def reversible(self) -> bool:
        """Whether ``--fix`` may change this setting (and undo it)."""
        return self.kind in REVERSIBLE_KINDS


@dataclass(frozen=True)
class Profile:
    """A named, ordered set of checks."""

    name: str
    checks: tuple[CheckSpec, ...]

    def check(self, check_id: str) -> CheckSpec | None:
        """The check with this id, or None."""
        return next((c for c in self.checks if c.id == check_id), None)


def _sysctl(name: str, recommended: str, compare: str, severity: str, why: str,
            source: str = _OPS) -> CheckSpec:
    return CheckSpec(id=f"sysctl.{name}", kind="sysctl", recommended=recommended,
                     compare=compare, severity=severity, why=why, source=source,
                     path="proc/sys/" + name.replace(".", "/"))


def _common(*, cc: str, roce_sev: str, fin_timeout: bool) -> list[CheckSpec]:
    checks = [
        _sysctl("net.core.somaxconn", "65535", "ge", "warn",
                "listen backlog for many ranks / clients connecting at once"),
        _sysctl("net.ipv4.tcp_tw_reuse", "1", "eq", "fail",
                "TIME_WAIT exhausting local ports resets gRPC connections (29% of projects)",
                _OPS + "; OPERATIONS.md s4 table [F]"),
        _sysctl("net.core.rmem_max", "134217728", "ge", "warn",
                "TCP bootstrap / NCCL socket transport needs large receive buffers"),
        _sysctl("net.core.wmem_max", "134217728", "ge", "warn",
                "TCP bootstrap / NCCL socket transport needs large send buffers"),
        _sysctl("net.ipv4.tcp_congestion_control", cc, "eq", "warn",
                f"{cc} for this kind of host (cubic for training, bbr for inference)"),
        _sysctl("net.ipv4.ip_local_port_range", "1024 65535", "range_covers", "warn",
                "enough ephemeral ports for many short connections"),
        _sysctl("net.ipv4.conf.all.arp_ignore", "1", "eq", roce_sev,
                "RoCE: answer ARP only on the interface that owns the address",
                _OPS + "; " + _IPS),
        _sysctl("net.ipv4.conf.all.arp_announce", "2", "eq", roce_sev,
                "RoCE: use the best local address in ARP requests", _OPS + "; " + _IPS),
        _sysctl("kernel.numa_balancing", "0", "eq", "warn",
                "automatic NUMA page migration stalls pinned GPU / NIC buffers",
                "mlnx_tune; kernel Documentation/admin-guide/sysctl/kernel.rst"),
        _sysctl("vm.zone_reclaim_mode", "0", "eq", "warn",
                "zone reclaim evicts page cache instead of using the remote node",
                "mlnx_tune; kernel Documentation/admin-guide/sysctl/vm.rst"),
    ]
    if fin_timeout:
        checks.append(_sysctl("net.ipv4.tcp_fin_timeout", "30", "le", "warn",
                              "frees FIN_WAIT2 sockets sooner; with tcp_tw_reuse fixes "
                              "gRPC connection resets", "OPERATIONS.md s4 table [F]; " + _IPS))
    return checks


def _host(*, thp_sev: str, min_speed: str) -> list[CheckSpec]:
    return [
        CheckSpec("thp", "thp", "never", "eq", thp_sev,
                  "transparent huge pages cause latency spikes in PyTorch hosts",
                  _OPS + "; kernel Documentation/admin-guide/mm/transhuge.rst"),
        CheckSpec("cpu.governor", "governor", "performance", "eq", "warn",
                  "frequency scaling adds latency to the collective's critical path",
                  _OPS + "; kernel Documentation/admin-guide/pm/cpufreq.rst"),
        CheckSpec("irqbalance", "irqbalance", "not running", "absent", "warn",
                  "irqbalance rewrites NIC IRQ affinity pinned to the NIC's NUMA node",
                  "mlnx_tune; " + _OPS),
        CheckSpec("nic.irq_affinity", "irq_affinity", "NIC NUMA node CPUs", "eq", "fail",
                  "NIC IRQs on the NIC's NUMA node cut AllReduce latency stddev by 63%",
                  _OPS + "; OPERATIONS.md s4 field facts [F]"),
        CheckSpec("nic.ring", "ring", "pre-set maximum", "ge", "warn",
                  "small RX rings drop packets under incast bursts",
                  "ethtool(8) -g/-G; NVIDIA ConnectX performance tuning"),
        CheckSpec("nic.mtu", "mtu", "9000", "ge", "warn",
                  "jumbo netdev MTU lets RoCE use its 4096-byte path MTU",
                  "mlnx_tune; NVIDIA RoCE configuration guide"),
        CheckSpec("nic.speed", "speed", min_speed, "ge", "warn",
                  "link trained below its expected rate (Mb/s)", "mlnx_tune; " + _OPS),
        CheckSpec("nic.operstate", "operstate", "up", "eq", "fail",
                  "a fabric NIC that is not up carries no traffic",
                  "kernel Documentation/ABI/testing/sysfs-class-net"),
        CheckSpec("hugepages", "hugepages", "free on every NUMA node", "eq", "warn",
                  "a NUMA node out of huge pages fails model load (NCCL 'Invalid argument')",
                  "OPERATIONS.md s4 table [F]"),
        CheckSpec("nic.firmware", "firmware", "", "report", "warn",
                  "firmware DMA deadlocks drop RoCE links; compare versions across the fleet",
                  "OPERATIONS.md s4 table [F]; mlnx_tune"),
        CheckSpec("iommu", "iommu", "off or passthrough (iommu=pt)", "eq", "warn",
                  "IOMMU translation slows GPUDirect RDMA / peer-to-peer DMA",
                  "mlnx_tune; NVIDIA GPUDirect RDMA documentation"),
    ]


#: The built-in profiles.
PROFILES: dict[str, Profile] = {
    "training": Profile("training", tuple(_common(cc="cubic", roce_sev="fail", fin_timeout=False)
                                          + _host(thp_sev="fail", min_speed="100000"))),
    "inference": Profile("inference", tuple(_common(cc="bbr", roce_sev="warn", fin_timeout=True)
                                            + _host(thp_sev="warn", min_speed="25000"))),
}

_FIELDS = {f.name for f in fields(CheckSpec)}


def _validate(spec: CheckSpec, src: str, i: int) -> CheckSpec:
    where = f"{src}: checks[{i}]"
    if spec.kind not in KINDS:
        raise ConfigError(f"{where}.kind: {spec.kind!r}: expected one of {', '.join(KINDS)}")
    if spec.compare not in COMPARISONS:
        raise ConfigError(f"{where}.compare: {spec.compare!r}: expected one of "
                          f"{', '.join(COMPARISONS)}")
    if spec.severity not in SEVERITIES:
        raise ConfigError(f"{where}.severity: {spec.severity!r}: expected fail or warn")
    if spec.kind == "sysctl" and (not spec.path.startswith("proc/sys/") or ".." in spec.path):
        raise ConfigError(f"{where}.path: {spec.path!r}: a sysctl path must start with proc/sys/")
    if spec.compare in ("ge", "le") and spec.kind == "sysctl":
        try:
            int(spec.recommended)
        except ValueError:
            raise ConfigError(f"{where}.recommended: {spec.recommended!r}: {spec.compare} "
                              "needs an integer") from None
    return spec


def profile_from_mapping(data: Any, *, source: str) -> Profile:
    """Build a profile from parsed YAML (see the module docstring for the schema)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with base / checks / disable")
    unknown = set(data) - {"base", "checks", "disable", "name"}
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r} "
                          "(expected base, name, checks, disable)")
    base_name = str(data.get("base", "training"))
    if base_name not in PROFILES:
        raise ConfigError(f"{source}: base: {base_name!r}: expected training or inference")
    checks = list(PROFILES[base_name].checks)
    disable = data.get("disable") or []
    if not isinstance(disable, list):
        raise ConfigError(f"{source}: disable: expected a list of check ids, got {disable!r}")
    known = {c.id for c in checks}
    for d in disable:
        if d not in known:
            raise ConfigError(f"{source}: disable: {d!r}: no such check in {base_name}")
    checks = [c for c in checks if c.id not in disable]
    items = data.get("checks") or []
    if not isinstance(items, list):
        raise ConfigError(f"{source}: checks: expected a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "id" not in item:
            raise ConfigError(f"{source}: checks[{i}]: expected a mapping with an id")
        bad = set(item) - _FIELDS
        if bad:
            raise ConfigError(f"{source}: checks[{i}]: unknown field {sorted(bad)[0]!r}")
        values = {k: str(v) for k, v in item.items()}
        pos = next((j for j, c in enumerate(checks) if c.id == values["id"]), None)
        if pos is not None:
            checks[pos] = _validate(replace(checks[pos], **values), source, i)
            continue
        if "kind" not in values or "recommended" not in values:
            raise ConfigError(f"{source}: checks[{i}]: new check {values['id']!r} needs kind "
                              "and recommended")
        checks.append(_validate(CheckSpec(**values), source, i))
    return Profile(str(data.get("name", Path(source).stem)), tuple(checks))


def load_profile(name_or_path: str) -> Profile:
    """``training`` / ``inference``, or a YAML file path that overrides / adds checks."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"--profile: {name_or_path!r}: expected training, inference or a "
                          "YAML file")
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{line} not valid YAML") from None
    return profile_from_mapping(data, source=str(path))
