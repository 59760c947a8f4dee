"""Traffic matrices over NICs: permutation, incast, all-to-all, and user flow lists (CSV/JSON).

These are NIC-level patterns (what a network test generator or the UEC htsim experiments
drive), not GPU collectives: two NICs of one host still talk through the fabric.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.flows import Workload
from fabricscope.sim.workload.build import FlowList
from fabricscope.sim.workload.units import parse_duration_ns, parse_size

MAX_REPORTED_ERRORS = 20


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _nic_ids(fabric: Fabric, nics: Sequence[str] | None) -> list[str]:
    ids = [n.id for n in fabric.nics] if nics is None else list(nics)
    known = {n.id for n in fabric.nics}
    for x in ids:
        if x not in known:
            raise WorkloadError(f"traffic: nics: {x!r} is not a NIC of {fabric.name!r}")
    return ids


def random_derangement(n: int, rng: np.random.Generator) -> list[int]:
    """A uniformly random permutation of ``0..n-1`` with no fixed point (rejection sampling:
    a random permutation is a derangement with probability ~1/e, so ~2.7 draws on average)."""
    if n < 2:
        raise WorkloadError(f"permutation: needs at least 2 endpoints, got {n}")
    idx = np.arange(n)
    while True:
        p = rng.permutation(n)
        if not np.any(p == idx):
            return [int(x) for x in p]


def permutation(
    fabric: Fabric,
    size_bytes: float,
    *,
    seed: int | np.random.Generator = 0,
    nics: Sequence[str] | None = None,
    name: str | None = None,
) -> Workload:
    """Every NIC sends one flow of ``size_bytes`` to a distinct other NIC (random derangement)."""
    ids = _nic_ids(fabric, nics)
    perm = random_derangement(len(ids), _rng(seed))
    fl = FlowList()
    for i, j in enumerate(perm):
        fl.add(ids[i], ids[j], size_bytes, tag="permutation")
    return Workload(name or f"permutation-{len(ids)}", fl.flows(),
                    meta={"pattern": "permutation", "flow_bytes": size_bytes})


def incast(
    fabric: Fabric,
    size_bytes: float,
    *,
    senders: int | Sequence[str],
    receiver: str | None = None,
    seed: int | np.random.Generator = 0,
    name: str | None = None,
) -> Workload:
    """``senders`` NICs each send ``size_bytes`` to one ``receiver`` (default: the first NIC).

    An integer ``senders`` draws that many distinct NICs (other than the receiver) at random.
    """
    all_ids = _nic_ids(fabric, None)
    recv = all_ids[0] if receiver is None else receiver
    if recv not in set(all_ids):
        raise WorkloadError(f"incast: receiver: {recv!r} is not a NIC of {fabric.name!r}")
    if isinstance(senders, int):
        pool = [x for x in all_ids if x != recv]
        if not 1 <= senders <= len(pool):
            raise WorkloadError(f"incast: senders: must be 1..{len(pool)}, got {senders}")
        pick = _rng(seed).choice(len(pool), size=senders, replace=False)
        srcs = [pool[int(i)] for i in sorted(pick)]
    else:
        srcs = _nic_ids(fabric, senders)
        if recv in srcs:
            raise WorkloadError(f"incast: senders: include the receiver {recv!r}")
        if not srcs:
            raise WorkloadError("incast: senders: empty list")
    fl = FlowList()
    for s in srcs:
        fl.add(s, recv, size_bytes, tag="incast")
    return Workload(name or f"incast-{len(srcs)}to1", fl.flows(),
                    meta={"pattern": "incast", "receiver": recv, "flow_bytes": size_bytes})


def all_to_all_matrix(
    fabric: Fabric,
    pair_bytes: float,
    *,
    nics: Sequence[str] | None = None,
    name: str | None = None,
) -> Workload:
    """Every NIC sends ``pair_bytes`` to every other NIC, all at t = 0."""
    ids = _nic_ids(fabric, nics)
    fl = FlowList()
    for a in ids:
        for b in ids:
            if a != b:
                fl.add(a, b, pair_bytes, tag="all-to-all")
    if not len(fl):
        raise WorkloadError("all-to-all: needs at least 2 NICs")
    return Workload(name or f"all-to-all-{len(ids)}", fl.flows(),
                    meta={"pattern": "all-to-all", "flow_bytes": pair_bytes})


# ---------------------------------------------------------------- user flow lists
def _endpoint_resolver(fabric: Fabric) -> Mapping[str, str]:
    """NIC ids, NIC addresses and single-NIC host ids, each mapped to a NIC id."""
    out: dict[str, str] = {n.id: n.id for n in fabric.nics}
    for addr, n in fabric.nic_by_address.items():
        out[addr] = n.id
    for h, ns in fabric.nics_of_host.items():
        if len(ns) == 1:
            out[h] = ns[0].id
    return out


def parse_flow_rows(
    fabric: Fabric,
    rows: Iterable[tuple[str, Mapping[str, object]]],
    *,
    source: str,
    name: str | None = None,
) -> Workload:
    """Flows from ``(location, row)`` pairs with fields ``src, dst, size[, start]``.

    Every bad row is reported (up to :data:`MAX_REPORTED_ERRORS`) in one :class:`ConfigError`
    naming the source, the row, the field and the value.
    """
    endpoints = _endpoint_resolver(fabric)
    fl = FlowList()
    errors: list[str] = []
    seen = 0
    for where, row in rows:
        seen += 1
        bad = len(errors)
        unknown = sorted(set(row) - {"src", "dst", "size", "start"})
        for k in unknown:
            errors.append(f"{source}: {where}: unknown field {k!r} (fields: src, dst, size, start)")
        ends: list[str] = []
        for key in ("src", "dst"):
            v = row.get(key)
            if v is None or v == "":
                errors.append(f"{source}: {where}: {key}: missing")
            elif str(v).strip() not in endpoints:
                errors.append(
                    f"{source}: {where}: {key}: {v!r} is not a NIC id, NIC address or "
                    f"single-NIC host of {fabric.name!r}"
                )
            else:
                ends.append(endpoints[str(v).strip()])
        size = 0.0
        try:
            size = parse_size(_strip(row.get("size")), field="size", source=f"{source}: {where}")
        except ConfigError as exc:
            errors.append(str(exc))
        start = 0
        if row.get("start") not in (None, ""):
            try:
                start = parse_duration_ns(_strip(row.get("start")), field="start",
                                          source=f"{source}: {where}")
            except ConfigError as exc:
                errors.append(str(exc))
        if len(ends) == 2 and ends[0] == ends[1]:
            errors.append(f"{source}: {where}: dst: same NIC as src ({ends[0]!r})")
        if len(errors) == bad:
            fl.add(ends[0], ends[1], size, start_ns=start, tag="flow-list")
    if errors:
        more = len(errors) - MAX_REPORTED_ERRORS
        lines = errors[:MAX_REPORTED_ERRORS] + ([f"... and {more} more"] if more > 0 else [])
        raise ConfigError(f"{len(errors)} error(s) in flow list: " + "; ".join(lines))  # one line
    if not len(fl):
        raise WorkloadError(f"{source}: no flows (empty flow list)")
    return Workload(name or pathlib.PurePath(source).stem or "flow-list", fl.flows(),
                    meta={"pattern": "flow-list", "source": source, "rows": seen})


def _strip(v: object) -> object:
    return v.strip() if isinstance(v, str) else v


def parse_flow_csv(fabric: Fabric, text: str, *, source: str = "<csv>") -> Workload:
    """Flows from CSV text with a header ``src,dst,size[,start]`` (``#`` lines are comments)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise WorkloadError(f"{source}: no flows (empty flow list)")
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in ("src", "dst", "size") if c not in header]
    if missing:
        raise ConfigError(
            f"{source}: header: missing column(s) {', '.join(missing)} "
            f"(expected src,dst,size[,start]; got {','.join(header)!r})"
        )

    def rows() -> Iterable[tuple[str, Mapping[str, object]]]:
        for i, raw in enumerate(reader, start=2):
            row: dict[str, object] = {}
            for k, v in raw.items():
                if k is None:  # more cells than header columns
                    row["<extra>"] = v
                else:
                    row[k.strip()] = v
            yield f"row {i}", row

    return parse_flow_rows(fabric, rows(), source=source)


