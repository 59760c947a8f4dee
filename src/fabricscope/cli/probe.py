"""``fabricscope probe``: run the mesh probe agent on a host, analyze stored probe samples."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_AGENT_HELP = """Run the probe responder and prober for one host (or NIC) of the inventory.

Every agent derives the same plan from the inventory and --seed (no controller): the NICs
under its leaf, the same rail on other leaves, a rotating cross-pod sample, with enough UDP
source ports per peer to cover every ECMP path with 99% probability; re-drawn every epoch.
The responder listens on UDP 47910 of each NIC address. Samples go to DuckDB and/or JSON lines:
one --db file per agent (DuckDB has one writer per file); `probe analyze --db A --db B` merges them.
Every --stats-interval seconds a self-metrics line goes to stderr (probes sent, answered,
lost, stored, send errors, kernel receive-buffer drops, packets rejected per reason); the
final counters are one JSON line on stdout. SIGINT / SIGTERM stop sending, wait up to
--shutdown-timeout for replies in flight, store every probe sent (the rest as lost) and exit
130 / 143; a second signal cuts the wait short. A second agent on the same address fails
to bind (exit 2) instead of sharing the port.

On a real host: `fabricscope probe agent -i cluster.yaml --self host0042 --db /var/lib/fs/p.duckdb`.
In a lab (root), each agent runs inside its host's namespace:

Examples:

  fabricscope lab up --prefix ag --leaves 2 --spines 1 --hosts-per-leaf 1

  ip netns exec aghost0000 fabricscope probe agent -i /tmp/fabricscope-lab-ag/inventory.json --self host0000 --jsonl /tmp/h0.jsonl --duration 10 --stats-interval 2

  fabricscope lab down --prefix ag
"""

_ANALYZE_HELP = """Localize lossy links, switches, NICs and CPU-starved hosts from stored probes.

