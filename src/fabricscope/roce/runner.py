"""Gather RoCE evidence: run the tools found on PATH and read /sys, or read saved outputs.

The only module of ``fabricscope.roce`` that starts processes or touches files. A tool that
is absent is a ``skip`` with the reason ("ibstat not found on PATH"), never an error; a tool
that fails or times out is a skip with its exit status / timeout. The sysfs root is a
parameter so tests use fixture trees.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fabricscope.model.errors import ConfigError, TraceFormatError
from fabricscope.roce.checks import Evidence
from fabricscope.roce.parsers import (
    EcnState,
    GidEntry,
    IbPort,
    LinkInfo,
    LldpNeighbor,
    PerftestRun,
    QosConfig,
    detect_format,
    parse_mlnx_qos,
    parse_sysfs_gid,
    parse_sysfs_port,
    parse_text,
)

__all__ = ["collect_live", "collect_saved", "read_sysfs"]

# (command, what it is called in results); perftest is not run: it needs both ends.
_TOOLS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("ibstat",), "ibstat"),
    (("ibv_devinfo", "-v"), "ibv_devinfo"),
    (("show_gids",), "show_gids"),
    (("iblinkinfo",), "iblinkinfo"),
    (("lldpctl", "-f", "json"), "lldpctl"),
)


class _Acc:
    def __init__(self) -> None:
        self.ports: list[IbPort] = []
        self.gids: list[GidEntry] = []
        self.links: list[LinkInfo] = []
        self.runs: list[PerftestRun] = []
        self.qos: list[QosConfig] = []
        self.ecn: list[EcnState] = []
        self.mtu: dict[str, int] = {}
        self.lldp: list[LldpNeighbor] = []
        self.skips: list[tuple[str, str]] = []
        self.warnings: list[str] = []

    def add_text(self, text: str, source: str) -> None:
        pf = parse_text(text, source=source)
        self.ports += pf.ports
        self.gids += pf.gids
        self.links += pf.links
        self.runs += pf.runs
        self.qos += pf.qos
        self.lldp += pf.lldp
        if pf.truncated:
            self.warnings.append(f"{source}: output ends early (truncated)")

    def evidence(self) -> Evidence:
        gids: dict[tuple[str, int, int], GidEntry] = {}
        for g in self.gids:  # the first source read wins
            gids.setdefault((g.device, g.port, g.index), g)
        return Evidence(ports=tuple(self.ports), gids=tuple(gids.values()),
                        links=tuple(self.links), runs=tuple(self.runs), qos=tuple(self.qos),
                        ecn=tuple(self.ecn), netdev_mtu=dict(self.mtu), lldp=tuple(self.lldp),
                        skips=tuple(self.skips), warnings=tuple(self.warnings))


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return ""


def read_sysfs(root: Path, acc: _Acc | None = None) -> Evidence:
    """Ports, GIDs, netdev MTUs and ECN enables under ``root/sys`` (kernel ABI
    Documentation/ABI/stable/sysfs-class-infiniband and mlx5 ``ecn/roce_{np,rp}/enable/P``).

    Absent directories become skips with the reason ("/sys/class/infiniband absent").
    """
    a = acc if acc is not None else _Acc()
    ib = root / "sys" / "class" / "infiniband"
    if not ib.is_dir():
        a.skips.append(("sysfs", f"{_shown(root, ib)} absent"))
    else:
        for dev in sorted(ib.iterdir()):
            ports_dir = dev / "ports"
            if not ports_dir.is_dir():
                continue
            for pdir in sorted(ports_dir.iterdir()):
                if not pdir.name.isdigit():
                    continue
                port = int(pdir.name)
                files = {n: _read(pdir / n) for n in ("state", "phys_state", "rate", "link_layer")
                         if (pdir / n).is_file()}
                ndev = _read(pdir / "gid_attrs" / "ndevs" / "0").strip() or None
                a.ports.append(parse_sysfs_port(dev.name, port, files, netdev=ndev,
                                                source=_shown(root, pdir)))
                gdir = pdir / "gids"
                if gdir.is_dir():
                    for gf in sorted(gdir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
                        if not gf.name.isdigit():
                            continue
                        i = int(gf.name)
                        gtype = pdir / "gid_attrs" / "types" / gf.name
                        gnd = pdir / "gid_attrs" / "ndevs" / gf.name
                        # an empty slot's types file cannot be read (EINVAL): treat as unknown
                        g = parse_sysfs_gid(dev.name, port, i, _read(gf),
                                            _read(gtype) if gtype.is_file() else None,
                                            netdev=_read(gnd).strip() or None if gnd.is_file() else None,
                                            source=_shown(root, gf))
                        if g is not None:
                            a.gids.append(g)
    net = root / "sys" / "class" / "net"
    if not net.is_dir():
        a.skips.append(("netdev-mtu", f"{_shown(root, net)} absent"))
    else:
        for nd in sorted(net.iterdir()):
            if nd.name == "lo":
                continue
            mtu = _read(nd / "mtu").strip()
            ecn_dir = nd / "ecn"
            # only RDMA netdevs: a management NIC at 1500 is not a RoCE finding
            if mtu.isdigit() and (ecn_dir.is_dir() or nd.name in {g.netdev for g in a.gids}
                                  or nd.name in {p.netdev for p in a.ports}):
                a.mtu[nd.name] = int(mtu)
            elif mtu and not mtu.isdigit():
                raise TraceFormatError(f"{_shown(root, nd / 'mtu')}: line 1: mtu: cannot read {mtu!r}")
            if ecn_dir.is_dir():
                np_ = _ecn_table(ecn_dir / "roce_np" / "enable")
                rp = _ecn_table(ecn_dir / "roce_rp" / "enable")
                if np_ or rp:
                    a.ecn.append(EcnState(nd.name, np_, rp, source=_shown(root, ecn_dir)))
    return a.evidence()


def _ecn_table(d: Path) -> dict[int, bool]:
    if not d.is_dir():
        return {}
    return {int(f.name): _read(f).strip() == "1" for f in d.iterdir() if f.name.isdigit()}


def _shown(root: Path, p: Path) -> str:
    """``/sys/...`` for the real root, the fixture path otherwise."""
    return "/" + str(p.relative_to(root)) if root == Path("/") else str(p)


def collect_saved(folder: Path) -> Evidence:
    """Evidence from a folder of saved tool outputs (any names; formats are detected from the
    text) and, if the folder holds ``sys/``, that sysfs tree. A file of no known format is a
    warning; a file of a known format that cannot be read raises TraceFormatError.
    """
    if not folder.is_dir():
        raise ConfigError(f"--from: {str(folder)!r}: not a folder")
    a = _Acc()
    files = sorted(p for p in folder.rglob("*") if p.is_file()
                   and "sys" not in p.relative_to(folder).parts[:1]
                   and p.suffix.lower() not in (".md", ".yaml", ".yml"))
    for p in files:
        text = _read(p)
        fmt = detect_format(text)
        if fmt is None:
            a.warnings.append(f"{p}: not the output of a known tool, ignored")
            continue
        if fmt == "mlnx_qos":
            a.qos.append(parse_mlnx_qos(text, source=str(p)))
            continue
        a.add_text(text, str(p))
    if (folder / "sys").is_dir():
        read_sysfs(folder, a)
    return a.evidence()


def collect_live(*, root: Path = Path("/"), path: str | None = None, timeout_s: float = 20.0,
                 interfaces: Sequence[str] = ()) -> Evidence:
    """Run ibstat, ibv_devinfo -v, show_gids, iblinkinfo, lldpctl and ``mlnx_qos -i IF`` where
    they are on ``path`` (default $PATH), each with ``timeout_s``, then read ``root/sys``.

    mlnx_qos runs for ``interfaces`` or, by default, every netdev that carries a GID.
    perftest is never started here (it needs a server on the other end): its absence is a
    skip with that reason.
    """
    a = _Acc()
    search = path if path is not None else os.environ.get("PATH", "")
    for cmd, name in _TOOLS:
        text = _run(cmd, name, search, timeout_s, a)
        if text is None:
            continue
        if detect_format(text) is None and not text.strip():
            a.skips.append((name, f"{name} printed nothing"))
            continue
        try:
            a.add_text(text, f"{name} (live)")
        except TraceFormatError as exc:
            a.warnings.append(str(exc))
    read_sysfs(root, a)
    ifaces = list(interfaces) or sorted({g.netdev for g in a.gids if g.netdev}
                                        | {p.netdev for p in a.ports if p.netdev})
    if ifaces:
        for nd in ifaces:
            text = _run(("mlnx_qos", "-i", nd), "mlnx_qos", search, timeout_s, a)
            if text is not None:
                try:
                    a.qos.append(parse_mlnx_qos(text, source=f"mlnx_qos -i {nd} (live)",
                                                interface=nd))
                except TraceFormatError as exc:
                    a.warnings.append(str(exc))
    elif shutil.which("mlnx_qos", path=search) is None:
        a.skips.append(("mlnx_qos", "mlnx_qos not found on PATH"))
    else:
        a.skips.append(("mlnx_qos", "no RoCE netdev found to query"))
    a.skips.append(("perftest", "perftest is not run here (it needs both ends); save the "
                    "server and client outputs and use --from"))
    return a.evidence()


def _run(cmd: tuple[str, ...], name: str, search: str, timeout_s: float, a: _Acc) -> str | None:
    exe = shutil.which(cmd[0], path=search)
    if exe is None:
        if not any(w == name for w, _ in a.skips):
            a.skips.append((name, f"{cmd[0]} not found on PATH"))
        return None
    try:
        cp = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout_s,
                            check=False)
    except subprocess.TimeoutExpired:
        a.skips.append((name, f"{' '.join(cmd)} timed out after {timeout_s:g} s"))
        return None
    except OSError as exc:
        a.skips.append((name, f"{' '.join(cmd)} could not start: {exc.strerror}"))
        return None
    if cp.returncode != 0 and not cp.stdout.strip():
        err = re.sub(r"\s+", " ", cp.stderr).strip()[:120]
        a.skips.append((name, f"{' '.join(cmd)} exited {cp.returncode}: {err}"))
        return None
    return cp.stdout
