"""``fabricscope topo``: build an inventory file from a builder, or summarize one."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_BUILD_HELP = """Build a fabric inventory from SPEC and write it to --out FILE (.yaml, .yml or .json).

SPEC is KIND[:KEY=VALUE,...], the same as `sim --topo`; KIND is one of leaf-spine, fat-tree, rail-optimized, multi-plane, dual-tor. Every parameter has a default (`--params` lists them), so KIND alone builds. Keys take dashes or underscores.

Examples:

  fabricscope topo build rail-optimized:servers=128 -o rail-1k.yaml

  fabricscope topo build rail-optimized:servers=4096 -o rail-32k.json   # 3 tiers, 32,768 GPUs

  fabricscope topo build multi-plane:servers=64,planes=4 -o mp.yaml

  fabricscope topo build dual-tor:servers=32,oversubscription=2 -o dt.yaml

  fabricscope topo build leaf-spine:leaves=32,hosts_per_leaf=32,spines=8 -o ls.yaml   # 4:1

  fabricscope topo build fat-tree:k=16 -o ft.yaml

  fabricscope topo build fat-tree:pods=16,tors_per_pod=8,aggs_per_pod=8,hosts_per_tor=8,cores_per_plane=8 -o htsim-1024.yaml

  fabricscope topo build leaf-spine -o ls-default.yaml   # defaults: 8 leaves x 8 hosts, 4 spines

  fabricscope topo build rail-optimized --params
"""

_SHOW_HELP = """Summarize an inventory FILE: GPUs, switches by tier, links, bisection, oversubscription.

Also hosts, NICs, rails and planes. Bisection is half the smallest total capacity between two adjacent tiers (see docs/fabric.md).

Examples:

  fabricscope topo show rail-1k.yaml

  fabricscope topo show rail-32k.json --json
"""


def register(app: typer.Typer) -> None:
    """Add the ``topo`` command group (``build``, ``show``)."""
    topo = typer.Typer(
        help="Build fabric inventories (leaf-spine, fat tree, rail-optimized, multi-plane, "
        "dual-ToR) and summarize them.\n\nExamples:\n\n"
        "  fabricscope topo build rail-optimized:servers=128 -o rail-1k.yaml\n\n"
        "  fabricscope topo show rail-1k.yaml",
        no_args_is_help=True,
    )
    app.add_typer(topo, name="topo")

    @topo.command("build", help=_BUILD_HELP)
    def build(
        kind: str = typer.Argument(..., metavar="SPEC", help="KIND[:KEY=VALUE,...]; KIND: leaf-spine | fat-tree | rail-optimized | multi-plane | dual-tor"),
        params: list[str] | None = typer.Argument(None, hidden=True, help="Older form: parameters as separate KEY=VALUE words."),
        out: Path | None = typer.Option(None, "--out", "-o", help="Inventory file to write (.yaml/.yml/.json)."),
        list_params: bool = typer.Option(False, "--params", help="List KIND's parameters and defaults, then exit."),
    ) -> None:
        import inspect

        from rich.console import Console

        from fabricscope.fabric.catalog import build_fabric, builder_parameters, parse_fabric_spec
        from fabricscope.fabric.io import write_fabric
        from fabricscope.fabric.summary import summarize
        from fabricscope.model.errors import ConfigError

        console = Console(highlight=False, soft_wrap=True)  # piped: one line, not wrapped at 80
        kind, given = parse_fabric_spec([kind, *(params or [])], source="topo build")
        if list_params:
            for name, (tp, default) in builder_parameters(kind).items():
                shown = "required" if default is inspect.Parameter.empty else f"default {default}"
                console.print(f"  {name:<24} {tp:<36} {shown}")
            return
        if out is None:
            raise ConfigError("topo build: --out FILE is required (.yaml, .yml or .json)")
        # Spinner on stderr (stdout is the result line); rich draws it only on a terminal.
        with Console(stderr=True).status(f"building {kind} ...") as status:
            fabric = build_fabric(kind, given, source=f"topo build {kind}")
            status.update(f"writing {out} ({len(fabric.links):,} links) ...")
            write_fabric(fabric, out)
        s = summarize(fabric)
        console.print(
            f"wrote {out}: {s['gpus']} GPUs, {s['nics']} NICs, {s['switches_total']} switches "
            f"({_switch_text(s)}), {s['links_total']} links, {s['tiers']} tiers, "
            f"bisection {_gbps(s['bisection_gbps'])}"
        )

    @topo.command("show", help=_SHOW_HELP)
    def show(
        file: Path = typer.Argument(..., help="Inventory file (.yaml, .yml or .json)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        from fabricscope.fabric.io import read_fabric
        from fabricscope.fabric.summary import summarize

        summary = summarize(read_fabric(file))
        if as_json:
            typer.echo(json.dumps(summary, indent=2, default=str))
            return
        _print_summary(summary)


def _gbps(v: float) -> str:
    if v >= 1e3:
        return f"{v / 1e3:,.1f} Tb/s"
    return f"{v:,.0f} Gb/s"


def _switch_text(s: dict[str, object]) -> str:
    sw = s["switches"]
    assert isinstance(sw, dict)
    return ", ".join(f"{n} {role}" for role, n in sw.items())


def _print_summary(s: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{s['name']} ({s['kind']}, {s['tiers']} tiers)", show_header=False)
    t.add_column("what", style="bold", no_wrap=True)  # the subject stays whole; values fold
    t.add_column("value")
    t.add_row("GPUs", f"{s['gpus']:,}")
    t.add_row("hosts", f"{s['hosts']:,}")
    t.add_row("NICs", f"{s['nics']:,} ({_gbps(float(str(s['nic_gbps'])))} each, {s['nic_ports']:,} ports in all)")
    t.add_row("switches", f"{s['switches_total']:,} ({_switch_text(s)})")
    links = s["links"]
    caps = s["link_capacity_gbps"]
    assert isinstance(links, dict) and isinstance(caps, dict)
    for pair, n in links.items():
        t.add_row(f"links {pair}", f"{n:,} ({_gbps(caps[pair])})")
    t.add_row("rails / planes", f"{s['rails']} / {s['planes']}")
    comp = s["components"]
    t.add_row("bisection", _gbps(float(str(s["bisection_gbps"])))
              + ("" if comp == 1 else f" ({comp} disconnected pieces)"))
    over = s["oversubscription"]
    assert isinstance(over, dict)
    for tier, ratio in over.items():
        t.add_row(f"oversubscription {tier}", f"{ratio:g}:1")
    console = Console(highlight=False)
    if not console.is_terminal:  # piped: as wide as the table needs, not wrapped at 80
        console = Console(highlight=False, width=400)
    console.print(t)
