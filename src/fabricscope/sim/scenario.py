"""A what-if scenario: topology + workload + load-balancing schemes + faults + seeds, and its run.

A scenario comes from a YAML file or from command-line flags; both go through
:func:`parse_scenario`, and :func:`prepare` builds the fabric, checks every fault subject and
builds every workload *before* anything runs, so a corrupt scenario is rejected up front with
the file, the field and the value named. YAML vocabulary::

    name: uplink-what-if
    topology:                     # a builder and its parameters ...
      kind: rail-optimized        #   leaf-spine | fat-tree | rail-optimized | multi-plane | dual-tor
      params: {servers: 16}
      # file: cluster.yaml        # ... or an inventory file (fabricscope topo build -o)
    workload: {kind: permutation, size: 2MiB}    # see fabricscope.sim.workload
    lb: [ecmp, spray, dlb]        # one or several of ecmp random spray flowlet dlb stripe
    hash: {function: crc32, seed: 0, per_switch_seed: true}
    faults:
      - {kind: link-down, link: "leaf-p0-r0-00~spine-p0-00"}
      - {kind: link-degraded, link: "leaf-p0-r1-00:eth9", factor: 0.25, start: 50us}
      - {kind: gray-loss, link: "leaf-p0-r0-01~spine-p0-01", loss: 0.01}   # transport runs only
    compare_healthy: true         # also run every scheme without the faults
    seeds: [0, 1]                 # workload seeds (placement, permutation) and random LB
    flowlet_bytes: 256KiB

A link is named by its cable id ``a:eth1|b:eth2``, one direction ``a:eth1->b:eth2``, one of
its ports ``a:eth1`` or its two devices ``a~b`` (the first cable between them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fabricscope.fabric.hashing import HASH_FUNCTIONS, HashConfig
from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.model.errors import ConfigError, FabricscopeError
from fabricscope.model.yamlfile import read_yaml
from fabricscope.sim.engine import Progress, simulate
from fabricscope.sim.faults import Fault
from fabricscope.sim.flows import Workload
from fabricscope.sim.loadbalance import SCHEMES, Scheme, check_scheme
from fabricscope.sim.results import SimResult

if TYPE_CHECKING:
    from fabricscope.sim.transport import TransportConfig
    from fabricscope.sim.transport.results import TransportResult

_TOP_KEYS = frozenset({
    "name", "topology", "workload", "lb", "hash", "faults", "compare_healthy", "seeds", "seed",
    "flowlet_bytes", "batch_rtol",
})
_FAULT_KINDS = ("link-down", "link-degraded", "gray-loss")


@dataclass(frozen=True)
class FaultSpec:
    """A link fault as written by the user (resolved against the fabric by :func:`prepare`)."""

    kind: str
    link: str
    factor: float = 1.0
    start_ns: int = 0
    end_ns: int | None = None
    where: str = "faults[0]"


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (not yet built)."""

    name: str
    topology_kind: str | None
    topology_params: Mapping[str, object]
    topology_file: str | None
    workload: Mapping[str, object]
    schemes: tuple[Scheme, ...]
    hash: HashConfig
    faults: tuple[FaultSpec, ...]
    compare_healthy: bool
    seeds: tuple[int, ...]
    flowlet_bytes: float
    batch_rtol: float
    source: str = "<scenario>"


@dataclass(frozen=True)
class Prepared:
    """A scenario with its fabric built, faults resolved and workloads built (one per seed)."""

    scenario: Scenario
    fabric: Fabric
    faults: tuple[Fault, ...]
    workloads: Mapping[int, Workload]


@dataclass(frozen=True)
class Run:
    """One simulation of a scenario: a scheme, a case (healthy or faulted) and a seed."""

    scheme: str
    case: str
    seed: int
    result: SimResult
    # A ring steady-state workload (``steady_state: true``): the whole collective's time and
    # busbw predicted from the step's max-min rates at t = 0 (``ring_time_from_rates``).
    ring_s: float | None = None
    ring_busbw_Bps: float | None = None

    @property
    def label(self) -> str:
        return self.scheme if self.case == "healthy" else f"{self.scheme} ({self.case})"


