"""``--transport`` lines for the twin: run the transport engine, play the run into the counters.

A line is ``"PATTERN [key=value ...]"``, with times relative to the twin's start:

``incast``     ``senders`` NICs (default 8, drawn with ``seed``) each send ``size`` (default
               1MB) to ``receiver`` (default the first NIC); played once at ``start``, or every
               ``every`` (an inference batch, a training step) until ``end``.
``stuck-nic``  ``nic`` (default the first NIC) stops accepting and pauses its switch for good;
               ``senders`` NICs (default 2) send to it. One run lasts ``run`` (default 1ms) of
               fabric time and is played back to back (``every`` defaults to ``run``) from
               ``start`` to ``end``: a storm that holds while it lasts.

Common keys: ``cc`` (dcqcn, hpcc, nscc, eqds, none; default dcqcn), ``pfc`` (on / off; default
on), ``buffer`` (switch buffer, a size), ``seed``. The engine is
:class:`fabricscope.sim.transport.FluidTransport` (watched: every busy switch queue traced);
the replay, with each flow's INT-MD stack at its sink switch, is
:mod:`fabricscope.twin.transport_replay`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.transport import BufferConfig, FluidTransport, PfcConfig, TransportConfig
from fabricscope.sim.transport.config import CcName
from fabricscope.sim.transport.segments import main_path
from fabricscope.sim.workload.traffic import incast
from fabricscope.sim.workload.units import parse_duration_ns, parse_size
from fabricscope.twin.transport_replay import TransportEpisode

PATTERNS: tuple[str, ...] = ("incast", "stuck-nic")
CCS: tuple[str, ...] = ("dcqcn", "hpcc", "nscc", "eqds", "none")
_COMMON = frozenset({"start", "every", "end", "cc", "pfc", "buffer", "seed"})
_KEYS = {"incast": _COMMON | {"senders", "size", "receiver"},
         "stuck-nic": _COMMON | {"nic", "senders", "size", "run"}}


def _split(text: str, source: str) -> tuple[str, dict[str, str]]:
    parts = text.split()
    if not parts:
        raise ConfigError(f"{source}: empty; expected 'PATTERN [key=value ...]' with PATTERN one of "
                          f"{', '.join(PATTERNS)}")
    pattern = parts[0]
    if pattern not in _KEYS:
        raise ConfigError(f"{source}: {text!r}: unknown pattern {pattern!r}; choose from {', '.join(PATTERNS)}")
    kv: dict[str, str] = {}
    for item in parts[1:]:
        k, sep, v = item.partition("=")
        if not sep or not v:
            raise ConfigError(f"{source}: {text!r}: expected key=value, got {item!r}")
        if k not in _KEYS[pattern]:
            raise ConfigError(f"{source}: {text!r}: unknown key {k!r} for {pattern}; choose from "
                              f"{', '.join(sorted(_KEYS[pattern]))}")
        kv[k] = v
    return pattern, kv


def _nic(fabric: Fabric, value: str | None, key: str, where: str) -> str:
    nics = [n.id for n in fabric.nics]
    if not nics:
        raise ConfigError(f"{where}: the fabric has no NICs")
    if value is None:
        return nics[0]
    if value not in set(nics):
        raise ConfigError(f"{where}: {key}: {value!r} is not a NIC of {fabric.name!r} (e.g. {nics[0]!r})")
    return value


def _int(value: str, key: str, where: str, lo: int) -> int:
    try:
        out = int(value)
    except ValueError:
        raise ConfigError(f"{where}: {key}: expected an integer, got {value!r}") from None
    if out < lo:
        raise ConfigError(f"{where}: {key}: must be >= {lo}, got {out}")
    return out


def parse_transport(text: str, fabric: Fabric, *, t0_ns: int = 0, source: str = "--transport") -> TransportEpisode:
    """Run the engine for one ``--transport`` line on ``fabric`` and place it at ``t0_ns`` + start.

    >>> from fabricscope.fabric.builders import leaf_spine_fabric
    >>> ep = parse_transport("incast senders=4 size=200KB every=1s", leaf_spine_fabric(leaves=2, hosts_per_leaf=4))
    >>> ep.every_ns, ep.result.unfinished
    (1000000000, 0)
    """
    pattern, kv = _split(text, source)
    where = f"{source}: {text!r}"
    cc = kv.get("cc", "dcqcn")
    if cc not in CCS:
        raise ConfigError(f"{where}: cc: {cc!r} is not one of {', '.join(CCS)}")
    pfc = kv.get("pfc", "on")
    if pfc not in ("on", "off"):
        raise ConfigError(f"{where}: pfc: expected on or off, got {pfc!r}")
    seed = _int(kv.get("seed", "0"), "seed", where, 0)
    cfg = TransportConfig(cc=cast(CcName, cc), pfc=PfcConfig(enabled=pfc == "on"))
    if "buffer" in kv:
        cfg = replace(cfg, buffer=BufferConfig(size_bytes=parse_size(kv["buffer"], field="buffer", source=where)))
    start = t0_ns + parse_duration_ns(kv.get("start", "0"), field="start", source=where)
    end = t0_ns + parse_duration_ns(kv["end"], field="end", source=where) if "end" in kv else None
    stuck: list[str] = []
    if pattern == "incast":
        size = parse_size(kv.get("size", "1MB"), field="size", source=where)
        recv = _nic(fabric, kv.get("receiver"), "receiver", where)
        n = _int(kv.get("senders", "8"), "senders", where, 1)
        if n > len(fabric.nics) - 1:
            raise ConfigError(f"{where}: senders: {n} is more than the {len(fabric.nics) - 1} other NICs")
        w = incast(fabric, size, senders=n, receiver=recv, seed=seed)
        every = parse_duration_ns(kv["every"], field="every", source=where) if "every" in kv else None
    else:
        size = parse_size(kv.get("size", "50MB"), field="size", source=where)
        nic = _nic(fabric, kv.get("nic"), "nic", where)
        run_ns = parse_duration_ns(kv.get("run", "1ms"), field="run", source=where)
        if run_ns <= 0:
            raise ConfigError(f"{where}: run: must be > 0, got {kv.get('run')!r}")
        others = [x.id for x in fabric.nics if x.id != nic]
        n = _int(kv.get("senders", "2"), "senders", where, 1)
        if n > len(others):
            raise ConfigError(f"{where}: senders: {n} is more than the {len(others)} other NICs")
        step = max(1, len(others) // n)  # spread over the fabric: some cross the spines
        w = Workload(f"to-stuck-{nic}", tuple(FlowSpec(i, others[(i * step) % len(others)], nic, size)
                                              for i in range(n)))
        cfg = replace(cfg, max_time_ns=float(run_ns))
        stuck = [nic]
        every = parse_duration_ns(kv["every"], field="every", source=where) if "every" in kv else run_ns
    if end is not None and end < start:
        raise ConfigError(f"{where}: end: before start")
    try:
        cfg.validate()
        # watched: every busy switch queue is traced, so the flows' INT sinks have queues to report
        sim = FluidTransport(fabric, w, config=cfg, seed=seed, stuck_nics=stuck, watch=True)
        sim.advance_to(cfg.max_time_ns)
        paths = tuple(tuple(main_path(sim.segs, f)) for f in range(len(w.flows)))
        return TransportEpisode(sim.result(), start_ns=start, every_ns=every, until_ns=end, paths=paths)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class TransportTruth:
    """What a ``--transport`` line injected, for scoring a diagnosis (like a Fault's kind,
    subject and times): ``incast`` on the receiver's access port (the switch port facing it),
    ``stuck-nic`` on the stuck NIC's port (the one that sends the pauses)."""

    kind: str
    subject: str
    start_ns: int
    end_ns: int | None
    fault_type: str  # the knowledge base's fault id it should be named as


