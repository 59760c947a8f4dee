"""``fabricscope demo``: the main job on an embedded default twin."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command."""

    @app.command(
        "demo",
        help=(
            "Run the closed loop on an embedded default twin: a load-balancing what-if on a "
            "rail-optimized cluster, its telemetry streamed over real gNMI into the collector, "
            "the mesh prober localizing an injected gray link, and a training job whose slow "
            "NIC is localized from per-rank traces.\n\n"
            "Examples:\n\n"
            "  fabricscope demo\n\n"
            "  fabricscope demo --part sim --part probe --out /tmp/demo\n\n"
            "  fabricscope demo --quick"
        ),
    )
    def demo(
        out: Path = typer.Option(Path("demo-out"), "--out", "-o", help="Folder for plots and summary.json."),
        seed: int = typer.Option(7, help="Seed for every random choice (fault placement, noise)."),
        part: list[str] = typer.Option(
            [], "--part", "-p", help="Run only these parts: sim, telemetry, probe, straggler."
        ),
        quick: bool = typer.Option(False, help="Smaller twin and shorter runs (seconds)."),
    ) -> None:
        from rich.console import Console

        from fabricscope.service.demo import run_demo

        console = Console(highlight=False)
        run_demo(outdir=out, seed=seed, parts=part or None, quick=quick, echo=console.print)