Reads samples from --db (DuckDB files written by `probe agent`, one per host) or --jsonl
(both repeatable), and prints findings,
strongest first: kind, subject (directed link a:ethX->b:ethY, switch, NIC or host), estimated
loss, confidence and evidence. --method map (default: sparse MAP over link/device loss
rates) or 007 (vote baseline, Arzani et al. NSDI'18). --paths: traceroute path cache (JSON);
without it each flow's candidate ECMP path set is used.

Examples:

  fabricscope probe analyze --inventory lab.json --db /tmp/probes.duckdb

  fabricscope probe analyze -i lab.json --jsonl p.jsonl --method 007 --json

  fabricscope probe analyze -i lab.json --db h0.duckdb --db h1.duckdb --last 60 --paths p0.json --paths p1.json
"""


def register(app: typer.Typer) -> None:
    """Add the ``probe`` command group (``agent``, ``analyze``)."""
    grp = typer.Typer(
        help="Mesh probing: probe every ECMP path and localize gray links, NIC/switch faults.\n\n"
        "Examples:\n\n  fabricscope probe agent --inventory lab.json --self host0003 --db p.duckdb\n\n"
        "  fabricscope probe analyze --inventory lab.json --db p.duckdb",
        no_args_is_help=True,
    )
    app.add_typer(grp, name="probe")

    @grp.command("agent", help=_AGENT_HELP)
    def agent_cmd(
        inventory: Path = typer.Option(..., "--inventory", "-i", help="inventory YAML/JSON"),
        self_id: str = typer.Option(..., "--self", help="this host (all its NICs) or one NIC id"),
        seed: int = typer.Option(0, help="shared plan seed (same on every agent)"),
        rate: float = typer.Option(100.0, help="probes per second per NIC"),
        duration: float = typer.Option(0.0, help="seconds to run (0: until interrupted)"),
        epoch: float = typer.Option(30.0, help="seconds between plan re-draws"),
        db: Path | None = typer.Option(None, help="DuckDB file to append samples to"),
        jsonl: Path | None = typer.Option(None, help="JSON lines file to append samples to"),
        stats_interval: float = typer.Option(10.0, "--stats-interval",
                                             help="seconds between self-metrics log lines on stderr (0: off)"),
        shutdown_timeout: float = typer.Option(5.0, "--shutdown-timeout",
                                               help="on SIGINT/SIGTERM, the longest wait for replies in flight (s)"),
    ) -> None:
        import asyncio
        import signal
        import sys

        from fabricscope.fabric.io import read_fabric
        from fabricscope.model.errors import ConfigError
        from fabricscope.service.probe_live import run_agent

        if db is None and jsonl is None:
            raise ConfigError("probe agent: give --db FILE and/or --jsonl FILE for the samples")
        if rate <= 0:
            raise ConfigError(f"probe agent: --rate must be > 0, got {rate}")
        if shutdown_timeout < 0 or stats_interval < 0:
            raise ConfigError("probe agent: --shutdown-timeout and --stats-interval must be >= 0")
        fabric = read_fabric(inventory)
        try:
            snap = asyncio.run(run_agent(fabric, self_id, seed=seed, rate_pps=rate, duration_s=duration,
                                         epoch_s=epoch, db=db, jsonl=jsonl,
                                         log=lambda m: typer.echo(m, err=True),
                                         stats_every_s=stats_interval, shutdown_timeout_s=shutdown_timeout,
                                         handle_signals=True))
        except KeyboardInterrupt:  # Ctrl-C before the agent's own handler was installed: nothing sent yet
            typer.echo("probe agent: interrupted before start", err=True)
            sys.exit(130)
        typer.echo(json.dumps(snap.as_dict()))
        if snap.stopped_by is not None:  # 130 / 143: stopped by SIGINT / SIGTERM, all samples kept
            sys.exit(128 + int(signal.Signals[snap.stopped_by]))

    @grp.command("analyze", help=_ANALYZE_HELP)
    def analyze_cmd(
        inventory: Path = typer.Option(..., "--inventory", "-i", help="inventory YAML/JSON"),
        db: list[Path] = typer.Option([], help="DuckDB file written by `probe agent` (repeatable: one per host)"),
        jsonl: list[Path] = typer.Option([], help="JSON lines sample files (repeatable)"),
        method: str = typer.Option("map", help="map (default) or 007"),
        last: float = typer.Option(0.0, help="only the last N seconds of samples (0: all)"),
        paths: list[Path] = typer.Option([], help="traceroute path cache (JSON, `lab trace`; repeatable: one per host)"),
        steady: bool = typer.Option(True, help="only the window in which every prober was running "
                                    "(agents starting/stopping at different times look like loss)"),
        as_json: bool = typer.Option(False, "--json", help="print findings as JSON"),
    ) -> None:
        from rich.console import Console
        from rich.table import Table

        from fabricscope.fabric.io import read_fabric
        from fabricscope.model.errors import ConfigError
        from fabricscope.probe.analysis import common_window, observations_from_samples
        from fabricscope.service.probe_live import analyze_observations, read_paths
        from fabricscope.store.probes import ProbeStore, read_jsonl

        if not db and not jsonl:
            raise ConfigError("probe analyze: give --db FILE or --jsonl FILE")
        if method not in ("map", "007"):
            raise ConfigError(f"probe analyze: --method must be map or 007, got {method!r}")
        fabric = read_fabric(inventory)
        if db:
            for dbf in db:
                if not dbf.is_file():
                    raise ConfigError(f"probe analyze: --db {dbf}: no such file")
            store = ProbeStore.merged(db)
            obs = store.observations()
            store.close()
        else:
            errors: list[str] = []
            rows = [r for p in jsonl for r in read_jsonl(p, errors=errors)]
            for e in errors[:10]:
                typer.secho(f"skipped {e}", err=True, fg=typer.colors.YELLOW)
            obs = observations_from_samples([s for s, _ in rows], [st for _, st in rows])
        if len(obs) and steady:  # also trims agent start-up (ARP) transients of a single prober
            n_all = len(obs)
            obs = obs.window(*common_window(obs, margin_ns=2_000_000_000))
            if len(obs) < n_all and not as_json:  # --json output stays pure JSON
                typer.secho(f"steady window: {len(obs)} of {n_all} probes (all agents running, 2 s margins; "
                            "--no-steady keeps all)", err=True, fg=typer.colors.YELLOW)
        if len(obs) and last > 0:
            t1 = int(obs.t_send_ns.max())
            obs = obs.window(t1 - int(last * 1e9), t1 + 1)
        known: dict[tuple[str, str, int, int], tuple[int, ...]] = {}
        for pth in paths:
            known.update(read_paths(pth, fabric))
        findings = analyze_observations(fabric, obs, method=method, paths=known or None)
        if as_json:
            typer.echo(json.dumps([{"kind": f.kind, "subject": f.subject, "score": f.score,
                                    "window": list(f.window), "evidence": list(f.evidence),
                                    "action": f.action, "details": dict(f.details)}
                                   for f in findings], indent=1))
            return
        t = Table(title=f"{len(obs)} probes, {len(findings)} findings ({method})")
        t.add_column("kind", no_wrap=True)
        t.add_column("subject", overflow="fold", min_width=20)
        t.add_column("loss / delay", no_wrap=True)
        t.add_column("confidence" if method == "map" else "vote share", no_wrap=True)
        t.add_column("evidence (lossiest probe flows)", overflow="fold")
        for f in findings:
            d = f.details
            est = (f"{float(d['loss']) * 100:.2f}% loss" if "loss" in d and d.get("method") == "map"
                   else f"{float(d['strength']):.1f} votes" if d.get("method") == "007"
                   else f"+{float(d.get('added_delay_ns', 0)) / 1e3:.0f} us" if "added_delay_ns" in d else "")
            t.add_row(f.kind, f.subject, est, f"{f.score:.3f}", "\n".join(f.evidence[:3]))
        Console().print(t)
