"""Target ownership across collectors: member leases and per-target claims in JetStream KV.

Edge module (nats-py, asyncio). The protocol is described in
``docs/design/cluster-membership.md``; in short:

- ``fs_members`` (history 1, TTL = lease): every member writes ``member.<name>`` every
  lease/3 by compare-and-set on its own last revision. A watch sees joins and clean leaves
  (delete markers) at once; a member whose heartbeat has not been *received* for a lease is
  dead. NATS 2.9 expires keys by the bucket's ``max_age`` without telling watchers, so expiry
  is judged here on the local monotonic clock, not by waiting for the key to vanish.
- ``fs_owners`` (history 1, TTL = lease): a member holds ``target.<name>`` by creating it (or
  updating it from the revision it saw, when the previous owner is dead or released it),
  renews every lease/3, and deletes it on release. Targets are the member's share of a
  weighted rendezvous hash over the live members (:mod:`fabricscope.cluster.ring`).
- Order of effects: a member calls ``on_release(target)`` *before* it deletes the claim, and
  ``on_acquire(target)`` only *after* its claim write succeeded. A member that cannot renew
  for ``lease - margin`` (measured from when it *sent* its last acknowledged write) stops the
  targets itself before anyone else may take them (Gray & Cheriton 1989, "Leases").

:class:`Membership` is the asyncio API; :class:`MembershipThread` runs it on a background
thread for synchronous callers (the gNMI collector). :func:`read_cluster_status` is the
read-only view behind ``fabricscope cluster status``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as _dt
import hashlib
import json
import logging
import re
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricscope.cluster.ring import assign
from fabricscope.model.errors import ConfigError, TransportError

__all__ = [
    "ClaimInfo",
    "ClusterStatus",
    "LeaseSettings",
    "MemberInfo",
    "Membership",
    "MembershipThread",
    "NatsAuth",
    "key_target",
    "read_cluster_status",
    "target_key",
]

log = logging.getLogger("fabricscope.cluster.membership")

Callback = Callable[[str], object]

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
_BUCKET_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_MAX_TARGETS = 200_000
_CAS_BATCH = 128  # concurrent KV writes in flight per member


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Lease timing shared by every member of a cluster (the buckets' TTL is ``lease_s``).

    ``heartbeat_s`` (default lease/3) is how often a member renews its member key and its
    claims; ``margin_s`` (default lease/6) is how long before the lease runs out a member that
    cannot renew stops its targets; ``settle_s`` (default one heartbeat) is how long a joining
    member listens before claiming, so members started together do not all claim everything.
    """

    lease_s: float = 3.0
    heartbeat_s: float | None = None
    margin_s: float | None = None
    settle_s: float | None = None
    members_bucket: str = "fs_members"
    owners_bucket: str = "fs_owners"

    @property
    def heartbeat(self) -> float:
        """Seconds between renewals."""
        return self.heartbeat_s if self.heartbeat_s is not None else self.lease_s / 3.0

    @property
    def margin(self) -> float:
        """Seconds before lease expiry at which a member that cannot renew self-fences."""
        return self.margin_s if self.margin_s is not None else self.lease_s / 6.0

    @property
    def settle(self) -> float:
        """Seconds a joining member listens before its first claim."""
        return self.settle_s if self.settle_s is not None else self.heartbeat

    def validate(self) -> LeaseSettings:
        """Raise :class:`ConfigError` unless heartbeat < lease - margin and names are valid."""
        if not (0.2 <= self.lease_s <= 3600.0):
            raise ConfigError(f"lease: {self.lease_s!r} s: must be within 0.2 .. 3600 s")
        if not (0.0 < self.margin < self.lease_s / 2):
            raise ConfigError(f"lease margin: {self.margin!r} s: must be in (0, lease/2)")
        if not (0.0 < self.heartbeat < self.lease_s - self.margin):
            raise ConfigError(f"heartbeat: {self.heartbeat!r} s: must be in (0, lease - margin)"
                              f" = (0, {self.lease_s - self.margin:g})")
        for b in (self.members_bucket, self.owners_bucket):
            if not _BUCKET_RE.fullmatch(b):
                raise ConfigError(f"bucket: {b!r}: use letters, digits, '-' and '_'")
        return self


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """How to authenticate to NATS; secrets never appear in ``repr`` or logs."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (TLS context built from the PEM files)."""
        kw: dict[str, Any] = {}
        if self.user is not None:
            kw["user"] = self.user
            kw["password"] = self.password or ""
        if self.token is not None:
            kw["token"] = self.token
        if self.creds is not None:
            if not self.creds.is_file():
                raise ConfigError(f"--creds: {str(self.creds)!r}: no such file")
            kw["user_credentials"] = str(self.creds)
        if self.tls_ca or self.tls_cert:
            try:
                ctx = ssl.create_default_context(
                    cafile=str(self.tls_ca) if self.tls_ca else None)
                if self.tls_cert:
                    ctx.load_cert_chain(str(self.tls_cert),
                                        str(self.tls_key) if self.tls_key else None)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"TLS files: {exc}") from exc
            kw["tls"] = ctx
        return kw


