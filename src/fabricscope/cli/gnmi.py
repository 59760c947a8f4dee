"""``fabricscope gnmi``: serve the twin over gNMI, run the collector, or take a quick look at a target."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import typer

_SERVE_HELP = """Serve a twin of a fabric over real gNMI: every switch is a target selected by prefix.target.

The twin's counters follow a random-permutation background load; --fault injects faults
("KIND SUBJECT [start=5s] [end=6s] [param=value ...]", times relative to start-up; kinds as in
docs/telemetry.md). --fault-file adds faults while it runs: edit the file, then send SIGHUP
(kill -HUP PID). --transport runs the transport engine on the fabric at start-up (an incast
repeated every batch, a stuck NIC's pause storm) and plays it into the counters, so marks,
watermarks, drops and PFC pauses come from the physics (patterns and keys in
docs/telemetry.md). Binds 127.0.0.1 unless --address says otherwise; another address needs
--username (or --tls-client-ca) and --tls-cert, or --insecure. With --username, clients must
send username/password metadata (password from --password-env, never on the command line);
failed logins are logged and throttled. SIGINT/SIGTERM stop it within --shutdown-grace, print
a summary and exit 130/143.

Examples:

  fabricscope gnmi serve-twin --topo leaf-spine:leaves=4,hosts_per_leaf=4,spines=2

  fabricscope gnmi serve-twin --topo rail-optimized:servers=16 --address 127.0.0.1:9339 \\
      --fault "micro-burst leaf-p0-r0-00:eth3 start=10s end=10.005s depth_bytes=3e6" \\
      --fault "link-flap leaf-p0-r0-00:eth17|spine-p0-00:eth1 start=20s end=40s period_ns=2e9"

  fabricscope gnmi serve-twin --topo leaf-spine:leaves=2,hosts_per_leaf=8,spines=2 \\
      --address 127.0.0.1:0 --duration 5 \\
      --transport "incast senders=12 size=1MB start=1s every=100ms" \\
      --transport "stuck-nic start=3s end=4s"

  FABRICSCOPE_GNMI_PASSWORD=s3cret fabricscope gnmi serve-twin --inventory fabric.yaml \\
      --username admin --password-env FABRICSCOPE_GNMI_PASSWORD --tls-cert cert.pem --tls-key key.pem
"""

_INT_HELP = """Decode an INT-MD header and metadata stack (INT spec v2.1) given as hex.

The twin serves one per flow of a --transport run at the flow's sink switch:
/fabricscope/int/flows/flow[id=E.F]/state/int-md, the stack of the flow's worst packet in the
latest run (the most recent hop first). Units are in docs/telemetry.md.

Examples:

  fabricscope gnmi int-decode 20000305e0000000000000000000000700010002000005dc

  fabricscope gnmi int-decode --json 20000305e0000000000000000000000700010002000005dc
"""

_COLLECT_HELP = """Run the collector from a YAML config (gnmic-like: targets, subscriptions, processors, detectors, sinks).

The config is validated completely before anything connects; an error names the file, the
field and the value. Findings print as they are detected. See docs/telemetry.md for the format.

Examples:

  fabricscope gnmi collect --config collector.yaml

  fabricscope gnmi collect --config collector.yaml --duration 60
"""

_GET_HELP = """One gNMI Get against ADDRESS for one target (a live switch or the twin).

Examples:

  fabricscope gnmi get 127.0.0.1:9339 --target leaf-000 /interfaces/interface[name=eth1]/state/counters

  fabricscope gnmi get 127.0.0.1:9339 -t spine-00 "/components/component[name=*]/state/temperature/instant" --json
"""

_SUB_HELP = """Subscribe to PATHs on one target and print updates as they arrive (Ctrl-C or --duration to stop).

Examples:

  fabricscope gnmi subscribe 127.0.0.1:9339 -t leaf-000 /interfaces/interface[name=eth1]/state/counters --interval 1s

  fabricscope gnmi subscribe 127.0.0.1:9339 -t leaf-000 /interfaces/interface[name=*]/state/oper-status \\
      --stream-mode on-change --heartbeat 10s

  fabricscope gnmi subscribe 127.0.0.1:9339 -t leaf-000 /qos --mode once
"""


def _h(text: str) -> str:
    """Help text with gNMI keys ``[name=eth1]`` shown literally (rich would take them as markup)."""
    return text.replace("[", "\\[")


def _fabric(topo: str | None, inventory: Path | None):  # type: ignore[no-untyped-def]
    from fabricscope.fabric.catalog import build_fabric, parse_params
    from fabricscope.fabric.io import read_fabric
    from fabricscope.model.errors import ConfigError

    if inventory is not None:
        return read_fabric(inventory)
    spec = topo or "leaf-spine:leaves=4,hosts_per_leaf=4,spines=2"
    kind, _, rest = spec.partition(":")
    params = parse_params([p for p in rest.split(",") if p], source="--topo") if rest else {}
    if not kind:
        raise ConfigError(f"--topo: expected KIND[:KEY=VALUE,...], got {spec!r}")
    return build_fabric(kind, params, source="--topo")


def _password(env: str | None) -> str | None:
    from fabricscope.model.errors import ConfigError

    if env is None:
        return None
    pw = os.environ.get(env)
    if pw is None:
        raise ConfigError(f"--password-env: environment variable {env!r} is not set")
    if not pw:
        # an empty password would mean "anyone who knows the user name": never auth=on
        raise ConfigError(f"--password-env: environment variable {env!r} is empty")
    return pw


def _login(username: str | None, password_env: str | None) -> tuple[str | None, str | None]:
    """(user, password) from --username/--password-env: both or neither, never silently off."""
    from fabricscope.model.errors import ConfigError

    if username is not None and not username:
        raise ConfigError("--username: must not be empty")
    if username is None and password_env is not None:
        raise ConfigError(f"--password-env {password_env}: also give --username (auth needs both)")
    if username is not None and password_env is None:
        raise ConfigError(f"--username {username}: also give --password-env (the password is never "
                          "taken from the command line)")
    return username, _password(password_env)


def _address(text: str, flag: str, *, allow_port0: bool) -> str:
    """Check ``host:port`` (``[v6]:port``); one ConfigError line naming the flag and value."""
    import ipaddress
    import re

    from fabricscope.model.errors import ConfigError

    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{flag}: expected HOST:PORT, got {text!r}")
    lo = 0 if allow_port0 else 1
    if not port.isdigit() or not lo <= int(port) <= 65535:
        raise ConfigError(f"{flag}: {text!r}: port must be a number {lo}-65535, got {port!r}")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ConfigError(f"{flag}: {text!r}: unterminated IPv6 address {host!r}")
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ConfigError(f"{flag}: {text!r}: {host[1:-1]!r} is not an IPv6 address") from None
    elif ":" in host or not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?", host):
        raise ConfigError(f"{flag}: {text!r}: {host!r} is not a host name or address (IPv6: [addr]:port)")
    return text


def _encoding(value: str, allowed: tuple[str, ...], flag: str = "--encoding") -> str:
    from fabricscope.model.errors import ConfigError

    if value not in allowed:
        raise ConfigError(f"{flag}: expected {' | '.join(allowed)}, got {value!r}")
    return value


def _clear_text_warning(address: str, password: str | None, tls_ca: str | None) -> None:
    from fabricscope.telemetry.target import is_loopback

    if password is not None and tls_ca is None and not is_loopback(address.rpartition(":")[0]):
        typer.secho(f"warning: sending a password to {address} without TLS (give --tls-ca)", err=True,
                    fg=typer.colors.YELLOW)


def register(app: typer.Typer) -> None:
    """Add the ``gnmi`` command group (serve-twin, collect, get, subscribe)."""
    gnmi = typer.Typer(
        help=_h("Streaming telemetry over gNMI: serve the twin, collect into DuckDB/Prometheus/JSON lines, "
                "get/subscribe for a quick look.\n\nExamples:\n\n"
                "  fabricscope gnmi serve-twin --topo leaf-spine:leaves=4,hosts_per_leaf=4,spines=2\n\n"
                "  fabricscope gnmi get 127.0.0.1:9339 -t leaf-000 /interfaces/interface[name=eth1]/state/counters\n\n"
                "  fabricscope gnmi collect --config collector.yaml"),
        no_args_is_help=True,
    )
    app.add_typer(gnmi, name="gnmi")
    # SQL over the collector's store, also while it collects
    from fabricscope.cli.gnmi_query import register as register_query

    register_query(gnmi)

    @gnmi.command("serve-twin", help=_h(_SERVE_HELP))
    def serve_twin_cmd(
        topo: str | None = typer.Option(None, "--topo", help="KIND[:KEY=VALUE,...] builder (default a small leaf-spine)."),
        inventory: Path | None = typer.Option(None, "--inventory", help="Inventory file (YAML/JSON) instead of --topo."),
        address: str = typer.Option("127.0.0.1:9339", "--address", help="host:port to listen on (port 0: any)."),
        utilization: float = typer.Option(0.3, "--utilization", help="Background load per NIC, 0..1."),
        seed: int = typer.Option(0, "--seed", help="Seed for load and noise."),
        fault: list[str] = typer.Option([], "--fault", help=_h('"KIND SUBJECT [start=..] [end=..] [k=v ...]" (repeatable).')),
        fault_file: Path | None = typer.Option(None, "--fault-file", help="File of fault lines, re-read on SIGHUP "
                                               "(inject faults while serving)."),
        transport: list[str] = typer.Option([], "--transport", help=_h(
            '"incast|stuck-nic [start=..] [every=..] [end=..] [k=v ...]" (repeatable): run the transport '
            "engine on the fabric at start-up and play the run into the counters (docs/telemetry.md).")),
        username: str | None = typer.Option(None, "--username", help="Require this user name in metadata."),
        password_env: str | None = typer.Option(None, "--password-env", help="Environment variable holding the password."),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="PEM certificate (enables TLS)."),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="PEM private key for --tls-cert."),
        tls_client_ca: Path | None = typer.Option(None, "--tls-client-ca", help="PEM CA: clients must present a "
                                                  "certificate it signed (mTLS; needs --tls-cert)."),
        insecure: bool = typer.Option(False, "--insecure", help="Allow a non-loopback address without auth or TLS."),
        max_sessions: int = typer.Option(32, "--max-sessions-per-client", help="Concurrent Subscribes per client "
                                         "host and device."),
        max_subs: int = typer.Option(256, "--max-subscriptions", help="Subscriptions per Subscribe request."),
        max_paths: int = typer.Option(256, "--max-paths", help="Paths per Get request."),
        max_msg: int = typer.Option(1 << 20, "--max-message-bytes", help="Largest request accepted (gRPC receive limit)."),
        grace: float = typer.Option(2.0, "--shutdown-grace", help="Seconds open RPCs get to finish on SIGINT/SIGTERM."),
        encoding: str = typer.Option("request", "--encoding", help="request | typed | json_ietf (json_ietf: pygnmi-safe)."),
        duration: float | None = typer.Option(None, "--duration", help="Stop after this many seconds."),
        allow_set: bool = typer.Option(False, "--allow-set", help="Accept gNMI Set of "
                                       "/interfaces/interface[name=*]/config/enabled from an authenticated "
                                       "client (false takes the port and its cable down: the console's "
                                       "cost-out); needs --username/--password-env."),
    ) -> None:
        import asyncio
        import logging

        from fabricscope.model.errors import ConfigError
        from fabricscope.service.gnmi_twin import FaultFile, parse_fault, serve_twin, twin_for
        from fabricscope.sim.clock import WallClock
        from fabricscope.telemetry.limits import TargetLimits
        from fabricscope.telemetry.target import Credentials, TLSFiles, is_loopback

        _address(address, "--address", allow_port0=True)
        _encoding(encoding, ("request", "typed", "json_ietf"))
        if grace < 0:
            raise ConfigError(f"--shutdown-grace: expected seconds >= 0, got {grace}")
        for flag, v in (("--max-sessions-per-client", max_sessions), ("--max-subscriptions", max_subs),
                        ("--max-paths", max_paths), ("--max-message-bytes", max_msg)):
            if v < 1:
                raise ConfigError(f"{flag}: expected an integer >= 1, got {v}")
        limits = TargetLimits(sessions_per_client=max_sessions, subscriptions_per_session=max_subs,
                              paths_per_request=max_paths, receive_message_bytes=max_msg)
        user, pw = _login(username, password_env)
        creds = Credentials(user, pw) if user is not None and pw is not None else None
        if allow_set and creds is None:
            raise ConfigError("--allow-set: Set changes the fabric, so it needs credentials: "
                              "add --username and --password-env")
        tls = None
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("--tls-cert/--tls-key: give both or neither")
        if tls_client_ca is not None and tls_cert is None:
            raise ConfigError("--tls-client-ca: also give --tls-cert/--tls-key (mTLS is TLS)")
        if tls_cert is not None and tls_key is not None:
            try:
                tls = TLSFiles(tls_cert.read_bytes(), tls_key.read_bytes(),
                               tls_client_ca.read_bytes() if tls_client_ca is not None else None)
            except OSError as exc:
                raise ConfigError(f"--tls-cert/--tls-key/--tls-client-ca: {exc.filename}: {exc.strerror}") from exc
            tls.check(f"--tls-cert {tls_cert} / --tls-key {tls_key}"
                      + (f" / --tls-client-ca {tls_client_ca}" if tls_client_ca else ""))
        host = address.rpartition(":")[0]
        authed = creds is not None or tls_client_ca is not None
        if not is_loopback(host) and not (authed and tls is not None) and not insecure:
            missing = " and ".join(w for w, ok in (("authentication (--username or --tls-client-ca)", authed),
                                                   ("TLS (--tls-cert/--tls-key)", tls is not None)) if not ok)
            raise ConfigError(f"--address {address}: not loopback and no {missing}; "
                              "add them, or --insecure to serve anyway")
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        fab = _fabric(topo, inventory)
        clock = WallClock()
        t0 = clock.now_ns()
        faults = [parse_fault(f, t0_ns=t0) for f in fault]
        ff = FaultFile(fault_file) if fault_file is not None else None
        more = ff.load(t0) if ff is not None else []
        twin = twin_for(fab, faults=[*faults, *more], utilization=utilization, seed=seed, clock=clock)
        if transport:
            from fabricscope.service.twin_transport import describe, parse_transport

            for i, line in enumerate(transport, 1):
                typer.echo(f"transport {i}/{len(transport)}: simulating {line!r} ...", err=True)
                ep = parse_transport(line, fab, t0_ns=t0, source=f"--transport {i}")
                twin.add_transport(ep)
                typer.echo(f"transport {i}/{len(transport)}: {describe(ep, t0)}", err=True)

        def ready(t: object) -> None:
            bound = getattr(t, "bound", address)
            mtls = " mtls=on," if tls is not None and tls.client_ca_pem is not None else ""
            typer.echo(f"serving {len(twin.targets())} targets of {fab.name} over gNMI on {bound}"
                       f" (tls={'on' if tls else 'off'},{mtls} auth={'on' if creds else 'off'}, pid {os.getpid()});"
                       " Ctrl-C to stop", err=False)

        def reloaded(n: int, err: str) -> None:
            typer.echo(f"fault reload failed, previous faults kept: {err}" if err else
                       f"fault file reloaded: {n} fault(s) active or scheduled", err=bool(err))

        summary = asyncio.run(serve_twin(twin, address=address, credentials=creds, tls=tls, encoding=encoding,
                                         on_ready=ready, duration_s=duration, limits=limits, grace_s=grace,
                                         faults=faults, fault_file=ff, on_reload=reloaded,
                                         allow_set=allow_set))
        t, st = summary.target, summary.target.stats
        typer.echo(f"stopped after {summary.uptime_s:.1f} s ({summary.signal or 'duration over'}"
                   f"{', shutdown deadline hit' if summary.stop_timed_out else ''}): {st.rpcs} RPCs, "
                   f"{t.updates_sent} updates / {t.bytes_sent} bytes sent, {st.refused} requests over limits, "
                   f"{st.auth_failures} failed logins ({st.auth_throttled} throttled), "
                   f"{summary.reloads} fault reloads")
        if summary.exit_code:
            raise typer.Exit(summary.exit_code)

    @gnmi.command("int-decode", help=_h(_INT_HELP))
    def int_decode_cmd(
        value: str = typer.Argument(..., help="INT-MD header and stack as hex (what the int-md leaf serves)."),
        json_out: bool = typer.Option(False, "--json", help="One JSON object: header and hops."),
    ) -> None:
        import dataclasses
        import json

        from fabricscope.model import int_md
        from fabricscope.model.errors import ConfigError

        try:
            raw = bytes.fromhex(value.strip())
        except ValueError:
            raise ConfigError(f"int-decode: VALUE: not hex ({value[:40]!r})") from None
        if not raw:
            raise ConfigError("int-decode: VALUE: empty (the sink has seen no packet of that flow yet)")
        try:
            hdr, hops = int_md.unpack(raw)
        except int_md.IntFormatError as exc:
            raise ConfigError(f"int-decode: VALUE: {exc}") from None
        if json_out:
            typer.echo(json.dumps({"header": dataclasses.asdict(hdr),
                                   "hops": [dataclasses.asdict(h) for h in hops]}))
            return
        typer.echo(f"INT-MD v{hdr.version}: {len(hops)} hop(s), instructions {hdr.instructions:#06x}, "
                   f"{hdr.hop_ml} words per hop, {hdr.remaining_hop_count} hops left"
                   + (", hop count exceeded" if hdr.exceeded_hop_count else ""))
        typer.echo("  hop  node  in  out  queue B  hop latency ns  tx util ppm  ingress ts ns")
        for k, h in enumerate(hops):
            def show(v: int | None) -> str:
                return "-" if v is None else str(v)
            typer.echo(f"  {k:3d}  {show(h.node_id):>4}  {show(h.l1_ingress):>2}  {show(h.l1_egress):>3}  "
                       f"{show(h.queue_occupancy):>7}  {show(h.hop_latency):>14}  {show(h.tx_utilization):>11}  "
                       f"{show(h.ingress_ts)}")

    @gnmi.command("collect", help=_h(_COLLECT_HELP))
    def collect_cmd(
        config: Path = typer.Option(..., "--config", "-c", help="Collector YAML config."),
        duration: float | None = typer.Option(None, "--duration", help="Stop after this many seconds."),
        cluster: bool = typer.Option(False, "--cluster", help="Join the collector cluster of the config's "
                                     "cluster: section: collect only the devices this member owns and publish "
                                     "them to NATS JetStream (detection runs in 'fabricscope worker')."),
    ) -> None:
        import asyncio
        import logging
        import signal
        import sys

        # gRPC's C core logs reconnect attempts on its own; the collector reports each
        # condition once per interval instead (set GRPC_VERBOSITY to see gRPC's lines)
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        os.environ.setdefault("GRPC_TRACE", "")

        import math

        from rich.console import Console
        from rich.table import Table

        from fabricscope.model.errors import ConfigError, TransportError
        from fabricscope.telemetry.collector import Collector, CollectorStats
        from fabricscope.telemetry.config import load_config
        from fabricscope.telemetry.shards import ShardedCollector

        if duration is not None and not (math.isfinite(duration) and duration > 0):
            raise ConfigError(f"--duration: expected a number of seconds > 0, got {duration:g}")
        cfg = load_config(config)
        console = Console(highlight=False)
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
        if cluster:
            import threading

            from fabricscope.service.cluster_collector import run_cluster_collector

            if cfg.cluster is None:
                raise ConfigError(f"{config}: cluster: --cluster needs a cluster: section (nats: URL, member: "
                                  "name; see docs/design/cluster-bus.md)")
            stop_ev = threading.Event()
            got: list[int] = []

            def on_stop(sig: int, _frame: object) -> None:
                got.append(sig)
                stop_ev.set()

            old_h = {sg: signal.signal(sg, on_stop) for sg in (signal.SIGINT, signal.SIGTERM)}
            console.print(f"cluster member {cfg.cluster.member} of {cfg.cluster.nats}: sharing "
                          f"{sum(len(t.names) for t in cfg.targets)} devices; Ctrl-C to stop")
            try:
                cst = run_cluster_collector(cfg, duration_s=duration, stop_event=stop_ev)
            finally:
                for sg, h in old_h.items():
                    signal.signal(sg, h)
            console.print(f"member {cst.member}: acquired {cst.acquired}, released {cst.released}, received "
                          f"{cst.received}, published {cst.published_events}, dropped {cst.dropped_events}, "
                          f"spilled {cst.spilled_events}, lost {cst.lost_events}")
            if cst.lost_events:
                raise TransportError(f"gnmi collect --cluster: {cst.lost_events} events were neither published "
                                     "nor spilled (see the log above)")
            if got:
                raise typer.Exit(130 if got[0] == signal.SIGINT else 143)
            return

        def show(findings: list) -> None:  # type: ignore[type-arg]
            for f in findings:
                console.print(f"[bold red]{f.kind}[/] {f.subject} score={f.score:.2f} {'; '.join(f.evidence)}")

        col: Collector | ShardedCollector
        if cfg.workers > 1:
            col = ShardedCollector(cfg, workers=cfg.workers, on_findings=show)
        else:
            col = Collector(cfg, on_findings=show)
        console.print(f"collecting from {len(cfg.targets)} target connection(s) "
                      f"({sum(len(t.names) for t in cfg.targets)} devices, {cfg.workers} worker(s)); Ctrl-C to stop")
        signals: list[int] = []

        def on_signal(sig: int) -> None:
            # first signal: drain until shutdown.deadline, then spill; a second: spill now
            signals.append(sig)
            logging.getLogger("fabricscope.cli").warning(
                "%s: stopping (%s)", signal.Signals(sig).name,
                "deadline now" if len(signals) > 1 else f"draining for up to {cfg.shutdown_deadline_ns / 1e9:g}s")
            col.stop()

        async def run() -> CollectorStats:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, on_signal, sig)
            return await col.run(duration_s=duration)

        try:
            stats = asyncio.run(run())
        except KeyboardInterrupt:  # a Ctrl-C before the loop installed its handler
            signals.append(signal.SIGINT)
            stats = col.stats
        finally:
            col.close()
        tbl = Table("stream", "state", "connects", "updates", "decode errors", "stale", "last error")
        for st in stats.targets.values():
            tbl.add_row(st.name, st.state, str(st.connects), str(st.updates), str(st.decode_errors), str(st.stale),
                        st.last_error[:60])
        console.print(tbl)
        spilled = f" to {stats.spill_file}" if stats.spilled else ""
        console.print(f"received {stats.received}, written {stats.written}, spilled {stats.spilled}{spilled}, "
                      f"replayed {stats.replayed}, lost {stats.lost}, findings {stats.findings}")
        if stats.lost:
            raise TransportError(f"gnmi collect: {stats.lost} events were neither written nor spilled "
                                 "(see the log above)")
        if signals:
            raise typer.Exit(130 if signals[0] == signal.SIGINT else 143)
        if stats.received == 0:
            addrs = ", ".join(sorted({t.address for t in cfg.targets}))
            errs = [st.last_error for st in stats.targets.values() if st.last_error]
            raise TransportError(f"gnmi collect: no updates received from {addrs}"
                                 f"{f' in {duration:g}s' if duration else ''}; expected updates from every target"
                                 f"{f' (last error: {errs[-1]})' if errs else ''}")
        for st in stats.targets.values():
            if st.updates == 0:
                typer.secho(f"warning: {st.name}: no updates received"
                            f"{f' ({st.last_error})' if st.last_error else ''}", err=True, fg=typer.colors.YELLOW)

    @gnmi.command("get", help=_h(_GET_HELP))
    def get_cmd(
        address: str = typer.Argument(..., help="host:port of the gNMI target."),
        paths: list[str] = typer.Argument(..., help="gNMI path(s), wildcards allowed."),
        target: str = typer.Option(..., "--target", "-t", help="prefix.target: the device."),
        username: str | None = typer.Option(None, "--username", help="User name sent as metadata (needs --password-env)."),
        password_env: str | None = typer.Option(None, "--password-env", help="Environment variable holding the password."),
        tls_ca: str | None = typer.Option(None, "--tls-ca", help="CA PEM to verify the target (enables TLS)."),
        server_name: str | None = typer.Option(None, "--server-name", help="TLS name to verify."),
        encoding: str = typer.Option("proto", "--encoding", help="proto | json_ietf"),
        as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table."),
    ) -> None:
        import asyncio
        import json

        from fabricscope.telemetry.collector import gnmi_get

        _address(address, "ADDRESS", allow_port0=False)
        _encoding(encoding, ("proto", "json_ietf"))
        user, pw = _login(username, password_env)
        _clear_text_warning(address, pw, tls_ca)
        events = asyncio.run(gnmi_get(address, target, paths, username=user, password=pw,
                                      tls_ca=tls_ca, server_name=server_name, encoding=encoding))
        if as_json:
            for e in events:
                typer.echo(json.dumps({"target": e.target, "name": e.name, "tags": dict(e.tags), "value": e.value,
                                       "ts_ns": e.ts_ns}))
            return
        from rich.console import Console
        from rich.table import Table

        tbl = Table()
        for col in ("path", "keys", "value"):
            tbl.add_column(col, overflow="fold")  # a path is useless cut short: fold, never ellipsize
        for e in events:
            tbl.add_row(e.name, ",".join(f"{k}={v}" for k, v in e.tags.items()), str(e.value))
        Console().print(tbl)

    @gnmi.command("subscribe", help=_h(_SUB_HELP))
    def subscribe_cmd(
        address: str = typer.Argument(..., help="host:port of the gNMI target."),
        paths: list[str] = typer.Argument(..., help="gNMI path(s), wildcards allowed."),
        target: str = typer.Option(..., "--target", "-t", help="prefix.target: the device."),
        mode: str = typer.Option("stream", "--mode", help="stream | once | poll"),
        stream_mode: str = typer.Option("sample", "--stream-mode", help="sample | on-change | target-defined"),
        interval: str = typer.Option("1s", "--interval", help="Sample (or poll) interval."),
        heartbeat: str = typer.Option("0s", "--heartbeat", help="Heartbeat interval for on-change / suppress-redundant."),
        updates_only: bool = typer.Option(False, "--updates-only", help="Skip the initial full set; only changes."),
        suppress_redundant: bool = typer.Option(False, "--suppress-redundant",
                                                help="Target sends a sampled leaf only when it changed."),
        encoding: str = typer.Option("proto", "--encoding", help="proto | json_ietf"),
        username: str | None = typer.Option(None, "--username", help="User name sent as metadata (needs --password-env)."),
        password_env: str | None = typer.Option(None, "--password-env", help="Environment variable holding the password."),
        tls_ca: str | None = typer.Option(None, "--tls-ca", help="CA PEM to verify the target (enables TLS)."),
        server_name: str | None = typer.Option(None, "--server-name", help="TLS name to verify."),
        duration: float | None = typer.Option(None, "--duration", help="Stop after this many seconds."),
    ) -> None:
        import asyncio

        from fabricscope.telemetry.collector import gnmi_subscribe
        from fabricscope.telemetry.config import parse_duration_ns

        _address(address, "ADDRESS", allow_port0=False)
        _encoding(encoding, ("proto", "json_ietf"))
        _encoding(mode, ("stream", "once", "poll"), "--mode")
        _encoding(stream_mode, ("sample", "on-change", "target-defined"), "--stream-mode")
        username, pw = _login(username, password_env)
        _clear_text_warning(address, pw, tls_ca)

        def show(events: list) -> None:  # type: ignore[type-arg]
            for e in events:
                keys = ",".join(f"{k}={v}" for k, v in e.tags.items())
                typer.echo(f"{e.ts_ns} {e.target} {e.name}[{keys}] = {e.value}")

        try:
            asyncio.run(gnmi_subscribe(
                address, target, paths, on_events=show, mode=mode, stream_mode=stream_mode,
                interval_ns=parse_duration_ns(interval, "--interval"),
                heartbeat_ns=parse_duration_ns(heartbeat, "--heartbeat"), updates_only=updates_only,
                suppress_redundant=suppress_redundant, encoding=encoding, username=username,
                password=pw, tls_ca=tls_ca, server_name=server_name, duration_s=duration))
        except KeyboardInterrupt:  # Ctrl-C: the stream ends as the user asked, exit 130
            raise typer.Exit(130) from None
