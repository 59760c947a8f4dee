"""``fabricscope lab``: a real leaf-spine in network namespaces (root), faults, traceroute."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_UP_HELP = """Build a leaf-spine of Linux routers in network namespaces (needs root, ip, nft, tc).

Namespaces are named PREFIX<device> (hosts: PREFIXhost0003); addresses come only from
198.18.0.0/15; routers hash ECMP on L4 with a fixed seed. Writes the inventory to
/tmp/fabricscope-lab-PREFIX/inventory.json for `probe agent` / `probe analyze`.

Examples:

  fabricscope lab up

  fabricscope lab up --prefix lab2 --leaves 4 --spines 2 --hosts-per-leaf 2

  ip netns exec fslhost0000 fabricscope probe agent -i /tmp/fabricscope-lab-fsl/inventory.json --self host0000 --db /tmp/h0.duckdb
"""

_FAULT_HELP = """Inject a fault on one direction of a lab link (the egress port of its first end).

LINK is a directed link id from the inventory, e.g. leaf-000:eth3->spine-00:eth1.
--loss N: nftables random drop of N percent; --rate R: tc tbf rate limit (a slow link);
--clear: remove every injected fault.

Examples:

  fabricscope lab fault leaf-000:eth3->spine-00:eth1 --loss 5

  fabricscope lab fault spine-01:eth2->leaf-001:eth4 --rate 1mbit

  fabricscope lab fault --clear
"""


def register(app: typer.Typer) -> None:
    """Add the ``lab`` command group (``up``, ``down``, ``fault``, ``trace``)."""
    grp = typer.Typer(
        help="A real leaf-spine lab in network namespaces (root): up, down, fault, trace.\n\n"
        "Examples:\n\n  fabricscope lab up\n\n  fabricscope lab fault leaf-000:eth3->spine-00:eth1 --loss 5\n\n"
        "  fabricscope lab down",
        no_args_is_help=True,
    )
    app.add_typer(grp, name="lab")

    @grp.command("up", help=_UP_HELP)
    def up_cmd(
        prefix: str = typer.Option("fsl", help="namespace / interface name prefix (1-6 chars)"),
        leaves: int = typer.Option(4),
        spines: int = typer.Option(2),
        hosts_per_leaf: int = typer.Option(2),
    ) -> None:
        from fabricscope.probe import lab

        built = lab.up(prefix=prefix, leaves=leaves, spines=spines, hosts_per_leaf=hosts_per_leaf)
        typer.echo(f"lab {prefix}: {len(built.fabric.hosts)} hosts, {len(built.fabric.switches)} routers; "
                   f"inventory {built.inventory_path}")

    @grp.command("down", help="Delete every namespace (and veth) with the prefix.\n\nExample:\n\n  fabricscope lab down --prefix fsl")
    def down_cmd(prefix: str = typer.Option("fsl", help="namespace prefix")) -> None:
        from fabricscope.probe import lab

        typer.echo(f"removed {lab.down(prefix=prefix)} namespaces")

    @grp.command("fault", help=_FAULT_HELP)
    def fault_cmd(
        link: str = typer.Argument("", help="directed link a:ethX->b:ethY"),
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
            raise ConfigError("lab fault: give a LINK (a:ethX->b:ethY) or --clear")
        typer.echo(lab.fault(built, link, loss_pct=loss, rate=rate))

    @grp.command("trace", help="Paris-traceroute this host's probe flows (both directions) inside "
                 "its namespace; writes a path cache for `probe analyze --paths`.\n\nExample:\n\n"
                 "  ip netns exec fslhost0000 fabricscope lab trace --self host0000 --out /tmp/p0.json")
    def trace_cmd(
        self_id: str = typer.Option(..., "--self", help="host id"),
        out: Path = typer.Option(..., help="JSON path cache to write"),
        prefix: str = typer.Option("fsl", help="lab prefix"),
        seed: int = typer.Option(0, help="the agents' plan seed"),
        epoch: float = typer.Option(30.0, help="the agents' epoch length (s)"),
        rate: float = typer.Option(100.0, help="the agents' probe rate (plan budget)"),
    ) -> None:
        import time

        from fabricscope.model.records import FiveTuple
        from fabricscope.probe import lab
        from fabricscope.probe.plan import plan_mesh
        from fabricscope.probe.traceroute import path_cache
        from fabricscope.service.probe_live import self_nics

        built = lab.load(prefix)
        f = built.fabric
        mine = set(self_nics(f, self_id))
        ep = int(time.time() // epoch)
        flows: list[FiveTuple] = []
        for e in (ep, ep + 1):
            for src, plan in plan_mesh(f, seed=seed, epoch=e, budget_pps=rate, epoch_s=epoch).items():
                for dst, ft in plan.flows(f):
                    if src in mine:
                        flows.append(ft)
                    if dst in mine:  # the reply path of a flow probing us starts here
                        flows.append(FiveTuple(ft.dst_ip, ft.src_ip, ft.dst_port, ft.src_port, ft.proto))
        entries = path_cache(f, flows, built.port_addr)
        out.write_text(json.dumps(entries))
        typer.echo(f"traced {len(entries)}/{len(set(flows))} flows -> {out}")
