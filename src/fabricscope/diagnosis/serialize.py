"""JSON form of the diagnosis records (Observed, Incident with its RootCause and Check).

The store keeps an incident as one JSON document and the export writes the same documents,
so this module is the one place that says what they look like. ``*_to_json`` gives plain
dicts of str / int / float / bool / list (``json.dumps``-ready); ``*_from_json`` reads them
back into the frozen records and is exact: ``incident_from_json(incident_to_json(i)) == i``.

Reading validates as it goes (a hand-edited export, a store written by another version):
a missing key, a wrong type or an unknown key is one
:class:`~fabricscope.model.errors.ConfigError` naming the source, the record, the field and
the value, never a ``KeyError`` or ``TypeError``. Keys whose record field has a default may
be omitted.

An observed finding::

    {"id": "f-1a2b3c4d5e6f", "source": "telemetry", "reported_ns": 12000000000,
     "kind": "crc-increase", "subject": "spine-01:eth4", "score": 0.93,
     "window": [10000000000, 12000000000], "evidence": ["in-fcs-errors +412/s"],
     "action": "inspect the optic", "details": {"rate": 412.0}}

An incident (``root_causes`` ranked, each with its ``checks``)::

    {"id": "inc-0001", "status": "open", "opened_ns": ..., "updated_ns": ...,
     "first_symptom_ns": ..., "detected_ns": ..., "root_cause_ns": ... | null,
     "action_ns": ... | null, "closed_ns": ... | null, "severity": "critical",
     "title": "...", "findings": ["f-..."], "blast": {"links": 1, "gpus": 16},
     "actions": ["..."],
     "root_causes": [{"resource": "spine-01:eth4", "fault": "dirty-connector",
                      "probability": 0.87, "explains": ["f-..."], "evidence": ["..."],
                      "action": "...", "specialist": "optics",
                      "checks": [{"name": "...", "source": "...", "result": "supports",
                                  "detail": "..."}]}]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from fabricscope.diagnosis.model import Check, Incident, Observed, RootCause
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding

__all__ = [
    "incident_from_json",
    "incident_to_json",
    "observed_from_json",
    "observed_to_json",
]

STATUSES: tuple[str, ...] = ("open", "closed")
_T = TypeVar("_T")


def observed_to_json(o: Observed) -> dict[str, Any]:
    """The JSON dict of one observed finding (flat: the finding's fields beside id/source)."""
    f = o.finding
    return {
        "id": o.id, "source": o.source, "reported_ns": o.reported_ns,
        "kind": f.kind, "subject": f.subject, "score": f.score,
        "window": [f.window[0], f.window[1]], "evidence": list(f.evidence),
        "action": f.action, "details": dict(f.details),
    }


def _check_to_json(c: Check) -> dict[str, Any]:
    return {"name": c.name, "source": c.source, "result": c.result, "detail": c.detail}


def _root_cause_to_json(r: RootCause) -> dict[str, Any]:
    return {
        "resource": r.resource, "fault": r.fault, "probability": r.probability,
        "explains": list(r.explains), "evidence": list(r.evidence),
        "checks": [_check_to_json(c) for c in r.checks],
        "action": r.action, "specialist": r.specialist,
    }


def incident_to_json(i: Incident) -> dict[str, Any]:
    """The JSON dict of one incident, root causes and their checks nested, in rank order."""
    return {
        "id": i.id, "status": i.status, "opened_ns": i.opened_ns, "updated_ns": i.updated_ns,
        "first_symptom_ns": i.first_symptom_ns, "detected_ns": i.detected_ns,
        "root_cause_ns": i.root_cause_ns, "action_ns": i.action_ns, "closed_ns": i.closed_ns,
        "severity": i.severity, "title": i.title,
        "root_causes": [_root_cause_to_json(r) for r in i.root_causes],
        "findings": list(i.findings), "blast": dict(i.blast), "actions": list(i.actions),
    }


class _Reader:
    """Typed access to one JSON object; every failure names source, record and field."""

    def __init__(self, d: object, *, source: str, where: str) -> None:
        self.source = source
        self.where = where
        if not isinstance(d, Mapping):
            self.fail("", d, "an object")
        self.d: Mapping[object, object] = d

    def fail(self, field: str, value: object, expected: str) -> NoReturn:
        text = repr(value)
        if len(text) > 60:
            text = text[:57] + "..."
        at = f"{self.where} field {field}" if field else self.where
        raise ConfigError(f"{self.source}: {at}: expected {expected}, got {text}")

    def only(self, allowed: tuple[str, ...]) -> None:
        extra = sorted(str(k) for k in self.d if k not in allowed)
        if extra:
            raise ConfigError(f"{self.source}: {self.where}: unknown field(s) "
                              f"{', '.join(extra)} (known: {', '.join(allowed)})")

    def get(self, key: str, default: object, check: Callable[[object], bool],
             expected: str) -> object:
        if key not in self.d:
            if default is _REQUIRED:
                raise ConfigError(f"{self.source}: {self.where}: missing field {key}")
            return default
        v = self.d[key]
        if not check(v):
            self.fail(key, v, expected)
        return v

    def str_(self, key: str, default: object = None) -> str:
        v = self.get(key, _REQUIRED if default is None else default,
                      lambda x: isinstance(x, str), "a string")
        assert isinstance(v, str)
        return v

    def int_(self, key: str) -> int:
        v = self.get(key, _REQUIRED, _is_int, "an integer")
        assert isinstance(v, int)
        return v

    def opt_int(self, key: str) -> int | None:
        v = self.get(key, None, lambda x: x is None or _is_int(x), "an integer or null")
        assert v is None or isinstance(v, int)
        return v

    def float_(self, key: str) -> float:
        v = self.get(key, _REQUIRED, _is_number, "a number")
        assert isinstance(v, int | float)
        return float(v)

    def list_(self, key: str, item: Callable[[object, str], _T]) -> tuple[_T, ...]:
        v = self.get(key, [], lambda x: isinstance(x, list | tuple), "a list")
        assert isinstance(v, list | tuple)
        return tuple(item(x, f"{key}[{k}]") for k, x in enumerate(v))

    def str_item(self, x: object, field: str) -> str:
        if not isinstance(x, str):
            self.fail(field, x, "a string")
        return x

    def mapping(self, key: str, ok: Callable[[object], bool], expected: str) -> dict[str, Any]:
        v = self.get(key, {}, lambda x: isinstance(x, Mapping), "an object")
        assert isinstance(v, Mapping)
        out: dict[str, Any] = {}
        for k, x in v.items():
            if not isinstance(k, str):
                self.fail(key, k, "string keys")
            if not ok(x):
                self.fail(f"{key}.{k}", x, expected)
            out[k] = x
        return out


_REQUIRED = object()


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _record_id(d: object, fallback: str) -> str:
    if isinstance(d, Mapping) and isinstance(d.get("id"), str):
        return str(d["id"])
    return fallback


_OBSERVED_KEYS = ("id", "source", "reported_ns", "kind", "subject", "score", "window",
                  "evidence", "action", "details")


def observed_from_json(d: object, *, source: str = "findings") -> Observed:
    """An :class:`Observed` from :func:`observed_to_json`'s dict; ``source`` names where the
    dict came from (a file and line, a table) in the error of a malformed one."""
    r = _Reader(d, source=source, where=f"finding {_record_id(d, '(no id)')}")
    r.only(_OBSERVED_KEYS)
    window = r.get("window", _REQUIRED, lambda x: isinstance(x, list | tuple) and len(x) == 2
                    and all(_is_int(t) for t in x), "[start_ns, end_ns] (two integers)")
    assert isinstance(window, list | tuple)
    details = r.mapping("details", lambda x: isinstance(x, str) or _is_number(x),
                        "a number or a string")
    finding = Finding(kind=r.str_("kind"), subject=r.str_("subject"), score=r.float_("score"),
                      window=(int(window[0]), int(window[1])),
                      evidence=r.list_("evidence", r.str_item), action=r.str_("action", ""),
                      details=details)
    return Observed(source=r.str_("source"), finding=finding, reported_ns=r.int_("reported_ns"),
                    id=r.str_("id", ""))


_CHECK_KEYS = ("name", "source", "result", "detail")
_ROOT_CAUSE_KEYS = ("resource", "fault", "probability", "explains", "evidence", "checks",
                    "action", "specialist")
_INCIDENT_KEYS = ("id", "status", "opened_ns", "updated_ns", "first_symptom_ns", "detected_ns",
                  "root_cause_ns", "action_ns", "closed_ns", "severity", "title", "root_causes",
                  "findings", "blast", "actions")


def _check_from_json(d: object, *, source: str, where: str) -> Check:
    r = _Reader(d, source=source, where=where)
    r.only(_CHECK_KEYS)
    return Check(name=r.str_("name"), source=r.str_("source"), result=r.str_("result"),
                 detail=r.str_("detail", ""))


def _root_cause_from_json(d: object, *, source: str, where: str) -> RootCause:
    r = _Reader(d, source=source, where=where)
    r.only(_ROOT_CAUSE_KEYS)
    checks = r.list_("checks", lambda x, f: _check_from_json(x, source=source,
                                                             where=f"{where}.{f}"))
    return RootCause(resource=r.str_("resource"), fault=r.str_("fault"),
                     probability=r.float_("probability"),
                     explains=r.list_("explains", r.str_item),
                     evidence=r.list_("evidence", r.str_item), checks=checks,
                     action=r.str_("action", ""), specialist=r.str_("specialist", ""))


def incident_from_json(d: object, *, source: str = "incidents") -> Incident:
    """An :class:`Incident` from :func:`incident_to_json`'s dict (root causes and checks
    nested); ``source`` names where it came from in the error of a malformed one."""
    iid = _record_id(d, "(no id)")
    where = f"incident {iid}"
    r = _Reader(d, source=source, where=where)
    r.only(_INCIDENT_KEYS)
    status = r.str_("status")
    if status not in STATUSES:
        r.fail("status", status, " or ".join(STATUSES))
    root_causes = r.list_("root_causes", lambda x, f: _root_cause_from_json(
        x, source=source, where=f"{where} {f}"))
    return Incident(
        id=r.str_("id"), status="open" if status == "open" else "closed",
        opened_ns=r.int_("opened_ns"), updated_ns=r.int_("updated_ns"),
        first_symptom_ns=r.int_("first_symptom_ns"), detected_ns=r.int_("detected_ns"),
        root_causes=root_causes, findings=r.list_("findings", r.str_item),
        severity=r.str_("severity", "warning"),
        blast=r.mapping("blast", _is_int, "an integer"),
        root_cause_ns=r.opt_int("root_cause_ns"), action_ns=r.opt_int("action_ns"),
        closed_ns=r.opt_int("closed_ns"), title=r.str_("title", ""),
        actions=r.list_("actions", r.str_item),
    )
