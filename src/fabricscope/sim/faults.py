"""Faults the twin can inject, each with a time window, so the ground truth is known.

One fault model serves every capability: the flow engine (link down / degraded), the
telemetry twin (counters, optics, oper-status), the probe transport (gray loss, added delay,
CPU-starved responder) and the training-trace generator (slow GPU / NIC, imbalance).

Subjects are inventory ids: a cable ``a|b`` or one direction ``a->b`` for link faults, a
device id for switch / NIC / host faults, ``host0042/gpu3`` for a GPU, a port id for optics.

Parameters are floats. A parameter with named values (``optic-degrading``'s ``mode``) keeps a
documented code per name (:data:`OPTIC_MODES`); :func:`param_value` turns the text a user
wrote (``mode=aging-laser`` or ``mode=1``) into that code, :func:`optic_mode` a fault's code
back into its name. ``optic-degrading`` parameters (docs/design/optics-twin.md):

* ``mode``: ``generic`` (0, the default: the historical drift of every reading), ``aging-laser``
  (1), ``dirty-connector`` (2), ``bent-fiber`` (3), ``hot-module`` (4);
* ``rate``: severity per day (generic, dirty-connector, bent-fiber: dB of loss; aging-laser: mA
  of laser threshold-current rise; hot-module: 3 degC of heating per unit);
* ``accel``: simulated days per day (a scenario of minutes shows days of drift);
* ``lane``: the lane whose laser ages (aging-laser only; default 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from fabricscope.model.errors import ConfigError

FaultKind = Literal[
    "link-down",        # cable removed from routing (both directions)
    "link-degraded",    # capacity x factor (params: factor in (0, 1])
    "gray-loss",        # random drop on a direction (params: loss in [0, 1])
    "link-delay",       # added one-way delay (params: delay_ns)
    "link-flap",        # oper-status toggles (params: period_ns)
    "congestion",       # background load on a direction (params: load in [0, 1])
    "micro-burst",      # queue build-up on a port for a short window (params: depth_bytes)
    "optic-degrading",  # transceiver drift on a port (params: rate per day, accel, mode, lane)
    "switch-fault",     # every path through a switch drops (params: loss)
    "nic-fault",        # every path to a NIC drops / slows (params: loss, factor)
    "slow-nic",         # NIC bandwidth x factor (params: factor)
    "slow-gpu",         # compute time x factor (params: factor)
    "cpu-starved",      # responder / host processing delay (params: delay_ns)
    "pfc-storm",        # pause frames from a port (params: rate)
    "stage-imbalance",  # workload: one pipeline stage heavier (params: factor, stage)
    "sequence-imbalance",  # workload: micro-batch length skew (params: cv)
]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]


#: ``optic-degrading`` ``mode`` codes (a Fault parameter is a float: the name maps to this code).
OPTIC_MODES: Mapping[str, int] = {
    "generic": 0, "aging-laser": 1, "dirty-connector": 2, "bent-fiber": 3, "hot-module": 4,
}
#: Parameters whose values have names, per (fault kind, parameter).
NAMED_PARAMS: Mapping[tuple[str, str], Mapping[str, int]] = {
    ("optic-degrading", "mode"): OPTIC_MODES,
}


def param_value(kind: str, key: str, text: str, *, source: str) -> float:
    """The float of one ``KEY=VALUE`` fault parameter: a number, or a name of :data:`NAMED_PARAMS`.

    A named parameter accepts its names and their codes only; anything else is a
    :class:`ConfigError` naming ``source``, the parameter and the value.

    >>> param_value("optic-degrading", "mode", "dirty-connector", source="--fault")
    2.0
    >>> param_value("gray-loss", "loss", "0.02", source="--fault")
    0.02
    """
    names = NAMED_PARAMS.get((kind, key))
    v = text.strip()
    if names is not None:
        if v in names:
            return float(names[v])
        try:
            code = float(v)
        except ValueError:
            code = float("nan")
        if code in names.values():
            return code
        choices = ", ".join(f"{n} ({c})" for n, c in names.items())
        raise ConfigError(f"{source}: {key}: unknown {kind} {key} {v!r}; choose one of {choices}")
    try:
        return float(v)
    except ValueError:
        raise ConfigError(f"{source}: {key}: expected a number, got {v!r}") from None


def optic_mode(fault: Fault) -> str:
    """The name of an ``optic-degrading`` fault's ``mode`` (``generic`` when absent).

    A code that names no mode is a :class:`ConfigError` naming the fault.
    """
    code = fault.param("mode", 0.0)
    for name, c in OPTIC_MODES.items():
        if code == c:
            return name
    raise ConfigError(
        f"fault {fault.kind} on {fault.subject}: mode: unknown code {code!r}; choose one of "
        + ", ".join(f"{n} ({c})" for n, c in OPTIC_MODES.items())
    )


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault on ``subject`` active in ``[start_ns, end_ns)`` (``end_ns`` None: forever)."""

    kind: FaultKind
    subject: str
    start_ns: int = 0
    end_ns: int | None = None
    params: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ConfigError(
                f"fault.kind: unknown {self.kind!r}; choose one of {', '.join(FAULT_KINDS)}"
            )
        if self.end_ns is not None and self.end_ns < self.start_ns:
            raise ConfigError(
                f"fault {self.kind} on {self.subject}: end_ns {self.end_ns} < start_ns {self.start_ns}"
            )

    def active(self, t_ns: int) -> bool:
        return self.start_ns <= t_ns and (self.end_ns is None or t_ns < self.end_ns)

    def param(self, name: str, default: float) -> float:
        return float(self.params.get(name, default))


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    """An immutable list of faults with time and subject queries."""

    faults: tuple[Fault, ...] = ()

    @classmethod
    def of(cls, faults: Iterable[Fault]) -> FaultSchedule:
        return cls(tuple(sorted(faults, key=lambda f: (f.start_ns, f.subject, f.kind))))

    def active(self, t_ns: int) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.active(t_ns))

    def on(self, subject: str, t_ns: int | None = None) -> tuple[Fault, ...]:
        return tuple(
            f for f in self.faults if f.subject == subject and (t_ns is None or f.active(t_ns))
        )

    def of_kind(self, *kinds: str) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.kind in kinds)
