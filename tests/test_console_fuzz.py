"""Fuzz the console's two readers of user text: the ``serve --config`` file and the twin
fault an operator types (CLI ``--fault`` and ``POST /api/v1/twin/faults``). Each input is
either accepted or one ConfigError naming where it came from, never another exception."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.fabric.catalog import build_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.store_source import read_live_config
from fabricscope.service.supervise_twin import parse_twin_fault
from fuzzing import fuzz_settings

FABRIC = build_fabric("rail-optimized", {"servers": 2}, source="fuzz")
ROOT = Path(__file__).resolve().parents[1]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                     st.text(max_size=30), st.just(str(ROOT / "examples" / "fabric.yaml")),
                     st.just("5s"), st.just("telemetry.duckdb"))
_DOCS = st.dictionaries(
    st.sampled_from(["inventory", "sources", "poll", "x"]),
    st.one_of(_SCALARS, st.lists(_SCALARS, max_size=2),
              st.dictionaries(st.sampled_from(["telemetry", "findings", "x"]), _SCALARS,
                              max_size=3)),
    max_size=4)


@fuzz_settings()
@given(st.one_of(st.binary(max_size=300), _DOCS.map(lambda d: yaml.safe_dump(d).encode())))
def test_live_config_is_a_config_or_one_error(tmp_path_factory, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path_factory.getbasetemp() / "console-fuzz.yaml"
    p.write_bytes(raw)
    try:
        read_live_config(p)
    except ConfigError as exc:
        assert str(exc).startswith(f"--config {p}")
        assert "\n" not in str(exc)


_KINDS = st.sampled_from(["gray-loss", "link-down", "pfc-storm", "slow-gpu", "nope", ""])
_SUBJECTS = st.sampled_from(["leaf-p0-r0-00:eth1", "host0000/gpu0", "host0000/nic0",
                             "leaf-p0-r0-00", "x:y->z:w", "a|b", ""])


@fuzz_settings()
@given(st.one_of(st.text(max_size=80),
                 st.builds(lambda k, s, t, kv: f"{k}:{s}{t}{kv}", _KINDS, _SUBJECTS,
                           st.sampled_from(["", "@10s", "@5-2", "@1h-2h", "@x", "@-"]),
                           st.sampled_from(["", ",loss=0.1", ",loss=x", ",=", ",a", ",k=1e309"]))))
def test_twin_fault_is_a_fault_or_one_error(text: str) -> None:
    try:
        f = parse_twin_fault(text, FABRIC, source="fault")
    except ConfigError as exc:
        assert str(exc).startswith("fault")
    else:
        assert f.end_ns is None or f.end_ns >= f.start_ns
