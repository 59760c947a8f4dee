"""The fault knowledge base: fault types, their symptoms per instrument, checks and actions.

The knowledge is data, not code: YAML files in ``fabricscope/diagnosis/kb`` (one per family,
plus the integrator's troubleshooting table), extended by a user's folders (an entry whose id
exists replaces it). Each entry gives, per instrument (*signal*), the findings it reports
when the fault is present with ``P(finding | fault)`` (a naive-Bayes style likelihood table,
as in classical diagnostic expert systems), and whether the finding is on the faulty
resource itself (``at: self``) or on a neighbour (``at: near``). Schema and the list of types:
``docs/diagnosis-kb.md``.

Parsing (:func:`parse_kb`) is pure and checks every key strictly: an unknown key or a bad
value raises :class:`~fabricscope.model.errors.ConfigError` with one line naming the file,
the entry and the key. :func:`load_kb` reads the packaged files (once; cached) and the
user's folders.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fabricscope.model.errors import ConfigError

SIGNALS: tuple[str, ...] = ("telemetry", "probe", "straggler", "optics", "collective", "host",
                            "config", "operator")
FAMILIES: tuple[str, ...] = ("physical", "link", "congestion", "routing", "host", "job",
                             "config", "service")
SPECIALISTS: tuple[str, ...] = ("optics", "link", "congestion", "routing", "host", "job",
                                "config")
RESOURCES: tuple[str, ...] = ("cable", "port", "switch", "nic", "host", "gpu", "job", "fabric")
RELATIONS: tuple[str, ...] = ("self", "near")
RISKS: tuple[str, ...] = ("low", "medium", "high")
AUTOMATIONS: tuple[str, ...] = ("cost-out-link", "shift-lb-weight", "restart-agent", "none")
#: where a check runs: an instrument's store, a simulator what-if, or a person (``manual``)
CHECK_SOURCES: tuple[str, ...] = (*SIGNALS, "what-if", "manual")

#: The finding kinds the instruments emit today, per signal, in the knowledge base's terms
#: (:mod:`fabricscope.diagnosis.normalize` maps the health checks' kinds). A symptom naming
#: another kind is knowledge for an instrument still to come.
EMITTED: Mapping[str, frozenset[str]] = {
    "telemetry": frozenset({"micro-burst", "queue-buildup", "error-counter-increase",
                            "discard-increase", "link-flap", "link-down", "pause-storm"}),
    "probe": frozenset({"gray-link", "switch-fault", "nic-fault", "cpu-starved", "slow-link",
                        "slow-switch", "slow-nic", "ambiguous"}),
    "straggler": frozenset({"slow-gpu", "slow-nic", "slow-switch", "stage-imbalance",
                            "sequence-imbalance"}),
    "optics": frozenset({"optic-degrading", "optic-rx-low"}),
    # fabricscope collective analyze / slow-node, roce check, preflight (issue 16)
    "collective": frozenset({"busbw-low", "slow-node", "slow-node-pair"}),
    "host": frozenset({"host-misconfig", "roce-port-down", "roce-rate-low", "roce-gid-mismatch",
                       "roce-bw-low", "roce-lat-high", "roce-neighbour-mismatch",
                       "roce-perftest-error"}),
    "config": frozenset({"mtu-mismatch", "pfc-priority-mismatch", "ecn-disabled"}),
}

_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True, slots=True)
class Symptom:
    """What ``signal`` reports when the fault is present: ``finding`` with ``likelihood``.

    ``at`` is ``self`` when the finding's subject is the faulty resource (or a port or
    direction of it), ``near`` when it is a neighbour (the device of a port, the host of a
    NIC, a port of a switch, a rank on a host). ``primary`` marks the symptoms a knowledge
    tree branches on.
    """

    signal: str
    finding: str
    likelihood: float
    at: str = "self"
    primary: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.signal, self.finding)

    @property
    def emitted(self) -> bool:
        """Whether an instrument emits this finding today (:data:`EMITTED`)."""
        return self.finding in EMITTED.get(self.signal, frozenset())


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A finding on the same resource that argues against the fault type, and why."""

    signal: str
    finding: str
    why: str


