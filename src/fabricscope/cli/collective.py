"""``fabricscope collective``: analyze nccl-tests / NCCL Inspector outputs, watch a benchmark."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer

_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(h|m|s)?\s*$")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, None: 1.0}

_ANALYZE_HELP = """Per file: the collective, ranks, nodes, per size time / algbw / busbw (out-of-place and in-place), the peak busbw and where it is reached, the file's own Avg bus bandwidth next to the reader's recomputation; with an expectation, measured / expected per size and a collective-busbw-low finding when below it by more than --margin, attributed by the curve's shape (bandwidth-network, bandwidth-nvlink-or-pcie, latency, ambiguous).

FILES are nccl-tests outputs (any *_perf binary, any version; mpirun --tag-output prefixes, NCCL INFO lines and failures mixed in are fine) or NCCL Inspector JSONL files. The expectation is one of: a known-good run of the same job (--baseline: every size is judged, small and large, so latency and bandwidth are told apart), a JSON file {size: busbw} (--expected, every size it names), a flat --expected-busbw, or the simulator's figure for a fabric (--fabric). The last two are bandwidths and judge only the largest sizes (at least 1/4 of the largest): a real NCCL curve reaches the fabric's bound only there, and the model has none of NCCL's protocol latencies.

Examples:

  fabricscope collective analyze examples/collective/allreduce_8gpu.log

  fabricscope collective analyze examples/collective/allreduce_2node.txt --expected-busbw 360 --json

  fabricscope collective analyze examples/collective/allreduce_2node.txt --fabric rail-optimized:servers=2,gpus-per-server=8 --plot busbw.png

  fabricscope collective analyze examples/collective/allreduce_2node.txt --baseline examples/collective/allreduce_2node.txt
"""

_WATCH_HELP = """Run a benchmark command every --every, record avg busbw, avg time, max latency and latency std per run (DuckDB --store), detect changes (robust median/MAD baseline, two-sided CUSUM), and on an anomaly print it, run the RoCE link checks (those of 'roce check': on this host, or on saved outputs with --roce-from; --no-link-checks skips them), add a collective-regression finding naming --subject with the link-check verdicts as evidence (and each failed link check as its own finding) to --db, and run --on-anomaly.

Everything after -- is the benchmark command (in production e.g. mpirun -np 16 all_reduce_perf -b 8 -e 8G -f 2); its stdout is read as nccl-tests output. The example below replays five real runs, the last two with a slower socket configuration.

Examples:

  fabricscope collective watch --every 1s --count 5 --warmup 3 --db diag.duckdb -- python3 examples/collective/print_run.py examples/collective/socket_runs.md state.txt 0 1 2 3 4

  fabricscope collective watch --every 0s --count 5 --warmup 3 --subject job/llama-70b --roce-from tests/data/roce/broken --db diag-links.duckdb -- python3 examples/collective/print_run.py examples/collective/socket_runs.md state2.txt 0 1 2 3 4
"""


_GROUP_HELP = ("Collective health: read nccl-tests and NCCL Inspector outputs, compare busbw with "
               "the expected figure, watch a benchmark for regressions.\n\nExamples:\n\n"
               "  fabricscope collective analyze examples/collective/allreduce_8gpu.log\n\n"
               "  fabricscope collective analyze examples/collective/allreduce_2node.txt --expected-busbw 360")


def parse_every(text: str) -> float:
    """``5m``, ``30s``, ``1h``, ``10`` (seconds) -> seconds."""
    from fabricscope.model.errors import ConfigError

    m = _DUR.match(text)
    if not m or float(m.group(1)) < 0:
        raise ConfigError(f"--every: {text!r}: expected a duration like 5m, 30s or 1h")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _expected_file(path: Path) -> dict[int, float]:
    from fabricscope.model.errors import ConfigError

    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--expected: {path}: not a readable JSON object ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--expected: {path}: expected a JSON object {{size: busbw_gbs}}")
    out: dict[int, float] = {}
    for k, v in data.items():
        try:
            out[int(k)] = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"--expected: {path}: {k!r}: {v!r}: expected an integer size "
                              "and a busbw in GB/s") from None
    return out


def _baseline(path: Path, *, collective: str | None) -> tuple[dict[int, float], Any]:
    """The better placement's busbw per size of the known-good run in ``path``."""
    from fabricscope.collective import read_collective_file
    from fabricscope.model.errors import ConfigError

    runs = [r for r in read_collective_file(str(path), collective=collective) if r.rows]
    if len(runs) != 1:
        raise ConfigError(f"--baseline: {path}: holds {len(runs)} runs with a size table; "
                          "give a file with exactly one")
    out = {r.size_bytes: r.best_busbw() for r in runs[0].rows if r.size_bytes > 0}
    return {k: v for k, v in out.items() if v > 0}, runs[0]


