"""Parse ``ethtool -m`` (text and ``--json``) output of SFF-8472, SFF-8636 and CMIS modules.

Text form: ethtool prints one ``%-41s : value`` line per field (``sfpdiag.c`` for SFF-8472
SFP/SFP+, ``qsfp.c`` for SFF-8636 QSFP+/QSFP28, ``cmis.c`` for CMIS 4.x/5.x QSFP-DD/OSFP;
``sff-common.h`` formats: power ``%.4f mW / %.2f dBm``, bias ``%.3f mA``, temperature
``%.2f degrees C / %.2f degrees F``, voltage ``%.4f V``). Per-lane fields carry
``(Channel N)`` / ``(Chan N)``, 1-based (some vendor CLIs print 0-based channels; a channel 0
makes the numbering 0-based). The dBm figure is preferred over the mW one; ``-inf dBm`` /
``0.0000 mW`` means no light and is stored as NaN with a warning. Lines without ``:`` continue
the previous value (mail clients wrap long lines; the CMIS fixture is such a paste).

JSON form (``ethtool --json -m``, ethtool 6.14+, the module-info JSON series by D. Ratson,
netdev, Feb 2025): keys are the text labels lower-cased with ``_`` for spaces; per-lane values
are arrays in mW / mA; received power is ``rx_power.values``; thresholds are objects
``laser_bias_current``, ``laser_output_power``, ``module_temperature``, ``module_voltage``,
``laser_rx_power`` with ``high_alarm_threshold`` ... (note that ``module_temperature`` appears
twice in one object, the reading then the threshold object: duplicate keys are kept apart).
SFF-8472 JSON keys (``laser_bias_current`` as a number, ``laser_output_power``,
``receiver_signal_average_optical_power``) are derived from ethtool's label-to-key rule; no
public SFF-8472 JSON sample was found to check them.

File names ``<device>__<port>.txt`` / ``.json`` name the module; a header line
``# device=<d> port=<p> [ts=<ns or ISO-8601>]`` at the top overrides them. Bad input never
raises: it gives ``FILE:LINE: field: value: what was done`` warnings and the rest is kept.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from fabricscope.optics.history import (
    ALL_METRICS,
    THRESHOLD_COLUMNS,
    FleetHistory,
    module_table,
    sort_rows,
)

__all__ = [
    "ParsedModule",
    "module_type_of",
    "normalize_media",
    "parse_ethtool_json",
    "parse_ethtool_module",
    "read_ethtool_files",
]

#: Values that mean "no reading" in every source (ethtool, SONiC STATE_DB, CSV).
MISSING_TOKENS = frozenset({"n/a", "na", "none", "null", "", "-", "unknown"})


@dataclass(frozen=True)
class ParsedModule:
    """One transceiver reading at one time, as a reader found it (nothing invented).

    ``tx_bias_ma[k]``, ``tx_power_dbm[k]``, ``rx_power_dbm[k]`` are lane ``k`` (0-based); NaN
    where the source gave no usable value. ``thresholds`` holds only the threshold columns
    (:data:`fabricscope.optics.history.THRESHOLD_COLUMNS`) the source printed and that passed
    the sanity checks. ``module_type`` is ``"SFF-8472"``, ``"SFF-8636"``, ``"CMIS"`` or
    ``"unknown"``.
    """

    device: str
    port: str
    ts_ns: int
    source: str
    module_type: str
    identifier: str
    vendor: str
    part_number: str
    serial: str
    media: str
    temperature_c: float
    vcc_v: float
    tx_bias_ma: tuple[float, ...]
    tx_power_dbm: tuple[float, ...]
    rx_power_dbm: tuple[float, ...]
    laser_temp_c: float = math.nan
    pre_fec_ber: float = math.nan
    thresholds: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def lanes(self) -> int:
        """Number of lanes the source reported."""
        return max(len(self.tx_bias_ma), len(self.tx_power_dbm), len(self.rx_power_dbm))


class Warnings:
    """Collects ``SOURCE:POSITION: field: value: what was done`` lines, grouping repeats.

    The same (field, value, action) seen at several positions of one source is reported once
    with a count, so an 8-lane module with four dark lanes gives one line, not four.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._order: list[tuple[str, str, str]] = []
        self._first: dict[tuple[str, str, str], str] = {}
        self._count: dict[tuple[str, str, str], int] = {}

    def add(self, position: str | int, fld: str, value: object, action: str) -> None:
        key = (fld, str(value), action)
        if key not in self._first:
            self._order.append(key)
            self._first[key] = str(position)
            self._count[key] = 0
        self._count[key] += 1

    def lines(self) -> tuple[str, ...]:
        out = []
        for key in self._order:
            fld, value, action = key
            n = self._count[key]
            more = f" (and {n - 1} more)" if n > 1 else ""
            out.append(f"{self.source}:{self._first[key]}: {fld}: {value}: {action}{more}")
        return tuple(out)


