"""Bearer-token / basic authentication with failed-login throttling for the console.

Every request to ``/api/*`` and ``/metrics`` carries ``Authorization: Bearer TOKEN`` (RFC 6750)
or ``Authorization: Basic base64(user:TOKEN)`` (RFC 7617). Comparison is constant-time
(:func:`hmac.compare_digest`). Failures are counted per client address over a sliding
``window_s``; past ``max_failures`` the client is refused with 429 and ``Retry-After`` for
``lockout_s`` (doubling on each further lockout, up to ``max_lockout_s``), even with the right
token, so guessing is throttled. Each failure is logged with the client address and the
scheme used, never the credential. A request with no credentials at all (a page before
its login) is refused with 401 but is not a failed login. The failure table is bounded (``max_clients``; the oldest
entries go first).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

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
                 window_s: float = 60.0, lockout_s: float = 30.0, max_lockout_s: float = 900.0,
                 max_clients: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if len(token) < 16:
            raise ValueError("token: at least 16 characters")
        self._token = token.encode()
        self._basic = f"{user}:{token}".encode()
        self.max_failures = max_failures
        self.window_s = window_s
        self.lockout_s = lockout_s
        self.max_lockout_s = max_lockout_s
        self.max_clients = max_clients
        self.clock = clock
        self._lock = threading.Lock()
        self._fails: OrderedDict[str, deque[float]] = OrderedDict()
        self._locked: dict[str, tuple[float, float]] = {}  # client -> (until, last lockout)
        self.failures = 0
        self.lockouts = 0

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
            lk = self._locked.get(client)
            if lk is not None and now < lk[0]:
                return Verdict(False, 429, int(lk[0] - now) + 1, "too many failed logins")
        ok, scheme = self._matches(header)
        if ok:
            return Verdict(True)
        if scheme == "none":  # no credentials at all: not a login attempt, not throttled
            return Verdict(False, 401, 0, "credentials required")
        with self._lock:
            self.failures += 1
            q = self._fails.setdefault(client, deque())
            self._fails.move_to_end(client)
            q.append(now)
            while q and q[0] < now - self.window_s:
                q.popleft()
            n = len(q)
            while len(self._fails) > self.max_clients:
                self._fails.popitem(last=False)
            locked = n >= self.max_failures
            if locked:
                prev = self._locked.get(client)
                dur = self.lockout_s if prev is None else min(self.max_lockout_s, prev[1] * 2)
                self._locked[client] = (now + dur, dur)
                if len(self._locked) > self.max_clients:
                    for k in [k for k, v in self._locked.items() if v[0] < now]:
                        del self._locked[k]
                self.lockouts += 1
                q.clear()
        log.warning("failed login from %s (%s credentials, %d in %.0f s)%s", client, scheme, n,
                    self.window_s, f"; locked out for {dur:.0f} s" if locked else "")
        if locked:
            return Verdict(False, 429, int(dur) + 1, "too many failed logins")
        return Verdict(False, 401, 0, "missing or wrong credentials")
