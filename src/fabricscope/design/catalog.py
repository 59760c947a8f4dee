"""The price and power catalog of a fabric design: switch models, media by reach class, NICs.

A :class:`Catalog` holds every figure the bill of materials multiplies: switch models
(radix x port speed, chip capacity, price, watts), cabling media per *reach class* and
speed, the reach policy that says which class each tier pair's cables fall in, and the
NIC (and optional GPU server) price. Every figure carries a ``source``: a vendor document
or standard (marked ``[V]``) or ``[estimate: why]`` where no public figure exists (most
prices: list prices of switches and optics are not published). The defaults live in
``catalog_default.yaml`` next to this module; ``docs/design/design-catalog.md`` says why
they are what they are and how to override them.

Reach classes (IEEE 802.3 reach names; lengths are the usual planning figures)::

    in-rack     DAC passive copper (<= 3 m at 100G/lane, ~1 m at 200G/lane); AEC to ~7 m
    in-row      AOC or SR multimode optics (OM4, 50-100 m)
    cross-row   DR single-mode optics (500 m)
    campus      FR single-mode optics (2 km)

A medium is ``kind: cable`` (DAC, AEC, AOC: one assembly with its ends, priced per cable)
or ``kind: optic`` (a transceiver per end, priced per transceiver, plus a fiber per link).

Override files are merged onto the defaults (any subset of ``switches``, ``media``,
``prefer``, ``reach``, ``nic``); every bad value raises :class:`ConfigError` with one line
naming the file, the field and the value (``my.yaml: switches[2].price_usd: must be >= 0,
got -5``).
"""

from __future__ import annotations

import importlib.resources
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.yamlfile import parse_yaml, read_yaml

__all__ = [
    "LINK_PAIRS",
    "MEDIUM_KINDS",
    "REACH_CASES",
    "REACH_CLASSES",
    "Catalog",
    "Medium",
    "NicSpec",
    "ReachPolicy",
    "SwitchModel",
    "default_catalog",
    "load_catalog",
]

Reach = Literal["in-rack", "in-row", "cross-row", "campus"]
REACH_CLASSES: tuple[str, ...] = ("in-rack", "in-row", "cross-row", "campus")
MediumKind = Literal["cable", "optic"]
MEDIUM_KINDS: tuple[str, ...] = ("cable", "optic")
#: The tier pairs a reach policy covers, and the cases each one distinguishes.
LINK_PAIRS: tuple[str, ...] = ("host-leaf", "leaf-spine", "spine-core")
REACH_CASES: Mapping[str, tuple[str, ...]] = {
    "host-leaf": ("standard", "rail"),
    "leaf-spine": ("two-tier", "two-tier-large", "three-tier"),
    "spine-core": ("any",),
}
#: Builder kinds whose hosts cable to a ToR in their own rack / to rail leaves at the row end.
STANDARD_KINDS: frozenset[str] = frozenset({"leaf-spine", "fat-tree"})
RAIL_KINDS: frozenset[str] = frozenset({"rail-optimized", "multi-plane", "dual-tor"})
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class SwitchModel:
    """A switch: ``radix`` logical ports of ``port_gbps`` on a ``chip_tbps`` chip."""

    name: str
    radix: int
    port_gbps: float
    chip_tbps: float
    price_usd: float
    watts: float
    source: str


@dataclass(frozen=True, slots=True)
class Medium:
    """A cabling medium of one reach class and speed.

    ``price_usd`` is per cable (``kind="cable"``) or per transceiver (``kind="optic"``, two
    per link); ``watts`` is per end; ``fiber_usd`` is the fiber of one optic link.
    """

    reach: str
    gbps: float
    family: str
    name: str
    kind: str
    max_m: float
    price_usd: float
    watts: float
    fiber_usd: float
    source: str


@dataclass(frozen=True, slots=True)
class NicSpec:
    """NIC port price / power at ``port_gbps`` (scaled linearly to other port speeds), and
    the optional GPU server price / power (``0`` = not counted: cost per GPU is the fabric's)."""

    port_price_usd: float
    port_watts: float
    port_gbps: float
    server_price_usd: float
    server_watts: float
    source: str


@dataclass(frozen=True)
class ReachPolicy:
    """The reach class of each tier pair, per layout case (see :meth:`Catalog.reach_for`).

    ``rules[pair][case]``: ``host-leaf`` cases ``standard`` (ToR in the rack) and ``rail``
    (the rail leaves of a row at its end); ``leaf-spine`` cases ``two-tier`` (up to
    ``row_gpus`` GPUs), ``two-tier-large`` and ``three-tier`` (a pod is a row group);
    ``spine-core`` case ``any``.
    """

    rules: Mapping[str, Mapping[str, str]]
    row_gpus: int


