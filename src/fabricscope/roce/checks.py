"""Judge parsed RoCE bring-up evidence against expectations: pass / warn / fail / skip (pure).

The checks follow the three-step bring-up of OPERATIONS.md section 5 (ibstat: every port
Active / LinkUp at the expected rate; iblinkinfo: the neighbour is the inventory's switch port;
perftest: >= 90 % of line rate, latency near 1.2 us, the same GID index at both ends) plus the
RoCE configuration a lossless fabric needs (NVIDIA "MTU considerations for RoCE based
applications": netdev MTU 4200 gives active_mtu 4096; PFC on the RoCE priority, DSCP trust,
ECN enabled; mlnx_qos(8)). Every result says what was expected, what was seen and, where one
exists, the command that fixes it. No subprocess, no files: evidence and expectations in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from fabricscope.model.records import Finding
from fabricscope.roce.parsers import (
    EcnState,
    GidEntry,
    IbPort,
    LinkInfo,
    LldpNeighbor,
    PerftestRun,
    QosConfig,
)

__all__ = ["CheckResult", "Evidence", "Expectations", "check_roce", "exit_code", "findings",
           "merge_ports", "summarize"]

Status = Literal["pass", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "skip")


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The verdict of one check on one subject (a NIC ``host/nicN`` or a device as seen).

    ``kind`` is the Finding kind a ``fail`` becomes (``roce-port-down``, ``roce-mtu``...).
    """

    name: str
    subject: str
    status: Status
    expected: str
    seen: str
    fix: str = ""
    kind: str = ""
    evidence: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Expectations:
    """What a healthy RoCE port looks like; every value is a documented CLI option.

    rate_gbps:      expected port rate (None: the inventory NIC speed, else not checked)
    link_layer:     "Ethernet" for RoCE ("InfiniBand" for an IB fabric)
    active_mtu:     RDMA path MTU (4096: the largest IB MTU; RoCE needs netdev MTU >= 4200)
    netdev_mtu_min: the Ethernet MTU that carries a 4096 RoCE payload plus headers (4200)
    bw_fraction:    perftest average bandwidth >= this fraction of line rate (0.9: 180 of 200)
    lat_us, lat_factor: perftest typical latency <= lat_us x lat_factor (1.2 us x 1.5)
    pfc_priority:   the RoCE lossless priority (3); PFC must be on it and only on it
    trust:          the QoS trust state (dscp)
    ecn:            ECN (DCQCN) must be enabled on the RoCE priority where /sys shows it
    gid_index:      the GID index jobs use (None: the index perftest used, if any)
    """

    rate_gbps: float | None = None
    link_layer: str = "Ethernet"
    active_mtu: int = 4096
    netdev_mtu_min: int = 4200
    bw_fraction: float = 0.9
    lat_us: float = 1.2
    lat_factor: float = 1.5
    pfc_priority: int = 3
    trust: str = "dscp"
    ecn: bool = True
    gid_index: int | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything read about one host; ``skips`` lists (what, why) for each absent source."""

    ports: tuple[IbPort, ...] = ()
    gids: tuple[GidEntry, ...] = ()
    links: tuple[LinkInfo, ...] = ()
    runs: tuple[PerftestRun, ...] = ()
    qos: tuple[QosConfig, ...] = ()
    ecn: tuple[EcnState, ...] = ()
    netdev_mtu: Mapping[str, int] = field(default_factory=dict)
    lldp: tuple[LldpNeighbor, ...] = ()
    skips: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.ports or self.gids or self.links or self.runs or self.qos or self.ecn
                    or self.netdev_mtu or self.lldp)


def merge_ports(ports: Sequence[IbPort]) -> tuple[IbPort, ...]:
    """One record per (device, port): each field from the first source that has it.

    Sources come in the order read (ibstat, ibv_devinfo, sysfs): ibstat wins for state and
    rate, ibv_devinfo adds the MTUs, sysfs the netdev. ``truncated`` only if every source was.
    """
    out: dict[tuple[str, int], IbPort] = {}
    for p in ports:
        key = (p.device, p.port)
        if key not in out:
            out[key] = p
            continue
        cur = out[key]
        upd: dict[str, Any] = {}
        for f in fields(IbPort):
            if getattr(cur, f.name) is None and getattr(p, f.name) is not None:
                upd[f.name] = getattr(p, f.name)
        upd["truncated"] = cur.truncated and p.truncated
        upd["source"] = cur.source if p.source in cur.source else f"{cur.source}, {p.source}"
        out[key] = replace(cur, **upd)
    return tuple(sorted(out.values(), key=lambda p: (_natural(p.device), p.port)))


def _natural(s: str) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def _fmt(x: float) -> str:
    return f"{x:g}"


def check_roce(
    ev: Evidence,
    *,
    expect: Expectations = Expectations(),
    nic_of: Mapping[str, str] | None = None,
    rate_of: Mapping[str, float] | None = None,
    peer_of: Mapping[str, str] | None = None,
) -> list[CheckResult]:
    """Every check on every port / run / interface in ``ev``; a check with no data is ``skip``.

    nic_of:  RDMA device -> inventory NIC id (the subject of results and findings)
    rate_of: RDMA device -> expected rate in Gb/s (inventory NIC port speed)
    peer_of: RDMA device -> expected peer port id (inventory ``peer_port``, ``leaf-01:eth3``)
    """
    nic_of = nic_of or {}
    rate_of = rate_of or {}
    peer_of = peer_of or {}
    res: list[CheckResult] = []
    for what, why in ev.skips:
        res.append(CheckResult(what, "-", "skip", "tool output", why))
    ports = merge_ports(ev.ports)
    dev_of_netdev = _dev_of_netdev(ev, ports)
    subj = _subject(nic_of)
    res += _port_checks(ports, expect, subj, rate_of)
    res += _mtu_checks(ports, ev, expect, subj, dev_of_netdev)
    res += _gid_checks(ports, ev, expect, subj)
    res += _perftest_checks(ports, ev.runs, expect, subj, rate_of)
    res += _qos_checks(ev, expect, subj, dev_of_netdev)
    res += _neighbour_checks(ports, ev, subj, peer_of, dev_of_netdev)
    return res


def _subject(nic_of: Mapping[str, str]) -> Any:
    def s(device: str | None, port: int | None = None) -> str:
        if device is None:
            return "?"
        base = nic_of.get(device, device)
        return base if port in (None, 1) or base != device else f"{device}/{port}"
    return s


def _dev_of_netdev(ev: Evidence, ports: Sequence[IbPort]) -> dict[str, str]:
    out = {g.netdev: g.device for g in ev.gids if g.netdev}
    out.update({p.netdev: p.device for p in ports if p.netdev})
    return out


# --------------------------------------------------------------------------- ports
def _port_checks(ports: Sequence[IbPort], ex: Expectations, subj: Any,
                 rate_of: Mapping[str, float]) -> list[CheckResult]:
    if not ports:
        why = "no port data (ibstat, ibv_devinfo, /sys/class/infiniband)"
        return [CheckResult(n, "-", "skip", e, why) for n, e in (
            ("port-state", "Active"), ("phys-state", "LinkUp"), ("rate", "an expected rate"),
            ("link-layer", ex.link_layer))]
    out: list[CheckResult] = []
    for p in ports:
        s = subj(p.device, p.port)
        src = f"{p.device} port {p.port} ({p.source})"
        if p.truncated and p.state is None:
            out.append(CheckResult("port-state", s, "warn", "Active",
                                   "output ends before the port's State (truncated)",
                                   "save the whole output again", evidence=src))
        elif p.state is not None:
            ok = p.state == "Active"
            out.append(CheckResult(
                "port-state", s, "pass" if ok else "fail", "Active", p.state,
                "" if ok else _down_fix(p), kind="" if ok else "roce-port-down", evidence=src))
        if p.phys_state is not None:
            ok = p.phys_state == "LinkUp"
            out.append(CheckResult(
                "phys-state", s, "pass" if ok else "fail", "LinkUp", p.phys_state,
                "" if ok else _phys_fix(p), kind="" if ok else "roce-port-down", evidence=src))
        want = ex.rate_gbps if ex.rate_gbps is not None else rate_of.get(p.device)
        if p.rate_gbps is None:
            pass
        elif want is None:
            out.append(CheckResult("rate", s, "skip", "an expected rate",
                                   f"{_fmt(p.rate_gbps)} Gb/s; give --expect-rate or --inventory "
                                   "with --host", evidence=src))
        elif p.state is not None and p.state != "Active":
            out.append(CheckResult("rate", s, "skip", f"{_fmt(want)} Gb/s",
                                   f"{_fmt(p.rate_gbps)} Gb/s on a port that is {p.state} "
                                   "(rate is meaningless until it is Active)", evidence=src))
        elif p.rate_gbps < want:
            out.append(CheckResult(
                "rate", s, "fail", f"{_fmt(want)} Gb/s", f"{_fmt(p.rate_gbps)} Gb/s",
                f"check the cable / transceiver rating and the switch port speed; "
                f"`ethtool {p.netdev or '<netdev>'}` shows the negotiated speed",
                kind="roce-rate-low", evidence=src))
        else:
            st: Status = "pass" if p.rate_gbps == want else "warn"
            out.append(CheckResult("rate", s, st, f"{_fmt(want)} Gb/s",
                                   f"{_fmt(p.rate_gbps)} Gb/s", evidence=src))
        if p.link_layer is not None:
            ok = p.link_layer.lower() == ex.link_layer.lower()
            out.append(CheckResult(
                "link-layer", s, "pass" if ok else "warn", ex.link_layer, p.link_layer,
                "" if ok else f"`mlxconfig -d <pci> set LINK_TYPE_P{p.port}="
                              f"{2 if ex.link_layer.lower() == 'ethernet' else 1}` and reboot "
                              "(or --link-layer if this port is meant to be "
                              f"{p.link_layer})", evidence=src))
    return out


def _down_fix(p: IbPort) -> str:
    if p.link_layer and p.link_layer.lower() == "ethernet":
        return (f"`ip link set dev {p.netdev or '<netdev>'} up`; if it stays down check the "
                "cable and the switch port")
    return "check the cable and that the subnet manager runs (`sminfo`)"


def _phys_fix(p: IbPort) -> str:
    if p.phys_state == "Polling":
        return "no signal from the peer: reseat / replace the cable or transceiver, check the switch port is enabled"
    if p.phys_state == "Disabled":
        if p.link_layer and p.link_layer.lower() == "ethernet":
            return f"`ip link set dev {p.netdev or '<netdev>'} up` (the port is administratively disabled)"
        return f"`ibportstate -C {p.device} -P {p.port} <lid> {p.port} enable` (administratively disabled)"
    return "check the cable and the switch port"


# --------------------------------------------------------------------------- MTU
def _mtu_checks(ports: Sequence[IbPort], ev: Evidence, ex: Expectations, subj: Any,
                dev_of_netdev: Mapping[str, str]) -> list[CheckResult]:
    out: list[CheckResult] = []
    netdev_of = {v: k for k, v in dev_of_netdev.items()}
    seen_mtu = False
    for p in ports:
        if p.active_mtu is None:
            continue
        seen_mtu = True
        ok = p.active_mtu >= ex.active_mtu
        nd = p.netdev or netdev_of.get(p.device, "<netdev>")
        out.append(CheckResult(
            "active-mtu", subj(p.device, p.port), "pass" if ok else "fail", f">= {ex.active_mtu}",
            str(p.active_mtu), "" if ok else f"`ip link set dev {nd} mtu {ex.netdev_mtu_min}` "
            f"(RoCE active_mtu follows the netdev MTU; {ex.netdev_mtu_min} gives {ex.active_mtu})",
            kind="" if ok else "roce-mtu", evidence=f"{p.device} port {p.port} ({p.source})"))
    for r in ev.runs:
        if r.mtu is None or r.link_type is None or r.link_type.lower() != "ethernet":
            continue
        seen_mtu = True
        ok = r.mtu >= ex.active_mtu
        out.append(CheckResult(
            "perftest-mtu", subj(r.device), "pass" if ok else "fail", f">= {ex.active_mtu}",
            str(r.mtu), "" if ok else f"raise the netdev MTU of {r.device} to "
            f"{ex.netdev_mtu_min} at both ends (`ip link set dev <netdev> mtu "
            f"{ex.netdev_mtu_min}`)", kind="" if ok else "roce-mtu", evidence=r.source))
    for nd, mtu in sorted(ev.netdev_mtu.items()):
        seen_mtu = True
        ok = mtu >= ex.netdev_mtu_min
        dev = dev_of_netdev.get(nd)
        out.append(CheckResult(
            "netdev-mtu", subj(dev) if dev else nd, "pass" if ok else "fail",
            f">= {ex.netdev_mtu_min}", str(mtu),
            "" if ok else f"`ip link set dev {nd} mtu {ex.netdev_mtu_min}` (and the switch "
            "port MTU at least as large)", kind="" if ok else "roce-mtu",
            evidence=f"/sys/class/net/{nd}/mtu"))
    if not seen_mtu:
        out.append(CheckResult("mtu", "-", "skip", f"active_mtu {ex.active_mtu}, netdev MTU >= "
                               f"{ex.netdev_mtu_min}", "no MTU data (ibv_devinfo, perftest, "
                               "/sys/class/net)"))
    return out


# --------------------------------------------------------------------------- GIDs
def _gid_checks(ports: Sequence[IbPort], ev: Evidence, ex: Expectations, subj: Any
                ) -> list[CheckResult]:
    out: list[CheckResult] = []
    eth_devs = {p.device for p in ports if (p.link_layer or "").lower() == "ethernet"}
    if not ev.gids:
        if eth_devs or any((r.link_type or "").lower() == "ethernet" for r in ev.runs):
            out.append(CheckResult("gid-v2", "-", "skip", "a RoCE v2 GID",
                                   "no GID table (show_gids, ibv_devinfo -v, /sys gids)"))
    else:
        table: dict[tuple[str, int], GidEntry] = {(g.device, g.index): g for g in ev.gids}
        used: dict[str, set[int]] = {}
        for r in ev.runs:
            if r.device and r.gid_index is not None:
                used.setdefault(r.device, set()).add(r.gid_index)
        for dev in sorted({g.device for g in ev.gids}, key=_natural):
            idxs = used.get(dev, set()) | ({ex.gid_index} if ex.gid_index is not None else set())
            v2 = sorted(g.index for g in ev.gids if g.device == dev and g.version == "v2")
            v2_ip = sorted(g.index for g in ev.gids
                           if g.device == dev and g.version == "v2" and g.ipv4)
            if not idxs:
                ok = bool(v2_ip)
                out.append(CheckResult(
                    "gid-v2", subj(dev), "pass" if ok else "fail", "a RoCE v2 GID with an IPv4 "
                    "address", f"v2 with IPv4 at index {v2_ip}" if ok else
                    f"none (v2 indices {v2})", "" if ok else "assign the interface its IPv4 "
                    "address (the GID table follows it); `cma_roce_mode -d "
                    f"{dev} -p 1 -m 2` for v2", kind="" if ok else "roce-gid-mismatch",
                    evidence="GID table"))
            for i in sorted(idxs):
                g = table.get((dev, i))
                ok = g is not None and g.version == "v2"
                seen = ("empty" if g is None else
                        f"{g.version or 'unknown version'} {g.gid}" + (f" ({g.ipv4})" if g.ipv4 else ""))
                out.append(CheckResult(
                    "gid-v2", subj(dev), "pass" if ok else "fail", f"RoCE v2 GID at index {i}",
                    seen, "" if ok else f"use a v2 index with an IPv4 address: {v2_ip or v2} "
                    f"(`ib_write_bw -x {_first(v2_ip or v2)}`, "
                    f"NCCL_IB_GID_INDEX)", kind="" if ok else "roce-gid-mismatch",
                    evidence=f"{dev} GID[{i}] ({g.source if g else 'GID table'})"))
    out += _gid_consistency(ev.runs, subj)
    return out


def _first(idx: Sequence[int]) -> str:
    return str(idx[0]) if idx else "<index>"


def _gid_consistency(runs: Sequence[PerftestRun], subj: Any) -> list[CheckResult]:
    """Pair the two ends of one perftest and compare their GID indices.

    Two runs are the ends of one test when one's local GID is the other's remote GID (and
    back); without GIDs (a truncated output), a server and a client of the same test title in
    the same evidence are paired. Unpaired runs cannot be compared: skip with the reason.
    """
    out: list[CheckResult] = []
    ends = [r for r in runs if r.gid_index is not None]
    used: set[int] = set()
    for i, a in enumerate(ends):
        for j in range(i + 1, len(ends)):
            if i in used or j in used:
                continue
            b = ends[j]
            cross = (a.local_gid and a.remote_gid and a.local_gid == b.remote_gid
                     and a.remote_gid == b.local_gid)
            half = (a.local_gid and (a.local_gid == b.remote_gid or a.remote_gid == b.local_gid))
            roles = {a.role, b.role} == {"server", "client"} and a.test == b.test
            if not (cross or half or roles):
                continue
            used |= {i, j}
            ok = a.gid_index == b.gid_index
            how = "GIDs cross-match" if cross else "one GID matches" if half else "server + client of one test"
            out.append(CheckResult(
                "gid-index-ends", subj(a.device), "pass" if ok else "fail",
                "the same GID index at both ends",
                f"{a.role} {a.gid_index} ({a.source}), {b.role} {b.gid_index} ({b.source})",
                "" if ok else f"run both ends with the same RoCE v2 index: `{_tool(a)} -d "
                f"{a.device or '<dev>'} -x <index>` (see show_gids)",
                kind="" if ok else "roce-gid-mismatch", evidence=f"paired by: {how}"))
    if ends and not used:
        out.append(CheckResult("gid-index-ends", "-", "skip", "both ends of a perftest",
                               f"{len(ends)} perftest output(s), none are the two ends of one "
                               "test (save the server's and the client's output)"))
    return out


def _tool(r: PerftestRun) -> str:
    t = (r.test or "").lower()
    op = "read" if "read" in t else "send" if "send" in t else "write"
    return f"ib_{op}_{'lat' if r.kind == 'lat' else 'bw'}"


# --------------------------------------------------------------------------- perftest
def _perftest_checks(ports: Sequence[IbPort], runs: Sequence[PerftestRun], ex: Expectations,
                     subj: Any, rate_of: Mapping[str, float]) -> list[CheckResult]:
    out: list[CheckResult] = []
    if not runs:
        why = "no perftest output (perftest needs both ends: save them and use --from)"
        return [CheckResult("perftest-bw", "-", "skip", f">= {ex.bw_fraction:.0%} of line rate", why),
                CheckResult("perftest-lat", "-", "skip",
                            f"<= {_fmt(ex.lat_us * ex.lat_factor)} us", why)]
    port_rate = {p.device: p.rate_gbps for p in ports if p.rate_gbps is not None}
    for r in runs:
        s = subj(r.device) if r.device else r.source.replace("\\", "/").rsplit("/", 1)[-1]
        if r.errors:
            errs = list(dict.fromkeys(r.errors))
            gid = any("gid" in e.lower() for e in errs)
            out.append(CheckResult(
                "perftest-error", s, "fail", "no error", "; ".join(errs),
                "compare the GID index (-x), MTU and link state of both ends; "
                "`show_gids` on each", kind="roce-gid-mismatch" if gid else "roce-perftest-error",
                evidence=r.source))
        if r.truncated:
            out.append(CheckResult("perftest-output", s, "warn", "a complete result table",
                                   "output ends early (truncated)", "save the whole output",
                                   evidence=r.source))
        if r.bw_rows:
            best = max(r.bw_rows, key=lambda b: b.avg_gbps)
            line = ex.rate_gbps if ex.rate_gbps is not None else rate_of.get(r.device or "",
                                                                             port_rate.get(r.device or ""))
            if line is None:
                out.append(CheckResult("perftest-bw", s, "skip", f">= {ex.bw_fraction:.0%} of "
                                       "line rate", f"{best.avg_gbps:.2f} Gb/s; no line rate "
                                       "(--expect-rate, inventory or ibstat)", evidence=r.source))
            else:
                need = ex.bw_fraction * line
                ok = best.avg_gbps >= need
                st: Status = "pass" if ok else "fail"
                if ok and best.avg_gbps > line * 1.02:
                    st = "warn"  # more than the port can carry: not this port's run?
                out.append(CheckResult(
                    "perftest-bw", s, st, f">= {_fmt(need)} Gb/s ({ex.bw_fraction:.0%} of "
                    f"{_fmt(line)})", f"{best.avg_gbps:.2f} Gb/s at {best.bytes} B",
                    "" if ok else "retest with larger messages and more QPs (`-s 1048576 -q 4`); "
                    "then check the rate, MTU, PCIe width and NUMA placement",
                    kind="" if ok else "roce-bw-low", evidence=r.source))
        if r.lat_rows:
            small = min(r.lat_rows, key=lambda x: x.bytes)
            limit = ex.lat_us * ex.lat_factor
            ok = small.t_typical <= limit
            out.append(CheckResult(
                "perftest-lat", s, "pass" if ok else "fail", f"<= {_fmt(limit)} us typical "
                f"({_fmt(ex.lat_us)} x {_fmt(ex.lat_factor)})",
                f"{small.t_typical:g} us typical at {small.bytes} B"
                + (f" (p99 {small.p99:g})" if small.p99 is not None else ""),
                "" if ok else "pin the test to the NIC's NUMA node (`numactl`), set the CPU "
                "governor to performance, check for a switch hop or congestion on the path",
                kind="" if ok else "roce-lat-high", evidence=r.source))
    return out


# --------------------------------------------------------------------------- QoS / ECN
def _qos_checks(ev: Evidence, ex: Expectations, subj: Any, dev_of_netdev: Mapping[str, str]
                ) -> list[CheckResult]:
    out: list[CheckResult] = []
    if not ev.qos and not ev.ecn:
        why = "no mlnx_qos output and no /sys/class/net/*/ecn"
        return [CheckResult("pfc", "-", "skip", f"PFC on priority {ex.pfc_priority} only", why),
                CheckResult("trust", "-", "skip", ex.trust, why)]
    want_pfc = tuple(i == ex.pfc_priority for i in range(8))
    for q in ev.qos:
        dev = dev_of_netdev.get(q.interface)
        s = subj(dev) if dev else q.interface
        if q.pfc is not None:
            ok = q.pfc == want_pfc
            out.append(CheckResult(
                "pfc", s, "pass" if ok else "fail", f"PFC on priority {ex.pfc_priority} only",
                f"PFC on {list(q.pfc_priorities or ())}",
                "" if ok else f"`mlnx_qos -i {q.interface} --pfc "
                f"{','.join('1' if b else '0' for b in want_pfc)}`",
                kind="" if ok else "roce-pfc-config", evidence=q.source))
        if q.trust is not None:
            ok = q.trust == ex.trust
            out.append(CheckResult(
                "trust", s, "pass" if ok else "fail", ex.trust, q.trust,
                "" if ok else f"`mlnx_qos -i {q.interface} --trust {ex.trust}`",
                kind="" if ok else "roce-pfc-config", evidence=q.source))
        else:
            out.append(CheckResult("trust", s, "skip", ex.trust, "not in the mlnx_qos output",
                                   evidence=q.source))
    if ex.ecn:
        p = ex.pfc_priority
        for e in ev.ecn:
            dev = dev_of_netdev.get(e.interface)
            s = subj(dev) if dev else e.interface
            for side, table in (("roce_np", e.np), ("roce_rp", e.rp)):
                if p not in table:
                    continue
                ok = table[p]
                out.append(CheckResult(
                    f"ecn-{side[5:]}", s, "pass" if ok else "fail", f"{side} enabled on priority {p}",
                    "enabled" if ok else "disabled",
                    "" if ok else f"`echo 1 > /sys/class/net/{e.interface}/ecn/{side}/enable/{p}`",
                    kind="" if ok else "roce-pfc-config",
                    evidence=f"/sys/class/net/{e.interface}/ecn/{side}/enable/{p}"))
    return out


# --------------------------------------------------------------------------- neighbour
def _neighbour_checks(ports: Sequence[IbPort], ev: Evidence, subj: Any,
                      peer_of: Mapping[str, str], dev_of_netdev: Mapping[str, str]
                      ) -> list[CheckResult]:
    out: list[CheckResult] = []
    if not peer_of:
        if ev.links or ev.lldp:
            out.append(CheckResult("neighbour", "-", "skip", "the inventory's switch port",
                                   "no inventory (give --inventory and --host)"))
        return out
    if not ev.links and not ev.lldp:
        return [CheckResult("neighbour", "-", "skip", "the inventory's switch port",
                            "no iblinkinfo or `lldpctl -f json` output")]
    guid_dev: dict[str, str] = {}
    for p in ports:
        for g in (p.port_guid, p.node_guid):
            if g:
                guid_dev[g.lower()] = p.device
    for dev, want in sorted(peer_of.items()):
        seen: str | None = None
        got_ok = False
        src = ""
        for ln in ev.links:
            if ln.local_guid and guid_dev.get(ln.local_guid.lower()) == dev:
                seen = f"{ln.peer_name} port {ln.peer_port}"
                got_ok = _peer_matches(want, ln.peer_name, str(ln.peer_port or ""))
                src = f"iblinkinfo line {ln.line}"
                break
        if seen is None:
            for nb in ev.lldp:
                if dev_of_netdev.get(nb.interface) == dev or nb.interface == dev:
                    seen = f"{nb.system} {nb.port}"
                    got_ok = _peer_matches(want, nb.system, nb.port)
                    src = f"lldp {nb.interface} ({nb.source})"
                    break
        if seen is None:
            out.append(CheckResult("neighbour", subj(dev), "skip", want,
                                   f"no link line for {dev} (its port GUID not in iblinkinfo / "
                                   "no LLDP on its netdev)"))
            continue
        out.append(CheckResult(
            "neighbour", subj(dev), "pass" if got_ok else "fail", want, seen,
            "" if got_ok else f"the cable is not where the inventory says: move it to {want} "
            "or correct the inventory", kind="" if got_ok else "roce-neighbour-mismatch",
            evidence=src))
    return out


def _peer_matches(want: str, system: str, port: str) -> bool:
    """``leaf-01:eth3`` matches a peer whose name contains ``leaf-01`` (case-insensitive) and
    whose port is ``eth3`` or the number 3 (IB switch ports are numbers)."""
    dev, _, pname = want.rpartition(":")
    if dev.lower() not in system.lower():
        return False
    if port == pname:
        return True
    digits = re.findall(r"\d+", pname)
    return bool(digits) and port.isdigit() and int(digits[-1]) == int(port)


# --------------------------------------------------------------------------- summary
def summarize(results: Sequence[CheckResult]) -> dict[str, int]:
    """Count of results per status."""
    out: dict[str, int] = {s: 0 for s in STATUSES}
    for r in results:
        out[r.status] += 1
    return out


def exit_code(results: Sequence[CheckResult]) -> int:
    """1 if any check failed, 2 if nothing could be checked (every result is skip), else 0."""
    if not results or all(r.status == "skip" for r in results):
        return 2
    return 1 if any(r.status == "fail" for r in results) else 0


_SCORE = {"roce-bw-low": 0.8, "roce-lat-high": 0.8, "roce-perftest-error": 0.9}


def findings(results: Sequence[CheckResult], *, at_ns: int, host: str | None = None
             ) -> list[Finding]:
    """One Finding per failed check. Configuration facts score 1.0; a single perftest run
    0.8 (one run can be disturbed by other traffic); the window is the instant of the check."""
    out: list[Finding] = []
    for r in results:
        if r.status != "fail":
            continue
        kind = r.kind or "roce-check-failed"
        subject = r.subject if (host is None or "/" in r.subject or ":" in r.subject) else f"{host}/{r.subject}"
        out.append(Finding(
            kind=kind, subject=subject, score=_SCORE.get(kind, 1.0), window=(at_ns, at_ns),
            evidence=tuple(x for x in (f"{r.name}: expected {r.expected}, seen {r.seen}",
                                       r.evidence) if x),
            action=r.fix, details={"check": r.name, "expected": r.expected, "seen": r.seen}))
    return out
