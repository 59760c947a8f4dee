"""A seeded synthetic fleet of optical transceivers with degradation modes, nuisances and truth.

The generator writes the optics history table (:mod:`fabricscope.optics.history`) of a fleet of
modules cabled in pairs (every link has two ends on two switches), with the failures a
benchmark scores predictions against. Physics of each mode (docs/design/optics-fleet.md):

* every laser sits in an automatic-power-control (APC) loop: the bias is the threshold current
  plus what the set power needs, ``I = I_th(T) + P_set / eta``, and the threshold current follows
  temperature, ``I_th(T) = I_th0 exp((T - T_ref) / T_0)`` (characteristic temperature ``T_0``:
  Coldren, Corzine & Mashanovitch, *Diode Lasers and Photonic Integrated Circuits*, ch. 2), so
  bias follows the room's diurnal cycle and tx power drifts a little with temperature;
* ``aging-laser``: the threshold current grows as a power law in time (Telcordia GR-468-CORE
  counts a laser failed at a fixed bias rise under APC or a fixed power drop); the loop hides it
  until the bias reaches its clamp, then tx power fades; the module fails when tx power (or
  bias, where the clamp lies above the alarm) crosses its alarm;
* ``connector`` (dirty / damaged connector or patch cord) and ``bent-fiber``: the *link* loss
  rises, so the far end's rx falls while this transmitter's tx and bias stay normal (CorrOpt,
  Zhuo et al., SIGCOMM'17: the two ends' optical powers tell a connector from a module); a bent
  fiber adds a temperature-correlated wander and, sometimes, flaps;
* ``hot-module``: a switch's airflow degrades, every module on it warms, bias rises with
  temperature, one to three modules cross their temperature alarm;
* ``fec-degradation``: the electrical (SerDes) error floor of one lane grows, pre-FEC BER passes
  the RS(544,514) limit with bursty errors that show as uncorrectable codewords first, DOM normal;
* ``sudden-death``: no precursor at all.

Pre-FEC BER is ``0.5 erfc(q / sqrt 2)`` with ``q`` proportional to received optical power
(thermal-noise-limited receiver; Agrawal, *Fiber-Optic Communication Systems*, ch. 4), scaled so
that each receiver reaches the KP4 limit (about 2.4e-4, IEEE 802.3 clause 119 RS(544,514)) at its
own sensitivity, plus an electrical floor. Uncorrectable codewords per interval are Poisson with
the rate of codewords having more than ``t`` symbol errors (errors in bursts of ``b`` symbols).

Benign nuisances: vendor offsets, diurnal room cycles, reseats (a loss bump cleaned away, then a
step in rx), modules parked near a warning threshold, hot-switch neighbours, sampling jitter,
missing samples and collector outages, duplicated samples, switch reboots (counters zeroed, the
far end dark for a while), stale counter values, ``N/A`` readings, modules without thresholds.

Randomness: a master stream draws the plan (who fails, how, when, every offset); each module
draws its noise from its own stream (``SeedSequence(seed, spawn_key=(1, module))``), so the
fleet is the same whatever ``chunk_modules`` the writer uses. Pure: numpy / scipy / pyarrow,
no clock, no sockets.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq
from scipy.special import erfc, pdtrc

from fabricscope.model.errors import ConfigError
from fabricscope.optics.history import (
    ALL_METRICS,
    COLUMNS,
    THRESHOLD_COLUMNS,
    FleetHistory,
    ModuleTable,
)

__all__ = [
    "KP4_BER_LIMIT",
    "KR4_BER_LIMIT",
    "LOS_DBM",
    "MEDIA",
    "MODES",
    "NUISANCES",
    "FailureLabel",
    "Fleet",
    "FleetConfig",
    "FleetFiles",
    "MediaSpec",
    "ModuleTruth",
    "VendorProfile",
    "generate_fleet",
    "to_history",
    "write_fleet",
]

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: Failure modes, in the order of the plan's mode codes.
MODES: tuple[str, ...] = (
    "aging-laser", "connector", "bent-fiber", "hot-module", "fec-degradation", "sudden-death",
)
AGING, CONNECTOR, BENT, HOT, FEC, SUDDEN = range(6)
HEALTHY = -1
#: Nuisances a healthy module may carry (truth only; they never fail).
NUISANCES: tuple[str, ...] = ("parked", "reseat", "hot-neighbor")

KP4_BER_LIMIT = 2.4e-4
LOS_DBM = -40.0  # what a dark receiver reports (0 mW clipped, as ethtool -m shows it)
_Q_LIMIT = 3.4916760634  # 0.5 erfc(q / sqrt 2) = 2.4e-4
_TX_TEMP_DB_PER_C = -0.01  # APC tracking error: tx power drifts down with temperature
_MAX_LANES = 8
_DAY = 86400.0
_BER_MASK = 1e-6  # below this a codeword with > t symbol errors is < 1e-30: skip pdtrc
_KINDS4 = ("high_alarm", "high_warn", "low_warn", "low_alarm")


def _kp4_cw_error(ber: float) -> float:
    return float(pdtrc(15, 544 * 10 * ber))


#: RS(528,514) "KR4" (t = 7, 100G NRZ) limit: the BER whose codeword error ratio equals KP4's
#: at 2.4e-4, so both media are graded on the same post-FEC reliability.
KR4_BER_LIMIT = float(brentq(lambda b: pdtrc(7, 528 * 10 * b) - _kp4_cw_error(KP4_BER_LIMIT),
                             1e-7, 1e-3))


@dataclass(frozen=True)
class MediaSpec:
    """Nominal optics of one media type (illustrative datasheet-class values, not a vendor's).

    ``thresholds`` holds ``<metric>_<kind>`` for the five DOM metrics (SFF-8636 / CMIS alarm and
    warning sets); ``sens_db`` is where a receiver's sensitivity (BER at the FEC limit) lies
    relative to ``rx_power_dbm_low_alarm``; ``parallel`` media (MPO ribbons) lose light
    unevenly across lanes at a dirty connector, duplex WDM media evenly.
    """

    lanes: int
    lane_gbps: float
    fec_n: int
    fec_t: int
    ber_limit: float
    vcsel: bool
    parallel: bool
    bias_ma: float
    ith_ma: float
    tx_dbm: float
    loss_db: tuple[float, float]
    sens_db: tuple[float, float]
    self_heat_c: tuple[float, float]
    thresholds: Mapping[str, float]


def _th(temp: Sequence[float], vcc: Sequence[float], bias: Sequence[float],
        tx: Sequence[float], rx: Sequence[float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m, vals in (("temperature_c", temp), ("vcc_v", vcc), ("tx_bias_ma", bias),
                    ("tx_power_dbm", tx), ("rx_power_dbm", rx)):
        for k, v in zip(_KINDS4, vals, strict=True):
            out[f"{m}_{k}"] = float(v)
    return out


_TEMP = (75.0, 70.0, 0.0, -5.0)
_VCC = (3.63, 3.465, 3.135, 2.97)
#: The media the generator knows (lane counts: 4 for 100G / 400G DR4 / FR4, 8 for SR8 / DR8).
MEDIA: Mapping[str, MediaSpec] = {
    "100GBASE-SR4": MediaSpec(
        4, 25.78125, 528, 7, KR4_BER_LIMIT, True, True, 7.0, 1.0, -0.5, (0.5, 2.0), (0.5, 2.5),
        (10.0, 15.0), _th(_TEMP, _VCC, (13.0, 11.0, 3.0, 2.0), (4.0, 2.0, -5.3, -7.3),
                          (3.4, 2.4, -9.5, -13.5))),
    "400GBASE-DR4": MediaSpec(
        4, 106.25, 544, 15, KP4_BER_LIMIT, False, True, 50.0, 10.0, 1.5, (1.0, 3.0), (-1.0, 0.5),
        (15.0, 22.0), _th(_TEMP, _VCC, (100.0, 90.0, 20.0, 10.0), (6.0, 5.0, -3.9, -5.9),
                          (6.0, 5.0, -7.9, -10.9))),
    "400GBASE-FR4": MediaSpec(
        4, 106.25, 544, 15, KP4_BER_LIMIT, False, False, 60.0, 12.0, 2.0, (2.0, 4.0), (-0.5, 1.0),
        (15.0, 22.0), _th(_TEMP, _VCC, (110.0, 100.0, 20.0, 10.0), (6.5, 5.5, -3.2, -5.2),
                          (6.5, 5.5, -9.0, -12.0))),
    "400GBASE-SR8": MediaSpec(
        8, 53.125, 544, 15, KP4_BER_LIMIT, True, True, 8.0, 1.2, -0.5, (0.5, 2.0), (0.5, 1.5),
        (10.0, 15.0), _th(_TEMP, _VCC, (14.0, 12.0, 3.0, 2.0), (4.0, 3.0, -5.5, -7.5),
                          (4.0, 3.0, -9.5, -12.5))),
    "800GBASE-DR8": MediaSpec(
        8, 106.25, 544, 15, KP4_BER_LIMIT, False, True, 55.0, 11.0, 1.5, (1.0, 3.0), (-1.0, 0.5),
        (17.0, 24.0), _th(_TEMP, _VCC, (105.0, 95.0, 20.0, 10.0), (6.0, 5.0, -3.9, -5.9),
                          (6.0, 5.0, -7.9, -10.9))),
}
_MEDIA_NAMES = tuple(MEDIA)


def _number(where: str, v: object, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or not lo <= v <= hi:
        raise ConfigError(f"optics fleet config: {where}: must be a number in [{lo:g}, {hi:g}], "
                          f"got {v!r}")
    return float(v)


def _integer(where: str, v: object, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"optics fleet config: {where}: must be an integer in [{lo}, {hi}], "
                          f"got {v!r}")
    return v


@dataclass(frozen=True)
class VendorProfile:
    """A vendor's systematic offsets: bias scale, tx power offset, case temperature, noise."""

    bias_scale: float = 1.0
    power_offset_db: float = 0.0
    temp_offset_c: float = 0.0
    noise_scale: float = 1.0

    def __post_init__(self) -> None:
        for name, lo, hi in (("bias_scale", 0.5, 2.0), ("power_offset_db", -2.0, 2.0),
                             ("temp_offset_c", -10.0, 10.0), ("noise_scale", 0.1, 5.0)):
            _number(f"vendor profile: {name}", getattr(self, name), lo, hi)


#: Default vendors (fictional names) and their offsets.
DEFAULT_VENDORS: Mapping[str, VendorProfile] = {
    "Acme": VendorProfile(),
    "Borealis": VendorProfile(1.08, 0.4, 2.5, 1.3),
    "Cobalt": VendorProfile(0.93, -0.3, -1.5, 0.8),
}


def _shares(where: str, mix: object, known: Sequence[str] | None) -> None:
    if not isinstance(mix, Mapping) or not mix:
        raise ConfigError(f"optics fleet config: {where}: must be a non-empty mapping name -> "
                          f"share, got {mix!r}")
    for k, v in mix.items():
        if not isinstance(k, str) or not k:
            raise ConfigError(f"optics fleet config: {where}: names must be non-empty strings, "
                              f"got {k!r}")
        if known is not None and k not in known:
            raise ConfigError(f"optics fleet config: {where}: unknown name {k!r} "
                              f"(known: {', '.join(known)})")
        _number(f"{where}[{k!r}]", v, 0.0, 1e9)
    if sum(float(v) for v in mix.values()) <= 0:
        raise ConfigError(f"optics fleet config: {where}: shares sum to 0")


def _pair(where: str, v: object, lo: float, hi: float) -> None:
    if not isinstance(v, tuple) or len(v) != 2:
        raise ConfigError(f"optics fleet config: {where}: must be a (low, high) pair, got {v!r}")
    a = _number(f"{where}[0]", v[0], lo, hi)
    b = _number(f"{where}[1]", v[1], lo, hi)
    if a > b:
        raise ConfigError(f"optics fleet config: {where}: low {a:g} > high {b:g}")


@dataclass(frozen=True)
class FleetConfig:
    """What fleet to generate; validated on construction (:class:`ConfigError` names the field).

    Shares (``vendor_mix``, ``media_mix``, ``mode_mix``) are normalized. ``fail_fraction`` of the
    modules fail inside the window (their mode drawn from ``mode_mix``); ``late_fraction`` degrade
    inside it but fail after its end (truth only, no label). ``parked_fraction`` sit near a warning
    threshold, ``reseat_fraction`` get a loss bump that a reseat cleans; neither ever fails.
    Vendors missing from ``vendor_profiles`` get offsets drawn from the seed (in ``truth.json``).
    """

    modules: int = 1500
    days: float = 21.0
    sample_s: int = 600
    start_ts_ns: int = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z
    vendor_mix: Mapping[str, float] = field(
        default_factory=lambda: {"Acme": 0.5, "Borealis": 0.3, "Cobalt": 0.2})
    vendor_profiles: Mapping[str, VendorProfile] = field(default_factory=lambda: dict(DEFAULT_VENDORS))
    media_mix: Mapping[str, float] = field(default_factory=lambda: {
        "400GBASE-DR4": 0.4, "800GBASE-DR8": 0.25, "400GBASE-FR4": 0.1, "400GBASE-SR8": 0.1,
        "100GBASE-SR4": 0.15})
    ports_per_switch: int = 32
    mode_mix: Mapping[str, float] = field(default_factory=lambda: {
        "aging-laser": 0.25, "connector": 0.25, "bent-fiber": 0.1, "hot-module": 0.1,
        "fec-degradation": 0.15, "sudden-death": 0.15})
    fail_fraction: float = 0.06
    late_fraction: float = 0.01
    parked_fraction: float = 0.04
    reseat_fraction: float = 0.03
    lead_days: tuple[float, float] = (1.0, 14.0)
    diurnal_c: tuple[float, float] = (1.0, 3.0)
    jitter_s: float = 2.0
    missing_rate: float = 0.002
    duplicate_rate: float = 0.001
    nan_rate: float = 0.0005
    outages_per_device: float = 0.2
    reboots_per_device: float = 0.1
    threshold_missing_fraction: float = 0.1
    failed_nan_fraction: float = 0.25

    def __post_init__(self) -> None:
        _integer("modules", self.modules, 2, 10_000_000)
        _number("days", self.days, 1.0 / 24.0, 3650.0)
        _integer("sample_s", self.sample_s, 1, 86_400)
        _integer("start_ts_ns", self.start_ts_ns, 0, 2**62)
        if self.days * _DAY / self.sample_s < 2:
            raise ConfigError(f"optics fleet config: days / sample_s: fewer than 2 samples "
                              f"({self.days!r} days at {self.sample_s!r} s)")
        _shares("vendor_mix", self.vendor_mix, None)
        if not isinstance(self.vendor_profiles, Mapping):
            raise ConfigError(f"optics fleet config: vendor_profiles: must be a mapping vendor -> "
                              f"VendorProfile, got {self.vendor_profiles!r}")
        for k, v in self.vendor_profiles.items():
            if not isinstance(v, VendorProfile):
                raise ConfigError(f"optics fleet config: vendor_profiles[{k!r}]: must be a "
                                  f"VendorProfile, got {v!r}")
        _shares("media_mix", self.media_mix, _MEDIA_NAMES)
        _integer("ports_per_switch", self.ports_per_switch, 1, 4096)
        _shares("mode_mix", self.mode_mix, MODES)
        total = 0.0
        for name in ("fail_fraction", "late_fraction", "parked_fraction", "reseat_fraction"):
            total += _number(name, getattr(self, name), 0.0, 0.4)
        if total > 0.4:
            raise ConfigError(f"optics fleet config: fail_fraction + late_fraction + "
                              f"parked_fraction + reseat_fraction: must be <= 0.4 (each uses a "
                              f"whole link), got {total:g}")
        _pair("lead_days", self.lead_days, 1.0 / 24.0, 365.0)
        _pair("diurnal_c", self.diurnal_c, 0.0, 4.0)
        _number("jitter_s", self.jitter_s, 0.0, 0.25 * self.sample_s)
        for name in ("missing_rate", "duplicate_rate", "nan_rate"):
            _number(name, getattr(self, name), 0.0, 0.5)
        for name in ("outages_per_device", "reboots_per_device"):
            _number(name, getattr(self, name), 0.0, 100.0)
        for name in ("threshold_missing_fraction", "failed_nan_fraction"):
            _number(name, getattr(self, name), 0.0, 1.0)

    @property
    def samples(self) -> int:
        """Sample rounds in the window."""
        return int(self.days * _DAY // self.sample_s)

    @property
    def end_ts_ns(self) -> int:
        """End of the window (exclusive)."""
        return self.start_ts_ns + self.samples * self.sample_s * 10**9


@dataclass(frozen=True, slots=True)
class FailureLabel:
    """One row of ``labels.csv``: what an RMA / ticket system exports."""

    device: str
    port: str
    serial: str
    failure_ts_ns: int
    cause: str


@dataclass(frozen=True)
class ModuleTruth:
    """The generator's ground truth for one module (one entry of ``truth.json``).

    ``mode`` is ``"healthy"`` or one of :data:`MODES`; ``onset_ts_ns`` when its degradation
    began (the failure time for sudden deaths; may precede the window), ``failure_ts_ns`` when
    it fails (``None``: never; after the window's end for ``late`` modules,
    ``fails_in_window`` false); ``lane`` the lane the mode acts on (``None``: all lanes or
    none); ``criterion`` which reading crossed what at the failure; ``params`` the drawn values;
    ``thresholds`` the module's own alarm / warning set (also where it reports none).
    """

    device: str
    port: str
    serial: str
    vendor: str
    part_number: str
    media: str
    lanes: int
    peer: str
    mode: str
    nuisances: tuple[str, ...]
    onset_ts_ns: int | None
    failure_ts_ns: int | None
    fails_in_window: bool
    lane: int | None
    criterion: str
    params: Mapping[str, float]
    thresholds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Fleet:
    """A generated fleet in memory: history table, labels, truth, cabling (``device:port``)."""

    config: FleetConfig
    seed: int
    history: FleetHistory
    labels: tuple[FailureLabel, ...]
    truth: tuple[ModuleTruth, ...]
    peers: Mapping[str, str]
    devices: tuple[Mapping[str, Any], ...]

    def to_history(self) -> FleetHistory:
        """The history table (the same object as :attr:`history`)."""
        return self.history


@dataclass(frozen=True)
class FleetFiles:
    """What :func:`write_fleet` wrote."""

    history: Path
    labels: Path
    truth: Path
    links: Path
    rows: int
    row_groups: int


# ---------------------------------------------------------------------------------- plan
@dataclass
class _Plan:
    """Everything drawn by the master stream; per module (M), per lane (M, 8), per device (D)."""

    cfg: FleetConfig
    seed: int
    T: int
    device_names: list[str]
    dev: I64
    port: list[str]
    peer: I64
    media: I64
    vendor_names: list[str]
    vendor: I64
    vendor_profiles: dict[str, VendorProfile]
    lanes: I64
    serial: list[str]
    part: list[str]
    th_true: dict[str, F64]
    th_reported: dict[str, F64]
    # module / lane baselines
    self_heat: F64
    tref: F64
    t0: F64
    vcc0: F64
    rx_cal: F64
    noise: F64
    bias0: F64
    ith0: F64
    tx0: F64
    loss0: F64
    psens: F64
    floor0: F64
    weight: F64
    # device
    inlet: F64
    amp: F64
    phase: F64
    fan_rise: F64
    fan_on: F64
    fan_full: F64
    reboots: list[list[tuple[float, float]]]
    outages: list[list[tuple[float, float]]]
    # mode
    mode: I64
    nuisance: list[list[str]]
    onset: F64
    fail: F64
    in_window: B
    lane_fail: I64
    shape: F64
    criterion: list[str]
    d_i: F64
    clamp: F64
    loss_kind: I64  # 0 none, 1 drift, 2 steps, 3 bent, 4 reseat bump
    loss_f: F64
    loss_on: F64
    loss_end: F64
    steps: F64  # (M, 4) step times (inf padded)
    bend_tc: F64
    flap_per_day: F64
    flap_db: F64
    rs_after: F64
    hot_extra: F64
    fec_target: F64
    burst: F64
    fail_nan: B
    stale: F64
    params: list[dict[str, float]]


def _largest_remainder(n: int, shares: Mapping[str, float], names: Sequence[str]) -> list[int]:
    w = np.array([float(shares.get(k, 0.0)) for k in names])
    w = w / w.sum() if w.sum() > 0 else w
    raw = w * n
    out = np.floor(raw).astype(np.int64)
    rest = int(n - out.sum())
    if rest > 0:
        out[np.argsort(-(raw - out), kind="stable")[:rest]] += 1
    return [int(x) for x in out]


def _room(inlet: F64, amp: F64, phase: F64, t: F64) -> F64:
    """Switch inlet temperature: mean + a 24 h sinusoid (the room's cycle)."""
    return np.asarray(inlet + amp * np.sin(2 * np.pi * (t / _DAY + phase)), dtype=np.float64)


def _plan(cfg: FleetConfig, seed: int) -> _Plan:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"optics fleet: seed: must be an integer >= 0, got {seed!r}")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0,))))
    M, P, T = cfg.modules, cfg.ports_per_switch, cfg.samples
    window = T * cfg.sample_s
    nlinks, odd = M // 2, M % 2
    n_a = nlinks + odd
    n_leaf, n_spine = -(-n_a // P), -(-nlinks // P)
    device_names = [f"leaf-{i:03d}" for i in range(n_leaf)] + \
        [f"spine-{i:03d}" for i in range(n_spine)]
    dev = np.zeros(M, dtype=np.int64)
    slot = np.zeros(M, dtype=np.int64)
    a = np.arange(n_a)
    dev[2 * a] = a // P
    slot[2 * a] = a % P
    perm = rng.permutation(nlinks)
    b = np.arange(nlinks)
    dev[2 * b + 1] = n_leaf + perm // P
    slot[2 * b + 1] = perm % P
    port = [f"Ethernet{8 * int(s)}" for s in slot]
    peer = np.full(M, -1, dtype=np.int64)
    peer[2 * b], peer[2 * b + 1] = 2 * b + 1, 2 * b
    D = len(device_names)

    mw = np.array([cfg.media_mix.get(k, 0.0) for k in _MEDIA_NAMES], dtype=np.float64)
    link_media = rng.choice(len(_MEDIA_NAMES), size=n_a, p=mw / mw.sum())
    media = np.repeat(link_media, 2)[:M]
    vendor_names = list(cfg.vendor_mix)
    vw = np.array([cfg.vendor_mix[k] for k in vendor_names], dtype=np.float64)
    vendor = rng.choice(len(vendor_names), size=M, p=vw / vw.sum())
    profiles: dict[str, VendorProfile] = {}
    for v in vendor_names:
        drawn = VendorProfile(float(rng.uniform(0.9, 1.12)), float(rng.uniform(-0.5, 0.5)),
                              float(rng.uniform(-3.0, 3.0)), float(rng.uniform(0.7, 1.5)))
        profiles[v] = cfg.vendor_profiles.get(v, drawn)
    specs = [MEDIA[_MEDIA_NAMES[int(k)]] for k in media]
    lanes = np.array([s.lanes for s in specs], dtype=np.int64)
    serial = [f"{vendor_names[int(vendor[m])][:3].upper()}{m:06d}"
              f"{chr(65 + int(rng.integers(26)))}{chr(65 + int(rng.integers(26)))}"
              for m in range(M)]
    # part numbers: one per (vendor, media), each with its own small threshold variant
    part_of: dict[tuple[int, int], tuple[str, float, float]] = {}
    for vi, vname in enumerate(vendor_names):
        for ki, name in enumerate(_MEDIA_NAMES):
            short = name.replace("GBASE-", "G-")
            part_of[(vi, ki)] = (f"{vname[:3].upper()}-{short}-{'ABC'[int(rng.integers(3))]}",
                               float(rng.choice([0.0, 5.0])),
                               float(np.round(rng.uniform(-0.5, 0.5), 1)))
    part = [part_of[(int(vendor[m]), int(media[m]))][0] for m in range(M)]
    th_true = {c: np.zeros(M) for c in THRESHOLD_COLUMNS}
    for m in range(M):
        _, dtemp, drx = part_of[(int(vendor[m]), int(media[m]))]
        for c in THRESHOLD_COLUMNS:
            v0 = specs[m].thresholds[c]
            if c.startswith("temperature_c_high"):
                v0 += dtemp
            elif c.startswith("rx_power_dbm_low"):
                v0 += drx
            th_true[c][m] = v0
    missing_th = rng.random(M) < cfg.threshold_missing_fraction
    th_rep = {c: np.where(missing_th, np.nan, v) for c, v in th_true.items()}

    def col(attr: str) -> F64:
        return np.array([float(getattr(s, attr)) for s in specs])

    def rng_pair(attr: str) -> F64:
        lo = np.array([getattr(s, attr)[0] for s in specs])
        hi = np.array([getattr(s, attr)[1] for s in specs])
        return np.asarray(rng.uniform(lo, hi), dtype=np.float64)

    vp = [profiles[vendor_names[int(v)]] for v in vendor]
    bias_scale = np.array([p.bias_scale for p in vp])
    p_off = np.array([p.power_offset_db for p in vp])
    t_off = np.array([p.temp_offset_c for p in vp])
    noise = np.array([p.noise_scale for p in vp])
    L = _MAX_LANES
    inlet = rng.uniform(22.0, 28.0, D)
    amp = rng.uniform(cfg.diurnal_c[0], cfg.diurnal_c[1], D)
    site_phase = float(rng.uniform(0, 1))
    phase = site_phase + rng.normal(0, 0.02, D)
    self_heat = rng_pair("self_heat_c") + t_off + rng.normal(0, 1.5, M)
    t0 = rng.uniform(50.0, 80.0, M)
    vcc0 = 3.3 + rng.normal(0, 0.03, M)
    rx_cal = rng.normal(0, 0.3, M)
    bias0 = col("bias_ma")[:, None] * bias_scale[:, None] * (1 + rng.normal(0, 0.08, (M, L)))
    ith0 = col("ith_ma")[:, None] * (1 + rng.normal(0, 0.1, (M, L)))
    ith0 = np.minimum(ith0, 0.5 * bias0)
    tx_lw, tx_hw = th_true["tx_power_dbm_low_warn"], th_true["tx_power_dbm_high_warn"]
    tx0 = np.clip(col("tx_dbm")[:, None] + p_off[:, None] + rng.normal(0, 0.4, (M, L)),
                  (tx_lw + 1.0)[:, None], (tx_hw - 1.0)[:, None])
    loss0 = np.maximum(rng_pair("loss_db")[:, None] + rng.normal(0, 0.2, (M, L)), 0.2)
    psens = (th_true["rx_power_dbm_low_alarm"] + rng_pair("sens_db"))[:, None] + \
        rng.normal(0, 0.3, (M, L))
    floor0 = rng.uniform(-8.5, -6.5, M)[:, None] + rng.normal(0, 0.2, (M, L))
    par = col("parallel") > 0
    w = np.where(par[:, None], rng.uniform(0.3, 1.0, (M, L)), 1.0)
    w = w / np.max(np.where(np.arange(L)[None, :] < lanes[:, None], w, 0.0), axis=1)[:, None]
    tref = inlet[dev] + self_heat

    reboots: list[list[tuple[float, float]]] = []
    outages: list[list[tuple[float, float]]] = []
    for _ in range(D):
        k = int(rng.poisson(cfg.reboots_per_device))
        reboots.append(sorted((float(rng.uniform(0, window)),
                               float(rng.integers(2, 7)) * cfg.sample_s) for _ in range(k)))
        k = int(rng.poisson(cfg.outages_per_device))
        outages.append(sorted((float(rng.uniform(0, window)),
                               float(rng.uniform(0.5, 6.0)) * 3600.0) for _ in range(k)))

    # ---- who fails, how
    mode = np.full(M, HEALTHY, dtype=np.int64)
    nuisance: list[list[str]] = [[] for _ in range(M)]
    used = np.zeros(M, dtype=bool)  # link taken (both ends)
    n_fail = round(cfg.fail_fraction * M)
    n_late = round(cfg.late_fraction * M)
    counts = _largest_remainder(n_fail, cfg.mode_mix, MODES)
    pre_modes = (AGING, CONNECTOR, BENT, FEC)
    pre_w = {MODES[k]: float(cfg.mode_mix.get(MODES[k], 0.0)) for k in pre_modes}
    if sum(pre_w.values()) <= 0:
        pre_w = {MODES[AGING]: 1.0}
    late_counts = _largest_remainder(n_late, pre_w, [MODES[k] for k in pre_modes])
    late = np.zeros(M, dtype=bool)
    hot_dev = np.zeros(D, dtype=bool)

    def take(m: int) -> None:
        used[m] = True
        if peer[m] >= 0:
            used[peer[m]] = True

    n_hot = counts[HOT]
    if n_hot:
        per_dev = np.full(max(1, -(-n_hot // 2)), 0)
        for i in range(n_hot):
            per_dev[i % per_dev.shape[0]] += 1
        cand = rng.permutation(D)
        got = 0
        for d in cand:
            if got >= per_dev.shape[0]:
                break
            mods = np.flatnonzero((dev == d) & ~used)
            k = int(per_dev[got])
            if mods.shape[0] < k + 1:
                continue
            hot_dev[d] = True
            for m in rng.choice(mods, size=k, replace=False):
                mode[m] = HOT
                take(int(m))
            got += 1
        if got < per_dev.shape[0]:
            raise ConfigError(f"optics fleet config: mode_mix['hot-module']: {n_hot} hot modules "
                              f"do not fit on {D} switches of {P} ports")
    on_hot = hot_dev[dev]
    # failing modes may sit on a hot switch; nuisances (which must never fail) may not
    order = rng.permutation(np.flatnonzero(peer >= 0))
    cool = ~on_hot & ~on_hot[np.maximum(peer, 0)]

    def pick(k: int, what: str, *, nuisance: bool = False) -> list[int]:
        out: list[int] = []
        for m in order.tolist():
            if len(out) == k:
                break
            if not used[m] and (cool[m] or not nuisance):
                out.append(m)
                take(m)
        if len(out) < k:
            raise ConfigError(f"optics fleet config: {what}: not enough free links among {M} "
                              f"modules for the failing and nuisance fractions")
        return out

    for k in (AGING, CONNECTOR, BENT, FEC, SUDDEN):
        for m in pick(counts[k], f"mode_mix[{MODES[k]!r}]"):
            mode[m] = k
    for k, n_k in zip(pre_modes, late_counts, strict=True):
        for m in pick(n_k, "late_fraction"):
            mode[m] = k
            late[m] = True
    parked = pick(round(cfg.parked_fraction * M), "parked_fraction", nuisance=True)
    reseat = pick(round(cfg.reseat_fraction * M), "reseat_fraction", nuisance=True)
    for mi in np.flatnonzero(on_hot & (mode == HEALTHY)).tolist():
        nuisance[mi].append("hot-neighbor")

    # ---- times: failure uniform over the window, lead log-uniform in lead_days
    failing = mode != HEALTHY
    fail = np.full(M, np.inf)
    onset = np.full(M, np.inf)
    lead = np.exp(rng.uniform(np.log(cfg.lead_days[0]), np.log(cfg.lead_days[1]), M)) * _DAY
    fail_in = rng.uniform(min(0.5 * _DAY, 0.1 * window), window, M)
    fail_late = window + rng.uniform(0.5, 7.0, M) * _DAY
    fail = np.where(failing, np.where(late, fail_late, fail_in), np.inf)
    lead = np.where(late, np.maximum(lead, fail_late - window + 0.5 * _DAY), lead)
    onset = np.where(failing, np.where(mode == SUDDEN, fail, fail - lead), np.inf)
    in_window = failing & ~late
    shape = rng.uniform(1.5, 3.0, M)
    lane_fail = np.array([int(rng.integers(int(n))) for n in lanes], dtype=np.int64)
    room_f = _room(inlet[dev], amp[dev], phase[dev], np.where(np.isfinite(fail), fail, 0.0))

    # hot switches: fan ramps from the first onset to the first failure of its hot modules
    fan_rise = np.zeros(D)
    fan_on = np.full(D, np.inf)
    fan_full = np.full(D, np.inf)
    for d in np.flatnonzero(hot_dev):
        ms = np.flatnonzero((dev == d) & (mode == HOT))
        fan_rise[d] = rng.uniform(6.0, 12.0)
        fan_on[d] = float(onset[ms].min())
        fan_full[d] = float(fail[ms].min())

    def fan_at(d: I64, t: F64) -> F64:
        with np.errstate(invalid="ignore"):
            span = np.maximum(fan_full[d] - fan_on[d], 1.0)
            r = np.clip((t - fan_on[d]) / span, 0.0, 1.0)
        return np.asarray(np.where(np.isfinite(fan_on[d]), fan_rise[d] * r, 0.0))

    # ---- nuisances that move baselines (parked), then mode parameters
    params: list[dict[str, float]] = [{} for _ in range(M)]
    crit = ["" for _ in range(M)]
    d_i = np.zeros(M)
    clamp = np.full(M, np.inf)
    loss_kind = np.zeros(M, dtype=np.int64)
    loss_f = np.zeros(M)
    loss_on = np.full(M, np.inf)
    loss_end = np.full(M, np.inf)
    steps = np.full((M, 4), np.inf)
    bend_tc = np.zeros(M)
    flap_per_day = np.zeros(M)
    flap_db = np.zeros(M)
    rs_after = np.zeros(M)
    hot_extra = np.zeros(M)
    fec_target = np.zeros(M)
    burst = np.ones(M)
    lane_ok = np.arange(L)[None, :] < lanes[:, None]

    def far_tx(m: int) -> F64:
        """This module's incoming light at the far transmitter (its baseline tx per lane)."""
        q = int(peer[m])
        return tx0[q] if q >= 0 else np.full(L, col("tx_dbm")[m])

    def fail_level(m: int) -> F64:
        """True rx power (per lane) at which this receiver fails: alarm or BER limit first."""
        return np.asarray(np.maximum(th_true["rx_power_dbm_low_alarm"][m] - rx_cal[m], psens[m]))

    for m in parked:
        metric = ("rx_power_dbm", "tx_bias_ma", "temperature_c", "tx_power_dbm")[int(rng.integers(4))]
        nuisance[m].append("parked")
        params[m]["parked_metric_" + metric] = 1.0
        if metric == "rx_power_dbm":
            target = np.maximum(th_true["rx_power_dbm_low_warn"][m] - rx_cal[m]
                                + rng.uniform(-0.5, 1.0), fail_level(m) + 2.0)
            loss0[m] = np.maximum(far_tx(m) - target, 0.2)
            params[m]["parked_level"] = float(np.mean(target[: lanes[m]]))
        elif metric == "tx_bias_ma":
            hw, ha = th_true["tx_bias_ma_high_warn"][m], th_true["tx_bias_ma_high_alarm"][m]
            level = min(hw * (1 + rng.uniform(-0.05, 0.015)), ha * 0.95)
            bias0[m] = level * (1 + rng.normal(0, 0.005, L))
            params[m]["parked_level"] = float(level)
        elif metric == "temperature_c":
            level = th_true["temperature_c_high_warn"][m] + rng.uniform(-3.0, 0.0)
            self_heat[m] = level - inlet[dev[m]]
            tref[m] = level
            params[m]["parked_level"] = float(level)
        else:
            level = th_true["tx_power_dbm_low_warn"][m] + rng.uniform(-0.3, 0.8)
            tx0[m] = level + rng.normal(0, 0.05, L)
            params[m]["parked_level"] = float(level)

    for m in reseat:
        nuisance[m].append("reseat")
        margin = float(np.min((far_tx(m) - loss0[m] - fail_level(m))[: lanes[m]]))
        bump = float(rng.uniform(1.0, max(1.0, min(3.0, margin - 2.0))))
        if margin - bump < 2.0:
            bump = max(0.0, margin - 2.0)
        t_on = float(rng.uniform(0, 0.7 * window))
        t_at = min(t_on + float(rng.uniform(0.5, 5.0)) * _DAY, window - cfg.sample_s)
        loss_kind[m], loss_f[m], loss_on[m], loss_end[m] = 4, bump, t_on, t_at
        rs_after[m] = float(np.clip(rng.normal(0, 0.3), -0.8, min(0.8, margin - 2.0)))
        params[m].update(reseat_bump_db=bump, reseat_on_s=t_on, reseat_at_s=t_at,
                         reseat_step_db=rs_after[m])

    for m in np.flatnonzero(failing).tolist():
        k = int(mode[m])
        lf = int(lane_fail[m])
        tf = float(fail[m])
        p = params[m]
        p["lead_days"] = float((fail[m] - onset[m]) / _DAY)
        p["shape"] = float(shape[m])
        # deterministic case temperature at the failure (room cycle, self heating, fan)
        t_f = float(room_f[m] + self_heat[m] + fan_at(dev[m:m + 1], fail[m:m + 1])[0])
        if k == AGING:
            ith_f = ith0[m, lf] * math.exp((t_f - tref[m]) / t0[m])
            slope = bias0[m, lf] - ith0[m, lf]  # P_set / eta
            ha = th_true["tx_bias_ma_high_alarm"][m]
            clamp[m] = ha * float(rng.uniform(0.85, 1.05))
            r_alarm = 10 ** ((th_true["tx_power_dbm_low_alarm"][m] - tx0[m, lf]
                              - _TX_TEMP_DB_PER_C * (t_f - tref[m])) / 10)
            di_p = clamp[m] - ith_f - slope * r_alarm
            di_b = ha - ith_f - slope if clamp[m] > ha else np.inf
            d_i[m] = min(di_p, di_b)
            crit[m] = "tx_bias_ma>high_alarm" if di_b < di_p else "tx_power_dbm<low_alarm"
            p.update(bias_clamp_ma=float(clamp[m]), threshold_rise_ma=float(d_i[m]),
                     bias0_ma=float(bias0[m, lf]))
        elif k in (CONNECTOR, BENT):
            rx0 = far_tx(m) - loss0[m]
            level = fail_level(m)
            wm = w[m] if k == CONNECTOR else np.where(np.arange(L) == lf, 1.0,
                                                     rng.uniform(0.0, 0.3, L))
            w[m] = wm
            need = np.where(lane_ok[m], (rx0 - level) / np.maximum(wm, 1e-3), np.inf)
            worst = int(np.argmin(need))
            wander = 0.0
            if k == BENT:
                bend_tc[m] = float(rng.uniform(0.05, 0.25))
                wander = bend_tc[m] * float(room_f[m] - inlet[dev[m]])
                flap_per_day[m] = 0.0 if rng.random() < 0.4 else float(rng.uniform(1.0, 6.0))
                flap_db[m] = float(rng.uniform(3.0, 8.0))
                loss_kind[m] = 3
            else:
                loss_kind[m] = 1 if rng.random() < 0.6 else 2
            loss_f[m] = float(need[worst]) + 0.1 - wander
            loss_on[m], loss_end[m] = float(onset[m]), tf
            if loss_kind[m] == 2:
                ns = int(rng.integers(2, 5))
                # handling damage: steps spread over the first 80% of the lead, the last one
                # (the failure) at tf
                st = np.sort(rng.uniform(onset[m], onset[m] + 0.8 * (tf - onset[m]), ns - 1))
                steps[m, : ns - 1] = st
                steps[m, ns - 1] = tf
                p.update(steps=float(ns), first_step_s=float(st[0]))
            crit[m] = ("rx_power_dbm<low_alarm"
                       if th_true["rx_power_dbm_low_alarm"][m] - rx_cal[m] >= psens[m, worst]
                       else "pre_fec_ber>limit")
            lane_fail[m] = worst
            p.update(loss_at_failure_db=float(loss_f[m] + wander), worst_lane=float(worst),
                     worst_lane_weight=float(wm[worst]), sensitivity_dbm=float(psens[m, worst]),
                     profile=float(loss_kind[m]), bend_db_per_c=float(bend_tc[m]),
                     flaps_per_day=float(flap_per_day[m]), flap_db=float(flap_db[m]))
            q = int(peer[m])
            if k == CONNECTOR and q >= 0 and rng.random() < 0.5:
                # the same dirty mating pair loses light both ways, less on the peer's side
                margin = float(np.min(((far_tx(q) - loss0[q] - fail_level(q)) / w[q])[: lanes[q]]))
                fac = min(float(rng.uniform(0.3, 0.8)), (margin - 1.5) / max(loss_f[m], 1e-6))
                if fac > 0.05:
                    loss_kind[q], loss_f[q] = loss_kind[m], fac * loss_f[m]
                    loss_on[q], loss_end[q], steps[q] = loss_on[m], loss_end[m], steps[m]
                    p["peer_loss_fraction"] = fac
        elif k == HOT:
            hot_extra[m] = th_true["temperature_c_high_alarm"][m] + 0.3 - t_f
            crit[m] = "temperature_c>high_alarm"
            p.update(extra_c=float(hot_extra[m]), fan_rise_c=float(fan_rise[dev[m]]))
        elif k == FEC:
            limit = MEDIA[_MEDIA_NAMES[int(media[m])]].ber_limit
            fec_target[m] = math.log10(limit * 1.05)
            burst[m] = float(rng.integers(2, 4))
            crit[m] = "pre_fec_ber>limit"
            p.update(burst_symbols=float(burst[m]), floor0_log10=float(floor0[m, lf]))
        else:
            crit[m] = "none"
    fail_nan = rng.random(M) < cfg.failed_nan_fraction
    stale = np.where(rng.random(M) < 0.05, np.floor(rng.uniform(1, 1e4, M)), 0.0)
    return _Plan(
        cfg=cfg, seed=seed, T=T, device_names=device_names, dev=dev, port=port, peer=peer,
        media=media, vendor_names=vendor_names, vendor=vendor, vendor_profiles=profiles,
        lanes=lanes, serial=serial, part=part, th_true=th_true, th_reported=th_rep,
        self_heat=self_heat, tref=tref, t0=t0, vcc0=vcc0, rx_cal=rx_cal, noise=noise,
        bias0=bias0, ith0=ith0, tx0=tx0, loss0=loss0, psens=psens, floor0=floor0, weight=w,
        inlet=inlet, amp=amp, phase=phase, fan_rise=fan_rise, fan_on=fan_on, fan_full=fan_full,
        reboots=reboots, outages=outages, mode=mode, nuisance=nuisance, onset=onset, fail=fail,
        in_window=in_window, lane_fail=lane_fail, shape=shape, criterion=crit, d_i=d_i,
        clamp=clamp, loss_kind=loss_kind, loss_f=loss_f, loss_on=loss_on, loss_end=loss_end,
        steps=steps, bend_tc=bend_tc, flap_per_day=flap_per_day, flap_db=flap_db,
        rs_after=rs_after, hot_extra=hot_extra, fec_target=fec_target, burst=burst,
        fail_nan=fail_nan, stale=stale, params=params,
    )


# ---------------------------------------------------------------------------------- chunk
@dataclass
class _Rows:
    ts: I64
    module: npt.NDArray[np.int32]
    lane: npt.NDArray[np.int32]
    metrics: dict[str, F32]


def _module_rng(seed: int, m: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1, m))))


def _chunk(pl: _Plan, lo: int, hi: int) -> _Rows:
    """Rows of modules ``lo:hi`` (peers must lie inside: ``lo`` even).

    Lane-level arrays are ``(n, 8, T)`` float32; per-module work (noise streams, the few
    degrading modules) loops over modules, never over samples.
    """
    cfg = pl.cfg
    n, T, L, dt = hi - lo, pl.T, _MAX_LANES, float(cfg.sample_s)
    sl = slice(lo, hi)
    f32 = np.float32
    t = np.arange(T, dtype=np.float64) * dt
    mods = list(range(lo, hi))
    dev = pl.dev[sl]
    ns = pl.noise[sl].astype(f32)
    nlanes = pl.lanes[sl]
    mode = pl.mode[sl]
    # ---- per-module random streams: noise first (fixed draw order), the rest after physics
    e_t = np.zeros((n, T), dtype=f32)
    e_v = np.zeros((n, T), dtype=f32)
    e_lane = [np.zeros((n, L, T), dtype=f32) for _ in range(4)]  # bias, tx, rx, ber
    u_flap = np.zeros((n, T), dtype=f32)
    jit = np.zeros((n, T), dtype=f32)
    count = np.ones((n, T), dtype=np.int64)
    gens = []
    for i, m in enumerate(mods):
        g = _module_rng(pl.seed, m)
        gens.append(g)
        nl = int(nlanes[i])
        g.standard_normal(out=e_t[i], dtype=f32)
        g.standard_normal(out=e_v[i], dtype=f32)
        for arr in e_lane:
            g.standard_normal(out=arr[i, :nl], dtype=f32)
        g.random(out=u_flap[i], dtype=f32)
        g.standard_normal(out=jit[i], dtype=f32)
        u = g.random(T)
        count[i, u < cfg.missing_rate] = 0
        count[i, (u >= cfg.missing_rate) & (u < cfg.missing_rate + cfg.duplicate_rate)] = 2
    e_b, e_tx, e_rx, e_ber = e_lane
    # ---- temperature: room cycle + self heating + fan (hot switch) + hot module
    room = _room(pl.inlet[dev][:, None], pl.amp[dev][:, None], pl.phase[dev][:, None], t[None, :])
    temp = room + pl.self_heat[sl][:, None]
    with np.errstate(invalid="ignore"):
        for d in np.unique(dev[np.isfinite(pl.fan_on[dev])]).tolist():
            span = max(float(pl.fan_full[d] - pl.fan_on[d]), 1.0)
            temp[dev == d] += pl.fan_rise[d] * np.clip((t - pl.fan_on[d]) / span, 0.0, 1.0)
    onset, fail, shape = pl.onset[sl], pl.fail[sl], pl.shape[sl]
    degrading = np.flatnonzero(np.isfinite(onset) & (mode != SUDDEN))

    def progress(i: int) -> F64:
        """(t - onset) / (failure - onset) in [0, 1], raised to the module's shape exponent."""
        span = max(float(fail[i] - onset[i]), 1.0)
        return np.asarray(np.clip((t - onset[i]) / span, 0.0, 1.0) ** shape[i])

    progp = {int(i): progress(int(i)) for i in degrading}
    for i in np.flatnonzero(mode == HOT).tolist():
        temp[i] += pl.hot_extra[lo + i] * progp[i]
    dtemp = temp - pl.tref[sl][:, None]
    # ---- laser under APC: bias = I_th(T) + P_set/eta; I_th(T) = I_th0 exp(dT / T0)
    ith0, bias0 = pl.ith0[sl].astype(f32), pl.bias0[sl].astype(f32)
    eth = np.exp(dtemp / pl.t0[sl][:, None]).astype(f32)
    bias = ith0[:, :, None] * eth[:, None, :] + (bias0 - ith0)[:, :, None]
    tx_true = (pl.tx0[sl].astype(f32)[:, :, None]
               + f32(_TX_TEMP_DB_PER_C) * dtemp.astype(f32)[:, None, :])
    for i in np.flatnonzero(mode == AGING).tolist():
        # aging: the threshold current grows; the loop follows up to the clamp, then power fades
        m, lf = lo + i, int(pl.lane_fail[lo + i])
        ith = ith0[i, lf] * eth[i] + pl.d_i[m] * progp[i]
        slope = float(pl.bias0[m, lf] - pl.ith0[m, lf])
        b_l = np.minimum(ith + slope, pl.clamp[m])
        bias[i, lf] = b_l
        tx_true[i, lf] += 10 * np.log10(np.maximum((b_l - ith) / slope, 1e-6))
    # ---- incoming light: far transmitter - link loss - degradation of the link
    peer = pl.peer[sl]
    pi = peer - lo
    paired = peer >= 0
    rx_true = np.empty_like(tx_true)
    rx_true[paired] = tx_true[pi[paired]]
    spec_tx = np.array([MEDIA[_MEDIA_NAMES[int(k)]].tx_dbm for k in pl.media[sl]], dtype=f32)
    rx_true[~paired] = spec_tx[~paired][:, None, None]
    rx_true -= pl.loss0[sl].astype(f32)[:, :, None]
    for i in np.flatnonzero(pl.loss_kind[sl] > 0).tolist():
        m = lo + i
        kind, lf_db = int(pl.loss_kind[m]), float(pl.loss_f[m])
        on, end = float(pl.loss_on[m]), float(pl.loss_end[m])
        lp = np.clip((t - on) / max(end - on, 1.0), 0.0, 1.0)
        lpp = lp ** shape[i]
        if kind == 1:  # drift
            dl = lf_db * lpp
        elif kind == 2:  # steps (handling damage)
            st = pl.steps[m][np.isfinite(pl.steps[m])]
            dl = lf_db * np.searchsorted(st, t, side="right") / max(st.shape[0], 1)
        elif kind == 3:  # bent fiber: drift + temperature-correlated wander + flaps
            dl = lf_db * lpp + pl.bend_tc[m] * (room[i] - pl.inlet[pl.dev[m]]) * lp
            flap = (u_flap[i] < pl.flap_per_day[m] * dt / _DAY * lp ** 2) & (t < end)
            dl = dl + np.where(flap, pl.flap_db[m], 0.0)
        else:  # reseat nuisance: a bump, cleaned at `end`, then a small step
            dl = np.where(t < end, lf_db * lp, pl.rs_after[m])
        rx_true[i] -= (pl.weight[m][:, None] * dl[None, :]).astype(f32)
    # the far end dark: its module failed (in the window) or its switch is rebooting
    down = np.zeros((n, T), dtype=bool)
    reset = np.zeros((n, T), dtype=bool)
    gone = t[None, :] >= fail[:, None]
    for i in range(n):
        d = int(dev[i])
        for t_r, d_r in pl.reboots[d]:
            down[i] |= (t >= t_r) & (t < t_r + d_r)
            first = int(np.searchsorted(t, t_r + d_r))
            if first < T:
                reset[i, first] = True
        for t_o, d_o in pl.outages[d]:
            count[i, (t >= t_o) & (t < t_o + d_o)] = 0
        if pl.loss_kind[lo + i] == 4:  # a reseat: the module is out of its cage a few samples
            k0 = int(np.searchsorted(t, pl.loss_end[lo + i]))
            count[i, k0: k0 + 1 + int(gens[i].integers(3))] = 0
    dark = np.zeros((n, T), dtype=bool)
    dark[paired] = down[pi[paired]] | (gone[pi[paired]] & pl.in_window[peer[paired]][:, None])
    count[down] = 0
    # ---- pre-FEC BER: electrical floor (x temperature, + FEC degradation) + optical
    fl = pl.floor0[sl]
    ber = (10.0 ** fl).astype(f32)[:, :, None] * (10.0 ** (0.02 * dtemp)).astype(f32)[:, None, :]
    for i in np.flatnonzero(mode == FEC).tolist():
        m, lf = lo + i, int(pl.lane_fail[lo + i])
        ber[i, lf] = 10.0 ** (fl[i, lf] + (pl.fec_target[m] - fl[i, lf]) * progp[i])
    margin = rx_true - pl.psens[sl].astype(f32)[:, :, None]
    near = margin < 7.0
    if near.any():
        q = _Q_LIMIT * 10.0 ** (margin[near].astype(np.float64) / 10.0)
        ber[near] += (0.5 * erfc(q / math.sqrt(2.0))).astype(f32)
    del margin, near
    np.minimum(ber, f32(0.5), out=ber)
    # ---- FEC counters: Poisson codewords with > t symbol errors (bursts of b symbols)
    specs = [MEDIA[_MEDIA_NAMES[int(k)]] for k in pl.media[sl]]
    lane_ok = np.arange(L)[None, :] < nlanes[:, None]
    fec_inc = np.zeros((n, T))
    crc_inc = np.zeros((n, T))
    for i in np.flatnonzero(((ber > _BER_MASK) & lane_ok[:, :, None]).any(axis=(1, 2))).tolist():
        s = specs[i]
        b_l = ber[i, : s.lanes].astype(np.float64)
        b_sym = float(pl.burst[lo + i])
        mean = s.fec_n * np.minimum(1.0, 10.0 * b_l) / b_sym
        pcw = np.where(b_l > _BER_MASK, pdtrc(math.floor(s.fec_t / b_sym), mean), 0.0)
        lam = pcw.sum(axis=0) * (s.lane_gbps * 1e9 / (s.fec_n * 10)) * dt
        if lam.max() > 0:
            fec_inc[i] = gens[i].poisson(lam)
            crc_inc[i] = gens[i].binomial(fec_inc[i].astype(np.int64), 0.8)
    stale = pl.stale[sl]
    # ---- readings (what the module reports)
    rep: dict[str, npt.NDArray[Any]] = {}
    rep["temperature_c"] = (temp + 0.15 * ns[:, None] * e_t).astype(f32)
    rep["vcc_v"] = (pl.vcc0[sl][:, None] - 0.0005 * dtemp + 0.004 * ns[:, None] * e_v).astype(f32)
    bias *= 1.0 + f32(0.005) * ns[:, None, None] * e_b
    rep["tx_bias_ma"] = bias
    tx_true += f32(0.05) * ns[:, None, None] * e_tx
    rep["tx_power_dbm"] = np.maximum(tx_true, f32(LOS_DBM))
    rx_true += (pl.rx_cal[sl].astype(f32)[:, None, None] + f32(0.08) * ns[:, None, None] * e_rx)
    np.maximum(rx_true, f32(LOS_DBM), out=rx_true)
    rx_true[np.broadcast_to(dark[:, None, :], rx_true.shape)] = LOS_DBM
    rep["rx_power_dbm"] = rx_true
    vcsel = np.array([s.vcsel for s in specs])
    rep["laser_temp_c"] = np.where(vcsel[:, None], np.nan,
                                   temp + 4.0 + 0.1 * ns[:, None] * e_t).astype(f32)
    ber *= np.exp(e_ber * f32(0.1 * math.log(10.0)))
    ber[np.broadcast_to(dark[:, None, :], ber.shape)] = np.nan
    rep["pre_fec_ber"] = ber
    rep["fec_uncorrectable"] = _counter(fec_inc, reset, stale).astype(f32)
    rep["crc_errors"] = _counter(crc_inc, reset, np.floor(stale * 0.8)).astype(f32)
    # after the failure: no rows, or rows of N/A
    fail_nan = pl.fail_nan[sl]
    count[gone & ~fail_nan[:, None]] = 0
    nan_rows = gone & fail_nan[:, None]
    # sparse N/A readings, per metric
    for i, g in enumerate(gens):
        nl = int(nlanes[i])
        for name in ALL_METRICS:
            a = rep[name]
            cells = nl * T if a.ndim == 3 else T
            k = int(g.binomial(cells, cfg.nan_rate)) if cfg.nan_rate > 0 else 0
            if k:
                at = g.integers(cells, size=k)
                if a.ndim == 3:
                    a[i, at // T, at % T] = np.nan
                else:
                    a[i, at] = np.nan
    # ---- rows: (module, lane, ts), missing samples dropped, duplicates repeated
    ml_mod, ml_lane = np.nonzero(lane_ok)
    cnt = count[ml_mod].ravel()
    idx = np.repeat(np.arange(cnt.shape[0], dtype=np.int64), cnt)
    flat_t = idx % T
    ml = idx // T
    row_mod = ml_mod[ml]
    row_lane = ml_lane[ml]
    mod_cell = row_mod * T + flat_t
    lane_cell = (row_mod * L + row_lane) * T + flat_t
    del idx, ml
    off = np.clip(jit.ravel()[mod_cell].astype(np.float64) * cfg.jitter_s, -0.4 * dt, 0.4 * dt)
    ts = (cfg.start_ts_ns + flat_t * (cfg.sample_s * 10**9) + np.rint(off * 1e9).astype(np.int64))
    del off
    nan_r = nan_rows.ravel()[mod_cell]
    out: dict[str, F32] = {}
    for name in ALL_METRICS:
        a = rep.pop(name)
        v = np.take(a.ravel(), lane_cell if a.ndim == 3 else mod_cell)
        if nan_r.any():
            v[nan_r] = np.nan
        out[name] = v
    return _Rows(ts.astype(np.int64), (row_mod + lo).astype(np.int32),
                 row_lane.astype(np.int32), out)


def _counter(inc: F64, reset: B, stale: F64) -> F64:
    """Cumulative counter of ``inc``, zeroed where ``reset`` (a reboot), from ``stale``."""
    cum = np.cumsum(inc, axis=1)
    prev = np.concatenate([np.zeros((inc.shape[0], 1)), cum[:, :-1]], axis=1)
    base = np.maximum.accumulate(np.where(reset, prev, 0.0), axis=1)
    fresh = np.cumsum(reset, axis=1) == 0
    return np.asarray(cum - base + np.where(fresh, stale[:, None], 0.0))


# ---------------------------------------------------------------------------------- outputs
def _ns(cfg: FleetConfig, s: float) -> int | None:
    return None if not math.isfinite(s) else cfg.start_ts_ns + round(s * 1e9)


def _truth(pl: _Plan) -> tuple[ModuleTruth, ...]:
    out = []
    for m in range(pl.cfg.modules):
        k = int(pl.mode[m])
        q = int(pl.peer[m])
        failing = k != HEALTHY
        out.append(ModuleTruth(
            device=pl.device_names[int(pl.dev[m])], port=pl.port[m], serial=pl.serial[m],
            vendor=pl.vendor_names[int(pl.vendor[m])], part_number=pl.part[m],
            media=_MEDIA_NAMES[int(pl.media[m])], lanes=int(pl.lanes[m]),
            peer=f"{pl.device_names[int(pl.dev[q])]}:{pl.port[q]}" if q >= 0 else "",
            mode=MODES[k] if failing else "healthy", nuisances=tuple(pl.nuisance[m]),
            onset_ts_ns=_ns(pl.cfg, float(pl.onset[m])),
            failure_ts_ns=_ns(pl.cfg, float(pl.fail[m])),
            fails_in_window=bool(pl.in_window[m]),
            lane=int(pl.lane_fail[m]) if k in (AGING, CONNECTOR, BENT, FEC) else None,
            criterion=pl.criterion[m] if failing else "",
            params={**pl.params[m], "late": float(failing and not pl.in_window[m])}
            if failing else dict(pl.params[m]),
            thresholds={c: float(v[m]) for c, v in pl.th_true.items()},
        ))
    return tuple(out)


def _labels(truth: Sequence[ModuleTruth]) -> tuple[FailureLabel, ...]:
    rows = [FailureLabel(t.device, t.port, t.serial, int(t.failure_ts_ns), t.mode)
            for t in truth if t.fails_in_window and t.failure_ts_ns is not None]
    return tuple(sorted(rows, key=lambda r: (r.failure_ts_ns, r.device, r.port)))


def _devices(pl: _Plan) -> tuple[dict[str, Any], ...]:
    cfg = pl.cfg
    out = []
    for d, name in enumerate(pl.device_names):
        out.append({
            "device": name, "inlet_c": float(pl.inlet[d]), "diurnal_c": float(pl.amp[d]),
            "hot": bool(np.isfinite(pl.fan_on[d])), "fan_rise_c": float(pl.fan_rise[d]),
            "fan_onset_ts_ns": _ns(cfg, float(pl.fan_on[d])),
            "reboots": [[_ns(cfg, a), float(b)] for a, b in pl.reboots[d]],
            "outages": [[_ns(cfg, a), float(b)] for a, b in pl.outages[d]],
        })
    return tuple(out)


def _module_table(pl: _Plan) -> ModuleTable:
    return ModuleTable(
        device=tuple(pl.device_names[int(d)] for d in pl.dev), port=tuple(pl.port),
        vendor=tuple(pl.vendor_names[int(v)] for v in pl.vendor), part_number=tuple(pl.part),
        serial=tuple(pl.serial), media=tuple(_MEDIA_NAMES[int(k)] for k in pl.media),
        lanes=pl.lanes.astype(np.int32), thresholds={c: v.copy() for c, v in pl.th_reported.items()},
    )


def _peers(pl: _Plan) -> dict[str, str]:
    out = {}
    for m in range(pl.cfg.modules):
        q = int(pl.peer[m])
        if q >= 0:
            out[f"{pl.device_names[int(pl.dev[m])]}:{pl.port[m]}"] = \
                f"{pl.device_names[int(pl.dev[q])]}:{pl.port[q]}"
    return out


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    size = max(2, size + size % 2)  # even: a link's two ends share a chunk
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


def generate_fleet(config: FleetConfig, *, seed: int) -> Fleet:
    """A fleet in memory (for tests and small fleets; :func:`write_fleet` streams big ones).

    Deterministic per ``(config, seed)``; the rows equal those :func:`write_fleet` writes.
    """
    pl = _plan(config, seed)
    parts = [_chunk(pl, lo, hi) for lo, hi in _chunks(config.modules, 64)]
    ts = np.concatenate([p.ts for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    hist = FleetHistory(
        ts=ts, module=np.concatenate([p.module for p in parts]),
        lane=np.concatenate([p.lane for p in parts]),
        metrics={k: np.concatenate([p.metrics[k] for p in parts]) for k in ALL_METRICS},
        modules=_module_table(pl),
    )
    truth = _truth(pl)
    return Fleet(config, seed, hist, _labels(truth), truth, _peers(pl), _devices(pl))


def to_history(config: FleetConfig, *, seed: int) -> FleetHistory:
    """Just the history table of :func:`generate_fleet`."""
    return generate_fleet(config, seed=seed).history


def _config_json(cfg: FleetConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["vendor_mix"] = dict(cfg.vendor_mix)
    d["media_mix"] = dict(cfg.media_mix)
    d["mode_mix"] = dict(cfg.mode_mix)
    d["vendor_profiles"] = {k: asdict(v) for k, v in cfg.vendor_profiles.items()}
    return d


def write_labels(labels: Sequence[FailureLabel], path: str | os.PathLike[str]) -> Path:
    """``labels.csv``: device, port, serial, failure_ts_ns, cause (one row per failure)."""
    p = Path(path)
    with p.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["device", "port", "serial", "failure_ts_ns", "cause"])
        for r in labels:
            w.writerow([r.device, r.port, r.serial, r.failure_ts_ns, r.cause])
    return p


def _write_truth(path: Path, cfg: FleetConfig, seed: int, pl: _Plan,
                 truth: Sequence[ModuleTruth]) -> None:
    doc = {
        "format": "fabricscope-optics-fleet-truth/1", "seed": seed, "config": _config_json(cfg),
        "start_ts_ns": cfg.start_ts_ns, "end_ts_ns": cfg.end_ts_ns,
        "vendors": {k: asdict(v) for k, v in pl.vendor_profiles.items()},
        "devices": list(_devices(pl)),
        "modules": [{**asdict(t), "nuisances": list(t.nuisances),
                     "params": dict(t.params), "thresholds": dict(t.thresholds)} for t in truth],
    }
    path.write_text(json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n",
                    encoding="utf-8")


def write_fleet(config: FleetConfig, out_dir: str | os.PathLike[str], *, seed: int,
                chunk_modules: int = 64) -> FleetFiles:
    """Stream a fleet to ``out_dir``: ``history.parquet``, ``labels.csv``, ``truth.json``, ``links.csv``.

    ``history.parquet`` has exactly :data:`fabricscope.optics.history.COLUMNS` (strings and
    thresholds dictionary-encoded, metrics float32, ``ts`` int64 ns), one row group per chunk of
    ``chunk_modules`` modules, so memory stays bounded by a chunk whatever the fleet size.
    ``links.csv`` is the cabling (``device_a, port_a, device_b, port_b``) that per-direction loss
    needs; it is inventory, not truth.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    _integer("chunk_modules", chunk_modules, 2, 1_000_000)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pl = _plan(config, seed)
    names = {
        "device": [pl.device_names[int(d)] for d in pl.dev], "port": pl.port,
        "vendor": [pl.vendor_names[int(v)] for v in pl.vendor], "part_number": pl.part,
        "serial": pl.serial, "media": [_MEDIA_NAMES[int(k)] for k in pl.media],
    }
    dict_cols = [*names, *THRESHOLD_COLUMNS]
    fields = []
    for c in COLUMNS:
        if c == "ts":
            fields.append(pa.field(c, pa.int64()))
        elif c == "lane":
            fields.append(pa.field(c, pa.int32()))
        elif c in names:
            fields.append(pa.field(c, pa.dictionary(pa.int32(), pa.string())))
        elif c in THRESHOLD_COLUMNS:
            fields.append(pa.field(c, pa.dictionary(pa.int32(), pa.float64())))
        else:
            fields.append(pa.field(c, pa.float32()))
    schema = pa.schema(fields)
    hist_path = out / "history.parquet"
    tmp = out / "history.parquet.part"
    rows = groups = 0
    writer = pq.ParquetWriter(
        tmp, schema, store_schema=False, compression="lz4", use_dictionary=dict_cols,
        write_statistics=["ts", "device", "port", "lane", "serial"],
        column_encoding={"ts": "DELTA_BINARY_PACKED", "lane": "DELTA_BINARY_PACKED",
                         **{m: "BYTE_STREAM_SPLIT" for m in ALL_METRICS}},
    )
    try:
        for lo, hi in _chunks(config.modules, chunk_modules):
            r = _chunk(pl, lo, hi)
            local = pa.array((r.module - lo).astype(np.int32))
            cols: list[Any] = []
            for c in COLUMNS:
                if c == "ts":
                    cols.append(pa.array(r.ts))
                elif c == "lane":
                    cols.append(pa.array(r.lane))
                elif c in names:
                    # a dictionary of distinct values (a repeated entry makes pyarrow's writer
                    # fall back to plain encoding); serials are distinct per module already
                    uniq, inv = np.unique(np.asarray(names[c][lo:hi], dtype=object),
                                          return_inverse=True)
                    codes = pa.array(inv.astype(np.int32)[r.module - lo])
                    cols.append(pa.DictionaryArray.from_arrays(
                        codes, pa.array(uniq.tolist(), type=pa.string())))
                elif c in THRESHOLD_COLUMNS:
                    cols.append(pa.DictionaryArray.from_arrays(
                        local, pa.array(pl.th_reported[c][lo:hi], type=pa.float64())))
                else:
                    cols.append(pa.array(r.metrics[c]))
            writer.write_table(pa.Table.from_arrays(cols, schema=schema),
                               row_group_size=max(1, len(r.ts)))
            rows += len(r.ts)
            groups += 1
            del r, cols, local
    finally:
        writer.close()
    tmp.replace(hist_path)
    truth = _truth(pl)
    labels_path = write_labels(_labels(truth), out / "labels.csv")
    truth_path = out / "truth.json"
    _write_truth(truth_path, config, seed, pl, truth)
    links_path = out / "links.csv"
    with links_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["device_a", "port_a", "device_b", "port_b"])
        for m in range(0, config.modules - 1, 2):
            q = int(pl.peer[m])
            if q >= 0:
                w.writerow([pl.device_names[int(pl.dev[m])], pl.port[m],
                            pl.device_names[int(pl.dev[q])], pl.port[q]])
    return FleetFiles(hist_path, labels_path, truth_path, links_path, rows, groups)