@dataclass(frozen=True)
class Catalog:
    """Switch models, media, reach policy and NIC figures; immutable, merged by :meth:`merged`.

    ``prefer`` names the medium family to use per reach class (``{"in-rack": "AEC"}``) where
    several are listed at a speed; otherwise the first listed one is used.
    """

    switches: tuple[SwitchModel, ...]
    media: tuple[Medium, ...]
    reach: ReachPolicy
    nic: NicSpec
    prefer: Mapping[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ look-ups
    def switch_for(self, radix: int, port_gbps: float) -> SwitchModel:
        """The switch model for ``radix`` ports of ``port_gbps``.

        The model with exactly that radix and speed; else the smallest (by chip capacity,
        then radix, then price) with radix >= and speed >= the ones asked for.
        """
        for m in self.switches:
            if m.radix == radix and math.isclose(m.port_gbps, port_gbps):
                return m
        fit = [m for m in self.switches
               if m.radix >= radix and m.port_gbps >= port_gbps - _EPS]
        if not fit:
            raise ConfigError(
                f"catalog: switches: no model has radix >= {radix} and port_gbps >= "
                f"{port_gbps:g}; add one (docs/design/design-catalog.md)"
            )
        return min(fit, key=lambda m: (m.chip_tbps, m.radix, m.price_usd))

    def medium_for(self, reach: str, gbps: float) -> Medium:
        """The medium for a link of ``gbps`` in reach class ``reach``.

        The listed speed equal to ``gbps``, else the next faster one (a faster module run at
        a lower rate, priced as such); among those, the ``prefer``-red family, else the first.
        """
        cands = [m for m in self.media if m.reach == reach and m.gbps >= gbps - _EPS]
        if not cands:
            raise ConfigError(
                f"catalog: media: no {reach} medium of >= {gbps:g} Gb/s; add one "
                "(docs/design/design-catalog.md)"
            )
        speed = min(m.gbps for m in cands)
        at = [m for m in cands if math.isclose(m.gbps, speed)]
        want = self.prefer.get(reach)
        for m in at:
            if want is not None and m.family.lower() == want.lower():
                return m
        return at[0]

    def reach_for(self, fabric: Fabric) -> dict[str, str]:
        """Reach class of each tier pair of ``fabric`` under this catalog's policy.

        Layout: ``meta["layout"]`` (``standard`` / ``rail``) if given, else from
        ``meta["kind"]`` (``leaf-spine``, ``fat-tree``: standard; ``rail-optimized``,
        ``multi-plane``, ``dual-tor``: rail), else rail when NICs carry a rail tag. Tiers:
        ``meta["tiers"]``, else the number of switch roles present.
        """
        meta = fabric.meta
        layout = meta.get("layout")
        kind = meta.get("kind")
        if layout not in ("standard", "rail"):
            if kind in STANDARD_KINDS:
                layout = "standard"
            elif kind in RAIL_KINDS:
                layout = "rail"
            else:
                layout = "rail" if any(n.rail is not None for n in fabric.nics) else "standard"
        tiers = meta.get("tiers")
        if not isinstance(tiers, int):
            tiers = len({d.role for d in fabric.switches})
        if tiers >= 3:
            ls = "three-tier"
        elif fabric.gpu_count > self.reach.row_gpus:
            ls = "two-tier-large"
        else:
            ls = "two-tier"
        r = self.reach.rules
        return {
            "host-leaf": r["host-leaf"][str(layout)],
            "leaf-spine": r["leaf-spine"][ls],
            "spine-core": r["spine-core"]["any"],
        }

    # ------------------------------------------------------------------ merging
    def merged(self, overrides: Mapping[str, Any], *, source: str = "<overrides>") -> Catalog:
        """This catalog with ``overrides`` (the YAML shape of catalog_default.yaml) applied.

        ``switches`` entries update the model of the same ``name`` (any subset of fields) or
        add a new one (every field); ``media`` entries likewise by (``reach``, ``gbps``,
        ``family``); ``prefer``, ``nic`` and ``reach`` update field by field. A ``reach``
        pair given as a string sets every case of that pair.
        """
        return _merge(self, overrides, source)

    def to_dict(self) -> dict[str, Any]:
        """The catalog in the YAML shape it is read from (for ``--json`` / display)."""
        return {
            "switches": [_record_dict(m) for m in self.switches],
            "media": [_record_dict(m) for m in self.media],
            "prefer": dict(self.prefer),
            "reach": {"row_gpus": self.reach.row_gpus,
                      **{p: dict(c) for p, c in self.reach.rules.items()}},
            "nic": _record_dict(self.nic),
        }


def default_catalog() -> Catalog:
    """The catalog shipped with fabricscope (``catalog_default.yaml``)."""
    text = importlib.resources.files("fabricscope.design").joinpath(
        "catalog_default.yaml").read_text(encoding="utf-8")
    return _from_text(text, "catalog_default.yaml", base=None)


def load_catalog(path: str | Path) -> Catalog:
    """The default catalog with the overrides of the YAML file ``path`` merged onto it."""
    p = Path(path)
    return _from_data(read_yaml(p, what="catalog"), str(p), base=default_catalog())


# ---------------------------------------------------------------------- parsing
_TOP = ("switches", "media", "prefer", "reach", "nic")
_SWITCH_FIELDS = tuple(f.name for f in fields(SwitchModel))
_MEDIUM_FIELDS = tuple(f.name for f in fields(Medium))
_NIC_FIELDS = tuple(f.name for f in fields(NicSpec))


def _from_text(text: str, source: str, *, base: Catalog | None) -> Catalog:
    return _from_data(parse_yaml(text, source=source), source, base=base)


def _from_data(data: object, source: str, *, base: Catalog | None) -> Catalog:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of {', '.join(_TOP)}, "
                          f"got {type(data).__name__}")
    return _merge(base, data, source)


