"""``fabricscope lab``: a real leaf-spine in network namespaces (root), faults, traceroute."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

_UP_HELP = """Build a leaf-spine of Linux routers in network namespaces (needs root, ip, nft, tc).

Namespaces are named PREFIX<device> (hosts: PREFIXhost0003); addresses come only from
198.18.0.0/15; routers hash ECMP on L4 with a fixed seed and send ICMP errors from the
ingress port's address with no rate limit (--kernel-icmp-limits keeps Linux's defaults, as
harsh as a real switch). Writes the inventory to /tmp/fabricscope-lab-PREFIX/inventory.json
for `probe agent` / `probe analyze`. Takes a few seconds (progress on stderr); SIGINT or
SIGTERM tears down what was built (exit 130 / 143).

Examples:

  fabricscope lab up --prefix lab2 --leaves 2 --spines 2 --hosts-per-leaf 1

  ip netns exec lab2host0000 fabricscope probe agent -i /tmp/fabricscope-lab-lab2/inventory.json --self host0000 --db /tmp/h0.duckdb --duration 5

  fabricscope lab down --prefix lab2
"""

_FAULT_HELP = """Inject a fault on one direction of a lab link (the egress port of its first end).

LINK is a directed link id from the inventory, e.g. 'leaf-000:eth3->spine-00:eth1' (quote
it: an unquoted > is a shell redirection). --loss N: nftables random drop of N percent;
--rate R: tc tbf rate limit (a slow link); --clear: remove every injected fault.

Examples:

  fabricscope lab up --prefix fx --leaves 2 --spines 2 --hosts-per-leaf 1

  fabricscope lab fault 'leaf-000:eth3->spine-01:eth1' --loss 5 --prefix fx

  fabricscope lab fault 'spine-01:eth2->leaf-001:eth3' --rate 1mbit --prefix fx

  fabricscope lab fault --clear --prefix fx

  fabricscope lab down --prefix fx
"""

_TRACE_HELP = """Paris-traceroute a host's probe flows (both directions); writes a path cache for
`probe analyze --paths`.

