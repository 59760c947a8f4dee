"""Collector output to long-term storage over Prometheus Remote-Write 1.0 (protobuf + snappy).

Follows the Prometheus Remote-Write 1.0 specification
(https://prometheus.io/docs/specs/remote_write_spec/): each request is a ``WriteRequest``
(:mod:`fabricscope.telemetry.prompb`) compressed with the snappy *block* format, POSTed with
``Content-Encoding: snappy``, ``Content-Type: application/x-protobuf``,
``X-Prometheus-Remote-Write-Version: 0.1.0`` and a ``User-Agent``. Every series carries
``__name__``, labels sorted by name and samples sorted by timestamp; 5xx, 429 and connection
errors are retried with exponential backoff and jitter, other 4xx are never retried (the
receiver will not change its mind) and their samples are counted as rejected.

The collector never waits on the receiver: :meth:`RemoteWriteSink.write` converts the batch
and appends it to a bounded queue (samples and estimated bytes); when the queue is full the
*oldest* samples are dropped and counted (fresh data is worth more to an operator than old
data, the same choice Prometheus' own WAL-less agents make). One background thread takes at
most ``max_samples_per_send`` samples per request. :meth:`RemoteWriteSink.close` flushes what
is queued within a deadline and counts what it could not deliver.

Names follow the Prometheus exposition of :mod:`fabricscope.telemetry.prometheus`
(:func:`~fabricscope.telemetry.prometheus.metric_name`): ``/interfaces/interface/state/
counters/in-octets`` -> ``gnmi_interfaces_interface_state_counters_in_octets``, labels from
``target`` and the event tags. Numbers only: bools are 0/1, strings are skipped and counted.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import itertools
import logging
import math
import os
import random
import re
import ssl
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cramjam

from fabricscope import __version__
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.prometheus import MetricSample, _label, metric_name, severity_of
from fabricscope.telemetry.selfmetrics import RateLimitedLog

__all__ = [
    "USER_AGENT",
    "RemoteWriteOptions",
    "RemoteWriteSink",
    "RemoteWriteStats",
    "build_remote_write_sink",
    "encode_write_request",
    "label_bytes",
    "parse_remote_write_options",
    "series_labels",
    "snappy_block",
]

log = logging.getLogger(__name__)

USER_AGENT = f"fabricscope/{__version__}"
_HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": USER_AGENT,
}
_LOG_INTERVAL_S = 60.0
_MAX_RESPONSE_BYTES = 64 << 10
_FINDING_METRIC = "fabricscope_finding_score"
_METRIC_RX = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAMPLE_OVERHEAD = 16  # wire bytes of one Sample (double + varint timestamp + tags), rounded up

Labels = tuple[tuple[str, str], ...]
# one queued sample: (the series' encoded labels, timestamp ms, value, estimated wire bytes)
_Entry = tuple[bytes, int, float, int]
_pack_sample = struct.Struct("<Bd").pack  # field 1 (double) of Sample: tag 0x09 + 8 bytes


# ---------------------------------------------------------------------------- pure encoding

def series_labels(name: str, target: str, tags: Mapping[str, str], prefix: str = "gnmi") -> Labels:
    """The sorted label set of one event's series: ``__name__``, ``target`` and the tags.

    Tag keys are sanitized like the exposition does (``interface-name`` -> ``interface_name``,
    a key that starts with a digit or ``__`` gets a ``tag_`` prefix); a tag never overrides
    ``target``. Empty values are left out (Prometheus treats an empty label as absent), and
    the result is sorted by label name as Remote-Write 1.0 requires.
    """
    labels = {"__name__": metric_name(name, prefix), "target": target}
    for k, v in tags.items():
        labels.setdefault(_label(str(k)), str(v))
    return tuple(sorted((k, v) for k, v in labels.items() if v != ""))


def _varint(n: int) -> bytes:
    """Protobuf base-128 varint; a negative int64 as its 64-bit two's complement (10 bytes)."""
    if n < 0:
        n &= (1 << 64) - 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(tag: int, data: bytes) -> bytes:
    """A length-delimited protobuf field (string or embedded message)."""
    return bytes((tag,)) + _varint(len(data)) + data