# --------------------------------------------------------------------------- keys / values


def target_key(target: str) -> str:
    """The ``fs_owners`` key of ``target``: ``target.<escaped>``, reversible by :func:`key_target`.

    Characters outside ``[A-Za-z0-9_-]`` (':' of port ids, '.', '/', ...) become ``=XX`` (UTF-8
    hex), so any name is one valid KV token.
    """
    out = []
    for ch in target:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"={b:02X}" for b in ch.encode("utf-8"))
    return "target." + "".join(out)


def key_target(key: str) -> str:
    """Inverse of :func:`target_key`."""
    body = key.removeprefix("target.")
    raw = bytearray()
    i = 0
    while i < len(body):
        if body[i] == "=" and i + 3 <= len(body):
            raw.append(int(body[i + 1:i + 3], 16))
            i += 3
        else:
            raw.extend(body[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8", errors="replace")


def _digest(targets: Sequence[str]) -> str:
    h = hashlib.sha256("\n".join(targets).encode("utf-8"))
    return h.hexdigest()[:12]


def _loads(data: bytes | None) -> dict[str, Any] | None:
    if not data:
        return None
    try:
        v = json.loads(data)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


# --------------------------------------------------------------------------- status records


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """One member as seen now: its lease age is the time since its last heartbeat."""

    name: str
    incarnation: str
    weight: float
    lease_age_s: float
    live: bool
    targets: int  # how many targets it was configured with
    digest: str  # hash of its target list: members that disagree show different digests


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """One claim in ``fs_owners``: the owner and the time since it was last written."""

    target: str
    owner: str
    incarnation: str
    lease_age_s: float
    live: bool  # the owner (this incarnation) is a live member


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """Members, claims and (when known) the target list, for ``fabricscope cluster status``."""

    lease_s: float
    members: tuple[MemberInfo, ...]
    claims: tuple[ClaimInfo, ...]
    targets: tuple[str, ...] | None = None

    def targets_per_member(self) -> dict[str, list[str]]:
        """Live member -> the targets it holds a live claim on."""
        out: dict[str, list[str]] = {m.name: [] for m in self.members if m.live}
        for c in self.claims:
            if c.live:
                out.setdefault(c.owner, []).append(c.target)
        return {m: sorted(ts) for m, ts in out.items()}

    def unowned(self) -> list[str]:
        """Targets without a live owner: stale claims, plus known targets with no claim."""
        held = {c.target for c in self.claims if c.live}
        names = {c.target for c in self.claims} | set(self.targets or ())
        return sorted(names - held)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``--json``)."""
        per = self.targets_per_member()
        return {
            "lease_s": self.lease_s,
            "members": [
                {"name": m.name, "incarnation": m.incarnation, "weight": m.weight,
                 "lease_age_s": round(m.lease_age_s, 3), "live": m.live,
                 "configured_targets": m.targets, "targets_digest": m.digest,
                 "owned": len(per.get(m.name, []))}
                for m in self.members],
            "owners": {c.target: c.owner for c in self.claims if c.live},
            "claim_ages_s": {c.target: round(c.lease_age_s, 3) for c in self.claims},
            "unowned": self.unowned(),
        }


# --------------------------------------------------------------------------- internals


@dataclass(slots=True)
class _Seen:
    inc: str
    weight: float
    ntargets: int
    digest: str
    recv: float  # local monotonic time the latest heartbeat was received


@dataclass(slots=True)
class _Claim:
    owner: str
    inc: str
    rev: int
    recv: float


@dataclass(slots=True)
class _Held:
    rev: int
    ok_send: float  # monotonic time the last acknowledged write of this claim was sent


class _RateLimitedLog:
    """One log line per condition per interval (a page of retries helps nobody)."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self._last: dict[str, float] = {}
        self._interval = interval_s

    def warn(self, key: str, msg: str) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -1e18) >= self._interval:
            self._last[key] = now
            log.warning(msg)


def _wrong_last(exc: BaseException) -> bool:
    import nats.js.errors as jse

    return isinstance(exc, jse.KeyWrongLastSequenceError)