@dataclass(frozen=True, slots=True)
class KbCheck:
    """A concrete check to confirm or exclude the type, with what each outcome means."""

    id: str
    source: str
    how: str
    if_true: str
    if_false: str


@dataclass(frozen=True, slots=True)
class KbAction:
    """A remediation, its risk, whether it can be undone, and the automation that does it."""

    action: str
    risk: str
    reversible: bool
    automation: str


@dataclass(frozen=True, slots=True)
class FaultType:
    """One entry of the knowledge base (schema: ``docs/diagnosis-kb.md``).

    ``prior`` is relative, per resource of kind ``resource``. ``twin`` lists the twin's fault
    kinds (``fabricscope.sim.faults``) whose ground truth this type is; ``share`` the fraction
    of the integrator's projects that met it (OPERATIONS.md section 4); ``origin`` the file
    the entry came from.
    """

    id: str
    title: str
    family: str
    specialist: str
    resource: str
    prior: float
    symptoms: tuple[Symptom, ...]
    checks: tuple[KbCheck, ...]
    root_causes: tuple[str, ...]
    actions: tuple[KbAction, ...]
    references: tuple[str, ...]
    excluded_by: tuple[Exclusion, ...] = ()
    twin: tuple[str, ...] = ()
    share: float | None = None
    origin: str = ""

    @property
    def primary(self) -> tuple[Symptom, ...]:
        """The symptoms a knowledge tree branches on."""
        return tuple(s for s in self.symptoms if s.primary)

    @property
    def diagnosable(self) -> bool:
        """True when one of its primary symptoms is a finding an instrument emits today."""
        return any(s.emitted for s in self.primary)


def _order(ft: FaultType) -> tuple[float, str]:
    return (-ft.prior, ft.id)


class KnowledgeBase:
    """Fault types by id, indexed by the findings that are their symptoms.

    Iteration and every lookup list types in one fixed order: prior descending, then id.
    """

    def __init__(self, types: Mapping[str, FaultType]) -> None:
        ordered = sorted(types.values(), key=_order)
        self.types: Mapping[str, FaultType] = {ft.id: ft for ft in ordered}
        index: dict[tuple[str, str], list[tuple[FaultType, Symptom]]] = {}
        for ft in ordered:
            for s in ft.symptoms:
                index.setdefault(s.key, []).append((ft, s))
        self._index = {k: tuple(v) for k, v in index.items()}
        self._twin = {k: ft for ft in reversed(ordered) for k in ft.twin}

    def __len__(self) -> int:
        return len(self.types)

    def __iter__(self) -> Iterator[FaultType]:
        return iter(self.types.values())

    def __contains__(self, fault_id: object) -> bool:
        return fault_id in self.types

    def get(self, fault_id: str) -> FaultType:
        """The type ``fault_id``; ConfigError naming the known ids when there is none."""
        try:
            return self.types[fault_id]
        except KeyError:
            raise ConfigError(f"fault type {fault_id!r}: not in the knowledge base; known: "
                              f"{', '.join(sorted(self.types))}") from None

    def for_finding(self, signal: str, kind: str) -> tuple[tuple[FaultType, Symptom], ...]:
        """Every (type, symptom) that could explain finding ``kind`` from ``signal``
        (a type listing it at ``self`` and at ``near`` appears twice)."""
        return self._index.get((signal, kind), ())

    def branches(self, signal: str, kind: str) -> tuple[tuple[FaultType, Symptom], ...]:
        """The (type, symptom) pairs whose symptom is *primary* for this finding."""
        return tuple(p for p in self.for_finding(signal, kind) if p[1].primary)

    def for_twin(self, twin_kind: str) -> FaultType | None:
        """The type that is the ground truth of the twin's fault kind, if any."""
        return self._twin.get(twin_kind)


# --------------------------------------------------------------------------- parsing