def _expected_twin(fabric_spec: str, run: Any, *, gpus_per_node: int, placement: str) -> dict[int, float]:
    """The simulator's expected busbw (fabricscope.twin.collective_twin.expected_busbw)."""
    from fabricscope.model.errors import ConfigError

    try:
        from fabricscope.twin.collective_twin import expected_busbw
    except ImportError:
        raise ConfigError("--fabric: the collective twin (fabricscope.twin.collective_twin) "
                          "is not installed in this build; use --expected or --expected-busbw") from None
    if Path(fabric_spec).exists():
        from fabricscope.fabric.io import read_fabric

        fabric = read_fabric(fabric_spec)
    else:
        from fabricscope.fabric.catalog import build_fabric, parse_fabric_spec

        kind, params = parse_fabric_spec(fabric_spec, source="--fabric")
        fabric = build_fabric(kind, params, source="--fabric")
    if not run.ranks:
        raise ConfigError(f"--fabric: {run.source}: the rank count is unknown (no rank "
                          "listing, no nGpus header), cannot simulate")
    pts = expected_busbw(fabric, run.collective, run.ranks, run.sizes,
                         gpus_per_node=gpus_per_node, placement=placement)
    return {int(p.size_bytes): float(p.busbw_gbs) for p in pts}


def _plot(analyses: list[Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for a in analyses:
        xs = [s.size_bytes for s in a.sizes if s.size_bytes > 0]
        name = Path(a.source).name
        oop = [(s.size_bytes, s.oop_busbw_gbs) for s in a.sizes if s.size_bytes > 0 and s.oop_busbw_gbs is not None]
        ip = [(s.size_bytes, s.ip_busbw_gbs) for s in a.sizes if s.size_bytes > 0 and s.ip_busbw_gbs is not None]
        if oop:
            ax.plot(*zip(*oop, strict=True), marker="o", ms=3, label=f"{name} out-of-place")
        if ip:
            ax.plot(*zip(*ip, strict=True), marker="x", ms=3, ls="--", label=f"{name} in-place")
        exp = [(s.size_bytes, s.expected_busbw_gbs) for s in a.sizes
               if s.size_bytes > 0 and s.expected_busbw_gbs is not None]
        if exp and xs:
            ax.plot(*zip(*exp, strict=True), color="k", lw=1, ls=":", label=f"{name} expected")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _add_findings(db: Path, findings: list[Any], *, source: str) -> None:
    from fabricscope.diagnosis.model import Observed
    from fabricscope.store.findings import DiagnosisStore

    now = time.time_ns()
    store = DiagnosisStore(db)
    try:
        store.add_findings([Observed(source=source, finding=f, reported_ns=now) for f in findings])
    finally:
        store.close()


def register(app: typer.Typer) -> None:
    """Add the ``collective`` command group."""
    coll = typer.Typer(help=_GROUP_HELP, no_args_is_help=True)
    app.add_typer(coll, name="collective")
    from fabricscope.cli import collective_slownode  # ``collective slow-node ...``

    collective_slownode.register(coll)

    @coll.command("analyze", help=_ANALYZE_HELP,
                  short_help="Per size busbw of each run, against the expected busbw, with findings.")
    def analyze(
        files: list[Path] = typer.Argument(..., metavar="FILES", help="nccl-tests outputs or NCCL Inspector JSONL."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object per run."),
        margin: float = typer.Option(0.10, "--margin", help="A size is low when below (1 - margin) x expected."),
        expected: Path | None = typer.Option(None, "--expected", help="JSON {size_bytes: busbw_gbs}."),
        baseline: Path | None = typer.Option(None, "--baseline", help="A known-good run of the same collective and sizes: its busbw per size is the expectation."),
        expected_busbw: float | None = typer.Option(None, "--expected-busbw", help="A flat expected busbw (GB/s) for the largest sizes."),
        fabric: str | None = typer.Option(None, "--fabric", help="Fabric inventory file or KIND:KEY=VALUE spec: expected busbw from the simulator."),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="With --fabric: GPUs per node."),
        placement: str = typer.Option("in-order", "--placement", help="With --fabric: rank placement."),
        collective: str | None = typer.Option(None, "--collective", help="The collective, when the files do not name it."),
        plot: Path | None = typer.Option(None, "--plot", help="Write busbw vs size (PNG)."),
        db: Path | None = typer.Option(None, "--db", help="Add the findings to this DiagnosisStore (DuckDB)."),
    ) -> None:
        from fabricscope.collective import analyze_run, expected_from_flat, read_collective_file
        from fabricscope.collective.analysis import plateau_only
        from fabricscope.collective.model import COLLECTIVES
        from fabricscope.model.errors import ConfigError, TraceFormatError

        if not 0.0 <= margin < 1.0:
            raise ConfigError(f"--margin: {margin}: expected a fraction in [0, 1)")
        if sum(x is not None for x in (expected, expected_busbw, fabric, baseline)) > 1:
            raise ConfigError("--expected, --expected-busbw, --fabric and --baseline: give one at most")
        if expected_busbw is not None and expected_busbw <= 0:
            raise ConfigError(f"--expected-busbw: {expected_busbw}: expected a positive GB/s")
        if collective is not None and collective not in COLLECTIVES:
            raise ConfigError(f"--collective: {collective!r}: expected one of {', '.join(COLLECTIVES)}")
        if plot is not None and plot.suffix.lower() != ".png":
            raise ConfigError(f"--plot: {plot}: expected a .png file")
        exp_map = _expected_file(expected) if expected is not None else None
        base_run = None
        if baseline is not None:
            exp_map, base_run = _baseline(baseline, collective=collective)
        runs = [r for f in files for r in read_collective_file(str(f), collective=collective)]
        if not any(r.rows for r in runs):
            errs = "; ".join(e for r in runs for e in r.errors[:1]) or "no size table"
            raise TraceFormatError(f"{', '.join(map(str, files))}: no run holds a size table ({errs})")
        analyses = []
        for run in runs:
            if base_run is not None and (run.collective, run.ranks) != (base_run.collective, base_run.ranks):
                raise ConfigError(f"--baseline: {baseline}: {base_run.collective} on {base_run.ranks} ranks, "
                                  f"but {run.source} is {run.collective} on {run.ranks} ranks: "
                                  "a baseline must be the same collective at the same scale")
            if exp_map is not None:
                exp = exp_map
            elif expected_busbw is not None:
                exp = expected_from_flat(run.sizes, expected_busbw)
            elif fabric is not None and run.rows:
                exp = plateau_only(_expected_twin(fabric, run, gpus_per_node=gpus_per_node,
                                                  placement=placement), run.sizes)
            else:
                exp = None
            analyses.append(analyze_run(run, expected=exp, margin=margin))
        findings = [f for a in analyses for f in a.findings]
        if as_json:
            print(json.dumps({"runs": [a.to_json() for a in analyses]}, indent=2, default=str))
        else:
            for a in analyses:
                _print_analysis(a)
        for a in analyses:
            for w in a.warnings:
                print(f"warning: {w}", file=sys.stderr)
        if plot is not None:
            _plot(analyses, plot)
            print(f"wrote {plot}", file=sys.stderr)
        if db is not None and findings:
            _add_findings(db, findings, source="collective")
            print(f"added {len(findings)} finding(s) to {db}", file=sys.stderr)

    @coll.command("watch", help=_WATCH_HELP,
                  short_help="Run a benchmark every N minutes, detect busbw / latency changes.",
                  context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def watch(
        ctx: typer.Context,
        every: str = typer.Option("5m", "--every", help="Time between runs (5m, 30s, 1h)."),
        count: int | None = typer.Option(None, "--count", help="Stop after this many runs (default: run until interrupted)."),
        store: Path = typer.Option(Path("collective-watch.duckdb"), "--store", help="DuckDB file of the samples."),
        db: Path | None = typer.Option(None, "--db", help="Add collective-regression findings to this DiagnosisStore."),
        on_anomaly: str | None = typer.Option(None, "--on-anomaly", help="Command to run on an anomaly (e.g. 'fabricscope roce check')."),
        warmup: int = typer.Option(10, "--warmup", help="Runs that form the baseline before changes are tested."),
        timeout_s: float = typer.Option(3600.0, "--timeout", help="Seconds one benchmark run may take."),
        collective: str | None = typer.Option(None, "--collective", help="The collective, when the output does not name it."),
        subject: str | None = typer.Option(None, "--subject", help="What a finding names (a job, a host list, an inventory id; default: the command)."),
        link_checks: bool = typer.Option(True, "--link-checks/--no-link-checks", help="On an anomaly, run the RoCE link checks (as 'fabricscope roce check') and add their verdicts to the finding."),
        roce_from: Path | None = typer.Option(None, "--roce-from", help="Folder of saved tool outputs for the link checks (as 'roce check --from'), e.g. gathered from the job's hosts; default: this host, live."),
        roce_root: Path = typer.Option(Path("/"), "--roce-root", help="Root holding sys/ for live link checks (a fixture tree for tests)."),
    ) -> None:
        from fabricscope.model.errors import ConfigError

        if roce_from is not None and not roce_from.is_dir():
            raise ConfigError(f"--roce-from: {roce_from}: not a folder")
        cmd = list(ctx.args)
        if not cmd:
            raise ConfigError("watch: no benchmark command (give it after --)")
        period = parse_every(every)
        if count is not None and count < 1:
            raise ConfigError(f"--count: {count}: expected at least 1")
        if warmup < 3:
            raise ConfigError(f"--warmup: {warmup}: expected at least 3")
        _watch_loop(cmd, period=period, count=count, store_path=store, db=db,
                    on_anomaly=on_anomaly, warmup=warmup, timeout_s=timeout_s,
                    collective=collective, subject=subject,
                    link_checks=(roce_from, roce_root) if link_checks else None)


def _print_analysis(a: Any) -> None:
    print(f"{a.source}: {a.collective}, {a.ranks or '?'} ranks, {a.nodes or '?'} node(s)"
          + (" [truncated]" if a.truncated else ""))
    for e in a.errors[:5]:
        print(f"  error: {e}")
    if not a.sizes:
        return
    print(f"  {'size':>12} {'oop us':>10} {'oop busbw':>10} {'ip us':>10} {'ip busbw':>10} {'expected':>9} {'ratio':>6}")
    for s in a.sizes:
        def f(v: float | None, w: int) -> str:
            return f"{v:>{w}.2f}" if v is not None else " " * (w - 1) + "-"
        print(f"  {s.size_bytes:>12} {f(s.oop_time_us, 10)} {f(s.oop_busbw_gbs, 10)} "
              f"{f(s.ip_time_us, 10)} {f(s.ip_busbw_gbs, 10)} {f(s.expected_busbw_gbs, 9)} {f(s.ratio, 6)}")
    avg = f"{a.avg_busbw_file:g}" if a.avg_busbw_file is not None else "absent"
    rec = f"{a.avg_busbw_recomputed:.6g}" if a.avg_busbw_recomputed is not None else "-"
    print(f"  peak busbw {a.peak_busbw_gbs:.2f} GB/s at {a.peak_size_bytes} B; avg busbw (file) {avg}, "
          f"recomputed {rec}, match {a.avg_matches}")
    print(f"  attribution: {a.attribution}")
    for fd in a.findings:
        print(f"  finding {fd.kind} {fd.subject} score {fd.score:.2f}: {fd.action}")
        for ev in fd.evidence:
            print(f"    {ev}")


def _link_checks(roce_from: Path | None, root: Path, *, timeout_s: float, at_ns: int) -> tuple[list[str], list[Any]]:
    """The RoCE link checks of ``roce check`` (default expectations) as evidence lines and findings."""
    from fabricscope.roce.checks import Expectations, check_roce, findings, summarize
    from fabricscope.roce.runner import collect_live, collect_saved

    ev = collect_saved(roce_from) if roce_from is not None else collect_live(root=root, timeout_s=timeout_s)
    results = check_roce(ev, expect=Expectations())
    where = str(roce_from) if roce_from is not None else "this host"
    if not results or all(r.status == "skip" for r in results):
        why = "; ".join(w for _, w in ev.skips[:3]) or "no RDMA device or tool output"
        return [f"link checks ({where}): nothing could be checked ({why})"], []
    summ = summarize(results)
    bad = [r for r in results if r.status in ("fail", "warn")]
    lines = [f"link checks ({where}): " + ", ".join(f"{v} {k}" for k, v in summ.items() if v)]
    lines += [f"  {r.status} {r.subject} {r.name}: expected {r.expected}, seen {r.seen}" for r in bad[:6]]
    return lines, findings(results, at_ns=at_ns)


def _watch_loop(cmd: list[str], *, period: float, count: int | None, store_path: Path,
                db: Path | None, on_anomaly: str | None, warmup: int, timeout_s: float,
                collective: str | None, subject: str | None = None,
                link_checks: tuple[Path | None, Path] | None = None) -> None:
    from fabricscope.collective.analysis import summarize_run
    from fabricscope.collective.nccl_tests import parse_nccl_tests
    from fabricscope.collective.watch import Change, detect_changes
    from fabricscope.model.errors import TraceFormatError
    from fabricscope.model.records import Finding
    from fabricscope.store.collective import CollectiveWatchStore, WatchSample

    command = shlex.join(cmd)
    reported: set[tuple[str, int]] = set()
    prev_ts: int | None = None
    n = 0
    with CollectiveWatchStore(store_path) as st:
        while count is None or n < count:
            t0 = time.monotonic()
            n += 1
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
                out, rc = proc.stdout, proc.returncode
            except (OSError, subprocess.TimeoutExpired) as exc:
                out, rc = "", -1
                err0 = f"{type(exc).__name__}: {exc}"
            else:
                err0 = "" if rc == 0 else f"exit status {rc}"
            try:
                runs = parse_nccl_tests(out, source=f"run {n}", collective=collective)
            except TraceFormatError as exc:
                runs = []
                err0 = err0 or str(exc)
            run = next((r for r in reversed(runs) if r.rows), runs[-1] if runs else None)
            ts = time.time_ns()
            if run is None or not run.rows:
                err = err0 or (run.errors[0] if run and run.errors else "no size table")
                sample = WatchSample(ts, command, run.collective if run else "unknown",
                                     run.ranks if run else None, False, None, None, None, None, 0, err)
            else:
                s = summarize_run(run)
                err = err0 or (run.errors[0] if run.errors else "")
                sample = WatchSample(ts, command, run.collective, run.ranks, not err,
                                     s.avg_busbw_gbs, s.avg_time_us, s.max_time_us,
                                     s.time_std_us, s.sizes, err)
            st.add(sample)
            print(json.dumps({"run": n, "ts_ns": ts, "ok": sample.ok,
                              "avg_busbw_gbs": sample.avg_busbw_gbs, "avg_time_us": sample.avg_time_us,
                              "max_time_us": sample.max_time_us, "time_std_us": sample.time_std_us,
                              "error": sample.error}), flush=True)
            series = [x for x in st.samples(command=command) if x.ok]
            anomalies: list[tuple[str, Change | None, int, int]] = []
            for metric, want in (("avg_busbw_gbs", "down"), ("avg_time_us", "up"), ("max_time_us", "up")):
                vals = [float(getattr(x, metric)) for x in series if getattr(x, metric) is not None]
                for ch in detect_changes(vals, warmup=warmup, direction=want):
                    key = (metric, ch.onset if ch.kind == "cusum" else ch.index)
                    if ch.index == len(vals) - 1 and key not in reported:
                        reported.add(key)
                        anomalies.append((metric, ch, series[ch.index].ts_ns, series[ch.onset].ts_ns))
            if not sample.ok:
                anomalies.append(("run-failed", None, ts, ts))
            findings = []
            if anomalies:
                evidence: list[str] = []
                for metric, c, _, _ in anomalies:
                    if c is None:
                        msg = f"anomaly: run {n} failed: {sample.error}"
                        evidence.append(f"{command}: run {n}: {sample.error}")
                    else:
                        msg = (f"anomaly: {metric} {c.direction} ({c.kind}): {c.value:.4g} vs "
                               f"baseline {c.baseline:.4g} ({c.relative:+.1%})")
                        evidence.append(
                            f"{metric} {c.value:.4g} vs baseline median {c.baseline:.4g} (sigma "
                            f"{c.sigma:.3g}), {c.kind} statistic {c.statistic:.1f}, onset run "
                            f"{c.onset + 1} of the series")
                    print(msg, file=sys.stderr, flush=True)
                rel = [abs(c.relative) for _, c, _, _ in anomalies if c is not None]
                # the window is the interval since the previous run: one finding per
                # anomalous run (the store keys a finding by kind, subject and window start)
                host_findings: list[Finding] = []
                if link_checks is not None:
                    lines, host_findings = _link_checks(*link_checks, timeout_s=min(timeout_s, 60.0), at_ns=ts)
                    evidence.extend(lines)
                    for ln in lines:
                        print(ln, file=sys.stderr, flush=True)
                findings.append(Finding(
                    kind="collective-regression", subject=subject or command,
                    score=1.0 if len(rel) < len(anomalies) else min(1.0, 5 * max(rel)),
                    window=(prev_ts if prev_ts is not None else ts, ts),
                    evidence=(f"{command}: run {n}", *evidence),
                    action="run the link checks (ibstat / iblinkinfo, fabricscope roce check) "
                           "on the job's hosts",
                    details={"metrics": ",".join(m for m, _, _, _ in anomalies), "run": n}))
            prev_ts = ts
            if findings:
                if db is not None:
                    _add_findings(db, findings, source="collective-watch")
                    if host_findings:
                        _add_findings(db, host_findings, source="host")
                if on_anomaly:
                    res = subprocess.run(on_anomaly, shell=True, capture_output=True, text=True,
                                         timeout=timeout_s, check=False)
                    print(f"on-anomaly: {on_anomaly!r} exit {res.returncode}", file=sys.stderr)
                    if res.stdout:
                        print(res.stdout, end="", file=sys.stderr)
            if count is not None and n >= count:
                break
            time.sleep(max(0.0, period - (time.monotonic() - t0)))