def check_threshold_sets(
    th: dict[str, float], warn: Warnings, position: str | int
) -> dict[str, float]:
    """Drop threshold sets that cannot be real: all four equal, or out of order.

    A module that never programmed its thresholds reads 0 (or -inf dBm) for all of them, and
    some firmware returns garbage (the bnxt fixture: bias high alarm 15.4 mA below its high
    warning 36.0 mA). SFF-8472 / SFF-8636 / CMIS all require low alarm <= low warning <=
    high warning <= high alarm; a set that breaks it is dropped whole (the catalog fills it).
    """
    out = dict(th)
    metrics = sorted({c.rsplit("_", 2)[0] for c in th})
    for m in metrics:
        cols = [f"{m}_low_alarm", f"{m}_low_warn", f"{m}_high_warn", f"{m}_high_alarm"]
        vals = [th.get(c, math.nan) for c in cols]
        present = [v for v in vals if not math.isnan(v)]
        if len(present) >= 2 and max(present) == min(present):
            warn.add(position, f"{m} thresholds", f"all {present[0]:g}",
                     "not programmed by the module: ignored (catalog default used)")
            for c in cols:
                out.pop(c, None)
            continue
        if len(present) == 4 and not (vals[0] <= vals[1] <= vals[2] <= vals[3]):
            shown = "/".join(f"{v:g}" for v in vals)
            warn.add(position, f"{m} thresholds", f"low_alarm/low_warn/high_warn/high_alarm "
                     f"= {shown}", "out of order: ignored (catalog default used)")
            for c in cols:
                out.pop(c, None)
    return out


def history_from_modules(
    parsed: Sequence[ParsedModule], extra_warnings: Sequence[str] = ()
) -> FleetHistory:
    """Build a :class:`FleetHistory` (one row per module lane per reading) from parsed modules.

    Readings of the same ``device``/``port`` at several times become one module; its identity
    and thresholds are taken from the first reading, and a later reading with another serial
    is warned about (a module swap: grading should treat it as a new part).
    """
    warnings: list[str] = list(extra_warnings)
    index: dict[tuple[str, str], int] = {}
    rows: list[dict[str, object]] = []
    lanes: list[int] = []
    n_rows = sum(p.lanes for p in parsed)
    ts = np.empty(n_rows, dtype=np.int64)
    module = np.empty(n_rows, dtype=np.int32)
    lane = np.empty(n_rows, dtype=np.int32)
    metrics = {m: np.full(n_rows, np.nan, dtype=np.float32) for m in ALL_METRICS}
    r = 0
    for p in parsed:
        warnings.extend(p.warnings)
        key = (p.device, p.port)
        i = index.get(key)
        if i is None:
            i = len(rows)
            index[key] = i
            row: dict[str, object] = {
                "device": p.device, "port": p.port, "vendor": p.vendor,
                "part_number": p.part_number, "serial": p.serial, "media": p.media,
            }
            row.update({c: v for c, v in p.thresholds.items() if c in THRESHOLD_COLUMNS})
            rows.append(row)
            lanes.append(p.lanes)
        else:
            lanes[i] = max(lanes[i], p.lanes)
            first_serial = rows[i]["serial"]
            if p.serial and first_serial and p.serial != first_serial:
                warnings.append(
                    f"{p.source}: serial: {p.serial}: differs from {first_serial} seen earlier "
                    f"at {p.device}:{p.port}: kept the first identity (module replaced?)")
        n = p.lanes
        sl = slice(r, r + n)
        ts[sl] = p.ts_ns
        module[sl] = i
        lane[sl] = np.arange(n, dtype=np.int32)
        for name, vals in (("tx_bias_ma", p.tx_bias_ma), ("tx_power_dbm", p.tx_power_dbm),
                           ("rx_power_dbm", p.rx_power_dbm)):
            metrics[name][r:r + len(vals)] = vals
        metrics["temperature_c"][sl] = p.temperature_c
        metrics["vcc_v"][sl] = p.vcc_v
        metrics["laser_temp_c"][sl] = p.laser_temp_c
        metrics["pre_fec_ber"][sl] = p.pre_fec_ber
        r += n
    s_ts, s_mod, s_lane, s_met = sort_rows(ts, module, lane, metrics)
    return FleetHistory(
        ts=s_ts, module=s_mod, lane=s_lane, metrics=s_met,
        modules=module_table(rows, lanes=lanes), warnings=tuple(warnings),
    )


