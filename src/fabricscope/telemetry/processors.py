"""Event processors: small pure stages ``events -> events`` chosen by name in the collector config.

Modelled on gnmic's processor family (one interface, a name registry, typed options checked
before start). A processor may keep state across batches (previous counter values for
``rate``/``delta``, open windows for ``downsample``) but does no I/O and reads no clock: time
comes from the events themselves, so the same pipeline runs on simulated and wall time.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fabricscope.model.errors import ConfigError
from fabricscope.model.records import TelemetryEvent

__all__ = [
    "PROCESSORS",
    "Aggregate",
    "Delta",
    "Downsample",
    "Filter",
    "Pipeline",
    "Processor",
    "Rate",
    "Rename",
    "build_processor",
]

Events = Sequence[TelemetryEvent]


class Processor(Protocol):
    """A pipeline stage: a batch of events in, a batch out (in timestamp order per series)."""

    def __call__(self, events: Events) -> list[TelemetryEvent]: ...


SeriesKey = tuple[str, str, tuple[tuple[str, str], ...]]


def series_key(e: TelemetryEvent) -> SeriesKey:
    return (e.name, e.target, tuple(sorted(e.tags.items())))


def _matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Glob patterns (``*`` within and across elements) compiled into one regex."""
    if not patterns:
        return lambda _s: False
    rx = re.compile("|".join(fnmatch.translate(p) for p in patterns))
    return lambda s: rx.match(s) is not None


def _numeric(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class Filter:
    """Keep or drop events by name glob and/or tag values (``tags: {interface_name: "eth*"}``).

    ``action="keep"`` keeps matching events, ``"drop"`` drops them. An event matches when its
    name matches any of ``names`` (or ``names`` is empty) and every tag pattern matches.
    """

    def __init__(self, *, action: str = "keep", names: Sequence[str] = (), tags: Mapping[str, str] | None = None,
                 targets: Sequence[str] = ()) -> None:
        if action not in ("keep", "drop"):
            raise ConfigError(f"processor filter.action: expected keep|drop, got {action!r}")
        self.keep = action == "keep"
        self._name = _matcher(names) if names else (lambda _s: True)
        self._target = _matcher(targets) if targets else (lambda _s: True)
        self._tags = {k: _matcher([v]) for k, v in (tags or {}).items()}
        self._memo: dict[SeriesKey, bool] = {}

    def _hit(self, e: TelemetryEvent) -> bool:
        k = series_key(e)
        hit = self._memo.get(k)
        if hit is None:
            hit = self._name(e.name) and self._target(e.target) and all(
                m(e.tags.get(t, "")) for t, m in self._tags.items()
            )
            self._memo[k] = hit
        return hit

    def __call__(self, events: Events) -> list[TelemetryEvent]:
        return [e for e in events if self._hit(e) == self.keep]


class Rename:
    """Rename events whose name matches a regex (``re.sub`` semantics), e.g. OC -> short names."""

    def __init__(self, *, pattern: str, replacement: str) -> None:
        try:
            self._rx = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"processor rename.pattern: {pattern!r}: {exc}") from exc
        self._repl = replacement
        self._memo: dict[str, str] = {}

    def __call__(self, events: Events) -> list[TelemetryEvent]:
        out = []
        for e in events:
            n = self._memo.get(e.name)
            if n is None:
                n = self._rx.sub(self._repl, e.name)
                self._memo[e.name] = n
            out.append(e if n == e.name else TelemetryEvent(n, e.ts_ns, e.target, e.tags, e.value))
        return out


class Delta:
    """Counter -> increase since the previous sample of the same series (first sample dropped).

    A counter that goes backwards (device reboot / counter clear) restarts the series: the new
    value is taken as the increase from zero, as Prometheus' ``increase()`` does.
    Non-numeric events and names not matching ``names`` pass through unchanged.
    """

    suffix = ""

    def __init__(self, *, names: Sequence[str] = ("*",)) -> None:
        self._sel = _matcher(names)
        self._last: dict[SeriesKey, tuple[int, float]] = {}

    def _emit(self, e: TelemetryEvent, dv: float, dt_ns: int) -> TelemetryEvent | None:
        return TelemetryEvent(e.name, e.ts_ns, e.target, e.tags, dv)

    def __call__(self, events: Events) -> list[TelemetryEvent]:
        out: list[TelemetryEvent] = []
        last = self._last
        for e in events:
            if not _numeric(e.value) or not self._sel(e.name):
                out.append(e)
                continue
            k = series_key(e)
            v = float(e.value)
            prev = last.get(k)
            last[k] = (e.ts_ns, v)
            if prev is None or e.ts_ns <= prev[0]:
                continue
            dv = v - prev[1] if v >= prev[1] else v
            r = self._emit(e, dv, e.ts_ns - prev[0])
            if r is not None:
                out.append(r)
        return out


