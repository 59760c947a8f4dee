"""The builders by name, and building one from loosely typed parameters (CLI, scenario files)."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

from fabricscope.fabric.builders import (
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import InventoryError

BUILDERS: Mapping[str, Callable[..., Fabric]] = {
    "leaf-spine": leaf_spine_fabric,
    "fat-tree": fat_tree_fabric,
    "rail-optimized": rail_optimized_fabric,
    "multi-plane": multi_plane_fabric,
    "dual-tor": dual_tor_fabric,
}

_NONE = {"none", "null", "auto", ""}


def builder_parameters(kind: str) -> dict[str, tuple[str, object]]:
    """``{name: (type text, default)}`` of a builder; the default is ``inspect._empty`` when required."""
    fn = _builder(kind, source="topology")
    hints = typing.get_type_hints(fn)
    return {
        name: (_type_text(hints[name]), p.default)
        for name, p in inspect.signature(fn).parameters.items()
    }


def _type_text(tp: object) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in args)
    if args:
        return " or ".join(_type_text(a) for a in args if a is not type(None)) + (
            " (optional)" if type(None) in args else ""
        )
    return getattr(tp, "__name__", str(tp))


def _builder(kind: str, *, source: str) -> Callable[..., Fabric]:
    fn = BUILDERS.get(kind.replace("_", "-").lower())
    if fn is None:
        raise InventoryError(f"{source}: kind: unknown topology {kind!r}; choose one of {', '.join(BUILDERS)}")
    return fn


def _convert(value: object, tp: object, where: str) -> object:
    """``value`` as type ``tp`` (int, float, str, a Literal, or ``X | None``)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        opts = typing.get_args(tp)
        is_none = value is None or (isinstance(value, str) and value.strip().lower() in _NONE)
        if is_none and type(None) in opts:
            return None
        errors = []
        for opt in opts:
            if opt is type(None):
                continue
            try:
                return _convert(value, opt, where)
            except InventoryError as exc:
                errors.append(str(exc))
        raise InventoryError(errors[0] if errors else f"{where}: cannot use {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise InventoryError(f"{where}: expected one of {', '.join(map(str, allowed))}, got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
            return value.lower() in ("true", "yes", "1")
        raise InventoryError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise InventoryError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise InventoryError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        return str(value)
    raise InventoryError(f"{where}: unsupported parameter type {tp!r}")  # pragma: no cover


def build_fabric(kind: str, params: Mapping[str, Any] | None = None, *, source: str = "topology") -> Fabric:
    """Build a fabric of ``kind`` (``rail-optimized``, ``leaf-spine``, ...) from ``params``.

    Values may be strings (``"128"``, ``"none"``) as they come from a command line or of the
    right type as they come from YAML; names may use ``-`` for ``_``. An unknown kind, an
    unknown parameter or a bad value raises :class:`InventoryError` naming ``source``, the
    parameter and the value, and listing what is known.

    >>> build_fabric("rail-optimized", {"servers": "16", "gpus-per-server": 4}).gpu_count
    64
    """
    fn = _builder(kind, source=source)
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn).parameters
    kwargs: dict[str, object] = {}
    for raw_name, value in (params or {}).items():
        name = str(raw_name).replace("-", "_")
        if name not in sig:
            raise InventoryError(
                f"{source}: {raw_name}: unknown parameter for {kind}; known: {', '.join(sig)}"
            )
        kwargs[name] = _convert(value, hints[name], f"{source}: {raw_name}")
    missing = [n for n, p in sig.items() if p.default is inspect.Parameter.empty and n not in kwargs]
    if missing:
        raise InventoryError(f"{source}: {kind} needs {', '.join(missing)}")
    try:
        return fn(**kwargs)
    except TypeError as exc:  # e.g. a float where range() needs an int
        raise InventoryError(f"{source}: {kind}: {exc}") from None


def parse_fabric_spec(spec: str | list[str], *, source: str = "topology") -> tuple[str, dict[str, str]]:
    """A fabric spec ``KIND[:KEY=VALUE,...]`` -> ``(kind, {key: value})``: the one syntax of
    ``topo build`` and ``sim --topo``.

    Also accepted, for the command lines written before: the parameters as separate words
    (``["rail-optimized", "servers=128"]`` or ``"rail-optimized servers=128"``), and mixed.

    >>> parse_fabric_spec("rail-optimized:servers=128,planes=2")
    ('rail-optimized', {'servers': '128', 'planes': '2'})
    >>> parse_fabric_spec(["leaf-spine", "leaves=4"])
    ('leaf-spine', {'leaves': '4'})
    """
    words = spec.split() if isinstance(spec, str) else [w for item in spec for w in item.split()]
    if not words:
        raise InventoryError(f"{source}: expected KIND[:KEY=VALUE,...], got {spec!r}")
    kind, _, first = words[0].partition(":")
    if not kind.strip() or "=" in kind:
        raise InventoryError(f"{source}: expected KIND[:KEY=VALUE,...] (KIND first), got {spec!r}")
    items = [x for w in [first, *words[1:]] for x in w.split(",") if x.strip()]
    return kind.strip(), parse_params(items, source=source)


def parse_params(items: list[str], *, source: str = "topology") -> dict[str, str]:
    """``["servers=128", "planes=2"]`` -> ``{"servers": "128", "planes": "2"}``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InventoryError(f"{source}: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out