@dataclass(frozen=True)
class ScenarioResult:
    """Every run of a scenario, and the comparison table over seeds."""

    scenario: Scenario
    fabric: Fabric
    runs: tuple[Run, ...]
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def labels(self) -> list[str]:
        out: list[str] = []
        for r in self.runs:
            if r.label not in out:
                out.append(r.label)
        return out

    def table(self) -> list[dict[str, object]]:
        """One row per (scheme, case): FCT statistics and completion, averaged over seeds.

        With several seeds every averaged number ``x`` also has ``x_sd``, its sample standard
        deviation over the seeds (one seed: no spread, no ``_sd`` keys).
        """
        rows: list[dict[str, object]] = []
        for label in self.labels():
            rs = [r.result for r in self.runs if r.label == label]
            stats = [x.fct_stats_us() for x in rs]
            row: dict[str, object] = {"scheme": label, "seeds": len(rs), "flows": int(rs[0].flow_ids.shape[0])}
            for key, values in (
                ("fct_mean_us", [s["mean"] for s in stats]),
                ("fct_p50_us", [s["p50"] for s in stats]),
                ("fct_p99_us", [s["p99"] for s in stats]),
                ("fct_max_us", [s["max"] for s in stats]),
                ("completion_us", [x.completion_ns / 1e3 for x in rs]),
            ):
                _put(row, key, values)
            row["unroutable"] = sum(len(x.unroutable) + len(x.blocked) for x in rs)
            row["wall_s"] = round(sum(x.wall_s for x in rs), 3)
            if rs[0].collective != "none" and rs[0].collective_bytes > 0:
                _put(row, "busbw_GBps", [x.busbw_Bps / 1e9 for x in rs])
            rings = [r for r in self.runs if r.label == label and r.ring_s is not None]
            if rings and len(rings) == len(rs):
                _put(row, "ring_ms", [float(r.ring_s or 0.0) * 1e3 for r in rings])
                _put(row, "busbw_GBps", [float(r.ring_busbw_Bps or 0.0) / 1e9 for r in rings])
            rows.append(row)
        return rows

    def seed_values(self, label: str, key: str = "fct_p99_us") -> dict[int, float]:
        """Per seed, one statistic of one row (``fct_p99_us``, ``fct_mean_us``, ``completion_us``...)."""
        out: dict[int, float] = {}
        for r in self.runs:
            if r.label != label:
                continue
            if key == "completion_us":
                out[r.seed] = r.result.completion_ns / 1e3
            elif key == "ring_ms":
                out[r.seed] = float("nan") if r.ring_s is None else r.ring_s * 1e3
            else:
                out[r.seed] = r.result.fct_stats_us()[key.removeprefix("fct_").removesuffix("_us")]
        return out

    def difference(self, a: str, b: str, key: str = "fct_p99_us") -> Difference:
        """``b`` minus ``a`` for one statistic, paired over the seeds both rows ran."""
        va, vb = self.seed_values(a, key), self.seed_values(b, key)
        seeds = [s for s in va if s in vb]
        return paired_difference(a, b, key, [va[s] for s in seeds], [vb[s] for s in seeds])

    def comparisons(self, key: str = "fct_p99_us") -> list[Difference]:
        """The differences a reader looks at: every scheme against the first one in the same
        case, and every faulted row against its healthy row."""
        out: list[Difference] = []
        labels = self.labels()
        schemes = list(self.scenario.schemes)
        for case in ("", " (faults)"):
            here = [f"{s}{case}" for s in schemes if f"{s}{case}" in labels]
            out.extend(self.difference(here[0], x, key) for x in here[1:])
        out.extend(self.difference(s, f"{s} (faults)", key) for s in schemes
                   if s in labels and f"{s} (faults)" in labels)
        return out

    def to_dict(self) -> dict[str, object]:
        sc = self.scenario
        return {
            "scenario": sc.name,
            "source": sc.source,
            "fabric": self.fabric.name,
            "nics": len(self.fabric.nics),
            "workload": dict(sc.workload),
            "faults": [
                {"kind": f.kind, "link": f.subject, "start_ns": f.start_ns, "end_ns": f.end_ns,
                 **dict(f.params)} for f in self.faults
            ],
            "table": self.table(),
            "comparisons": [d.to_dict() for d in self.comparisons()],
            "runs": [
                {"scheme": r.scheme, "case": r.case, "seed": r.seed, **r.result.summary(),
                 **({"ring_ms": r.ring_s * 1e3, "ring_busbw_GBps": (r.ring_busbw_Bps or 0.0) / 1e9}
                    if r.ring_s is not None else {})}
                for r in self.runs
            ],
        }


def _mean(values: Any) -> float:
    v = [float(x) for x in values]
    return round(float(np.mean(v)), 3) if v else float("nan")


def _put(row: dict[str, object], key: str, values: Sequence[float]) -> None:
    row[key] = _mean(values)
    if len(values) > 1:
        row[f"{key}_sd"] = round(float(np.std(np.asarray(values, dtype=np.float64), ddof=1)), 3)