# --- module type (SFF-8024 identifier codes) ------------------------------------------------

_SFF8472_IDS = {0x02, 0x03}
_SFF8636_IDS = {0x0C, 0x0D, 0x11}
_CMIS_IDS = {0x18, 0x19, 0x1B, 0x1E, 0x1F, 0x20}


def module_type_of(identifier: str) -> str:
    """``SFF-8472`` / ``SFF-8636`` / ``CMIS`` / ``unknown`` from an ethtool identifier string.

    Uses the SFF-8024 identifier code (``0x03 (SFP)``, ``0x11 (QSFP28)``, ``0x18 (QSFP-DD...)``),
    falling back to the description words when no code is printed.
    """
    m = re.match(r"\s*0x([0-9a-fA-F]{1,2})", identifier)
    if m:
        code = int(m.group(1), 16)
        if code in _SFF8472_IDS:
            return "SFF-8472"
        if code in _SFF8636_IDS:
            return "SFF-8636"
        if code in _CMIS_IDS:
            return "CMIS"
        return "unknown"
    up = identifier.upper()
    if "QSFP-DD" in up or "OSFP" in up or "CMIS" in up:
        return "CMIS"
    if "QSFP" in up:
        return "SFF-8636"
    if "SFP" in up:
        return "SFF-8472"
    return "unknown"


_MEDIA_RE = re.compile(r"(\d{2,3})G\s*BASE-?\s*([A-Z]+\d*)", re.IGNORECASE)


def normalize_media(text: str) -> str:
    """``100G Ethernet: 100G Base-SR4 or 25GBase-SR`` -> ``100GBASE-SR4``; else the text as is."""
    m = _MEDIA_RE.search(text)
    if m:
        return f"{m.group(1)}GBASE-{m.group(2).upper()}"
    return text.strip()


# --- value parsing ----------------------------------------------------------------------------

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan)"
_POWER_RE = re.compile(rf"{_NUM}\s*mW\s*/\s*{_NUM}\s*dBm", re.IGNORECASE)
_DBM_RE = re.compile(rf"{_NUM}\s*dBm", re.IGNORECASE)
_MW_RE = re.compile(rf"{_NUM}\s*mW", re.IGNORECASE)
_TEMP_RE = re.compile(rf"{_NUM}\s*degrees\s*C", re.IGNORECASE)
_UNIT_RE = {"mA": re.compile(rf"{_NUM}\s*mA"), "V": re.compile(rf"{_NUM}\s*V\b")}
_CHAN_RE = re.compile(r"\(\s*(?:Channel|Chan|Ch)\s*(\d+)\s*\)", re.IGNORECASE)
_LINE_RE = re.compile(r"^\s*(\S.*?)\s*:(?:\s(.*))?$")


def mw_to_dbm(mw: float) -> float:
    """10 log10(mW); NaN for 0 or negative (no light)."""
    if not mw > 0:
        return math.nan
    return 10.0 * math.log10(mw)


