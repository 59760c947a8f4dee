"""Collector config validation: every bad value is ONE ConfigError naming field and value.

The regression cases are the ones from the issue (each gave a traceback or passed validation
and failed at connect); the fuzz target throws arbitrary YAML-like values at every known key
and asserts a valid config or one ConfigError, never another exception, never a secret echoed.
"""

from __future__ import annotations

import copy
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.model.errors import ConfigError
from fabricscope.telemetry.config import CollectorConfig, load_config, parse_config
from fuzzing import fuzz_settings

SECRET = "S3CRET-SENTINEL-pw"


def _good(tmp: Path) -> dict[str, Any]:
    return {
        "targets": {"t": {"address": "127.0.0.1:9339", "names": ["leaf-0"], "username": "admin",
                          "password": SECRET, "subscriptions": ["s"]}},
        "subscriptions": {"s": {"paths": ["/interfaces/interface[name=*]/state/counters"], "mode": "stream",
                                "stream-mode": "sample", "sample-interval": "1s", "heartbeat-interval": "10s",
                                "encoding": "proto", "poll-interval": "10s"}},
        "processors": [{"type": "filter", "action": "drop", "names": ["*/in-discards"]},
                       {"type": "rate", "names": ["*octets"]}],
        "detectors": {"micro-burst": {"watermark-bytes": 1_000_000}, "error-increase": {}},
        "sinks": [{"type": "jsonl", "path": str(tmp / "out.jsonl")},
                  {"type": "prometheus", "listen": "127.0.0.1:9273"},
                  {"type": "duckdb", "path": str(tmp / "t.duckdb"), "roll-interval": "1m"}],
        "buffer": {"max-events": 1000, "batch": 100, "flush-interval": "200ms"},
        "backoff": {"initial": "200ms", "max": "30s"},
        "workers": 1,
    }


def _with(base: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    d = copy.deepcopy(base)
    node: Any = d
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split("/")]
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    return d


def _error(cfg: object) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_config(cfg, source="c.yaml")
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("c.yaml: "), msg
    assert SECRET not in msg, msg
    return msg


def test_the_good_config_is_valid(tmp_path: Path) -> None:
    cfg = parse_config(_good(tmp_path), source="c.yaml")
    assert isinstance(cfg, CollectorConfig) and cfg.targets[0].password == SECRET
    assert SECRET not in repr(cfg)
    prom = next(s for s in cfg.sinks if s.type == "prometheus")
    assert "*octets" in prom.options["gauges"]  # the rate processor made those gauges
    duck = next(s for s in cfg.sinks if s.type == "duckdb")
    assert duck.options["roll-interval"] == 60.0


@pytest.mark.parametrize(("path", "value", "field", "shown"), [
    ("processors/0/type", ["a"], "processors[0].type", "['a']"),
    ("sinks/0/type", {"a": 1}, "sinks[0].type", "{'a': 1}"),
    ("subscriptions/s/sample-interval", math.inf, "subscriptions.s.sample-interval", "inf"),
    ("subscriptions/s/sample-interval", math.nan, "subscriptions.s.sample-interval", "nan"),
    ("subscriptions/s/heartbeat-interval", 1_000_000_000_000, "subscriptions.s.heartbeat-interval", "1000000000000"),
    ("subscriptions/s/sample-interval", "99999999h", "subscriptions.s.sample-interval", "'99999999h'"),
    ("detectors/micro-burst/watermark-bytes", None, "detectors.micro-burst.watermark-bytes", "None"),
    ("detectors/micro-burst/watermark-bytes", math.inf, "detectors.micro-burst.watermark-bytes", "inf"),
    ("targets/t/tls", {"ca-file": 5}, "targets.t.tls.ca-file", "5"),
    ("targets/t/tls", {"ca-file": "/nonexistent/ca.pem"}, "targets.t.tls.ca-file", "/nonexistent/ca.pem"),
    ("targets/t/address", 9339, "targets.t.address", "9339"),
    ("targets/t/names", [1, 2], "targets.t.names", "[1, 2]"),
    ("targets/t/names", [], "targets.t.names", "at least one"),
    ("sinks/0/path", 2, "sinks[0].path", "int 2"),
    ("sinks/0/path", "/nonexistent-dir/out.jsonl", "sinks[0].path", "/nonexistent-dir"),
    ("sinks/2/path", 3, "sinks[2].path", "int 3"),
    ("sinks/1/listen", "127.0.0.1:99999", "sinks[1].listen", "99999"),
    ("sinks/1/prefix", "bad-prefix", "sinks[1].prefix", "'bad-prefix'"),
    ("buffer/max-events", 10**12, "buffer.max-events", "1000000000000"),
    ("workers", 1.5, "workers", "1.5"),
    ("backoff/max", "1ms", "backoff.max", "'1ms'"),
    ("subscriptions/s/mode", ["stream"], "subscriptions.s.mode", "['stream']"),
    ("subscriptions/s/prefix", ["x"], "subscriptions.s.prefix", "['x']"),
    ("processors", {"type": "rate"}, "processors", "{'type': 'rate'}"),
])
def test_bad_value_is_one_config_error_naming_field_and_value(tmp_path: Path, path: str, value: object,
                                                              field: str, shown: str) -> None:
    msg = _error(_with(_good(tmp_path), path, value))
    assert field in msg and shown in msg, msg


