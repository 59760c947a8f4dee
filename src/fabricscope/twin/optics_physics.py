"""The physics of one degrading optic in the live twin: DOM drift per mode, pre-FEC BER, frame loss.

Shared by the twin's device state (:mod:`fabricscope.twin.state`: transceiver leaves and port
counters) and its probe transport (:mod:`fabricscope.twin.probe_transport`: UDP probe loss), so
one ``optic-degrading`` fault shows in telemetry, probing and DOM with the same numbers. The
ideas and constants follow the synthetic fleet generator (:mod:`fabricscope.twin.optics_fleet`,
docs/design/optics-fleet.md); the twin's version is docs/design/optics-twin.md.

The twin's module is a 4-lane 400G-class optic with 100GBASE-SR4-like laser numbers (bias
7 mA over a 1 mA threshold, the twin's historical baseline) and a receiver sensitivity near a
400GBASE-DR4 rx low alarm. Its per-lane baselines (drawn by the twin) are *calibration
offsets* of the readings: the true link is the nominal one below, as in the fleet generator
where the reported rx adds a per-module calibration offset to the true power. That is what
lets the probe transport, which has no readings, compute the same frame loss as the twin.

Modes (``severity = rate x days``, days since the fault's start times ``accel``):

* ``aging-laser``: the threshold current of one lane grows ``1 mA`` per unit; the APC loop
  (automatic power control) raises the bias to hold the power, ``I = I_th + P_set / eta``,
  until the driver's clamp, then tx power fades ``P ~ I_clamp - I_th`` (Telcordia
  GR-468-CORE: bias rise at constant power, then power drop, is the aging signature); the
  peer's rx falls by the tx drop and its BER rises as its rx nears sensitivity;
* ``dirty-connector``: the link loss at this end's mating face rises ``1 dB`` per unit: the
  peer's rx falls by it, this end's rx by half (the dirty face attenuates both directions,
  the reflected-back direction less), tx and bias stay at baseline (CorrOpt, Zhuo et al.,
  SIGCOMM'17: the two ends' powers tell a connector from a module);
* ``bent-fiber``: both fibers of the cable lose ``1 dB`` per unit plus a temperature-correlated
  wander (micro-bending: ``0.15 dB/degC`` of a 2 degC swing of the cable's air, one cycle per
  simulated day, that both modules' temperatures show);
* ``hot-module``: the module heats ``3 degC`` per unit; the threshold current follows,
  ``I_th(T) = I_th0 exp(dT / T_0)`` (``T_0 = 60 K``; Coldren, Corzine & Mashanovitch, *Diode
  Lasers and Photonic Integrated Circuits*, ch. 2), so the bias rises with it; tx power falls
  ``0.01 dB/degC`` (the loop's tracking error) and the electrical error floor rises
  ``0.02 decade/degC``.

Pre-FEC BER is an electrical floor plus ``0.5 erfc(q / sqrt 2)`` with ``q`` proportional to the
received power (thermal-noise-limited receiver; Agrawal, *Fiber-Optic Communication Systems*,
ch. 4), scaled so the BER is the RS(544,514) "KP4" limit 2.4e-4 (IEEE 802.3 clause 119) at the
sensitivity. Post-FEC: a codeword (544 ten-bit symbols, 5,140 payload bits) is uncorrectable
when more than ``t = 15`` symbols are wrong, so with symbol error ``p_s = 1 - (1 - BER)^10``
its probability is the binomial tail ``P(X > 15)``, ``X ~ Bin(544, p_s)``, and a frame of ``B``
bytes spanning ``ceil(8 B / 5140)`` codewords is lost (its FCS fails) with
``1 - (1 - P_unc)^codewords``. That is ~0 below a BER of 5e-4 (codeword error 8e-13 at the
2.4e-4 limit) and a cliff above 1e-3 (a 4,096-byte frame: 1.1e-3 lost at 1e-3, 0.44 at 2e-3,
0.996 at 3e-3). Codeword symbols are spread over all lanes of the module (400GBASE-R
distributes both interleaved codewords' symbols over every PMD lane), so the BER a codeword
meets is the mean of the lanes'.

Pure: numpy / scipy, no clock, no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import erfc, erfcinv
from scipy.stats import binom

from fabricscope.model.errors import ConfigError
from fabricscope.sim.faults import OPTIC_MODES

__all__ = [
    "CODEWORD_PAYLOAD_BITS",
    "KP4_BER_LIMIT",
    "KP4_N",
    "KP4_T",
    "NOMINAL_FLOOR_BER",
    "NOMINAL_RX_DBM",
    "SENSITIVITY_DBM",
    "EndDelta",
    "codeword_error_prob",
    "codewords_per_frame",
    "end_deltas",
    "frame_loss",
    "mode_code",
    "mode_frame_loss",
    "pre_fec_ber",
    "receiver_ber",
    "symbol_error_prob",
]

F64 = npt.NDArray[np.float64]

#: RS(544,514) over GF(2^10) ("KP4", IEEE 802.3 clause 119 / 91): n, k, t and the symbol size.
KP4_N, KP4_K, KP4_T, SYMBOL_BITS = 544, 514, 15, 10
CODEWORD_PAYLOAD_BITS = KP4_K * SYMBOL_BITS  # 5,140
#: Pre-FEC BER the KP4 code corrects to the usual post-FEC target (OPERATIONS.md section 2).
KP4_BER_LIMIT = 2.4e-4
#: q at which 0.5 erfc(q / sqrt 2) is the limit (3.4917, as the fleet generator's).
Q_LIMIT = float(math.sqrt(2.0) * erfcinv(2.0 * KP4_BER_LIMIT))

#: The twin's nominal link (its readings add per-lane calibration offsets to these).
NOMINAL_TX_DBM = 1.0
NOMINAL_RX_DBM = -1.5
NOMINAL_BIAS_MA = 7.0
NOMINAL_FLOOR_BER = 1e-8
#: Receiver sensitivity: the rx power at which BER reaches the KP4 limit (a 400GBASE-DR4 rx
#: low alarm of -10.9 dBm, a little below it: the margin at the nominal rx is 9.5 dB).
SENSITIVITY_DBM = -11.0
LOS_DBM = -40.0  # what a dark receiver reports

#: Laser under APC (100GBASE-SR4-like, the fleet catalog's): threshold current, driver clamp
#: (between that catalog's bias high warning 11 mA and alarm 13 mA), characteristic temperature.
ITH0_MA = 1.0
BIAS_CLAMP_MA = 12.0
T0_K = 60.0
TX_DB_PER_C = -0.01  # APC tracking error (the fleet's _TX_TEMP_DB_PER_C)
FLOOR_DECADE_PER_C = 0.02  # electrical floor x 10^(0.02 dT) (the fleet's)
#: Severity units per mode.
AGING_MA_PER_UNIT = 1.0
CONNECTOR_DB_PER_UNIT = 1.0
CONNECTOR_NEAR_FRACTION = 0.5
BEND_DB_PER_UNIT = 1.0
BEND_DB_PER_C = 0.15
BEND_SWING_C = 2.0
HOT_C_PER_UNIT = 3.0

GENERIC, AGING, CONNECTOR, BENT, HOT = (OPTIC_MODES[n] for n in (
    "generic", "aging-laser", "dirty-connector", "bent-fiber", "hot-module"))


@dataclass(frozen=True, slots=True)
class EndDelta:
    """What a mode does to one end's module: changes from baseline, shape ``(..., lanes)``.

    ``rx_power_db`` is the change of the *true* received power (negative: less light), so the
    end's BER is :func:`receiver_ber` of it; the others add to the readings.
    """

    temperature_c: F64
    tx_bias_ma: F64
    tx_power_db: F64
    rx_power_db: F64


def mode_code(mode: str | float) -> int:
    """The code of an ``optic-degrading`` mode given by name or code (ConfigError if unknown)."""
    if isinstance(mode, str):
        if mode in OPTIC_MODES:
            return OPTIC_MODES[mode]
    elif float(mode) in OPTIC_MODES.values():
        return int(mode)
    raise ConfigError(f"optic-degrading: mode: unknown {mode!r}; choose one of "
                      + ", ".join(f"{n} ({c})" for n, c in OPTIC_MODES.items()))


def symbol_error_prob(ber: npt.ArrayLike) -> F64:
    """Probability that a 10-bit symbol holds at least one bit error: ``1 - (1 - BER)^10``."""
    b = np.clip(np.asarray(ber, dtype=np.float64), 0.0, 0.5)
    return np.asarray(-np.expm1(SYMBOL_BITS * np.log1p(-b)))


def codeword_error_prob(ber: npt.ArrayLike) -> F64:
    """RS(544,514) codeword error ratio: ``P(X > 15)``, ``X ~ Bin(544, p_s)``.

    Symbols are taken as independent (optical noise; SerDes error bursts would need a burst
    model, as the fleet generator's ``b``)."""
    return np.asarray(binom.sf(KP4_T, KP4_N, symbol_error_prob(ber)), dtype=np.float64)


def codewords_per_frame(frame_bytes: int) -> int:
    """Codewords a frame of ``frame_bytes`` spans: ``ceil(8 B / 5140)`` (at least one)."""
    if frame_bytes < 1:
        raise ConfigError(f"frame_bytes: must be >= 1, got {frame_bytes!r}")
    return max(1, math.ceil(frame_bytes * 8 / CODEWORD_PAYLOAD_BITS))


def frame_loss(ber: npt.ArrayLike, *, frame_bytes: int) -> F64:
    """Probability that a frame of ``frame_bytes`` meets an uncorrectable codeword (FCS fails)."""
    cw = codewords_per_frame(frame_bytes)
    p = np.clip(codeword_error_prob(ber), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        return np.asarray(-np.expm1(cw * np.log1p(-p)))


def pre_fec_ber(rx_dbm: npt.ArrayLike, *, floor: npt.ArrayLike = NOMINAL_FLOOR_BER,
                sensitivity_dbm: float = SENSITIVITY_DBM) -> F64:
    """Pre-FEC BER at a received power: ``floor + 0.5 erfc(q / sqrt 2)``, ``q ~ P_rx`` (<= 0.5)."""
    rx = np.asarray(rx_dbm, dtype=np.float64)
    q = Q_LIMIT * 10.0 ** ((rx - sensitivity_dbm) / 10.0)
    optical = 0.5 * erfc(q / math.sqrt(2.0))
    return np.asarray(np.minimum(np.asarray(floor, dtype=np.float64) + optical, 0.5))


def receiver_ber(delta: EndDelta, *, floor: npt.ArrayLike = NOMINAL_FLOOR_BER,
                 nominal_rx_dbm: float = NOMINAL_RX_DBM,
                 sensitivity_dbm: float = SENSITIVITY_DBM) -> F64:
    """Per-lane pre-FEC BER of a receiver whose true rx power changed by ``delta.rx_power_db``
    and whose temperature by ``delta.temperature_c`` (the floor rises 0.02 decade/degC)."""
    fl = np.asarray(floor, dtype=np.float64) * 10.0 ** (FLOOR_DECADE_PER_C * delta.temperature_c)
    rx = np.maximum(nominal_rx_dbm + delta.rx_power_db, LOS_DBM)
    return pre_fec_ber(rx, floor=fl, sensitivity_dbm=sensitivity_dbm)


def end_deltas(mode: int, days: npt.ArrayLike, *, rate: float, lanes: int,
               lane: int = 0) -> tuple[EndDelta, EndDelta]:
    """(this end, the peer) changes of a degrading optic ``days`` (accelerated) after its start.

    ``days`` may be an array (one value per send time): the results have shape
    ``days.shape + (lanes,)``. ``mode`` is a code of :data:`~fabricscope.sim.faults.OPTIC_MODES`
    other than ``generic`` (whose historical drift lives in the twin's state).
    """
    if lanes < 1:
        raise ConfigError(f"optic-degrading: lanes: must be >= 1, got {lanes!r}")
    d = np.asarray(days, dtype=np.float64)
    s = np.maximum(d * float(rate), 0.0)[..., None]  # severity, broadcast over lanes
    shape = (*d.shape, lanes)
    z = np.zeros(shape)
    one = np.ones(shape)
    if mode == AGING:
        if not 0 <= lane < lanes:
            raise ConfigError(f"optic-degrading aging-laser: lane: must be in 0..{lanes - 1}, "
                              f"got {lane!r}")
        on = np.zeros(shape)
        on[..., lane] = 1.0
        slope = NOMINAL_BIAS_MA - ITH0_MA  # P_set / eta
        ith = ITH0_MA + AGING_MA_PER_UNIT * s * on
        bias = np.minimum(ith + slope, BIAS_CLAMP_MA)
        ratio = np.clip((bias - ith) / slope, 0.0, 1.0)
        with np.errstate(divide="ignore"):
            tx_db = np.maximum(10.0 * np.log10(ratio), LOS_DBM - NOMINAL_TX_DBM)
        near = EndDelta(z, bias - NOMINAL_BIAS_MA, tx_db, z.copy())
        far = EndDelta(z.copy(), z.copy(), z.copy(), tx_db.copy())
        return near, far
    if mode == CONNECTOR:
        loss = CONNECTOR_DB_PER_UNIT * s * one
        near = EndDelta(z, z.copy(), z.copy(), -CONNECTOR_NEAR_FRACTION * loss)
        far = EndDelta(z.copy(), z.copy(), z.copy(), -loss)
        return near, far
    if mode == BENT:
        swing = BEND_SWING_C * np.sin(2.0 * math.pi * d)[..., None] * one
        loss = BEND_DB_PER_UNIT * s * one + BEND_DB_PER_C * swing * np.minimum(s, 1.0)
        return (EndDelta(swing, z.copy(), z.copy(), -loss),
                EndDelta(swing.copy(), z.copy(), z.copy(), -loss.copy()))
    if mode == HOT:
        dt = HOT_C_PER_UNIT * s * one
        bias = ITH0_MA * np.expm1(dt / T0_K)
        tx_db = TX_DB_PER_C * dt
        near = EndDelta(dt, bias, tx_db, z.copy())
        far = EndDelta(z.copy(), z.copy(), z.copy(), tx_db.copy())
        return near, far
    raise ConfigError(f"optic-degrading: mode: code {mode!r} has no end physics (generic is the "
                      "twin's own drift)")


def mode_frame_loss(mode: int, days: npt.ArrayLike, *, rate: float, lanes: int, lane: int = 0,
                    frame_bytes: int) -> tuple[F64, F64]:
    """(into this end, into the peer) frame loss of one degrading optic ``days`` after its start.

    The receiver at each end meets the mean of its lanes' BER (:func:`receiver_ber` at the
    nominal floor), and a frame of ``frame_bytes`` is lost with :func:`frame_loss`.
    """
    near, far = end_deltas(mode, days, rate=rate, lanes=lanes, lane=lane)
    return (frame_loss(receiver_ber(near).mean(axis=-1), frame_bytes=frame_bytes),
            frame_loss(receiver_ber(far).mean(axis=-1), frame_bytes=frame_bytes))