def _power(value: str, fld: str, pos: str | int, warn: Warnings) -> float:
    m = _POWER_RE.search(value)
    if m:
        mw, dbm = float(m.group(1)), float(m.group(2))
        if math.isfinite(dbm) and mw > 0:
            return dbm
        warn.add(pos, fld, value.strip(), "no light (0 mW / -inf dBm): stored as NaN")
        return math.nan
    m = _DBM_RE.search(value)
    if m:
        dbm = float(m.group(1))
        if math.isfinite(dbm):
            return dbm
        warn.add(pos, fld, value.strip(), "no light (-inf dBm): stored as NaN")
        return math.nan
    m = _MW_RE.search(value)
    if m:
        dbm = mw_to_dbm(float(m.group(1)))
        if math.isnan(dbm):
            warn.add(pos, fld, value.strip(), "no light (0 mW): stored as NaN")
        return dbm
    warn.add(pos, fld, value.strip() or "(empty)", "not a power reading: stored as NaN")
    return math.nan


def _scalar(value: str, rx: re.Pattern[str], fld: str, pos: str | int, warn: Warnings) -> float:
    m = rx.search(value)
    if m:
        v = float(m.group(1))
        if math.isfinite(v):
            return v
    warn.add(pos, fld, value.strip() or "(empty)", "not a number: stored as NaN")
    return math.nan


# --- label -> history column ----------------------------------------------------------------

_KIND = {"high alarm": "high_alarm", "low alarm": "low_alarm",
         "high warning": "high_warn", "low warning": "low_warn"}
_TH_METRIC = {
    "laser bias current": "tx_bias_ma",
    "laser output power": "tx_power_dbm",
    "laser tx power": "tx_power_dbm",
    "module temperature": "temperature_c",
    "module voltage": "vcc_v",
    "laser rx power": "rx_power_dbm",
}
_TH_RE = re.compile(
    r"^(laser bias current|laser output power|laser tx power|module temperature|module voltage"
    r"|laser rx power) (high alarm|low alarm|high warning|low warning) threshold$")
# lane metrics: label (channel removed, lower case, spaces collapsed) -> column
_LANE_FIELDS = {
    "laser bias current": "tx_bias_ma",
    "laser tx bias current": "tx_bias_ma",
    "laser output power": "tx_power_dbm",
    "transmit avg optical power": "tx_power_dbm",
    "receiver signal average optical power": "rx_power_dbm",
    "receiver signal oma": "rx_power_dbm",
    "rcvr signal avg optical power": "rx_power_dbm",
    "rcvr signal oma": "rx_power_dbm",
    "receiver signal avg optical power": "rx_power_dbm",
}


def _norm_label(label: str) -> tuple[str, int | None]:
    ch = None
    m = _CHAN_RE.search(label)
    if m:
        ch = int(m.group(1))
        label = label[: m.start()] + label[m.end():]
    return " ".join(label.lower().split()), ch


@dataclass
class _Lines:
    fields: list[tuple[int, str, str]] = field(default_factory=list)  # (line, label, value)
    header: dict[str, str] = field(default_factory=dict)


def _split_lines(text: str, warn: Warnings) -> _Lines:
    out = _Lines()
    lines = text.splitlines()
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        s = raw.strip()
        if s.startswith("#"):
            if not out.fields:
                for tok in s.lstrip("#").split():
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        out.header[k.strip().lower()] = v.strip()
            continue
        m = _LINE_RE.match(raw)
        if m and not (out.fields and raw[:1] not in " \t" and _looks_continuation(s)):
            out.fields.append((i, m.group(1), (m.group(2) or "").strip()))
        elif out.fields:
            ln, label, value = out.fields[-1]
            out.fields[-1] = (ln, label, f"{value} {s}".strip())
        else:
            warn.add(i, "line", s[:60], "not a 'field : value' line: skipped")
    if text and not text.endswith("\n") and out.fields:
        ln, label, value = out.fields[-1]
        if ":" not in lines[-1]:
            warn.add(ln, label, value, "output ends mid-line (truncated?): kept as read")
    return out