def transport_truth(text: str, fabric: Fabric, ep: TransportEpisode) -> TransportTruth:
    """The truth of one ``--transport`` line (already accepted by :func:`parse_transport`)."""
    pattern, kv = _split(text, "--transport")
    key = "receiver" if pattern == "incast" else "nic"
    nic = _nic(fabric, kv.get(key), key, "--transport")
    ports = [p for p in fabric.ports_of.get(nic, ()) if p in fabric.peer_port]
    if not ports:
        raise ConfigError(f"--transport: {text!r}: {key}: {nic!r} has no cabled port to score against")
    if pattern == "incast":
        subject, fault_type = fabric.peer_port[ports[0]], "incast-congestion"
    else:
        subject, fault_type = ports[0], "pfc-storm"
    return TransportTruth(pattern, subject, ep.start_ns, ep.until_ns, fault_type)


def describe(ep: TransportEpisode, t0_ns: int = 0) -> str:
    """One line: what one run did and when it is played."""
    r = ep.result
    t = r.stats.totals()
    when = f"from {(ep.start_ns - t0_ns) / 1e9:g} s"
    if ep.every_ns is not None:
        when += f", every {ep.every_ns / 1e6:g} ms"
    if ep.until_ns is not None:
        when += f", until {(ep.until_ns - t0_ns) / 1e9:g} s"
    unfinished = f", {r.unfinished} flows unfinished" if r.unfinished else ""
    return (f"{r.sim.workload_name} ({r.sim.meta.get('cc')}, pfc {'on' if r.sim.meta.get('pfc') else 'off'}): "
            f"{r.stats.sim_time_ns / 1e6:.3f} ms of fabric time per run{unfinished}; per run "
            f"{t['ecn_marks']:,.0f} ECN marks, {t['pause_frames']} XOFF, {t['drops_KB']:,.0f} KB dropped, "
            f"max queue {t['max_queue_KB']:,.0f} KB; played {when}")