def label_bytes(labels: Labels) -> bytes:
    """``TimeSeries.labels`` (field 1, repeated ``Label{name=1, value=2}``) on the wire.

    Encoded once per series and cached by the sink: a series' labels are most of a request's
    bytes and, built as protobuf objects on every request, most of its CPU.
    """
    return b"".join(_ld(0x0A, _ld(0x0A, k.encode()) + _ld(0x12, v.encode())) for k, v in labels)


def _write_request(series: Iterable[tuple[bytes, Sequence[tuple[int, float]]]]) -> bytes:
    """``WriteRequest`` bytes from (encoded labels, samples already sorted by timestamp)."""
    parts: list[bytes] = []
    tcache: dict[int, bytes] = {}  # the samples of one batch mostly share a few timestamps
    for lab, pts in series:
        body = [lab]
        for t, v in pts:
            tb = tcache.get(t)
            if tb is None:
                tb = tcache[t] = b"\x10" + _varint(t)
            smp = _pack_sample(0x09, v) + tb
            body.append(b"\x12" + bytes((len(smp),)) + smp)  # a Sample is at most 20 bytes
        ts = b"".join(body)
        parts.append(b"\x0a" + _varint(len(ts)) + ts)
    return b"".join(parts)


def encode_write_request(series: Iterable[tuple[Labels, Iterable[tuple[int, float]]]]) -> bytes:
    """Serialize ``(labels, [(timestamp_ms, value), ...])`` pairs as a Remote-Write 1.0 ``WriteRequest``.

    ``labels`` must already be sorted by name (:func:`series_labels` returns them so); the
    samples of each series are sorted here by timestamp, oldest first (spec, "Ordering").
    A series with no sample is left out. The bytes are the protobuf encoding of
    ``prompb/remote.proto`` written directly (fields in number order; zero values are written
    rather than omitted, which every protobuf decoder reads the same); the tests decode them
    with the protobuf runtime.
    """
    items: list[tuple[bytes, Sequence[tuple[int, float]]]] = []
    for labels, samples in series:
        pts = sorted(samples, key=_ts)
        if pts:
            items.append((label_bytes(labels), pts))
    return _write_request(items)


def _ts(p: tuple[int, float]) -> int:
    return p[0]


def snappy_block(data: bytes) -> bytes:
    """Snappy *block* format (not the framed/stream format), as Remote-Write 1.0 requires."""
    return bytes(cramjam.snappy.compress_raw(data))


# ---------------------------------------------------------------------------- options

@dataclass(frozen=True, slots=True)
class RemoteWriteOptions:
    """Validated options of :class:`RemoteWriteSink` (see :func:`parse_remote_write_options`).

    Defaults follow Prometheus' own ``queue_config`` where one exists (``max_samples_per_send``
    2000, ``min_backoff`` 30 ms, ``max_backoff`` 5 s, ``remote_timeout`` 30 s).
    """

    url: str
    prefix: str = "gnmi"
    max_queue_samples: int = 200_000
    max_queue_bytes: int = 32 << 20
    max_samples_per_send: int = 2_000
    batch_wait_s: float = 1.0
    timeout_s: float = 30.0
    min_backoff_s: float = 0.03
    max_backoff_s: float = 5.0
    close_deadline_s: float = 5.0
    bearer_token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    findings: bool = True
    max_tracked_series: int = 1_000_000
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # extra request headers (a tenant id)


_INT_OPTS = ("max_queue_samples", "max_queue_bytes", "max_samples_per_send", "max_tracked_series")
_FLOAT_OPTS = ("batch_wait_s", "timeout_s", "min_backoff_s", "max_backoff_s", "close_deadline_s")
_FILE_OPTS = ("ca_file", "cert_file", "key_file")
_SECRET_OPTS = ("bearer_token", "password")
_KNOWN = frozenset({"url", "prefix", "username", "insecure_skip_verify", "findings", "headers", *_INT_OPTS, *_FLOAT_OPTS,
                    *_FILE_OPTS, *(f"{s}{suf}" for s in _SECRET_OPTS for suf in ("", "_env", "_file"))})


def _dash(k: str) -> str:
    return k.replace("_", "-")


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"remote_write sink: {_dash(key)}: {msg}")


