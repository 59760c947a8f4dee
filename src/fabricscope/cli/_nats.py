"""The NATS connection flags shared by ``worker`` and ``probe agent --nats`` (one place)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fabricscope.cluster.bus import BusConfig


def bus_config(url: str, *, client_name: str, flag: str = "--nats", prefix: str = "--", user: str | None = None,
               password_env: str | None = None, token_env: str | None = None, creds: Path | None = None,
               tls_ca: Path | None = None, tls_cert: Path | None = None, tls_key: Path | None = None) -> BusConfig:
    """A :class:`BusConfig` from command-line flags; errors name the flag (``prefix`` + field:
    ``--user`` for ``worker``, ``--nats-user`` for ``probe agent``), never a secret."""
    from fabricscope.cluster.bus import BusConfig
    from fabricscope.model.errors import ConfigError

    token = None
    if token_env is not None:
        token = os.environ.get(token_env)
        if not token:
            raise ConfigError(f"{prefix}token-env: environment variable {token_env!r} is not set or empty")
    try:
        return BusConfig(url=url, user=user, password_env=password_env, token=token,
                         creds_file=str(creds) if creds else None, tls_ca=str(tls_ca) if tls_ca else None,
                         tls_cert=str(tls_cert) if tls_cert else None, tls_key=str(tls_key) if tls_key else None,
                         client_name=client_name)
    except ConfigError as exc:
        msg = str(exc).replace("bus: url:", f"{flag}:")
        for field, opt in (("password_env", "password-env"), ("creds_file", "creds"), ("tls_ca", "tls-ca"),
                           ("tls_cert", "tls-cert"), ("tls_key", "tls-key")):
            msg = msg.replace(f"bus: {field}", f"{prefix}{opt}")
        raise ConfigError(msg.replace("bus: ", prefix)) from None
