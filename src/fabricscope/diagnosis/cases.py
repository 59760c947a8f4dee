"""The case base: past incidents, retrieved by the similarity of their symptoms.

Case-based reasoning (Aamodt & Plaza, "Case-based reasoning: foundational issues,
methodological variations, and system approaches", AI Communications 7(1), 1994): *retrieve*
the past cases most similar to the new problem, *reuse* their resolution, *revise* it with
the checks, *retain* the resolved incident as a new case (:func:`case_from_incident`,
:func:`save_case`).

A case's *signature* is a set of weighted features ``(signal, finding kind, relation)``:
``relation`` is ``self`` when the finding's subject is the root cause's resource (or a port /
direction of it), ``near`` otherwise, and ``any`` in a query built without a hypothesised
resource. Similarity is the weighted Jaccard index ``sum(min(w_q, w_c)) / sum(max(w_q, w_c))``
over the union of features (1 for identical signatures, 0 for disjoint ones); when either
side has an ``any`` feature both are first projected onto ``(signal, kind)`` (weight: the
largest over relations).

Parsing and dumping are pure (:func:`parse_case`, :func:`dump_case`); file I/O is in
:func:`load_cases`, :func:`save_case` and :func:`load_case_base`, which the service calls.
Seed cases ship in ``diagnosis/kb/cases`` (drawn from OPERATIONS.md section 4).
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.resources
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fabricscope.diagnosis.knowledge import RESOURCES, SIGNALS, KnowledgeBase, relation
from fabricscope.diagnosis.model import Incident, Observed
from fabricscope.model.errors import ConfigError

Feature = tuple[str, str, str]
"""(signal, finding kind, relation) with relation ``self`` | ``near`` | ``any``."""

CASE_RELATIONS: tuple[str, ...] = ("self", "near", "any")
_ID = re.compile(r"^[a-z0-9]+(?:[-_.][a-z0-9]+)*$")
_DATE = re.compile(r"^\d{4}(?:-\d{2}(?:-\d{2})?)?$")
_KEYS = {"id": True, "title": True, "fault": True, "resource_kind": True, "signature": True,
         "resolution": True, "date": True, "resource": False, "source": False}
_FEATURE_KEYS = {"signal": True, "finding": True, "at": True, "weight": True}
_MIN_WEIGHT = 0.1


@dataclass(frozen=True, slots=True)
class Case:
    """One past incident: what it looked like, what it was, how it was resolved.

    ``date`` is ISO (``2023``, ``2023-06`` or ``2023-06-01``; empty when unknown);
    ``resource`` the inventory id of the example's root cause (informational);
    ``source`` where the case comes from (a table, an incident id).
    """

    id: str
    title: str
    fault: str
    resource_kind: str
    signature: tuple[tuple[Feature, float], ...]
    resolution: str
    date: str
    resource: str = ""
    source: str = ""

    @property
    def weights(self) -> dict[Feature, float]:
        return dict(self.signature)


def _freeze(sig: Mapping[Feature, float]) -> tuple[tuple[Feature, float], ...]:
    return tuple(sorted(sig.items()))


def signature_of(findings: Iterable[Observed], resource: str | None = None) -> dict[Feature, float]:
    """The signature of ``findings`` relative to ``resource`` (relation ``any`` when None).

    A feature's weight is the largest score among its findings, floored at 0.1 so that a
    reported finding always counts.
    """
    sig: dict[Feature, float] = {}
    for o in findings:
        rel = "any" if resource is None else relation(o.subject, resource)
        key = (o.source, o.kind, rel)
        w = min(1.0, max(_MIN_WEIGHT, float(o.finding.score)))
        sig[key] = max(sig.get(key, 0.0), w)
    return sig


def _project(sig: Mapping[Feature, float]) -> dict[Feature, float]:
    out: dict[Feature, float] = {}
    for (s, k, _), w in sig.items():
        out[(s, k, "any")] = max(out.get((s, k, "any"), 0.0), w)
    return out


def similarity(a: Mapping[Feature, float], b: Mapping[Feature, float]) -> float:
    """Weighted Jaccard similarity of two signatures, in [0, 1] (see the module doc)."""
    if any(f[2] == "any" for f in (*a, *b)):
        a, b = _project(a), _project(b)
    keys = set(a) | set(b)
    den = sum(max(a.get(f, 0.0), b.get(f, 0.0)) for f in keys)
    if den <= 0.0:
        return 0.0
    return sum(min(a.get(f, 0.0), b.get(f, 0.0)) for f in keys) / den


class CaseBase:
    """Cases by id; :meth:`retrieve` ranks them by similarity to a signature."""

    def __init__(self, cases: Iterable[Case] = ()) -> None:
        self.cases: dict[str, Case] = {}
        for c in cases:
            self.cases[c.id] = c  # a later case with the same id replaces the earlier one

    def __len__(self) -> int:
        return len(self.cases)

    def __iter__(self) -> Iterator[Case]:
        return iter(self.cases.values())

    def add(self, case: Case) -> None:
        self.cases[case.id] = case

    def retrieve(self, signature: Mapping[Feature, float], k: int = 3, *,
                 fault: str | None = None) -> list[tuple[Case, float]]:
        """The ``k`` most similar cases (similarity > 0), best first, ties by id.

        ``fault`` restricts the search to cases of one fault type.
        """
        if k < 1:
            raise ConfigError(f"retrieve: k must be >= 1, got {k}")
        scored = [(c, similarity(signature, c.weights)) for c in self.cases.values()
                  if fault is None or c.fault == fault]
        scored = [p for p in scored if p[1] > 0.0]
        scored.sort(key=lambda p: (-p[1], p[0].id))
        return scored[:k]

    def unknown_faults(self, kb: KnowledgeBase) -> list[str]:
        """Ids of cases whose fault type is not in ``kb`` (to report, not to fail on)."""
        return sorted(c.id for c in self.cases.values() if c.fault not in kb)


def case_from_incident(incident: Incident, findings: Sequence[Observed], *, kb: KnowledgeBase,
                       resolution: str, date: str | _dt.date, case_id: str | None = None,
                       title: str | None = None) -> Case:
    """A case from a resolved incident: its top root cause and the findings it grouped.

    ``findings`` may hold more than the incident's; only those whose id the incident lists
    are used (all of them when the incident lists none). The resource kind comes from the
    root cause's type in ``kb``.
    """
    if not incident.root_causes:
        raise ConfigError(f"incident {incident.id}: no root cause; only a diagnosed "
                          "incident can become a case")
    if not resolution.strip():
        raise ConfigError(f"incident {incident.id}: resolution: empty; say how it was fixed")
    rc = incident.root_causes[0]
    ft = kb.get(rc.fault)
    wanted = set(incident.findings)
    mine = [o for o in findings if not wanted or o.id in wanted]
    if not mine:
        raise ConfigError(f"incident {incident.id}: none of its findings were given")
    day = date.isoformat() if isinstance(date, _dt.date) else date
    if day and not _DATE.match(day):
        raise ConfigError(f"incident {incident.id}: date: {day!r} is not YYYY[-MM[-DD]]")
    cid = case_id or f"case-{incident.id}".lower()
    if not _ID.match(cid):
        raise ConfigError(f"incident {incident.id}: case id {cid!r} is not lowercase "
                          "letters, digits and '-'")
    return Case(id=cid, title=title or incident.title or f"{rc.fault} on {rc.resource}",
                fault=rc.fault, resource_kind=ft.resource,
                signature=_freeze(signature_of(mine, rc.resource)), resolution=resolution,
                date=day, resource=rc.resource, source=f"incident {incident.id}")


# --------------------------------------------------------------------------- YAML

def _err(name: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{name}: case.{key}: {msg}")


def _text(name: str, key: str, v: Any, *, empty: bool = False) -> str:
    if not isinstance(v, str) or (not empty and not v.strip()):
        raise _err(name, key, f"expected a{'' if empty else ' non-empty'} string, got {v!r}")
    return v


def parse_case(name: str, text: str) -> Case:
    """One case from YAML ``text`` (``name`` names it in errors); pure."""
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict) or set(doc) != {"case"} or not isinstance(doc["case"], dict):
        raise ConfigError(f"{name}: expected one top-level key 'case' (a mapping)")
    d = doc["case"]
    for k in d:
        if k not in _KEYS:
            raise _err(name, str(k), f"unknown key; allowed: {', '.join(_KEYS)}")
    for k, req in _KEYS.items():
        if req and k not in d:
            raise _err(name, k, "missing")
    cid = _text(name, "id", d["id"])
    if not _ID.match(cid):
        raise _err(name, "id", f"{cid!r} is not lowercase letters, digits and '-'")
    kind = d["resource_kind"]
    if kind not in RESOURCES:
        raise _err(name, "resource_kind", f"{kind!r} is not one of {', '.join(RESOURCES)}")
    date = d["date"]
    date = date.isoformat() if isinstance(date, _dt.date) else date
    date = str(date) if isinstance(date, int) and not isinstance(date, bool) else date
    if not isinstance(date, str) or (date and not _DATE.match(date)):
        raise _err(name, "date", f"{date!r} is not YYYY[-MM[-DD]] (or '' when unknown)")
    raw = d["signature"]
    if not isinstance(raw, list) or not raw:
        raise _err(name, "signature", f"expected a non-empty list, got {raw!r}")
    sig: dict[Feature, float] = {}
    for i, f in enumerate(raw):
        where = f"signature[{i}]"
        if not isinstance(f, dict):
            raise _err(name, where, f"expected a mapping, got {f!r}")
        for k in f:
            if k not in _FEATURE_KEYS:
                raise _err(name, f"{where}.{k}", f"unknown key; allowed: {', '.join(_FEATURE_KEYS)}")
        for k in _FEATURE_KEYS:
            if k not in f:
                raise _err(name, f"{where}.{k}", "missing")
        if f["signal"] not in SIGNALS:
            raise _err(name, f"{where}.signal", f"{f['signal']!r} is not one of {', '.join(SIGNALS)}")
        if f["at"] not in CASE_RELATIONS:
            raise _err(name, f"{where}.at", f"{f['at']!r} is not one of {', '.join(CASE_RELATIONS)}")
        w = f["weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 < float(w) <= 1.0:
            raise _err(name, f"{where}.weight", f"{w!r} is not in (0, 1]")
        key = (str(f["signal"]), _text(name, f"{where}.finding", f["finding"]), str(f["at"]))
        if key in sig:
            raise _err(name, where, f"{' '.join(key)} listed twice")
        sig[key] = float(w)
    return Case(id=cid, title=_text(name, "title", d["title"]),
                fault=_text(name, "fault", d["fault"]), resource_kind=str(kind),
                signature=_freeze(sig), resolution=_text(name, "resolution", d["resolution"]),
                date=date, resource=_text(name, "resource", d.get("resource", ""), empty=True),
                source=_text(name, "source", d.get("source", ""), empty=True))


def dump_case(case: Case) -> str:
    """The YAML text of ``case`` (:func:`parse_case` reads it back unchanged)."""
    body: dict[str, Any] = {
        "id": case.id, "title": case.title, "fault": case.fault,
        "resource_kind": case.resource_kind, "date": case.date,
        "signature": [{"signal": s, "finding": k, "at": r, "weight": w}
                      for (s, k, r), w in case.signature],
        "resolution": case.resolution,
    }
    if case.resource:
        body["resource"] = case.resource
    if case.source:
        body["source"] = case.source
    return yaml.safe_dump({"case": body}, sort_keys=False, allow_unicode=True, width=100)


def save_case(case: Case, folder: Path) -> Path:
    """Write ``case`` to ``folder/<id>.yaml`` (creating the folder; replaces that file)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{case.id}.yaml"
        tmp = path.with_suffix(".yaml.tmp")
        tmp.write_text(dump_case(case), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"{folder}: cannot save case {case.id}: {exc}") from None
    return path


def load_cases(folder: Path) -> list[Case]:
    """Every ``*.yaml`` case directly in ``folder``, sorted by file name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder of cases")
    out = []
    for p in sorted(folder.glob("*.yaml")):
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: cannot read: {exc}") from None
        out.append(parse_case(str(p), text))
    return out


@functools.lru_cache(maxsize=1)
def _seeds() -> tuple[Case, ...]:
    root = importlib.resources.files("fabricscope.diagnosis").joinpath("kb").joinpath("cases")
    return tuple(parse_case(p.name, p.read_text(encoding="utf-8"))
                 for p in sorted(root.iterdir(), key=lambda p: p.name)
                 if p.is_file() and p.name.endswith(".yaml"))


def seed_cases() -> list[Case]:
    """The packaged seed cases (parsed once per process)."""
    return list(_seeds())


def load_case_base(folders: Sequence[Path] = (), *, seeds: bool = True) -> CaseBase:
    """The seed cases (unless ``seeds`` is False) plus the cases of ``folders``, in order;
    a case whose id exists replaces it."""
    cb = CaseBase(seed_cases() if seeds else ())
    for f in folders:
        for c in load_cases(f):
            cb.add(c)
    return cb
