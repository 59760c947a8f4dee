"""A real leaf-spine in Linux network namespaces (edge): build, inject faults, tear down.

Every device of a small inventory (``leaf_spine_fabric``: default 2 spines, 4 leaves, 2 hosts
per leaf) becomes a namespace named ``<prefix><device>``; every cable a veth pair whose ends
carry the inventory's port names. Switches are Linux routers with L4 ECMP
(``fib_multipath_hash_policy=1``, a fixed ``fib_multipath_hash_seed``), ICMP errors from the
ingress interface address (so traceroute hops name links) and no ICMP rate limit, unless
``kernel_icmp_limits`` keeps the kernel's defaults (what a real fabric looks like to
traceroute: 1 error/s per destination after a burst of 6, 1,000/s per router).

Addresses are ONLY from 198.18.0.0/15: NICs keep their inventory address (/32, default route
on their port, the leaf answers ARP by proxy); every router port gets 198.19.x.y from a /31
per cable. Faults: nftables ``numgen random mod 100 < N drop`` on one link direction (the
egress port of the sending end), ``tc tbf`` for a slow link. ``down`` deletes every namespace
with the prefix (which removes the veths, nft tables and qdiscs inside them).

Every command runs with a timeout (``CMD_TIMEOUT_S``) and ``down`` with an overall deadline,
so neither a stuck ``ip`` nor a signal leaves a half-built lab behind for long: ``up`` tears
down what it built on any exception, ``KeyboardInterrupt`` and :class:`Interrupted` included.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.fabric.io import read_fabric, write_fabric
from fabricscope.model.errors import ConfigError, TransportError

LAB_NET = ipaddress.ip_network("198.18.0.0/15")
_P2P_BASE = int(ipaddress.IPv4Address("198.19.0.0"))
HASH_SEED = 2026
CMD_TIMEOUT_S = 10.0
DOWN_DEADLINE_S = 30.0
Progress = Callable[[str], None]


class Interrupted(BaseException):  # like KeyboardInterrupt: not an error, ends the command
    """A termination signal (SIGTERM) arrived during a lab operation; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _run(cmd: list[str], *, check: bool = True, ns: str | None = None,
         stdin: str | None = None, timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    full = (["ip", "netns", "exec", ns] if ns else []) + cmd
    try:
        p = subprocess.run(full, capture_output=True, text=True, check=False, input=stdin,
                           timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        if check:
            raise TransportError(f"lab: `{' '.join(full)}` did not finish within {timeout:g} s") from None
        return subprocess.CompletedProcess(full, 124, "", "timeout")
    if check and p.returncode != 0:
        why = " | ".join(ln.strip() for ln in (p.stderr or p.stdout).splitlines() if ln.strip())
        raise TransportError(f"lab: `{' '.join(full)}` failed: {why}")
    return p


def available() -> str | None:
    """None when a lab can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install iproute2 nftables)"
    return None


@dataclass(frozen=True)
class Lab:
    """A built lab: its inventory, namespace prefix and router port addresses."""

    fabric: Fabric
    prefix: str
    port_addr: dict[str, str]  # router port id -> its address (198.19.x.y)
    state_dir: Path

    def ns(self, device: str) -> str:
        """The namespace of an inventory device (hosts hold their NICs)."""
        d = self.fabric.devices[device]
        return self.prefix + (d.host if d.role == "nic" and d.host else device).replace("/", "_")

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.json"


def _check_prefix(prefix: str) -> None:
    if not prefix or len(prefix) > 6 or not prefix.replace("-", "").isalnum():
        raise ConfigError(f"lab --prefix {prefix!r}: 1-6 letters/digits (interface names are <= 15 chars)")


def up(*, prefix: str = "fsl", leaves: int = 4, spines: int = 2, hosts_per_leaf: int = 2,
       state_dir: Path | None = None, kernel_icmp_limits: bool = False,
       progress: Progress | None = None) -> Lab:
    """Build the lab; on any failure (or interrupt) everything built so far is torn down.

    ``progress`` gets one line per step (namespaces, cables, routes)."""
    _check_prefix(prefix)
    reason = available()
    if reason:
        raise TransportError(f"lab: {reason}")
    if any(n.startswith(prefix) for n in _netns()):
        raise ConfigError(f"lab: namespaces with prefix {prefix!r} already exist; run `fabricscope lab down --prefix {prefix}`")
    fabric = leaf_spine_fabric(leaves=leaves, hosts_per_leaf=hosts_per_leaf, spines=spines,
                               name=f"lab-{prefix}")
    state = state_dir or Path(f"/tmp/fabricscope-lab-{prefix}")
    state.mkdir(parents=True, exist_ok=True)
    port_addr: dict[str, str] = {}
    lab = Lab(fabric, prefix, port_addr, state)
    try:
        _build(lab, kernel_icmp_limits=kernel_icmp_limits, progress=progress or (lambda _m: None))
    except BaseException:
        if progress is not None:
            progress("tearing down the half-built lab")
        down(prefix=prefix, state_dir=state)
        raise
    write_fabric(fabric, lab.inventory_path)
    (state / "ports.json").write_text(json.dumps({"prefix": prefix, "port_addr": port_addr}, indent=1))
    return lab


def _build(lab: Lab, *, kernel_icmp_limits: bool, progress: Progress) -> None:
    f = lab.fabric
    routers = [d for d in f.switches]
    progress(f"creating {len(f.hosts) + len(routers)} namespaces ({len(f.hosts)} hosts, {len(routers)} routers)")
    for d in (*f.hosts, *routers):
        ns = lab.ns(d.id)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "set", "lo", "up"], ns=ns)
    sysctls = [("net.ipv4.ip_forward", "1"), ("net.ipv4.fib_multipath_hash_policy", "1"),
               ("net.ipv4.icmp_errors_use_inbound_ifaddr", "1"),
               ("net.ipv4.conf.all.rp_filter", "0"), ("net.ipv4.conf.default.rp_filter", "0")]
    if not kernel_icmp_limits:
        sysctls += [("net.ipv4.icmp_ratelimit", "0"), ("net.ipv4.icmp_msgs_per_sec", "100000"),
                    ("net.ipv4.icmp_msgs_burst", "10000")]
    for d in routers:
        ns = lab.ns(d.id)
        for key, val in sysctls:
            _run(["sysctl", "-qw", f"{key}={val}"], ns=ns)
        # The seed sysctl exists from Linux 6.11; older kernels hash with a boot-time seed.
        _run(["sysctl", "-qw", f"net.ipv4.fib_multipath_hash_seed={HASH_SEED}"], ns=ns, check=False)
    for h in f.hosts:
        _run(["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"], ns=lab.ns(h.id))
    progress(f"wiring {len(f.links)} cables (veth pairs)")
    for k, ln in enumerate(f.links):
        a_tmp, b_tmp = f"{lab.prefix}{k}a", f"{lab.prefix}{k}b"
        _run(["ip", "link", "add", a_tmp, "type", "veth", "peer", "name", b_tmp])
        for tmp, port in ((a_tmp, ln.a), (b_tmp, ln.b)):
            dev = port_device(port)
            ns = lab.ns(dev)
            name = port.rsplit(":", 1)[1]
            _run(["ip", "link", "set", tmp, "netns", ns])
            _run(["ip", "link", "set", tmp, "name", name], ns=ns)
            _run(["ip", "link", "set", name, "up"], ns=ns)
            if f.devices[dev].is_switch:
                addr = str(ipaddress.IPv4Address(_P2P_BASE + 2 * k + (0 if port == ln.a else 1)))
                lab.port_addr[port] = addr
                _run(["ip", "addr", "add", f"{addr}/31", "dev", name], ns=ns)
                _run(["sysctl", "-qw", f"net.ipv4.conf.{name}.rp_filter=0"], ns=ns)
    progress(f"addressing {len(f.nics)} NICs and routing (ECMP) on {len(routers)} routers")
    # NICs: inventory address /32, default route on the port; the leaf proxies ARP.
    for nic in f.nics:
        ns = lab.ns(nic.id)
        port = f.ports_of[nic.id][0]
        name = port.rsplit(":", 1)[1]
        assert nic.address is not None
        _run(["ip", "addr", "add", f"{nic.address}/32", "dev", name], ns=ns)
        _run(["ip", "route", "add", "default", "dev", name], ns=ns)
        peer = f.peer_port[port]
        leaf_ns, leaf_if = lab.ns(port_device(peer)), peer.rsplit(":", 1)[1]
        _run(["sysctl", "-qw", f"net.ipv4.conf.{leaf_if}.proxy_arp=1"], ns=leaf_ns)
        _run(["ip", "route", "add", f"{nic.address}/32", "dev", leaf_if], ns=leaf_ns)
    # Routers: every NIC /32 over all shortest next hops (ECMP).
    from fabricscope.fabric.routing import Routing

    r = Routing(f)
    ix = f.index
    for sw in routers:
        node = ix.node_of[sw.id]
        for nic in f.nics:
            nh = [e for e in r.next_hops(node, ix.node_of[nic.id]) if f.devices[ix.node_ids[int(ix.dst[e])]].is_switch]
            if not nh:
                continue  # directly attached: done above
            hops: list[str] = []
            for e in nh:
                hops += ["nexthop", "via", lab.port_addr[ix.to_port[e]]]
            assert nic.address is not None
            _run(["ip", "route", "add", f"{nic.address}/32", *hops], ns=lab.ns(sw.id))


def _netns() -> list[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def down(*, prefix: str = "fsl", state_dir: Path | None = None, deadline_s: float = DOWN_DEADLINE_S) -> int:
    """Delete every namespace whose name starts with ``prefix`` and the lab's state folder
    (inventory, port addresses); returns how many namespaces. Every command shares one
    ``deadline_s``; what is left after it is reported (TransportError), never waited on."""
    _check_prefix(prefix)
    t_end = time.monotonic() + deadline_s

    def left() -> float:
        return min(CMD_TIMEOUT_S, t_end - time.monotonic())

    state = state_dir or Path(f"/tmp/fabricscope-lab-{prefix}")
    for name in ("inventory.json", "ports.json"):
        (state / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not there, or holds files that are not ours
        state.rmdir()
    n = 0
    mine = [ns for ns in _netns() if ns.startswith(prefix)]
    if mine:
        # One `ip -batch` instead of a process per namespace: a 14-namespace lab in one call.
        _run(["ip", "-force", "-batch", "-"], check=False, stdin="".join(f"netns del {ns}\n" for ns in mine),
             timeout=max(0.1, t_end - time.monotonic()))
        n = len(mine)
    # veths left in the root namespace by a half-built lab
    p = _run(["ip", "-o", "link", "show"], check=False, timeout=left())
    for line in p.stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(prefix) and name[len(prefix):-1].isdigit() and left() > 0:
            _run(["ip", "link", "del", name], check=False, timeout=left())
    stuck = [ns for ns in _netns() if ns.startswith(prefix)]
    if stuck:
        raise TransportError(f"lab down: {len(stuck)} namespaces with prefix {prefix!r} remain after "
                             f"{deadline_s:g} s (e.g. {stuck[0]}); run `fabricscope lab down --prefix {prefix}` again")
    return n


def load(prefix: str = "fsl", state_dir: Path | None = None) -> Lab:
    """A lab built earlier (by ``up``), from its state folder."""
    state = state_dir or Path(f"/tmp/fabricscope-lab-{prefix}")
    try:
        meta = json.loads((state / "ports.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"lab {prefix!r}: no state in {state} (run `fabricscope lab up` first): {exc}") from None
    if not any(n.startswith(prefix) for n in _netns()):
        raise ConfigError(f"lab {prefix!r}: its namespaces are gone (run `fabricscope lab up --prefix {prefix}`)")
    return Lab(read_fabric(state / "inventory.json"), meta["prefix"], dict(meta["port_addr"]), state)


def fault(lab: Lab, link: str, *, loss_pct: int | None = None, rate: str | None = None) -> str:
    """Inject a fault on the directed link ``a:ethX->b:ethY`` (egress of ``a``).

    ``loss_pct``: nftables random drop of that percentage; ``rate``: a tc tbf rate limit
    (e.g. ``1mbit``). Returns a description.
    """
    f = lab.fabric
    try:
        a, _b = link.split("->")
        f.edge_index(link)
    except (ValueError, Exception) as exc:
        hint = " (quote it: an unquoted > is a shell redirection)" if link.endswith("-") else ""
        raise ConfigError(f"lab fault: {link!r} is not a directed link of the lab ({exc}){hint}") from None
    ns, ifname = lab.ns(port_device(a)), a.rsplit(":", 1)[1]
    if loss_pct is None and rate is None:
        raise ConfigError("lab fault: give --loss PCT and/or --rate RATE")
    out = []
    if loss_pct is not None:
        if not 0 < loss_pct <= 100:
            raise ConfigError(f"lab fault: --loss must be in 1..100, got {loss_pct}")
        table = f"{lab.prefix}fault"
        match = "" if loss_pct == 100 else f"numgen random mod 100 < {int(loss_pct)} "  # nft: mod 100 < 100 is invalid
        rules = (f"table inet {table} {{\n  chain out {{\n"
                 f"    type filter hook postrouting priority 0;\n"
                 f'    oifname "{ifname}" {match}drop\n  }}\n}}\n')
        _run(["nft", "delete", "table", "inet", table], ns=ns, check=False)
        _run(["nft", "-f", "-"], ns=ns, stdin=rules)
        out.append(f"{loss_pct}% random drop")
    if rate is not None:
        _run(["tc", "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", rate, "burst", "32kbit",
              "latency", "400ms"], ns=ns)
        out.append(f"tbf {rate}")
    return f"{link}: {', '.join(out)} (egress {ifname} in {ns})"


def clear_faults(lab: Lab) -> None:
    """Remove every injected fault (nft tables and tbf qdiscs) from the lab."""
    for d in (*lab.fabric.hosts, *lab.fabric.switches):
        ns = lab.ns(d.id)
        _run(["nft", "delete", "table", "inet", f"{lab.prefix}fault"], ns=ns, check=False)
        for port in lab.fabric.ports_of.get(d.id, ()):
            _run(["tc", "qdisc", "del", "dev", port.rsplit(":", 1)[1], "root"], ns=ns, check=False)
        if d.role == "host":
            for n in lab.fabric.nics_of_host[d.id]:
                for port in lab.fabric.ports_of.get(n.id, ()):
                    _run(["tc", "qdisc", "del", "dev", port.rsplit(":", 1)[1], "root"], ns=ns, check=False)
