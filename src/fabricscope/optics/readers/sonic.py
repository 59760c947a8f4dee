"""Read SONiC STATE_DB transceiver tables (redis-style JSON or ``sonic-db-dump`` output).

SONiC's xcvrd writes, per front-panel port, the hashes ``TRANSCEIVER_INFO|<port>`` (identity),
``TRANSCEIVER_DOM_SENSOR|<port>`` (readings), ``TRANSCEIVER_DOM_THRESHOLD|<port>`` and, for
CMIS modules with performance monitoring, ``TRANSCEIVER_PM|<port>`` (field names as in
sonic-platform-daemons ``xcvrd`` and the sonic-utilities ``tests/mock_tables/state_db.json``
fixture). Two file shapes are accepted:

* redis-style: ``{"TRANSCEIVER_DOM_SENSOR|Ethernet0": {"temperature": "30.9", ...}, ...}``
  (what the sonic-utilities mock tables and ``redis-dump`` style exports hold);
* ``sonic-db-dump -n STATE_DB -y``: ``{"KEY": {"expireat": .., "ttl": .., "type": "hash",
  "value": {...}}}``.

Fields read: ``temperature``, ``voltage``, ``laser_temperature``, ``tx<N>bias`` (mA),
``tx<N>power`` / ``rx<N>power`` (dBm), N = 1..8 (1-based lanes become 0-based); thresholds
``temphighalarm`` .. ``vcclowwarning``, ``txbias*``, ``txpower*``, ``rxpower*``; identity
``manufacturer``, ``model``, ``serial`` and the media from ``specification_compliance`` /
``application_advertisement`` / ``type``; ``prefec_ber_avg`` of ``TRANSCEIVER_PM`` as the
module's ``pre_fec_ber``. Values are strings; ``N/A``, ``-inf`` and empty ones become NaN with
one warning per (field, value) and file.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from fabricscope.optics.history import FleetHistory
from fabricscope.optics.readers.ethtool import (
    MISSING_TOKENS,
    ParsedModule,
    Warnings,
    check_threshold_sets,
    history_from_modules,
    normalize_media,
)

__all__ = ["read_sonic_state_db"]

_TABLES = ("TRANSCEIVER_INFO", "TRANSCEIVER_DOM_SENSOR", "TRANSCEIVER_DOM_THRESHOLD",
           "TRANSCEIVER_PM")
_TH_FIELDS = {
    "temp": "temperature_c", "vcc": "vcc_v", "txbias": "tx_bias_ma",
    "txpower": "tx_power_dbm", "rxpower": "rx_power_dbm",
}
_TH_KINDS = {"highalarm": "high_alarm", "highwarning": "high_warn",
             "lowwarning": "low_warn", "lowalarm": "low_alarm"}
_LANE_RE = re.compile(r"^(tx|rx)(\d+)(bias|power)$")


def _value(raw: Any, key: str, fld: str, warn: Warnings) -> float:
    s = str(raw).strip()
    if s.lower() in MISSING_TOKENS:
        warn.add(f"record {key}", fld, s or "(empty)", "no value: stored as NaN")
        return math.nan
    try:
        v = float(s)
    except ValueError:
        warn.add(f"record {key}", fld, s, "not a number: stored as NaN")
        return math.nan
    if not math.isfinite(v):
        warn.add(f"record {key}", fld, s, "no light / no reading: stored as NaN")
        return math.nan
    return v


def _media(info: Mapping[str, Any]) -> str:
    spec = info.get("specification_compliance")
    if isinstance(spec, str) and spec.startswith("{"):
        try:
            d = ast.literal_eval(spec)
        except (ValueError, SyntaxError):
            d = {}
        if isinstance(d, dict):
            for k in ("Extended Specification Compliance", "10/40G Ethernet Compliance Code"):
                v = d.get(k)
                if isinstance(v, str) and v and v != "Extended":
                    return normalize_media(v)
    adv = info.get("application_advertisement")
    if isinstance(adv, str) and "module_media_interface_id" in adv:
        m = re.search(r"'module_media_interface_id':\s*'([^']*)'", adv)
        if m:
            return normalize_media(m.group(1))
    return str(info.get("media_interface_code") or "")


def read_sonic_state_db(path: str | os.PathLike[str], *, ts_ns: int | None = None
                        ) -> FleetHistory:
    """One reading per port with a ``TRANSCEIVER_DOM_SENSOR`` entry in a STATE_DB dump.

    ``device`` is the file's ``DEVICE_METADATA|localhost`` ``hostname`` when present, else the
    file stem; ``port`` the key suffix (``Ethernet0``). ``ts_ns`` is the sample time; when
    None, the file's modification time is used (a dump carries no sample time of its own).
    Ports with identity but no readings are warned about and get no rows.
    """
    p = os.fspath(path)
    warn = Warnings(p)
    try:
        with open(p, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        return history_from_modules([], [f"{p}: file: {exc.strerror}: skipped"])
    except json.JSONDecodeError as exc:
        return history_from_modules(
            [], [f"{p}:{exc.lineno}: json: {exc.msg}: not valid JSON: file skipped"])
    if not isinstance(data, dict):
        return history_from_modules([], [f"{p}:1: json: {type(data).__name__}: expected an "
                                         "object of STATE_DB keys: file skipped"])
    t = int(ts_ns) if ts_ns is not None else int(os.stat(p).st_mtime_ns)
    tables: dict[str, dict[str, Mapping[str, Any]]] = {tb: {} for tb in _TABLES}
    device = os.path.splitext(os.path.basename(p))[0]
    for key, val in data.items():
        if isinstance(val, dict) and "value" in val and "type" in val:
            val = val["value"]  # sonic-db-dump shape
        if not isinstance(key, str) or not isinstance(val, dict):
            continue
        if key == "DEVICE_METADATA|localhost" and val.get("hostname"):
            device = str(val["hostname"])
        table, sep, port = key.partition("|")
        if sep and table in tables:
            tables[table][port] = val
    parsed: list[ParsedModule] = []
    for port in sorted(tables["TRANSCEIVER_INFO"]):
        if port not in tables["TRANSCEIVER_DOM_SENSOR"]:
            warn.add(f"record TRANSCEIVER_INFO|{port}", "TRANSCEIVER_DOM_SENSOR", "(missing)",
                     "identity without readings: no rows")
    for port in _port_order(tables["TRANSCEIVER_DOM_SENSOR"]):
        dom = tables["TRANSCEIVER_DOM_SENSOR"][port]
        key = f"TRANSCEIVER_DOM_SENSOR|{port}"
        info = tables["TRANSCEIVER_INFO"].get(port, {})
        lanes: dict[str, dict[int, float]] = {"tx_bias_ma": {}, "tx_power_dbm": {},
                                              "rx_power_dbm": {}}
        for f, raw in dom.items():
            m = _LANE_RE.match(f)
            if not m:
                continue
            col = "tx_bias_ma" if m.group(3) == "bias" else f"{m.group(1)}_power_dbm"
            lanes[col][int(m.group(2))] = _value(raw, key, col, warn)
        n = max((max(d) for d in lanes.values() if d), default=0)
        per_lane = {}
        for col, d in lanes.items():
            if d and len(d) < n:
                miss = [k for k in range(1, n + 1) if k not in d]
                warn.add(f"record {key}", col, f"lanes {miss}", "missing: stored as NaN")
            per_lane[col] = tuple(d.get(k, math.nan) for k in range(1, n + 1))
        if n == 0:
            warn.add(f"record {key}", "lanes", "none", "no tx<N>bias / <N>power fields: no rows")
        th: dict[str, float] = {}
        tkey = f"TRANSCEIVER_DOM_THRESHOLD|{port}"
        for f, raw in tables["TRANSCEIVER_DOM_THRESHOLD"].get(port, {}).items():
            for pre, metric in _TH_FIELDS.items():
                kind = _TH_KINDS.get(f[len(pre):]) if f.startswith(pre) else None
                if kind:
                    v = _value(raw, tkey, f"{metric} threshold", warn)
                    if not math.isnan(v):
                        th[f"{metric}_{kind}"] = v
        th = check_threshold_sets(th, warn, f"record {tkey}")
        pm = tables["TRANSCEIVER_PM"].get(port, {})
        ber = (_value(pm["prefec_ber_avg"], f"TRANSCEIVER_PM|{port}", "prefec_ber_avg", warn)
               if "prefec_ber_avg" in pm else math.nan)
        temp = _value(dom["temperature"], key, "temperature", warn) if "temperature" in dom \
            else math.nan
        vcc = _value(dom["voltage"], key, "voltage", warn) if "voltage" in dom else math.nan
        ltemp = (_value(dom["laser_temperature"], key, "laser_temperature", warn)
                 if "laser_temperature" in dom else math.nan)
        parsed.append(ParsedModule(
            device=device, port=port, ts_ns=t, source=p, module_type=_mtype(info),
            identifier=str(info.get("type", "")), vendor=str(info.get("manufacturer", "")),
            part_number=str(info.get("model", "")), serial=str(info.get("serial", "")),
            media=_media(info), temperature_c=temp, vcc_v=vcc,
            tx_bias_ma=per_lane["tx_bias_ma"], tx_power_dbm=per_lane["tx_power_dbm"],
            rx_power_dbm=per_lane["rx_power_dbm"], laser_temp_c=ltemp, pre_fec_ber=ber,
            thresholds=th,
        ))
    return history_from_modules(parsed, warn.lines())


def _mtype(info: Mapping[str, Any]) -> str:
    if info.get("cmis_rev"):
        return "CMIS"
    t = str(info.get("type", "")).upper()
    if "QSFP-DD" in t or "OSFP" in t or "CMIS" in t:
        return "CMIS"
    if "QSFP" in t:
        return "SFF-8636"
    if "SFP" in t:
        return "SFF-8472"
    return "unknown"


def _port_order(d: Mapping[str, Any]) -> list[str]:
    def key(name: str) -> tuple[str, int]:
        m = re.match(r"^(.*?)(\d+)$", name)
        return (m.group(1), int(m.group(2))) if m else (name, -1)
    return sorted(d, key=key)
