"""Build a Workload from a small dict / YAML vocabulary (what scenario files and the CLI use).

Vocabulary (every key but ``kind`` optional unless marked; sizes take units: ``2MiB``,
``32MB``, ``256KiB``, bytes as a number; durations: ``10us``, ``1.5ms``, ns as a number)::

    kind: allreduce | allgather | reducescatter | alltoall      # GPU collectives
          permutation | incast | nic-all-to-all | flows | job   # NIC traffic, jobs
          poisson                                        # open-loop flow-size traffic
    name: label for results

    # collectives
    size: per-rank buffer S (required; nccl-tests meaning)
    ranks: number of ranks (default: every GPU of the fabric)
    placement: in-order | random | rail-aware      (default in-order)
    ranks_per_host: for rail-aware placement
    algorithm: ring | tree                         (allreduce only; default ring)
    channels: rings / trees in parallel            (default: NICs per server when rail_aligned)
    rail_aligned: true | false                     (default true: NCCL rail-local rings / PXN)
    ring_order: host | rank                        (default host: NCCL topology-aware ring)
    steady_state: true | false                     (ring only: one step's flows, see docs)
    chunks: pipeline chunks per tree               (tree only; default 8)

    # permutation / nic-all-to-all: size (per flow / per pair)
    # incast: size, senders (count or list of NIC ids, required), receiver (NIC id)
    # flows:  file (CSV or JSON with src,dst,size[,start]) or flows (inline list)
    # job:    dp (required), tp, pp, microbatches, grad_size, activation_size,
    #         fwd_compute, bwd_compute, dp_collective (allreduce | reducescatter), channels
    # poisson: cdf (websearch | fb_hadoop | a 'SIZE PERCENT' file; default websearch),
    #          load (fraction of each host's link rate, 0.5 or 50%; required),
    #          duration (arrivals in [0, duration]; required)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.flows import Workload
from fabricscope.sim.workload.collectives import all_to_all, ring_collective, ring_steady_state
from fabricscope.sim.workload.jobs import JobSpec, job_iteration
from fabricscope.sim.workload.placement import PLACEMENT_POLICIES, place_ranks
from fabricscope.sim.workload.poisson import (
    FlowSizeCdf,
    expected_flows,
    load_cdf,
    poisson_workload,
)
from fabricscope.sim.workload.traffic import (
    all_to_all_matrix,
    incast,
    parse_flow_rows,
    permutation,
    read_flow_list,
)
from fabricscope.sim.workload.trees import tree_allreduce
from fabricscope.sim.workload.units import parse_duration_ns, parse_size

_COLLECTIVE_KEYS = {"kind", "name", "size", "ranks", "placement", "ranks_per_host"}
KEYS: dict[str, frozenset[str]] = {
    "allreduce": frozenset(_COLLECTIVE_KEYS | {"algorithm", "channels", "rail_aligned",
                                               "ring_order", "steady_state", "chunks"}),
    "allgather": frozenset(_COLLECTIVE_KEYS | {"channels", "rail_aligned", "ring_order",
                                               "steady_state"}),
    "reducescatter": frozenset(_COLLECTIVE_KEYS | {"channels", "rail_aligned", "ring_order",
                                                   "steady_state"}),
    "alltoall": frozenset(_COLLECTIVE_KEYS | {"rail_aligned"}),
    "permutation": frozenset({"kind", "name", "size"}),
    "nic-all-to-all": frozenset({"kind", "name", "size"}),
    "incast": frozenset({"kind", "name", "size", "senders", "receiver"}),
    "flows": frozenset({"kind", "name", "file", "flows"}),
    "job": frozenset({"kind", "name", "dp", "tp", "pp", "microbatches", "grad_size",
                      "activation_size", "fwd_compute", "bwd_compute", "dp_collective",
                      "channels"}),
    "poisson": frozenset({"kind", "name", "cdf", "load", "duration"}),
}
KINDS: tuple[str, ...] = tuple(KEYS)


class _Spec:
    """Typed access to a spec mapping; every error names ``source``, the field and the value."""

    def __init__(self, spec: Mapping[str, object], source: str, where: str) -> None:
        self.d = spec
        self.source = source
        self.where = where

    def err(self, key: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.where}.{key}: {msg}")

    def has(self, key: str) -> bool:
        return self.d.get(key) is not None

    def size(self, key: str, default: float | None = None) -> float:
        if not self.has(key):
            if default is None:
                raise self.err(key, "missing (a size like '32MiB')")
            return default
        return parse_size(self.d[key], field=f"{self.where}.{key}", source=self.source)

    def duration(self, key: str) -> int:
        if not self.has(key):
            return 0
        return parse_duration_ns(self.d[key], field=f"{self.where}.{key}", source=self.source)

    def int_(self, key: str, default: int | None = None, *, minimum: int = 1) -> int | None:
        v = self.d.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.err(key, f"expected an integer >= {minimum}, got {v!r}")
        return v

    def req_int(self, key: str, default: int | None = None) -> int:
        v = self.int_(key, default)
        if v is None:
            raise self.err(key, "missing (an integer >= 1)")
        return v

    def bool_(self, key: str, default: bool) -> bool:
        v = self.d.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.err(key, f"expected true or false, got {v!r}")
        return v

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        v = self.d.get(key)
        if v is None:
            return default
        if v not in choices:
            raise self.err(key, f"unknown {v!r} (choose one of {', '.join(choices)})")
        assert isinstance(v, str)
        return v

    def str_(self, key: str) -> str | None:
        v = self.d.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.err(key, f"expected a string, got {v!r}")
        return v


def workload_from_spec(
    fabric: Fabric,
    spec: Mapping[str, object],
    *,
    seed: int = 0,
    source: str = "<spec>",
    where: str = "workload",
) -> Workload:
    """Build the workload ``spec`` describes on ``fabric`` (vocabulary in the module docstring).

    ``seed`` drives random placement, permutations and incast sender choice. Unknown keys or
    values raise :class:`ConfigError` naming ``source``, ``where.<field>`` and the value.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{source}: {where}: expected a mapping with 'kind', got {spec!r}")
    s = _Spec(spec, source, where)
    kind = spec.get("kind")
    if kind is None:
        raise s.err("kind", f"missing (one of {', '.join(KINDS)})")
    if kind not in KEYS:
        raise s.err("kind", f"unknown {kind!r} (choose one of {', '.join(KINDS)})")
    assert isinstance(kind, str)
    for k in spec:
        if k not in KEYS[kind]:
            raise s.err(str(k), f"unknown key for kind {kind!r} (value {spec[k]!r}; allowed: "
                                f"{', '.join(sorted(KEYS[kind]))})")
    name = s.str_("name")
    if kind in ("allreduce", "allgather", "reducescatter", "alltoall"):
        return _collective(fabric, s, kind, name, seed)
    if kind == "permutation":
        return permutation(fabric, s.size("size"), seed=seed, name=name)
    if kind == "nic-all-to-all":
        return all_to_all_matrix(fabric, s.size("size"), name=name)
    if kind == "incast":
        return _incast(fabric, s, name, seed)
    if kind == "flows":
        return _flows(fabric, s, name)
    if kind == "poisson":
        return _poisson(fabric, s, name, seed)
    return _job(fabric, s, name)


