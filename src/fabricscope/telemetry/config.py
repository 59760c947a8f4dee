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
      - {type: duckdb, path: telemetry.duckdb}
      - {type: prometheus, listen: 127.0.0.1:9273}
      - {type: jsonl, path: "-"}
    buffer: {max-events: 1000000, batch: 20000, flush-interval: 200ms}
    backoff: {initial: 200ms, max: 30s}
    workers: 2                           # collector processes (targets sharded; one DuckDB writer)
    inventory: fabric.yaml               # lets 'aggregate' group by rail / plane / pod / tier

Every error names the file, the field and the value (``collector.yaml: subscriptions.counters.mode:
expected once|poll|stream, got 'streem'``).
"""

from __future__ import annotations

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
    "CollectorConfig",
    "SinkConfig",
    "SubscriptionConfig",
    "TLSConfig",
    "TargetConfig",
    "load_config",
    "parse_config",
    "parse_duration_ns",
]

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
          "m": 60_000_000_000, "h": 3_600_000_000_000}
_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|m|h)\s*$")


def parse_duration_ns(v: object, field_name: str = "duration") -> int:
    """``"1s"``, ``"250ms"``, ``"5m"`` or a number of seconds -> integer ns."""
    if isinstance(v, bool):
        raise ConfigError(f"{field_name}: expected a duration like 1s or 250ms, got {v!r}")
    if isinstance(v, int | float):
        if v < 0:
            raise ConfigError(f"{field_name}: must be >= 0, got {v!r}")
        return int(v * 1_000_000_000)
    m = _DUR.match(str(v))
    if not m:
        raise ConfigError(f"{field_name}: expected a duration like 1s or 250ms, got {v!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


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

    def subscriptions_of(self, t: TargetConfig) -> tuple[SubscriptionConfig, ...]:
        names = t.subscriptions or tuple(self.subscriptions)
        return tuple(self.subscriptions[n] for n in names)


SINK_TYPES: Mapping[str, frozenset[str]] = {
    "duckdb": frozenset({"path", "table"}),
    "prometheus": frozenset({"listen", "prefix"}),
    "jsonl": frozenset({"path"}),
    "memory": frozenset(),
}


def _check_keys(src: str, where: str, d: Mapping[str, Any], allowed: Sequence[str] | frozenset[str]) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{src}: {where}.{k}: unknown field; allowed: {', '.join(sorted(allowed))}")


def _mapping(src: str, where: str, v: object) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{src}: {where}: expected a mapping, got {type(v).__name__} {v!r}")
    return v


def _bool(src: str, where: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{src}: {where}: expected true/false, got {v!r}")
    return v


def _choice(src: str, where: str, v: object, options: Sequence[str]) -> str:
    s = str(v).lower().replace("_", "-") if v is not None else ""
    opts = [o.replace("_", "-") for o in options]
    if s not in opts:
        raise ConfigError(f"{src}: {where}: expected {'|'.join(options)}, got {v!r}")
    return options[opts.index(s)]


def _dur(src: str, where: str, v: object) -> int:
    return parse_duration_ns(v, f"{src}: {where}")


def _strs(src: str, where: str, v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{src}: {where}: expected a list of strings, got {v!r}")
    return tuple(v)


def _address(src: str, where: str, v: object) -> str:
    s = str(v or "")
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{src}: {where}: expected host:port, got {v!r}")
    return s


def parse_config(data: object, *, source: str = "<config>") -> CollectorConfig:
    """Validate a decoded YAML document into a :class:`CollectorConfig`."""
    src = source
    top = _mapping(src, "<top>", data)
    _check_keys(src, "<top>", top, ("targets", "subscriptions", "processors", "detectors", "sinks", "buffer", "backoff",
                                    "workers", "inventory"))
    subs: dict[str, SubscriptionConfig] = {}
    for name, raw in _mapping(src, "subscriptions", top.get("subscriptions")).items():
        w = f"subscriptions.{name}"
        d = _mapping(src, w, raw)
        _check_keys(src, w, d, ("paths", "prefix", "mode", "stream-mode", "sample-interval", "heartbeat-interval",
                                "suppress-redundant", "updates-only", "encoding", "poll-interval"))
        paths = _strs(src, f"{w}.paths", d.get("paths"))
        if not paths:
            raise ConfigError(f"{src}: {w}.paths: at least one path is required")
        for i, p in enumerate(paths):
            parse_path(p, source=f"{src}: {w}.paths[{i}]")
        if d.get("prefix"):
            parse_path(str(d["prefix"]), source=f"{src}: {w}.prefix")
        si = _dur(src, f"{w}.sample-interval", d.get("sample-interval", "1s"))
        if si < 1_000_000:
            raise ConfigError(f"{src}: {w}.sample-interval: must be >= 1ms, got {d.get('sample-interval')!r}")
        subs[str(name)] = SubscriptionConfig(
            name=str(name), paths=paths, prefix=str(d.get("prefix", "")),
            mode=_choice(src, f"{w}.mode", d.get("mode", "stream"), ("once", "poll", "stream")),
            stream_mode=_choice(src, f"{w}.stream-mode", d.get("stream-mode", "sample"),
                                ("sample", "on-change", "target-defined")),
            sample_interval_ns=si,
            heartbeat_interval_ns=_dur(src, f"{w}.heartbeat-interval", d.get("heartbeat-interval", 0)),
            suppress_redundant=_bool(src, f"{w}.suppress-redundant", d.get("suppress-redundant", False)),
            updates_only=_bool(src, f"{w}.updates-only", d.get("updates-only", False)),
            encoding=_choice(src, f"{w}.encoding", d.get("encoding", "proto"), ("proto", "json_ietf")),
            poll_interval_ns=_dur(src, f"{w}.poll-interval", d.get("poll-interval", "10s")),
        )
    if not subs:
        raise ConfigError(f"{src}: subscriptions: at least one subscription is required")
    targets: list[TargetConfig] = []
    for name, raw in _mapping(src, "targets", top.get("targets")).items():
        w = f"targets.{name}"
        d = _mapping(src, w, raw)
        _check_keys(src, w, d, ("address", "names", "username", "password", "password-env", "tls", "subscriptions"))
        tls = None
        if "tls" in d:
            td = _mapping(src, f"{w}.tls", d["tls"])
            _check_keys(src, f"{w}.tls", td, ("ca-file", "cert-file", "key-file", "server-name"))
            tls = TLSConfig(td.get("ca-file"), td.get("cert-file"), td.get("key-file"), td.get("server-name"))
        sub_names = _strs(src, f"{w}.subscriptions", d.get("subscriptions", []))
        for s in sub_names:
            if s not in subs:
                raise ConfigError(f"{src}: {w}.subscriptions: unknown subscription {s!r}; defined: {', '.join(subs)}")
        if "password" in d and "password-env" in d:
            raise ConfigError(f"{src}: {w}: give password or password-env, not both")
        targets.append(TargetConfig(
            name=str(name), address=_address(src, f"{w}.address", d.get("address")),
            names=_strs(src, f"{w}.names", d.get("names", [str(name)])),
            username=d.get("username"), password=d.get("password"), password_env=d.get("password-env"),
            tls=tls, subscriptions=sub_names,
        ))
    if not targets:
        raise ConfigError(f"{src}: targets: at least one target is required")
    procs: list[ProcessorSpec] = []
    raw_procs = top.get("processors") or []
    if not isinstance(raw_procs, list):
        raise ConfigError(f"{src}: processors: expected a list, got {raw_procs!r}")
    for i, raw in enumerate(raw_procs):
        w = f"processors[{i}]"
        d = dict(_mapping(src, w, raw))
        ptype = d.pop("type", None)
        if ptype not in OPTIONS:
            raise ConfigError(f"{src}: {w}.type: unknown processor {ptype!r}; choose from {', '.join(sorted(OPTIONS))}")
        _check_keys(src, w, d, OPTIONS[ptype])
        spec = ProcessorSpec(ptype, d)
        if ptype == "aggregate" and "groups" not in d:
            if not top.get("inventory"):
                raise ConfigError(f"{src}: {w}.groups: give groups (device: label) or a top-level inventory file "
                                  f"to group by {d.get('by', 'rail')!r}")
            d = {**d, "groups": {}}  # resolved from the inventory when the collector starts
        build_processor(ProcessorSpec(ptype, d), source=f"{src}: {w}")  # validates option values now
        procs.append(spec)
    dets = {str(k): dict(_mapping(src, f"detectors.{k}", v))
            for k, v in _mapping(src, "detectors", top.get("detectors")).items()}
    for k, v in dets.items():
        build_detector(k, v, source=f"{src}: detectors")
    sinks: list[SinkConfig] = []
    raw_sinks = top.get("sinks") or []
    if not isinstance(raw_sinks, list):
        raise ConfigError(f"{src}: sinks: expected a list, got {raw_sinks!r}")
    for i, raw in enumerate(raw_sinks):
        w = f"sinks[{i}]"
        d = dict(_mapping(src, w, raw))
        stype = d.pop("type", None)
        if stype not in SINK_TYPES:
            raise ConfigError(f"{src}: {w}.type: unknown sink {stype!r}; choose from {', '.join(sorted(SINK_TYPES))}")
        _check_keys(src, w, d, SINK_TYPES[stype])
        if stype == "prometheus" and "listen" in d:
            _address(src, f"{w}.listen", d["listen"])
        sinks.append(SinkConfig(stype, d))
    buf = _mapping(src, "buffer", top.get("buffer"))
    _check_keys(src, "buffer", buf, ("max-events", "batch", "flush-interval"))
    bo = _mapping(src, "backoff", top.get("backoff"))
    _check_keys(src, "backoff", bo, ("initial", "max"))
    max_events = buf.get("max-events", 1_000_000)
    batch = buf.get("batch", 20_000)
    workers = top.get("workers", 1)
    for where, v in (("buffer.max-events", max_events), ("buffer.batch", batch), ("workers", workers)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{src}: {where}: expected a positive integer, got {v!r}")
    return CollectorConfig(
        targets=tuple(targets), subscriptions=subs, processors=tuple(procs), detectors=dets,
        sinks=tuple(sinks), buffer_max_events=max_events, batch_max=batch,
        flush_interval_ns=_dur(src, "buffer.flush-interval", buf.get("flush-interval", "200ms")),
        backoff_initial_ns=_dur(src, "backoff.initial", bo.get("initial", "200ms")),
        backoff_max_ns=_dur(src, "backoff.max", bo.get("max", "30s")),
        workers=workers,
        inventory=str(top["inventory"]) if top.get("inventory") else None,
        source=src,
    )


def load_config(path: str | Path) -> CollectorConfig:
    """Read and validate a YAML config file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{p}:{where}: not valid YAML: {exc}") from exc
    return parse_config(data, source=str(p))