def _secret(o: Mapping[str, Any], base: str) -> str | None:
    """``base``, ``base_env`` (a variable name) or ``base_file`` (a path): at most one; never echoed."""
    given = [k for k in (base, base + "_env", base + "_file") if o.get(k) is not None]
    if len(given) > 1:
        raise _err(base, f"give one of {', '.join(_dash(k) for k in given)}, not several")
    if not given:
        return None
    k = given[0]
    v = o[k]
    if not isinstance(v, str) or not v:
        raise _err(k, "expected a non-empty string (value not shown)")
    if k.endswith("_env"):
        if not _ENV_NAME.match(v):
            raise _err(k, "expected the NAME of an environment variable (letters, digits, _), value not shown")
        s = os.environ.get(v)
        if not s:
            raise _err(k, f"environment variable {v} is not set or empty")
        return s
    if k.endswith("_file"):
        try:
            with open(v, encoding="utf-8") as fh:
                s = fh.read().strip()
        except OSError as exc:
            raise _err(k, f"cannot read {v!r}: {exc.strerror}") from exc
        if not s:
            raise _err(k, f"{v!r} is empty")
        return s
    return v


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token
_RESERVED_HEADERS = frozenset(h.lower() for h in (*_HEADERS, "Authorization", "Content-Length", "Host"))


