"""``fabricscope probe``: run the mesh probe agent on a host, analyze stored probe samples."""

from __future__ import annotations

import json
import math
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

  fabricscope topo build leaf-spine:leaves=4,hosts_per_leaf=2,spines=2 -o lab.json

  fabricscope probe twin -i lab.json --fault 'gray:spine-01:eth3->leaf-002:eth4,loss=0.05' --duration 30 --db /tmp/probes.duckdb

  fabricscope probe analyze --inventory lab.json --db /tmp/probes.duckdb

  fabricscope probe analyze -i lab.json --db /tmp/probes.duckdb --method 007 --json --top 3

One file per host (agents on live hosts, traceroute path caches from `lab trace`):
`probe analyze -i cluster.yaml --db h0.duckdb --db h1.duckdb --last 60 --paths p0.json --paths p1.json`.
"""


_TWIN_HELP = """Probe a digital twin of a fabric with faults injected, then analyze the probes.

Every NIC of the twin probes its plan (the same plan `probe agent` uses) at --rate probes/s
for --duration seconds of simulated time; the probes go to --db (table probes, as `probe
agent` writes it, so `probe analyze --db` reads it) and the analysis is printed. Without
--traced the analysis knows only each flow's candidate ECMP paths, like `probe analyze`
without --paths on live hosts; --traced gives it every flow's true path (as traceroute would).

--fault (repeatable) uses the twin's fault syntax, the same as `gnmi serve-twin --fault`:
"KIND SUBJECT [start=10s] [end=20s] [param=value ...]", or compact KIND:SUBJECT,param=value.
Probe-visible kinds: gray-loss (loss=, one direction a->b or both a|b), link-down,
link-delay (delay_ns=), congestion (load=), switch-fault (loss=), nic-fault (loss=),
cpu-starved (delay_ns=); short forms gray, delay, down, switch, nic, cpu.

Examples:

  fabricscope probe twin --topo leaf-spine:leaves=4,hosts_per_leaf=2,spines=2 --fault 'gray:spine-01:eth3->leaf-002:eth4,loss=0.05' --duration 60 --db out.duckdb

  fabricscope probe twin --topo rail-optimized:servers=16 --fault 'switch-fault spine-p0-00 loss=0.02 start=10s' --duration 30 --traced

  fabricscope topo build leaf-spine:leaves=4,hosts_per_leaf=2,spines=2 -o lab.json   # the first twin's fabric

  fabricscope probe analyze --inventory lab.json --db out.duckdb --top 3
