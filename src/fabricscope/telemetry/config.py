"""Typed collector configuration (gnmic-like YAML), validated completely before anything starts.

::

    targets:
      twin:                              # one gRPC connection
        address: 127.0.0.1:9339
        names: [leaf-000, spine-00]      # prefix.target values served there (default: the key)
        username: admin                  # sent as gRPC metadata
        password-env: FABRICSCOPE_GNMI_PASSWORD   # or password: ... (never logged)
        tls: {ca-file: ca.pem, server-name: localhost}   # omit for plaintext
        subscriptions: [counters]        # default: all
    subscriptions:
      counters:
        paths: [/interfaces/interface[name=*]/state/counters]
        mode: stream                     # once | poll | stream
        stream-mode: sample              # sample | on-change | target-defined
        sample-interval: 1s
        heartbeat-interval: 10s
        suppress-redundant: false
        updates-only: false
        encoding: proto                  # proto | json_ietf
        poll-interval: 10s               # mode: poll
    processors:
      - {type: filter, action: drop, names: ["*/in-discards"]}
      - {type: rate, names: ["*octets"]}
    detectors: {micro-burst: {watermark-bytes: 1000000}, error-increase: {}}
    sinks:
      - {type: duckdb, path: telemetry.duckdb, roll-interval: 1m}   # readers: open_readonly()
      - {type: prometheus, listen: 127.0.0.1:9273}
      - {type: jsonl, path: "-"}
    buffer: {max-events: 1000000, batch: 20000, flush-interval: 200ms}
    backoff: {initial: 200ms, max: 30s}
    workers: 2                           # collector processes (targets sharded; one DuckDB writer)
    stale-after: 3                       # no update for 3 x sample-interval: stale, logged, reconnected (0: off)
    keepalive: 5m                        # gRPC keepalive ping on a silent connection (0s: off)
    stats-interval: 10s                  # self-metrics log line (0s: off)
    shutdown: {deadline: 5s, spill-file: collector.spill.jsonl}   # default: <config>.spill.jsonl
    inventory: fabric.yaml               # lets 'aggregate' group by rail / plane / pod / tier
    cluster:                             # only for 'gnmi collect --cluster' (docs/design/cluster-bus.md)
      nats: nats://127.0.0.1:4222        # or tls://host:port
      member: collector-a                # default: this host's name
      lease: 3s                          # target ownership lease (all members agree)
      user: fabricscope                  # + password-env: NAME; or token-env: NAME; or creds: FILE
      password-env: FABRICSCOPE_NATS_PASSWORD
      tls-ca: ca.pem                     # + tls-cert / tls-key for a client certificate
      max-bytes: 1073741824              # per stream; max-age: 24h; storage: file | memory

Every error names the file, the field and the value (``collector.yaml: subscriptions.counters.mode:
expected once|poll|stream, got 'streem'``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fabricscope.model.errors import ConfigError
from fabricscope.telemetry.detectors import build_detector
from fabricscope.telemetry.paths import parse_path
from fabricscope.telemetry.processors import OPTIONS, ProcessorSpec, build_processor

__all__ = [
    "ClusterConfig",
    "CollectorConfig",
    "SinkConfig",
    "SubscriptionConfig",
    "TLSConfig",
    "TargetConfig",
    "load_config",
    "parse_config",
    "parse_duration_ns",
    "show",
]

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
          "m": 60_000_000_000, "h": 3_600_000_000_000}
_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|m|h)\s*$")
_MS = 1_000_000
_S = 1_000_000_000
_H = 3_600 * _S
# gNMI carries intervals as uint64 ns; anything past a day is a typo, not a sampling plan
_MAX_INTERVAL_NS = 24 * _H
_SECRET = re.compile(r"pass|secret|token", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IDENT = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MAX_SHOWN = 80
_MAX_CONFIG_BYTES = 16 << 20


def _redact(v: object, depth: int = 0) -> object:
    """``v`` with every value under a password/secret/token key replaced, for error messages."""
    if depth > 4:
        return "..."
    if isinstance(v, Mapping):
        return {k: ("<redacted>" if isinstance(k, str) and _SECRET.search(k) else _redact(x, depth + 1))
                for k, x in list(v.items())[:20]}
    if isinstance(v, list):
        return [_redact(x, depth + 1) for x in v[:20]]
    return v


def show(v: object) -> str:
    """A value as quoted in an error: repr, secrets redacted, cut to one short line."""
    r = repr(_redact(v))
    return r if len(r) <= _MAX_SHOWN else r[: _MAX_SHOWN - 3] + "..."


def _key(k: object) -> str:
    s = str(k)
    return s if len(s) <= 40 else s[:37] + "..."


def parse_duration_ns(v: object, field_name: str = "duration") -> int:
    """``"1s"``, ``"250ms"``, ``"5m"`` or a number of seconds -> integer ns (finite, >= 0)."""
    expected = f"{field_name}: expected a duration like 1s or 250ms, got {show(v)}"
    if isinstance(v, bool):
        raise ConfigError(expected)
    if isinstance(v, int | float):
        if not math.isfinite(v):
            raise ConfigError(f"{field_name}: expected a finite duration, got {show(v)}")
        if v < 0:
            raise ConfigError(f"{field_name}: must be >= 0, got {show(v)}")
        ns = v * _S
    else:
        m = _DUR.match(v) if isinstance(v, str) else None
        if not m:
            raise ConfigError(expected)
        ns = float(m.group(1)) * _UNITS[m.group(2)]
    if ns > 2**63 - 1:
        raise ConfigError(f"{field_name}: duration too large, got {show(v)}")
    return int(ns)


@dataclass(frozen=True)
class TLSConfig:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None


@dataclass(frozen=True)
class TargetConfig:
    name: str
    address: str
    names: tuple[str, ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    password_env: str | None = None
    tls: TLSConfig | None = None
    subscriptions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SubscriptionConfig:
    name: str
    paths: tuple[str, ...]
    prefix: str = ""
    mode: str = "stream"
    stream_mode: str = "sample"
    sample_interval_ns: int = 1_000_000_000
    heartbeat_interval_ns: int = 0
    suppress_redundant: bool = False
    updates_only: bool = False
    encoding: str = "proto"
    poll_interval_ns: int = 10_000_000_000


@dataclass(frozen=True)
class SinkConfig:
    type: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class ClusterConfig:
    """The ``cluster:`` section: where the NATS bus is and how this collector joins it.

    Secrets are never held here, only the *names* of the environment variables that carry
    them (``password_env``, ``token_env``) or a credentials file, so neither ``repr`` nor a
    log line can show one.
    """

    nats: str
    member: str
    lease_ns: int = 3_000_000_000
    user: str | None = None
    password_env: str | None = None
    token_env: str | None = None
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    max_bytes: int = 1 << 30
    max_age_ns: int = 24 * 3_600_000_000_000
    storage: str = "file"


@dataclass(frozen=True)
class CollectorConfig:
    targets: tuple[TargetConfig, ...]
    subscriptions: Mapping[str, SubscriptionConfig]
    processors: tuple[ProcessorSpec, ...] = ()
    detectors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sinks: tuple[SinkConfig, ...] = ()
    buffer_max_events: int = 1_000_000
    batch_max: int = 20_000
    flush_interval_ns: int = 200_000_000
    backoff_initial_ns: int = 200_000_000
    backoff_max_ns: int = 30_000_000_000
    workers: int = 1
    inventory: str | None = None
    source: str = "<config>"
    # collector health and shutdown (issue 8): a stream with no update for stale_after x its
    # sample interval is stale; keepalive pings a silent connection; stats_interval paces the
    # self-metrics log line; by shutdown_deadline whatever the sinks have not taken is spilled.
    stale_after: float = 3.0
    keepalive_ns: int = 300_000_000_000  # gRPC/Go servers refuse pings more often than 5 min without data
    stats_interval_ns: int = 10_000_000_000
    shutdown_deadline_ns: int = 5_000_000_000
    spill_file: str | None = None
    cluster: ClusterConfig | None = None  # None: the embedded single-process mode

    def subscriptions_of(self, t: TargetConfig) -> tuple[SubscriptionConfig, ...]:
        names = t.subscriptions or tuple(self.subscriptions)
        return tuple(self.subscriptions[n] for n in names)


SINK_TYPES: Mapping[str, frozenset[str]] = {
    "duckdb": frozenset({"path", "roll-interval"}),
    "prometheus": frozenset({"listen", "prefix", "counters", "gauges", "max-series", "max-active-findings",
                             "finding-ttl"}),
    "jsonl": frozenset({"path"}),
    "memory": frozenset(),
    "remote_write": frozenset({"url", "prefix", "max-queue-samples", "max-queue-bytes", "max-samples-per-send",
                               "batch-wait-s", "timeout-s", "min-backoff-s", "max-backoff-s", "close-deadline-s",
                               "bearer-token", "bearer-token-env", "bearer-token-file", "username", "password",
                               "password-env", "password-file", "ca-file", "cert-file", "key-file",
                               "insecure-skip-verify", "findings", "max-tracked-series", "headers"}),
}
# processors whose output under the same name is no longer a counter (Prometheus TYPE gauge)
_GAUGE_MAKERS = ("rate", "delta", "downsample")


class _Ctx:
    """Where errors point: the source file and, for configs built from CLI flags, the flag names.

    ``labels`` maps an internal field path prefix (``subscriptions.cli.sample-interval``) to
    what the user typed (``--interval``), so an error never names a field the user never wrote.
    """

    def __init__(self, src: str, labels: Mapping[str, str]) -> None:
        self.src = src
        self.labels = sorted(labels.items(), key=lambda kv: -len(kv[0]))

    def where(self, w: str) -> str:
        for k, lab in self.labels:
            if w == k or w.startswith((k + ".", k + "[")):
                return lab + w[len(k):]
        return w

    def err(self, w: str, msg: str) -> ConfigError:
        where = "top level" if w == "<top>" else self.where(w)
        return ConfigError(f"{self.src}: {where}: {msg}")


def _check_keys(c: _Ctx, where: str, d: Mapping[Any, Any], allowed: Sequence[str] | frozenset[str]) -> None:
    for k in d:
        if k not in allowed:
            # the key only, never its value: a misspelt 'pasword: s3cret' must not echo the secret
            raise c.err(f"{where}.{_key(k)}" if where != "<top>" else _key(k),
                        f"unknown field; allowed: {', '.join(sorted(allowed))}")


def _mapping(c: _Ctx, where: str, v: object) -> Mapping[Any, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise c.err(where, f"expected a mapping, got {type(v).__name__} {show(v)}")
    return v


def _list(c: _Ctx, where: str, v: object) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise c.err(where, f"expected a list, got {type(v).__name__} {show(v)}")
    return v


def _bool(c: _Ctx, where: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise c.err(where, f"expected true/false, got {show(v)}")
    return v


def _choice(c: _Ctx, where: str, v: object, options: Sequence[str]) -> str:
    s = v.lower().replace("_", "-") if isinstance(v, str) else None
    opts = [o.replace("_", "-") for o in options]
    if s not in opts:
        raise c.err(where, f"expected {'|'.join(options)}, got {show(v)}")
    return options[opts.index(s)]


def _dur(c: _Ctx, where: str, v: object, lo_ns: int = 0, hi_ns: int = _MAX_INTERVAL_NS, *,
         zero_ok: bool = False) -> int:
    ns = parse_duration_ns(v, f"{c.src}: {c.where(where)}")
    if (ns < lo_ns and not (zero_ok and ns == 0)) or ns > hi_ns:
        rng = f"between {_fmt_ns(lo_ns)} and {_fmt_ns(hi_ns)}" + (" (or 0)" if zero_ok else "")
        raise c.err(where, f"must be {rng}, got {show(v)}")
    return ns


def _fmt_ns(ns: int) -> str:
    for unit, k in (("h", _H), ("m", 60 * _S), ("s", _S), ("ms", _MS), ("us", 1_000)):
        if ns >= k and ns % k == 0:
            return f"{ns // k}{unit}"
    return f"{ns}ns"


def _int(c: _Ctx, where: str, v: object, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        kind = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        raise c.err(where, f"expected {kind} <= {hi:,}, got {show(v)}")
    return v


def _str(c: _Ctx, where: str, v: object, *, secret: bool = False) -> str:
    if not isinstance(v, str) or not v.strip():
        got = f"{type(v).__name__} (value not shown)" if secret else show(v)
        raise c.err(where, f"expected a non-empty string{' (quote it in YAML)' if secret else ''}, got {got}")
    return v


def _strs(c: _Ctx, where: str, v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise c.err(where, f"expected a list of strings, got {show(v)}")
    return tuple(v)


def _address(c: _Ctx, where: str, v: object, *, listen: bool = False) -> str:
    s = v if isinstance(v, str) else ""
    host, _, port = s.rpartition(":")
    lo = 0 if listen else 1  # listening on port 0 takes any free port
    if not host or any(ch.isspace() for ch in host) or not port.isdigit() or not lo <= int(port) < 65536:
        raise c.err(where, f"expected host:port with a port {lo}-65535, got {show(v)}")
    return s


def _file(c: _Ctx, where: str, v: object) -> str:
    """A path to a readable regular file (TLS material, inventory): checked before start."""
    p = _str(c, where, v)
    if not Path(p).is_file():
        raise c.err(where, f"no such file {show(p)}")
    if not os.access(p, os.R_OK):
        raise c.err(where, f"cannot read {show(p)}: permission denied")
    return p


def _out_path(c: _Ctx, where: str, v: object) -> str:
    """A file path we will create or append to: a string whose directory exists and is writable.

    An integer would be taken by ``open()`` as a file descriptor (``path: 2`` wrote into
    stderr), so only strings are paths.
    """
    if not isinstance(v, str) or not v:
        raise c.err(where, f"expected a file path (a string), got {type(v).__name__} {show(v)}")
    p = Path(v)
    if p.is_dir():
        raise c.err(where, f"{show(v)} is a directory; expected a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise c.err(where, f"directory {show(str(parent))} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise c.err(where, f"cannot write {show(v)}: permission denied")
    return v


def _name(c: _Ctx, where: str, k: object) -> str:
    """A mapping key that names something (a target, a subscription): a string or an integer."""
    if isinstance(k, bool) or not isinstance(k, str | int) or not str(k).strip():
        raise c.err(f"{where}.{_key(k)}", f"expected a name (a string), got {show(k)}")
    return str(k)


def _subscription(c: _Ctx, name: str, raw: object) -> SubscriptionConfig:
    w = f"subscriptions.{name}"
    d = _mapping(c, w, raw)
    _check_keys(c, w, d, ("paths", "prefix", "mode", "stream-mode", "sample-interval", "heartbeat-interval",
                          "suppress-redundant", "updates-only", "encoding", "poll-interval"))
    paths = _strs(c, f"{w}.paths", d.get("paths"))
    if not paths:
        raise c.err(f"{w}.paths", "at least one path is required")
    for i, p in enumerate(paths):
        parse_path(p, source=f"{c.src}: {c.where(f'{w}.paths[{i}]')}")
    prefix = ""
    if d.get("prefix") is not None:
        prefix = _str(c, f"{w}.prefix", d["prefix"])
        parse_path(prefix, source=f"{c.src}: {c.where(f'{w}.prefix')}")
    return SubscriptionConfig(
        name=name, paths=paths, prefix=prefix,
        mode=_choice(c, f"{w}.mode", d.get("mode", "stream"), ("once", "poll", "stream")),
        stream_mode=_choice(c, f"{w}.stream-mode", d.get("stream-mode", "sample"),
                            ("sample", "on-change", "target-defined")),
        sample_interval_ns=_dur(c, f"{w}.sample-interval", d.get("sample-interval", "1s"), _MS),
        heartbeat_interval_ns=_dur(c, f"{w}.heartbeat-interval", d.get("heartbeat-interval", 0), _MS, zero_ok=True),
        suppress_redundant=_bool(c, f"{w}.suppress-redundant", d.get("suppress-redundant", False)),
        updates_only=_bool(c, f"{w}.updates-only", d.get("updates-only", False)),
        encoding=_choice(c, f"{w}.encoding", d.get("encoding", "proto"), ("proto", "json_ietf")),
        poll_interval_ns=_dur(c, f"{w}.poll-interval", d.get("poll-interval", "10s"), _MS),
    )


def _target(c: _Ctx, name: str, raw: object, subs: Mapping[str, SubscriptionConfig]) -> TargetConfig:
    w = f"targets.{name}"
    d = _mapping(c, w, raw)
    _check_keys(c, w, d, ("address", "names", "username", "password", "password-env", "tls", "subscriptions"))
    tls = None
    if "tls" in d:
        td = _mapping(c, f"{w}.tls", d["tls"])
        _check_keys(c, f"{w}.tls", td, ("ca-file", "cert-file", "key-file", "server-name"))
        files = {k: _file(c, f"{w}.tls.{k}", td[k]) if td.get(k) is not None else None
                 for k in ("ca-file", "cert-file", "key-file")}
        if (files["cert-file"] is None) != (files["key-file"] is None):
            raise c.err(f"{w}.tls", "give cert-file and key-file together (mTLS) or neither")
        sn = _str(c, f"{w}.tls.server-name", td["server-name"]) if td.get("server-name") is not None else None
        tls = TLSConfig(files["ca-file"], files["cert-file"], files["key-file"], sn)
    sub_names = _strs(c, f"{w}.subscriptions", d.get("subscriptions", []))
    for s in sub_names:
        if s not in subs:
            raise c.err(f"{w}.subscriptions", f"unknown subscription {show(s)}; defined: {', '.join(subs)}")
    if "password" in d and "password-env" in d:
        raise c.err(w, "give password or password-env, not both")
    username = _str(c, f"{w}.username", d["username"]) if d.get("username") is not None else None
    password = _str(c, f"{w}.password", d["password"], secret=True) if "password" in d else None
    password_env = None
    if "password-env" in d:
        pe = d["password-env"]
        if not isinstance(pe, str) or not _ENV_NAME.match(pe):
            # never echo it: a password pasted here by mistake must not land in a log
            raise c.err(f"{w}.password-env", "expected the NAME of an environment variable (letters, digits, _), "
                                             "got something else (value not shown)")
        password_env = pe
    if (password is not None or password_env is not None) and username is None:
        raise c.err(f"{w}.username", "a password is given but no username")
    names = _strs(c, f"{w}.names", d.get("names", [name]))
    if not names:
        raise c.err(f"{w}.names", "at least one device name (prefix.target) is required")
    return TargetConfig(
        name=name, address=_address(c, f"{w}.address", d.get("address")),
        names=names,
        username=username, password=password, password_env=password_env,
        tls=tls, subscriptions=sub_names,
    )


def _processors(c: _Ctx, raw_procs: object, has_inventory: bool) -> list[ProcessorSpec]:
    procs: list[ProcessorSpec] = []
    for i, raw in enumerate(_list(c, "processors", raw_procs)):
        w = f"processors[{i}]"
        d = dict(_mapping(c, w, raw))
        ptype = d.pop("type", None)
        if not isinstance(ptype, str) or ptype not in OPTIONS:
            raise c.err(f"{w}.type", f"unknown processor {show(ptype)}; choose from {', '.join(sorted(OPTIONS))}")
        _check_keys(c, w, d, OPTIONS[ptype])
        for k in ("names", "funcs", "targets"):
            if k in d:
                d[k] = _strs(c, f"{w}.{k}", d[k])
        for k in ("action", "pattern", "replacement", "by", "func", "window"):
            if k in d and (isinstance(d[k], bool) or not isinstance(d[k], str | int | float)):
                raise c.err(f"{w}.{k}", f"expected a string, got {show(d[k])}")
        for k in ("tags", "groups"):
            if k in d:
                m = _mapping(c, f"{w}.{k}", d[k])
                if not all(isinstance(a, str) and isinstance(b, str) for a, b in m.items()):
                    raise c.err(f"{w}.{k}", f"expected a mapping of strings to strings, got {show(d[k])}")
        if "keep-original" in d:
            _bool(c, f"{w}.keep-original", d["keep-original"])
        spec = ProcessorSpec(ptype, d)
        check = d
        if ptype == "aggregate" and "groups" not in d:
            if not has_inventory:
                raise c.err(f"{w}.groups", "give groups (device: label) or a top-level inventory file "
                                           f"to group by {show(d.get('by', 'rail'))}")
            check = {**d, "groups": {}}  # resolved from the inventory when the collector starts
        build_processor(ProcessorSpec(ptype, check), source=f"{c.src}: {c.where(w)}")  # option values, now
        procs.append(spec)
    return procs


def _detectors(c: _Ctx, raw: object) -> dict[str, dict[str, Any]]:
    dets: dict[str, dict[str, Any]] = {}
    for k, v in _mapping(c, "detectors", raw).items():
        if not isinstance(k, str):
            raise c.err(f"detectors.{_key(k)}", f"unknown detector {show(k)}")
        opts = dict(_mapping(c, f"detectors.{k}", v))
        for ok, ov in opts.items():
            # every detector option is a positive threshold or duration: finite, so a typo
            # (.inf, null, a list) fails here and not as a TypeError in the writer mid-run
            if (not isinstance(ok, str) or isinstance(ov, bool) or not isinstance(ov, int | float)
                    or not (math.isfinite(ov) and 0 < ov < 1e18)):
                raise c.err(f"detectors.{k}.{_key(ok)}", f"expected a positive finite number, got {show(ov)}")
        build_detector(k, opts, source=f"{c.src}: {c.where('detectors')}")
        dets[k] = opts
    return dets


def _sinks(c: _Ctx, raw_sinks: object, procs: Sequence[ProcessorSpec]) -> list[SinkConfig]:
    sinks: list[SinkConfig] = []
    for i, raw in enumerate(_list(c, "sinks", raw_sinks)):
        w = f"sinks[{i}]"
        d = dict(_mapping(c, w, raw))
        stype = d.pop("type", None)
        if not isinstance(stype, str) or stype not in SINK_TYPES:
            raise c.err(f"{w}.type", f"unknown sink {show(stype)}; choose from {', '.join(sorted(SINK_TYPES))}")
        _check_keys(c, w, d, SINK_TYPES[stype])
        if stype == "jsonl" and d.get("path", "-") != "-":
            d["path"] = _out_path(c, f"{w}.path", d["path"])
        elif stype == "duckdb":
            d["path"] = _out_path(c, f"{w}.path", d.get("path", "telemetry.duckdb"))
            if "roll-interval" in d:
                d["roll-interval"] = _dur(c, f"{w}.roll-interval", d["roll-interval"], _S, 24 * _H,
                                          zero_ok=True) / _S
        elif stype == "prometheus":
            _prometheus_options(c, w, d, procs)
        sinks.append(SinkConfig(stype, d))
    return sinks


def _prometheus_options(c: _Ctx, w: str, d: dict[str, Any], procs: Sequence[ProcessorSpec]) -> None:
    if "listen" in d:
        _address(c, f"{w}.listen", d["listen"], listen=True)
    if "prefix" in d and not (isinstance(d["prefix"], str) and _IDENT.match(d["prefix"])):
        raise c.err(f"{w}.prefix", f"expected a Prometheus metric name prefix ([a-zA-Z_][a-zA-Z0-9_]*), "
                                   f"got {show(d['prefix'])}")
    for k in ("counters", "gauges"):
        if k in d:
            d[k] = _strs(c, f"{w}.{k}", d[k])
    for k, hi in (("max-series", 10_000_000), ("max-active-findings", 1_000_000)):
        if k in d:
            d[k] = _int(c, f"{w}.{k}", d[k], 1, hi)
    if "finding-ttl" in d:
        d["finding-ttl"] = _dur(c, f"{w}.finding-ttl", d["finding-ttl"], _S, 7 * 24 * _H) / _S
    # a counter that a rate/delta/downsample processor rewrote in place is a gauge now
    made = [n for p in procs if p.type in _GAUGE_MAKERS for n in p.options.get("names", ("*",))]
    made += [n for p in procs if p.type == "aggregate" and p.options.get("func", "sum") != "sum"
             for n in p.options.get("names", ("*",))]
    if made:
        d["gauges"] = (*d.get("gauges", ()), *made)


_CLUSTER_KEYS = ("nats", "member", "lease", "user", "password-env", "token-env", "creds", "tls-ca", "tls-cert",
                 "tls-key", "max-bytes", "max-age", "storage")
_MEMBER = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def default_member_name() -> str:
    """This host's name made a valid member name (``[A-Za-z0-9_-]``, at most 128 characters)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", os.uname().nodename.split(".")[0])[:128]
    return name or "collector"