@dataclass(frozen=True, slots=True)
class Difference:
    """``b - a`` of one statistic over paired seeds, with its 95 % confidence interval.

    ``verdict`` is ``"lower"`` / ``"higher"`` (``b`` against ``a``) only when the interval
    excludes zero; ``"within seed spread"`` when it does not; ``"one seed"`` when there is no
    spread to judge by (a single seed's difference can be hash or placement luck).
    """

    a: str
    b: str
    key: str
    seeds: int
    mean: float
    ci95: float | None  # half-width (Student t over the paired differences); None: one seed

    @property
    def verdict(self) -> str:
        if self.ci95 is None or not np.isfinite(self.mean):
            return "one seed"
        if abs(self.mean) <= self.ci95:
            return "within seed spread"
        return "lower" if self.mean < 0 else "higher"

    def text(self, unit: str = "us") -> str:
        base = f"{self.b} vs {self.a}: {self.mean:+,.1f} {unit}"
        if self.ci95 is None:
            return f"{base} (one seed: no spread to judge it by; give several --seed)"
        spread = f"95% CI ±{self.ci95:,.1f} over {self.seeds} seeds"
        if self.verdict == "within seed spread":
            return f"{base} ({spread}): within seed spread, not a difference"
        return f"{base} ({spread}): {self.b} {self.verdict}"

    def to_dict(self) -> dict[str, object]:
        return {"a": self.a, "b": self.b, "key": self.key, "seeds": self.seeds,
                "mean_diff": round(self.mean, 3),
                "ci95": None if self.ci95 is None else round(self.ci95, 3), "verdict": self.verdict}