"""


def _check_counts(*, top: int | None = None, last: float | None = None,
                  duration: float | None = None, rate: float | None = None) -> None:
    """Counts and durations from the command line: one line naming the option on a bad value."""
    from fabricscope.model.errors import ConfigError

    if top is not None and top < 1:
        raise ConfigError(f"--top must be a count >= 1, got {top}")
    if last is not None and not last >= 0:
        raise ConfigError(f"--last must be seconds >= 0 (0: all), got {last:g}")
    if duration is not None and not 0 < duration <= 3600:
        raise ConfigError(f"--duration must be seconds in (0, 3600], got {duration:g}")
    if rate is not None and not 0 < rate <= 100_000:
        raise ConfigError(f"--rate must be probes/s in (0, 100000], got {rate:g}")


def _finite(obj: object) -> object:
    """``obj`` with every non-finite float replaced by None (for strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _print_findings(findings: list, n_probes: int, *, method: str, as_json: bool,  # type: ignore[type-arg]
                    top: int | None, traced: bool) -> None:
    """The findings as a table (or JSON); an ambiguous finding names its candidate set, what
    the members share and what would separate them."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    shown = findings[:top] if top is not None else findings
    if as_json:
        # Strict JSON: a loss that could not be estimated is null, never NaN.
        typer.echo(json.dumps([_finite({"kind": f.kind, "subject": f.subject, "score": f.score,
                                        "window": list(f.window), "evidence": list(f.evidence),
                                        "action": f.action, "details": dict(f.details)})
                               for f in shown], indent=1, allow_nan=False))
        return
    more = f", {len(shown)} shown" if len(shown) < len(findings) else ""
    t = Table(title=f"{n_probes} probes, {len(findings)} findings{more} ({method}, "
                    f"{'traced paths' if traced else 'candidate ECMP paths: no --paths'})")
    t.add_column("kind", no_wrap=True)
    t.add_column("subject", no_wrap=True)  # a link id is copied whole, never folded
    t.add_column("loss / delay", no_wrap=True)
    t.add_column("confidence" if method == "map" else "vote share", no_wrap=True)
    t.add_column("evidence (lossiest probe flows)", overflow="fold")
    notes = []
    for f in shown:
        d = f.details
        est = (f"{float(d['loss']) * 100:.2f}% loss" if "loss" in d and d.get("method") == "map"
               else f"{float(d['strength']):.1f} votes" if d.get("method") == "007"
               else f"+{float(d.get('added_delay_ns', 0)) / 1e3:.0f} us" if "added_delay_ns" in d else "")
        subject, conf = f.subject, f"{f.score:.3f}"
        if "candidates" in d:
            members = f.subject.split(" | ")
            subject = "\n".join([f"{d.get('common', 'one of')}:", *members[:6],
                                 *([f"... {len(members) - 6} more"] if len(members) > 6 else [])])
            conf = f"{f.score:.3f} for the set"
            notes.append(f"{d['candidates']} candidates cannot be told apart (posterior "
                         f"{d.get('posterior', '?')}); {f.action}")
        ev = [e for e in f.evidence if not e.startswith("ambiguous:")][:3]
        t.add_row(escape(f.kind), escape(subject), est, conf, escape("\n".join(ev)))
    console = Console()
    if not console.is_terminal:  # piped: whole rows, not a table squeezed to 80 columns
        console = Console(width=200)
    console.print(t)
    for n in notes:
        typer.echo(n)


def register(app: typer.Typer) -> None:
    """Add the ``probe`` command group (``agent``, ``analyze``)."""
    grp = typer.Typer(
        help="Mesh probing: probe every ECMP path and localize gray links, NIC/switch faults.\n\n"
        "Examples:\n\n"
        "  fabricscope topo build leaf-spine:leaves=4,hosts_per_leaf=2,spines=2 -o lab.json\n\n"
        "  fabricscope probe twin -i lab.json --fault 'gray:spine-01:eth3->leaf-002:eth4,loss=0.05' --duration 30 --db p.duckdb\n\n"
        "  fabricscope probe analyze --inventory lab.json --db p.duckdb\n\n"
        "On a host of the fleet: `fabricscope probe agent --inventory cluster.yaml --self host0003 "
        "--db p.duckdb` (see `probe agent --help`).",
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
        nats: str | None = typer.Option(None, "--nats", help="also publish every sample to this NATS JetStream "
                                        "(fs.probes.<NIC>) for `fabricscope worker --role probes`"),
        nats_user: str | None = typer.Option(None, "--nats-user", help="NATS user name"),
        nats_password_env: str | None = typer.Option(None, "--nats-password-env",
                                                     help="environment variable with the NATS password"),
        nats_token_env: str | None = typer.Option(None, "--nats-token-env",
                                                  help="environment variable with a NATS token"),
        nats_creds: Path | None = typer.Option(None, "--nats-creds", help="NATS credentials file (JWT + nkey)"),
        nats_tls_ca: Path | None = typer.Option(None, "--nats-tls-ca", help="CA of the NATS server certificate"),
        nats_tls_cert: Path | None = typer.Option(None, "--nats-tls-cert", help="client certificate for NATS"),
        nats_tls_key: Path | None = typer.Option(None, "--nats-tls-key", help="client key for NATS"),
    ) -> None:
        import asyncio
        import signal
        import sys

        from fabricscope.fabric.io import read_fabric
        from fabricscope.model.errors import ConfigError
        from fabricscope.service.probe_live import run_agent

        if db is None and jsonl is None and nats is None:
            raise ConfigError("probe agent: give --db FILE, --jsonl FILE and/or --nats URL for the samples")
        bus = None
        if nats is not None:
            from fabricscope.cli._nats import bus_config

            bus = bus_config(nats, client_name=f"fabricscope-probe-{self_id}", prefix="--nats-", user=nats_user,
                             password_env=nats_password_env, token_env=nats_token_env, creds=nats_creds,
                             tls_ca=nats_tls_ca, tls_cert=nats_tls_cert, tls_key=nats_tls_key)
        if rate <= 0:
            raise ConfigError(f"probe agent: --rate must be > 0, got {rate}")
        if shutdown_timeout < 0 or stats_interval < 0:
            raise ConfigError("probe agent: --shutdown-timeout and --stats-interval must be >= 0")
        fabric = read_fabric(inventory)
        try:
            snap = asyncio.run(run_agent(fabric, self_id, seed=seed, rate_pps=rate, duration_s=duration,
                                         epoch_s=epoch, db=db, jsonl=jsonl, bus=bus,
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
        top: int | None = typer.Option(None, "--top", help="print only the N strongest findings (N >= 1)"),
    ) -> None:
        from fabricscope.fabric.io import read_fabric
        from fabricscope.model.errors import ConfigError
        from fabricscope.probe.analysis import (
            check_inputs,
            common_window,
            observations_from_samples,
        )
        from fabricscope.service.probe_live import analyze_observations, read_paths
        from fabricscope.store.probes import ProbeStore, read_jsonl

        if not db and not jsonl:
            raise ConfigError("probe analyze: give --db FILE or --jsonl FILE")
        if method not in ("map", "007"):
            raise ConfigError(f"probe analyze: --method must be map or 007, got {method!r}")
        _check_counts(top=top, last=last)
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
        source = "probe analyze: " + " ".join([*(f"--db {x}" for x in db), *(f"--jsonl {x}" for x in jsonl)])
        check_inputs(fabric, obs, source=source)  # no data, or another fabric's: exit 2
        if len(obs) and steady:  # also trims agent start-up (ARP) transients of a single prober
            n_all = len(obs)
            obs = obs.window(*common_window(obs, margin_ns=2_000_000_000))
            if len(obs) < n_all and not as_json:  # --json output stays pure JSON
                typer.secho(f"steady window: {len(obs)} of {n_all} probes (all agents running, 2 s margins; "
                            "--no-steady keeps all)", err=True, fg=typer.colors.YELLOW)
        if len(obs) and last > 0:
            t1 = int(obs.t_send_ns.max())
            obs = obs.window(t1 - int(last * 1e9), t1 + 1)
        if len(obs) == 0:
            raise ConfigError(f"{source}: no probes left after --last {last:g} / the steady window "
                              "(expected probes from agents running at the same time; try --no-steady)")
        known: dict[tuple[str, str, int, int], tuple[int, ...]] = {}
        for pth in paths:
            known.update(read_paths(pth, fabric))
        findings = analyze_observations(fabric, obs, method=method, paths=known or None)
        _print_findings(findings, n_probes=len(obs), method=method, as_json=as_json, top=top,
                        traced=bool(known))

    @grp.command("twin", help=_TWIN_HELP)
    def twin_cmd(
        topo: str = typer.Option("leaf-spine:leaves=4,hosts_per_leaf=2,spines=2", "--topo",
                                 help="KIND[:KEY=VALUE,...] fabric builder (see `fabricscope topo`)"),
        inventory: Path | None = typer.Option(None, "--inventory", "-i", help="inventory YAML/JSON instead of --topo"),
        fault: list[str] = typer.Option([], "--fault", help="'KIND SUBJECT [start=..] [end=..] [k=v ...]' (repeatable)"),
        duration: float = typer.Option(30.0, help="seconds of probing (simulated time)"),
        rate: float = typer.Option(100.0, help="probes per second per NIC"),
        seed: int = typer.Option(0, help="seed of the plan, the transport and the loss draws"),
        db: Path | None = typer.Option(None, help="DuckDB file to write the probes to (table probes)"),
        traced: bool = typer.Option(False, help="analyze with every flow's true path (as traced)"),
        method: str = typer.Option("map", help="map (default) or 007"),
        top: int | None = typer.Option(None, "--top", help="print only the N strongest findings (N >= 1)"),
        as_json: bool = typer.Option(False, "--json", help="print findings as JSON"),
    ) -> None:
        from fabricscope.fabric.catalog import build_fabric, parse_params
        from fabricscope.fabric.io import read_fabric
        from fabricscope.model.errors import ConfigError
        from fabricscope.service.probe_live import analyze_observations
        from fabricscope.service.probe_twin import parse_probe_fault, run_twin, traced_paths

        _check_counts(top=top, duration=duration, rate=rate)
        if method not in ("map", "007"):
            raise ConfigError(f"probe twin: --method must be map or 007, got {method!r}")
        if inventory is not None:
            fabric = read_fabric(inventory)
        else:
            kind, _, rest = topo.partition(":")
            if not kind:
                raise ConfigError(f"--topo: expected KIND[:KEY=VALUE,...], got {topo!r}")
            params = parse_params([x for x in rest.split(",") if x], source="--topo") if rest else {}
            fabric = build_fabric(kind, params, source="--topo")
        faults = [parse_probe_fault(x, fabric) for x in fault]
        if db is not None and db.exists():
            raise ConfigError(f"probe twin: --db {db}: exists (give a new file; `probe analyze --db` reads it)")
        run = run_twin(fabric, faults, duration_s=duration, seed=seed, rate_pps=rate,
                       db=str(db) if db is not None else None)
        if not as_json:
            injected = "; ".join(f"{x.kind} {x.subject} {dict(x.params)}" for x in faults) or "no fault"
            typer.echo(f"twin {fabric.name}: {len(fabric.nics)} NICs, {len(run.mesh.flows)} probe flows, "
                       f"{len(run.obs)} probes in {duration:g} s; injected: {injected}"
                       + (f"; probes in {db}" if db is not None else ""))
        findings = analyze_observations(fabric, run.obs, method=method,
                                        paths=traced_paths(run) if traced else None)
        _print_findings(findings, n_probes=len(run.obs), method=method, as_json=as_json, top=top,
                        traced=traced)