def _env_name(c: _Ctx, where: str, v: object) -> str:
    if not isinstance(v, str) or not _ENV_NAME.match(v):
        # never echo it: a secret pasted here by mistake must not land in a log
        raise c.err(where, "expected the NAME of an environment variable (letters, digits, _), "
                           f"got {type(v).__name__} (value not shown)")
    return v


def _cluster(c: _Ctx, raw: object) -> ClusterConfig:
    """The ``cluster:`` section (NATS JetStream bus + target ownership; docs/design/cluster-bus.md)."""
    w = "cluster"
    d = _mapping(c, w, raw)
    _check_keys(c, w, d, _CLUSTER_KEYS)
    if "nats" not in d:
        raise c.err(f"{w}.nats", "required: the NATS URL, e.g. nats://127.0.0.1:4222")
    url = _str(c, f"{w}.nats", d["nats"])
    scheme, sep, rest = url.partition("://")
    host, _, port = rest.rpartition(":")
    if not sep or scheme not in ("nats", "tls") or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise c.err(f"{w}.nats", f"expected nats://host:port or tls://host:port, got {show(url)}")
    member = d.get("member")
    if member is None:
        member = default_member_name()
    elif isinstance(member, bool) or not isinstance(member, str | int) or not _MEMBER.match(str(member)):
        raise c.err(f"{w}.member", f"expected 1-128 letters, digits, '-' or '_', got {show(member)}")
    lease = _dur(c, f"{w}.lease", d.get("lease", "3s"), 200 * _MS, _H)
    user = _str(c, f"{w}.user", d["user"]) if "user" in d else None
    password_env = _env_name(c, f"{w}.password-env", d["password-env"]) if "password-env" in d else None
    token_env = _env_name(c, f"{w}.token-env", d["token-env"]) if "token-env" in d else None
    creds = _file(c, f"{w}.creds", d["creds"]) if "creds" in d else None
    if password_env is not None and user is None:
        raise c.err(f"{w}.user", "password-env is given but no user")
    if sum(x is not None for x in (user, token_env, creds)) > 1:
        raise c.err(w, "user, token-env and creds: choose one authentication method")
    tls = {k: _file(c, f"{w}.{k}", d[k]) for k in ("tls-ca", "tls-cert", "tls-key") if k in d}
    if ("tls-cert" in tls) != ("tls-key" in tls):
        raise c.err(f"{w}.tls-cert", "give tls-cert and tls-key together (a client certificate), or neither")
    storage = _choice(c, f"{w}.storage", d.get("storage", "file"), ("file", "memory"))
    return ClusterConfig(
        nats=url, member=str(member), lease_ns=lease, user=user, password_env=password_env, token_env=token_env,
        creds=creds, tls_ca=tls.get("tls-ca"), tls_cert=tls.get("tls-cert"), tls_key=tls.get("tls-key"),
        max_bytes=_int(c, f"{w}.max-bytes", d.get("max-bytes", 1 << 30), 1 << 20, 1 << 50),
        max_age_ns=_dur(c, f"{w}.max-age", d.get("max-age", "24h"), _S, 365 * 24 * _H),
        storage=storage)