def estimate_flows(
    fabric: Fabric, spec: Mapping[str, object], *, seed: int = 0, source: str = "<spec>",
    where: str = "workload",
) -> int | None:
    """How many flows :func:`workload_from_spec` would build, without building them.

    Cheap (a placement at most), so a command can refuse or warn before minutes of work;
    ``None`` when the count is not known up front (``job``, ``flows`` from a file). Ring
    collectives: ``steps x channels x fabric hops``; tree: ``channels x 4 x chunks x
    (servers - 1)``; alltoall: pairs on different hosts.
    """
    s = _Spec(spec, source, where)
    kind = spec.get("kind")
    n_nics = len(fabric.nics)
    if kind in ("permutation",):
        return n_nics
    if kind == "nic-all-to-all":
        return n_nics * (n_nics - 1)
    if kind == "incast":
        v = spec.get("senders")
        return len(v) if isinstance(v, list) else v if isinstance(v, int) and not isinstance(v, bool) else None
    if kind == "flows":
        v = spec.get("flows")
        return len(v) if isinstance(v, list) else None
    if kind == "poisson":
        cdf, load, duration = _poisson_params(s)
        return math.ceil(expected_flows(fabric, cdf, load=load, duration_ns=duration))
    if kind not in ("allreduce", "allgather", "reducescatter", "alltoall"):
        return None
    from fabricscope.sim.workload.collectives import (
        cross_hops,
        default_channels,
        ring_order,
        ring_steps,
    )

    pl = place_ranks(fabric, s.int_("ranks", None, minimum=2), policy=s.choice("placement", PLACEMENT_POLICIES, "in-order"),
                     seed=seed, ranks_per_host=s.int_("ranks_per_host"))
    rail = s.bool_("rail_aligned", True)
    n = pl.n_ranks
    if kind == "alltoall":
        per_host: dict[str, int] = {}
        for slot in pl.slots:
            per_host[slot.host] = per_host.get(slot.host, 0) + 1
        return n * n - sum(c * c for c in per_host.values())
    ch = s.int_("channels") or default_channels(pl, rail)
    if s.choice("algorithm", ("ring", "tree"), "ring") == "tree":
        return ch * 4 * (s.int_("chunks", 8) or 8) * max(len(pl.hosts) - 1, 0)
    hops = len(cross_hops(pl, ring_order(pl, s.choice("ring_order", ("host", "rank"), "host"))))
    steps = 1 if s.bool_("steady_state", False) else ring_steps(kind, n)
    return steps * ch * hops