async def _connect(servers: str | Sequence[str], auth: NatsAuth, *, name: str,
                   connect_timeout_s: float = 2.0, rl: _RateLimitedLog | None = None,
                   closing: Callable[[], bool] = lambda: False,
                   on_disconnect: Callable[[], None] | None = None,
                   on_reconnect: Callable[[], None] | None = None) -> Any:
    import nats

    rl = rl or _RateLimitedLog()
    urls = [servers] if isinstance(servers, str) else list(servers)
    where = ", ".join(urls)

    nc_box: list[Any] = []
    first: list[Exception] = []  # errors of the first connect go into its one error line

    async def _err(exc: Exception) -> None:
        if nc_box:
            rl.warn("nats-error", f"NATS {where}: {type(exc).__name__}: {exc}")
        else:
            first.append(exc)

    async def _disc() -> None:
        if on_disconnect is not None:
            on_disconnect()
        if closing():
            return
        rl.warn("nats-disconnected", f"NATS {where}: disconnected, reconnecting")

    async def _reconn() -> None:
        if on_reconnect is not None:
            on_reconnect()

    try:
        # A bounded first connect (an unreachable URL is an error, not a hang), then
        # reconnect forever: a running member must come back, and its fence keeps it safe.
        nc = await nats.connect(
            servers=urls, name=name, connect_timeout=connect_timeout_s,
            max_reconnect_attempts=2, reconnect_time_wait=0.5, allow_reconnect=True,
            error_cb=_err, disconnected_cb=_disc, reconnected_cb=_reconn, **auth.connect_kwargs())
        nc.options["max_reconnect_attempts"] = -1
        nc_box.append(nc)
        return nc
    except ConfigError:
        raise
    except Exception as exc:  # NoServersError, OSError, TimeoutError, auth errors
        why = first[-1] if first else exc
        raise TransportError(f"cannot connect to NATS at {where}: "
                             f"{type(why).__name__}: {why or 'no server answered'}") from exc


async def _bucket(js: Any, bucket: str, lease_s: float, *, create: bool) -> Any:
    """Open (or create) a KV bucket with history 1 and TTL = lease; a TTL mismatch is an error."""
    import nats.errors
    import nats.js.errors as jse

    try:
        kv = await js.key_value(bucket)
    except jse.BucketNotFoundError:
        if not create:
            raise TransportError(f"no cluster here: KV bucket {bucket!r} does not exist "
                                 "(no member has joined yet)") from None
        try:
            return await js.create_key_value(bucket=bucket, history=1, ttl=lease_s)
        except jse.APIError:  # another member created it first
            kv = await js.key_value(bucket)
    except nats.errors.NoRespondersError as exc:
        raise TransportError("NATS has no JetStream (start nats-server with -js)") from exc
    if create:
        ttl = (await kv.status()).ttl
        if ttl is None or abs(float(ttl) - lease_s) > 1e-3:
            raise ConfigError(f"--lease: {lease_s:g}s: KV bucket {bucket!r} has TTL {ttl}s; "
                              "every member of a cluster must use the same lease")
    return kv


async def _snapshot(kv: Any) -> list[Any]:
    """Every current entry of a bucket (last value per key, delete markers included)."""
    w = await kv.watchall()
    out: list[Any] = []
    try:
        while True:
            e = await w.updates(timeout=5.0)
            if e is None:
                break
            out.append(e)
    finally:
        with contextlib.suppress(Exception):
            await w.stop()
    return out


# --------------------------------------------------------------------------- Membership