def parse_config(data: object, *, source: str = "<config>", labels: Mapping[str, str] | None = None) -> CollectorConfig:
    """Validate a decoded YAML document into a :class:`CollectorConfig`.

    Every problem is one :class:`ConfigError` naming ``source``, the field and the value
    (secrets never shown); ``labels`` renames internal field paths for configs assembled
    from command-line flags (``{"subscriptions.cli.sample-interval": "--interval"}``).
    """
    c = _Ctx(source, labels or {})
    top = _mapping(c, "<top>", data)
    _check_keys(c, "<top>", top, ("targets", "subscriptions", "processors", "detectors", "sinks", "buffer", "backoff",
                                  "workers", "inventory", "stale-after", "keepalive", "stats-interval", "shutdown",
                                  "cluster"))
    inventory = _file(c, "inventory", top["inventory"]) if top.get("inventory") is not None else None
    subs: dict[str, SubscriptionConfig] = {}
    for name, raw in _mapping(c, "subscriptions", top.get("subscriptions")).items():
        n = _name(c, "subscriptions", name)
        subs[n] = _subscription(c, n, raw)
    if not subs:
        raise c.err("subscriptions", "at least one subscription is required")
    targets = [_target(c, _name(c, "targets", name), raw, subs)
               for name, raw in _mapping(c, "targets", top.get("targets")).items()]
    if not targets:
        raise c.err("targets", "at least one target is required")
    procs = _processors(c, top.get("processors"), inventory is not None)
    dets = _detectors(c, top.get("detectors"))
    sinks = _sinks(c, top.get("sinks"), procs)
    buf = _mapping(c, "buffer", top.get("buffer"))
    _check_keys(c, "buffer", buf, ("max-events", "batch", "flush-interval"))
    bo = _mapping(c, "backoff", top.get("backoff"))
    _check_keys(c, "backoff", bo, ("initial", "max"))
    max_events = _int(c, "buffer.max-events", buf.get("max-events", 1_000_000), 1, 100_000_000)
    batch = _int(c, "buffer.batch", buf.get("batch", 20_000), 1, 10_000_000)
    workers = _int(c, "workers", top.get("workers", 1), 1, 256)
    initial = _dur(c, "backoff.initial", bo.get("initial", "200ms"), _MS, _H)
    shut = _mapping(c, "shutdown", top.get("shutdown"))
    _check_keys(c, "shutdown", shut, ("deadline", "spill-file"))
    stale_after = top.get("stale-after", 3)
    if isinstance(stale_after, bool) or not isinstance(stale_after, int | float) or not 0 <= stale_after <= 1000:
        raise c.err("stale-after", f"expected a number of sample intervals 0-1000 (0: off), got {show(stale_after)}")
    return CollectorConfig(
        targets=tuple(targets), subscriptions=subs, processors=tuple(procs), detectors=dets,
        sinks=tuple(sinks), buffer_max_events=max_events, batch_max=batch,
        flush_interval_ns=_dur(c, "buffer.flush-interval", buf.get("flush-interval", "200ms"), _MS, _H),
        backoff_initial_ns=initial,
        backoff_max_ns=_dur(c, "backoff.max", bo.get("max", "30s"), initial, _MAX_INTERVAL_NS),
        workers=workers,
        inventory=inventory,
        source=source,
        stale_after=float(stale_after),
        keepalive_ns=_dur(c, "keepalive", top.get("keepalive", "5m"), _S, _H, zero_ok=True),
        stats_interval_ns=_dur(c, "stats-interval", top.get("stats-interval", "10s"), 100 * _MS, _H, zero_ok=True),
        shutdown_deadline_ns=_dur(c, "shutdown.deadline", shut.get("deadline", "5s"), 0, _H),
        spill_file=_out_path(c, "shutdown.spill-file", shut["spill-file"]) if shut.get("spill-file") else None,
        cluster=_cluster(c, top["cluster"]) if top.get("cluster") is not None else None,
    )


def load_config(path: str | Path) -> CollectorConfig:
    """Read and validate a YAML config file; every failure is one :class:`ConfigError` naming it."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(_MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    if len(raw) > _MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {_MAX_CONFIG_BYTES >> 20} MiB; expected a YAML collector config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          "expected a YAML collector config") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # problem + position only: the snippet PyYAML quotes could be a password line
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{p}:{where} not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to be a collector config") from None
    return parse_config(data, source=str(p))