class Rate(Delta):
    """Counter -> per-second rate between consecutive samples; name and tags are kept."""

    def _emit(self, e: TelemetryEvent, dv: float, dt_ns: int) -> TelemetryEvent | None:
        return TelemetryEvent(e.name, e.ts_ns, e.target, e.tags, dv * 1e9 / dt_ns)


_AGG: Mapping[str, Callable[[list[float]], float]] = {
    "min": min,
    "max": max,
    "mean": lambda xs: sum(xs) / len(xs),
    "last": lambda xs: xs[-1],
    "sum": sum,
    "count": lambda xs: float(len(xs)),
}


class Downsample:
    """Down-sample numeric series into fixed windows (aligned to multiples of ``window_ns``).

    A window is emitted once an event of a later window arrives for the same series, stamped
    with the window end; ``funcs`` picks min/max/mean/last/sum/count, each emitted with the
    tag ``agg=<func>``. Non-numeric events pass through.
    """

    def __init__(self, *, window_ns: int, funcs: Sequence[str] = ("mean",), names: Sequence[str] = ("*",)) -> None:
        if window_ns <= 0:
            raise ConfigError(f"processor downsample.window: must be > 0, got {window_ns!r} ns")
        bad = [f for f in funcs if f not in _AGG]
        if bad or not funcs:
            raise ConfigError(f"processor downsample.funcs: unknown {bad or funcs!r}; choose from {sorted(_AGG)}")
        self.window_ns = window_ns
        self.funcs = tuple(funcs)
        self._sel = _matcher(names)
        self._open: dict[SeriesKey, tuple[int, TelemetryEvent, list[float]]] = {}

    def _close(self, w: int, e: TelemetryEvent, xs: list[float]) -> list[TelemetryEvent]:
        end = (w + 1) * self.window_ns
        return [
            TelemetryEvent(e.name, end, e.target, {**e.tags, "agg": f}, _AGG[f](xs)) for f in self.funcs
        ]

    def __call__(self, events: Events) -> list[TelemetryEvent]:
        out: list[TelemetryEvent] = []
        for e in events:
            if not _numeric(e.value) or not self._sel(e.name):
                out.append(e)
                continue
            k = series_key(e)
            w = e.ts_ns // self.window_ns
            cur = self._open.get(k)
            if cur is not None and cur[0] != w:
                out += self._close(*cur)
                cur = None
            if cur is None:
                self._open[k] = (w, e, [float(e.value)])
            else:
                cur[2].append(float(e.value))
        return out

    def flush(self) -> list[TelemetryEvent]:
        """Close every open window (end of stream)."""
        out: list[TelemetryEvent] = []
        for cur in self._open.values():
            out += self._close(*cur)
        self._open.clear()
        return out


class Aggregate:
    """Sum (or max/mean) numeric events over a group: per ``rail``, ``plane``, ``tier`` or device.

    ``group_of`` maps a target (device id) to its group label; the caller builds it from the
    inventory (``{"leaf-p1-r3-07": "rail3"}``) so this stage needs no fabric import. Events of
    one name at one timestamp are combined into one event with target ``<by>:<label>`` and the
    tag ``by``. Original events are kept when ``keep_original``.
    """

    def __init__(self, *, by: str, group_of: Mapping[str, str], func: str = "sum",
                 names: Sequence[str] = ("*",), keep_original: bool = False) -> None:
        if func not in _AGG:
            raise ConfigError(f"processor aggregate.func: unknown {func!r}; choose from {sorted(_AGG)}")
        self.by = by
        self.group_of = dict(group_of)
        self.func = _AGG[func]
        self._sel = _matcher(names)
        self.keep_original = keep_original

    def __call__(self, events: Events) -> list[TelemetryEvent]:
        groups: dict[tuple[str, int, str], list[float]] = {}
        out: list[TelemetryEvent] = []
        for e in events:
            label = self.group_of.get(e.target)
            if label is None or not _numeric(e.value) or not self._sel(e.name):
                out.append(e)
                continue
            groups.setdefault((e.name, e.ts_ns, label), []).append(float(e.value))
            if self.keep_original:
                out.append(e)
        for (name, ts, label), xs in groups.items():
            out.append(TelemetryEvent(name, ts, f"{self.by}:{label}", {"by": self.by}, self.func(xs)))
        return out


