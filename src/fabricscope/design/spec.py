"""Design files: what a design is, and the fabric it builds at a given GPU count.

A design file (YAML) names one architecture and its switch choices; the scale comes from the
command line, so one file answers "what does this cost at 8k and at 32k GPUs?"::

    name: rail-2tier-51T            # shown in every table
    kind: rail-optimized            # fat-tree | rail-optimized | multi-plane | dual-tor
    params: {radix: 128, nic_gbps: 400, spine_mode: per-rail}
    catalog: {}                     # overrides of the price / power catalog (design.catalog)
    failures: {}                    # overrides of the failure-rate table (design.reliability)

``fat-tree`` is the standard (non-rail) Clos: the ``gpus_per_server`` NICs of a server all
cable to its ToR, as many tiers as the radix needs (two while the leaves fit one spine's
ports, else three: Al-Fares et al., SIGCOMM'08, with parallel links to fewer cores when the
fabric is smaller than k^3/4). The rail family (``rail-optimized``, ``multi-plane``,
``dual-tor``) is the builders' own sizing (docs/design/fabric-rail-layout.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricscope.fabric.builders import (
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError, InventoryError
from fabricscope.model.yamlfile import read_yaml

DESIGN_KINDS: tuple[str, ...] = ("fat-tree", "rail-optimized", "multi-plane", "dual-tor")
_RAIL_BUILDERS = {
    "rail-optimized": rail_optimized_fabric,
    "multi-plane": multi_plane_fabric,
    "dual-tor": dual_tor_fabric,
}
#: Keys a fat-tree design accepts (its own sizing; the rail family takes its builder's keys).
FAT_TREE_PARAMS: tuple[str, ...] = (
    "radix", "nic_gbps", "gpus_per_server", "oversubscription", "latency_ns",
)
_RAIL_PARAMS: tuple[str, ...] = (
    "gpus_per_server", "nic_gbps", "radix", "servers_per_leaf", "oversubscription",
    "uplink_gbps", "spines", "planes", "spine_mode", "pods", "servers_per_pod",
    "core_oversubscription", "latency_ns",
)
_KEYS = ("name", "kind", "params", "catalog", "failures", "notes")


@dataclass(frozen=True)
class DesignSpec:
    """One design: an architecture ``kind``, its builder ``params`` and per-design overrides."""

    name: str
    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)
    catalog: Mapping[str, Any] = field(default_factory=dict)
    failures: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""
    source: str = "design"

    @property
    def gpus_per_server(self) -> int:
        return int(self.params.get("gpus_per_server", 8))

    def __post_init__(self) -> None:
        src = self.source
        if self.kind not in DESIGN_KINDS:
            raise ConfigError(f"{src}: kind: unknown {self.kind!r}; choose one of {', '.join(DESIGN_KINDS)}")
        allowed = FAT_TREE_PARAMS if self.kind == "fat-tree" else _RAIL_PARAMS
        if self.kind == "multi-plane":
            allowed = tuple(k for k in allowed if k != "spine_mode")
        if self.kind == "dual-tor":
            allowed = tuple(k for k in allowed if k not in ("spine_mode", "planes"))
        for k in self.params:
            if k not in allowed:
                raise ConfigError(f"{src}: params.{k}: not a {self.kind} parameter (known: {', '.join(allowed)})")
        g = self.params.get("gpus_per_server", 8)
        if not isinstance(g, int) or isinstance(g, bool) or g < 1:
            raise ConfigError(f"{src}: params.gpus_per_server: must be an integer >= 1, got {g!r}")


def design_from_mapping(data: object, *, source: str) -> DesignSpec:
    """A :class:`DesignSpec` from parsed YAML; every error names ``source`` and the field."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with name, kind, params; got {type(data).__name__}")
    for k in data:
        if k not in _KEYS:
            raise ConfigError(f"{source}: {k}: unknown key (known: {', '.join(_KEYS)})")
    for k in ("name", "kind"):
        if not isinstance(data.get(k), str) or not data.get(k):
            raise ConfigError(f"{source}: {k}: required, a non-empty string; got {data.get(k)!r}")
    maps: dict[str, Mapping[str, Any]] = {}
    for k in ("params", "catalog", "failures"):
        v = data.get(k) or {}
        if not isinstance(v, Mapping):
            raise ConfigError(f"{source}: {k}: must be a mapping, got {v!r}")
        maps[k] = dict(v)
    notes = data.get("notes", "")
    return DesignSpec(
        name=str(data["name"]), kind=str(data["kind"]), params=maps["params"],
        catalog=maps["catalog"], failures=maps["failures"], notes=str(notes or ""), source=source,
    )


def load_design(path: str | Path) -> DesignSpec:
    """Read one design file (YAML). Missing file or bad YAML: :class:`ConfigError`."""
    return design_from_mapping(read_yaml(path, what="design file"), source=str(path))


