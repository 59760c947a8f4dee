"""Bearer-token / basic authentication for the console, throttled per client address.

Every request to ``/api/*`` and ``/metrics`` carries ``Authorization: Bearer TOKEN`` (RFC 6750)
or ``Authorization: Basic base64(user:TOKEN)`` (RFC 7617), compared in constant time
(:func:`hmac.compare_digest`). Failed logins go through the same
:class:`~fabricscope.telemetry.auth.LoginThrottle` the gNMI target uses: after
``max_failures`` consecutive failures an address is locked out for ``lockout_s``, doubling
with every further failure up to ``max_lockout_s``; while locked out it gets 429 with
``Retry-After`` even with the right token, so guessing is throttled; a success resets it.
Each failure is logged with the client address and the scheme used, never the credential.
A request with no credentials at all (a page before its login) is refused with 401 but is
not a failed login.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fabricscope.telemetry.auth import LoginThrottle

log = logging.getLogger("fabricscope.serve.auth")


@dataclass(frozen=True, slots=True)
class Verdict:
    """``ok``; else the HTTP status (401 / 429) and, for 429, seconds to wait."""

    ok: bool
    status: int = 200
    retry_after_s: int = 0
    reason: str = ""


class Authenticator:
    """Checks ``Authorization`` headers and throttles failing clients (see module doc)."""

    def __init__(self, token: str, *, user: str = "fabricscope", max_failures: int = 5,
                 lockout_s: float = 30.0, max_lockout_s: float = 900.0,
                 max_clients: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if len(token) < 16:
            raise ValueError("token: at least 16 characters")
        self._token = token.encode()
        self._basic = f"{user}:{token}".encode()
        self.clock = clock
        self.throttle = LoginThrottle(free_failures=max_failures, base_lockout_s=lockout_s,
                                      max_lockout_s=max_lockout_s, max_hosts=max_clients)
        self._lock = threading.Lock()
        self.failures = 0

    def _matches(self, header: str | None) -> tuple[bool, str]:
        if not header:
            return False, "none"
        scheme, _, cred = header.strip().partition(" ")
        scheme = scheme.lower()
        cred = cred.strip()
        if scheme == "bearer":
            return hmac.compare_digest(cred.encode(), self._token), "bearer"
        if scheme == "basic":
            try:
                raw = base64.b64decode(cred, validate=True)
            except (binascii.Error, ValueError):
                return False, "basic"
            return hmac.compare_digest(raw, self._basic), "basic"
        return False, "unknown scheme"

    def check(self, header: str | None, client: str) -> Verdict:
        """Decide one request from ``client`` (an address) with ``header``."""
        now = self.clock()
        with self._lock:
            wait = self.throttle.locked(client, now)
        if wait > 0:
            return Verdict(False, 429, math.ceil(wait), "too many failed logins")
        ok, scheme = self._matches(header)
        if ok:
            with self._lock:
                self.throttle.success(client)
            return Verdict(True)
        if scheme == "none":  # no credentials at all: not a login attempt, not throttled
            return Verdict(False, 401, 0, "credentials required")
        with self._lock:
            self.failures += 1
            n, lock = self.throttle.failure(client, now)
        log.warning("failed login from %s (%s credentials, %d in a row)%s", client, scheme, n,
                    f"; locked out for {lock:.0f} s" if lock else "")
        if lock:
            return Verdict(False, 429, math.ceil(lock), "too many failed logins")
        return Verdict(False, 401, 0, "missing or wrong credentials")