def _record_dict(rec: object) -> dict[str, Any]:
    return {f.name: getattr(rec, f.name) for f in fields(rec)}  # type: ignore[arg-type]


def _merge(base: Catalog | None, data: Mapping[str, Any], src: str) -> Catalog:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{src}: catalog overrides must be a mapping, got {type(data).__name__}")
    for k in data:
        if k not in _TOP:
            raise ConfigError(f"{src}: {k}: unknown catalog section; expected one of "
                              f"{', '.join(_TOP)}")
    switches = list(base.switches) if base else []
    for i, entry in enumerate(_entries(data, "switches", src)):
        where = f"{src}: switches[{i}]"
        name = entry.get("name")
        pos = next((j for j, m in enumerate(switches) if m.name == name), None)
        old = _record_dict(switches[pos]) if pos is not None else {}
        rec = _switch({**old, **entry}, where)
        if pos is None:
            switches.append(rec)
        else:
            switches[pos] = rec
    media = list(base.media) if base else []
    for i, entry in enumerate(_entries(data, "media", src)):
        where = f"{src}: media[{i}]"
        key = (entry.get("reach"), _num_or_none(entry.get("gbps")),
               str(entry.get("family", "")).lower())
        pos = next((j for j, m in enumerate(media)
                    if (m.reach, m.gbps, m.family.lower()) == key), None)
        old = _record_dict(media[pos]) if pos is not None else {}
        med = _medium({**old, **entry}, where)
        if pos is None:
            media.append(med)
        else:
            media[pos] = med
    prefer = dict(base.prefer) if base else {}
    for k, v in _section(data, "prefer", src).items():
        if k not in REACH_CLASSES:
            raise ConfigError(f"{src}: prefer.{k}: unknown reach class; expected one of "
                              f"{', '.join(REACH_CLASSES)}")
        if not isinstance(v, str) or not v:
            raise ConfigError(f"{src}: prefer.{k}: must be a medium family name, got {v!r}")
        prefer[k] = v
    reach = _reach(base.reach if base else None, _section(data, "reach", src), src)
    nic_over = _section(data, "nic", src)
    nic = _nic({**(_record_dict(base.nic) if base else {}), **nic_over}, f"{src}: nic")
    if not switches:
        raise ConfigError(f"{src}: switches: the catalog lists no switch model")
    return Catalog(switches=tuple(switches), media=tuple(media), reach=reach, nic=nic,
                   prefer=prefer)


def _section(data: Mapping[str, Any], key: str, src: str) -> Mapping[str, Any]:
    v = data.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{src}: {key}: must be a mapping, got {type(v).__name__}")
    return v


def _entries(data: Mapping[str, Any], key: str, src: str) -> list[Mapping[str, Any]]:
    v = data.get(key)
    if v is None:
        return []
    if not isinstance(v, Sequence) or isinstance(v, str):
        raise ConfigError(f"{src}: {key}: must be a list, got {type(v).__name__}")
    for i, e in enumerate(v):
        if not isinstance(e, Mapping):
            raise ConfigError(f"{src}: {key}[{i}]: must be a mapping, got {type(e).__name__}")
    return list(v)


