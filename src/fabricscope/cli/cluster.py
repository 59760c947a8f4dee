"""``fabricscope cluster``: target ownership across collectors (status, and a demo member)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import typer

_STATUS_HELP = """Show the collector cluster: live members and their lease ages, how many targets each holds, and targets nobody owns (stale claims of dead members and, with --targets, listed targets without a claim). Reads the KV buckets fs_members / fs_owners once and creates nothing.

Exit codes: 0 at least one live member and every target owned, 1 no live member or some target unowned, 2 NATS unreachable, no cluster there, or bad input.

Examples:

  fabricscope cluster status --nats nats://127.0.0.1:4222

  fabricscope cluster status --nats nats://127.0.0.1:4222 --targets targets.txt --json
"""

_MEMBER_HELP = """Join the cluster as member NAME and hold this member's share of the targets (weighted rendezvous hashing over the live members), printing one line per acquire / release:

  2026-12-02T07:30:00.123456Z c1 acquire leaf-007

A target is acquired only after this member's claim in KV bucket fs_owners was written by compare-and-set, and released (the line printed) before the claim is deleted. Heartbeats and claims are renewed every lease/3; if they cannot be renewed for lease - lease/6 the member stops all its targets itself. SIGTERM / Ctrl-C leave cleanly (release everything, then the member key) and exit 143 / 130. For demos and tests; the gNMI collector embeds the same Membership.

