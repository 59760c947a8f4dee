"""``fabricscope preflight``: check a host's kernel, CPU and NIC tuning; fix what is reversible."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer

_HELP = """Check this host (or a /proc + /sys tree under --root) against a training or inference profile: sysctls, transparent huge pages, CPU governor, NUMA balancing, zone_reclaim, irqbalance, NIC IRQ affinity against the NIC's NUMA node, ring sizes (ethtool -g), MTU, link speed, huge pages, firmware, IOMMU.

Each check prints the current and recommended value, why, and the exact command that fixes it. Nothing changes unless --fix is given and confirmed (or --yes); --fix applies only reversible settings (sysctl, THP, governor, IRQ affinity, ring sizes) and first writes an undo script with every previous value. No root needed to check.

Exit codes: 0 nothing failed (warn / skip allowed), 1 a check failed (0 with --exit-zero, for collecting every host's --json in a loop), 2 no data or bad input.

Examples:

  fabricscope preflight --root tests/data/preflight/tuned

  fabricscope preflight --root tests/data/preflight/tuned --profile inference --json

  fabricscope preflight --root tests/data/preflight/untuned --exit-zero

  fabricscope preflight --root tests/data/preflight/untuned --fix --dry-run --exit-zero

  fabricscope preflight fleet tests/data/preflight/fleet/*.json --exit-zero
"""

_FLEET_HELP = """Summarize many hosts' `preflight --json` reports: per check how many hosts pass / warn / fail, the majority value, and the hosts that differ from it (firmware, governor, ring sizes...). With no strict majority (a tie) a check says so instead of naming one.

Exit codes: 0 no host failed a check, 1 some host did (0 with --exit-zero), 2 bad input.

Examples:

  fabricscope preflight fleet tests/data/preflight/fleet/*.json --exit-zero

  fabricscope preflight fleet tests/data/preflight/fleet/gpu-train-07.json tests/data/preflight/fleet/gpu-train-08.json --json
"""

_MARK = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip", "unknown": "??"}


def _print_results(host: str, profile: str, root: str, elapsed: float,
                   results: list[Any], *, verbose: bool) -> None:
    from fabricscope.preflight import summarize

    typer.echo(f"{host}: profile {profile}, root {root}, {elapsed:.2f} s")
    for r in results:
        if r.status == "pass" and not verbose:
            continue
        line = f"  {_MARK[r.status]:<5} {r.check:<36} {r.subject:<22} current {r.current or '-'}"
        typer.echo(line + (f"  recommended {r.recommended}" if r.status != "skip" else ""))
        if r.fix:
            typer.echo(f"        fix: {r.fix}")
        if r.status in ("warn", "fail") and r.why:
            typer.echo(f"        why: {r.why} [{r.source}]")
        if r.reason and r.status != "pass":
            typer.echo(f"        note: {r.reason}")
    s = summarize(results)
    typer.echo("summary: " + ", ".join(f"{n} {k}" for k, n in s.items()))


def _fix(results: list[Any], *, host: str, root: str, yes: bool, dry_run: bool,
         undo_script: Path | None, as_json: bool) -> dict[str, Any]:
    from fabricscope.preflight.fix import apply_fixes, plan_fixes

    plan = plan_fixes(results, allow_commands=str(Path(root)) == "/")
    def out(message: str) -> None:
        typer.echo(message, err=as_json)  # with --json, stdout holds only the JSON

    for r, acts in plan.apply:
        for a in acts:
            what = " ".join(a.command) if a.command else f"/{a.path}: {a.previous!r} -> {a.value!r}"
            out(f"  change {r.check} ({r.subject}): {what}")
    for r, why in plan.refused:
        out(f"  refuse {r.check} ({r.subject}): {why}")
    if any(r.check == "irqbalance" for r, _ in plan.refused) and any(
            r.check == "nic.irq_affinity" for r, _ in plan.apply):
        out("  note: irqbalance is running and will rewrite the IRQ affinity set here; "
            "stop it first (systemctl disable --now irqbalance)")
    info: dict[str, Any] = {"planned": len(plan.actions), "refused": len(plan.refused),
                            "applied": 0, "undo_script": None}
    if dry_run or not plan.actions:
        out("dry run: nothing changed" if dry_run else "nothing reversible to fix")
        return info
    if not yes and not typer.confirm(f"Apply {len(plan.actions)} change(s) under {root}?",
                                     default=False, err=True):
        out("nothing changed")
        return info
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = undo_script or Path(f"preflight-undo-{host}-{stamp}.sh")
    info["applied"] = apply_fixes(plan, root=root, undo_path=path, hostname=host,
                                  written_at=stamp + "Z")
    info["undo_script"] = str(path)
    out(f"applied {info['applied']} change(s); undo with: sh {path}")
    return info


def _add_to_db(db: Path, results: list[Any], host: str) -> int:

    from fabricscope.diagnosis.model import Observed
    from fabricscope.preflight import findings
    from fabricscope.store.findings import DiagnosisStore

    now = time.time_ns()
    # finding_id adds details' check and target (host/IF) to its key: one finding per fail
    obs = [Observed(source="host", finding=f, reported_ns=now)
           for f in findings(results, hostname=host, now_ns=now)]
    with DiagnosisStore(db) as store:
        return store.add_findings(obs)


def register(app: typer.Typer) -> None:
    """Add the ``preflight`` command (and ``preflight fleet``)."""
    pre = typer.Typer(help=_HELP, invoke_without_command=True, no_args_is_help=False)
    app.add_typer(pre, name="preflight")

    @pre.callback(invoke_without_command=True, help=_HELP)
    def preflight(
        ctx: typer.Context,
        profile: str = typer.Option("training", "--profile", help="training, inference, or a YAML file overriding / adding checks."),
        root: str = typer.Option("/", "--root", help="Host root holding proc/ and sys/ (a fixture tree for tests)."),
        nic: list[str] = typer.Option([], "--nic", help="Check only this interface (repeatable; default: every NIC with a device)."),
        as_json: bool = typer.Option(False, "--json", help="Print the host report as JSON (what `preflight fleet` reads)."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Also list the checks that pass."),
        fix: bool = typer.Option(False, "--fix", help="Apply the reversible fixes after confirmation; writes an undo script first."),
        yes: bool = typer.Option(False, "--yes", "-y", help="With --fix: do not ask for confirmation."),
        dry_run: bool = typer.Option(False, "--dry-run", help="With --fix: print what would change, change nothing."),
        undo: Path | None = typer.Option(None, "--undo-script", help="With --fix: where to write the undo script (default ./preflight-undo-HOST-TIME.sh)."),
        db: Path | None = typer.Option(None, "--db", help="Add each failed check as a host-misconfig finding to this DuckDB diagnosis store."),
        exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when a check fails (2 still means no data / bad input)."),
    ) -> None:
        if ctx.invoked_subcommand is not None:
            return
        from fabricscope.model.errors import ConfigError
        from fabricscope.preflight import exit_code, load_profile, report_json, run_preflight

        if (yes or dry_run or undo is not None) and not fix:
            raise ConfigError("--yes / --dry-run / --undo-script: only with --fix")
        prof = load_profile(profile)
        facts, results, elapsed = run_preflight(prof, root=root, nics=nic)
        if as_json:
            rep = report_json(facts, results, profile=prof.name, elapsed_s=elapsed)
        else:
            _print_results(facts.hostname, prof.name, root, elapsed, results, verbose=verbose)
        code = exit_code(results)
        if fix:
            info = _fix(results, host=facts.hostname, root=root, yes=yes, dry_run=dry_run,
                        undo_script=undo, as_json=as_json)
            if info["applied"]:
                facts, results, elapsed = run_preflight(prof, root=root, nics=nic)
                code = exit_code(results)
                if as_json:
                    rep = report_json(facts, results, profile=prof.name, elapsed_s=elapsed)
                else:
                    typer.echo("after the fix:")
                    _print_results(facts.hostname, prof.name, root, elapsed, results,
                                   verbose=False)
            if as_json:
                rep["fix"] = info
        if as_json:
            typer.echo(json.dumps(rep, indent=1))
        if db is not None:
            n = _add_to_db(db, results, facts.hostname)
            print(f"added {n} host-misconfig finding(s) to {db}", file=sys.stderr)
        if code == 2:
            print("preflight: no check had data (every check skipped or unknown)",
                  file=sys.stderr)
        raise typer.Exit(0 if code == 1 and exit_zero else code)

    @pre.command("fleet", help=_FLEET_HELP)
    def fleet(
        reports: list[Path] = typer.Argument(..., metavar="HOSTS_JSON", help="`preflight --json` outputs, one host each (or a list)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when some host fails a check."),
    ) -> None:
        from fabricscope.preflight.fleet import differing_hosts, read_reports, summarize_fleet

        reps = read_reports(reports)
        summary = summarize_fleet(reps)
        odd = differing_hosts(summary)
        failed = any(s.failing for s in summary) and not exit_zero
        if as_json:
            typer.echo(json.dumps({"hosts": len(reps), "checks": [s.to_json() for s in summary],
                                   "differing_hosts": odd}, indent=1))
            raise typer.Exit(1 if failed else 0)
        typer.echo(f"{len(reps)} hosts")
        for s in summary:
            counts = " ".join(f"{k}={v}" for k, v in s.status_counts.items())
            subj = f" [{s.subject}]" if s.subject else ""
            maj = (f"majority {s.majority!r} ({s.majority_hosts})" if s.majority is not None
                   else "no majority (tie)")
            typer.echo(f"  {s.check}{subj}: {counts}; {maj}")
            if s.failing:
                typer.echo(f"      failing: {', '.join(s.failing)}")
            for h, v in s.outliers.items():
                typer.echo(f"      differs: {h} = {v!r}")
        if odd:
            typer.echo("hosts that differ from the fleet majority:")
            for h, checks in odd.items():
                typer.echo(f"  {h}: {', '.join(checks)}")
        raise typer.Exit(1 if failed else 0)