def paired_difference(a: str, b: str, key: str, va: Sequence[float], vb: Sequence[float]) -> Difference:
    """Mean of ``vb - va`` over paired seeds and the half-width of its 95 % t interval."""
    d = np.asarray(vb, dtype=np.float64) - np.asarray(va, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.shape[0] == 0:
        return Difference(a, b, key, 0, float("nan"), None)
    if d.shape[0] == 1:
        return Difference(a, b, key, 1, float(d[0]), None)
    from scipy import stats

    half = float(stats.t.ppf(0.975, d.shape[0] - 1) * d.std(ddof=1) / np.sqrt(d.shape[0]))
    return Difference(a, b, key, int(d.shape[0]), float(d.mean()), half)


# ---------------------------------------------------------------------- parsing
def _err(source: str, field_: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: {field_}: {msg}")


def _size(value: object, field_: str, source: str) -> float:
    from fabricscope.sim.workload import parse_size

    return parse_size(value, field=field_, source=source)


def _duration(value: object, field_: str, source: str) -> int:
    from fabricscope.sim.workload import parse_duration_ns

    return parse_duration_ns(value, field=field_, source=source)


def _factor(value: object, field_: str, source: str) -> float:
    """A degradation factor: 0.25, "0.25" or "25%" (capacity kept), in (0, 1]."""
    try:
        if isinstance(value, str) and value.strip().endswith("%"):
            f = float(value.strip()[:-1]) / 100.0
        elif isinstance(value, bool):
            raise ValueError
        else:
            f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _err(source, field_, f"expected a fraction like 0.25 or '25%', got {value!r}") from None
    if not 0 < f <= 1:
        raise _err(source, field_, f"must be in (0, 1] (capacity that remains), got {value!r}")
    return f


def parse_scenario(data: object, *, source: str = "<scenario>") -> Scenario:
    """Validate a scenario mapping (as loaded from YAML). Errors name source, field, value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with topology, workload and lb, got {type(data).__name__}")
    for k in data:
        if k not in _TOP_KEYS:
            raise _err(source, str(k), f"unknown key (value {data[k]!r}); known: {', '.join(sorted(_TOP_KEYS))}")
    name = data.get("name", "scenario")
    if not isinstance(name, str):
        raise _err(source, "name", f"expected a string, got {name!r}")
    # topology
    topo = data.get("topology")
    if not isinstance(topo, Mapping):
        raise _err(source, "topology", f"expected a mapping with kind+params or file, got {topo!r}")
    for k in topo:
        if k not in ("kind", "params", "file"):
            raise _err(source, f"topology.{k}", "unknown key (use kind, params or file)")
    kind, tfile = topo.get("kind"), topo.get("file")
    if (kind is None) == (tfile is None):
        raise _err(source, "topology", "give exactly one of kind (a builder) or file (an inventory)")
    if kind is not None and not isinstance(kind, str):
        raise _err(source, "topology.kind", f"expected a string, got {kind!r}")
    if tfile is not None and not isinstance(tfile, str):
        raise _err(source, "topology.file", f"expected a path, got {tfile!r}")
    params = topo.get("params") or {}
    if not isinstance(params, Mapping):
        raise _err(source, "topology.params", f"expected a mapping, got {params!r}")
    if tfile is not None and source not in ("<flags>", "<scenario>") and not Path(tfile).is_absolute():
        tfile = str(Path(source).parent / tfile)  # relative to the scenario file
    # workload
    wl = data.get("workload")
    if not isinstance(wl, Mapping) or "kind" not in wl:
        raise _err(source, "workload", f"expected a mapping with a kind (e.g. {{kind: permutation, size: 2MiB}}), got {wl!r}")
    # schemes
    lb = data.get("lb", ["ecmp"])
    lbs = [x.strip() for x in lb.split(",")] if isinstance(lb, str) else lb
    if not isinstance(lbs, list) or not lbs:
        raise _err(source, "lb", f"expected a scheme or a list of schemes, got {lb!r}")
    schemes = tuple(check_scheme(str(x), source=f"{source}: lb") for x in lbs)
    # hash
    h = data.get("hash") or {}
    if not isinstance(h, Mapping):
        raise _err(source, "hash", f"expected a mapping, got {h!r}")
    for k in h:
        if k not in ("function", "seed", "per_switch_seed"):
            raise _err(source, f"hash.{k}", "unknown key (use function, seed, per_switch_seed)")
    fn = h.get("function", "crc32")
    if fn not in HASH_FUNCTIONS:
        raise _err(source, "hash.function", f"unknown {fn!r}; choose one of {', '.join(HASH_FUNCTIONS)}")
    hseed = h.get("seed", 0)
    if isinstance(hseed, bool) or not isinstance(hseed, int):
        raise _err(source, "hash.seed", f"expected an integer, got {hseed!r}")
    pss = h.get("per_switch_seed", True)
    if not isinstance(pss, bool):
        raise _err(source, "hash.per_switch_seed", f"expected true or false, got {pss!r}")
    hc = HashConfig(function=fn, seed=hseed, per_switch_seed=pss)
    # faults
    raw_faults = data.get("faults") or []
    if not isinstance(raw_faults, list):
        raise _err(source, "faults", f"expected a list, got {raw_faults!r}")
    faults: list[FaultSpec] = []
    for i, f in enumerate(raw_faults):
        where = f"faults[{i}]"
        if not isinstance(f, Mapping):
            raise _err(source, where, f"expected a mapping with kind and link, got {f!r}")
        for k in f:
            if k not in ("kind", "link", "factor", "loss", "start", "end"):
                raise _err(source, f"{where}.{k}", "unknown key (use kind, link, factor, loss, start, end)")
        fk = f.get("kind")
        if fk not in _FAULT_KINDS:
            raise _err(source, f"{where}.kind", f"unknown {fk!r}; the flow engine models {', '.join(_FAULT_KINDS)}")
        link = f.get("link")
        if not isinstance(link, str) or not link:
            raise _err(source, f"{where}.link", f"expected a link name, got {link!r}")
        factor = 1.0
        if fk == "link-degraded":
            if "factor" not in f:
                raise _err(source, f"{where}.factor", "missing (capacity that remains, e.g. 0.25)")
            factor = _factor(f["factor"], f"{where}.factor", source)
        if fk == "gray-loss":  # the fraction of frames the link corrupts, kept in ``factor``
            if "loss" not in f:
                raise _err(source, f"{where}.loss", "missing (fraction of frames corrupted, e.g. 0.01)")
            factor = _loss(f["loss"], f"{where}.loss", source)
        start = _duration(f["start"], f"{where}.start", source) if f.get("start") is not None else 0
        end = _duration(f["end"], f"{where}.end", source) if f.get("end") is not None else None
        if end is not None and end <= start:
            raise _err(source, f"{where}.end", f"must be after start ({start} ns), got {f['end']!r}")
        faults.append(FaultSpec(str(fk), link, factor, start, end, where))
    ch = data.get("compare_healthy", bool(faults))
    if not isinstance(ch, bool):
        raise _err(source, "compare_healthy", f"expected true or false, got {ch!r}")
    # seeds
    seeds_raw = data.get("seeds", [data.get("seed", 0)])
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds_raw = [seeds_raw]
    if not isinstance(seeds_raw, list) or not seeds_raw or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in seeds_raw
    ):
        raise _err(source, "seeds", f"expected a list of integers, got {seeds_raw!r}")
    for s in seeds_raw:
        if not 0 <= s < 2**63:  # numpy's generators take non-negative seeds only
            raise _err(source, "seeds", f"a seed must be a non-negative integer, got {s!r}")
    if len(set(seeds_raw)) != len(seeds_raw):
        dup = next(s for s in seeds_raw if seeds_raw.count(s) > 1)
        raise _err(source, "seeds", f"seed {dup} is given twice (a repeated seed is the same run)")
    fb = _size(data.get("flowlet_bytes", 256 * 1024), "flowlet_bytes", source)
    rtol = data.get("batch_rtol", 1e-9)
    if isinstance(rtol, str):  # PyYAML (YAML 1.1) reads `1e-9` (no dot) as a string
        with contextlib.suppress(ValueError):
            rtol = float(rtol)
    if isinstance(rtol, bool) or not isinstance(rtol, int | float) or not 0 <= rtol < 0.1:
        raise _err(source, "batch_rtol", f"expected a number in [0, 0.1), got {rtol!r}")
    return Scenario(
        name=name, topology_kind=kind, topology_params=dict(params), topology_file=tfile,
        workload=dict(wl), schemes=schemes, hash=hc, faults=tuple(faults), compare_healthy=ch,
        seeds=tuple(int(s) for s in seeds_raw), flowlet_bytes=fb, batch_rtol=float(rtol),
        source=source,
    )


def read_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    p = Path(path)
    return parse_scenario(read_yaml(p, what="scenario"), source=str(p))


def _scalar(text: str) -> object:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_kv_spec(text: str, *, field_: str, source: str = "<flags>") -> tuple[str, dict[str, object]]:
    """``"kind:key=value,key=value"`` (or spaces) -> (kind, {key: value}); numbers become numbers."""
    head, _, rest = text.partition(":")
    kind = head.strip()
    if not kind:
        raise _err(source, field_, f"expected KIND[:KEY=VALUE,...], got {text!r}")
    out: dict[str, object] = {}
    for item in rest.replace(",", " ").split():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise _err(source, field_, f"expected KEY=VALUE after {kind!r}, got {item!r}")
        out[k.replace("-", "_") if field_ == "--workload" else k] = _scalar(v)
    return kind, out


def scenario_from_flags(
    *,
    topo: str,
    workload: str,
    lb: str = "ecmp",
    fail: Sequence[str] = (),
    degrade: Sequence[str] = (),
    corrupt: Sequence[str] = (),
    seeds: Sequence[int] = (0,),
    hash_function: str = "crc32",
    per_switch_seed: bool = True,
    compare_healthy: bool | None = None,
    name: str = "cli",
) -> Scenario:
    """The scenario that ``fabricscope sim --topo ... --workload ... --lb ...`` describes.

    ``topo`` is ``KIND[:K=V,...]`` or an inventory file; ``workload`` is ``KIND[:K=V,...]``;
    ``degrade`` items are ``LINK=FACTOR`` (``LINK=0.25`` or ``LINK=25%``), ``corrupt`` items
    ``LINK=LOSS`` (gray-loss: the fraction of frames the link corrupts; transport runs only).
    """
    src = "<flags>"
    data: dict[str, object] = {"name": name}
    if Path(topo).suffix.lower() in (".yaml", ".yml", ".json") or Path(topo).is_file():
        data["topology"] = {"file": topo}
    else:
        from fabricscope.fabric.catalog import parse_fabric_spec

        kind, params = parse_fabric_spec(topo, source=f"{src}: --topo")
        data["topology"] = {"kind": kind, "params": params}
    wkind, wparams = parse_kv_spec(workload, field_="--workload", source=src)
    data["workload"] = {"kind": wkind, **wparams}
    data["lb"] = lb
    data["hash"] = {"function": hash_function, "per_switch_seed": per_switch_seed}
    data["faults"] = _flag_faults(fail, degrade, corrupt)
    if compare_healthy is not None:
        data["compare_healthy"] = compare_healthy
    data["seeds"] = list(seeds)
    return parse_scenario(data, source=src)


def _loss(v: object, where: str, source: str) -> float:
    try:
        x = float(str(v).strip().removesuffix("%")) / (100.0 if str(v).strip().endswith("%") else 1.0)
    except ValueError:
        raise _err(source, where, f"expected a fraction in [0, 1) (0.01 or 1%), got {v!r}") from None
    if not 0 <= x < 1:
        raise _err(source, where, f"expected a fraction in [0, 1) (0.01 or 1%), got {v!r}")
    return x


def _flag_faults(fail: Sequence[str], degrade: Sequence[str],
                 corrupt: Sequence[str] = ()) -> list[dict[str, object]]:
    faults: list[dict[str, object]] = [{"kind": "link-down", "link": x} for x in fail]
    for c in corrupt:
        link, sep, loss = c.rpartition("=")
        if not sep or not link:
            raise _err("<flags>", "--corrupt", f"expected LINK=LOSS (e.g. leaf-000~spine-00=0.01), got {c!r}")
        faults.append({"kind": "gray-loss", "link": link, "loss": loss})
    for d in degrade:
        link, sep, factor = d.rpartition("=")
        if not sep or not link:
            raise _err("<flags>", "--degrade", f"expected LINK=FACTOR (e.g. leaf-000~spine-00=0.25), got {d!r}")
        faults.append({"kind": "link-degraded", "link": link, "factor": factor})
    return faults


def scenario_to_dict(sc: Scenario) -> dict[str, object]:
    """The YAML-shaped mapping of a scenario (``parse_scenario`` of it gives it back)."""
    topo: dict[str, object] = (
        {"file": sc.topology_file} if sc.topology_file is not None
        else {"kind": sc.topology_kind, "params": dict(sc.topology_params)}
    )
    faults: list[dict[str, object]] = []
    for f in sc.faults:
        d: dict[str, object] = {"kind": f.kind, "link": f.link}
        if f.kind == "link-degraded":
            d["factor"] = f.factor
        if f.kind == "gray-loss":
            d["loss"] = f.factor
        if f.start_ns:
            d["start"] = f.start_ns
        if f.end_ns is not None:
            d["end"] = f.end_ns
        faults.append(d)
    return {
        "name": sc.name, "topology": topo, "workload": dict(sc.workload), "lb": list(sc.schemes),
        "hash": {"function": sc.hash.function, "seed": sc.hash.seed, "per_switch_seed": sc.hash.per_switch_seed},
        "faults": faults, "compare_healthy": sc.compare_healthy, "seeds": list(sc.seeds),
        "flowlet_bytes": sc.flowlet_bytes, "batch_rtol": sc.batch_rtol,
    }


def with_overrides(
    sc: Scenario,
    *,
    lb: str | None = None,
    seeds: Sequence[int] = (),
    fail: Sequence[str] = (),
    degrade: Sequence[str] = (),
    corrupt: Sequence[str] = (),
    hash_function: str | None = None,
    polarized: bool = False,
) -> Scenario:
    """A scenario with command-line overrides: schemes, seeds and the hash replaced, faults added."""
    d = scenario_to_dict(sc)
    if lb is not None:
        d["lb"] = lb
    if hash_function is not None or polarized:
        h = dict(d["hash"])  # type: ignore[call-overload]
        if hash_function is not None:
            h["function"] = hash_function
        if polarized:
            h["per_switch_seed"] = False
        d["hash"] = h
    if seeds:
        d["seeds"] = list(seeds)
    extra = _flag_faults(fail, degrade, corrupt)
    if extra:
        d["faults"] = [*d["faults"], *extra]  # type: ignore[misc]
        d["compare_healthy"] = True
    if sc.topology_file is not None:
        d["topology"] = {"file": str(Path(sc.topology_file).resolve())}
    return parse_scenario(d, source=sc.source)


# ---------------------------------------------------------------------- building
def resolve_link(fabric: Fabric, name: str, *, where: str = "link") -> str:
    """The cable id (``a|b``) or direction (``a->b``) a user's link name means.

    Accepted: ``a:eth1|b:eth2``, ``a:eth1->b:eth2``, a port ``a:eth1``, or ``devA~devB``.
    """
    if "->" in name or "|" in name:
        try:
            fabric.edge_index(name.replace("|", "->"))
        except FabricscopeError:
            raise ConfigError(f"{where}: no link {name!r} in fabric {fabric.name!r}") from None
        return name
    if "~" in name:
        a, _, b = name.partition("~")
        for ln in fabric.links:
            ends = {port_device(ln.a), port_device(ln.b)}
            if ends == {a.strip(), b.strip()}:
                return ln.id
        raise ConfigError(f"{where}: no cable between {a!r} and {b!r} in fabric {fabric.name!r}")
    cable = fabric.link_of_port.get(name)
    if cable is None:
        hint = ""
        if name in fabric.devices:
            ports = [p for p in fabric.ports_of.get(name, ()) if p in fabric.link_of_port][:4]
            hint = f" ({name!r} is a device; name one of its ports, e.g. {', '.join(ports)}, or 'devA~devB')"
        raise ConfigError(f"{where}: no cabled port or link {name!r} in fabric {fabric.name!r}{hint}")
    return cable.id


def uplinks(fabric: Fabric) -> list[str]:
    """Cable ids between a leaf and a switch above it, in id order (what-if candidates)."""
    out = []
    for ln in fabric.links:
        roles = {fabric.devices[port_device(ln.a)].role, fabric.devices[port_device(ln.b)].role}
        if "leaf" in roles and roles & {"spine", "core"}:
            out.append(ln.id)
    return sorted(out)


MAX_FLOWS = 2_000_000
"""Above this many flows per seed :func:`prepare` refuses unless ``max_flows=None``: building
and running the event-driven DAG takes hours there (8.4M flows for a 256 MiB ring all-reduce
on 2,048 GPUs), while ``steady_state: true`` answers a ring's time and busbw in seconds."""


def steady_state_hint(workload: Mapping[str, object]) -> str:
    """What to say when a workload is big: the ring's steady state, if it applies."""
    ring = workload.get("kind") in ("allreduce", "allgather", "reducescatter") and workload.get(
        "algorithm", "ring") == "ring"
    if ring and not workload.get("steady_state"):
        return ("steady_state=true answers the ring's completion time and busbw in seconds "
                "(one step's max-min rates, docs/workloads.md)")
    return "a smaller size of fabric or ranks= answers faster"


def estimate(scenario: Scenario, fabric: Fabric) -> int | None:
    """Flows per seed the scenario's workload will build (``None``: not known up front)."""
    from fabricscope.sim.workload import estimate_flows

    return estimate_flows(fabric, scenario.workload, seed=scenario.seeds[0], source=scenario.source)


def prepare(
    scenario: Scenario,
    *,
    max_flows: int | None = MAX_FLOWS,
    progress: Callable[[str], None] | None = None,
) -> Prepared:
    """Build the fabric, resolve faults and build every seed's workload, or fail clearly.

    ``max_flows``: refuse (before building anything big) a workload estimated above it;
    ``None`` lifts the limit. ``progress(text)`` hears each step that can take seconds.
    """
    src = scenario.source
    say = progress or (lambda _text: None)
    if scenario.topology_file is not None:
        from fabricscope.fabric.io import read_fabric

        say(f"reading {scenario.topology_file}")
        fabric = read_fabric(scenario.topology_file)
    else:
        from fabricscope.fabric.catalog import build_fabric

        assert scenario.topology_kind is not None
        say(f"building the {scenario.topology_kind} fabric")
        fabric = build_fabric(scenario.topology_kind, scenario.topology_params, source=f"{src}: topology.params")
    faults: list[Fault] = []
    for fs in scenario.faults:
        link = resolve_link(fabric, fs.link, where=f"{src}: {fs.where}.link")
        params = ({"factor": fs.factor} if fs.kind == "link-degraded"
                  else {"loss": fs.factor} if fs.kind == "gray-loss" else {})
        faults.append(Fault(fs.kind, link, fs.start_ns, fs.end_ns, params))  # type: ignore[arg-type]
    if "stripe" in scenario.schemes:
        _check_planes(fabric, src)
    n_est = estimate(scenario, fabric)
    if max_flows is not None and n_est is not None and n_est > max_flows:
        raise _err(
            src, "workload",
            f"{scenario.workload.get('kind')} on this fabric builds about {n_est:,} flows per seed "
            f"(limit {max_flows:,}; hours of work): {steady_state_hint(scenario.workload)}, "
            "or pass --force to run it anyway",
        )
    from fabricscope.sim.workload import workload_from_spec

    workloads: dict[int, Workload] = {}
    for k, s in enumerate(scenario.seeds):
        est = f"~{n_est:,} flows" if n_est is not None else "flows"
        say(f"building the workload ({est}), seed {s} ({k + 1} of {len(scenario.seeds)})")
        workloads[s] = workload_from_spec(fabric, scenario.workload, seed=s, source=src, where="workload")
    return Prepared(scenario, fabric, tuple(faults), workloads)


def _check_planes(fabric: Fabric, source: str) -> None:
    """``stripe`` splits a flow over its NIC's planes: on a fabric whose NICs all have one
    uplink it is ECMP under another name, so asking for it is a mistake worth a clear line."""
    ix = fabric.index
    uplinks_per_nic = np.bincount(
        ix.src[(~ix.is_switch[ix.src]) & ix.is_switch[ix.dst]], minlength=ix.n_nodes
    )
    if not (uplinks_per_nic > 1).any():
        raise _err(
            source, "lb",
            f"stripe needs NICs with several uplinks (planes); every NIC of fabric {fabric.name!r} "
            "has one (use a multi-plane or dual-tor fabric, or ecmp/spray/dlb)",
        )


def run_scenario(
    scenario: Scenario | Prepared,
    *,
    progress: Callable[[str], Progress] | None = None,
    record_utilization: bool = True,
    transport: TransportConfig | None = None,
    on_transport: Callable[[str, int, TransportResult], None] | None = None,
) -> ScenarioResult:
    """Run every (scheme, case, seed) of a scenario. ``progress(label)`` may return a
    per-run callback ``(finished, total)`` for a progress bar. With ``transport`` every run
    goes through the fluid transport engine (:mod:`fabricscope.sim.transport`) instead of
    the ideal max-min engine; its counters are in each result's ``meta``. With
    ``on_transport`` too, each run is watched (``simulate_transport(watch=True)``: the same
    results, plus queue traces and first pauses) and handed over as ``(label, seed,
    TransportResult)`` as soon as it ends, so a caller can reduce it before the next."""
    prep = scenario if isinstance(scenario, Prepared) else prepare(scenario)
    sc = prep.scenario
    cases: list[tuple[str, tuple[Fault, ...]]] = []
    if not prep.faults or sc.compare_healthy:
        cases.append(("healthy", ()))
    if prep.faults:
        cases.append(("faults", prep.faults))
    runs: list[Run] = []
    for case, faults in cases:
        for scheme in sc.schemes:
            for seed in sc.seeds:
                label = scheme if case == "healthy" else f"{scheme} ({case})"
                cb = progress(f"{label} seed {seed}") if progress is not None else None
                if transport is not None:
                    from fabricscope.sim.transport import simulate_transport

                    tres = simulate_transport(
                        prep.fabric, prep.workloads[seed], config=transport, lb=scheme,
                        hash_config=sc.hash, faults=faults, seed=seed, progress=cb,
                        watch=on_transport is not None,
                    )
                    if on_transport is not None:
                        on_transport(label, seed, tres)
                    runs.append(Run(scheme, case, seed, tres.sim))
                    continue
                res = simulate(
                    prep.fabric, prep.workloads[seed], lb=scheme, hash_config=sc.hash,
                    faults=faults, seed=seed, flowlet_bytes=sc.flowlet_bytes,
                    batch_rtol=sc.batch_rtol, record_utilization=record_utilization, progress=cb,
                )
                ring_s, ring_bw = _ring_estimate(prep, seed, scheme, faults, res)
                runs.append(Run(scheme, case, seed, res, ring_s, ring_bw))
    return ScenarioResult(sc, prep.fabric, tuple(runs), prep.faults)


def _ring_estimate(
    prep: Prepared, seed: int, scheme: str, faults: tuple[Fault, ...], res: SimResult
) -> tuple[float | None, float | None]:
    """Collective time and busbw of a ring steady-state workload (else ``(None, None)``):
    the step's max-min rates at t = 0 and its path latencies, as the benchmarks use them."""
    w = prep.workloads[seed]
    if not w.meta.get("steady_state") or res.unroutable or not res.done.all():
        return None, None
    from fabricscope.sim.engine import steady_state_rates
    from fabricscope.sim.workload import (
        path_latency_s,
        ring_busbw_from_rates,
        ring_time_from_rates,
    )

    sc = prep.scenario
    st = steady_state_rates(prep.fabric, w, lb=scheme, hash_config=sc.hash, faults=faults, seed=seed)
    lat = path_latency_s(prep.fabric, w, hash_config=sc.hash)  # hop count is the same on any Clos path
    return (ring_time_from_rates(w, st.rates_bps, latency_s=lat),
            ring_busbw_from_rates(w, st.rates_bps, latency_s=lat))


__all__ = [
    "MAX_FLOWS",
    "SCHEMES",
    "Difference",
    "FaultSpec",
    "Prepared",
    "Run",
    "Scenario",
    "ScenarioResult",
    "estimate",
    "paired_difference",
    "parse_kv_spec",
    "parse_scenario",
    "prepare",
    "read_scenario",
    "resolve_link",
    "run_scenario",
    "scenario_from_flags",
    "scenario_to_dict",
    "steady_state_hint",
    "uplinks",
    "with_overrides",
]
