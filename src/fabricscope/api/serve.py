"""``fabricscope serve``: compose the console (twin supervisor, alert sinks, API, UI) and run it.

Credentials: the token comes from ``--token-file`` (created with a random token, mode 0600,
when it does not exist), else the environment variable ``token_env`` names, else
``$XDG_CONFIG_HOME/fabricscope/console.token`` (``~/.config/...``). The token is never
printed or logged; the startup line says which file holds it. Binding: loopback by default; another address needs TLS
(``--tls-cert/--tls-key``) or ``--insecure``, because the token would cross the network in
clear text otherwise.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricscope.api.app import ApiSettings, create_app
from fabricscope.api.server import TlsFiles, bind, serve_forever
from fabricscope.diagnosis.actions import check_mode
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.services import ConsoleServices, build_twin_console
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.console.twin_source import TwinSettings, TwinSupervisor
from fabricscope.service.supervise_twin import load_twin_fabric, parse_time_s
from fabricscope.telemetry.target import is_loopback

log = logging.getLogger("fabricscope.serve")

def default_token_file() -> Path:
    """``$XDG_CONFIG_HOME/fabricscope/console.token`` (``~/.config`` when unset)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "fabricscope" / "console.token"


@dataclass
class ServeOptions:
    """Everything ``serve`` takes (the CLI fills it)."""

    twin: str = "rail-optimized:servers=8"
    config: Path | None = None  # live sources (service/console/store_source.py)
    faults: Sequence[str] = ()
    speed: float = 1.0
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8765
    token_file: Path | None = None
    token_env: str = "FABRICSCOPE_TOKEN"
    user: str = "fabricscope"
    tls: TlsFiles | None = None
    insecure: bool = False
    public_url: str | None = None
    alertmanager: str | None = None
    webhook: str | None = None
    telemetry_db: Path | None = None
    actions: str = "off"  # off | approve | auto (diagnosis/actions.py)
    segment: str = "15s"
    warmup: str = "45s"
    extra: dict[str, Any] = field(default_factory=dict)