def _num_or_none(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _check_fields(rec: Mapping[str, Any], names: tuple[str, ...], where: str) -> None:
    for k in rec:
        if k not in names:
            raise ConfigError(f"{where}.{k}: unknown field; expected one of {', '.join(names)}")
    for k in names:
        if k not in rec:
            raise ConfigError(f"{where}.{k}: missing (a new entry needs every field)")


def _number(rec: Mapping[str, Any], k: str, where: str, *, positive: bool = False) -> float:
    v = rec[k]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ConfigError(f"{where}.{k}: must be a number, got {v!r}")
    if positive and not v > 0:
        raise ConfigError(f"{where}.{k}: must be > 0, got {v!r}")
    if not positive and v < 0:
        raise ConfigError(f"{where}.{k}: must be >= 0, got {v!r}")
    return float(v)


def _text(rec: Mapping[str, Any], k: str, where: str) -> str:
    v = rec[k]
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{where}.{k}: must be a non-empty string, got {v!r}")
    return v


def _switch(rec: Mapping[str, Any], where: str) -> SwitchModel:
    _check_fields(rec, _SWITCH_FIELDS, where)
    radix = rec["radix"]
    if isinstance(radix, bool) or not isinstance(radix, int) or radix < 1:
        raise ConfigError(f"{where}.radix: must be an integer >= 1, got {radix!r}")
    return SwitchModel(
        name=_text(rec, "name", where), radix=radix,
        port_gbps=_number(rec, "port_gbps", where, positive=True),
        chip_tbps=_number(rec, "chip_tbps", where, positive=True),
        price_usd=_number(rec, "price_usd", where), watts=_number(rec, "watts", where),
        source=_text(rec, "source", where),
    )


def _medium(rec: Mapping[str, Any], where: str) -> Medium:
    _check_fields(rec, _MEDIUM_FIELDS, where)
    if rec["reach"] not in REACH_CLASSES:
        raise ConfigError(f"{where}.reach: must be one of {', '.join(REACH_CLASSES)}, "
                          f"got {rec['reach']!r}")
    if rec["kind"] not in MEDIUM_KINDS:
        raise ConfigError(f"{where}.kind: must be cable or optic, got {rec['kind']!r}")
    fiber = _number(rec, "fiber_usd", where)
    if rec["kind"] == "cable" and fiber:
        raise ConfigError(f"{where}.fiber_usd: a cable has no separate fiber; must be 0, "
                          f"got {rec['fiber_usd']!r}")
    return Medium(
        reach=str(rec["reach"]), gbps=_number(rec, "gbps", where, positive=True),
        family=_text(rec, "family", where), name=_text(rec, "name", where),
        kind=str(rec["kind"]), max_m=_number(rec, "max_m", where, positive=True),
        price_usd=_number(rec, "price_usd", where), watts=_number(rec, "watts", where),
        fiber_usd=fiber, source=_text(rec, "source", where),
    )


def _nic(rec: Mapping[str, Any], where: str) -> NicSpec:
    _check_fields(rec, _NIC_FIELDS, where)
    return NicSpec(
        port_price_usd=_number(rec, "port_price_usd", where),
        port_watts=_number(rec, "port_watts", where),
        port_gbps=_number(rec, "port_gbps", where, positive=True),
        server_price_usd=_number(rec, "server_price_usd", where),
        server_watts=_number(rec, "server_watts", where),
        source=_text(rec, "source", where),
    )


def _reach(base: ReachPolicy | None, over: Mapping[str, Any], src: str) -> ReachPolicy:
    rules: dict[str, dict[str, str]] = (
        {p: dict(c) for p, c in base.rules.items()} if base else {p: {} for p in LINK_PAIRS})
    row_gpus = base.row_gpus if base else None
    for pair, v in over.items():
        where = f"{src}: reach.{pair}"
        if pair == "row_gpus":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where}: must be an integer >= 1, got {v!r}")
            row_gpus = v
            continue
        if pair not in REACH_CASES:
            raise ConfigError(f"{where}: unknown tier pair; expected row_gpus or one of "
                              f"{', '.join(LINK_PAIRS)}")
        cases = dict.fromkeys(REACH_CASES[pair], v) if isinstance(v, str) else v
        if not isinstance(cases, Mapping):
            raise ConfigError(f"{where}: must be a reach class or a mapping of "
                              f"{', '.join(REACH_CASES[pair])}, got {v!r}")
        for case, cls in cases.items():
            if case not in REACH_CASES[pair]:
                raise ConfigError(f"{where}.{case}: unknown case; expected one of "
                                  f"{', '.join(REACH_CASES[pair])}")
            if cls not in REACH_CLASSES:
                raise ConfigError(f"{where}.{case}: must be one of "
                                  f"{', '.join(REACH_CLASSES)}, got {cls!r}")
            rules[pair][case] = cls
    for pair, cases in REACH_CASES.items():
        for case in cases:
            if case not in rules[pair]:
                raise ConfigError(f"{src}: reach.{pair}.{case}: missing")
    if row_gpus is None:
        raise ConfigError(f"{src}: reach.row_gpus: missing")
    return ReachPolicy(rules=rules, row_gpus=row_gpus)