--targets FILE: one target name per line (blank lines and # comments ignored), or a JSON list of names. Every member should get the same file.

Examples:

  fabricscope cluster member --nats nats://127.0.0.1:4222 --name c1 --targets targets.txt --lease 3s
"""


def _auth(user: str | None, password: str | None, token: str | None, creds: Path | None,
          tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None) -> Any:
    from fabricscope.cluster.membership import NatsAuth
    from fabricscope.model.errors import ConfigError

    if tls_key is not None and tls_cert is None:
        raise ConfigError("--tls-key: needs --tls-cert")
    for flag, p in (("--tls-ca", tls_ca), ("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if p is not None and not p.is_file():
            raise ConfigError(f"{flag}: {str(p)!r}: no such file")
    return NatsAuth(user=user, password=password, token=token, creds=creds, tls_ca=tls_ca,
                    tls_cert=tls_cert, tls_key=tls_key)


def read_targets(path: Path) -> list[str]:
    """Target names from a text file (one per line, # comments) or a JSON list."""
    from fabricscope.model.errors import ConfigError

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--targets: {str(path)!r}: not UTF-8 text ({exc.reason})") from None
    names: list[str] = []
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--targets: {str(path)!r}: invalid JSON: {exc}") from None
        for i, v in enumerate(data):
            if not isinstance(v, str) or not v.strip():
                raise ConfigError(f"--targets: {str(path)!r}: item {i}: expected a target "
                                  f"name, got {v!r}")
            names.append(v.strip())
    else:
        for n, line in enumerate(text.splitlines(), start=1):
            s = line.split("#", 1)[0].strip()
            if not s:
                continue
            if any(c.isspace() for c in s):
                raise ConfigError(f"--targets: {str(path)!r}: line {n}: {s!r}: one target "
                                  "name per line (no spaces)")
            names.append(s)
    if not names:
        raise ConfigError(f"--targets: {str(path)!r}: no target names in the file")
    return names


def _lease(text: str) -> float:
    from fabricscope.model.errors import ConfigError
    from fabricscope.telemetry.config import parse_duration_ns

    value: object = text
    with contextlib.suppress(ValueError):
        value = float(text)
    s = parse_duration_ns(value, "--lease") / 1e9
    if not 0.2 <= s <= 3600:
        raise ConfigError(f"--lease: {text!r}: must be between 200ms and 1h")
    return s


def _fmt_age(s: float) -> str:
    return f"{s:.1f}s" if s < 120 else f"{s / 60:.0f}m"


def register(app: typer.Typer) -> None:
    """Add the ``cluster`` command group (``cluster status``, ``cluster member``)."""
    cluster = typer.Typer(help="Collector cluster over NATS JetStream: who is live, who owns "
                               "which target.", no_args_is_help=True)
    app.add_typer(cluster, name="cluster")

    nats_opt = typer.Option("nats://127.0.0.1:4222", "--nats",
                            help="NATS server URL (comma-separated for several).")
    user_opt = typer.Option(None, "--user", help="NATS user name.")
    password_opt = typer.Option(None, "--password", envvar="FABRICSCOPE_NATS_PASSWORD",
                                help="NATS password (or FABRICSCOPE_NATS_PASSWORD).")
    token_opt = typer.Option(None, "--token", envvar="FABRICSCOPE_NATS_TOKEN",
                             help="NATS token (or FABRICSCOPE_NATS_TOKEN).")
    creds_opt = typer.Option(None, "--creds", help="NATS credentials file (JWT + nkey).")
    ca_opt = typer.Option(None, "--tls-ca", help="CA bundle (PEM) to verify the server.")
    cert_opt = typer.Option(None, "--tls-cert", help="Client certificate (PEM) for mTLS.")
    key_opt = typer.Option(None, "--tls-key", help="Client key (PEM) for mTLS.")

    @cluster.command("status", help=_STATUS_HELP)
    def status(
        nats_url: str = nats_opt,
        targets: Path | None = typer.Option(None, "--targets", help="The target list, to also show targets nobody has claimed."),
        as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
        members_bucket: str = typer.Option("fs_members", "--members-bucket", help="KV bucket of member leases."),
        owners_bucket: str = typer.Option("fs_owners", "--owners-bucket", help="KV bucket of target claims."),
        user: str | None = user_opt, password: str | None = password_opt,
        token: str | None = token_opt, creds: Path | None = creds_opt,
        tls_ca: Path | None = ca_opt, tls_cert: Path | None = cert_opt,
        tls_key: Path | None = key_opt,
    ) -> None:
        import asyncio

        from fabricscope.cluster.membership import read_cluster_status

        auth = _auth(user, password, token, creds, tls_ca, tls_cert, tls_key)
        names = read_targets(targets) if targets is not None else None
        st = asyncio.run(read_cluster_status(
            [u.strip() for u in nats_url.split(",") if u.strip()], auth=auth,
            members_bucket=members_bucket, owners_bucket=owners_bucket, targets=names))
        live = [m for m in st.members if m.live]
        unowned = st.unowned()
        if as_json:
            typer.echo(json.dumps(st.to_json(), indent=2, sort_keys=True))
        else:
            per = st.targets_per_member()
            digests = {m.digest for m in live}
            typer.echo(f"lease {st.lease_s:g}s; {len(live)} live member(s), "
                       f"{sum(len(v) for v in per.values())} owned target(s), "
                       f"{len(unowned)} unowned")
            typer.echo(f"{'member':<20} {'state':<6} {'lease age':>9} {'owned':>6} "
                       f"{'configured':>10}  digest")
            for m in st.members:
                typer.echo(f"{m.name:<20} {'live' if m.live else 'dead':<6} "
                           f"{_fmt_age(m.lease_age_s):>9} {len(per.get(m.name, [])):>6} "
                           f"{m.targets:>10}  {m.digest}")
            if len(digests) > 1:
                typer.echo("warning: live members were given different target lists "
                           "(digests differ); some targets may have no owner")
            if unowned:
                shown = ", ".join(unowned[:20]) + (" ..." if len(unowned) > 20 else "")
                typer.echo(f"unowned: {shown}")
        if not live or unowned:
            raise typer.Exit(1)

    @cluster.command("member", help=_MEMBER_HELP)
    def member(
        name: str = typer.Option(..., "--name", help="This member's unique name ([A-Za-z0-9_-])."),
        targets: Path = typer.Option(..., "--targets", help="File of target names (one per line, or a JSON list)."),
        nats_url: str = nats_opt,
        lease: str = typer.Option("3s", "--lease", help="Lease: a dead member's targets move after about this long (e.g. 3s, 500ms)."),
        weight: float = typer.Option(1.0, "--weight", help="Relative capacity: share = weight / sum(weights)."),
        members_bucket: str = typer.Option("fs_members", "--members-bucket", help="KV bucket of member leases."),
        owners_bucket: str = typer.Option("fs_owners", "--owners-bucket", help="KV bucket of target claims."),
        user: str | None = user_opt, password: str | None = password_opt,
        token: str | None = token_opt, creds: Path | None = creds_opt,
        tls_ca: Path | None = ca_opt, tls_cert: Path | None = cert_opt,
        tls_key: Path | None = key_opt,
    ) -> None:
        import asyncio
        import datetime as dt
        import signal

        from fabricscope.cluster.membership import LeaseSettings, Membership

        lease_s = _lease(lease)
        auth = _auth(user, password, token, creds, tls_ca, tls_cert, tls_key)
        names = read_targets(targets)

        def line(what: str, target: str) -> None:
            ts = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            sys.stdout.write(f"{ts} {name} {what} {target}\n")
            sys.stdout.flush()

        m = Membership([u.strip() for u in nats_url.split(",") if u.strip()], name, names,
                       on_acquire=lambda t: line("acquire", t),
                       on_release=lambda t: line("release", t),
                       lease=LeaseSettings(lease_s=lease_s, members_bucket=members_bucket,
                                           owners_bucket=owners_bucket),
                       weight=weight, auth=auth)
        got: list[int] = []

        async def run() -> None:
            loop = asyncio.get_running_loop()
            done = asyncio.Event()

            def on_signal(code: int) -> None:
                got.append(code)
                done.set()

            for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
                loop.add_signal_handler(sig, on_signal, code)
            await m.start()
            typer.echo(f"member {name} joined ({len(names)} targets, lease {lease_s:g}s)",
                       err=True)
            while not done.is_set() and m.failed is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.5)
            await m.stop(deadline_s=max(5.0, lease_s))

        asyncio.run(run())
        if m.failed is not None:
            raise m.failed
        if got:
            typer.echo(f"member {name} left cleanly", err=True)
            raise typer.Exit(got[0])