def _collective(fabric: Fabric, s: _Spec, kind: str, name: str | None, seed: int) -> Workload:
    size = s.size("size")
    policy = s.choice("placement", PLACEMENT_POLICIES, "in-order")
    pl = place_ranks(fabric, s.int_("ranks", None, minimum=2), policy=policy, seed=seed,
                     ranks_per_host=s.int_("ranks_per_host"))
    rail = s.bool_("rail_aligned", True)
    if kind == "alltoall":
        return all_to_all(pl, size, rail_aligned=rail, name=name)
    channels = s.int_("channels")
    algorithm = s.choice("algorithm", ("ring", "tree"), "ring")
    if algorithm == "tree":
        for k in ("steady_state", "ring_order"):
            if s.has(k):
                raise s.err(k, f"only applies to algorithm 'ring', got {s.d[k]!r}")
        return tree_allreduce(pl, size, channels=channels, chunks=s.req_int("chunks", 8),
                              rail_aligned=rail, name=name)
    if s.has("chunks"):
        raise s.err("chunks", f"only applies to algorithm 'tree', got {s.d['chunks']!r}")
    order = s.choice("ring_order", ("host", "rank"), "host")
    build = ring_steady_state if s.bool_("steady_state", False) else ring_collective
    return build(pl, size, collective=kind, channels=channels, rail_aligned=rail, order=order,
                 name=name)


def _incast(fabric: Fabric, s: _Spec, name: str | None, seed: int) -> Workload:
    v = s.d.get("senders")
    if v is None:
        raise s.err("senders", "missing (a count or a list of NIC ids)")
    senders: int | list[str]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        senders = [str(x) for x in v]
    elif isinstance(v, int) and not isinstance(v, bool):
        senders = v
    else:
        raise s.err("senders", f"expected a count or a list of NIC ids, got {v!r}")
    return incast(fabric, s.size("size"), senders=senders, receiver=s.str_("receiver"),
                  seed=seed, name=name)


def _flows(fabric: Fabric, s: _Spec, name: str | None) -> Workload:
    path = s.str_("file")
    inline = s.d.get("flows")
    if (path is None) == (inline is None):
        raise s.err("file", "give exactly one of 'file' (CSV/JSON path) or 'flows' (a list)")
    if path is not None:
        return read_flow_list(fabric, path)
    if not isinstance(inline, list):
        raise s.err("flows", f"expected a list of {{src, dst, size[, start]}}, got {inline!r}")
    rows: list[tuple[str, Mapping[str, object]]] = []
    for i, item in enumerate(inline):
        if not isinstance(item, Mapping):
            raise s.err(f"flows[{i}]", f"expected a mapping with src, dst, size, got {item!r}")
        rows.append((f"{s.where}.flows[{i}]", item))
    return parse_flow_rows(fabric, rows, source=s.source, name=name)


def _poisson_params(s: _Spec) -> tuple[FlowSizeCdf, float, float]:
    cdf = load_cdf(s.str_("cdf") or "websearch", where=f"{s.source}: {s.where}.cdf")
    v = s.d.get("load")
    if v is None:
        raise s.err("load", "missing (a fraction of the host link rate, e.g. 0.5 or 50%)")
    load: float | None = None
    if isinstance(v, int | float) and not isinstance(v, bool):
        load = float(v)
    elif isinstance(v, str):
        try:
            load = float(v.strip().removesuffix("%")) / (100.0 if v.strip().endswith("%") else 1.0)
        except ValueError:
            load = None
    if load is None or not 0 < load <= 1:
        raise s.err("load", f"expected a fraction in (0, 1] of the host link rate (0.5 or 50%), got {v!r}")
    if not s.has("duration"):
        raise s.err("duration", "missing (a duration like '10ms')")
    duration = s.duration("duration")
    if duration <= 0:
        raise s.err("duration", f"must be > 0, got {s.d['duration']!r}")
    return cdf, load, float(duration)


def _poisson(fabric: Fabric, s: _Spec, name: str | None, seed: int) -> Workload:
    cdf, load, duration = _poisson_params(s)
    return poisson_workload(fabric, cdf, load=load, duration_ns=duration, seed=seed, name=name)


def _job(fabric: Fabric, s: _Spec, name: str | None) -> Workload:
    job = JobSpec(
        dp=s.req_int("dp"),
        tp=s.req_int("tp", 1),
        pp=s.req_int("pp", 1),
        microbatches=s.req_int("microbatches", 1),
        grad_bytes=s.size("grad_size", float(1 << 30)),
        activation_bytes=s.size("activation_size", float(16 << 20)),
        fwd_compute_ns=s.duration("fwd_compute"),
        bwd_compute_ns=s.duration("bwd_compute"),
        dp_collective=s.choice("dp_collective", ("allreduce", "reducescatter"), "allreduce"),
        channels=s.req_int("channels", 1),
    )
    return job_iteration(fabric, job, name=name)
