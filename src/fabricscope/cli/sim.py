"""``fabricscope sim``: run a what-if scenario (from a YAML file or flags) and report it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from fabricscope.sim.scenario import Prepared
    from fabricscope.sim.transport import TransportConfig
    from fabricscope.sim.transport_tune import Trial

_HELP = """Simulate a workload on a fabric with one or several load-balancing schemes.

The flow-level engine gives every flow max-min fair rates between arrivals and completions and reports FCTs, collective busbw, link utilization and any unroutable flow. Give a scenario YAML file (see docs/sim.md) or describe the scenario with flags.

--topo is KIND[:KEY=VALUE,...] (a builder: leaf-spine, fat-tree, rail-optimized, multi-plane, dual-tor; the same spec as `topo build`, every parameter has a default) or an inventory FILE. --workload is KIND[:KEY=VALUE,...] (permutation, nic-all-to-all, incast, allreduce, allgather, reducescatter, alltoall, flows, job, poisson). A LINK is a cable id 'a:eth1|b:eth2', a port 'a:eth1' or two devices 'a~b'.

Schemes: ecmp, random (uniform random path), spray (per-packet), flowlet, dlb (least-loaded path per flowlet, CONGA-style, against current capacity), stripe (multi-plane or dual-homed NICs only).

With several --seed every cell is mean ±sd over the seeds and each comparison below the table says whether it exceeds the seed spread (95% CI). A workload estimated above 2,000,000 flows per seed is refused unless --force (a ring's steady_state=true answers in seconds).

Examples:

  fabricscope sim --topo fat-tree:k=8 --workload permutation:size=2MiB --lb ecmp,spray,dlb

  fabricscope sim --topo rail-optimized:servers=16 --workload allreduce:size=32MiB,placement=random --lb ecmp,spray

  fabricscope sim --topo leaf-spine:leaves=4,hosts_per_leaf=8,spines=4 --workload permutation:size=1MB --fail leaf-000~spine-00 --degrade leaf-001~spine-01=25%

  fabricscope sim scenario.yaml --out results/ --seed 0 --seed 1

  fabricscope sim --topo leaf-spine:leaves=4,hosts_per_leaf=8,spines=4 --workload poisson:cdf=websearch,load=0.5,duration=1ms --cc hpcc

A poisson workload is open-loop traffic: every NIC starts flows as a Poisson process at load x its link rate, sizes from a flow-size CDF (cdf=websearch or fb_hadoop, the HPCC repository's, or a 'SIZE PERCENT' file), destinations uniform. Transport runs (--cc other than ideal) also print the FCT slowdown (FCT / FCT alone on an empty path) by flow-size bucket (p50 / p95 / p99), and --out adds it to sim.json and slowdown.png.
"""


def _cc_names() -> tuple[str, ...]:
    """``CC_NAMES`` of sim/transport/config.py, read without importing it (the import pulls
    numba, about a second on every start of the CLI); the import is the fallback."""
    import ast

    import fabricscope

    try:
        path = Path(fabricscope.__file__).parent / "sim" / "transport" / "config.py"
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target: ast.expr
            value: ast.expr | None
            if isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id == "CC_NAMES" and value is not None:
                names = ast.literal_eval(value)
                if isinstance(names, tuple) and all(isinstance(x, str) for x in names):
                    return names
    except (OSError, SyntaxError, ValueError):
        pass
    from fabricscope.sim.transport.config import CC_NAMES

    return tuple(CC_NAMES)


def _cc_help() -> str:
    fluid = [n for n in _cc_names() if n not in ("none", "ideal")]
    return ("Congestion control: ideal (max-min, no queues) or a fluid transport one "
            f"(buffers, ECN, PFC): {', '.join(fluid)}.")


def register(app: typer.Typer) -> None:
    """Add the ``sim`` command."""

    @app.command("sim", help=_HELP)
    def sim(
        scenario_file: Path | None = typer.Argument(None, metavar="[SCENARIO.yaml]", help="Scenario file (YAML)."),
        topo: str | None = typer.Option(None, "--topo", help="KIND[:KEY=VALUE,...] or an inventory file."),
        workload: str | None = typer.Option(None, "--workload", "-w", help="KIND[:KEY=VALUE,...], e.g. permutation:size=2MiB."),
        lb: str | None = typer.Option(
            None, "--lb",
            help="Scheme(s), comma separated: ecmp, random, spray, flowlet, dlb, stripe, oblivious:paths=N; with a "
                 "transport --cc also reps[:paths=N] (senders recycle the entropies that came back unmarked) "
                 "and ar (switches split by their own egress queues: adaptive routing).",
        ),
        fail: list[str] = typer.Option([], "--fail", help="LINK to take down (repeatable)."),
        degrade: list[str] = typer.Option([], "--degrade", help="LINK=FACTOR: capacity kept, 0.25 or 25% (repeatable)."),
        corrupt: list[str] = typer.Option(
            [], "--corrupt",
            help="LINK=LOSS: the link corrupts that fraction of its frames, 0.01 or 1% (gray-loss; repeatable; transport "
                 "--cc only: re-sent end to end, or on the link with --llr).",
        ),
        seed: list[int] = typer.Option([], "--seed", help="Seed(s) for placement / permutation / random LB (repeatable)."),
        hash_function: str | None = typer.Option(None, "--hash", help="ECMP hash: crc32 (default), crc16 or xor."),
        polarized: bool = typer.Option(False, "--polarized", help="Same hash seed on every switch (shows polarization)."),
        out: Path | None = typer.Option(
            None, "--out", "-o",
            help="Directory for sim.json, fct_cdf.png, link_util.png (transport runs: slowdown.png, queues.png, pauses.png).",
        ),
        no_plot: bool = typer.Option(False, "--no-plot", help="With --out: write sim.json only."),
        force: bool = typer.Option(
            False, "--force", help=f"Run a workload estimated above {2_000_000:,} flows per seed (hours of work).",
        ),
        cc: str = typer.Option(
            "ideal", "--cc",
            help=_cc_help(),
        ),
        buffer: str | None = typer.Option(None, "--buffer", help="With a transport --cc (not ideal): shared buffer per switch, e.g. 32MiB."),
        ecn: str | None = typer.Option(None, "--ecn", help="With a transport --cc (not ideal): KMIN,KMAX,PMAX, e.g. 5KB,200KB,0.01."),
        pfc: bool | None = typer.Option(
            None, "--pfc/--no-pfc",
            help="With a transport --cc (not ideal): lossless PFC (default on; off for the UEC transports nscc and eqds).",
        ),
        trim: bool | None = typer.Option(
            None, "--trim/--no-trim",
            help="With --cc nscc or eqds: switches trim a packet that does not fit to its header, which reaches the "
                 "receiver (NACK, re-sent at once; default) or drop it whole (found at the sender's timeout).",
        ),
        cbfc: bool = typer.Option(
            False, "--cbfc",
            help="With a transport --cc: credit-based flow control (UEC link layer) instead of PFC: a link sends only into "
                 "the credit the next switch advertised; lossless, no pause frames.",
        ),
        llr: bool = typer.Option(
            False, "--llr",
            help="With a transport --cc: link-level retry: frames a link corrupts (gray-loss faults) are re-sent on that "
                 "link instead of end to end.",
        ),
        dcqcn_params: str = typer.Option(
            "paper", "--dcqcn", help="With --cc dcqcn: parameter set paper (Zhu et al.) or nic-default.",
        ),
        tune_ecn: bool = typer.Option(
            False, "--tune-ecn",
            help="With a --cc that reacts to ECN marks (e.g. dcqcn): search ECN KMIN,KMAX,PMAX for the workload (coordinate search on the twin, "
                 "from SONiC's default lossless profile) on the --seed workloads, and report the gain on held-out ones.",
        ),
        holdout_seed: list[int] = typer.Option(
            [], "--holdout-seed",
            help="With --tune-ecn: workload seed(s) kept out of the search to measure the gain on (default: two new seeds).",
        ),
        tune_objective: str = typer.Option(
            "short_p99", "--tune-objective",
            help="With --tune-ecn: what to minimize: short_p99 (flows <= 200 KB), p99, short_p95 or mean slowdown.",
        ),
    ) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        from fabricscope.model.errors import ConfigError
        from fabricscope.service.sim_report import (
            format_comparisons,
            format_slowdowns,
            format_table,
            write_report,
        )
        from fabricscope.sim.scenario import (
            MAX_FLOWS,
            prepare,
            read_scenario,
            run_scenario,
            scenario_from_flags,
            with_overrides,
        )
        from fabricscope.sim.transport.config import transport_config_from_flags

        if dcqcn_params != "paper" and cc != "dcqcn":
            raise ConfigError("--dcqcn: only applies with --cc dcqcn")
        transport = transport_config_from_flags(cc=cc, buffer=buffer, ecn=ecn, pfc=pfc, dcqcn=dcqcn_params, trim=trim,
                                                cbfc=cbfc, llr=llr)
        if not tune_ecn:
            for flag, given in (("--holdout-seed", bool(holdout_seed)), ("--tune-objective", tune_objective != "short_p99")):
                if given:
                    raise ConfigError(f"{flag}: only applies with --tune-ecn")
        else:
            _check_tune_flags(transport, ecn, tune_objective)
        if no_plot and out is None:
            raise ConfigError("--no-plot: only applies with --out DIR (without --out nothing is plotted)")
        console = Console(highlight=False, soft_wrap=True)
        # Progress goes to stderr (stdout stays the report); rich draws it only on a terminal.
        errc = Console(stderr=True, highlight=False, soft_wrap=True)
        if scenario_file is not None:
            if topo is not None or workload is not None:
                raise ConfigError("--topo/--workload: give either a scenario file or flags, not both")
            sc = read_scenario(scenario_file)
            if lb is not None or seed or fail or degrade or corrupt or hash_function is not None or polarized:
                sc = with_overrides(sc, lb=lb, seeds=seed, fail=fail, degrade=degrade, corrupt=corrupt,
                                    hash_function=hash_function, polarized=polarized)
        else:
            if topo is None or workload is None:
                raise ConfigError(
                    "sim: give a SCENARIO.yaml or both --topo and --workload "
                    "(e.g. --topo fat-tree:k=8 --workload permutation:size=2MiB)"
                )
            sc = scenario_from_flags(
                topo=topo, workload=workload, lb=lb or "ecmp", fail=fail, degrade=degrade, corrupt=corrupt,
                seeds=seed or [0], hash_function=hash_function or "crc32", per_switch_seed=not polarized,
            )
        with errc.status("preparing ...") as status:
            # Everything is validated (and the flow count estimated) before the first run.
            prep = prepare(sc, max_flows=None if force else MAX_FLOWS,
                           progress=lambda text: status.update(text + " ..."))
        if transport is None and any(f.kind == "gray-loss" for f in prep.faults):
            raise ConfigError("gray-loss (--corrupt): frame corruption is modelled by the transport engine only; "
                              "give a transport --cc (dcqcn, hpcc, nscc or eqds)")
        if llr and not any(f.kind == "gray-loss" for f in prep.faults):
            errc.print("note: --llr: no link corrupts frames in this run (give --corrupt LINK=LOSS), so it changes nothing")
        if out is not None:
            _output_folder(out)
        if tune_ecn:
            assert transport is not None
            _run_tune(prep, transport, holdout_seed, tune_objective, out, console, errc)
            return
        n_flows = sum(len(w.flows) for w in prep.workloads.values())
        if n_flows // max(len(prep.workloads), 1) > 200_000:
            from fabricscope.sim.scenario import steady_state_hint

            errc.print(f"note: {n_flows // len(prep.workloads):,} flows per seed; this can take minutes "
                       f"per run ({steady_state_hint(sc.workload)})")
        console.print(
            f"[bold]{sc.name}[/]: {prep.fabric.name} ({len(prep.fabric.nics)} NICs), "
            f"{sc.workload.get('kind')} ({n_flows // max(len(prep.workloads), 1)} flows), "
            f"schemes {', '.join(sc.schemes)}, seeds {', '.join(map(str, sc.seeds))}"
            + (f", faults: {', '.join(f'{f.kind} {f.subject}' for f in prep.faults)}" if prep.faults else "")
        )
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
            console=errc, transient=True,
        ) as bar:
            def progress(label: str):  # type: ignore[no-untyped-def]
                task = bar.add_task(label, total=1)

                def cb(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=max(total, 1))

                return cb

            watched = None
            if transport is None:
                result = run_scenario(prep, progress=progress, record_utilization=out is not None)
            elif out is not None:
                # Watched runs (same results): every switch queue traced in bounded memory and
                # every first pause timed, for sim.json's pauses and queues.png / pauses.png.
                from fabricscope.service.sim_plots_transport import run_transport_watched

                result, watched = run_transport_watched(prep, transport, progress=progress)
            else:
                result = run_scenario(prep, progress=progress, record_utilization=False, transport=transport)
        console.print(format_table(result, width=console.width if console.is_terminal else None))
        for line in format_comparisons(result):
            console.print(line, soft_wrap=not console.is_terminal)
        if transport is not None:
            for r in result.runs:
                console.print(_transport_line(r.label, r.seed, r.result.meta))
            for table in format_slowdowns(result):
                console.print("")
                console.print(table, soft_wrap=not console.is_terminal)
        partitioned: list[str] = []
        for r in result.runs:
            if r.result.unroutable or r.result.blocked:
                ex = r.result.summary().get("unroutable_flows", [])
                first = ", ".join(f"{f['src']}->{f['dst']}" for f in ex[:3]) if isinstance(ex, list) else ""
                console.print(
                    f"[yellow]warning[/]: {r.label} seed {r.seed}: {len(r.result.unroutable)} flow(s) "
                    f"unroutable (partitioned), {len(r.result.blocked)} blocked behind them: {first}"
                )
                partitioned.append(f"{r.label} seed {r.seed} ({len(r.result.unroutable)}, e.g. {first.split(', ')[0]})")
        if out is not None:
            try:
                files = write_report(result, out, plots=not no_plot, watched=watched)
            except OSError as exc:
                raise ConfigError(f"--out {out}: cannot write the report: {exc.strerror or exc}") from None
            for kind, path in files.items():
                console.print(f"{kind}: {path}")
        if partitioned:
            # The report above is complete; a partitioned fabric is still an error for scripts.
            from fabricscope.model.errors import UnroutableError

            raise UnroutableError(
                "the fabric is partitioned: unroutable flows in " + "; ".join(partitioned)
                + " (check --fail / faults: a NIC or leaf lost its last link)"
            )


def _check_tune_flags(transport: object, ecn: str | None, objective: str) -> None:
    from fabricscope.model.errors import ConfigError
    from fabricscope.sim.transport_tune import OBJECTIVES

    if transport is None or getattr(transport, "cc", None) in ("hpcc", "none", "eqds"):
        raise ConfigError("--tune-ecn: needs a --cc that reacts to ECN marks (e.g. dcqcn; not ideal, hpcc, whose window "
                          "follows INT, or eqds, whose receivers grant credit)")
    if ecn is not None:
        raise ConfigError("--ecn: not with --tune-ecn (the search chooses KMIN,KMAX,PMAX)")
    if objective not in OBJECTIVES:
        raise ConfigError(f"--tune-objective: unknown {objective!r} (choose one of {', '.join(OBJECTIVES)})")


def _run_tune(prep: Prepared, transport: TransportConfig, holdout_seeds: list[int], objective: str,
              out: Path | None, console: Console, errc: Console) -> None:
    """``--tune-ecn``: search on the scenario's seeds, score on held-out seeds, print, write."""
    import json

    from fabricscope.model.errors import ConfigError
    from fabricscope.sim.slowdown import format_size
    from fabricscope.sim.transport_tune import OBJECTIVES, VENDOR_TEMPLATE, tune_ecn
    from fabricscope.sim.workload import workload_from_spec

    obj = next(o for o in OBJECTIVES if o == objective)  # validated by _check_tune_flags

    sc = prep.scenario
    if len(sc.schemes) != 1:
        raise ConfigError(f"--tune-ecn: give one --lb scheme (got {', '.join(sc.schemes)})")
    if prep.faults:
        raise ConfigError("--tune-ecn: not with --fail/--degrade (tune the healthy fabric)")
    seeds = list(sc.seeds)
    held = list(holdout_seeds) or [max(seeds) + 1, max(seeds) + 2]
    if set(held) & set(seeds):
        raise ConfigError(f"--holdout-seed: {sorted(set(held) & set(seeds))} also searched (--seed); a held-out seed must be new")
    hold = [workload_from_spec(prep.fabric, sc.workload, seed=s, source=sc.source) for s in held]
    with errc.status("searching ECN settings ..."):
        res = tune_ecn(prep.fabric, [prep.workloads[s] for s in seeds], transport, holdout=hold,
                       objective=obj, lb=sc.schemes[0], seeds=seeds, holdout_seeds=held)

    def ecn_text(t: Trial) -> str:
        e = t.ecn
        return f"{format_size(e.kmin_bytes)},{format_size(e.kmax_bytes)},{e.pmax:g}"

    console.print(f"[bold]ECN tuning[/] ({transport.cc}, {sc.schemes[0]}, objective {objective} slowdown, "
                  f"{len(res.trials)} settings x {len(seeds)} workload(s), {res.rounds} round(s))")
    b = VENDOR_TEMPLATE
    console.print(f"template (SONiC AZURE_LOSSLESS {format_size(b.kmin_bytes)},{format_size(b.kmax_bytes)},{b.pmax:g}): "
                  f"{res.baseline.score:.3f} on seeds {', '.join(map(str, seeds))}")
    console.print(f"best --ecn {ecn_text(res.best)}: {res.best.score:.3f} (gain {res.gain:.1%} on the searched seeds)")
    if res.holdout_best is not None and res.holdout_baseline is not None and res.holdout_gain is not None:
        console.print(f"held-out seeds {', '.join(map(str, held))}: template {res.holdout_baseline.score:.3f}, "
                      f"best {res.holdout_best.score:.3f}: gain {res.holdout_gain:.1%}")
    for axis, span in res.sensitivity_span().items():
        pts = ", ".join(f"{format_size(v) if axis != 'pmax' else f'{v:g}'}: {sc_:.2f}" for v, sc_ in res.sensitivity[axis])
        console.print(f"sensitivity {axis} (others at the best; spread {span:.1%}): {pts}")
    for note in res.notes:
        console.print(f"note: {note}")
    if out is not None:
        path = out / "ecn_tune.json"
        try:
            path.write_text(json.dumps({"search_seeds": seeds, "holdout_seeds": held, **res.to_dict()}, indent=2) + "\n",
                            encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot write the report: {exc.strerror or exc}") from None
        console.print(f"tune: {path}")


def _transport_line(label: str, seed: int, meta: object) -> str:
    """One line of queue / mark / pause / drop counters of a transport run."""
    m = meta if isinstance(meta, dict) else {}
    line = (
        f"transport {label} seed {seed}: {m.get('cc')}{f' ({d})' if (d := m.get('dcqcn')) != '-' else ''}, pfc {'on' if m.get('pfc') else 'off'}"
        f"{'' if (tr := m.get('trimming')) is None else ', trimming ' + ('on' if tr else 'off')}"
        f"{', cbfc' if m.get('cbfc') else ''}{', llr' if m.get('llr') else ''}: "
        f"max queue {m.get('max_queue_KB')} KB, drops {m.get('drops_KB')} KB"
        f"{f' (trimmed {t} KB)' if (t := m.get('trimmed_KB')) else ''}, ECN marks {m.get('ecn_marks')}, "
        f"pause frames {m.get('pause_frames')} ({m.get('paused_links')} links paused {m.get('paused_us')} us), "
        f"watchdog {m.get('watchdog_events')}"
        f"{f', LLR retries {r}' if (r := m.get('llr_retries')) else ''}"
    )
    if m.get("unfinished"):
        line += f", unfinished flows {m.get('unfinished')} (simulated time limit)"
    return line


def _output_folder(out: Path) -> None:
    """``--out`` must be a folder we can write (made now, before a long run, not after it)."""
    import os

    from fabricscope.model.errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is an existing file, not a folder (sim writes sim.json and plots into a folder)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the folder: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: the folder is not writable")