def load_token(opts: ServeOptions, echo: Callable[[str], None]) -> tuple[str, str]:
    """(token, where it came from); creates a token file when none exists."""
    if opts.token_file is None:
        env = os.environ.get(opts.token_env)
        if env:
            if len(env) < 16:
                raise ConfigError(f"${opts.token_env}: the token must have at least 16 "
                                  f"characters, it has {len(env)}")
            return env, f"${opts.token_env}"
    path = (opts.token_file or default_token_file()).expanduser()
    if path.exists():
        try:
            tok = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--token-file {path}: cannot read: {exc.strerror}") from None
        if len(tok) < 16:
            raise ConfigError(f"--token-file {path}: the token must have at least 16 "
                              f"characters, it has {len(tok)}")
        if path.stat().st_mode & 0o077:
            echo(f"warning: --token-file {path} is readable by other users (chmod 600 it)")
        return tok, str(path)
    tok = secrets.token_urlsafe(24)
    if opts.token_file is not None and not path.parent.is_dir():
        raise ConfigError(f"--token-file {path}: no such directory {path.parent}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # the default location's folders
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(tok + "\n")
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: cannot create: {exc.strerror}") from None
    echo(f"created a new API token in {path} (mode 600)")
    return tok, str(path)


def build(opts: ServeOptions, echo: Callable[[str], None]
          ) -> tuple[Any, ConsoleState, ConsoleServices, str]:
    """(app, state, services, token source), nothing started."""
    if not (0 <= opts.port <= 65535):
        raise ConfigError(f"--port: expected 0..65535, got {opts.port}")
    if not is_loopback(opts.host) and opts.tls is None and not opts.insecure:
        raise ConfigError(f"--host {opts.host}: not a loopback address and no TLS: the token "
                          "would cross the network in clear text; give --tls-cert/--tls-key, "
                          "or --insecure to serve anyway")
    if opts.tls is not None:
        opts.tls.check()
    actions = check_mode(opts.actions, source="--actions")
    if opts.config is not None:
        from fabricscope.service.console.services import build_live_console
        from fabricscope.service.console.store_source import read_live_config

        if opts.faults:
            raise ConfigError("--fault: faults are injected on the twin; with --config the "
                              "console follows live sources")
        cfg = read_live_config(opts.config)
        for note in cfg.notes:
            echo(f"note: --config {opts.config}: {note}")
        if actions != "off" and cfg.actions_gnmi is None:
            raise ConfigError(f"--actions {actions}: --config {opts.config} has no actions.gnmi "
                              "(the gnmi collect config naming the switches to act on)")
        token, where = load_token(opts, echo)
        state, svc = build_live_console(cfg)
        if actions != "off":
            from fabricscope.service.gnmi_executor import GnmiExecutor
            from fabricscope.telemetry.config import load_config

            assert cfg.actions_gnmi is not None
            executor = GnmiExecutor(state.fabric, load_config(cfg.actions_gnmi))
            state.configure_actions(executor, svc.kb, mode=actions)
    else:
        token, where = load_token(opts, echo)
        fabric = load_twin_fabric(opts.twin)
        settings = TwinSettings(speed=opts.speed, seed=opts.seed,
                                segment_s=parse_time_s(opts.segment, source="--segment"),
                                warmup_s=parse_time_s(opts.warmup, source="--warmup"))
        state, svc = build_twin_console(fabric, settings=settings,
                                        telemetry_db=opts.telemetry_db)
        sup = svc.supervisor
        assert isinstance(sup, TwinSupervisor)
        for i, f in enumerate(opts.faults):
            sup.inject(f, source=f"--fault {i + 1}")
        if actions != "off":
            from fabricscope.service.console.twin_executor import ConsoleTwinExecutor

            state.configure_actions(ConsoleTwinExecutor(sup), svc.kb, mode=actions)
    scheme = "https" if opts.tls is not None else "http"
    url = opts.public_url or f"{scheme}://{opts.host}:{opts.port}"
    _add_sinks(opts, state, svc, url)
    app = create_app(state, ApiSettings(token=token, user=opts.user, public_url=url), svc)
    return app, state, svc, where


def _add_sinks(opts: ServeOptions, state: ConsoleState, svc: ConsoleServices, url: str) -> None:
    if not (opts.alertmanager or opts.webhook):
        return
    from fabricscope.service.console import alerts

    made: list[tuple[str, Any]] = []
    if opts.alertmanager:
        # twin incidents carry simulated ns: the alert's wall times count from the start
        base = state.started_s if state.mode == "twin" else 0.0
        made.append(("alertmanager", alerts.AlertmanagerSink(
            opts.alertmanager, console_url=url, time_base_s=base, fabric=state.fabric.name)))
    if opts.webhook:
        made.append(("webhook", alerts.WebhookSink(opts.webhook, console_url=url)))
    for name, sink in made:
        svc.sinks[name] = sink
        state.subscribe(sink)
        if hasattr(sink, "start"):
            sink.start()
        svc.closers.append(_closer(sink))


def _closer(sink: Any) -> Callable[[], None]:
    def close() -> None:
        sink.close(5.0)
    return close


def run(opts: ServeOptions, echo: Callable[[str], None] = print) -> int:
    """Serve until interrupted; returns the exit code."""
    app, state, svc, where = build(opts, echo)
    sock = bind(opts.host, opts.port)
    port = sock.getsockname()[1]
    scheme = "https" if opts.tls is not None else "http"
    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    what = (f"live sources of {opts.config}, fabric {state.fabric.name}" if opts.config
            else f"twin {state.fabric.name}, {opts.speed:g}x real time")
    echo(f"fabricscope console on {scheme}://{shown}:{port}/ ({what}; API token in {where}; "
         "Ctrl-C stops)")
    assert svc.supervisor is not None
    svc.supervisor.start()
    t0 = time.monotonic()
    try:
        serve_forever(app, sock, opts.tls)
    finally:
        svc.close()
        echo(f"stopped after {time.monotonic() - t0:.0f} s: {state.snapshot()['incidents']} "
             f"incident(s), {state.snapshot()['findings']} finding(s)")
    return 0