Runs on the host itself (in a lab: inside its namespace). The flows are the agents' plan
(same --seed, --epoch, --rate) from and to --self (default: the inventory NICs whose address
is on this host's interfaces). Hops the inventory already decides (a NIC's leaf, the last
link) are not probed; the ECMP choices are, paced per router (AIMD from --pps) and retried
(--retries) when silent, since routers rate-limit ICMP. A reply's source address is looked up
in --addresses (JSON {port id: address}; a lab's ports.json by default) and in the
inventory's switch addresses. Prints the coverage: flows traced, and why the rest were not.
Needs root (raw sockets).

Examples:

  fabricscope lab up --prefix tr --leaves 2 --spines 2 --hosts-per-leaf 1

  ip netns exec trhost0000 fabricscope lab trace --prefix tr --self host0000 --out /tmp/p0.json

  ip netns exec trhost0000 fabricscope lab trace -i /tmp/fabricscope-lab-tr/inventory.json --addresses /tmp/fabricscope-lab-tr/ports.json --out /tmp/p0.json

  fabricscope lab down --prefix tr
"""


@contextmanager
def _signals_end_command(on_signal: Callable[[str], None] | None = None) -> Iterator[None]:
    """SIGTERM raises lab.Interrupted (a BaseException, like Ctrl-C's KeyboardInterrupt) so
    the command's cleanup runs; the command then exits 130 (SIGINT) or 143 (SIGTERM)."""
    import signal
    import sys

    from fabricscope.probe import lab

    def raise_it(signum: int, _frame: object) -> None:
        raise lab.Interrupted(signum)

    old = signal.signal(signal.SIGTERM, raise_it)
    try:
        yield
    except KeyboardInterrupt:
        if on_signal:
            on_signal("SIGINT")
        sys.exit(130)
    except lab.Interrupted as exc:
        if on_signal:
            on_signal(signal.Signals(exc.signum).name)
        sys.exit(128 + exc.signum)
    finally:
        signal.signal(signal.SIGTERM, old)


def register(app: typer.Typer) -> None:
    """Add the ``lab`` command group (``up``, ``down``, ``fault``, ``trace``)."""
    grp = typer.Typer(
        help="A real leaf-spine lab in network namespaces (root): up, down, fault, trace.\n\n"
        "Examples:\n\n  fabricscope lab up --prefix grp\n\n"
        "  fabricscope lab fault 'leaf-000:eth3->spine-00:eth1' --loss 5 --prefix grp\n\n"
        "  fabricscope lab down --prefix grp",
        no_args_is_help=True,
    )
    app.add_typer(grp, name="lab")

    def err(msg: str) -> None:
        typer.echo(msg, err=True)

    @grp.command("up", help=_UP_HELP)
    def up_cmd(
        prefix: str = typer.Option("fsl", help="namespace / interface name prefix (1-6 chars)"),
        leaves: int = typer.Option(4, help="leaf switches (routers)"),
        spines: int = typer.Option(2, help="spine switches (routers)"),
        hosts_per_leaf: int = typer.Option(2, help="hosts (one NIC each) under every leaf"),
        kernel_icmp_limits: bool = typer.Option(False, "--kernel-icmp-limits",
                                                help="keep Linux's default ICMP rate limits on the routers"),
    ) -> None:
        from fabricscope.probe import lab

        with _signals_end_command(lambda s: err(f"lab up: {s}: the half-built lab was torn down")):
            built = lab.up(prefix=prefix, leaves=leaves, spines=spines, hosts_per_leaf=hosts_per_leaf,
                           kernel_icmp_limits=kernel_icmp_limits, progress=lambda m: err(f"lab up: {m}"))
        typer.echo(f"lab {prefix}: {len(built.fabric.hosts)} hosts, {len(built.fabric.switches)} routers; "
                   f"inventory {built.inventory_path}")

    @grp.command("down", help="Delete every namespace (and veth) with the prefix, within a deadline."
                 "\n\nExample:\n\n  fabricscope lab down --prefix fsl")
    def down_cmd(
        prefix: str = typer.Option("fsl", help="namespace prefix"),
        deadline: float = typer.Option(30.0, help="give up (and say what is left) after this many seconds"),
    ) -> None:
        from fabricscope.probe import lab

        with _signals_end_command():
            typer.echo(f"removed {lab.down(prefix=prefix, deadline_s=deadline)} namespaces")

    @grp.command("fault", help=_FAULT_HELP)
    def fault_cmd(
        link: str = typer.Argument("", help="directed link 'a:ethX->b:ethY' (quoted)"),
        loss: int | None = typer.Option(None, help="random drop percentage (1-100)"),
        rate: str | None = typer.Option(None, help="tbf rate, e.g. 1mbit"),
        clear: bool = typer.Option(False, help="remove all injected faults"),
        prefix: str = typer.Option("fsl", help="lab prefix"),
    ) -> None:
        from fabricscope.model.errors import ConfigError
        from fabricscope.probe import lab

        built = lab.load(prefix)
        if clear:
            lab.clear_faults(built)
            typer.echo("faults cleared")
            return
        if not link:
            raise ConfigError("lab fault: give a LINK ('a:ethX->b:ethY', quoted) or --clear")
        typer.echo(lab.fault(built, link, loss_pct=loss, rate=rate))

    @grp.command("trace", help=_TRACE_HELP)
    def trace_cmd(
        out: Path = typer.Option(..., help="JSON path cache to write (checked before tracing)"),
        self_id: str | None = typer.Option(None, "--self", help="host or NIC id (default: from this host's addresses)"),
        inventory: Path | None = typer.Option(None, "--inventory", "-i",
                                              help="inventory YAML/JSON (default: the lab's, from --prefix)"),
        addresses: Path | None = typer.Option(None, help="router port addresses, JSON {port id: address} "
                                              "(default: the lab's ports.json when tracing a lab)"),
        prefix: str = typer.Option("fsl", help="lab prefix (without --inventory)"),
        seed: int = typer.Option(0, help="the agents' plan seed"),
        epoch: float = typer.Option(30.0, help="the agents' epoch length (s)"),
        at: float | None = typer.Option(None, "--at", help="Unix time whose epoch (and the next) to trace "
                                        "the flows of (default: now)"),
        rate: float = typer.Option(100.0, help="the agents' probe rate (plan budget)"),
        pps: float = typer.Option(50.0, help="most trace probes per second (overall, and per router to start)"),
        retries: int = typer.Option(8, help="extra tries of a hop that stays silent"),
        timeout: float = typer.Option(1.0, help="seconds to wait for a hop's ICMP reply"),
    ) -> None:
        import os

        from fabricscope.fabric.io import read_fabric
        from fabricscope.model.errors import ConfigError, TransportError
        from fabricscope.probe import lab
        from fabricscope.service.probe_live import (
            read_port_addresses,
            self_nics,
            trace_host,
            write_path_cache,
        )

        # Outputs and inputs first: a bad --out must not cost a whole trace.
        if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
            raise ConfigError(f"lab trace: --out {out}: cannot write there (folder missing, not writable, "
                              "or a folder given)")
        if pps <= 0 or timeout <= 0 or retries < 0:
            raise ConfigError("lab trace: --pps and --timeout must be > 0, --retries >= 0")
        if inventory is not None:
            fabric = read_fabric(inventory)
            port_addr = read_port_addresses(addresses) if addresses is not None else {}
        else:
            built = lab.load(prefix)
            fabric = built.fabric
            port_addr = read_port_addresses(addresses) if addresses is not None else built.port_addr
        nics = self_nics(fabric, self_id) if self_id is not None else None
        with _signals_end_command(lambda s: err(f"lab trace: {s}: stopped, {out} not written")):
            flows, res = trace_host(fabric, nics, port_addr=port_addr, seed=seed, epoch_s=epoch,
                                    rate_pps=rate, now_s=at, pps=pps, timeout_s=timeout, retries=retries)
        if flows and not res.paths:
            raise TransportError(f"lab trace: nothing traced, {out} not written: {res.summary()}")
        write_path_cache(res, out)
        typer.echo(f"{res.summary()} -> {out}")