def group_labels(devices: Iterable[Any], by: str) -> dict[str, str]:
    """Device id -> group label for :class:`Aggregate`: ``rail``, ``plane``, ``pod``, ``tier`` or ``role``.

    ``devices`` are inventory devices (``fabricscope.fabric.Device``: ``id``, ``role``,
    ``rail``, ``plane``, ``pod``, ``tier``); devices without the attribute are left out.
    """
    if by not in ("rail", "plane", "pod", "tier", "role"):
        raise ConfigError(f"processor aggregate.by: expected rail|plane|pod|tier|role, got {by!r}")
    out: dict[str, str] = {}
    for d in devices:
        v = getattr(d, by, None)
        if v is not None:
            out[str(d.id)] = str(v)
    return out


class Pipeline:
    """Processors applied in order."""

    def __init__(self, stages: Sequence[Processor] = ()) -> None:
        self.stages = list(stages)

    def __call__(self, events: Events) -> list[TelemetryEvent]:
        out = list(events)
        for s in self.stages:
            if not out:
                break
            out = s(out)
        return out


def _dur(v: Any, field: str) -> int:
    from fabricscope.telemetry.config import parse_duration_ns

    return parse_duration_ns(v, field)


def _filter(o: Mapping[str, Any]) -> Processor:
    return Filter(action=o.get("action", "keep"), names=o.get("names", ()), tags=o.get("tags"),
                  targets=o.get("targets", ()))


def _build_aggregate(o: Mapping[str, Any]) -> Processor:
    groups = o.get("groups")
    if not isinstance(groups, Mapping):
        raise ConfigError("processor aggregate.groups: a mapping device -> label is required "
                          "(or give the collector an 'inventory' to derive rail/plane/pod/tier groups)")
    return Aggregate(by=o.get("by", "group"), group_of=groups, func=o.get("func", "sum"),
                     names=o.get("names", ("*",)), keep_original=bool(o.get("keep-original", False)))


# name -> factory(options). Options were validated by config.py against OPTIONS below.
PROCESSORS: dict[str, Callable[[Mapping[str, Any]], Processor]] = {
    "filter": _filter,
    "rename": lambda o: Rename(pattern=o["pattern"], replacement=o.get("replacement", "")),
    "delta": lambda o: Delta(names=o.get("names", ("*",))),
    "rate": lambda o: Rate(names=o.get("names", ("*",))),
    "downsample": lambda o: Downsample(window_ns=_dur(o.get("window", "10s"), "downsample.window"),
                                       funcs=o.get("funcs", ("mean",)), names=o.get("names", ("*",))),
    "aggregate": _build_aggregate,
}
OPTIONS: Mapping[str, frozenset[str]] = {
    "filter": frozenset({"action", "names", "tags", "targets"}),
    "rename": frozenset({"pattern", "replacement"}),
    "delta": frozenset({"names"}),
    "rate": frozenset({"names"}),
    "downsample": frozenset({"window", "funcs", "names"}),
    "aggregate": frozenset({"by", "groups", "func", "names", "keep-original"}),
}


@dataclass(frozen=True)
class ProcessorSpec:
    type: str
    options: Mapping[str, Any]


def build_processor(spec: ProcessorSpec, *, source: str = "processors") -> Processor:
    factory = PROCESSORS.get(spec.type)
    if factory is None:
        raise ConfigError(f"{source}: type: unknown processor {spec.type!r}; choose from {sorted(PROCESSORS)}")
    try:
        return factory(spec.options)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {spec.type}: bad options {dict(spec.options)!r}: {exc}") from exc
