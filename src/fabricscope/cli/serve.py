"""``fabricscope serve``: the operator console (HTTP API, web UI, /metrics, alerts)."""

from __future__ import annotations

from pathlib import Path

import typer

_HELP = """Run the operator console: the closed loop on the embedded twin, an HTTP API, a web UI and /metrics.

Starts the supervisor on a digital twin of FABRIC (instruments -> findings -> incidents -> root cause, as `supervise` does, but live: the simulated clock follows the wall clock at --speed) and serves, from one process:

  /            the web UI (incidents with evidence drill-down, fabric view, probe matrix, stragglers, optics, what-if, advisor)
  /api/v1/...  the JSON API (OpenAPI schema at /api/openapi.json; docs/console.md)
  /metrics     Prometheus exposition (incidents, findings, self-metrics)

Security: every /api and /metrics request needs `Authorization: Bearer TOKEN` (or basic auth, user `fabricscope`). The token is read from --token-file (created with a random token, mode 600, when missing), or from $FABRICSCOPE_TOKEN, or $XDG_CONFIG_HOME/fabricscope/console.token (~/.config/...); it is never printed. Failed logins are logged and throttled (429 after 5 in a row). The server listens on 127.0.0.1; another --host needs --tls-cert/--tls-key (or --insecure). --tls-client-ca requires client certificates (mTLS).

Live sources instead of the twin: --config console.yaml names the inventory and the stores the live tools write (`gnmi collect` with a duckdb sink, read while it writes; a diagnosis store); the console polls them, diagnoses what is new and serves it the same way (docs/console.md).

On the twin, inject faults while it runs from the UI's API (POST /api/v1/twin/faults) or at start with --fault KIND:SUBJECT[@START[-END]][,KEY=VALUE] (times from now; kinds as in `supervise --help`).

Actions (off by default): with --actions approve, approving an incident's proposed action in the UI or the API (POST /api/v1/incidents/ID/approve) executes it when it is on the allow-list of reversible actions and the twin can carry it out (cost-out-link: the cable stops carrying traffic, so the symptoms that need traffic end); --actions auto executes it without waiting for an approval. Every execution, and every refusal, is in the incident's history. With --config, the actions go to the switches as gNMI Set requests (cost-out-link: interfaces/interface/config/enabled false on the cable's switch end) through the targets of the collector config named by the console config's actions.gnmi, and the link-down that follows is not reported as a new incident.

Alerts: --alertmanager URL posts incidents to Alertmanager's v2 API (resolved when they close); --webhook URL posts each change as JSON.

Examples:

  fabricscope serve

  fabricscope serve --twin rail-optimized:servers=16 --speed 2 --port 8765 --token-file console.token --fault "gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@30s,loss=0.03"

  curl -H "Authorization: Bearer $(cat console.token)" http://127.0.0.1:8765/api/v1/incidents
"""


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command."""

    @app.command("serve", help=_HELP)
    def serve_cmd(
        twin: str = typer.Option("rail-optimized:servers=8", "--twin",
                                 help="inventory file or builder spec of the twin"),
        config: Path | None = typer.Option(None, "--config",
                                           help="live sources (YAML: inventory, sources."
                                                "telemetry / sources.findings stores, poll) "
                                                "instead of the twin"),
        fault: list[str] = typer.Option([], "--fault", help="fault to inject at start (repeat)"),
        speed: float = typer.Option(1.0, "--speed", help="simulated seconds per wall second"),
        seed: int = typer.Option(0, "--seed", help="twin noise seed"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
        port: int = typer.Option(8765, "--port", help="TCP port (0: any free port)"),
        token_file: Path | None = typer.Option(None, "--token-file",
                                               help="file with the API token (created if missing)"),
        user: str = typer.Option("fabricscope", "--user", help="user name for basic auth"),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="PEM certificate (HTTPS)"),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="PEM key of --tls-cert"),
        tls_client_ca: Path | None = typer.Option(None, "--tls-client-ca",
                                                  help="PEM CA clients' certificates must chain "
                                                       "to (mTLS)"),
        insecure: bool = typer.Option(False, "--insecure",
                                      help="allow a non-loopback --host without TLS"),
        public_url: str | None = typer.Option(None, "--public-url",
                                              help="URL alerts link back to (default: the "
                                                   "listening address)"),
        alertmanager: str | None = typer.Option(None, "--alertmanager",
                                                help="Alertmanager base URL (v2 API)"),
        webhook: str | None = typer.Option(None, "--webhook", help="generic webhook URL"),
        telemetry_db: Path | None = typer.Option(None, "--telemetry-db",
                                                 help="DuckDB file for the twin's telemetry "
                                                      "(default: in memory)"),
        actions: str = typer.Option("off", "--actions",
                                    help="off: approvals are recorded only; approve: an approved "
                                         "action from the allow-list is executed on the twin "
                                         "(cost-out-link; with --config as a gNMI Set); auto: the "
                                         "console executes it itself"),
    ) -> None:
        from fabricscope.api.serve import ServeOptions, run
        from fabricscope.api.server import TlsFiles
        from fabricscope.model.errors import ConfigError

        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("--tls-cert/--tls-key: give both or neither")
        if tls_client_ca is not None and tls_cert is None:
            raise ConfigError("--tls-client-ca: also give --tls-cert/--tls-key (mTLS is TLS)")
        tls = (TlsFiles(tls_cert, tls_key, tls_client_ca)
               if tls_cert is not None and tls_key is not None else None)
        opts = ServeOptions(twin=twin, config=config, faults=fault, speed=speed, seed=seed, host=host,
                            port=port, token_file=token_file, user=user, tls=tls,
                            insecure=insecure, public_url=public_url, alertmanager=alertmanager,
                            webhook=webhook, telemetry_db=telemetry_db, actions=actions)
        raise typer.Exit(run(opts, echo=lambda m: typer.echo(m, err=True)))