def parse_flow_json(fabric: Fabric, text: str, *, source: str = "<json>") -> Workload:
    """Flows from JSON: a list of ``{"src", "dst", "size"[, "start"]}`` or ``{"flows": [...]}``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}") from None
    if isinstance(data, dict) and "flows" in data:
        data = data["flows"]
    if not isinstance(data, list):
        raise ConfigError(f"{source}: expected a list of flows or {{'flows': [...]}}, got {type(data).__name__}")
    errors: list[str] = []
    good: list[tuple[str, Mapping[str, object]]] = []
    for i, item in enumerate(data):
        if isinstance(item, dict):
            good.append((f"flows[{i}]", item))
        else:
            errors.append(f"{source}: flows[{i}]: expected an object with src, dst, size, got {item!r}")
    try:
        wl = parse_flow_rows(fabric, good, source=source)
    except ConfigError as exc:
        if not errors:
            raise
        raise ConfigError(f"{len(errors)} error(s) in flow list: " + "; ".join(errors) + "; " + str(exc)) from None
    if errors:
        raise ConfigError(f"{len(errors)} error(s) in flow list: " + "; ".join(errors))
    return wl


def read_flow_list(fabric: Fabric, path: str | pathlib.Path) -> Workload:
    """Read a user flow list; ``.json`` files are JSON, anything else CSV."""
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read flow list: {exc.strerror or exc}") from None
    if p.suffix.lower() == ".json":
        return parse_flow_json(fabric, text, source=str(p))
    return parse_flow_csv(fabric, text, source=str(p))