def test_a_directory_is_not_a_sink_file(tmp_path: Path) -> None:
    msg = _error(_with(_good(tmp_path), "sinks/0/path", str(tmp_path)))
    assert "sinks[0].path" in msg and "is a directory" in msg


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_sink_directory_fails_validation(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    msg = _error(_with(_good(tmp_path), "sinks/0/path", str(ro / "x.jsonl")))
    assert "sinks[0].path" in msg and "permission denied" in msg


def test_passwords_are_never_echoed(tmp_path: Path) -> None:
    good = _good(tmp_path)
    # an integer password passes YAML but fails at connect: refuse it, without showing it
    msg = _error(_with(good, "targets/t/password", 987654321))
    assert "targets.t.password" in msg and "987654321" not in msg and "quote it" in msg
    # a misspelt key: the key is named, its value (the secret) is not
    t = dict(good["targets"]["t"])
    t["pasword"] = t.pop("password")
    msg = _error(_with(good, "targets/t", t))
    assert "targets.t.pasword" in msg and "unknown field" in msg
    # the password pasted where the variable NAME belongs
    t = dict(good["targets"]["t"])
    del t["password"]
    t["password-env"] = "hunter2 with spaces!"
    msg = _error(_with(good, "targets/t", t))
    assert "targets.t.password-env" in msg and "hunter2" not in msg
    # a whole target given as a list: the value is shown, the password in it redacted
    msg = _error(_with(good, "targets", [{"password": SECRET, "address": "127.0.0.1:1"}]))
    assert "targets" in msg and "<redacted>" in msg


def test_labels_name_the_flag_the_user_typed() -> None:
    cfg = {"targets": {"cli": {"address": "127.0.0.1:1"}},
           "subscriptions": {"cli": {"paths": ["/a"], "sample-interval": 0.0001}}}
    with pytest.raises(ConfigError) as ei:
        parse_config(cfg, source="gnmi subscribe", labels={"subscriptions.cli.sample-interval": "--interval",
                                                            "subscriptions.cli.paths": "PATH"})
    assert str(ei.value).startswith("gnmi subscribe: --interval: must be between 1ms and 24h"), ei.value
    assert "subscriptions.cli" not in str(ei.value)
    cfg["subscriptions"]["cli"] = {"paths": ["/a", "/b[x"]}
    with pytest.raises(ConfigError, match=r"PATH\[1\]"):
        parse_config(cfg, source="gnmi subscribe", labels={"subscriptions.cli.paths": "PATH"})


def test_load_config_binary_and_bad_yaml_files(tmp_path: Path) -> None:
    binf = tmp_path / "blob.bin"
    binf.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match=r"blob\.bin: not UTF-8 text \(byte 0x80 at offset 128\)"):
        load_config(binf)
    y = tmp_path / "bad.yaml"
    y.write_text(f"targets:\n  t: {{password: {SECRET}: x}}\n")
    with pytest.raises(ConfigError) as ei:
        load_config(y)
    assert "bad.yaml: line 2" in str(ei.value) and SECRET not in str(ei.value), ei.value
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)


