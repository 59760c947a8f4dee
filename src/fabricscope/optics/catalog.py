"""Default alarm / warning thresholds per part class, for modules whose EEPROM gives none.

SFF-8472, SFF-8636 and CMIS 5.x define *where* a module stores its thresholds, not their
values: each vendor programs its own. When a module gives none (not programmed: all 0 or
-inf dBm), or gives a set that cannot be real (out of order), grading needs defaults. They are
kept per part class because operating ranges differ per media (../shared/reference/
OPERATIONS.md section 2: "defaults are per part").

How the values are chosen (each class row below):

* temperature: commercial-temperature modules (0..70 C case): warn 0 / 70, alarm -5 / 75;
  voltage 3.3 V +-5 % warn (3.135 / 3.465), +-10 % alarm (2.97 / 3.63) (OPERATIONS.md
  section 2; the same values appear in the real fixtures under tests/data/optics).
* optical power, dBm per lane: the warning band is the IEEE 802.3 (or MSA) transmitter
  average launch power range / receiver average power range of the media; alarms sit 3 dB
  outside it (the convention of the Mellanox 100G SR4 fixture: warn +2.4 / -8.4, alarm +5.4 /
  -11.4 dBm, which is exactly IEEE 802.3 clause 95 +-3 dB). QSFP28 generic receive values
  follow OPERATIONS.md section 2 (-13.5 / -9.5 / +2.4 / +3.4 dBm).
* bias, mA: VCSEL (multimode) parts 0.5 / 1.0 / 9.5 / 10 (OPERATIONS.md section 2 "0.5-10
  mA"; the SONiC mock QSFP28); single-mode DFB / EML parts 10 / 15 / 125 / 130 (the Arista
  400G XDR4 CMIS fixture).

The IEEE figures are transcribed from the clause tables named in each row (95 SR4, 88 LR4,
124 DR4/DR8, 151 FR4, 138 SR8, 52 10G, 112 25G-SR) and the 100G CWDM4 MSA; treat them as
typical defaults, not acceptance limits. A module's own thresholds always win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from fabricscope.optics.history import THRESHOLD_COLUMNS, ModuleTable

__all__ = [
    "PART_CLASSES",
    "PartClass",
    "catalog_filled",
    "default_thresholds",
    "fill_thresholds",
    "part_class",
]

_TEMP = (-5.0, 0.0, 70.0, 75.0)  # low_alarm, low_warn, high_warn, high_alarm
_VCC = (2.97, 3.135, 3.465, 3.63)
_BIAS_VCSEL = (0.5, 1.0, 9.5, 10.0)
_BIAS_SMF = (10.0, 15.0, 125.0, 130.0)


def _band(lo: float, hi: float, margin: float = 3.0) -> tuple[float, float, float, float]:
    return (lo - margin, lo, hi, hi + margin)


@dataclass(frozen=True)
class PartClass:
    """One media class: match words and the (low_alarm, low_warn, high_warn, high_alarm) sets."""

    name: str
    match: tuple[str, ...]
    source: str
    tx_power_dbm: tuple[float, float, float, float]
    rx_power_dbm: tuple[float, float, float, float]
    tx_bias_ma: tuple[float, float, float, float]
    temperature_c: tuple[float, float, float, float] = _TEMP
    vcc_v: tuple[float, float, float, float] = _VCC


#: Part classes, most specific first; ``match`` words are looked for in media and part number.
PART_CLASSES: tuple[PartClass, ...] = (
    PartClass("800G-2xFR4", ("2XFR4", "2FR4", "800GBASE-FR8", "800G-FR8"),
              "2 x IEEE 802.3 cl. 151 400GBASE-FR4 per lane", _band(-3.2, 3.5),
              _band(-7.2, 3.5), _BIAS_SMF),
    PartClass("800G-DR8", ("800GBASE-DR8", "DR8", "800G-DR"),
              "IEEE 802.3 cl. 124 (100 G/lane PAM4), 8 lanes", _band(-2.9, 4.0),
              _band(-5.9, 4.0), _BIAS_SMF),
    PartClass("400G-SR8", ("400GBASE-SR8", "SR8"), "IEEE 802.3 cl. 138 400GBASE-SR8",
              _band(-6.5, 4.0), _band(-9.5, 4.0), _BIAS_VCSEL),
    PartClass("400G-FR4", ("400GBASE-FR4", "FR4"), "IEEE 802.3 cl. 151 400GBASE-FR4",
              _band(-3.2, 3.5), _band(-7.2, 3.5), _BIAS_SMF),
    PartClass("400G-DR4", ("400GBASE-DR4", "DR4"), "IEEE 802.3 cl. 124 400GBASE-DR4",
              _band(-2.9, 4.0), _band(-5.9, 4.0), _BIAS_SMF),
    PartClass("100G-CWDM4", ("CWDM4",), "100G CWDM4 MSA rev 1.1", _band(-6.5, 2.5),
              _band(-11.5, 2.5), _BIAS_SMF),
    PartClass("100G-LR4", ("100GBASE-LR4", "LR4"), "IEEE 802.3 cl. 88 100GBASE-LR4",
              _band(-4.3, 4.5), _band(-10.6, 4.5), _BIAS_SMF),
    PartClass("100G-SR4", ("100GBASE-SR4", "SR4"), "IEEE 802.3 cl. 95 100GBASE-SR4",
              _band(-8.4, 2.4), _band(-10.3, 2.4), _BIAS_VCSEL),
    PartClass("25G-SR", ("25GBASE-SR",), "IEEE 802.3 cl. 112 25GBASE-SR",
              _band(-8.4, 2.4), _band(-10.3, 2.4), _BIAS_VCSEL),
    PartClass("10G-LR", ("10GBASE-LR",), "IEEE 802.3 cl. 52 10GBASE-LR",
              _band(-8.2, 0.5), _band(-14.4, 0.5), _BIAS_SMF),
    PartClass("10G-SR", ("10GBASE-SR",), "IEEE 802.3 cl. 52 10GBASE-SR",
              _band(-7.3, -1.0), _band(-9.9, -1.0), _BIAS_VCSEL),
)
#: Used when nothing matches: OPERATIONS.md section 2 typical QSFP28 values.
GENERIC = PartClass("generic", (), "OPERATIONS.md section 2 (typical QSFP28)",
                    _band(-8.4, 2.4), (-13.5, -9.5, 2.4, 3.4), _BIAS_VCSEL)

_KINDS = ("low_alarm", "low_warn", "high_warn", "high_alarm")
_METRICS = ("temperature_c", "vcc_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm")


def part_class(media: str, part_number: str = "", vendor: str = "") -> PartClass:
    """The :class:`PartClass` whose match words occur in ``media`` (then ``part_number``).

    ``vendor`` is accepted for per-vendor overrides; none are shipped (no public per-vendor
    table to cite), so it does not change the result today.
    """
    del vendor
    for text in (media.upper().replace(" ", ""), part_number.upper()):
        if not text:
            continue
        for pc in PART_CLASSES:
            if any(w in text for w in pc.match):
                return pc
    return GENERIC


def default_thresholds(media: str, part_number: str = "", vendor: str = "") -> dict[str, float]:
    """The 20 threshold columns (``<metric>_<kind>``) for a part, from :func:`part_class`."""
    pc = part_class(media, part_number, vendor)
    out: dict[str, float] = {}
    for m in _METRICS:
        vals = getattr(pc, m)
        for k, v in zip(_KINDS, vals, strict=True):
            out[f"{m}_{k}"] = float(v)
    assert set(out) == set(THRESHOLD_COLUMNS)
    return out


def fill_thresholds(modules: ModuleTable) -> ModuleTable:
    """A copy of ``modules`` with every NaN threshold filled from :func:`default_thresholds`.

    Which values came from the catalog is recorded in the returned table's ``thresholds``
    mapping under ``catalog:<column>`` (float64 1.0 = from the catalog, 0.0 = the module's
    own); :func:`catalog_filled` reads it back as booleans. Consumers that iterate
    :data:`THRESHOLD_COLUMNS` are unaffected by those extra keys.
    """
    n = len(modules)
    th = {c: np.array(modules.thresholds.get(c, np.full(n, np.nan)), dtype=np.float64)
          for c in THRESHOLD_COLUMNS}
    filled = {c: np.zeros(n, dtype=np.float64) for c in THRESHOLD_COLUMNS}
    cache: dict[tuple[str, str, str], dict[str, float]] = {}
    for i in range(n):
        need = [c for c in THRESHOLD_COLUMNS if math.isnan(th[c][i])]
        if not need:
            continue
        key = (modules.media[i], modules.part_number[i], modules.vendor[i])
        d = cache.get(key)
        if d is None:
            d = cache[key] = default_thresholds(*key)
        for c in need:
            th[c][i] = d[c]
            filled[c][i] = 1.0
    out: dict[str, npt.NDArray[np.float64]] = dict(th)
    out.update({f"catalog:{c}": v for c, v in filled.items()})
    return replace(modules, thresholds=out)


def catalog_filled(modules: ModuleTable) -> dict[str, npt.NDArray[np.bool_]]:
    """Per threshold column, which modules got the value from the catalog (all False if none)."""
    n = len(modules)
    return {c: np.asarray(modules.thresholds.get(f"catalog:{c}", np.zeros(n)), dtype=bool)
            for c in THRESHOLD_COLUMNS}
