"""A streaming detector of degrading optics over transceiver DOM readings (rx / tx power, pre-FEC BER).

DOM (digital optical monitoring) readings are the repair evidence of choice for corrupting
links: CorrOpt (Zhuo et al., "Understanding and Mitigating Packet Corruption in Data Center
Networks", SIGCOMM'17) shows that corruption is stable, unrelated to load, and that the
optical power readings of both ends say which module or connector to act on. This detector
follows that idea in its simplest form:

* per (port, lane) it learns a baseline of rx and tx power, the median of the first
  ``baseline_n`` readings, and its noise (1.4826 x the median absolute deviation);
* ``optic-degrading`` (subject: the port) when, on some lane, the port's own light has fallen
  ``>= drop_db`` below the baseline for ``>= k`` consecutive readings, or its pre-FEC BER has
  been ``>= ber_fraction`` of the RS(544,514) "KP4" correction limit (about 2.4e-4,
  ../shared/reference/OPERATIONS.md section 2) for ``k`` readings. "Own light" is the tx power
  drop, or the rx power drop *not explained by the far end*: when the peer's transmitter
  (same lane) fell by ``x`` dB, ``x`` dB of this port's rx drop is the peer's, not this
  module's (a dying laser at one end must not flag the healthy module that receives it), and
  a BER rise at a port whose rx drop is mostly the far end's is not counted either;
* ``optic-rx-low`` when rx power stays below ``rx_low_dbm`` (the SFF-8636 low-warning
  default -9.5 dBm; per part number later) for ``k`` readings.

Each is reported once per episode; an episode ends after ``k`` consecutive clean readings.
The score is how far the drop stands above the baseline noise: ``z / (z + 5)`` with
``z = drop / max(noise, noise_floor_db)``.

State is kept in numpy arrays (one row per port, ``max_lanes`` columns), so a 2,048-GPU
fabric (8k ports x 4 lanes) costs a few array operations per reading round
(:meth:`DomDetector.observe`); :meth:`DomDetector.__call__` takes :class:`DomReading` records.
Pure: no I/O, time comes from the readings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import ConfigError
from fabricscope.model.records import DomReading, Finding

__all__ = ["KP4_BER_LIMIT", "DomDetector", "DomThresholds"]

KP4_BER_LIMIT = 2.4e-4
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_DEGRADING, _RX_LOW = 0, 1
_KINDS = ("optic-degrading", "optic-rx-low")
_ACTIONS = (
    "optic degrading: clean the connector or replace the module at this port before it fails "
    "(CorrOpt); drain the link if pre-FEC BER nears the FEC limit",
    "rx power below the low warning: inspect the fiber and the far-end transmitter, clean or "
    "replace",
)


@dataclass(frozen=True, slots=True)
class DomThresholds:
    """Thresholds of :class:`DomDetector` (defaults: 400G-class 4-lane modules)."""

    drop_db: float = 1.5
    k: int = 2
    baseline_n: int = 3
    ber_fraction: float = 0.1
    ber_limit: float = KP4_BER_LIMIT
    rx_low_dbm: float = -9.5
    noise_floor_db: float = 0.05

    def __post_init__(self) -> None:
        for name in ("drop_db", "ber_fraction", "ber_limit", "noise_floor_db"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ConfigError(f"optics thresholds: {name}: must be a number > 0, got {v!r}")
        for name in ("k", "baseline_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"optics thresholds: {name}: must be an integer >= 1, got {v!r}")
        if isinstance(self.rx_low_dbm, bool) or not isinstance(self.rx_low_dbm, int | float):
            raise ConfigError(f"optics thresholds: rx_low_dbm: must be a number, got {self.rx_low_dbm!r}")


class DomDetector:
    """Streaming ``DOM readings -> findings``; see the module docstring for the rules.

    Parameters
    ----------
    thresholds:
        :class:`DomThresholds`.
    peers:
        Port -> the port at the other end of its cable (``Fabric.peer_port``). Without it a
        port's rx drop counts as its own (the far end cannot be told apart).
    max_lanes:
        Lanes per module kept (8 covers QSFP-DD / OSFP); a reading of a higher lane is a
        :class:`ConfigError`.
    """

    def __init__(self, thresholds: DomThresholds | None = None, *,
                 peers: Mapping[str, str] | None = None, max_lanes: int = 8) -> None:
        self.th = thresholds or DomThresholds()
        if isinstance(max_lanes, bool) or not isinstance(max_lanes, int) or max_lanes < 1:
            raise ConfigError(f"optics detector: max_lanes: must be an integer >= 1, got {max_lanes!r}")
        self.peers = dict(peers or {})
        self.lanes = max_lanes
        self.ports: list[str] = []
        self._row: dict[str, int] = {}
        n, nl, nb = 0, max_lanes, self.th.baseline_n
        self._hist = np.zeros((nb, n, 2, nl))  # first readings of (rx, tx)
        self._nhist = np.zeros(n, dtype=np.int64)
        self._base = np.full((n, 2, nl), np.nan)  # baseline (rx, tx)
        self._noise = np.full((n, nl), np.nan)  # rx noise
        self._cur = np.full((n, 3, nl), np.nan)  # latest (rx, tx, ber)
        self._run = np.zeros((2, n, nl), dtype=np.int64)  # consecutive bad readings per kind
        self._start = np.zeros((2, n, nl), dtype=np.int64)  # ts of the first bad reading
        self._clean = np.zeros((2, n), dtype=np.int64)  # consecutive clean readings per kind
        self._open = np.zeros((2, n), dtype=bool)  # episode reported and not over
        self._peer = np.zeros(n, dtype=np.int64)

    # ------------------------------------------------------------------ rows
    def _rows(self, ports: Sequence[str]) -> I64:
        row = self._row
        new = [p for p in dict.fromkeys(ports) if p not in row]
        if new:
            n0 = len(self.ports)
            for p in new:
                row[p] = len(self.ports)
                self.ports.append(p)
            self._grow(len(self.ports))
            self._peer[n0:] = -1
            for i in range(len(self.ports)):  # peers seen before their partner: link both ways
                q = self.peers.get(self.ports[i])
                if q is not None and q in row:
                    self._peer[i] = row[q]
        return np.fromiter((row[p] for p in ports), dtype=np.int64, count=len(ports))

    def _grow(self, n: int) -> None:
        old = self._nhist.shape[0]
        if n <= old:
            return

        def pad(a: Any, axis: int, fill: float | bool | int) -> Any:
            shape = list(a.shape)
            shape[axis] = n - old
            return np.concatenate([a, np.full(shape, fill, dtype=a.dtype)], axis=axis)

        self._hist = pad(self._hist, 1, 0.0)
        self._nhist = pad(self._nhist, 0, 0)
        self._base = pad(self._base, 0, np.nan)
        self._noise = pad(self._noise, 0, np.nan)
        self._cur = pad(self._cur, 0, np.nan)
        self._run = pad(self._run, 1, 0)
        self._start = pad(self._start, 1, 0)
        self._clean = pad(self._clean, 1, 0)
        self._open = pad(self._open, 1, False)
        self._peer = pad(self._peer, 0, -1)

    # ------------------------------------------------------------------ input
    def __call__(self, readings: Sequence[DomReading]) -> list[Finding]:
        """Feed readings (any order, any ports); rounds are taken per timestamp, in time order."""
        if not readings:
            return []
        out: list[Finding] = []
        by_ts: dict[int, list[DomReading]] = {}
        for r in readings:
            if not 0 <= r.lane < self.lanes:
                raise ConfigError(f"optics: {r.port}: lane {r.lane} outside 0..{self.lanes - 1}")
            by_ts.setdefault(r.ts_ns, []).append(r)
        for ts in sorted(by_ts):
            rs = by_ts[ts]
            ports = list(dict.fromkeys(r.port for r in rs))
            pos = {p: i for i, p in enumerate(ports)}
            rx = np.full((len(ports), self.lanes), np.nan)
            tx = rx.copy()
            ber = rx.copy()
            for r in rs:
                i = pos[r.port]
                rx[i, r.lane], tx[i, r.lane], ber[i, r.lane] = r.rx_power_dbm, r.tx_power_dbm, r.pre_fec_ber
            out += self.observe(ts, ports, rx, tx, ber)
        return out

    def observe(self, ts_ns: int, ports: Sequence[str], rx_dbm: npt.ArrayLike, tx_dbm: npt.ArrayLike,
                pre_fec_ber: npt.ArrayLike) -> list[Finding]:
        """One reading round at ``ts_ns``: arrays of shape (len(ports), lanes) (NaN: no lane)."""
        rx = np.asarray(rx_dbm, dtype=np.float64)
        tx = np.asarray(tx_dbm, dtype=np.float64)
        ber = np.asarray(pre_fec_ber, dtype=np.float64)
        n = len(ports)
        if rx.ndim != 2 or rx.shape[0] != n or rx.shape[1] > self.lanes or tx.shape != rx.shape \
                or ber.shape != rx.shape:
            raise ConfigError(f"optics: observe: expected arrays of shape ({n}, <= {self.lanes}), got "
                              f"rx {rx.shape}, tx {tx.shape}, ber {ber.shape}")
        if rx.shape[1] < self.lanes:
            fill = np.full((n, self.lanes - rx.shape[1]), np.nan)
            rx, tx, ber = (np.hstack([a, fill]) for a in (rx, tx, ber))
        rows = self._rows(ports)
        th = self.th
        self._cur[rows, 0], self._cur[rows, 1], self._cur[rows, 2] = rx, tx, ber
        # baseline: the first baseline_n readings of each port
        learning = self._nhist[rows] < th.baseline_n
        if learning.any():
            lr = rows[learning]
            self._hist[self._nhist[lr], lr, 0] = rx[learning]
            self._hist[self._nhist[lr], lr, 1] = tx[learning]
            self._nhist[lr] += 1
            done = lr[self._nhist[lr] == th.baseline_n]
            if done.size:
                h = self._hist[:, done]  # (nb, d, 2, lanes)
                med = np.median(h, axis=0)
                self._base[done] = med
                self._noise[done] = 1.4826 * np.median(np.abs(h[:, :, 0] - med[None, :, 0]), axis=0)
        base = self._base[rows]
        with np.errstate(invalid="ignore"):
            tx_drop = base[:, 1] - tx
            rx_drop = base[:, 0] - rx
            peer = self._peer[rows]
            has_peer = peer >= 0
            explained = np.zeros_like(rx_drop)
            if has_peer.any():
                pr = peer[has_peer]
                ptx = self._base[pr, 1] - self._cur[pr, 1]
                explained[has_peer] = np.clip(np.nan_to_num(ptx, nan=0.0), 0.0, None)
            own_rx = rx_drop - np.minimum(explained, np.clip(np.nan_to_num(rx_drop, nan=0.0), 0.0, None))
            drop = np.fmax(tx_drop, own_rx)
            bad_power = drop >= th.drop_db
            # a BER rise that comes with an rx drop the far end's transmitter explains is the
            # far end's problem (flagged there by its own tx drop), not this module's
            far = (explained >= th.drop_db) & (explained >= np.nan_to_num(own_rx, nan=0.0))
            bad_ber = (ber >= th.ber_fraction * th.ber_limit) & ~far
            bad = np.stack([bad_power | bad_ber, rx < th.rx_low_dbm])  # (2, n, lanes)
        out: list[Finding] = []
        for kind in (_DEGRADING, _RX_LOW):
            b = bad[kind]
            run = self._run[kind]
            prev = run[rows]
            self._start[kind, rows] = np.where(b & (prev == 0), ts_ns, self._start[kind, rows])
            cur = np.where(b, prev + 1, 0)
            run[rows] = cur
            port_bad = (cur >= th.k).any(axis=1)
            any_bad = b.any(axis=1)
            clean = self._clean[kind]
            clean[rows] = np.where(any_bad, 0, clean[rows] + 1)
            is_open = self._open[kind]
            is_open[rows[clean[rows] >= th.k]] = False
            fire = np.flatnonzero(port_bad & ~is_open[rows])
            for i in fire.tolist():
                r = int(rows[i])
                is_open[r] = True
                out.append(self._finding(kind, r, ts_ns, cur[i], drop[i], tx_drop[i], own_rx[i],
                                         explained[i], rx[i], tx[i], ber[i]))
        return out

    # ------------------------------------------------------------------ output
    def _finding(self, kind: int, r: int, ts_ns: int, run: I64, drop: F64, tx_drop: F64, own_rx: F64,
                 explained: F64, rx: F64, tx: F64, ber: F64) -> Finding:
        th = self.th
        port = self.ports[r]
        lanes = np.flatnonzero(run >= th.k)
        start = int(self._start[kind, r, lanes].min())
        ev: list[str] = []
        details: dict[str, float | int | str] = {}
        score = 0.0
        if kind == _RX_LOW:
            lane = int(lanes[np.nanargmin(rx[lanes])])
            ev.append(f"{port} lane {lane}: rx {rx[lane]:.2f} dBm < low warning {th.rx_low_dbm:.2f} dBm "
                      f"for {int(run[lane])} readings")
            details = {"lane": lane, "metric": "rx_power_dbm", "current": float(rx[lane]),
                       "threshold": th.rx_low_dbm, "baseline": float(self._base[r, 0, lane])}
            score = min(0.99, 0.6 + 0.1 * (th.rx_low_dbm - float(rx[lane])))
        else:
            dl = np.where(np.isnan(drop[lanes]), -np.inf, drop[lanes])
            lane = int(lanes[int(np.argmax(dl))])
            d = float(drop[lane])
            if np.isfinite(d) and d >= th.drop_db:
                own_tx = bool(tx_drop[lane] >= own_rx[lane])
                metric = "tx_power_dbm" if own_tx else "rx_power_dbm"
                m = 1 if own_tx else 0
                base = float(self._base[r, m, lane])
                cur = float((tx if own_tx else rx)[lane])
                line = (f"{port} lane {lane}: {metric[:2]} {cur:.2f} dBm, baseline {base:.2f} dBm: "
                        f"down {d:.2f} dB >= {th.drop_db:.2f} dB for {int(run[lane])} readings")
                if not own_tx and explained[lane] > 0:
                    line += f" ({explained[lane]:.2f} dB of the rx drop is the far end's tx, not counted)"
                ev.append(line)
                noise = float(self._noise[r, lane])
                z = d / max(noise if np.isfinite(noise) else 0.0, th.noise_floor_db)
                score = z / (z + 5.0)
                details = {"lane": lane, "metric": metric, "baseline": base, "current": cur,
                           "drop_db": d, "threshold": th.drop_db, "noise_db": noise,
                           "explained_by_peer_db": float(explained[lane])}
            limit = th.ber_fraction * th.ber_limit
            if np.nanmax(np.where(np.isnan(ber[lanes]), -np.inf, ber[lanes])) >= limit:
                bl = int(lanes[int(np.nanargmax(np.where(np.isnan(ber[lanes]), -np.inf, ber[lanes])))])
                ev.append(f"{port} lane {bl}: pre-FEC BER {ber[bl]:.2e} >= {limit:.2e} "
                          f"({th.ber_fraction:g} of the KP4 limit {th.ber_limit:.1e})")
                details.setdefault("lane", bl)
                details.setdefault("metric", "pre_fec_ber")
                details["pre_fec_ber"] = float(ber[bl])
                details["ber_threshold"] = limit
                score = max(score, min(0.99, 0.6 + 0.3 * float(np.log10(ber[bl] / limit) + 1) / 2))
        return Finding(_KINDS[kind], port, float(score), (start, ts_ns), tuple(ev), _ACTIONS[kind], details)