def _looks_continuation(s: str) -> bool:
    # "degrees F" or "Transceiver (INF-8628))" wrapped by a mail client: no ' : ' separator
    return " : " not in s and not s.rstrip().endswith(":")


def parse_ethtool_module(
    text: str, *, device: str, port: str, ts_ns: int, source: str
) -> ParsedModule:
    """Parse one ``ethtool -m`` text output (SFF-8472, SFF-8636 or CMIS) into a record.

    Reads identity (``Vendor name`` / ``PN`` / ``SN``, ``Transceiver type`` as media),
    module temperature and voltage, per-lane bias, Tx and Rx power (dBm preferred), laser
    temperature where printed, and the 20 alarm / warning thresholds. Nothing is invented: a
    field the output lacks is NaN / ``""``. Problems (unknown module type, ``N/A``, a lane
    missing a metric, no light, truncated output, threshold sets that cannot be real) are
    returned in ``warnings`` as ``SOURCE:LINE: field: value: what was done``.
    """
    warn = Warnings(source)
    lines = _split_lines(text, warn)
    ident = vendor = pn = sn = media = ""
    ident_line = 0
    temp = vcc = laser_temp = math.nan
    lane_vals: dict[str, dict[int, float]] = {c: {} for c in
                                              ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm")}
    lane_line: dict[str, dict[int, int]] = {c: {} for c in lane_vals}
    th: dict[str, float] = {}
    first_th_line = 0
    flags_implemented = False
    saw_dom = False
    for ln, label, value in lines.fields:
        key, ch = _norm_label(label)
        low = value.strip().lower()
        if key == "identifier":
            ident, ident_line = value, ln
            continue
        if key == "vendor name":
            vendor = value
        elif key == "vendor pn":
            pn = value
        elif key == "vendor sn":
            sn = value
        elif key == "transceiver type" and not media:
            # SFF-8472 / SFF-8636 print several; the Ethernet compliance one names the media
            if "ethernet" in low or "base" in low:
                media = normalize_media(value)
        elif key == "alarm/warning flags implemented":
            flags_implemented = low.startswith("yes")
        elif key in ("module temperature", "laser temperature"):
            saw_dom = True
            if low in MISSING_TOKENS:
                warn.add(ln, label, value or "(empty)", "no reading: stored as NaN")
                continue
            v = _scalar(value, _TEMP_RE, label, ln, warn)
            if key == "module temperature":
                temp = v
            else:
                laser_temp = v
        elif key == "module voltage":
            saw_dom = True
            if low in MISSING_TOKENS:
                warn.add(ln, label, value or "(empty)", "no reading: stored as NaN")
                continue
            vcc = _scalar(value, _UNIT_RE["V"], label, ln, warn)
        elif key in _LANE_FIELDS:
            saw_dom = True
            col = _LANE_FIELDS[key]
            c = 1 if ch is None else ch
            if low in MISSING_TOKENS:
                warn.add(ln, label, value or "(empty)", "no reading: stored as NaN")
                v = math.nan
            elif col == "tx_bias_ma":
                v = _scalar(value, _UNIT_RE["mA"], label, ln, warn)
            else:
                v = _power(value, col, ln, warn)
            lane_vals[col][c] = v
            lane_line[col][c] = ln
        else:
            m = _TH_RE.match(key)
            if m:
                first_th_line = first_th_line or ln
                metric = _TH_METRIC[m.group(1)]
                col = f"{metric}_{_KIND[m.group(2)]}"
                if low in MISSING_TOKENS:
                    warn.add(ln, f"{metric} threshold", value or "(empty)",
                             "no threshold: left NaN")
                    continue
                if metric in ("tx_power_dbm", "rx_power_dbm"):
                    v = _threshold_power(value, f"{metric} threshold", ln, warn)
                elif metric == "tx_bias_ma":
                    v = _scalar(value, _UNIT_RE["mA"], label, ln, warn)
                elif metric == "vcc_v":
                    v = _scalar(value, _UNIT_RE["V"], label, ln, warn)
                else:
                    v = _scalar(value, _TEMP_RE, label, ln, warn)
                if not math.isnan(v):
                    th[col] = v
    mtype = module_type_of(ident) if ident else "unknown"
    if not ident:
        warn.add(1, "Identifier", "(missing)", "module type unknown: fields read by label")
    elif mtype == "unknown":
        warn.add(ident_line, "Identifier", ident, "unknown module type: fields read by label")
    # channel numbering: 1-based unless a channel 0 is printed
    chans = {c for d in lane_vals.values() for c in d}
    base = 0 if 0 in chans else 1
    n = (max(chans) - base + 1) if chans else 0
    per_lane: dict[str, tuple[float, ...]] = {}
    for col, d in lane_vals.items():
        vals = [d.get(k + base, math.nan) for k in range(n)]
        if d:
            for k in range(n):
                if (k + base) not in d:
                    last = max(lane_line[col].values())
                    warn.add(last, col, f"lane {k}", "missing from the output: stored as NaN")
        per_lane[col] = tuple(vals)
    if saw_dom and n == 0:
        warn.add(ident_line or 1, "lanes", "none", "no per-lane bias / power lines: no rows")
    if not saw_dom:
        warn.add(ident_line or 1, "diagnostics", "(none printed)",
                 "module has no DOM readings (copper cable or no diagnostics): no rows")
        per_lane = {col: () for col in per_lane}
    if flags_implemented and saw_dom and not th and first_th_line == 0:
        last = lines.fields[-1][0] if lines.fields else 1
        warn.add(last, "thresholds", "(none printed)",
                 "expected after 'Alarm/warning flags implemented: Yes' (truncated output?)")
    th = check_threshold_sets(th, warn, first_th_line or 1)
    return ParsedModule(
        device=device, port=port, ts_ns=int(ts_ns), source=source, module_type=mtype,
        identifier=ident, vendor=vendor, part_number=pn, serial=sn, media=media,
        temperature_c=temp, vcc_v=vcc, tx_bias_ma=per_lane["tx_bias_ma"],
        tx_power_dbm=per_lane["tx_power_dbm"], rx_power_dbm=per_lane["rx_power_dbm"],
        laser_temp_c=laser_temp, thresholds=th, warnings=warn.lines(),
    )


def _threshold_power(value: str, label: str, ln: int, warn: Warnings) -> float:
    m = _POWER_RE.search(value)
    if m:
        mw, dbm = float(m.group(1)), float(m.group(2))
        if math.isfinite(dbm) and mw > 0:
            return dbm
        warn.add(ln, label, value, "0 mW / -inf dBm (not programmed): left NaN")
        return math.nan
    m = _DBM_RE.search(value)
    if m and math.isfinite(float(m.group(1))):
        return float(m.group(1))
    m = _MW_RE.search(value)
    if m and float(m.group(1)) > 0:
        return mw_to_dbm(float(m.group(1)))
    warn.add(ln, label, value or "(empty)", "not a power threshold: left NaN")
    return math.nan


# --- JSON -------------------------------------------------------------------------------------

_JSON_TH_OBJECTS = {
    "laser_bias_current": "tx_bias_ma",
    "laser_output_power": "tx_power_dbm",
    "module_temperature": "temperature_c",
    "module_voltage": "vcc_v",
    "laser_rx_power": "rx_power_dbm",
}
_JSON_TH_KEYS = {"high_alarm_threshold": "high_alarm", "low_alarm_threshold": "low_alarm",
                 "high_warning_threshold": "high_warn", "low_warning_threshold": "low_warn"}


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # ethtool emits "module_temperature" twice (reading, then threshold object): keep both
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            if isinstance(v, dict) and not isinstance(out[k], dict):
                out[f"{k}#thresholds"] = v
                continue
            if isinstance(out[k], dict) and not isinstance(v, dict):
                out[f"{k}#thresholds"] = out[k]
                out[k] = v
                continue
            if isinstance(out[k], str) and isinstance(v, str):
                out[k] = f"{out[k]}; {v}"
                continue
        out[k] = v
    return out


def _num(v: Any) -> float:
    if isinstance(v, bool) or v is None:
        return math.nan
    if isinstance(v, int | float):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return math.nan


def parse_ethtool_json(
    text: str, *, device: str, port: str, ts_ns: int, source: str
) -> list[ParsedModule]:
    """Parse ``ethtool --json -m`` output (a JSON array, one object per module) into records.

    Powers come in mW (converted to dBm; 0 mW -> NaN with a warning), bias in mA, temperature
    in degrees C, voltage in V. Positions in warnings are ``record N``.
    """
    warn = Warnings(source)
    try:
        data = json.loads(text, object_pairs_hook=_pairs_hook)
    except json.JSONDecodeError as exc:
        warn.add(f"{exc.lineno}:{exc.colno}", "json", exc.msg, "not valid JSON: file skipped")
        return [_empty(device, port, ts_ns, source, warn)]
    objs = data if isinstance(data, list) else [data]
    out = []
    for rec_no, obj in enumerate(objs, start=1):
        w = Warnings(source)
        pos = f"record {rec_no}"
        if not isinstance(obj, dict):
            w.add(pos, "record", type(obj).__name__, "not an object: skipped")
            out.append(_empty(device, port, ts_ns, source, w))
            continue
        out.append(_json_module(obj, device=device, port=port, ts_ns=ts_ns, source=source,
                                warn=w, pos=pos))
    return out


def _json_lane(obj: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, list[Any]] | None:
    for k in keys:
        v = obj.get(k)
        if isinstance(v, dict) and "values" in v:
            v = v["values"]
        if isinstance(v, list):
            return k, v
        if isinstance(v, int | float) and not isinstance(v, bool):
            return k, [v]
    return None


def _json_module(
    obj: Mapping[str, Any], *, device: str, port: str, ts_ns: int, source: str,
    warn: Warnings, pos: str,
) -> ParsedModule:
    code = obj.get("identifier")
    desc = str(obj.get("identifier_description", ""))
    ident = f"0x{int(code):02x} ({desc})" if isinstance(code, int) else desc
    mtype = module_type_of(ident) if ident else "unknown"
    if mtype == "unknown":
        warn.add(pos, "identifier", ident or "(missing)", "unknown module type: read by key")
    ttype = obj.get("transceiver_type")
    media = normalize_media(str(ttype)) if isinstance(ttype, str) else ""
    temp = _num(obj.get("module_temperature"))
    vcc = _num(obj.get("module_voltage"))
    lanes: dict[str, tuple[float, ...]] = {}
    specs = {
        "tx_bias_ma": ("laser_tx_bias_current", "laser_bias_current"),
        "tx_power_dbm": ("transmit_avg_optical_power", "laser_output_power"),
        "rx_power_dbm": ("rx_power", "rcvr_signal_avg_optical_power",
                         "receiver_signal_average_optical_power", "receiver_signal_oma"),
    }
    for col, keys in specs.items():
        found = _json_lane(obj, keys)
        if found is None:
            lanes[col] = ()
            continue
        k, vals = found
        conv = []
        for lane_no, v in enumerate(vals):
            x = _num(v)
            if col != "tx_bias_ma":
                if x == 0.0:
                    warn.add(f"{pos} {k}[{lane_no}]", col, v, "no light (0 mW): stored as NaN")
                x = mw_to_dbm(x) if not math.isnan(x) else x
            elif math.isnan(x):
                warn.add(f"{pos} {k}[{lane_no}]", col, v, "not a number: stored as NaN")
            conv.append(x)
        lanes[col] = tuple(conv)
    n = max((len(v) for v in lanes.values()), default=0)
    for col, have in list(lanes.items()):
        if have and len(have) < n:
            warn.add(pos, col, f"{len(have)} of {n} lanes", "missing lanes stored as NaN")
            lanes[col] = have + (math.nan,) * (n - len(have))
        elif not have and n:
            lanes[col] = (math.nan,) * n
    th: dict[str, float] = {}
    for key, metric in _JSON_TH_OBJECTS.items():
        o = obj.get(f"{key}#thresholds", obj.get(key))
        if not isinstance(o, dict):
            continue
        for jk, kind in _JSON_TH_KEYS.items():
            if jk not in o:
                continue
            x = _num(o[jk])
            if metric in ("tx_power_dbm", "rx_power_dbm"):
                if not x > 0:
                    warn.add(f"{pos} {key}.{jk}", f"{metric}_{kind}", o[jk],
                             "0 mW (not programmed): left NaN")
                    continue
                x = mw_to_dbm(x)
            if not math.isnan(x):
                th[f"{metric}_{kind}"] = x
    th = check_threshold_sets(th, warn, pos)
    if n == 0:
        warn.add(pos, "lanes", "none", "no per-lane bias / power values: no rows")
    return ParsedModule(
        device=device, port=port, ts_ns=int(ts_ns), source=source, module_type=mtype,
        identifier=ident, vendor=str(obj.get("vendor_name", "") or ""),
        part_number=str(obj.get("vendor_pn", "") or ""),
        serial=str(obj.get("vendor_sn", "") or ""), media=media, temperature_c=temp,
        vcc_v=vcc, tx_bias_ma=lanes["tx_bias_ma"], tx_power_dbm=lanes["tx_power_dbm"],
        rx_power_dbm=lanes["rx_power_dbm"], thresholds=th, warnings=warn.lines(),
    )


def _empty(device: str, port: str, ts_ns: int, source: str, warn: Warnings) -> ParsedModule:
    return ParsedModule(device=device, port=port, ts_ns=int(ts_ns), source=source,
                        module_type="unknown", identifier="", vendor="", part_number="",
                        serial="", media="", temperature_c=math.nan, vcc_v=math.nan,
                        tx_bias_ma=(), tx_power_dbm=(), rx_power_dbm=(),
                        warnings=warn.lines())


# --- files ------------------------------------------------------------------------------------


def parse_ts(value: str) -> int:
    """An int of ns since the epoch, or an ISO-8601 time (``Z`` / offset; naive = UTC)."""
    s = value.strip()
    if re.fullmatch(r"[-+]?\d+", s):
        return int(s)
    dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _names_from_path(path: str) -> tuple[str, str] | None:
    stem = os.path.basename(path)
    for suf in (".txt", ".json", ".out", ".log"):
        if stem.endswith(suf):
            stem = stem[: -len(suf)]
            break
    if "__" in stem:
        dev, prt = stem.split("__", 1)
        if dev and prt:
            return dev, prt
    return None


def read_ethtool_files(paths: Iterable[str | os.PathLike[str]], *, ts_ns: int) -> FleetHistory:
    """Read ``ethtool -m`` outputs (text, or JSON when the file starts with ``[`` / ``{``).

    ``device`` / ``port`` come from a ``# device=.. port=..`` header line, else the file name
    ``<device>__<port>.txt``; failing both, ``device`` is ``""`` and ``port`` the file stem
    (warned). ``ts_ns`` is the sample time of every file without its own ``ts=`` header.
    A file that cannot be read is warned about and skipped.
    """
    parsed: list[ParsedModule] = []
    extra: list[str] = []
    for p in paths:
        path = os.fspath(p)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            extra.append(f"{path}: file: {exc.strerror}: skipped")
            continue
        header: dict[str, str] = {}
        for line in text.splitlines()[:5]:
            s = line.strip()
            if s.startswith("#"):
                for tok in s.lstrip("#").split():
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        header[k.lower()] = v
            elif s:
                break
        names = _names_from_path(path)
        device = header.get("device", names[0] if names else "")
        port = header.get("port", names[1] if names else "")
        if not port:
            port = os.path.splitext(os.path.basename(path))[0]
            extra.append(f"{path}:1: device/port: (none): no '# device=.. port=..' header and "
                         f"no <device>__<port> file name: device '' port '{port}' used")
        t = ts_ns
        if "ts" in header:
            try:
                t = parse_ts(header["ts"])
            except ValueError:
                extra.append(f"{path}:1: ts: {header['ts']}: not ns or ISO-8601: {ts_ns} used")
        body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        if body.lstrip()[:1] in ("[", "{"):
            parsed.extend(parse_ethtool_json(body, device=device, port=port, ts_ns=t,
                                             source=path))
        else:
            parsed.append(parse_ethtool_module(text, device=device, port=port, ts_ns=t,
                                               source=path))
    return history_from_modules(parsed, extra)

