"""``fabricscope demo``: the main job on an embedded default twin."""

from __future__ import annotations

from pathlib import Path

import typer

from fabricscope.model.errors import ConfigError


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command."""

    @app.command(
        "demo",
        help=(
            "Run the closed loop on an embedded default twin: a load-balancing what-if on a "
            "rail-optimized cluster, its telemetry streamed over real gNMI into the collector, "
            "the mesh prober localizing an injected gray link, and a training job whose slow "
            "NIC is localized from per-rank traces.\n\n"
            "Each part prints what it injected, what was found and how long it took; "
            "--out receives summary.json and each part's plots (a folder that holds "
            "something else is refused unless --force).\n\n"
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
            [], "--part", "-p", help="Run only these parts: loop, sim, telemetry, probe, straggler."
        ),
        quick: bool = typer.Option(False, help="Smaller twin and shorter runs (seconds)."),
        force: bool = typer.Option(
            False, help="Write into --out even if it holds files of something else."
        ),
    ) -> None:
        from contextlib import AbstractContextManager, nullcontext

        from rich.console import Console

        from fabricscope.cli._outputs import check_output_dir
        from fabricscope.service.demo import PARTS, run_demo

        known = [p for p, _ in PARTS]
        bad = [p for p in part if p not in known]
        if bad:
            raise ConfigError(f"demo --part: unknown part {bad[0]!r}; choose from {', '.join(known)}")
        if seed < 0:
            raise ConfigError(f"demo --seed: {seed} is negative; give a seed >= 0")
        check_output_dir(out, flag="--out", marker="summary.json", force=force)
        console = Console(highlight=False)
        # Piped output keeps whole lines (a reader greps them); a terminal wraps at its width.
        console.soft_wrap = not console.is_terminal

        def progress(title: str) -> AbstractContextManager[object]:
            # A spinner with elapsed time while a part runs, on a terminal only.
            if not console.is_terminal:
                return nullcontext()
            return console.status(f"{title} ...")

        run_demo(
            outdir=out, seed=seed, parts=part or None, quick=quick, echo=console.print,
            progress=progress,
        )