class Membership:
    """One collector's membership: heartbeat, watch, ring, claims, callbacks (asyncio).

    Parameters
    ----------
    servers:
        NATS URL(s), e.g. ``nats://127.0.0.1:4222``.
    name:
        This member's name (``[A-Za-z0-9_-]``); unique in the cluster.
    targets:
        The target names to share out; every member should be given the same list (a
        member's digest of it is published so ``cluster status`` shows disagreement).
    on_acquire, on_release:
        Called with a target name, in order, on one dedicated thread, so they may block
        (start / stop a gNMI subscription). ``on_release`` returns before the claim is
        deleted; ``on_acquire`` runs only after the claim write succeeded.
    lease:
        :class:`LeaseSettings`; all members of a cluster must agree on ``lease_s``.
    weight:
        Relative capacity; a member's expected share is ``weight / sum(weights)``.
    auth:
        :class:`NatsAuth` (user/password, token, creds file, TLS).

    Notes
    -----
    Failover bound (a member dies): ``lease`` (the others stop receiving heartbeats at most
    one heartbeat before the death, so detection takes ``lease - heartbeat .. lease``) plus
    one reconcile tick plus a compare-and-set round trip plus ``on_acquire``.
    """

    def __init__(self, servers: str | Sequence[str], name: str, targets: Iterable[str], *,
                 on_acquire: Callback | None = None, on_release: Callback | None = None,
                 lease: LeaseSettings | None = None, weight: float = 1.0,
                 auth: NatsAuth | None = None, tick_s: float = 0.25) -> None:
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(f"--name: {name!r}: use 1-128 letters, digits, '-' or '_'")
        if not (weight > 0.0 and weight < float("inf")):
            raise ConfigError(f"--weight: {weight!r}: must be a positive number")
        self.name = name
        self.lease = (lease or LeaseSettings()).validate()
        tlist = sorted(set(targets))
        if len(tlist) > _MAX_TARGETS:
            raise ConfigError(f"targets: {len(tlist)}: at most {_MAX_TARGETS} per cluster")
        self.targets: tuple[str, ...] = tuple(tlist)
        self.weight = float(weight)
        self.incarnation = uuid.uuid4().hex[:12]
        self._servers = servers
        self._auth = auth or NatsAuth()
        self._on_acquire = on_acquire
        self._on_release = on_release
        self._tick = tick_s
        self._digest = _digest(self.targets)
        self._rl = _RateLimitedLog()

        self._nc: Any = None
        self._kv_m: Any = None
        self._kv_o: Any = None
        self._members: dict[str, _Seen] = {}
        self._blind_since: float | None = None  # monotonic time this member lost the bus
        self._claims: dict[str, _Claim] = {}
        self._held: dict[str, _Held] = {}
        self._hb_rev = 0
        self._hb_ok_send: float | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._failed: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watchers: list[Any] = []
        self._cb_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"fs-member-{name}")
        self._last_live: tuple[tuple[str, str], ...] = ()
        self._started = False
        self._main_task: asyncio.Task[None] | None = None
        self._settled = False

    # ---------------------------------------------------------------- public API

    @property
    def failed(self) -> BaseException | None:
        """The error that stopped this member (a name clash), or ``None``."""
        return self._failed

    def held(self) -> frozenset[str]:
        """The targets this member holds now (its ``on_acquire`` ran, ``on_release`` did not)."""
        return frozenset(self._held)

    async def start(self) -> None:
        """Connect, open the buckets, load both watches, take the member key, start the loops.

        Raises :class:`TransportError` when NATS is unreachable and :class:`ConfigError` when
        the buckets disagree on the lease or a live member already uses this name.
        """
        self._wake = asyncio.Event()
        self._nc = await _connect(self._servers, self._auth, name=f"fabricscope-{self.name}",
                                  rl=self._rl, closing=lambda: self._stopping,
                                  on_disconnect=self._on_disconnect, on_reconnect=self._on_reconnect)
        try:
            js = self._nc.jetstream(timeout=max(2.0, self.lease.heartbeat))
            self._kv_m = await _bucket(js, self.lease.members_bucket, self.lease.lease_s,
                                       create=True)
            self._kv_o = await _bucket(js, self.lease.owners_bucket, self.lease.lease_s,
                                       create=True)
            loaded_m, loaded_o = asyncio.Event(), asyncio.Event()
            self._tasks.append(asyncio.create_task(self._watch(self._kv_m, self._on_member,
                                                               loaded_m)))
            self._tasks.append(asyncio.create_task(self._watch(self._kv_o, self._on_claim,
                                                               loaded_o)))
            await asyncio.wait_for(asyncio.gather(loaded_m.wait(), loaded_o.wait()), 10.0)
            await self._join()
            self._tasks.append(asyncio.create_task(self._heartbeat_loop()))
            self._tasks.append(asyncio.create_task(self._fence_loop()))
            self._main_task = asyncio.create_task(self._main_loop())
            self._tasks.append(self._main_task)
            self._started = True
        except BaseException:
            await self._teardown()
            raise

    async def stop(self, *, deadline_s: float = 5.0) -> None:
        """Clean leave within ``deadline_s``: on_release + delete every claim, then the member key.

        Claims go first so nobody takes a target this member still streams; once the member
        key's delete marker arrives, the others take the released targets at once.
        """
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        try:
            await asyncio.wait_for(self._quiesce_then_leave(), deadline_s)
        except TimeoutError:
            self._rl.warn("stop-deadline", f"member {self.name}: clean leave exceeded "
                          f"{deadline_s:g}s; the leases expire in {self.lease.lease_s:g}s")
        finally:
            await self._teardown()

    def status(self) -> ClusterStatus:
        """Members, owner of every claimed target and lease ages, from this member's view."""
        now = time.monotonic()
        live = self._live(now)
        members = tuple(
            MemberInfo(n, s.inc, s.weight, now - s.recv, live.get(n) == s.inc, s.ntargets,
                       s.digest)
            for n, s in sorted(self._members.items()))
        claims = tuple(
            ClaimInfo(t, c.owner, c.inc, now - c.recv, live.get(c.owner) == c.inc)
            for t, c in sorted(self._claims.items()))
        return ClusterStatus(self.lease.lease_s, members, claims, self.targets)

    # ---------------------------------------------------------------- join / leave

    def _member_value(self) -> bytes:
        return json.dumps({"v": 1, "name": self.name, "inc": self.incarnation,
                           "weight": self.weight, "targets": len(self.targets),
                           "digest": self._digest}).encode()

    def _claim_value(self) -> bytes:
        return json.dumps({"v": 1, "owner": self.name, "inc": self.incarnation}).encode()

    async def _join(self) -> None:
        """Create ``member.<name>``; if another incarnation holds it, wait out its lease.

        A key rewritten while we wait belongs to a live process: that is a name clash.
        """
        import nats.js.errors as jse

        key = f"member.{self.name}"
        deadline = time.monotonic() + self.lease.lease_s + self.lease.heartbeat
        seen_rev: int | None = None
        while True:
            send = time.monotonic()
            try:
                self._hb_rev = await self._kv_m.create(key, self._member_value())
                self._hb_ok_send = send
                return
            except jse.KeyWrongLastSequenceError:
                pass
            try:
                e = await self._kv_m.get(key)
            except (jse.KeyNotFoundError, jse.KeyDeletedError):
                continue
            if seen_rev is not None and e.revision != seen_rev:
                raise ConfigError(f"--name: {self.name!r}: a live member already uses this "
                                  "name (its heartbeat keeps changing)")
            seen_rev = e.revision
            if time.monotonic() >= deadline:  # stale: the previous incarnation is dead
                try:
                    self._hb_rev = await self._kv_m.update(key, self._member_value(),
                                                           last=seen_rev)
                    self._hb_ok_send = send
                    return
                except jse.KeyWrongLastSequenceError:
                    continue
            await asyncio.sleep(self.lease.heartbeat / 2)

    async def _quiesce_then_leave(self) -> None:
        # Let a reconcile pass in flight finish first, so nothing is acquired behind _leave.
        if self._main_task is not None and not self._main_task.done():
            if not self._settled:  # still listening before its first claim: nothing to finish
                self._main_task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._main_task
        await self._leave()

    async def _leave(self) -> None:
        import nats.js.errors as jse

        for t in sorted(self._held):
            await self._call(self._on_release, t)
        held, self._held = self._held, {}
        await self._gather(self._kv_o.delete(target_key(t), last=h.rev)
                           for t, h in held.items())
        with contextlib.suppress(jse.Error, asyncio.TimeoutError, TimeoutError):
            await self._kv_m.delete(f"member.{self.name}", last=self._hb_rev)

    async def _teardown(self) -> None:
        self._stopping = True
        for tsk in self._tasks:
            tsk.cancel()
        for tsk in self._tasks:
            with contextlib.suppress(BaseException):
                await tsk
        self._tasks.clear()
        for w in self._watchers:
            with contextlib.suppress(Exception):
                await w.stop()
        self._watchers.clear()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.drain(), 2.0)
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None
        self._cb_pool.shutdown(wait=True)

    # ---------------------------------------------------------------- watches

    async def _watch(self, kv: Any, handle: Callable[[Any], None], loaded: asyncio.Event
                     ) -> None:
        w = await kv.watchall()
        self._watchers.append(w)
        async for e in w:  # ends when the watcher is stopped
            if e is None:  # the "initial values delivered" marker
                loaded.set()
                continue
            handle(e)

    def _on_member(self, e: Any) -> None:
        name = e.key.removeprefix("member.")
        if e.operation in ("DEL", "PURGE"):
            if self._members.pop(name, None) is not None:
                self._wake.set()
            return
        v = _loads(e.value)
        if v is None or not isinstance(v.get("inc"), str):
            self._rl.warn(f"bad-member-{name}", f"ignoring malformed member key {e.key!r}")
            return
        if name == self.name and v["inc"] != self.incarnation and self._started:
            self._rl.warn("name-clash", f"member {self.name}: another process wrote "
                          f"member.{self.name} (incarnation {v['inc']})")
        prev = self._members.get(name)
        try:
            weight = float(v.get("weight", 1.0))
        except (TypeError, ValueError):
            weight = 1.0
        weight = weight if 0.0 < weight < float("inf") else 1.0
        self._members[name] = _Seen(v["inc"], weight, int(v.get("targets", 0) or 0),
                                    str(v.get("digest", "")), time.monotonic())
        if prev is None or prev.inc != v["inc"] or prev.weight != weight:
            self._wake.set()

    def _on_claim(self, e: Any) -> None:
        t = key_target(e.key)
        if e.operation in ("DEL", "PURGE"):
            self._claims.pop(t, None)
            self._wake.set()
            return
        v = _loads(e.value)
        if v is None or not isinstance(v.get("owner"), str):
            self._rl.warn(f"bad-claim-{t}", f"ignoring malformed claim {e.key!r}")
            return
        prev = self._claims.get(t)
        self._claims[t] = _Claim(v["owner"], str(v.get("inc", "")), int(e.revision),
                                 time.monotonic())
        if prev is None or prev.owner != v["owner"]:
            self._wake.set()

    # ---------------------------------------------------------------- liveness

    def _on_disconnect(self) -> None:
        if self._blind_since is None:
            self._blind_since = time.monotonic()

    def _on_reconnect(self) -> None:
        """A peer is judged dead only on silence this member saw while connected: the time
        it was cut off from the bus (a NATS restart, a partition of this member) does not
        count against the others. Without this, every member would take every other's
        targets after an outage longer than the lease. Safety does not depend on it: claims
        are compare-and-set and a member that lost the bus fences itself."""
        if self._blind_since is None:
            return
        blind = time.monotonic() - self._blind_since
        self._blind_since = None
        for seen in self._members.values():
            seen.recv += blind
        self._wake.set()

    def _fenced(self, now: float) -> bool:
        return self._hb_ok_send is None or (
            now - self._hb_ok_send > self.lease.lease_s - self.lease.margin)

    def _live(self, now: float) -> dict[str, str]:
        """Live member name -> incarnation: heartbeat received within the lease."""
        live = {n: s.inc for n, s in self._members.items()
                if now - s.recv <= self.lease.lease_s and n != self.name}
        if not self._stopping and not self._fenced(now):
            live[self.name] = self.incarnation
        return live

    def _next_expiry(self, now: float) -> float:
        nxt = [s.recv + self.lease.lease_s - now for n, s in self._members.items()
               if n != self.name and now - s.recv <= self.lease.lease_s]
        return max(0.005, min([self._tick, *[x + 0.005 for x in nxt]]))

    # ---------------------------------------------------------------- loops

    async def _heartbeat_loop(self) -> None:
        import nats.js.errors as jse

        key = f"member.{self.name}"
        while not self._stopping:
            send = time.monotonic()
            try:
                self._hb_rev = await self._kv_m.update(key, self._member_value(),
                                                       last=self._hb_rev)
                self._hb_ok_send = send
            except jse.KeyWrongLastSequenceError:
                await self._heartbeat_conflict(key, send)
            except Exception as exc:
                self._rl.warn("heartbeat", f"member {self.name}: heartbeat failed: "
                              f"{type(exc).__name__}: {exc}")
            if self._failed is not None:
                return
            await asyncio.sleep(max(0.0, self.lease.heartbeat - (time.monotonic() - send)))

    async def _heartbeat_conflict(self, key: str, send: float) -> None:
        """Our member key changed under us: it expired (rejoin) or another process took it."""
        import nats.js.errors as jse

        try:
            e = await self._kv_m.get(key)
            v = _loads(e.value) or {}
            if v.get("inc") != self.incarnation:
                self._failed = ConfigError(
                    f"--name: {self.name!r}: another member took this name "
                    f"(incarnation {v.get('inc')!r}); stopping")
                self._hb_ok_send = None  # fence: stop every target now
                self._wake.set()
                return
            self._hb_rev = int(e.revision)
        except (jse.KeyNotFoundError, jse.KeyDeletedError):
            # Our key expired (we were silent for a lease): the others may have taken our
            # targets; the fence already stopped them. Rejoin.
            self._hb_rev = await self._kv_m.create(key, self._member_value())
            self._hb_ok_send = send
            self._rl.warn("rejoin", f"member {self.name}: lease had expired; rejoined")

    async def _main_loop(self) -> None:
        await asyncio.sleep(self.lease.settle)
        self._settled = True
        next_renew = time.monotonic() + self.lease.heartbeat
        while not self._stopping:
            try:
                if time.monotonic() >= next_renew:
                    next_renew = time.monotonic() + self.lease.heartbeat
                    await self._renew()
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._rl.warn("reconcile", f"member {self.name}: {type(exc).__name__}: {exc}")
            if self._stopping:
                return
            self._wake.clear()
            timeout = min(self._next_expiry(time.monotonic()),
                          max(0.005, next_renew - time.monotonic()))
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _renew(self) -> None:
        """Rewrite every held claim from its last revision; a lost CAS means it was taken."""
        items = list(self._held.items())
        sends = time.monotonic()
        results = await self._gather(
            self._kv_o.update(target_key(t), self._claim_value(), last=h.rev) for t, h in items)
        for (t, h), r in zip(items, results, strict=True):
            if t not in self._held or self._held[t] is not h:
                continue
            if isinstance(r, int):
                self._held[t] = _Held(r, sends)
            elif _wrong_last(r):
                self._rl.warn(f"lost-{t}", f"member {self.name}: claim on {t} was taken over")
                del self._held[t]
                await self._call(self._on_release, t)

    async def _fence(self) -> None:
        """Stop whatever could not be renewed in time, before anyone else may take it."""
        now = time.monotonic()
        limit = self.lease.lease_s - self.lease.margin
        if self._fenced(now) or self._failed is not None:
            stale = sorted(self._held)
        else:
            stale = sorted(t for t, h in self._held.items() if now - h.ok_send > limit)
        if stale:
            self._rl.warn("fence", f"member {self.name}: could not renew for {limit:g}s; "
                          f"stopping {len(stale)} target(s) before the lease runs out")
        for t in stale:
            if self._held.pop(t, None) is not None:
                await self._call(self._on_release, t)

    async def _fence_loop(self) -> None:
        # Its own task: the reconcile task may sit in a KV write that times out (a
        # partition), and the fence must fire on time regardless.
        step = min(self._tick, self.lease.margin / 3)
        while not self._stopping:
            await self._fence()
            await asyncio.sleep(step)

    async def _reconcile(self) -> None:
        await self._fence()
        now = time.monotonic()
        if self._failed is not None:
            self._stopping = True
            return
        live = self._live(now)
        key = tuple(sorted(live.items()))
        if key != self._last_live:
            self._last_live = key
            log.info("member %s: live members %s", self.name, sorted(live))
        if self.name not in live:
            return
        weights = {n: (self._members[n].weight if n in self._members else 1.0) for n in live}
        weights[self.name] = self.weight
        mine = set(assign(self.targets, live, weights=weights).get(self.name, ()))
        # 2. Release first (stop, then delete the claim) ...
        drop = sorted(set(self._held) - mine)
        dropped: list[tuple[str, _Held]] = []
        for t in drop:
            h = self._held.pop(t)
            await self._call(self._on_release, t)
            dropped.append((t, h))
        if dropped:
            await self._gather(self._kv_o.delete(target_key(t), last=h.rev) for t, h in dropped)
        # 3. ... then claim what is ours and free (absent, released, or its owner is dead).
        todo: list[tuple[str, int | None]] = []
        for t in sorted(mine - set(self._held)):
            c = self._claims.get(t)
            if c is None:
                todo.append((t, None))
            elif live.get(c.owner) == c.inc and c.owner != self.name:
                continue  # a live owner: it releases when it sees the new ring
            else:
                todo.append((t, c.rev))
        if not todo:
            return
        send = time.monotonic()
        results = await self._gather(
            (self._kv_o.create(target_key(t), self._claim_value()) if rev is None else
             self._kv_o.update(target_key(t), self._claim_value(), last=rev))
            for t, rev in todo)
        retry: list[str] = []
        for (t, _), r in zip(todo, results, strict=True):
            if isinstance(r, int) and not self._stopping and not self._fenced(time.monotonic()):
                self._held[t] = _Held(r, send)
                await self._call(self._on_acquire, t)
            elif isinstance(r, int):  # stopping or fenced meanwhile: give it back unused
                await self._gather([self._kv_o.delete(target_key(t), last=r)])
            else:
                retry.append(t)
        if retry:
            await self._refresh(retry)

    async def _refresh(self, targets: list[str]) -> None:
        """Re-read claims whose compare-and-set failed (the watch may lag, or a key expired)."""
        import nats.js.errors as jse

        async def one(t: str) -> None:
            try:
                e = await self._kv_o.get(target_key(t))
            except (jse.KeyNotFoundError, jse.KeyDeletedError):
                self._claims.pop(t, None)
                return
            self._on_claim(e)

        await self._gather(one(t) for t in targets)
        self._wake.set()

    # ---------------------------------------------------------------- helpers

    async def _gather(self, coros: Iterable[Any]) -> list[Any]:
        """Run KV writes with bounded concurrency; exceptions are returned, not raised."""
        out: list[Any] = []
        batch: list[Any] = []
        for c in coros:
            batch.append(c)
            if len(batch) >= _CAS_BATCH:
                out.extend(await asyncio.gather(*batch, return_exceptions=True))
                batch = []
        if batch:
            out.extend(await asyncio.gather(*batch, return_exceptions=True))
        return out

    async def _call(self, cb: Callback | None, target: str) -> None:
        if cb is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._cb_pool, cb, target)
        except Exception as exc:
            self._rl.warn(f"cb-{target}", f"member {self.name}: callback for {target} failed: "
                          f"{type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- thread wrapper


class MembershipThread:
    """Run a :class:`Membership` on its own asyncio thread, for synchronous callers.

    ``start()`` returns once the member has joined (or raises what ``Membership.start``
    raised); ``stop()`` leaves cleanly within its deadline. Callbacks run on the member's
    callback thread, as with :class:`Membership`.
    """

    def __init__(self, servers: str | Sequence[str], name: str, targets: Iterable[str],
                 **kwargs: Any) -> None:
        self._args = (servers, name, list(targets))
        self._kwargs = kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._member: Membership | None = None
        self._thread: threading.Thread | None = None
        self._joined = threading.Event()
        self._error: BaseException | None = None
        self._stop_req: asyncio.Event | None = None

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the thread and wait until joined; raises the start error, if any."""
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"fs-membership-{self._args[1]}")
        self._thread.start()
        if not self._joined.wait(timeout_s):
            raise TransportError(f"member {self._args[1]}: not joined within {timeout_s:g}s")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop_req = asyncio.Event()
            self._member = Membership(*self._args, **self._kwargs)
            try:
                await self._member.start()
            except BaseException as exc:
                self._error = exc
                self._joined.set()
                return
            self._joined.set()
            await self._stop_req.wait()
            await self._member.stop(deadline_s=self._deadline)

        self._deadline = 5.0
        asyncio.run(main())

    def stop(self, *, deadline_s: float = 5.0) -> None:
        """Leave cleanly (release every target) within ``deadline_s`` and join the thread."""
        self._deadline = deadline_s
        if self._loop is not None and self._stop_req is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop_req.set)
            self._thread.join(deadline_s + 3.0)

    def held(self) -> frozenset[str]:
        """The targets held now."""
        return self._member.held() if self._member is not None else frozenset()

    def status(self) -> ClusterStatus:
        """The member's :meth:`Membership.status`, read on its own loop."""
        if self._member is None or self._loop is None:
            raise TransportError("member not started")

        async def snap() -> ClusterStatus:
            assert self._member is not None
            return self._member.status()

        return asyncio.run_coroutine_threadsafe(snap(), self._loop).result(5.0)


# --------------------------------------------------------------------------- read-only status


async def read_cluster_status(servers: str | Sequence[str], *, auth: NatsAuth | None = None,
                              members_bucket: str = "fs_members",
                              owners_bucket: str = "fs_owners",
                              targets: Iterable[str] | None = None) -> ClusterStatus:
    """Read both buckets once and say who is live and who owns what (creates nothing).

    Lease ages come from the server's stored timestamps against this host's clock, so they
    are as good as the clocks' agreement (NTP); liveness is "age <= bucket TTL".
    """
    nc = await _connect(servers, auth or NatsAuth(), name="fabricscope-cluster-status")
    try:
        js = nc.jetstream(timeout=5.0)
        kv_m = await _bucket(js, members_bucket, 0.0, create=False)
        kv_o = await _bucket(js, owners_bucket, 0.0, create=False)
        lease = float((await kv_m.status()).ttl or 0.0)
        now = _dt.datetime.now(_dt.UTC)

        def age(e: Any) -> float:
            c = e.created
            return max(0.0, (now - c).total_seconds()) if isinstance(c, _dt.datetime) else 0.0

        members: list[MemberInfo] = []
        live: dict[str, str] = {}
        for e in await _snapshot(kv_m):
            v = _loads(e.value)
            if e.operation in ("DEL", "PURGE") or v is None:
                continue
            a = age(e)
            ok = lease <= 0.0 or a <= lease
            name = e.key.removeprefix("member.")
            members.append(MemberInfo(name, str(v.get("inc", "")),
                                      float(v.get("weight", 1.0) or 1.0), a, ok,
                                      int(v.get("targets", 0) or 0), str(v.get("digest", ""))))
            if ok:
                live[name] = str(v.get("inc", ""))
        claims: list[ClaimInfo] = []
        for e in await _snapshot(kv_o):
            v = _loads(e.value)
            if e.operation in ("DEL", "PURGE") or v is None:
                continue
            owner, inc = str(v.get("owner", "")), str(v.get("inc", ""))
            claims.append(ClaimInfo(key_target(e.key), owner, inc, age(e),
                                    live.get(owner) == inc))
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return ClusterStatus(lease, tuple(sorted(members, key=lambda m: m.name)),
                         tuple(sorted(claims, key=lambda c: c.target)),
                         tuple(sorted(set(targets))) if targets is not None else None)
