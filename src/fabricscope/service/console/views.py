"""What the twin's instruments saw, accumulated across segments into the console's views.

``fabricscope serve`` runs the closed loop's instruments segment by segment (the lead's
:mod:`fabricscope.service.console.twin_source`): for the segment ``(t0, t0 + segment]`` each
instrument runs a scenario whose own ``t = 0`` is at absolute simulated time
``offset_ns = t0 - warmup``. An instrument with an ``observer`` reports raw data in its spec
time (the payloads are documented on each instrument: ``telemetry`` / ``links`` from
:class:`~fabricscope.service.instruments.telemetry.TelemetryInstrument`, ``probes`` from
:class:`~fabricscope.service.instruments.probe.ProbeInstrument`, ``stragglers`` from
:class:`~fabricscope.service.instruments.straggler.StragglerInstrument`, ``optics`` from
:class:`~fabricscope.service.instruments.optics.OpticsInstrument`).
:meth:`TwinViews.observer` shifts them to absolute time and drops the warm-up (data at or
before ``keep_from_ns``: the same half-open interval the supervisor keeps findings in, so a
sample at a segment boundary is kept once); :meth:`TwinViews.publish` writes the views the
API serves (``ConsoleState.set_view``), in the bodies of the API contract less ``sim_ns``:

========================  ==============================================================
view                      body
========================  ==============================================================
``probes``                ``GET /probes/matrix``: ``{"window_s", "group", "nodes",
                          "loss": [[ratio|null]], "rtt_us": [[us|null]]}`` (row: source,
                          column: destination; grouped by NIC up to ``max_matrix_nodes``
                          NICs, else by host, else leaf, else pod)
``stragglers``            ``GET /stragglers``: ``{"job": {"ranks", "iterations"},
                          "ranks": [{"rank", "gpu"}], "windows": [{"t_ns", "values"}],
                          "findings": [observed JSON]}``
``optics``                ``GET /optics``: ``{"counts": {grade: n}, "ports": [{"port",
                          "grade", "rx_dbm", "tx_dbm", "temp_c", "lanes"}]}`` (worst lane's
                          power; worst grade first, at most ``max_optics_ports`` rows, the
                          counts cover every port)
``optics_history``        port -> ``GET /optics/{port}``: ``{"port", "t_ns": [...],
                          "lanes": [{"lane", "rx_dbm": [...], "tx_dbm": [...]}]}``
``overlay``               metric -> ``{link_id: value}``, only non-zero values, for
                          ``utilization`` (fraction of capacity), ``loss`` (ratio), ``pfc``
                          (pause frames/s), ``optics`` (worst :data:`GRADES` code of the
                          two ends) and ``state`` (1 = down)
``links``                 ``{"up", "down", "degraded"}``: cables counted by state
========================  ==============================================================

Bounds (memory does not grow with the run's length):

* probes: the chunks of the last analysis window (at most ``max_probe_chunks``), each one
  count per probed (source, destination) pair;
* stragglers: the last ``max_windows`` analysis windows of one value per rank;
* optics: the latest round; a ring of the last few rounds of every port, float32, at most
  ``recent_cells`` lane values (so a port that turns bad has its history from before); a
  history of ``history_samples`` rounds for at most ``max_history_ports`` ports: every port
  graded worse than good or whose grade changed in the last ``changed_keep_s``, worst
  first, plus the first ``other_history_ports`` good ones (a healthy reference);
* the ``optics`` body lists at most ``max_optics_ports`` ports (the worst);
* links: the latest interval's arrays, one value per cable;
* telemetry: rows go to the :class:`~fabricscope.store.telemetry.TelemetryStore`, rows
  older than ``telemetry_retention_s`` of simulated time before the newest are deleted.

Thread safety: one lock; the observer runs in the supervisor's thread, ``publish`` may run
in any thread. The store's DuckDB connection is used only from the observer's thread.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from fabricscope.diagnosis.serialize import observed_to_json
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import TelemetryEvent
from fabricscope.service.console.state import ConsoleState
from fabricscope.service.instruments.optics import GRADES
from fabricscope.store.telemetry import TelemetryStore

__all__ = ["GRADES", "LOSS_DEGRADED", "PFC_DEGRADED", "TwinViews", "matrix_groups"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
NS = 1_000_000_000
Observer = Callable[[str, object], None]

#: A cable is ``degraded`` (up, but not healthy) when it loses at least this fraction of
#: the packets sent over it in a telemetry interval (one in a million: RoCE's go-back-N
#: retransmission makes even that visible in tail latency) ...
LOSS_DEGRADED = 1e-6
#: ... or an end sends at least this many PFC pause frames per second, or an end's optic is
#: graded ``degrading`` or worse.
PFC_DEGRADED = 1.0


def matrix_groups(fabric: Fabric, max_nodes: int = 256) -> tuple[str, list[str], dict[str, int]]:
    """How the probe matrix groups NICs: (level, group names, NIC id -> group index).

    The finest of NIC, host, leaf (a NIC's first leaf) and pod with at most ``max_nodes``
    groups (256 x 256 cells are ~800 kB of JSON, measured on a 2,048-GPU twin); pod when
    none fits.
    """
    nics = fabric.nics
    leaves = fabric.leaves_of_nic

    def key(level: str, n: Any) -> str:
        if level == "nic":
            return str(n.id)
        if level == "host":
            return str(n.host or n.id)
        if level == "leaf":
            lv = leaves.get(n.id, ())
            return lv[0] if lv else str(n.host or n.id)
        return f"pod{n.pod if n.pod is not None else 0}"

    levels = ("nic", "host", "leaf", "pod")
    for level in levels:
        names = list(dict.fromkeys(key(level, n) for n in nics))
        if len(names) <= max_nodes or level == levels[-1]:
            pos = {g: i for i, g in enumerate(names)}
            return level, names, {n.id: pos[key(level, n)] for n in nics}
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class _ProbeChunk:
    t_ns: int  # absolute time the outcomes were known
    window_ns: int
    src: I64  # group indices
    dst: I64
    sent: I64
    lost: I64
    rtt_sum_us: F64  # sum over answered probes


class TwinViews:
    """Accumulates the instruments' observations into the console's views (module doc).

    Parameters
    ----------
    fabric:
        The twin's inventory (link ids, NICs, ports).
    telemetry_store:
        Where the telemetry events go (absolute simulated ``ts_ns``); None: not kept.
    max_matrix_nodes, max_windows, max_probe_chunks, history_samples, max_history_ports,
    other_history_ports, recent_cells, changed_keep_s, telemetry_retention_s,
    max_optics_ports:
        The bounds of the module doc.
    """

    def __init__(self, fabric: Fabric, *, telemetry_store: TelemetryStore | None = None,
                 max_matrix_nodes: int = 256, max_windows: int = 500,
                 max_probe_chunks: int = 128, history_samples: int = 500,
                 max_history_ports: int = 256, other_history_ports: int = 16,
                 recent_cells: int = 4_000_000, changed_keep_s: float = 3600.0,
                 telemetry_retention_s: float | None = 86_400.0,
                 max_optics_ports: int = 10_000) -> None:
        for name, v in (("max_matrix_nodes", max_matrix_nodes), ("max_windows", max_windows),
                        ("max_probe_chunks", max_probe_chunks),
                        ("history_samples", history_samples),
                        ("max_history_ports", max_history_ports),
                        ("recent_cells", recent_cells), ("max_optics_ports", max_optics_ports)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"console views: {name}: must be an integer >= 1, got {v!r}")
        if other_history_ports < 0 or other_history_ports > max_history_ports:
            raise ConfigError("console views: other_history_ports: must be in 0.."
                              f"{max_history_ports}, got {other_history_ports!r}")
        if telemetry_retention_s is not None and not telemetry_retention_s > 0:
            raise ConfigError("console views: telemetry_retention_s: must be > 0 or None, "
                              f"got {telemetry_retention_s!r}")
        self.fabric = fabric
        self.store = telemetry_store
        self.max_windows = max_windows
        self.max_probe_chunks = max_probe_chunks
        self.history_samples = history_samples
        self.max_history_ports = max_history_ports
        self.other_history_ports = other_history_ports
        self.recent_cells = recent_cells
        self.max_optics_ports = max_optics_ports
        self.changed_keep_ns = round(changed_keep_s * NS)
        self.retention_ns = None if telemetry_retention_s is None \
            else round(telemetry_retention_s * NS)
        self._lock = threading.Lock()
        self.link_ids: list[str] = [ln.id for ln in fabric.links]
        # probes
        self.group, self.group_names, self._group_of_nic = matrix_groups(fabric, max_matrix_nodes)
        self._node_group: tuple[Sequence[str], I64] | None = None
        self._chunks: deque[_ProbeChunk] = deque()
        # stragglers
        self._windows: deque[tuple[int, int, list[float | None]]] = deque(maxlen=max_windows)
        self._gpus: list[str] = []
        self._iterations = 0
        # per kind, the time after which new data is accepted (the latest kept, or the
        # keep_from of a segment that recomputes what came after it)
        self._accept_after: dict[str, int] = {}
        self._newest_row_ns = -(1 << 62)
        # links (latest telemetry interval)
        self._links: dict[str, Any] | None = None
        # optics
        self._optics: dict[str, Any] | None = None
        self._ports: Sequence[str] = ()
        self._grade_prev: npt.NDArray[np.int8] | None = None
        self._changed_ns: I64 = np.zeros(0, dtype=np.int64)
        self._ring_t: deque[int] = deque()
        self._ring: deque[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]] = deque()
        self._hist: dict[str, deque[tuple[int, npt.NDArray[np.float32],
                                          npt.NDArray[np.float32]]]] = {}
        self._hist_json: dict[str, dict[str, Any]] = {}
        # telemetry
        self._oldest_ns = 1 << 62  # oldest row written (after pruning)
        # telemetry_rows: rows of the store written here and not deleted (pruned, rewound)
        self.stats: dict[str, int] = {"telemetry_rows": 0, "telemetry_pruned": 0,
                                      "dropped_warmup": 0}

    # -- input ------------------------------------------------------------------------------
    def observer(self, offset_ns: int, keep_from_ns: int) -> Observer:
        """The observer to install on the instruments for one segment.

        Spec times are shifted by ``offset_ns`` (the spec's ``t = 0`` in absolute simulated
        time); data at absolute times ``<= keep_from_ns`` (the warm-up, already seen in the
        previous segment) is dropped. Pass ``keep_from_ns = t0`` for a segment
        ``(t0, t0 + segment]``.
        """
        off, keep = int(offset_ns), int(keep_from_ns)
        seen: set[str] = set()

        def observe(kind: str, payload: object) -> None:
            if kind not in seen:  # this segment recomputes everything of ``kind`` after keep
                seen.add(kind)
                with self._lock:
                    self._rewind(kind, keep)
            if kind == "telemetry":
                self._on_telemetry(cast(Sequence[TelemetryEvent], payload), off, keep)
                return
            p = cast(Mapping[str, Any], payload)
            t = int(p["t_ns"]) + off
            if t <= keep:
                self.stats["dropped_warmup"] += 1
                return
            with self._lock:
                if t <= self._accept_after.get(kind, -(1 << 62)):
                    return
                self._accept_after[kind] = t
                if kind == "links":
                    self._on_links(p, t)
                elif kind == "probes":
                    self._on_probes(p, t)
                elif kind == "stragglers":
                    self._on_stragglers(p, t)
                elif kind == "optics":
                    self._on_optics(p, t)
        return observe

    def _rewind(self, kind: str, keep: int) -> None:
        """Forget what ``kind`` observed after ``keep`` (a segment recomputes it, e.g. after a
        fault was injected at ``keep``); a latest-value view is kept until replaced."""
        if kind in self._accept_after:
            self._accept_after[kind] = min(self._accept_after[kind], keep)
        if kind == "telemetry" and self.store is not None and self._newest_row_ns > keep:
            rows = self.store.con.execute("DELETE FROM telemetry WHERE ts_ns > ?",
                                          [keep]).fetchall()
            self.stats["telemetry_rows"] -= int(rows[0][0]) if rows else 0
            self._newest_row_ns = keep
        elif kind == "probes":
            while self._chunks and self._chunks[-1].t_ns > keep:
                self._chunks.pop()
        elif kind == "stragglers":
            while self._windows and self._windows[-1][0] > keep:
                self._iterations -= self._windows.pop()[1]
        elif kind == "optics":
            while self._ring_t and self._ring_t[-1] > keep:
                self._ring_t.pop()
                self._ring.pop()
            for h in self._hist.values():
                while h and h[-1][0] > keep:
                    h.pop()
            self._hist_json.clear()

    def _on_telemetry(self, events: Sequence[TelemetryEvent], off: int, keep: int) -> None:
        store = self.store
        if store is None or not events:
            return
        table = store.events_table(events)
        ts = pc.add(table.column("ts_ns"), pa.scalar(off, pa.int64()))
        table = table.set_column(0, "ts_ns", ts)
        table = table.filter(pc.greater(ts, pa.scalar(keep, pa.int64())))
        if table.num_rows == 0:
            self.stats["dropped_warmup"] += 1
            return
        store.write_table(table)
        self.stats["telemetry_rows"] += table.num_rows
        lo, hi = pc.min_max(table.column("ts_ns")).values()
        self._oldest_ns = min(self._oldest_ns, int(lo.as_py()))
        self._newest_row_ns = max(self._newest_row_ns, int(hi.as_py()))
        if self.retention_ns is None:
            return
        cutoff = int(hi.as_py()) - self.retention_ns
        # prune a tenth of the retention at a time: one DELETE per step, not per sample
        if cutoff - self._oldest_ns >= self.retention_ns // 10:
            rows = store.con.execute("DELETE FROM telemetry WHERE ts_ns < ?", [cutoff]).fetchall()
            n = int(rows[0][0]) if rows else 0
            self.stats["telemetry_pruned"] += n
            self.stats["telemetry_rows"] -= n
            self._oldest_ns = cutoff

    def _on_links(self, p: Mapping[str, Any], t: int) -> None:
        self._links = {"t_ns": t, "utilization": np.asarray(p["utilization"]),
                       "loss": np.asarray(p["loss"]), "pfc": np.asarray(p["pfc"]),
                       "up": np.asarray(p["up"], dtype=bool)}

    def _node_groups(self, nodes: Sequence[str]) -> I64:
        hit = self._node_group
        if hit is not None and hit[0] is nodes:
            return hit[1]
        g = np.array([self._group_of_nic.get(n, -1) for n in nodes], dtype=np.int64)
        self._node_group = (nodes, g)
        return g

    def _on_probes(self, p: Mapping[str, Any], t: int) -> None:
        groups = self._node_groups(p["nodes"])
        src, dst = groups[np.asarray(p["src"])], groups[np.asarray(p["dst"])]
        keep = (src >= 0) & (dst >= 0)
        sent = np.asarray(p["sent"], dtype=np.int64)
        lost = np.asarray(p["lost"], dtype=np.int64)
        rtt = np.nan_to_num(np.asarray(p["rtt_us"], dtype=np.float64), nan=0.0)
        self._chunks.append(_ProbeChunk(t, int(p["window_ns"]), src[keep], dst[keep],
                                        sent[keep], lost[keep], (rtt * (sent - lost))[keep]))
        self._prune_chunks()

    def _prune_chunks(self) -> None:
        chunks = self._chunks
        if not chunks:
            return
        newest = max(c.t_ns for c in chunks)
        window = chunks[-1].window_ns
        while chunks and (chunks[0].t_ns <= newest - window
                          or len(chunks) > self.max_probe_chunks):
            chunks.popleft()

    def _on_stragglers(self, p: Mapping[str, Any], t: int) -> None:
        gpus = list(p["gpus"])
        if gpus != self._gpus:  # another job: its windows are not comparable
            self._windows.clear()
            self._gpus = gpus
            self._iterations = 0
        a, b = p["iterations"]
        vals = [None if not math.isfinite(v) else round(v, 4)
                for v in np.asarray(p["slowdown"], dtype=np.float64).tolist()]
        if len(self._windows) == self._windows.maxlen:
            self._iterations -= self._windows[0][1]
        self._windows.append((t, int(b) - int(a), vals))
        self._iterations += int(b) - int(a)

    def _on_optics(self, p: Mapping[str, Any], t: int) -> None:
        ports: Sequence[str] = p["ports"]
        grade = np.asarray(p["grade"], dtype=np.int8)
        rx = np.asarray(p["rx_dbm"], dtype=np.float64)
        tx = np.asarray(p["tx_dbm"], dtype=np.float64)
        if tuple(ports) != tuple(self._ports):
            self._ports = tuple(ports)
            self._grade_prev = None
            self._changed_ns = np.full(len(ports), -(1 << 62), dtype=np.int64)
            self._ring.clear()
            self._ring_t.clear()
            self._hist.clear()
            self._hist_json.clear()
        if self._grade_prev is not None:
            self._changed_ns[grade != self._grade_prev] = t
        self._grade_prev = grade
        self._optics = {"t_ns": t, "grade": grade, "rx": rx, "tx": tx,
                        "temp": np.asarray(p["temp_c"], dtype=np.float64)}
        rx32, tx32 = rx.astype(np.float32), tx.astype(np.float32)
        depth = max(1, min(self.history_samples, self.recent_cells // max(rx.size, 1)))
        self._ring.append((rx32, tx32))
        self._ring_t.append(t)
        while len(self._ring) > depth:
            self._ring.popleft()
            self._ring_t.popleft()
        self._track(t, grade, rx32, tx32)

    def _track(self, t: int, grade: npt.NDArray[np.int8], rx: npt.NDArray[np.float32],
               tx: npt.NDArray[np.float32]) -> None:
        """Keep the history of the ports worth a plot (module doc), back-filled from the ring."""
        n = len(self._ports)
        recent = self._changed_ns >= t - self.changed_keep_ns
        notable = np.flatnonzero((grade > 0) | recent)
        # worst grade first, then the most recent change
        order = np.lexsort((-self._changed_ns[notable], -grade[notable].astype(np.int64)))
        chosen = notable[order][: self.max_history_ports - self.other_history_ports].tolist()
        taken = set(chosen)
        others = [i for i in range(min(n, self.other_history_ports + len(taken)))
                  if i not in taken][: self.other_history_ports]
        keep = {self._ports[i]: i for i in chosen + others}
        for port in [p for p in self._hist if p not in keep]:
            del self._hist[port]
            self._hist_json.pop(port, None)
        for port, i in keep.items():
            h = self._hist.get(port)
            if h is None:  # newly tracked: its recent past from the ring
                h = self._hist[port] = deque(maxlen=self.history_samples)
                for ts, (r, x) in zip(self._ring_t, self._ring, strict=True):
                    h.append((ts, r[i].copy(), x[i].copy()))
            else:
                h.append((t, rx[i].copy(), tx[i].copy()))
            self._hist_json.pop(port, None)

    # -- output -----------------------------------------------------------------------------
    def probes_view(self) -> dict[str, Any] | None:
        """The probe matrix body, or None before any probe."""
        with self._lock:
            chunks = list(self._chunks)
        if not chunks:
            return None
        g = len(self.group_names)
        sent = np.zeros((g, g), dtype=np.int64)
        lost = np.zeros((g, g), dtype=np.int64)
        rtt = np.zeros((g, g))
        for c in chunks:
            np.add.at(sent, (c.src, c.dst), c.sent)
            np.add.at(lost, (c.src, c.dst), c.lost)
            np.add.at(rtt, (c.src, c.dst), c.rtt_sum_us)
        ok = sent - lost
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = np.where(sent > 0, lost / np.maximum(sent, 1), np.nan)
            mean = np.where(ok > 0, rtt / np.maximum(ok, 1), np.nan)
        return {"window_s": chunks[-1].window_ns / NS, "group": self.group,
                "nodes": list(self.group_names), "loss": _rows(loss, 6),
                "rtt_us": _rows(mean, 2)}

    def stragglers_view(self, state: ConsoleState | None = None) -> dict[str, Any] | None:
        """The straggler body (its findings from ``state``), or None before any window."""
        with self._lock:
            if not self._gpus:
                return None
            windows = [{"t_ns": t, "values": v} for t, _, v in self._windows]
            body = {"job": {"ranks": len(self._gpus), "iterations": self._iterations},
                    "ranks": [{"rank": r, "gpu": gpu} for r, gpu in enumerate(self._gpus)],
                    "windows": windows}
        found = state.findings(source="straggler", limit=50) if state is not None else []
        body["findings"] = [observed_to_json(o) for o in found]
        return body

    def optics_view(self) -> dict[str, Any] | None:
        """The optics fleet body, or None before any DOM round."""
        with self._lock:
            o = self._optics
            ports = self._ports
        if o is None:
            return None
        grade, rx, tx, temp = o["grade"], o["rx"], o["tx"], o["temp"]
        counts = {name: int((grade == i).sum()) for i, name in enumerate(GRADES)}
        with np.errstate(invalid="ignore"):
            rx_min = np.nanmin(np.where(np.isnan(rx), np.inf, rx), axis=1)
            tx_min = np.nanmin(np.where(np.isnan(tx), np.inf, tx), axis=1)
        lanes = (~np.isnan(rx)).sum(axis=1)
        order = np.lexsort((np.arange(len(ports)), -grade.astype(np.int64)))
        order = order[: self.max_optics_ports]
        rows = [{"port": ports[i], "grade": GRADES[int(grade[i])],
                 "rx_dbm": _num(rx_min[i], 2), "tx_dbm": _num(tx_min[i], 2),
                 "temp_c": _num(temp[i], 1), "lanes": int(lanes[i])} for i in order.tolist()]
        return {"counts": counts, "ports": rows}

    def optics_history_view(self) -> dict[str, dict[str, Any]] | None:
        """Port -> per-lane series of the tracked ports, or None before any DOM round."""
        with self._lock:
            if self._optics is None:
                return None
            out: dict[str, dict[str, Any]] = {}
            for port, h in self._hist.items():
                body = self._hist_json.get(port)
                if body is None:
                    t = [s[0] for s in h]
                    rx = np.array([s[1] for s in h], dtype=np.float64).reshape(len(h), -1)
                    tx = np.array([s[2] for s in h], dtype=np.float64).reshape(len(h), -1)
                    body = {"port": port, "t_ns": t, "lanes": [
                        {"lane": j, "rx_dbm": _series(rx[:, j]), "tx_dbm": _series(tx[:, j])}
                        for j in range(rx.shape[1]) if not np.isnan(rx[:, j]).all()]}
                    self._hist_json[port] = body
                out[port] = body
            return out

    def overlay_view(self) -> dict[str, dict[str, float]] | None:
        """Metric -> {link id: value} (non-zero only), or None before any data."""
        with self._lock:
            links, optics = self._links, self._optics
            ports = self._ports
        if links is None and optics is None:
            return None
        ids = self.link_ids
        out: dict[str, dict[str, float]] = {}
        if links is not None:
            for metric, digits in (("utilization", 4), ("loss", 6), ("pfc", 1)):
                v = links[metric]
                out[metric] = {ids[i]: round(float(v[i]), digits)
                               for i in np.flatnonzero(np.round(v, digits) > 0).tolist()}
            out["state"] = {ids[i]: 1 for i in np.flatnonzero(~links["up"]).tolist()}
        if optics is not None:
            worst = self._link_grades(ports, optics["grade"])
            out["optics"] = {ids[i]: int(worst[i]) for i in np.flatnonzero(worst > 0).tolist()}
        return out

    def _link_grades(self, ports: Sequence[str], grade: npt.NDArray[np.int8]) -> I64:
        by_port = dict(zip(ports, grade.tolist(), strict=True))
        return np.array([max(by_port.get(ln.a, 0), by_port.get(ln.b, 0))
                         for ln in self.fabric.links], dtype=np.int64)

    def links_view(self) -> dict[str, int] | None:
        """Cables counted by state (up / down / degraded), or None before any telemetry."""
        with self._lock:
            links, optics, ports = self._links, self._optics, self._ports
        if links is None:
            return None
        up = links["up"]
        bad = (links["loss"] >= LOSS_DEGRADED) | (links["pfc"] >= PFC_DEGRADED)
        if optics is not None:
            bad |= self._link_grades(ports, optics["grade"]) >= GRADES.index("degrading")
        return {"up": int((up & ~bad).sum()), "down": int((~up).sum()),
                "degraded": int((up & bad).sum())}

    def publish(self, state: ConsoleState) -> None:
        """Write every view that has data into ``state`` (``ConsoleState.set_view``)."""
        views: dict[str, Any] = {
            "probes": self.probes_view(), "stragglers": self.stragglers_view(state),
            "optics": self.optics_view(), "optics_history": self.optics_history_view(),
            "overlay": self.overlay_view(), "links": self.links_view(),
        }
        for name, body in views.items():
            if body is not None:
                state.set_view(name, body)


def _num(v: float, digits: int) -> float | None:
    return round(float(v), digits) if math.isfinite(v) else None


def _rows(a: F64, digits: int) -> list[list[float | None]]:
    """A matrix as JSON rows (NaN -> null)."""
    r = np.round(a, digits)
    return [[None if math.isnan(x) else x for x in row] for row in r.tolist()]


def _series(a: F64) -> list[float | None]:
    return [None if math.isnan(x) else x for x in np.round(a, 2).tolist()]
