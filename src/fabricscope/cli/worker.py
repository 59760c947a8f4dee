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

Examples:

  fabricscope worker --nats nats://127.0.0.1:4222

  fabricscope worker --nats nats://127.0.0.1:4222 --durable fs-detectors --duration 60 --json-stats

  FABRICSCOPE_NATS_PASSWORD=s3cret fabricscope worker --nats tls://bus:4222 --tls-ca ca.pem \\
      --user fabricscope --password-env FABRICSCOPE_NATS_PASSWORD --db findings.duckdb
"""


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command."""

    @app.command("worker", help=_HELP)
    def worker_cmd(
        nats_url: str = typer.Option("nats://127.0.0.1:4222", "--nats", help="NATS URL (nats:// or tls://)."),
        durable: str = typer.Option("fs-detectors", "--durable", help="Durable consumer name (shared = shared work)."),
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
        tap: Path | None = typer.Option(None, "--tap", help="Append every new (de-duplicated) event to this file "
                                        "as JSON lines (debugging; grows without bound)."),
    ) -> None:
        import asyncio
        import logging
        import os
        import signal
        import sys
        import time

        from fabricscope.cluster.bus import BusConfig
        from fabricscope.cluster.worker import Worker, WorkerStats
        from fabricscope.model.errors import ConfigError
        from fabricscope.model.records import Finding, TelemetryEvent
        from fabricscope.telemetry.detectors import DetectorSet, default_detectors

        if duration is not None and not (math.isfinite(duration) and duration > 0):
            raise ConfigError(f"--duration: expected a number of seconds > 0, got {duration:g}")
        if not (math.isfinite(deadline) and deadline > 0):
            raise ConfigError(f"--deadline: expected a number of seconds > 0, got {deadline:g}")
        token = None
        if token_env is not None:
            token = os.environ.get(token_env)
            if not token:
                raise ConfigError(f"--token-env: environment variable {token_env!r} is not set or empty")
        try:
            cfg = BusConfig(url=nats_url, user=user, password_env=password_env, token=token,
                            creds_file=str(creds) if creds else None, tls_ca=str(tls_ca) if tls_ca else None,
                            tls_cert=str(tls_cert) if tls_cert else None, tls_key=str(tls_key) if tls_key else None,
                            client_name=f"fabricscope-worker-{durable}")
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("bus: url:", "--nats:").replace("bus: ", "--")) from None
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
        store = None
        if db is not None:
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

        w = Worker(cfg, durable=durable, detectors=_Shown(default_detectors().detectors), on_events=on_events)
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
        if json_stats:
            from dataclasses import asdict

            typer.echo(json.dumps({**asdict(stats), "stored_findings": added[0]}))
        else:
            typer.echo(f"worker {durable}: {stats.batches} batches, {stats.events} events "
                       f"({stats.unique_events} new, {stats.duplicate_events} duplicates), "
                       f"{stats.findings_published} findings published, lag {stats.lag}"
                       + (f"; {added[0]} findings added to {db}" if db is not None else ""), err=json_stats)
        if got:
            raise typer.Exit(130 if got[0] == signal.SIGINT else 143)
