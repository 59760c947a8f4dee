"""``fabricscope design``: compare fabric designs on cost, scaling efficiency and availability."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import typer

_COMPARE_HELP = """Compare fabric designs at one or more scales: bill of materials and cost per GPU, the step time of a training job from the simulator (ECMP vs spraying), failures and their blast radius, interruptions per day, the Young / Daly checkpoint interval, goodput, and availability against 99.99%.

DESIGN files are YAML (name, kind: fat-tree | rail-optimized | multi-plane | dual-tor, params, optional catalog and failures overrides). With no DESIGN, the four built-in examples run: rail-2tier, fattree, dual-plane, dual-tor (`design examples` writes them out to edit). --job is a job file (tp, pp, params_billion, compute_s, overlap, checkpoint_s, restart_s, ...); the default is a 70B dense model, TP 8.

Examples:

  fabricscope design compare --gpus 8192

  fabricscope design examples designs/

  fabricscope design compare designs/rail-2tier.yaml designs/fattree.yaml --gpus 2048 --job designs/job-llm70b.yaml --json

  fabricscope design compare --gpus 1024,4096 --extrapolate 131072 --plot plots/

  fabricscope design compare --gpus 32768 --no-sim --runs 200   # cost and availability only
"""

_EXAMPLES_HELP = """Write the built-in example designs and job file into FOLDER, to copy and edit.

Examples:

  fabricscope design examples designs/

  fabricscope design compare designs/rail-2tier.yaml designs/fattree.yaml --gpus 8192 --job designs/job-llm70b.yaml