_ENTRY_KEYS = {
    "id": True, "title": True, "family": True, "specialist": True, "resource": True,
    "prior": True, "symptoms": True, "checks": True, "root_causes": True, "actions": True,
    "references": True, "excluded_by": False, "twin": False, "share": False,
}
_SYMPTOM_KEYS = {"signal": True, "finding": True, "likelihood": True, "at": True,
                 "primary": False}
_EXCLUSION_KEYS = {"signal": True, "finding": True, "why": True}
_CHECK_KEYS = {"id": True, "source": True, "how": True, "if_true": True, "if_false": True}
_ACTION_KEYS = {"action": True, "risk": True, "reversible": True, "automation": True}


class _Where:
    """Builds ``file: faults[3] (id x): key: message`` lines."""

    def __init__(self, name: str, index: int, fault_id: str | None) -> None:
        self.head = f"{name}: faults[{index}]" + (f" (id {fault_id})" if fault_id else "")

    def error(self, key: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.head}: {key}: {msg}")


def _keys(w: _Where, path: str, obj: Any, spec: Mapping[str, bool]) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise w.error(path or "entry", f"expected a mapping, got {type(obj).__name__}")
    pre = f"{path}." if path else ""
    for k in obj:
        if k not in spec:
            raise w.error(f"{pre}{k}", f"unknown key; allowed: {', '.join(spec)}")
    for k, required in spec.items():
        if required and k not in obj:
            raise w.error(f"{pre}{k}", "missing")
    return obj


