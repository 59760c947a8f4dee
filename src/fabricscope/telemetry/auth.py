"""Failed-login throttling for the gNMI target (pure: the clock is a parameter).

After ``free_failures`` consecutive failed logins from one client host, that host is locked
out for ``base_lockout_s``, doubling with every further failure up to ``max_lockout_s``
(the exponential back-off of OpenSSH's ``PerSourcePenalties`` and fail2ban's ``bantime.increment``).
While locked out, attempts are refused without checking the password, so a guesser gets a
handful of tries per lockout instead of thousands per second. A success resets the host.
The table of hosts is bounded (least recently seen dropped first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["LoginThrottle"]


@dataclass
class _Host:
    failures: int = 0
    locked_until: float = 0.0


class LoginThrottle:
    """Per-host failed-login counter with exponential lockout."""

    def __init__(self, *, free_failures: int = 5, base_lockout_s: float = 1.0, max_lockout_s: float = 60.0,
                 max_hosts: int = 4096) -> None:
        self.free_failures = free_failures
        self.base_lockout_s = base_lockout_s
        self.max_lockout_s = max_lockout_s
        self.max_hosts = max_hosts
        self._hosts: OrderedDict[str, _Host] = OrderedDict()

    def locked(self, host: str, now: float) -> float:
        """Seconds ``host`` stays locked out (0.0: it may try)."""
        h = self._hosts.get(host)
        return max(0.0, h.locked_until - now) if h is not None else 0.0

    def failure(self, host: str, now: float) -> tuple[int, float]:
        """Record a failed login; return (consecutive failures, lockout seconds now imposed)."""
        h = self._hosts.pop(host, None) or _Host()
        self._hosts[host] = h
        while len(self._hosts) > self.max_hosts:
            self._hosts.popitem(last=False)
        h.failures += 1
        over = h.failures - self.free_failures
        if over < 0:
            return h.failures, 0.0
        lock = min(self.max_lockout_s, self.base_lockout_s * 2.0 ** min(over, 62))
        h.locked_until = now + lock
        return h.failures, lock

    def success(self, host: str) -> None:
        self._hosts.pop(host, None)

    def __len__(self) -> int:
        return len(self._hosts)
