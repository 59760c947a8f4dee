"""``fabricscope worker``: an analysis worker on the NATS bus (durable consumer -> detectors -> findings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

_HELP = """Run the detectors on the telemetry the cluster collectors publish to NATS JetStream.

Workers that share --durable share the work (a JetStream durable pull consumer); a restarted
worker resumes at the acknowledged position. Each batch is de-duplicated by (target, path,
tags, timestamp), run through the detectors, and acknowledged only after its findings were
published to fs.findings.<kind>. Findings print as they are found; --db adds them to a
DiagnosisStore. SIGINT/SIGTERM finish the batch in hand, acknowledge it and exit 130/143
within --deadline seconds. Loopback by default; --user with --password-env, --token-env or
--creds authenticate, --tls-ca (and --tls-cert/--tls-key) use TLS.

With --role probes it consumes the samples `probe agent --nats` publishes (fs.probes.>),
keeps them in --probe-db (acknowledged once stored: a restart on the same file loses
nothing) and every --window seconds of sample time runs the localization of `probe analyze`,
publishing the findings to fs.findings.<kind>. With --role incidents it correlates every
finding on fs.findings.> over the inventory (the console's correlator and specialists) and
publishes each incident that opens, changes or closes to fs.incidents.<id> (and --db); its
state is rebuilt from the findings stream at start, so run one per fabric.

Examples:

  fabricscope worker --nats nats://127.0.0.1:4222

  fabricscope worker --role probes --nats nats://127.0.0.1:4222 -i cluster.yaml --probe-db probes.duckdb

  fabricscope worker --role incidents --nats nats://127.0.0.1:4222 -i cluster.yaml --db incidents.duckdb

  fabricscope worker --nats nats://127.0.0.1:4222 --durable fs-detectors --duration 60 --json-stats

  FABRICSCOPE_NATS_PASSWORD=s3cret fabricscope worker --nats tls://bus:4222 --tls-ca ca.pem \\
      --user fabricscope --password-env FABRICSCOPE_NATS_PASSWORD --db findings.duckdb
"""


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command."""

    @app.command("worker", help=_HELP)
    def worker_cmd(
        nats_url: str = typer.Option("nats://127.0.0.1:4222", "--nats", help="NATS URL (nats:// or tls://)."),
        role: str = typer.Option("detectors", "--role", help="detectors: the telemetry detectors on fs.telemetry.>; "
                                 "probes: probe localization per window on fs.probes.> (needs --inventory, "
                                 "--probe-db); incidents: the correlation and diagnosis of fs.findings.> into "
                                 "incidents on fs.incidents.<id> (needs --inventory; run one per fabric)."),
        durable: str | None = typer.Option(None, "--durable", help="Durable consumer name (shared = shared work); "
                                           "default fs-detectors / fs-probes by --role."),
        duration: float | None = typer.Option(None, "--duration", help="Stop after this many seconds."),
        db: Path | None = typer.Option(None, "--db", help="Add the findings to this DiagnosisStore (DuckDB)."),
        json_stats: bool = typer.Option(False, "--json-stats", help="Print the final counters as one JSON line."),
        user: str | None = typer.Option(None, "--user", help="NATS user name."),
        password_env: str | None = typer.Option(None, "--password-env", help="Environment variable with the password."),
        token_env: str | None = typer.Option(None, "--token-env", help="Environment variable with a NATS token."),
        creds: Path | None = typer.Option(None, "--creds", help="NATS credentials file (JWT + nkey)."),
        tls_ca: Path | None = typer.Option(None, "--tls-ca", help="CA that signed the server certificate."),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Client certificate (with --tls-key)."),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="Client key."),
        deadline: float = typer.Option(5.0, "--deadline", help="Seconds a stop may take to drain and ack."),
        inventory: Path | None = typer.Option(None, "--inventory", "-i", help="--role probes: the fabric inventory."),
        probe_db: Path | None = typer.Option(None, "--probe-db", help="--role probes: the ProbeStore (DuckDB) file "
                                             "the samples are kept in; a restart on it loses nothing."),
        window: float = typer.Option(30.0, "--window", help="--role probes: seconds of sample time per analysis."),
        lateness: float = typer.Option(5.0, "--lateness", help="--role probes: analyse a window once samples this "
                                       "many seconds past its end arrived."),
        retain: float = typer.Option(600.0, "--retain", help="--role probes: seconds of samples kept in --probe-db."),
        method: str = typer.Option("map", "--method", help="--role probes: map (default) or 007."),
        metrics_file: Path | None = typer.Option(None, "--metrics-file", help="Write the worker's counters (batches, "
                                                 "events, duplicates, findings, lag, ack-pending) to this Prometheus "
                                                 "textfile every second (node_exporter's textfile collector exports "
                                                 "it; name it *.prom)."),
        stats_interval: float = typer.Option(30.0, "--stats-interval", help="Seconds between stats lines on "
                                             "stderr (lag included; 0: none)."),
        tap: Path | None = typer.Option(None, "--tap", help="Append every new (de-duplicated) event to this file "
                                        "as JSON lines (debugging; grows without bound)."),
    ) -> None:
        import asyncio
        import logging
        import signal
        import sys
        import time

        from fabricscope.cli._nats import bus_config
        from fabricscope.cluster.worker import Worker, WorkerStats
        from fabricscope.diagnosis.model import Incident
        from fabricscope.model.errors import ConfigError
        from fabricscope.model.records import Finding, TelemetryEvent
        from fabricscope.telemetry.detectors import DetectorSet, default_detectors

        if role not in ("detectors", "probes", "incidents"):
            raise ConfigError(f"--role: expected detectors, probes or incidents, got {role!r}")
        if role == "incidents" and inventory is None:
            raise ConfigError("--role incidents: give --inventory FILE")
        if role == "probes" and (inventory is None or probe_db is None):
            raise ConfigError("--role probes: give --inventory FILE and --probe-db FILE")
        if role == "detectors" and (inventory is not None or probe_db is not None):
            raise ConfigError("--inventory / --probe-db: only with --role probes or incidents")
        if role == "incidents" and probe_db is not None:
            raise ConfigError("--probe-db: only with --role probes")
        durable = durable or {"probes": "fs-probes", "incidents": "fs-incidents"}.get(role, "fs-detectors")
        if duration is not None and not (math.isfinite(duration) and duration > 0):
            raise ConfigError(f"--duration: expected a number of seconds > 0, got {duration:g}")
        if not (math.isfinite(stats_interval) and stats_interval >= 0):
            raise ConfigError(f"--stats-interval: expected a number of seconds >= 0, got {stats_interval:g}")
        if metrics_file is not None and not metrics_file.parent.is_dir():
            raise ConfigError(f"--metrics-file {metrics_file}: folder {metrics_file.parent} does not exist")
        if not (math.isfinite(deadline) and deadline > 0):
            raise ConfigError(f"--deadline: expected a number of seconds > 0, got {deadline:g}")
        cfg = bus_config(nats_url, client_name=f"fabricscope-worker-{durable}", user=user,
                         password_env=password_env, token_env=token_env, creds=creds, tls_ca=tls_ca,
                         tls_cert=tls_cert, tls_key=tls_key)
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
        store = None
        if db is not None and role != "incidents":  # the incident worker writes its own store
            from fabricscope.store.findings import DiagnosisStore

            store = DiagnosisStore(db)
        pending: list[Finding] = []
        added = [0]

        def to_store() -> None:
            if store is not None and pending:
                from fabricscope.diagnosis.model import Observed

                added[0] += store.add_findings(
                    Observed(source="worker", finding=f, reported_ns=f.window[1]) for f in pending)
            pending.clear()

        class _Shown(DetectorSet):
            """The default detectors; every finding also printed (and kept for --db)."""

            def __call__(self, events):  # type: ignore[no-untyped-def]
                out = super().__call__(events)
                for f in out:
                    typer.echo(f"{f.kind} {f.subject} score={f.score:.2f} {'; '.join(f.evidence)}")
                if store is not None:
                    pending.extend(out)
                    if len(pending) >= 500:
                        to_store()
                return out

        tap_fh = tap.open("a", encoding="utf-8") if tap is not None else None

        def on_events(evs: list[TelemetryEvent]) -> None:
            if tap_fh is not None:
                tap_fh.write(json.dumps({"t": time.time(), "events": [[e.target, e.name, e.ts_ns] for e in evs]})
                             + "\n")
                tap_fh.flush()

        w: Worker
        if role == "probes":
            from fabricscope.fabric.io import read_fabric
            from fabricscope.service.probe_bus import ProbeWorker

            assert inventory is not None and probe_db is not None
            fabric = read_fabric(inventory)

            def on_findings(found: list[Finding], win: tuple[int, int]) -> None:
                typer.echo(f"window {win[0] / 1e9:.0f}-{win[1] / 1e9:.0f} s: {len(found)} finding(s)")
                for f in found:
                    typer.echo(f"{f.kind} {f.subject} score={f.score:.2f} {'; '.join(f.evidence)}")
                if store is not None:
                    pending.extend(found)
                    to_store()

            w = ProbeWorker(cfg, fabric, probe_db, durable=durable, window_s=window, lateness_s=lateness,
                            retain_s=retain, method=method, on_findings=on_findings,
                            ack_wait_s=max(30.0, 2 * deadline))
        elif role == "incidents":
            from fabricscope.fabric.io import read_fabric
            from fabricscope.service.incident_bus import IncidentWorker

            assert inventory is not None

            def on_incident(inc: Incident) -> None:
                top = inc.root_causes[0] if inc.root_causes else None
                cause = f"{top.fault} on {top.resource} (p={top.probability:.2f})" if top else "no root cause yet"
                typer.echo(f"incident {inc.id} {inc.status}: {inc.title or cause}; {cause}")

            w = IncidentWorker(cfg, read_fabric(inventory), durable=durable, on_incident=on_incident, db=db)
        else:
            w = Worker(cfg, durable=durable, detectors=_Shown(default_detectors().detectors), on_events=on_events)
        next_line = [time.monotonic() + stats_interval]

        def on_stats(st: WorkerStats) -> None:
            if metrics_file is not None:
                from fabricscope.cli._textfile import write_textfile

                try:
                    write_textfile(metrics_file, st.metric_samples(), help_text=f"fabricscope worker {durable}")
                except OSError as exc:
                    logging.getLogger("fabricscope.cli").warning("--metrics-file %s: %s", metrics_file, exc)
            if stats_interval > 0 and time.monotonic() >= next_line[0]:
                next_line[0] = time.monotonic() + stats_interval
                logging.getLogger("fabricscope.cli").info(
                    "worker %s: %d batches, %d events, %d findings published, lag %d, ack pending %d%s", durable,
                    st.batches, st.events, st.findings_published, st.lag, st.ack_pending,
                    "" if st.connected else " (bus disconnected)")

        w.on_stats = on_stats
        got: list[int] = []

        async def main() -> WorkerStats:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()

            def on_signal(sig: int) -> None:
                got.append(sig)
                logging.getLogger("fabricscope.cli").warning(
                    "%s: stopping (draining the batch in hand for up to %g s)", signal.Signals(sig).name, deadline)
                w.stop()
                if len(got) == 1 and task is not None:
                    loop.call_later(deadline, task.cancel)  # the drain took too long

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, on_signal, sig)
            return await w.run(duration_s=duration)

        try:
            try:
                stats = asyncio.run(main())
            except asyncio.CancelledError:
                stats = w.stats()
                logging.getLogger("fabricscope.cli").error(
                    "worker: stop deadline (%g s) passed; the unacknowledged batches are redelivered", deadline)
        finally:
            to_store()
            if store is not None:
                store.con.close()
            if tap_fh is not None:
                tap_fh.close()
        extra: dict[str, int] = {}
        if role == "probes":
            extra = {"probe_samples": getattr(w, "samples", 0), "windows": getattr(w, "windows", 0),
                     "probes_not_running": getattr(w, "not_running", 0)}
        elif role == "incidents":
            extra = {"findings": getattr(w, "findings", 0), "incidents": len(getattr(w, "incidents", {})),
                     "incident_updates": getattr(w, "published", 0)}
        if json_stats:
            from dataclasses import asdict

            typer.echo(json.dumps({**asdict(stats), "stored_findings": added[0], **extra}))
        elif role == "incidents":
            typer.echo(f"worker {durable}: {stats.batches} batches, {extra['findings']} findings, "
                       f"{extra['incidents']} incidents ({extra['incident_updates']} updates published)"
                       + (f"; stored in {db}" if db is not None else ""))
        elif extra:
            typer.echo(f"worker {durable}: {stats.batches} batches, {extra['probe_samples']} probe samples, "
                       f"{extra['windows']} windows analysed ({extra['probes_not_running']} probes to or from an agent "
                       f"not running left out), {stats.findings_published} findings published, "
                       f"lag {stats.lag}" + (f"; {added[0]} findings added to {db}" if db is not None else ""))
        else:
            typer.echo(f"worker {durable}: {stats.batches} batches, {stats.events} events "
                       f"({stats.unique_events} new, {stats.duplicate_events} duplicates), "
                       f"{stats.findings_published} findings published, lag {stats.lag}"
                       + (f"; {added[0]} findings added to {db}" if db is not None else ""), err=json_stats)
        if got:
            raise typer.Exit(130 if got[0] == signal.SIGINT else 143)