def _str(w: _Where, key: str, v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise w.error(key, f"expected a non-empty string, got {v!r}")
    return v


def _choice(w: _Where, key: str, v: Any, allowed: Sequence[str]) -> str:
    if v not in allowed:
        raise w.error(key, f"{v!r} is not one of {', '.join(allowed)}")
    return str(v)


def _kebab(w: _Where, key: str, v: Any) -> str:
    if not isinstance(v, str) or not _ID.match(v):
        raise w.error(key, f"{v!r} is not a kebab-case id (lowercase words joined by '-')")
    return v


def _prob(w: _Where, key: str, v: Any, *, closed: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise w.error(key, f"expected a number, got {v!r}")
    x = float(v)
    if not (0.0 < x < 1.0 or (closed and x == 1.0)):
        raise w.error(key, f"{v!r} is not in (0, 1{']' if closed else ')'}")
    return x


def _list(w: _Where, key: str, v: Any, *, empty: bool = False) -> list[Any]:
    if not isinstance(v, list) or (not v and not empty):
        raise w.error(key, f"expected a{'' if empty else ' non-empty'} list, got {v!r}")
    return v


def _strings(w: _Where, key: str, v: Any) -> tuple[str, ...]:
    return tuple(_str(w, f"{key}[{i}]", x) for i, x in enumerate(_list(w, key, v)))


def _symptom(w: _Where, i: int, raw: Any) -> Symptom:
    p = f"symptoms[{i}]"
    d = _keys(w, p, raw, _SYMPTOM_KEYS)
    primary = d.get("primary", False)
    if not isinstance(primary, bool):
        raise w.error(f"{p}.primary", f"expected true or false, got {primary!r}")
    return Symptom(signal=_choice(w, f"{p}.signal", d["signal"], SIGNALS),
                   finding=_kebab(w, f"{p}.finding", d["finding"]),
                   likelihood=_prob(w, f"{p}.likelihood", d["likelihood"], closed=True),
                   at=_choice(w, f"{p}.at", d["at"], RELATIONS), primary=primary)


def _exclusion(w: _Where, i: int, raw: Any) -> Exclusion:
    p = f"excluded_by[{i}]"
    d = _keys(w, p, raw, _EXCLUSION_KEYS)
    return Exclusion(signal=_choice(w, f"{p}.signal", d["signal"], SIGNALS),
                     finding=_kebab(w, f"{p}.finding", d["finding"]),
                     why=_str(w, f"{p}.why", d["why"]))


def _check(w: _Where, i: int, raw: Any) -> KbCheck:
    p = f"checks[{i}]"
    d = _keys(w, p, raw, _CHECK_KEYS)
    return KbCheck(id=_kebab(w, f"{p}.id", d["id"]),
                   source=_choice(w, f"{p}.source", d["source"], CHECK_SOURCES),
                   how=_str(w, f"{p}.how", d["how"]),
                   if_true=_str(w, f"{p}.if_true", d["if_true"]),
                   if_false=_str(w, f"{p}.if_false", d["if_false"]))


def _action(w: _Where, i: int, raw: Any) -> KbAction:
    p = f"actions[{i}]"
    d = _keys(w, p, raw, _ACTION_KEYS)
    rev = d["reversible"]
    if not isinstance(rev, bool):
        raise w.error(f"{p}.reversible", f"expected true or false, got {rev!r}")
    auto = _choice(w, f"{p}.automation", d["automation"], AUTOMATIONS)
    if auto != "none" and not rev:
        raise w.error(f"{p}.automation", f"{auto!r} needs reversible: true (only reversible "
                                         "actions may be automated)")
    return KbAction(action=_str(w, f"{p}.action", d["action"]),
                    risk=_choice(w, f"{p}.risk", d["risk"], RISKS), reversible=rev,
                    automation=auto)


def _entry(name: str, index: int, raw: Any) -> FaultType:
    fid = raw.get("id") if isinstance(raw, dict) else None
    w = _Where(name, index, fid if isinstance(fid, str) else None)
    d = _keys(w, "", raw, _ENTRY_KEYS)
    fid = _kebab(w, "id", d["id"])
    symptoms = tuple(_symptom(w, i, s) for i, s in enumerate(_list(w, "symptoms", d["symptoms"])))
    seen: set[tuple[str, str, str]] = set()
    for i, s in enumerate(symptoms):
        if (s.signal, s.finding, s.at) in seen:
            raise w.error(f"symptoms[{i}]", f"{s.signal} {s.finding} at {s.at} listed twice")
        seen.add((s.signal, s.finding, s.at))
    excl = tuple(_exclusion(w, i, x)
                 for i, x in enumerate(_list(w, "excluded_by", d.get("excluded_by", []),
                                             empty=True)))
    keys = {s.key for s in symptoms}
    for i, x in enumerate(excl):
        if (x.signal, x.finding) in keys:
            raise w.error(f"excluded_by[{i}]", f"{x.signal} {x.finding} is also a symptom")
    checks = tuple(_check(w, i, c) for i, c in enumerate(_list(w, "checks", d["checks"])))
    ids = [c.id for c in checks]
    for i, c in enumerate(ids):
        if c in ids[:i]:
            raise w.error(f"checks[{i}].id", f"{c!r} listed twice")
    twin = tuple(_kebab(w, f"twin[{i}]", t)
                 for i, t in enumerate(_list(w, "twin", d.get("twin", []), empty=True)))
    share = d.get("share")
    return FaultType(
        id=fid, title=_str(w, "title", d["title"]),
        family=_choice(w, "family", d["family"], FAMILIES),
        specialist=_choice(w, "specialist", d["specialist"], SPECIALISTS),
        resource=_choice(w, "resource", d["resource"], RESOURCES),
        prior=_prob(w, "prior", d["prior"], closed=False),
        symptoms=symptoms, checks=checks,
        root_causes=_strings(w, "root_causes", d["root_causes"]),
        actions=tuple(_action(w, i, a) for i, a in enumerate(_list(w, "actions", d["actions"]))),
        references=_strings(w, "references", d["references"]),
        excluded_by=excl, twin=twin,
        share=None if share is None else _prob(w, "share", share, closed=True),
        origin=name)


def parse_doc(name: str, text: str) -> list[FaultType]:
    """The entries of one YAML document ``text`` (``name`` is used in error messages)."""
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{name}: {where}invalid YAML: {problem}") from None
    if not isinstance(doc, dict) or set(doc) != {"faults"}:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(f"{name}: expected one top-level key 'faults' (a list), got {got}")
    entries = doc["faults"]
    if not isinstance(entries, list):
        raise ConfigError(f"{name}: faults: expected a list, got {type(entries).__name__}")
    return [_entry(name, i, e) for i, e in enumerate(entries)]


def parse_kb(docs: Mapping[str, str], *, base: KnowledgeBase | None = None) -> KnowledgeBase:
    """A knowledge base from YAML documents (name -> text); pure.

    The entries of ``docs`` are added to ``base`` (if given): an entry whose id is in
    ``base`` replaces it. Two entries of ``docs`` with the same id are an error.
    """
    types: dict[str, FaultType] = dict(base.types) if base is not None else {}
    mine: dict[str, str] = {}
    for name, text in docs.items():
        for i, ft in enumerate(parse_doc(name, text)):
            if ft.id in mine:
                raise ConfigError(f"{name}: faults[{i}] (id {ft.id}): id: already defined "
                                  f"in {mine[ft.id]}")
            mine[ft.id] = name
            types[ft.id] = ft
    return KnowledgeBase(types)


def packaged_docs() -> dict[str, str]:
    """The packaged YAML files of the knowledge base (name -> text), sorted by name."""
    root = importlib.resources.files("fabricscope.diagnosis").joinpath("kb")
    return {p.name: p.read_text(encoding="utf-8")
            for p in sorted(root.iterdir(), key=lambda p: p.name)
            if p.is_file() and p.name.endswith(".yaml")}


@functools.lru_cache(maxsize=1)
def _packaged() -> KnowledgeBase:
    return parse_kb(packaged_docs())


def load_kb(extra_dirs: Sequence[Path] = ()) -> KnowledgeBase:
    """The packaged knowledge base plus every ``*.yaml`` directly in ``extra_dirs``.

    Folders are applied in order; a user entry with an existing id replaces it. The
    packaged part is parsed once per process. A missing folder or a bad file is a
    ConfigError naming it.
    """
    kb = _packaged()
    for d in extra_dirs:
        folder = Path(d)
        if not folder.is_dir():
            raise ConfigError(f"--kb {folder}: not a folder")
        docs: dict[str, str] = {}
        for p in sorted(folder.glob("*.yaml")):
            try:
                docs[str(p)] = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{p}: cannot read: {exc}") from None
        kb = parse_kb(docs, base=kb)
    return kb


# --------------------------------------------------------------------------- ids

def cable_of(subject: str) -> str | None:
    """The cable id (``a|b``, ports sorted) of a directed link ``a->b`` or cable ``a|b``."""
    for sep in ("->", "|"):
        if sep in subject and " | " not in subject:
            a, _, b = subject.partition(sep)
            a, b = a.strip(), b.strip()
            if a and b:
                return "|".join(sorted((a, b)))
    return None


def members(subject: str) -> tuple[str, ...]:
    """The members of an ambiguous subject ``x | y | z`` (one member when not ambiguous)."""
    return tuple(m.strip() for m in subject.split(" | ")) if " | " in subject else (subject,)


def _is_self(subject: str, resource: str) -> bool:
    if subject == resource:
        return True
    cab_s, cab_r = cable_of(subject), cable_of(resource)
    if cab_r is not None:
        # a direction of the cable, or one of its ports
        return cab_s == cab_r or subject in cab_r.split("|")
    if cab_s is not None:  # a directed link is not a part of a port or a device
        return False
    # a port of a device (``dev:eth1``, ``host/nic0:p0``)
    return subject.startswith(resource + ":")


def relation(subject: str, resource: str) -> str:
    """``self`` when ``subject`` is ``resource`` or a port / direction of it, else ``near``.

    Ids follow ``fabricscope.diagnosis.model``: cables ``a|b``, directions ``a->b``, ports
    ``device:port``. An ambiguous subject ``x | y`` is ``self`` when one member is.
    """
    return "self" if any(_is_self(m, resource) for m in members(subject)) else "near"
