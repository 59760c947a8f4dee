"""Reading and writing fabric inventories as YAML or JSON (schema version 1), validated.

The schema (documented with examples in ``docs/fabric.md``)::

    version: 1                       # required, the schema version
    name: my-cluster                 # optional, defaults to the file's stem
    meta: {kind: rail-optimized}     # optional free-form mapping (builder parameters)
    devices:                         # required: hosts, NICs and switches
      - {id: host0000, role: host, gpus: 8, pod: 0}
      - {id: host0000/nic0, role: nic, host: host0000, gpu: 0, rail: 0, address: 198.18.0.1}
      - {id: leaf-p0-r0-00, role: leaf, pod: 0, rail: 0, address: 198.19.255.254}
    ports:                           # optional: only uncabled ports, or ports whose speed
      - {id: "leaf-p0-r0-00:eth64", speed_gbps: 400}   # differs from their link's capacity
    links:                           # required: full-duplex cables between two ports
      - {a: "host0000/nic0:p0", b: "leaf-p0-r0-00:eth1", capacity_gbps: 400, latency_ns: 1000}

A port that a link names and ``ports`` does not list is declared by that link, with the
link's capacity as its speed; its device must exist. This keeps a 32,768-GPU file to one line
per device and per cable. Everything is checked before a :class:`Fabric` exists: unknown keys,
wrong types, duplicate ids, a link to a port of a missing device, a port used twice, a
capacity of 0, a NIC on two rails; each problem names the file, the field and the value.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fabricscope.fabric.inventory import ROLES, Device, Fabric, Link, Port
from fabricscope.model.errors import InventoryError

SCHEMA_VERSION = 1
DEFAULT_LATENCY_NS = 1000
MAX_REPORTED = 20

_TOP_KEYS = {"version", "name", "meta", "devices", "ports", "links"}
_INT_FIELDS = ("pod", "plane", "rail", "gpu", "gpus")
_DEVICE_KEYS = {"id", "role", "host", "address", *_INT_FIELDS}
_PORT_KEYS = {"id", "speed_gbps"}
_LINK_KEYS = {"a", "b", "capacity_gbps", "latency_ns"}
_BAD_ID_CHARS = (":", "|", "->", " ", "\t", "\n")

try:  # libyaml is ~10x faster on large inventories; pure Python is the fallback
    _Loader: Any = yaml.CSafeLoader
    _Dumper: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader
    _Dumper = yaml.SafeDumper


class _Problems:
    """Collects schema problems so one run reports many (up to :data:`MAX_REPORTED`)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, where: str, msg: str) -> None:
        self.items.append(f"{where}: {msg}")

    def raise_if_any(self) -> None:
        if not self.items:
            return
        shown = self.items[:MAX_REPORTED]
        more = len(self.items) - len(shown)
        head = f"{self.source}: " + ("" if len(self.items) == 1 else f"{len(self.items)} problems: ")
        raise InventoryError(head + "; ".join(shown) + (f"; ... and {more} more" if more else ""))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check_keys(item: Mapping[Any, Any], allowed: set[str], where: str, pr: _Problems) -> None:
    for k in item:
        if k not in allowed:
            # repr unless a plain word: a key with a newline must not break the one-line error
            shown = k if isinstance(k, str) and k.isidentifier() else repr(k)
            pr.add(f"{where}.{shown}", f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _check_id(v: object, where: str, pr: _Problems, *, port: bool = False) -> bool:
    if not isinstance(v, str) or not v:
        pr.add(where, f"expected a non-empty string, got {v!r}")
        return False
    if port:
        dev, _, pname = v.rpartition(":")
        if not dev or not pname:
            pr.add(where, f"a port id is '<device>:<port>', got {v!r}")
            return False
        bad = [c for c in _BAD_ID_CHARS if c in dev or (c != ":" and c in pname)]
    else:
        bad = [c for c in _BAD_ID_CHARS if c in v]
    if bad:
        pr.add(where, f"{v!r} contains {bad[0]!r}, which ids may not contain")
        return False
    return True


def _list(data: Mapping[Any, Any], key: str, pr: _Problems, *, required: bool) -> list[Any]:
    v = data.get(key)
    if v is None:
        if required:
            pr.add(key, "missing (a list is required)")
        return []
    if not isinstance(v, list):
        pr.add(key, f"expected a list, got {type(v).__name__}")
        return []
    return v


def _devices(raw: list[Any], pr: _Problems) -> list[Device]:
    out: list[Device] = []
    first_id: dict[str, int] = {}  # id -> first index; caught here, before links resolve ports
    first_addr: dict[str, int] = {}
    for i, item in enumerate(raw):
        where = f"devices[{i}]"
        if not isinstance(item, dict):
            pr.add(where, f"expected a mapping, got {item!r}")
            continue
        n0 = len(pr.items)
        did = item.get("id")
        if _check_id(did, f"{where}.id", pr):
            where = f"devices[{i}] ({did})"
            if did in first_id:
                pr.add(f"{where}.id", f"duplicate id {did!r} (first at devices[{first_id[did]}])")
            first_id.setdefault(str(did), i)
        _check_keys(item, _DEVICE_KEYS, where, pr)
        role: Any = item.get("role")
        if role not in ROLES:
            pr.add(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
        for f in _INT_FIELDS:
            v = item.get(f)
            if v is not None and (not _is_int(v) or v < 0):
                pr.add(f"{where}.{f}", f"expected an integer >= 0, got {v!r}")
        host = item.get("host")
        if host is not None and not isinstance(host, str):
            pr.add(f"{where}.host", f"expected a device id, got {host!r}")
        addr = item.get("address")
        if addr is not None:
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                pr.add(f"{where}.address", f"not an IP address: {addr!r}")
            else:
                if addr in first_addr:  # two NICs with one address would hash as one endpoint
                    pr.add(f"{where}.address", f"duplicate address {addr!r} (first at devices[{first_addr[addr]}])")
                first_addr.setdefault(addr, i)
        if len(pr.items) == n0:
            out.append(Device(
                id=str(did), role=role, pod=item.get("pod"), plane=item.get("plane"),
                rail=item.get("rail"), host=host, gpu=item.get("gpu"),
                gpus=item.get("gpus") or 0, address=addr,
            ))
    return out


def _ports(raw: list[Any], pr: _Problems) -> list[Port]:
    out: list[Port] = []
    for i, item in enumerate(raw):
        where = f"ports[{i}]"
        if not isinstance(item, dict):
            pr.add(where, f"expected a mapping, got {item!r}")
            continue
        n0 = len(pr.items)
        _check_keys(item, _PORT_KEYS, where, pr)
        pid = item.get("id")
        _check_id(pid, f"{where}.id", pr, port=True)
        speed: Any = item.get("speed_gbps")
        if not _is_number(speed):
            pr.add(f"{where}.speed_gbps", f"expected a number, got {speed!r}")
        if len(pr.items) == n0:
            dev, name = str(pid).rsplit(":", 1)
            out.append(Port(dev, name, speed))
    return out


def _links(raw: list[Any], pr: _Problems) -> list[Link]:
    out: list[Link] = []
    for i, item in enumerate(raw):
        where = f"links[{i}]"
        if not isinstance(item, dict):
            pr.add(where, f"expected a mapping, got {item!r}")
            continue
        n0 = len(pr.items)
        _check_keys(item, _LINK_KEYS, where, pr)
        for end in ("a", "b"):
            _check_id(item.get(end), f"{where}.{end}", pr, port=True)
        cap: Any = item.get("capacity_gbps")
        if not _is_number(cap):
            pr.add(f"{where}.capacity_gbps", f"expected a number, got {cap!r}")
        elif not cap > 0:
            pr.add(f"{where}.capacity_gbps", f"must be > 0, got {cap!r}")
        lat: Any = item.get("latency_ns", DEFAULT_LATENCY_NS)
        if not _is_int(lat) or lat < 0:
            pr.add(f"{where}.latency_ns", f"expected an integer >= 0, got {lat!r}")
        if len(pr.items) == n0:
            out.append(Link(item["a"], item["b"], cap, lat))
    return out


def fabric_from_dict(data: object, *, source: str = "<dict>", name: str | None = None) -> Fabric:
    """Validate a schema-v1 mapping and build the :class:`Fabric` it describes.

    ``source`` (a file name) starts every error message. Raises :class:`InventoryError`.
    """
    pr = _Problems(source)
    if not isinstance(data, dict):
        raise InventoryError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    _check_keys(data, _TOP_KEYS, "(top level)", pr)
    version = data.get("version")
    if version != SCHEMA_VERSION:
        pr.add("version", f"expected {SCHEMA_VERSION}, got {version!r}")
    fab_name = data.get("name", name or Path(source).stem)
    if not isinstance(fab_name, str) or not fab_name:
        pr.add("name", f"expected a non-empty string, got {fab_name!r}")
    meta = data.get("meta") or {}
    if not isinstance(meta, dict):
        pr.add("meta", f"expected a mapping, got {type(meta).__name__}")
    raw_devices = _list(data, "devices", pr, required=True)
    if isinstance(data.get("devices"), list) and not raw_devices:
        pr.add("devices", "empty (an inventory needs its hosts, NICs and switches)")
    devices = _devices(raw_devices, pr)
    ports = _ports(_list(data, "ports", pr, required=False), pr)
    links = _links(_list(data, "links", pr, required=True), pr)
    pr.raise_if_any()
    # Ports a link names but the file does not list are declared by the link.
    known = {p.id for p in ports}
    device_ids = {d.id for d in devices}
    for i, ln in enumerate(links):
        for end, pid in (("a", ln.a), ("b", ln.b)):
            if pid in known:
                continue
            dev, pname = pid.rsplit(":", 1)
            if dev not in device_ids:
                pr.add(f"links[{i}].{end}", f"port {pid!r} is on an unknown device {dev!r}")
                continue
            ports.append(Port(dev, pname, ln.capacity_gbps))
            known.add(pid)
    pr.raise_if_any()
    return Fabric.create(fab_name, devices, ports, links, meta=meta, source=source)


def fabric_to_dict(fabric: Fabric) -> dict[str, Any]:
    """The schema-v1 mapping of ``fabric`` (the inverse of :func:`fabric_from_dict`)."""
    devices: list[dict[str, Any]] = []
    for d in fabric.devices.values():
        item: dict[str, Any] = {"id": d.id, "role": d.role}
        for f in ("host", "gpu", "rail", "plane", "pod", "address"):
            v = getattr(d, f)
            if v is not None:
                item[f] = v
        if d.gpus:
            item["gpus"] = d.gpus
        devices.append(item)
    cap_of_port: dict[str, float] = {}
    links: list[dict[str, Any]] = []
    for ln in fabric.links:
        cap_of_port[ln.a] = cap_of_port[ln.b] = ln.capacity_gbps
        item = {"a": ln.a, "b": ln.b, "capacity_gbps": ln.capacity_gbps}
        if ln.latency_ns != DEFAULT_LATENCY_NS:
            item["latency_ns"] = ln.latency_ns
        links.append(item)
    ports = [
        {"id": p.id, "speed_gbps": p.speed_gbps}
        for p in fabric.ports.values()
        if cap_of_port.get(p.id) != p.speed_gbps
    ]
    out: dict[str, Any] = {"version": SCHEMA_VERSION, "name": fabric.name}
    if fabric.meta:
        out["meta"] = _plain(fabric.meta)
    out["devices"] = devices
    if ports:
        out["ports"] = ports
    out["links"] = links
    return out


def _plain(v: object) -> Any:
    """Meta as YAML/JSON-native values (tuples become lists)."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".json":
        return "json"
    raise InventoryError(f"{path}: unknown inventory format {suffix or '(none)'!r}; use .yaml, .yml or .json")


def parse_fabric(text: str, *, fmt: str, source: str = "<text>") -> Fabric:
    """Parse inventory text (``fmt`` ``"yaml"`` or ``"json"``); errors carry line numbers."""
    try:
        data = yaml.load(text, Loader=_Loader) if fmt == "yaml" else json.loads(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InventoryError(f"{source}{where}: malformed YAML: {problem}") from None
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{source}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}") from None
    except RecursionError:
        # An inventory is four levels deep; thousands of nested brackets are not one.
        raise InventoryError(
            f"{source}: malformed {fmt.upper()}: nested too deeply (an inventory is a mapping of "
            "lists of flat mappings)"
        ) from None
    try:
        return fabric_from_dict(data, source=source)
    except RecursionError:
        raise InventoryError(f"{source}: meta: nested too deeply") from None


def read_fabric(path: str | Path) -> Fabric:
    """Read and validate an inventory file (``.yaml``/``.yml`` or ``.json``)."""
    p = Path(path)
    fmt = _format(p)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"{p}: cannot read inventory: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    return parse_fabric(text, fmt=fmt, source=str(p))


def format_fabric(fabric: Fabric, *, fmt: str) -> str:
    """The inventory text of ``fabric`` (one line per device and per cable)."""
    data = fabric_to_dict(fabric)
    if fmt == "json":
        # One item per line: diffable and still compact at 32k GPUs.
        parts = []
        for key, value in data.items():
            if isinstance(value, list):
                body = ",\n".join("    " + json.dumps(x, separators=(", ", ": ")) for x in value)
                parts.append(f'  "{key}": [\n{body}\n  ]')
            else:
                parts.append(f'  "{key}": {json.dumps(value)}')
        return "{\n" + ",\n".join(parts) + "\n}\n"
    return str(yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=4096))


def write_fabric(fabric: Fabric, path: str | Path) -> Path:
    """Write ``fabric`` as YAML or JSON, chosen by the suffix of ``path``; returns the path."""
    p = Path(path)
    text = format_fabric(fabric, fmt=_format(p))
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"{p}: cannot write inventory: {exc.strerror or exc}") from None
    return p