def servers_for(spec: DesignSpec, gpus: int) -> int:
    """Servers of ``gpus_per_server`` GPUs that make ``gpus``; a remainder is an error."""
    g = spec.gpus_per_server
    if gpus < g or gpus % g:
        raise ConfigError(
            f"{spec.source}: gpus: {gpus} is not a whole number of {g}-GPU servers "
            f"(try {max(g, gpus // g * g)})"
        )
    return gpus // g


def check_size(spec: DesignSpec, gpus: int) -> None:
    """Fail fast (before any build) when ``spec`` cannot be sized at ``gpus`` GPUs.

    Exact for the fat tree (its sizing is planned here); the rail family's builder checks
    the rest of its sizes when it builds.
    """
    servers = servers_for(spec, gpus)
    if spec.kind == "fat-tree":
        _standard_plan(spec, servers)


def build_design(spec: DesignSpec, gpus: int) -> Fabric:
    """The fabric of ``spec`` at ``gpus`` GPUs. Impossible sizes: :class:`ConfigError`."""
    servers = servers_for(spec, gpus)
    try:
        if spec.kind == "fat-tree":
            two_tier, kw = _standard_plan(spec, servers)
            return (leaf_spine_fabric if two_tier else fat_tree_fabric)(**kw)
        builder = _RAIL_BUILDERS[spec.kind]
        params = {k: v for k, v in spec.params.items()}
        return builder(servers, name=f"{spec.name}-{gpus}", **params)
    except InventoryError as exc:
        raise ConfigError(f"{spec.source}: {spec.name} at {gpus} GPUs: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{spec.source}: params: {exc}") from None


def _divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(n, max(cap, 1)), 0, -1):
        if n % d == 0:
            return d
    return 1


def _standard_plan(spec: DesignSpec, servers: int) -> tuple[bool, dict[str, Any]]:
    """Builder arguments of a standard (ToR-per-server-group) fat tree for ``servers``.

    Returns (two tiers?, keyword arguments of ``leaf_spine_fabric`` / ``fat_tree_fabric``).
    """
    p = spec.params
    src = spec.source
    radix = int(p.get("radix", 64))
    g = spec.gpus_per_server
    gbps = float(p.get("nic_gbps", 400.0))
    over = float(p.get("oversubscription", 1.0))
    latency = int(p.get("latency_ns", 1000))
    if radix < 4 or over <= 0:
        raise ConfigError(f"{src}: params: radix must be >= 4 and oversubscription > 0")
    # ToR: as many whole servers as fit with their uplinks at the oversubscription.
    hpt = 0
    for h in range(radix // g, 0, -1):
        down = h * g
        if down + -(-down // over) <= radix:
            hpt = h
            break
    if hpt == 0:
        raise ConfigError(f"{src}: params.radix: a {radix}-port ToR cannot serve one {g}-GPU server and its uplinks")
    tor_up = int(-(-(hpt * g) // over))
    tors = -(-servers // hpt)
    if servers % hpt:
        raise ConfigError(
            f"{src}: gpus: {servers} servers do not fill {hpt}-server ToRs "
            f"(use a multiple of {hpt * g} GPUs)"
        )
    name = f"{spec.name}-{servers * g}"
    if tors <= radix:
        lps = _divisor_at_most(tor_up, radix // tors)
        return True, {
            "leaves": tors, "hosts_per_leaf": hpt, "spines": tor_up // lps,
            "links_per_spine": lps, "nics_per_host": g, "host_gbps": gbps,
            "latency_ns": latency, "name": name, "radix": radix,
        }
    # Three tiers: a pod is as many ToRs as one aggregation switch's down half serves.
    aggs = tor_up  # one link from every ToR to every aggregation switch of its pod
    agg_down = radix // 2
    tpp = min(agg_down, tors)
    if tors % tpp:
        raise ConfigError(
            f"{src}: gpus: {tors} ToRs do not fill pods of {tpp} "
            f"(use a multiple of {tpp * hpt * g} GPUs)"
        )
    pods = tors // tpp
    if pods > radix:
        raise ConfigError(
            f"{src}: gpus: {pods} pods exceed the {radix} ports of a core (three tiers of "
            f"radix {radix} reach {radix * tpp * hpt * g} GPUs)"
        )
    agg_up = tpp  # non-blocking above the ToR layer
    lpc = _divisor_at_most(agg_up, radix // pods)
    return False, {
        "pods": pods, "tors_per_pod": tpp, "aggs_per_pod": aggs, "hosts_per_tor": hpt,
        "cores_per_plane": agg_up // lpc, "links_per_core": lpc, "nics_per_host": g,
        "gbps": gbps, "latency_ns": latency, "name": name, "radix": radix,
    }