def test_cli_collect_with_a_binary_config_is_one_line_exit_2(tmp_path: Path) -> None:
    binf = tmp_path / "blob.bin"
    binf.write_bytes(b"\x00\xff\xfe" * 100)
    p = subprocess.run([sys.executable, "-c", "from fabricscope.cli import main; main()", "gnmi", "collect",
                        "-c", str(binf)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "blob.bin" in lines[0] and "Traceback" not in p.stderr, p.stderr


# ------------------------------------------------------------------ fuzz
_KEYS = ["targets", "subscriptions", "processors", "detectors", "sinks", "buffer", "backoff", "workers",
         "inventory", "address", "names", "username", "password", "password-env", "tls", "ca-file", "cert-file",
         "key-file", "server-name", "paths", "prefix", "mode", "stream-mode", "sample-interval",
         "heartbeat-interval", "suppress-redundant", "updates-only", "encoding", "poll-interval", "type",
         "action", "tags", "pattern", "replacement", "window", "funcs", "by", "groups", "func", "keep-original",
         "path", "listen", "roll-interval", "counters", "gauges", "max-series", "max-events", "batch",
         "flush-interval", "initial", "max", "watermark-bytes", "micro-burst", "rate", "duckdb", "jsonl"]
_EDGE: list[object] = [None, True, False, 0, 1, -1, 2**63, 2**70, -(2**70), 10**12, 0.5, -0.0, 1e300,
                       math.inf, -math.inf, math.nan, "", " ", "1s", "0ms", "1e9h", "99999999h", "-",
                       "127.0.0.1:0", "127.0.0.1:9339", "127.0.0.1:99999", "/interfaces", "/a[b", "stream",
                       "poll", "once", "sample", "on-change", "s", "t", "*", "rate", "filter", "aggregate",
                       "downsample", "delta", "rename", "duckdb", "jsonl", "prometheus", "memory", "drop", "keep",
                       "sum", "mean", "(", "[", ".", "/", "proto", "json_ietf", "ENV_X", "\x00", "ü" * 3]


def _value(rng: random.Random, depth: int = 0) -> object:
    """A YAML-like value: edge-case leaves, random scalars, nested lists / mappings."""
    r = rng.random()
    if depth < 3 and r < 0.15:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and r < 0.3:
        keys = [rng.choice(_KEYS) if rng.random() < 0.7 else rng.choice(_EDGE[:8]) for _ in range(rng.randrange(4))]
        return {k: _value(rng, depth + 1) for k in keys if not isinstance(k, float)}
    if r < 0.75:
        return rng.choice(_EDGE)
    if r < 0.85:
        return rng.randint(-(2**65), 2**65)
    if r < 0.92:
        return rng.uniform(-1e6, 1e6)
    return "".join(rng.choice("ab/:*[]=.-_ 0129sm\x7f") for _ in range(rng.randrange(8)))


def _nodes(v: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(v, dict):
        for k, x in v.items():
            out += _nodes(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _nodes(x, (*path, i))
    return out


_TMP = Path(tempfile.mkdtemp(prefix="fs-cfg-fuzz-"))
_BASE = _good(_TMP)
_PATHS = _nodes(_BASE)


@fuzz_settings()
@given(seed=st.integers(min_value=0, max_value=2**64 - 1))
def test_fuzz_config_is_valid_or_one_config_error(seed: int) -> None:
    # Values come from a seeded generator (cheap, so 10,000 examples fit the time budget);
    # Hypothesis drives the seeds and reports the failing one.
    rng = random.Random(seed)
    cfg: Any = copy.deepcopy(_BASE)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_PATHS)
        value = _value(rng)
        if not path:
            cfg = value
            continue
        node = cfg
        try:
            for k in path[:-1]:
                node = node[k]
            if rng.random() < 0.3 and isinstance(node[path[-1]], dict):
                node[path[-1]][rng.choice(_KEYS)] = value  # an extra (known or misplaced) key
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this node
    try:
        got = parse_config(cfg, source="f.yaml")
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith("f.yaml") and "\n" not in msg and SECRET not in msg, msg
        assert len(msg) < 600, msg
    else:
        assert isinstance(got, CollectorConfig)
        for s in got.subscriptions.values():
            assert 1_000_000 <= s.sample_interval_ns <= 86_400 * 10**9
            assert s.heartbeat_interval_ns == 0 or s.heartbeat_interval_ns >= 1_000_000
        for t in got.targets:
            assert t.password is None or isinstance(t.password, str)
        for sk in got.sinks:
            assert not isinstance(sk.options.get("path", "-"), int)
