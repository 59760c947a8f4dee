"""Fuzz the inventory reader (issue 8): ``parse_fabric`` on mutated inventory text gives a
Fabric or one :class:`InventoryError` naming the source, never another exception.

Found by this target and fixed: a cabled spine relabelled as a host (KeyError), and a deeply
nested JSON / YAML document (RecursionError).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.fabric import leaf_spine_fabric
from fabricscope.fabric.inventory import ROLES
from fabricscope.fabric.io import fabric_to_dict, parse_fabric
from fabricscope.fabric.summary import summarize
from fabricscope.model.errors import InventoryError
from fuzzing import fuzz_settings

_BASE = {k: v for k, v in fabric_to_dict(leaf_spine_fabric(leaves=2, hosts_per_leaf=1, spines=2, nics_per_host=2)).items()
         if k != "meta"}
# Characters that matter to the reader (id separators, whitespace, a non-ASCII letter); a
# fixed alphabet also spares Hypothesis its unicode tables (seconds at start-up).
_ALPHABET = "ab0:|->/. \n\té"
_SOURCE = "fuzz.inv"
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True), st.text(_ALPHABET, max_size=12),
    st.sampled_from(["host0000", "spine-00", "leaf-000:eth1", "host0000/nic0:p0", "a|b", "1.2.3.4", "::1"]),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(_ALPHABET, max_size=6), inner, max_size=3)), max_leaves=6)

_FIELDS = {
    "devices": ["id", "role", "host", "address", "pod", "plane", "rail", "gpu", "gpus", "extra"],
    "links": ["a", "b", "capacity_gbps", "latency_ns", "extra"],
    "ports": ["id", "speed_gbps"],
}


_OPS = st.sampled_from(["relabel", "set", "drop-item", "drop-key", "dup", "top", "swap-end"])
_SECTIONS = st.sampled_from(["devices", "links", "ports"])
_ROLES = st.sampled_from([*ROLES, "router", 3])
_FIELD = {k: st.sampled_from(v) for k, v in _FIELDS.items()}
_TOP = st.sampled_from(["version", "name", "meta", "devices", "ports", "links", "x"])
_INDEX = st.integers(0, 2**16)  # taken modulo the list's length (one cheap draw, no new strategy)


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(_BASE)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(_OPS)
        section = draw(_SECTIONS)
        items = data.setdefault(section, [])  # may have been replaced by a scalar ("top")
        if not isinstance(items, list):
            continue
        devices, links = data.get("devices"), data.get("links")
        if op == "relabel" and isinstance(devices, list) and devices:  # e.g. a cabled spine as a host
            dev = devices[draw(_INDEX) % len(devices)]
            if isinstance(dev, dict):
                dev["role"] = draw(_ROLES)
                if draw(st.booleans()):
                    dev.pop("host", None)
        elif op == "set":
            if not items:
                items.append({})
            it = items[draw(_INDEX) % len(items)]
            if isinstance(it, dict):
                it[draw(_FIELD[section])] = draw(_values)
        elif op == "drop-item" and items:
            items.pop(draw(_INDEX) % len(items))
        elif op == "drop-key" and items:
            it = items[draw(_INDEX) % len(items)]
            if isinstance(it, dict) and it:
                keys = sorted(it, key=str)
                it.pop(keys[draw(_INDEX) % len(keys)])
        elif op == "dup" and items:
            items.append(copy.deepcopy(items[draw(_INDEX) % len(items)]))
        elif op == "top":
            data[draw(_TOP)] = draw(_values)
        elif op == "swap-end" and isinstance(links, list) and links:
            ln = links[draw(_INDEX) % len(links)]
            if isinstance(ln, dict):
                ln["a"], ln["b"] = ln.get("b"), ln.get("a")
    return data


def _check(text: str, fmt: str) -> None:
    try:
        fab = parse_fabric(text, fmt=fmt, source=_SOURCE)
    except InventoryError as exc:
        msg = str(exc)
        assert msg.startswith(_SOURCE), msg
        assert "\n" not in msg, msg
    else:  # what every reader of the inventory builds next must work too
        assert fab.devices
        fab.index  # noqa: B018
        summarize(fab)


@pytest.mark.slow
@fuzz_settings()
@given(_mutated())
def test_mutated_inventory_is_a_fabric_or_one_inventory_error(data: dict[str, Any]) -> None:
    # JSON: the schema checks (fabric_from_dict) are the same for both formats, and JSON text
    # costs a fifth of YAML's per example; YAML gets its own, smaller target below.
    _check(json.dumps(data), "json")


@fuzz_settings(1000)
@given(_mutated())
def test_mutated_yaml_inventory_is_a_fabric_or_one_inventory_error(data: dict[str, Any]) -> None:
    _check(yaml.dump(data, Dumper=_DUMPER), "yaml")


@fuzz_settings(2000)
@given(st.text(_ALPHABET + '{}[],"\'#&*!%@`', max_size=200), st.sampled_from(["json", "yaml"]))
def test_arbitrary_text_is_one_inventory_error(text: str, fmt: str) -> None:
    _check(text, fmt)


def test_known_crashes_are_inventory_errors() -> None:
    # A cabled spine relabelled as a host (was a KeyError).
    data = copy.deepcopy(_BASE)
    spine = next(d for d in data["devices"] if d["id"] == "spine-00")
    spine["role"] = "host"
    for fmt, text in (("json", json.dumps(data)), ("yaml", yaml.safe_dump(data))):
        _check(text, fmt)
    # Deep nesting (was a RecursionError), in the document and inside a field.
    for fmt, text in (("json", "[" * 100_000 + "]" * 100_000), ("json", '{"version": 1, "meta": ' + "[" * 50_000 + "]" * 50_000 + "}"),
                      ("yaml", "[" * 100_000 + "]" * 100_000), ("yaml", "a:\n" + "".join(" " * i + "- \n" for i in range(1, 3000)))):
        try:
            parse_fabric(text, fmt=fmt, source=_SOURCE)
        except InventoryError as exc:
            assert str(exc).startswith(_SOURCE)
            assert "nest" in str(exc) or "expected" in str(exc) or "malformed" in str(exc), str(exc)
