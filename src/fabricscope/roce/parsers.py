"""Parse the text of RoCE / InfiniBand bring-up tools into small frozen records (pure, no I/O).

Formats (each parser cites what it follows and was tested on real outputs, tests/data/roce/):

* ``ibstat`` (infiniband-diags, ibstat(8)): ``CA 'mlx5_0'`` blocks with ``Port N:`` sub-blocks
  of ``State`` / ``Physical state`` / ``Rate`` / ``Port GUID`` / ``Link layer``.
* ``iblinkinfo`` (infiniband-diags, iblinkinfo(8)): one line per port,
  ``LID PORT[  ] ==( 4X 25.78125 Gbps Active/  LinkUp)==>  LID PORT[  ] "peer" ( )``.
* ``ibv_devinfo [-v]`` (rdma-core libibverbs/examples/devinfo.c): ``hca_id:`` blocks,
  ``port:`` sub-blocks of ``key: value`` and, with ``-v``, ``GID[ n]: gid, RoCE v2`` lines.
* ``show_gids`` (MLNX_OFED / mlnx-tools): ``DEV PORT INDEX GID IPv4 VER DEV`` table.
* perftest (linux-rdma/perftest ``ib_send_bw``, ``ib_write_bw``, ``ib_read_bw``, ``*_lat``):
  the banner (``Device``, ``Link type``, ``GID index``, ``Mtu``), the local / remote address
  and ``GID:`` lines, the result table, and error lines. ``MB/sec`` (also ``MiB/sec``) is
  2**20 bytes/s and ``Gb/sec`` is 1.25e8 bytes/s, as perftest's ``format_factor``
  (src/perftest_resources.c: ``report_fmt == MBS ? 0x100000 : 125000000``).
* ``mlnx_qos -i IF`` (MLNX_OFED, "mlnx_qos" community doc DOC-2792): ``Priority trust state``,
  ``PFC configuration:`` followed by ``priority 0 1 .. 7`` / ``enabled 0 0 0 1 ..``.
* sysfs (Documentation/ABI/stable/sysfs-class-infiniband): ``ports/N/state`` (``4: ACTIVE``),
  ``phys_state`` (``5: LinkUp``), ``rate`` (``200 Gb/sec (4X HDR)``), ``link_layer``,
  ``gids/N``, ``gid_attrs/types/N`` (``RoCE v2``), ``gid_attrs/ndevs/N``.

Every parser ignores lines it does not know, flags output that stops early (``truncated``),
and raises :class:`~fabricscope.model.errors.TraceFormatError` (one line: source, line number,
bad value) when a known field holds a value it cannot read or nothing in the text is its format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from fabricscope.model.errors import TraceFormatError

__all__ = [
    "BwRow",
    "EcnState",
    "GidEntry",
    "IbPort",
    "LatRow",
    "LinkInfo",
    "LldpNeighbor",
    "ParsedFile",
    "PerftestRun",
    "QosConfig",
    "detect_format",
    "parse_iblinkinfo",
    "parse_ibstat",
    "parse_ibv_devinfo",
    "parse_lldpctl_json",
    "parse_mlnx_qos",
    "parse_perftest",
    "parse_show_gids",
    "parse_sysfs_gid",
    "parse_sysfs_port",
    "parse_text",
]

Format = Literal["ibstat", "iblinkinfo", "ibv_devinfo", "show_gids", "perftest", "mlnx_qos",
                 "lldpctl"]

# perftest format_factor (bytes per second per reported unit).
_MB_BYTES = float(0x100000)
_GB_BITS_BYTES = 125_000_000.0


@dataclass(frozen=True, slots=True)
class IbPort:
    """One port of one RDMA device as a tool saw it; None where the tool does not say.

    ``state`` / ``phys_state`` are normalized to ``Active`` / ``Down`` / ``Init`` / ``Armed``
    and ``LinkUp`` / ``Polling`` / ``Disabled`` / ``Sleep`` ... (ibstat spelling).
    """

    device: str
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None  # "Ethernet" (RoCE) or "InfiniBand"
    active_mtu: int | None = None
    max_mtu: int | None = None
    port_guid: str | None = None
    node_guid: str | None = None
    netdev: str | None = None
    source: str = ""
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class GidEntry:
    """One GID table entry (show_gids row, ``ibv_devinfo -v`` GID line or sysfs)."""

    device: str
    port: int
    index: int
    gid: str
    version: str | None  # "v1" | "v2" | None (not shown)
    ipv4: str | None = None
    netdev: str | None = None
    source: str = ""


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """One ``iblinkinfo`` port line: the local end and what is on the other side of the cable."""

    node: str  # the CA / switch header the line sits under ("" when none)
    local_guid: str | None
    local_lid: int
    local_port: int
    width: str | None
    lane_gbps: float | None
    state: str
    phys_state: str
    peer_guid: str | None
    peer_lid: int | None
    peer_port: int | None
    peer_name: str
    line: int = 0

    @property
    def rate_gbps(self) -> float | None:
        """The nominal link data rate: width x the generation's nominal lane rate.

        iblinkinfo prints the lane *signalling* rate (``4X 25.78125 Gbps`` is EDR 100G); the
        table maps signalling to data rate per IBTA generation (SDR .. XDR).
        """
        if self.width is None or self.lane_gbps is None:
            return None
        lanes = int(self.width.rstrip("xX"))
        return lanes * _NOMINAL_LANE.get(self.lane_gbps, self.lane_gbps)


_NOMINAL_LANE: dict[float, float] = {2.5: 2.5, 5.0: 5.0, 10.0: 10.0, 14.0625: 14.0,
                                     25.78125: 25.0, 53.125: 50.0, 106.25: 100.0, 212.5: 200.0}


@dataclass(frozen=True, slots=True)
class LldpNeighbor:
    """One LLDP neighbour from ``lldpctl -f json``: our interface, the peer system and port."""

    interface: str
    system: str
    port: str
    source: str = ""


@dataclass(frozen=True, slots=True)
class BwRow:
    """One perftest bandwidth row, converted to Gb/s (peak is 0 when perftest did not measure it)."""

    bytes: int
    iterations: int
    peak_gbps: float
    avg_gbps: float
    msg_rate_mpps: float | None


@dataclass(frozen=True, slots=True)
class LatRow:
    """One perftest latency row in microseconds; None where the column is absent."""

    bytes: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float | None = None
    t_stdev: float | None = None
    p99: float | None = None
    p999: float | None = None


@dataclass(frozen=True, slots=True)
class PerftestRun:
    """One perftest output (one end of a test)."""

    source: str
    test: str | None  # "RDMA_Write BW Test", "RDMA_Read Latency Test", ...
    role: Literal["server", "client", "unknown"]
    device: str | None
    link_type: str | None
    gid_index: int | None
    mtu: int | None
    local_gid: str | None
    remote_gid: str | None
    bw_rows: tuple[BwRow, ...] = ()
    lat_rows: tuple[LatRow, ...] = ()
    unit: str | None = None  # the unit printed ("Gb/sec", "MB/sec", "MiB/sec", "usec")
    errors: tuple[str, ...] = ()
    truncated: bool = False

    @property
    def kind(self) -> Literal["bw", "lat", "unknown"]:
        if self.lat_rows or (self.test and "Latency" in self.test):
            return "lat"
        if self.bw_rows or (self.test and "BW" in self.test):
            return "bw"
        return "unknown"


@dataclass(frozen=True, slots=True)
class QosConfig:
    """``mlnx_qos -i IF``: trust state and the PFC-enabled priorities (None: not shown)."""

    interface: str
    trust: str | None
    pfc: tuple[bool, ...] | None  # 8 entries, priority 0..7
    source: str = ""

    @property
    def pfc_priorities(self) -> tuple[int, ...] | None:
        return None if self.pfc is None else tuple(i for i, on in enumerate(self.pfc) if on)


@dataclass(frozen=True, slots=True)
class EcnState:
    """ECN enables of one netdev from ``/sys/class/net/IF/ecn/roce_{np,rp}/enable/P``."""

    interface: str
    np: dict[int, bool] = field(default_factory=dict)  # notification point (receiver)
    rp: dict[int, bool] = field(default_factory=dict)  # reaction point (sender)
    source: str = ""


@dataclass(frozen=True, slots=True)
class ParsedFile:
    """What :func:`parse_text` made of one file: its format and its records."""

    source: str
    format: Format
    ports: tuple[IbPort, ...] = ()
    gids: tuple[GidEntry, ...] = ()
    links: tuple[LinkInfo, ...] = ()
    runs: tuple[PerftestRun, ...] = ()
    qos: tuple[QosConfig, ...] = ()
    lldp: tuple[LldpNeighbor, ...] = ()

    @property
    def truncated(self) -> bool:
        return any(p.truncated for p in self.ports) or any(r.truncated for r in self.runs)


def _bad(source: str, line: int, what: str, value: str) -> TraceFormatError:
    return TraceFormatError(f"{source}: line {line}: {what}: cannot read {value.strip()!r}")


# --------------------------------------------------------------------------- detection
_SIGNATURES: tuple[tuple[Format, re.Pattern[str]], ...] = (
    ("ibstat", re.compile(r"^CA '[^']+'\s*$", re.M)),
    ("ibv_devinfo", re.compile(r"^\s*hca_id:\s*\S+", re.M)),
    ("show_gids", re.compile(r"^DEV\s+PORT\s+INDEX\s+GID", re.M)),
    ("iblinkinfo", re.compile(r"\[\s*\]\s*==\(.*\)==>")),
    ("mlnx_qos", re.compile(r"^\s*(PFC configuration:|Priority trust state:)", re.M)),
    ("perftest", re.compile(
        r"(BW Test|Latency Test|#bytes\s+#?iterations|Waiting for client to connect"
        r"|Unable to init the socket connection|Couldn't connect to|Failed to modify QP"
        r"|Unable to Connect the HCA|Port number \d+ state is|Couldn't get context)")),
)


def detect_format(text: str) -> Format | None:
    """The tool whose output ``text`` is, from its signature lines; None when none matches."""
    stripped = text.lstrip()
    if stripped.startswith("{") and '"lldp"' in stripped[:200]:
        return "lldpctl"
    for fmt, pat in _SIGNATURES:
        if pat.search(text):
            return fmt
    return None


def parse_text(text: str, *, source: str, fmt: Format | None = None) -> ParsedFile:
    """Parse one tool output of any supported format (detected when ``fmt`` is None).

    Raises TraceFormatError (line 1) when the text is none of the formats.
    """
    fmt = fmt or detect_format(text)
    if fmt is None:
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        raise TraceFormatError(
            f"{source}: line 1: not the output of ibstat, iblinkinfo, ibv_devinfo, show_gids, "
            f"perftest, mlnx_qos or lldpctl -f json: {first[:60]!r}")
    if fmt == "ibstat":
        return ParsedFile(source, fmt, ports=parse_ibstat(text, source=source))
    if fmt == "ibv_devinfo":
        ports, gids = parse_ibv_devinfo(text, source=source)
        return ParsedFile(source, fmt, ports=ports, gids=gids)
    if fmt == "show_gids":
        return ParsedFile(source, fmt, gids=parse_show_gids(text, source=source))
    if fmt == "iblinkinfo":
        return ParsedFile(source, fmt, links=parse_iblinkinfo(text, source=source))
    if fmt == "mlnx_qos":
        return ParsedFile(source, fmt, qos=(parse_mlnx_qos(text, source=source),))
    if fmt == "lldpctl":
        return ParsedFile(source, fmt, lldp=parse_lldpctl_json(text, source=source))
    return ParsedFile(source, fmt, runs=(parse_perftest(text, source=source),))


# --------------------------------------------------------------------------- ibstat
_KV = re.compile(r"^\s*([A-Za-z][A-Za-z _]*?)\s*:\s*(.*?)\s*$")
_PHYS_NORM = {"linkup": "LinkUp", "link_up": "LinkUp", "polling": "Polling",
              "disabled": "Disabled", "sleep": "Sleep", "linkerrorrecovery": "LinkErrorRecovery",
              "link_error_recovery": "LinkErrorRecovery", "phytest": "PhyTest",
              "portconfigurationtraining": "PortConfigurationTraining", "nop": "NoChange"}
_STATE_NORM = {"active": "Active", "port_active": "Active", "down": "Down", "port_down": "Down",
               "init": "Init", "port_init": "Init", "armed": "Armed", "port_armed": "Armed",
               "active_defer": "ActiveDefer", "port_active_defer": "ActiveDefer"}


def _norm_state(value: str) -> str:
    key = re.sub(r"\s*\(\d+\)$", "", value.strip())  # "PORT_ACTIVE (4)"
    key = re.sub(r"^\d+:\s*", "", key)  # "4: ACTIVE"
    return _STATE_NORM.get(key.lower(), key)


def _norm_phys(value: str) -> str:
    key = re.sub(r"\s*\(\d+\)$", "", value.strip())
    key = re.sub(r"^\d+:\s*", "", key)
    return _PHYS_NORM.get(key.lower().replace(" ", ""), key)


def parse_ibstat(text: str, *, source: str = "<ibstat>") -> tuple[IbPort, ...]:
    """Ports of ``ibstat`` output (infiniband-diags ibstat(8)), one record per ``Port N:``.

    ``Rate`` is the aggregate data rate in Gb/s (``Rate: 200``). A CA that announces more
    ``Number of ports`` than it lists, or a port block without State / Physical state / Rate /
    Link layer, is flagged ``truncated``.
    """
    out: list[IbPort] = []
    dev: str | None = None
    node_guid: str | None = None
    n_ports = 0
    seen_of_dev = 0
    cur: dict[str, object] | None = None

    def close_port() -> None:
        nonlocal cur
        if cur is not None and dev is not None:
            complete = all(k in cur for k in ("state", "phys_state", "rate_gbps", "link_layer"))
            out.append(IbPort(device=dev, port=int(str(cur["port"])),
                              state=_opt(cur, "state"), phys_state=_opt(cur, "phys_state"),
                              rate_gbps=_optf(cur, "rate_gbps"), link_layer=_opt(cur, "link_layer"),
                              port_guid=_opt(cur, "port_guid"), node_guid=node_guid,
                              source=source, truncated=not complete))
        cur = None

    def close_dev() -> None:
        nonlocal seen_of_dev
        close_port()
        if dev is not None and seen_of_dev < n_ports:
            # the CA promised more ports than the text holds: output cut short
            out.append(IbPort(device=dev, port=seen_of_dev + 1, node_guid=node_guid,
                              source=source, truncated=True))
        seen_of_dev = 0

    for no, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^CA '([^']+)'\s*$", line)
        if m:
            close_dev()
            dev, node_guid, n_ports = m.group(1), None, 0
            continue
        if dev is None:
            continue
        m = re.match(r"^\s+Port (\d+):\s*$", line)
        if m:
            close_port()
            cur = {"port": m.group(1)}
            seen_of_dev += 1
            continue
        kv = _KV.match(line)
        if not kv:
            continue
        key, val = kv.group(1).lower(), kv.group(2)
        if cur is None:
            if key == "number of ports":
                if not val.isdigit():
                    raise _bad(source, no, "Number of ports", val)
                n_ports = int(val)
            elif key == "node guid":
                node_guid = val
            continue
        if key == "state":
            cur["state"] = _norm_state(val)
        elif key == "physical state":
            cur["phys_state"] = _norm_phys(val)
        elif key == "rate":
            try:
                cur["rate_gbps"] = float(val)
            except ValueError:
                raise _bad(source, no, "Rate", val) from None
        elif key == "link layer":
            cur["link_layer"] = val
        elif key == "port guid":
            cur["port_guid"] = val
    if dev is None:
        raise TraceFormatError(f"{source}: line 1: no \"CA '<name>'\" block (not ibstat output)")
    close_dev()
    return tuple(out)


def _opt(d: dict[str, object], key: str) -> str | None:
    v = d.get(key)
    return None if v is None else str(v)


def _optf(d: dict[str, object], key: str) -> float | None:
    v = d.get(key)
    return None if v is None else float(str(v))


def _opti(d: dict[str, object], key: str) -> int | None:
    v = d.get(key)
    return None if v is None else int(str(v))


# --------------------------------------------------------------------------- ibv_devinfo
_DEVINFO_GID = re.compile(r"^\s*GID\[\s*(\d+)\]:\s*([0-9a-fA-F:]+)\s*(?:,\s*(.*?))?\s*$")


def parse_ibv_devinfo(text: str, *, source: str = "<ibv_devinfo>"
                      ) -> tuple[tuple[IbPort, ...], tuple[GidEntry, ...]]:
    """Ports (and, with ``-v``, GIDs) of ``ibv_devinfo`` (rdma-core libibverbs devinfo.c).

    ``active_mtu: 4096 (5)`` is the port's RDMA path MTU in bytes; ``state: PORT_ACTIVE (4)``.
    A GID line's ``RoCE v2`` / ``IB/RoCE v1`` suffix (rdma-core PR #682) gives its version.
    """
    ports: list[IbPort] = []
    gids: list[GidEntry] = []
    dev: str | None = None
    node_guid: str | None = None
    cur: dict[str, object] | None = None
    n_ports = seen = 0

    def close_dev() -> None:
        nonlocal seen
        close()
        if dev is not None and seen < n_ports:  # a device block cut before its ports
            ports.append(IbPort(device=dev, port=seen + 1, node_guid=node_guid, source=source,
                                truncated=True))
        seen = 0

    def close() -> None:
        nonlocal cur
        if cur is not None and dev is not None:
            complete = all(k in cur for k in ("state", "active_mtu", "link_layer"))
            ports.append(IbPort(device=dev, port=int(str(cur["port"])), state=_opt(cur, "state"),
                                phys_state=_opt(cur, "phys_state"),
                                link_layer=_opt(cur, "link_layer"),
                                active_mtu=_opti(cur, "active_mtu"), max_mtu=_opti(cur, "max_mtu"),
                                node_guid=node_guid, source=source, truncated=not complete))
        cur = None

    for no, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*hca_id:\s*(\S+)", line)
        if m:
            close_dev()
            dev, node_guid, n_ports = m.group(1), None, 0
            continue
        if dev is None:
            continue
        m = re.match(r"^\s*port:\s*(\d+)\s*$", line)
        if m:
            close()
            cur = {"port": m.group(1)}
            seen += 1
            continue
        g = _DEVINFO_GID.match(line)
        if g and cur is not None:
            suffix = (g.group(3) or "").lower()
            ver = "v2" if "v2" in suffix else "v1" if "v1" in suffix else None
            gids.append(GidEntry(dev, int(str(cur["port"])), int(g.group(1)), g.group(2), ver,
                                 source=source))
            continue
        kv = _KV.match(line)
        if not kv:
            continue
        key, val = kv.group(1).lower(), kv.group(2)
        if cur is None:
            if key == "node_guid":
                node_guid = val
            elif key == "phys_port_cnt":
                if not val.isdigit():
                    raise _bad(source, no, "phys_port_cnt", val)
                n_ports = int(val)
            continue
        if key == "state":
            cur["state"] = _norm_state(val)
        elif key == "phys_state":
            cur["phys_state"] = _norm_phys(val)
        elif key in ("active_mtu", "max_mtu"):
            mm = re.match(r"^(\d+)", val)
            if not mm:
                raise _bad(source, no, key, val)
            cur[key] = int(mm.group(1))
        elif key == "link_layer":
            cur["link_layer"] = val
    if dev is None:
        raise TraceFormatError(f"{source}: line 1: no 'hca_id:' block (not ibv_devinfo output)")
    close_dev()
    return tuple(ports), tuple(gids)


# --------------------------------------------------------------------------- show_gids
def parse_show_gids(text: str, *, source: str = "<show_gids>") -> tuple[GidEntry, ...]:
    """Rows of ``show_gids`` (MLNX_OFED): ``DEV PORT INDEX GID [IPv4] VER NETDEV``."""
    out: list[GidEntry] = []
    header = False
    for no, line in enumerate(text.splitlines(), 1):
        if re.match(r"^DEV\s+PORT\s+INDEX", line):
            header = True
            continue
        if not header or not line.strip() or line.startswith("---") or "n_gids_found" in line:
            continue
        tok = line.split()
        if len(tok) not in (6, 7) or not tok[1].isdigit() or not tok[2].isdigit():
            if len(tok) >= 3 and tok[1].isdigit():
                raise _bad(source, no, "show_gids row", line)
            continue
        ipv4 = tok[4] if len(tok) == 7 else None
        ver = tok[-2] if tok[-2] in ("v1", "v2") else None
        if ver is None:
            raise _bad(source, no, "VER (v1 / v2)", tok[-2])
        out.append(GidEntry(tok[0], int(tok[1]), int(tok[2]), tok[3], ver, ipv4, tok[-1],
                            source=source))
    if not header:
        raise TraceFormatError(f"{source}: line 1: no 'DEV PORT INDEX GID' header (not show_gids)")
    return tuple(out)


# --------------------------------------------------------------------------- iblinkinfo
_LINK = re.compile(
    r"^\s*(?:(?P<lguid>0x[0-9a-fA-F]+)\s+(?:\"[^\"]*\"\s+)?)?(?P<llid>\d+)\s+(?P<lport>\d+)"
    r"\[\s*\S*\s*\]\s*==\(\s*(?:(?P<width>\d+X)\s+(?P<speed>[\d.]+)\s*Gbps\s+)?"
    r"(?P<state>[A-Za-z]+)/\s*(?P<phys>[A-Za-z]+)\s*\)==>\s*"
    r"(?:(?P<pguid>0x[0-9a-fA-F]+)\s+)?(?:(?P<plid>\d+)\s+)?(?:(?P<pport>\d+))?"
    r"\[\s*\S*\s*\]\s*\"(?P<pname>[^\"]*)\"")


def parse_iblinkinfo(text: str, *, source: str = "<iblinkinfo>") -> tuple[LinkInfo, ...]:
    """Port lines of ``iblinkinfo`` (infiniband-diags iblinkinfo(8); default and ``-l`` layouts).

    ``CA: name:`` / ``Switch: 0xGUID name:`` headers name the node the following lines
    belong to. A line that has ``==(`` but does not match the layout raises TraceFormatError.
    """
    out: list[LinkInfo] = []
    node = ""
    node_guid: str | None = None
    for no, line in enumerate(text.splitlines(), 1):
        h = re.match(r"^(CA|Switch):\s*(?:(0x[0-9a-fA-F]+)\s+)?(.*?):?\s*$", line)
        if h and "==(" not in line:
            node, node_guid = h.group(3), h.group(2)
            continue
        if "==(" not in line:
            continue
        m = _LINK.match(line)
        if not m:
            raise _bad(source, no, "iblinkinfo port line", line[:80])
        out.append(LinkInfo(
            node=node, local_guid=m.group("lguid") or node_guid, local_lid=int(m.group("llid")),
            local_port=int(m.group("lport")), width=m.group("width"),
            lane_gbps=float(m.group("speed")) if m.group("speed") else None,
            state=m.group("state"), phys_state=m.group("phys"), peer_guid=m.group("pguid"),
            peer_lid=int(m.group("plid")) if m.group("plid") else None,
            peer_port=int(m.group("pport")) if m.group("pport") else None,
            peer_name=m.group("pname"), line=no))
    if not out:
        raise TraceFormatError(f"{source}: line 1: no iblinkinfo port line ('==( ... )==>')")
    return tuple(out)


# --------------------------------------------------------------------------- mlnx_qos
def parse_mlnx_qos(text: str, *, source: str = "<mlnx_qos>", interface: str | None = None
                   ) -> QosConfig:
    """``mlnx_qos -i IF`` output: trust state and per-priority PFC enable.

    The interface comes from ``interface``, else from a saved command line ``# mlnx_qos -i IF``
    / ``$ mlnx_qos -i IF`` at the top, else the file name ``mlnx_qos[._-]IF.txt``, else ``?``.
    """
    iface = interface
    trust: str | None = None
    pfc: tuple[bool, ...] | None = None
    lines = text.splitlines()
    for no, line in enumerate(lines, 1):
        c = re.search(r"mlnx_qos\s+(?:.*\s)?-i\s+(\S+)", line)
        if c and iface is None and re.match(r"^\s*[#$]", line):
            iface = c.group(1)
            continue
        t = re.match(r"^\s*Priority trust (?:state|mode):\s*(\S+)", line)
        if t:
            trust = t.group(1).lower()
            continue
        if re.match(r"^\s*enabled\s", line) and pfc is None:
            vals = line.split()[1:]
            if len(vals) != 8 or any(v not in ("0", "1") for v in vals):
                raise _bad(source, no, "PFC 'enabled' row (8 values of 0/1)", line)
            pfc = tuple(v == "1" for v in vals)
    if trust is None and pfc is None:
        raise TraceFormatError(f"{source}: line 1: no 'Priority trust state' or 'PFC "
                               "configuration' (not mlnx_qos output)")
    if iface is None:
        m = re.search(r"mlnx_qos[._-]([^./]+)\.\w+$", source)
        iface = m.group(1) if m else "?"
    return QosConfig(iface, trust, pfc, source=source)


# --------------------------------------------------------------------------- lldpctl
def parse_lldpctl_json(text: str, *, source: str = "<lldpctl>") -> tuple[LldpNeighbor, ...]:
    """Neighbours of ``lldpctl -f json`` (lldpd). ``interface`` is a dict or a list of dicts
    keyed by interface name; ``chassis`` is keyed by system name; ``port.id.value`` the port.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{source}: line {exc.lineno}: not JSON: {exc.msg}") from None
    ifaces = data.get("lldp", {}).get("interface", []) if isinstance(data, dict) else []
    items: list[tuple[str, dict[str, object]]] = []
    if isinstance(ifaces, dict):
        items = [(k, v) for k, v in ifaces.items() if isinstance(v, dict)]
    elif isinstance(ifaces, list):
        for entry in ifaces:
            if isinstance(entry, dict):
                items += [(k, v) for k, v in entry.items() if isinstance(v, dict)]
    out: list[LldpNeighbor] = []
    for name, body in items:
        chassis = body.get("chassis")
        system = next(iter(chassis), "") if isinstance(chassis, dict) else ""
        port = body.get("port")
        pid = ""
        if isinstance(port, dict):
            ident = port.get("id")
            pid = str(ident.get("value", "")) if isinstance(ident, dict) else str(ident or "")
        out.append(LldpNeighbor(name, str(system), pid, source=source))
    return tuple(out)


# --------------------------------------------------------------------------- perftest
_PT_ERRORS = re.compile(
    r"(Failed to modify QP.*|Unable to Connect the HCA's through the link|"
    r"Unable to init the socket connection|Couldn't connect to .*|Couldn't get context.*|"
    r"Couldn't set the link layer|Port number \d+ state is \w+|Unable to create QP.*|"
    r"Failed to create QP.*|Couldn't create IB resources.*|No IB devices found|"
    r"IB device \S+ not found|Failed to query GID.*|.*[Gg][Ii][Dd] index .*(?:invalid|not valid|"
    r"out of range|doesn't exist).*|Couldn't find device.*|Failed to init.*|"
    r"Unable to open file descriptor.*|Couldn't allocate .*)", re.I)


def parse_perftest(text: str, *, source: str = "<perftest>") -> PerftestRun:
    """One perftest output (linux-rdma/perftest bw or lat test, either end).

    Bandwidth columns ``#bytes #iterations BW peak[U] BW average[U] MsgRate[Mpps]`` with U in
    Gb/sec, MB/sec, MiB/sec (converted to Gb/s by perftest's own factors); latency columns
    ``#bytes #iterations t_min[usec] t_max[usec] t_typical[usec] [t_avg t_stdev 99% 99.9%]``.
    Non-numeric lines inside the table (CPU-frequency warnings) are ignored; a row with fewer
    columns than its header, or a banner with neither rows nor errors, is ``truncated``.
    """
    test: str | None = None
    device = link = None
    gid_index: int | None = None
    mtu: int | None = None
    local_gid = remote_gid = None
    role: Literal["server", "client", "unknown"] = "unknown"
    last_addr: str | None = None
    cols: list[str] | None = None
    unit: str | None = None
    bw: list[BwRow] = []
    lat: list[LatRow] = []
    errors: list[str] = []
    truncated = False
    recognized = False
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if "Waiting for client" in line:
            role, recognized = "server", True
            continue
        m = re.match(r"^(\S.*(?:BW|Latency) Test)$", line)
        if m and not line.startswith("#"):
            test, recognized = m.group(1), True
            continue
        for pat, name in ((r"Device\s*:\s*(\S+)", "device"), (r"Link type\s*:\s*(\S+)", "link"),
                          (r"GID index\s*:\s*(\S+)", "gid"), (r"Mtu\s*:\s*(\S+)", "mtu")):
            mm = re.search(pat, line, re.I)
            if not mm:
                continue
            recognized = True
            val = mm.group(1)
            if name == "device":
                device = val
            elif name == "link":
                link = val
            elif name == "gid":
                if not val.isdigit():
                    raise _bad(source, no, "GID index", val)
                gid_index = int(val)
            else:
                mv = re.match(r"^(\d+)", val)
                if not mv:
                    raise _bad(source, no, "Mtu", val)
                mtu = int(mv.group(1))
        if re.match(r"^(local|remote) address:", line):
            last_addr = line.split()[0]
            continue
        g = re.match(r"^GID:\s*(\S+)", line)
        if g and last_addr is not None:
            if last_addr == "local":
                local_gid = g.group(1)
            else:
                remote_gid = g.group(1)
            last_addr = None
            continue
        if line.startswith("#bytes"):
            cols = re.split(r"\s{2,}|\t+", line)
            um = re.search(r"\[(Gb/sec|MB/sec|MiB/sec|usec)\]", line)
            unit = um.group(1) if um else None
            recognized = True
            continue
        err = _PT_ERRORS.search(line)
        if err and not re.match(r"^\d", line):
            errors.append(line)
            recognized = True
            continue
        if cols is not None and re.match(r"^\d+\s", line + " "):
            tok = line.split()
            try:
                nums = [float(t) for t in tok]
            except ValueError:
                raise _bad(source, no, "result row", line) from None
            is_lat = any("t_min" in c for c in cols)
            need = 5 if is_lat else 4
            if len(nums) < need:
                truncated = True
                continue
            if is_lat:
                opt = [*nums[5:9], *([None] * (9 - max(len(nums), 5)))]
                lat.append(LatRow(int(nums[0]), int(nums[1]), nums[2], nums[3], nums[4],
                                  opt[0], opt[1], opt[2], opt[3]))
            else:
                f = _bw_factor(unit, source, no)
                bw.append(BwRow(int(nums[0]), int(nums[1]), nums[2] * f, nums[3] * f,
                                nums[4] if len(nums) > 4 else None))
    if not recognized:
        raise TraceFormatError(f"{source}: line 1: no perftest banner, result table or error")
    if (test is not None or cols is not None) and not bw and not lat and not errors:
        truncated = True
    if role == "unknown" and (remote_gid is not None or bw or lat):
        role = "client" if "Waiting for client" not in text else "server"
    return PerftestRun(source=source, test=test, role=role, device=device, link_type=link,
                       gid_index=gid_index, mtu=mtu, local_gid=local_gid, remote_gid=remote_gid,
                       bw_rows=tuple(bw), lat_rows=tuple(lat), unit=unit, errors=tuple(errors),
                       truncated=truncated)


def _bw_factor(unit: str | None, source: str, line: int) -> float:
    """Gb/s per reported unit (perftest format_factor)."""
    if unit == "Gb/sec":
        return 1.0
    if unit in ("MB/sec", "MiB/sec"):
        return _MB_BYTES * 8 / 1e9
    raise TraceFormatError(f"{source}: line {line}: bandwidth unit: cannot read {unit!r}")


# --------------------------------------------------------------------------- sysfs values
def parse_sysfs_port(device: str, port: int, files: dict[str, str], *, source: str,
                     netdev: str | None = None) -> IbPort:
    """One port from its sysfs attribute texts (``state``, ``phys_state``, ``rate``,
    ``link_layer``; Documentation/ABI/stable/sysfs-class-infiniband). ``rate`` reads
    ``200 Gb/sec (4X HDR)``; a missing attribute stays None and flags the port truncated.
    """
    rate: float | None = None
    if "rate" in files:
        m = re.match(r"^\s*([\d.]+)\s*Gb/sec", files["rate"])
        if not m:
            raise TraceFormatError(f"{source}/rate: line 1: rate: cannot read "
                                   f"{files['rate'].strip()!r}")
        rate = float(m.group(1))
    state = _norm_state(files["state"]) if "state" in files else None
    phys = _norm_phys(files["phys_state"]) if "phys_state" in files else None
    ll = files.get("link_layer", "").strip() or None
    complete = all(k in files for k in ("state", "phys_state", "rate"))
    return IbPort(device, port, state=state, phys_state=phys, rate_gbps=rate, link_layer=ll,
                  netdev=netdev, source=source, truncated=not complete)


def parse_sysfs_gid(device: str, port: int, index: int, gid: str, gid_type: str | None, *,
                    netdev: str | None, source: str) -> GidEntry | None:
    """One GID table slot from ``gids/N`` and ``gid_attrs/types/N``; None for an empty slot."""
    g = gid.strip()
    if not g or set(g.replace(":", "")) == {"0"}:
        return None
    t = (gid_type or "").strip().lower()
    ver = "v2" if "v2" in t else "v1" if ("v1" in t or t.startswith("ib")) else None
    ipv4: str | None = None
    m = re.match(r"^0000:0000:0000:0000:0000:ffff:([0-9a-f]{4}):([0-9a-f]{4})$", g.lower())
    if m:
        a, b = int(m.group(1), 16), int(m.group(2), 16)
        ipv4 = f"{a >> 8}.{a & 255}.{b >> 8}.{b & 255}"
    return GidEntry(device, port, index, g, ver, ipv4, netdev, source=source)