def _headers(raw: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise _err("headers", f"expected a mapping of header name to value, got {type(raw).__name__}")
    out = []
    for k, v in raw.items():
        if not isinstance(k, str) or not _HEADER_NAME.match(k):
            raise _err("headers", f"not a valid header name: {str(k)[:40]!r}")
        if k.lower() in _RESERVED_HEADERS:
            raise _err("headers", f"{k} is set by the sink (use bearer-token / username for auth)")
        if not isinstance(v, str) or any(c in v for c in "\r\n\0"):
            raise _err(f"headers.{k}", "expected a one-line string (value not shown)")
        out.append((k, v))
    return tuple(out)


def parse_remote_write_options(options: Mapping[str, Any]) -> RemoteWriteOptions:
    """Validate sink options (config keys with dashes or underscores) into :class:`RemoteWriteOptions`.

    Raises :class:`ConfigError` naming the field and the bad value (never a secret's value).
    Resolves ``bearer-token-env`` / ``bearer-token-file`` and ``password-env`` / ``password-file``.
    """
    o = {str(k).replace("-", "_"): v for k, v in options.items()}
    for k in o:
        if k not in _KNOWN:
            raise _err(k, f"unknown option; choose from {', '.join(sorted(_dash(x) for x in _KNOWN))}")
    url = o.get("url")
    if not isinstance(url, str) or not url:
        raise _err("url", "required: the receiver's write endpoint, e.g. http://127.0.0.1:9090/api/v1/write")
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port
    except ValueError as exc:
        raise _err("url", f"not a valid URL ({exc})") from exc
    if u.scheme not in ("http", "https"):
        raise _err("url", f"expected an http:// or https:// URL, got scheme {u.scheme!r}")
    if u.username is not None or u.password is not None:
        # never echo it: the URL holds a password
        raise _err("url", "credentials in the URL are not supported; use username and password (URL not shown)")
    if not u.hostname:
        raise _err("url", f"no host in {url!r}")
    del port
    kw: dict[str, Any] = {"url": url}
    prefix = o.get("prefix", "gnmi")
    if not isinstance(prefix, str) or not _METRIC_RX.match(prefix):
        raise _err("prefix", f"expected a metric name prefix matching [a-zA-Z_:][a-zA-Z0-9_:]*, got {prefix!r}")
    kw["prefix"] = prefix
    for k in _INT_OPTS:
        if k in o:
            v = o[k]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise _err(k, f"expected a positive integer, got {v!r}")
            kw[k] = v
    for k in _FLOAT_OPTS:
        if k in o:
            v = o[k]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise _err(k, f"expected a positive number of seconds, got {v!r}")
            kw[k] = float(v)
    for k in ("insecure_skip_verify", "findings"):
        if k in o:
            if not isinstance(o[k], bool):
                raise _err(k, f"expected true or false, got {o[k]!r}")
            kw[k] = o[k]
    for k in _FILE_OPTS:
        if o.get(k) is not None:
            v = o[k]
            if not isinstance(v, str) or not os.path.isfile(v):
                raise _err(k, f"no such file: {v!r}")
            kw[k] = v
    if (kw.get("cert_file") is None) != (kw.get("key_file") is None):
        raise _err("cert_file", "give cert-file and key-file together (mTLS) or neither")
    if u.scheme == "http" and any(k in kw for k in (*_FILE_OPTS, "insecure_skip_verify")):
        raise _err("url", "TLS options are given but the URL is http://; use https://")
    if o.get("headers") is not None:
        kw["headers"] = _headers(o["headers"])
    token, password = _secret(o, "bearer_token"), _secret(o, "password")
    username = o.get("username")
    if username is not None and (not isinstance(username, str) or not username or ":" in username):
        raise _err("username", f"expected a non-empty string without ':', got {username!r}")
    if password is not None and username is None:
        raise _err("username", "a password is given but no username")
    if token is not None and username is not None:
        raise _err("bearer_token", "give a bearer token or username/password, not both")
    kw.update(bearer_token=token, username=username, password=password)
    opts = RemoteWriteOptions(**kw)
    if opts.min_backoff_s > opts.max_backoff_s:
        raise _err("min_backoff_s", f"{opts.min_backoff_s} is more than max-backoff-s {opts.max_backoff_s}")
    if opts.max_samples_per_send > opts.max_queue_samples:
        raise _err("max_samples_per_send", f"{opts.max_samples_per_send} is more than max-queue-samples "
                                           f"{opts.max_queue_samples}")
    return opts


def _tls_context(o: RemoteWriteOptions) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=o.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise _err("ca_file", f"cannot load {o.ca_file!r}: {exc}") from exc
    if o.cert_file is not None:
        try:
            ctx.load_cert_chain(o.cert_file, o.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise _err("cert_file", f"cannot load {o.cert_file!r} with key-file {o.key_file!r}: {exc}") from exc
    if o.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------- the sink

@dataclass(frozen=True, slots=True)
class RemoteWriteStats:
    """A snapshot of :class:`RemoteWriteSink`'s self-metrics (counters since start)."""

    samples_sent: int  # accepted by the receiver (2xx)
    requests: int  # HTTP attempts, retries included
    requests_failed: int  # attempts answered 5xx/429 or lost to a connection error
    retries: int
    dropped: int  # samples dropped, oldest first, because the queue was full
    rejected: int  # samples in requests answered 4xx other than 429 (not retried)
    skipped_non_numeric: int  # string events (oper-status ...): not Prometheus samples
    skipped_out_of_order: int  # at or before the series' last sent timestamp, or same-ms duplicates
    lost_at_close: int  # still queued or in flight when the close deadline passed
    queue_depth: int  # samples waiting (the batch in flight not included)
    queue_bytes: int  # their estimated encoded size
    in_flight: int  # samples in the request being sent or retried
    last_error: str


class RemoteWriteSink:
    """Telemetry events and findings to a Remote-Write 1.0 receiver (Prometheus, VictoriaMetrics, Mimir).

    Implements the :class:`~fabricscope.telemetry.sinks.Sink` protocol. ``write`` never blocks
    on the network: it queues (bounded by ``max_queue_samples`` and ``max_queue_bytes``; when
    full the oldest samples go and are counted in :meth:`stats`). One sender thread batches
    up to ``max_samples_per_send`` samples, waiting at most ``batch_wait_s`` for a batch to
    fill. Memory is bounded by the queue plus one batch in flight.

    Findings (``findings=True``) become ``fabricscope_finding_score{kind, subject, severity}``
    at the end of their window. ``seed`` seeds the backoff jitter (tests).
    """

    def __init__(self, options: RemoteWriteOptions, *, seed: int | None = None) -> None:
        self.options = o = options
        u = urllib.parse.urlsplit(o.url)
        self._https = u.scheme == "https"
        self._host = u.hostname or ""
        self._port = u.port or (443 if self._https else 80)
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self.endpoint = f"{u.scheme}://{u.netloc}{u.path or '/'}"  # what logs show: no query string
        self._ssl = _tls_context(o) if self._https else None
        self._headers = dict(_HEADERS)
        self._headers.update(o.headers)
        if o.bearer_token is not None:
            self._headers["Authorization"] = "Bearer " + o.bearer_token
        elif o.username is not None:
            cred = base64.b64encode(f"{o.username}:{o.password or ''}".encode()).decode("ascii")
            self._headers["Authorization"] = "Basic " + cred
        if "Authorization" in self._headers and not self._https and not _is_loopback(self._host):
            log.warning("remote write: credentials for %s go over plain http; use https", self.endpoint)
        if o.insecure_skip_verify:
            log.warning("remote write: TLS certificate verification is OFF for %s", self.endpoint)
        self._rng = random.Random(seed)
        self._ratelog = RateLimitedLog(log, _LOG_INTERVAL_S)
        self._loglock = threading.Lock()  # the collector thread and the sender both log
        self._labels: dict[tuple[str, str, tuple[tuple[str, str], ...]], tuple[bytes, int]] = {}
        self._last_ts: dict[bytes, int] = {}  # per series (its encoded labels): newest timestamp accepted
        self._queue: deque[_Entry] = deque()
        self._cond = threading.Condition()
        self._qbytes = 0
        self._in_flight = 0
        self._close_at: float | None = None
        self._closed = False
        self._conn: http.client.HTTPConnection | None = None
        self._n = dict.fromkeys(("samples_sent", "requests", "requests_failed", "retries", "dropped", "rejected",
                                 "skipped_non_numeric", "skipped_out_of_order", "lost_at_close"), 0)
        self._last_error = ""
        self._thread = threading.Thread(target=self._run, name="remote-write-sender", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"RemoteWriteSink({self.endpoint!r})"

    # -------------------------------------------------------------- collector side
    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        """Queue the numeric events (and findings); never waits for the receiver."""
        if self._closed or self._close_at is not None:
            raise TransportError(f"remote write sink {self.endpoint}: closed")
        entries: list[_Entry] = []
        skipped = 0
        cache, prefix = self._labels, self.options.prefix
        for e in events:
            v = e.value
            if isinstance(v, bool):
                fv = 1.0 if v else 0.0
            elif isinstance(v, int | float):
                try:
                    fv = float(v)
                except OverflowError:  # an int beyond a double
                    skipped += 1
                    continue
            else:
                skipped += 1
                continue
            key = (e.name, e.target, tuple(e.tags.items()))
            hit = cache.get(key)
            if hit is None:
                lab = label_bytes(series_labels(e.name, e.target, e.tags, prefix))
                hit = (lab, _SAMPLE_OVERHEAD + len(lab))
                if len(cache) >= self.options.max_tracked_series:
                    cache.clear()  # a churn of series must not grow memory; a miss only costs a recompute
                cache[key] = hit
            entries.append((hit[0], e.ts_ns // 1_000_000, fv, hit[1]))
        if self.options.findings:
            for f in findings:
                lab = label_bytes(tuple(sorted((("__name__", _FINDING_METRIC), ("kind", f.kind),
                                                ("subject", f.subject), ("severity", severity_of(f))))))
                entries.append((lab, f.window[1] // 1_000_000, float(f.score), _SAMPLE_OVERHEAD + len(lab)))
        o = self.options
        with self._cond:
            self._n["skipped_non_numeric"] += skipped
            q = self._queue
            was_empty = not q
            q.extend(entries)
            self._qbytes += sum(x[3] for x in entries)
            dropped = 0
            while q and (len(q) > o.max_queue_samples or self._qbytes > o.max_queue_bytes):
                self._qbytes -= q.popleft()[3]
                dropped += 1
            self._n["dropped"] += dropped
            if (was_empty and q) or len(q) >= o.max_samples_per_send:
                self._cond.notify_all()  # starts the batch-wait clock, or a full batch goes now
        if dropped:
            self._log(logging.WARNING, "dropped",
                      f"remote write: queue full ({o.max_queue_samples} samples / {o.max_queue_bytes} bytes), "
                      f"dropped the {dropped} oldest samples ({self.endpoint} slow or down)")

    def close(self, deadline_s: float | None = None) -> None:
        """Flush what is queued within ``deadline_s`` (default ``close_deadline_s``), then stop.

        Samples still undelivered at the deadline are counted as ``lost_at_close`` and logged
        in one line. Returns within the deadline plus a second or so.
        """
        if self._closed:
            return
        d = self.options.close_deadline_s if deadline_s is None else max(0.0, deadline_s)
        with self._cond:
            self._close_at = time.monotonic() + d
            self._cond.notify_all()
        self._thread.join(d + 2.0)
        self._closed = True
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
            self._qbytes = 0
            self._n["lost_at_close"] += left
            lost = self._n["lost_at_close"]
        if self._thread.is_alive():
            log.error("remote write: sender to %s still busy %.1f s after the close deadline", self.endpoint, 2.0)
        if lost:
            log.warning("remote write: %d samples not delivered to %s by the close deadline (%.1f s): %s",
                        lost, self.endpoint, d, self._last_error or "no error")
        conn, self._conn = self._conn, None
        if conn is not None and not self._thread.is_alive():
            conn.close()

    def stats(self) -> RemoteWriteStats:
        """Counters since start and the current queue state."""
        with self._cond:
            return RemoteWriteStats(**self._n, queue_depth=len(self._queue), queue_bytes=self._qbytes,
                                    in_flight=self._in_flight, last_error=self._last_error)

    def metric_samples(self) -> list[MetricSample]:
        """:meth:`stats` as self-metric samples (``remote_write_*``) for the Prometheus sink."""
        s = self.stats()
        lab = {"endpoint": self.endpoint}
        out: list[MetricSample] = []
        for k in ("samples_sent", "requests", "requests_failed", "retries", "dropped", "rejected",
                  "skipped_non_numeric", "skipped_out_of_order", "lost_at_close"):
            out.append((f"remote_write_{k}_total", "counter", lab, float(getattr(s, k))))
        for k in ("queue_depth", "queue_bytes", "in_flight"):
            out.append((f"remote_write_{k}", "gauge", lab, float(getattr(s, k))))
        return out

    def _log(self, level: int, condition: str, message: str) -> None:
        with self._loglock:
            self._ratelog.log(level, self.endpoint, condition, message, time.monotonic())

    # -------------------------------------------------------------- sender thread
    def _past_deadline(self) -> bool:
        return self._close_at is not None and time.monotonic() >= self._close_at

    def _run(self) -> None:
        o = self.options
        while True:
            with self._cond:
                while not self._queue and self._close_at is None:
                    self._cond.wait()
                if self._close_at is None and len(self._queue) < o.max_samples_per_send:
                    until = time.monotonic() + o.batch_wait_s
                    while (len(self._queue) < o.max_samples_per_send and self._close_at is None
                           and (rem := until - time.monotonic()) > 0):
                        self._cond.wait(rem)
                if not self._queue or self._past_deadline():
                    if self._close_at is not None:
                        return
                    continue
                n = min(len(self._queue), o.max_samples_per_send)
                batch = [self._queue.popleft() for _ in range(n)]
                self._qbytes -= sum(x[3] for x in batch)
                self._in_flight = n
            try:
                self._send(batch)
            except Exception as exc:  # a bug here must not kill the sender silently
                log.exception("remote write: sender error; %d samples lost", len(batch))
                with self._cond:
                    self._n["rejected"] += len(batch)
                    self._last_error = f"{type(exc).__name__}: {exc}"
            finally:
                with self._cond:
                    self._in_flight = 0

    def _encode(self, batch: Sequence[_Entry]) -> tuple[bytes, int, dict[bytes, int]]:
        """(snappy body, samples in it, newest timestamp per series); skips what Prometheus would reject.

        Prometheus fails a whole request (400, rolled back) on one out-of-order sample or one
        same-millisecond duplicate, so within a batch the later of two same-millisecond
        samples wins, and a sample at or before what the series last had accepted is skipped.
        """
        by_series: dict[bytes, list[tuple[int, float]]] = {}
        for lab, t, v, _ in batch:
            pts = by_series.get(lab)
            if pts is None:
                by_series[lab] = [(t, v)]
            else:
                pts.append((t, v))
        skipped = 0
        series: list[tuple[bytes, Sequence[tuple[int, float]]]] = []
        newest: dict[bytes, int] = {}
        last = self._last_ts
        for lab, pts in by_series.items():
            if len(pts) > 1:
                pts.sort(key=_ts)  # stable: same-millisecond samples stay in arrival order
                uniq = [p for p, q in itertools.pairwise(pts) if p[0] != q[0]]
                uniq.append(pts[-1])
                skipped += len(pts) - len(uniq)
                pts = uniq
            lt = last.get(lab)
            if lt is not None and pts[0][0] <= lt:
                keep = [p for p in pts if p[0] > lt]
                skipped += len(pts) - len(keep)
                pts = keep
            if pts:
                series.append((lab, pts))
                newest[lab] = pts[-1][0]
        if skipped:
            with self._cond:
                self._n["skipped_out_of_order"] += skipped
        n = sum(len(p) for _, p in series)
        return (snappy_block(_write_request(series)) if n else b""), n, newest

    def _remember(self, newest: Mapping[bytes, int]) -> None:
        last = self._last_ts
        for k, t in newest.items():
            last.pop(k, None)
            last[k] = t  # re-inserted: the dict's order is least recently sent first
        over = len(last) - self.options.max_tracked_series
        if over > 0:
            for k in list(last)[:over]:
                del last[k]

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with equal jitter: [d/2, d], d = min(max, min * 2**attempt)."""
        o = self.options
        d = min(o.max_backoff_s, o.min_backoff_s * (2.0 ** min(attempt, 30)))
        d = d / 2 + self._rng.uniform(0, d / 2)
        if retry_after is not None:
            d = max(d, min(retry_after, o.max_backoff_s))
        return d

    def _sleep(self, delay: float) -> None:
        end = time.monotonic() + delay
        with self._cond:
            while True:
                limit = end if self._close_at is None else min(end, self._close_at)
                now = time.monotonic()
                if now >= limit:
                    return
                self._cond.wait(limit - now)

    def _send(self, batch: Sequence[_Entry]) -> None:
        body, n, newest = self._encode(batch)
        if n == 0:
            return
        attempt = 0
        while True:
            if self._past_deadline():
                with self._cond:
                    self._n["lost_at_close"] += n
                return
            status, retry_after, detail = self._post(body)
            with self._cond:
                self._n["requests"] += 1
            if 200 <= status < 300:
                self._remember(newest)
                with self._cond:
                    self._n["samples_sent"] += n
                if attempt:
                    log.info("remote write: %s accepts writes again after %d retries", self.endpoint, attempt)
                with self._loglock:
                    self._ratelog.reset(self.endpoint, "retry")
                return
            what = f"HTTP {status}: {detail}" if status else detail
            if status == 0 or status == 429 or status >= 500:
                with self._cond:
                    self._n["requests_failed"] += 1
                    self._n["retries"] += 1
                    self._last_error = what
                delay = self._backoff(attempt, retry_after)
                attempt += 1
                self._log(logging.WARNING, "retry",
                          f"remote write: {self.endpoint} failed ({what}); retrying {n} samples with "
                          f"backoff (next in {delay:.2f} s)")
                self._sleep(delay)
                continue
            with self._cond:
                self._n["rejected"] += n
                self._last_error = what
            self._log(logging.ERROR, f"rejected-{status}",
                      f"remote write: {self.endpoint} rejected {n} samples ({what}); not retried")
            return

    def _post(self, body: bytes) -> tuple[int, float | None, str]:
        """One POST: (status or 0 on a connection error, Retry-After seconds, short detail)."""
        timeout = self.options.timeout_s
        if self._close_at is not None:
            timeout = max(0.05, min(timeout, self._close_at - time.monotonic()))
        try:
            conn = self._conn
            if conn is None:
                if self._https:
                    conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
                else:
                    conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
                self._conn = conn
            else:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            conn.request("POST", self._path, body=body, headers=self._headers)
            resp = conn.getresponse()
            data = resp.read(_MAX_RESPONSE_BYTES)
            if resp.will_close or not resp.isclosed():
                # the server closes, or its answer is longer than we read: start afresh next time
                self._drop_conn()
            retry_after = None
            ra = resp.getheader("Retry-After")
            if ra is not None and ra.strip().isdigit():
                retry_after = float(ra.strip())
            detail = " ".join(data[:200].decode("utf-8", "replace").split()) or resp.reason
            return resp.status, retry_after, detail
        except (OSError, http.client.HTTPException) as exc:
            self._drop_conn()
            return 0, None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def build_remote_write_sink(options: Mapping[str, Any], *, seed: int | None = None) -> RemoteWriteSink:
    """A :class:`RemoteWriteSink` from config ``sinks:`` options (validated, :class:`ConfigError` names the field)."""
    return RemoteWriteSink(parse_remote_write_options(options), seed=seed)
