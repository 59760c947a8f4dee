"""gNMI paths as plain values: parse, format and match (wildcards ``*``/``...`` and keys).

Follows the gNMI path conventions (openconfig/reference ``gnmi-path-conventions.md``):
``/interfaces/interface[name=eth1]/state/counters/in-octets``, an optional ``origin:`` before
the first ``/``, key values may contain ``/`` and escape ``]`` and ``\\`` with a backslash.
``*`` matches one element (or any key value); ``...`` matches any number of elements.
Nothing here knows protobuf: the edge (``codec``) converts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fabricscope.model.errors import ConfigError

__all__ = [
    "Elem",
    "GPath",
    "PathSyntaxError",
    "format_path",
    "join",
    "match",
    "parse_path",
    "schema_name",
    "tags_of",
]


class PathSyntaxError(ConfigError):
    """A gNMI path string cannot be parsed; names the path and the position."""


@dataclass(frozen=True, slots=True)
class Elem:
    """One path element: a name and its keys (sorted by key name, so equal paths compare equal)."""

    name: str
    keys: tuple[tuple[str, str], ...] = ()

    @property
    def key_map(self) -> Mapping[str, str]:
        return dict(self.keys)


@dataclass(frozen=True, slots=True)
class GPath:
    """A gNMI path: origin, elements and (for prefixes) the target."""

    elems: tuple[Elem, ...] = ()
    origin: str = ""
    target: str = ""

    def __str__(self) -> str:
        return format_path(self)

    @property
    def has_wildcards(self) -> bool:
        return any(
            e.name in ("*", "...") or any(v == "*" for _, v in e.keys) for e in self.elems
        )


def _bad_char(text: str, forbidden: str) -> str | None:
    for c in text:
        if c in forbidden or c.isspace():
            return c
    return None


def parse_path(text: str, *, source: str = "path") -> GPath:
    """Parse a path string; raise :class:`PathSyntaxError` naming ``source`` and the position.

    Surrounding whitespace is ignored, so element names, key names and the origin may not
    contain whitespace (YANG identifiers never do); key values may hold anything, with
    ``]`` and ``\\`` escaped by a backslash. For every string this accepts,
    ``parse_path(format_path(parse_path(s))) == parse_path(s)``.

    >>> parse_path("/interfaces/interface[name=eth1]/state").elems[1].keys
    (('name', 'eth1'),)
    """
    s = text.strip()
    origin = ""
    first_slash = s.find("/")
    first_br = s.find("[")
    colon = s.find(":")
    if colon > 0 and (first_slash < 0 or colon < first_slash) and (first_br < 0 or colon < first_br):
        origin, s = s[:colon], s[colon + 1 :]
        bad = _bad_char(origin, "]")
        if bad is not None:
            raise PathSyntaxError(f"{source}: {_clip(text)}: bad character {bad!r} in origin")
    if s in ("", "/"):
        return GPath((), origin)
    elems: list[Elem] = []
    i, n = 0, len(s)
    if s[0] == "/":
        i = 1
    while i < n:
        name_start = i
        while i < n and s[i] not in "/[]":
            i += 1
        name = s[name_start:i]
        if i < n and s[i] == "]":
            raise PathSyntaxError(f"{source}: {_clip(text)}: unexpected ']' at position {i}")
        if not name:
            raise PathSyntaxError(f"{source}: {_clip(text)}: empty element name at position {i}")
        bad = _bad_char(name, "")
        if bad is not None:
            raise PathSyntaxError(f"{source}: {_clip(text)}: bad character {bad!r} in element name "
                                  f"at position {name_start}")
        keys: dict[str, str] = {}
        while i < n and s[i] == "[":
            eq = s.find("=", i)
            if eq < 0:
                raise PathSyntaxError(f"{source}: {_clip(text)}: key without '=' at position {i}")
            kname = s[i + 1 : eq]
            if not kname or _bad_char(kname, "[]/") is not None:
                raise PathSyntaxError(f"{source}: {_clip(text)}: bad key name {_clip(kname)} at position {i}")
            j = eq + 1
            val: list[str] = []
            while j < n and s[j] != "]":
                if s[j] == "\\" and j + 1 < n:
                    j += 1
                val.append(s[j])
                j += 1
            if j >= n:
                raise PathSyntaxError(f"{source}: {_clip(text)}: unterminated key [{kname[:40]}=...")
            if kname in keys:
                raise PathSyntaxError(f"{source}: {_clip(text)}: duplicate key {kname!r} in {_clip(name, 40)}")
            keys[kname] = "".join(val)
            i = j + 1
        elems.append(Elem(name, tuple(sorted(keys.items()))))
        if i < n:
            if s[i] != "/":
                raise PathSyntaxError(f"{source}: {_clip(text)}: expected '/' at position {i}")
            i += 1
            if i == n:
                break  # trailing slash is harmless
    return GPath(tuple(elems), origin)


def _clip(text: str, limit: int = 200) -> str:
    """``repr`` of ``text`` cut to ``limit`` characters: an error never echoes a megabyte path."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"...({len(text)} chars)"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("]", "\\]")