"""


def _int_list(text: str, flag: str) -> list[int]:
    from fabricscope.model.errors import ConfigError

    out: list[int] = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        mult = 1
        if part.endswith("k"):
            mult, part = 1024, part[:-1]
        try:
            v = int(part) * mult
        except ValueError:
            raise ConfigError(f"{flag}: {text!r}: not a list of integers (e.g. 8192,32768 or 8k,32k)") from None
        if v < 1:
            raise ConfigError(f"{flag}: {v}: must be >= 1")
        out.append(v)
    if not out:
        raise ConfigError(f"{flag}: give at least one GPU count")
    return sorted(set(out))


def _examples_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("fabricscope.design") / "examples"))


def _work(args: tuple[Any, int, Any, Any, Any]) -> dict[str, Any]:
    from fabricscope.design.compare import evaluate

    spec, gpus, job, catalog, options = args
    return evaluate(spec, gpus, job, catalog=catalog, options=options)


def _run_all(
    tasks: Sequence[tuple[Any, int, Any, Any, Any]], workers: int,
    progress: Callable[[int, dict[str, Any]], None],
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    if workers <= 1 or len(tasks) <= 1:
        for i, t in enumerate(tasks):
            results.append(_work(t))
            progress(i, results[-1])
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, r in enumerate(pool.map(_work, tasks)):
            results.append(r)
            progress(i, r)
    return results


def _money(x: float) -> str:
    return f"${x:,.0f}"


def _print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=170)  # piped: keep each table row on one line
    rows = result["designs"]
    t = Table(title="Bill of materials (fabric only)", title_justify="left")
    for col in ("design", "GPUs", "tiers", "switches", "switch ports", "ports/GPU", "optics",
                "cables", "cost/GPU", "W/GPU", "total cost"):
        t.add_column(col, justify="right" if col not in ("design",) else "left")
    for r in rows:
        b = r["bom"]
        t.add_row(r["name"], f"{r['gpus']:,}", str(r["tiers"]), f"{b['switches']:,}",
                  f"{b['switch_ports_used']:,}", f"{b['switch_ports_used'] / r['gpus']:.2f}",
                  f"{b['transceivers']:,}", f"{b['cables']:,}", _money(b["cost_per_gpu_usd"]),
                  f"{b['watts_per_gpu']:.0f}", _money(b["cost_usd"]))
    console.print(t)
    lbs = sorted({lb for r in rows for lb in r["steps"]})
    t = Table(title=f"Step time of {result['job']['name']} (s) and scaling efficiency "
                    "(compute / step)", title_justify="left")
    t.add_column("design")
    t.add_column("GPUs", justify="right")
    for lb in lbs:
        t.add_column(f"{lb} step", justify="right")
        t.add_column(f"{lb} eff.", justify="right")
    t.add_column("after a failure", justify="left")
    for r in rows:
        cells = [r["name"], f"{r['gpus']:,}"]
        for lb in lbs:
            st = r["steps"].get(lb)
            cells += ([f"{st['step_s']:.3f}", f"{st['efficiency']:.1%}"] if st
                      else (["skipped", "-"] if lb in (r.get("skipped") or {}) else ["-", "-"]))
        deg = r.get("degraded") or {}
        cells.append("; ".join(f"{lb}: {d['step_s']:.3f} s ({d['fault']})" for lb, d in deg.items()) or "-")
        t.add_row(*cells)
    for e in result.get("extrapolated", []):
        st = e["step"]
        cells = [f"{e['name']} (analytical)", f"{e['gpus']:,}"]
        for _lb in lbs:
            cells += [f"{st['step_s']:.3f}", f"{st['efficiency']:.1%}"]
        cells.append(f"assumes {e['tiers_assumed']} tiers, no collisions")
        t.add_row(*cells)
    console.print(t)
    for r in rows:
        for lb, why in (r.get("skipped") or {}).items():
            console.print(f"note: {r['name']} @ {r['gpus']:,} GPUs: {lb} skipped: {why}")
    t = Table(title="Availability and goodput (job on every GPU)", title_justify="left")
    for col in ("design", "GPUs", "interrupts/day", "fabric share", "job MTBF h",
                "Young min", "Daly min", "goodput", "MC goodput p5-p95", "fabric avail.",
                "99.99%?"):
        t.add_column(col, justify="left" if col == "design" else "right")
    for r in rows:
        it = r["interruptions"]
        fab = sum(v for k, v in it["by_component"].items() if k != "gpu")
        share = fab / it["per_day"] if it["per_day"] else 0.0
        ck = r["checkpoint"]
        mc = r.get("montecarlo")
        mcs = (f"{mc['goodput']['p5']:.3f}-{mc['goodput']['p95']:.3f}" if mc else "-")
        av = r["availability"]
        t.add_row(r["name"], f"{r['gpus']:,}", f"{it['per_day']:.2f}", f"{share:.0%}",
                  f"{it['mtbf_s'] / 3600:.1f}", f"{ck['young_s'] / 60:.1f}",
                  f"{ck['daly_s'] / 60:.1f}", f"{ck['goodput_daly']:.4f}", mcs,
                  f"{av['fabric']:.6f}", "yes" if av["meets_target"] else "NO")
    console.print(t)
    t = Table(title="Blast radius of one failure (largest scale of each design): GPUs cut stop "
                    "the job; degraded GPUs keep a path at reduced bandwidth after the failover",
              title_justify="left")
    for col in ("design", "component", "count", "GPUs cut", "GPUs degraded", "bw lost",
                "failover", "failover s", "stops the job"):
        t.add_column(col, justify="left" if col in ("design", "component", "failover") else "right")
    largest: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["name"] not in largest or r["gpus"] > largest[r["name"]]["gpus"]:
            largest[r["name"]] = r
    for r in largest.values():
        for b in r["blast"]:
            fo = b["failover"]
            t.add_row(r["name"], b["component"], f"{b['count']:,}", f"{b['gpus_cut']:.2f}",
                      f"{b['gpus_degraded']:.2f}",
                      f"{b['bandwidth_lost']:.1%}" if b["gpus_degraded"] else "-",
                      fo, f"{r['failover_s'].get(fo, 0.0):g}" if fo != "none" else "-",
                      f"{r['interruptions']['probability'].get(b['component'], 0.0):.0%}")
    console.print(t)
    if result["port_saving"]:
        t = Table(title="Switch ports: rail family vs fat tree (claim: ~40% fewer)",
                  title_justify="left")
        for col in ("GPUs", "design", "tiers", "ports/GPU", "fat tree", "tiers ", "ports/GPU ",
                    "saving"):
            t.add_column(col, justify="left" if col in ("design", "fat tree") else "right")
        for p in result["port_saving"]:
            t.add_row(f"{p['gpus']:,}", p["design"], str(p["tiers"]), f"{p['ports_per_gpu']:.2f}",
                      p["fat_tree"], str(p["fat_tree_tiers"]), f"{p['fat_tree_ports_per_gpu']:.2f}",
                      f"{p['saving']:.0%}")
        console.print(t)
    for n in result["notes"]:
        console.print(f"note: {n}")


def register(app: typer.Typer) -> None:
    """Add the ``design`` command group (``compare``, ``examples``)."""
    design = typer.Typer(
        help="Design what-if: compare fabric designs on cost per GPU, scaling efficiency "
        "and availability before buying.\n\nExamples:\n\n"
        "  fabricscope design compare --gpus 8192,32768\n\n"
        "  fabricscope design examples designs/",
        no_args_is_help=True,
    )
    app.add_typer(design, name="design")

    @design.command("compare", help=_COMPARE_HELP)
    def compare(
        designs: list[Path] | None = typer.Argument(None, metavar="DESIGN", help="Design YAML files (default: the four built-in examples)."),
        gpus: str = typer.Option("8192,32768", "--gpus", "-g", help="GPU counts to build each design at (comma list; 8k = 8192)."),
        job_file: Path | None = typer.Option(None, "--job", help="Job YAML (default: 70B dense, TP 8, compute 2 s/step)."),
        catalog_file: Path | None = typer.Option(None, "--catalog", help="Price / power catalog overrides (YAML; see docs/design/design-catalog.md)."),
        runs: int = typer.Option(1000, "--runs", help="Monte Carlo runs per design and scale (0: closed forms only)."),
        horizon_days: float = typer.Option(30.0, "--horizon-days", help="Monte Carlo horizon."),
        seed: int = typer.Option(0, "--seed", help="Seed of the Monte Carlo and of random placement."),
        lb: str | None = typer.Option(None, "--lb", help="Load balancing to simulate: ecmp, spray or ecmp,spray (default: the job's)."),
        no_sim: bool = typer.Option(False, "--no-sim", help="Skip the simulator (analytical step time only): fastest."),
        extrapolate: str | None = typer.Option(None, "--extrapolate", help="Larger GPU counts to add with the analytical model (e.g. 65536,131072)."),
        plot: Path | None = typer.Option(None, "--plot", help="Folder for cost, scaling and goodput plots (PNG)."),
        as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
        out: Path | None = typer.Option(None, "--out", "-o", help="Also write the JSON result to this file."),
        workers: int = typer.Option(0, "--workers", help="Worker processes (default: CPU count, at most the number of cases)."),
    ) -> None:
        from fabricscope.cli._outputs import check_output_dir, check_output_file
        from fabricscope.design.catalog import default_catalog, load_catalog
        from fabricscope.design.compare import Options, summarize
        from fabricscope.design.scaling import job_from_mapping
        from fabricscope.design.spec import check_size, load_design
        from fabricscope.model.errors import ConfigError
        from fabricscope.model.yamlfile import read_yaml

        scales = _int_list(gpus, "--gpus")
        ext = _int_list(extrapolate, "--extrapolate") if extrapolate else []
        if runs < 0 or runs == 1:
            raise ConfigError(f"--runs: {runs}: give 0 (closed forms only) or >= 2")
        if horizon_days <= 0:
            raise ConfigError(f"--horizon-days: {horizon_days}: must be > 0")
        if plot is not None:
            check_output_dir(plot, flag="--plot")
        if out is not None:
            check_output_file(out, flag="--out", suffixes=(".json",))
        paths = list(designs or sorted(p for p in _examples_dir().glob("*.yaml")
                                       if not p.name.startswith("job-")))
        specs = [load_design(p) for p in paths]
        names = [s.name for s in specs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"designs: name {dup[0]!r} is used by two files; names must differ")
        if job_file is not None:
            job = job_from_mapping(read_yaml(job_file, what="job file"), source=str(job_file))
        else:
            job = job_from_mapping(None, source="default job")
        if lb is not None:
            job = dataclasses.replace(
                job, lb=tuple(x.strip() for x in lb.split(",") if x.strip()), source="--lb")
        for s in specs:  # every impossible size fails before any long work starts
            for g in scales:
                check_size(s, g)
                job.dp_for(g)
        catalog = load_catalog(catalog_file) if catalog_file is not None else default_catalog()
        options = Options(runs=runs, des_runs=2000 if runs else 0, seed=seed,
                          horizon_days=horizon_days, simulate=not no_sim)
        tasks = [(s, g, job, catalog, options) for g in scales for s in specs]
        n_workers = workers or min(len(tasks), os.cpu_count() or 1)
        t0 = time.perf_counter()
        print(f"design compare: {len(specs)} designs ({', '.join(names)}) x {len(scales)} "
              f"scales = {len(tasks)} cases, {n_workers} worker(s)", file=sys.stderr)

        def progress(i: int, r: dict[str, Any]) -> None:
            print(f"  [{i + 1}/{len(tasks)}] {r['name']} @ {r['gpus']:,} GPUs: {r['tiers']} tiers, "
                  f"{r['seconds']:.1f} s", file=sys.stderr)

        rows = _run_all(tasks, n_workers, progress)
        result = summarize(rows, specs, job, extrapolate=ext, options=options)
        result["seconds"] = round(time.perf_counter() - t0, 2)
        result["design_files"] = [str(p) for p in paths]
        if out is not None:
            out.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
        if plot is not None:
            from fabricscope.design.plot import plot_comparison

            for p in plot_comparison(result, plot):
                print(f"wrote {p}", file=sys.stderr)
        if as_json:
            print(json.dumps(result, indent=1, default=str))
        else:
            _print_tables(result)
        print(f"design compare: done in {result['seconds']:.1f} s", file=sys.stderr)

    @design.command("examples", help=_EXAMPLES_HELP)
    def examples(
        folder: Path = typer.Argument(..., metavar="FOLDER", help="Folder to write the example files into."),
        force: bool = typer.Option(False, "--force", help="Overwrite files of the same name."),
    ) -> None:
        from fabricscope.cli._outputs import check_output_dir
        from fabricscope.model.errors import ConfigError

        check_output_dir(folder, flag="FOLDER")
        srcs = sorted(_examples_dir().glob("*.yaml"))
        clash = [p.name for p in srcs if (folder / p.name).exists()]
        if clash and not force:
            raise ConfigError(f"FOLDER {folder}: {clash[0]} exists; pass --force to overwrite")
        for p in srcs:
            (folder / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
            print(f"wrote {folder / p.name}")