def format_path(path: GPath) -> str:
    """The canonical string form (``origin:`` only when set); inverse of :func:`parse_path`."""
    body = "/" + "/".join(
        e.name + "".join(f"[{k}={_escape(v)}]" for k, v in e.keys) for e in path.elems
    )
    return f"{path.origin}:{body}" if path.origin else body


def join(prefix: GPath, path: GPath) -> GPath:
    """Prefix + path (gNMI: the full path of an update), keeping the prefix's target."""
    return GPath(prefix.elems + path.elems, path.origin or prefix.origin, prefix.target)


def _elem_match(p: Elem, e: Elem) -> bool:
    if p.name != "*" and p.name != e.name:
        return False
    if not p.keys:
        return True
    have = dict(e.keys)
    return all(v == "*" or have.get(k) == v for k, v in p.keys)


def match(pattern: GPath, path: GPath, *, prefix: bool = True) -> bool:
    """Does ``path`` fall under ``pattern``?

    ``prefix=True`` (subscription semantics): ``pattern`` may stop above ``path`` and then
    covers the whole subtree. Origins are ignored when either side leaves it empty.
    """
    if pattern.origin and path.origin and pattern.origin != path.origin:
        return False
    return _match(pattern.elems, 0, path.elems, 0, prefix)


def _match(pe: tuple[Elem, ...], i: int, xe: tuple[Elem, ...], j: int, prefix: bool) -> bool:
    # A set of reachable positions in ``xe`` instead of backtracking: O(len(pe) x len(xe))
    # for any number of ``...`` (backtracking was exponential in them, a hostile pattern
    # could pin the event loop). A pattern with more fixed elements than the path has
    # cannot match at all, which rejects huge hostile patterns in O(len(pe)).
    rest = pe[i:]
    if sum(1 for p in rest if p.name != "...") > len(xe) - j:
        return False
    reach = {j}
    n = len(xe)
    for p in rest:
        if p.name == "...":
            reach = set(range(min(reach), n + 1))
        else:
            reach = {k + 1 for k in reach if k < n and _elem_match(p, xe[k])}
        if not reach:
            return False
    return prefix or n in reach


def schema_name(path: GPath) -> str:
    """The path without keys: the ``TelemetryEvent.name`` of a leaf."""
    return "/" + "/".join(e.name for e in path.elems)


def tags_of(path: GPath) -> dict[str, str]:
    """Keys as tags named ``<elem>_<key>`` (gnmic's convention: ``interface_name``)."""
    out: dict[str, str] = {}
    for e in path.elems:
        for k, v in e.keys:
            out[f"{e.name}_{k}"] = v
    return out
