"""Transport-layer settings: switch buffers, ECN marking, PFC, the watchdog and the step size.

Every value is validated here, once, with the field and the value named in the error, so the
engine below can assume sane numbers. Sizes are bytes, times nanoseconds, rates bits/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fabricscope.model.errors import ConfigError
from fabricscope.sim.transport.dcqcn import PAPER, DcqcnParams
from fabricscope.sim.transport.eqds import EqdsConfig
from fabricscope.sim.transport.nscc import NsccConfig

CcName = Literal["none", "dcqcn", "hpcc", "nscc", "eqds"]
CC_NAMES: tuple[CcName, ...] = ("none", "dcqcn", "hpcc", "nscc", "eqds")
LOSSY_CCS = ("nscc", "eqds")  # UEC transports: lossy switches that trim, PFC off by default


def _check(ok: bool, where: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {msg}")


@dataclass(frozen=True, slots=True)
class BufferConfig:
    """A shared switch buffer with dynamic thresholds (Choudhury & Hahne, IEEE/ACM ToN 1998):
    an egress queue admits bytes while its length is below ``alpha x (size - used)``.

    size_bytes: shared buffer per switch (all its ports)
    alpha:      dynamic-threshold factor (1 = a queue may take half of a free buffer)
    """

    size_bytes: float = 32 * 1024 * 1024
    alpha: float = 1.0

    def validate(self, *, mtu_bytes: int, where: str = "buffer") -> None:
        _check(self.size_bytes > 0, f"{where}.size", f"must be > 0, got {self.size_bytes!r}")
        _check(self.size_bytes >= mtu_bytes, f"{where}.size",
               f"{self.size_bytes:.0f} B is smaller than one MTU ({mtu_bytes} B)")
        _check(self.alpha > 0, f"{where}.alpha", f"must be > 0, got {self.alpha!r}")


@dataclass(frozen=True, slots=True)
class EcnConfig:
    """RED-like ECN marking on the instantaneous egress queue length (the switch side of
    DCQCN, Zhu et al. SIGCOMM'15 §3): no mark below ``kmin``, probability rising linearly to
    ``pmax`` at ``kmax``, every packet marked above ``kmax``."""

    kmin_bytes: float = 5_000.0
    kmax_bytes: float = 200_000.0
    pmax: float = 0.01

    def validate(self, *, where: str = "ecn") -> None:
        _check(self.kmin_bytes >= 0, f"{where}.kmin", f"must be >= 0, got {self.kmin_bytes!r}")
        _check(self.kmax_bytes >= 0, f"{where}.kmax", f"must be >= 0, got {self.kmax_bytes!r}")
        _check(self.kmin_bytes <= self.kmax_bytes, where,
               f"kmin ({self.kmin_bytes:.0f} B) must not exceed kmax ({self.kmax_bytes:.0f} B)")
        _check(0 < self.pmax <= 1, f"{where}.pmax", f"must be in (0, 1], got {self.pmax!r}")


@dataclass(frozen=True, slots=True)
class PfcConfig:
    """Priority flow control (IEEE 802.1Qbb) on one lossless priority.

    An ingress queue (bytes in a switch that arrived through one port) sends XOFF upstream
    when it exceeds the XOFF threshold and XON when it falls ``xon_delta_bytes`` below it.
    The threshold is ``xoff_bytes`` if given, else dynamic: ``alpha x`` the shared buffer
    that is free after reserving ``headroom`` for every ingress port (as Broadcom-class
    switches do). Headroom per port defaults to what arrives while the pause travels:
    ``2 x link rate x latency + 2 MTU``.

    The watchdog (as in SONiC / NVIDIA / Arista switches): an egress queue continuously
    paused with bytes waiting for ``watchdog_ns`` is declared stormed; for ``restore_ns`` it
    ignores pauses and drops what it holds and receives ("drop" action), then returns to
    normal; with ``watchdog_action="forward"`` it transmits instead (pauses ignored, the
    downstream buffer may then overflow). ``watchdog_ns = 0`` disables it.
    """

    enabled: bool = False
    xoff_bytes: float | None = None
    alpha: float = 0.125
    xon_delta_bytes: float | None = None  # default 2 MTU
    headroom_bytes: float | None = None  # default per port from its rate and latency
    watchdog_ns: float = 0.0
    restore_ns: float = 200_000.0
    watchdog_action: Literal["drop", "forward"] = "drop"

    def validate(self, *, where: str = "pfc") -> None:
        if self.xoff_bytes is not None:
            _check(self.xoff_bytes > 0, f"{where}.xoff", f"must be > 0, got {self.xoff_bytes!r}")
        _check(self.alpha > 0, f"{where}.alpha", f"must be > 0, got {self.alpha!r}")
        if self.xon_delta_bytes is not None:
            _check(self.xon_delta_bytes >= 0, f"{where}.xon_delta", f"must be >= 0, got {self.xon_delta_bytes!r}")
        if self.headroom_bytes is not None:
            _check(self.headroom_bytes >= 0, f"{where}.headroom", f"must be >= 0, got {self.headroom_bytes!r}")
        _check(self.watchdog_ns >= 0, f"{where}.watchdog", f"must be >= 0, got {self.watchdog_ns!r}")
        _check(self.restore_ns > 0, f"{where}.restore", f"must be > 0, got {self.restore_ns!r}")
        _check(self.watchdog_action in ("drop", "forward"), f"{where}.watchdog_action",
               f"must be 'drop' or 'forward', got {self.watchdog_action!r}")


@dataclass(frozen=True, slots=True)
class LinkLayerConfig:
    """The UEC link layer (Ultra Ethernet 1.0, link layer: credit-based flow control and
    link-level retry), per link, one virtual channel.

    cbfc:         credit-based flow control instead of PFC: a link's sender may only send
                  into the credit its receiver's ingress buffer advertised; credit comes back
                  one link delay after the bytes left that ingress queue. Lossless, and no
                  pause frames (``cbfc`` and ``pfc`` exclude each other)
    credit_bytes: credit (ingress buffer) per switch port; ``None`` = what keeps the link
                  busy across the credit loop, ``2 x rate x latency + 4 MTU``
    llr:          link-level retry: a frame the link corrupts (``gray-loss`` faults: the
                  frame error ratio) is re-sent on that link, costing the link the retried
                  bytes, instead of being dropped and re-sent end to end by its sender
    """

    cbfc: bool = False
    credit_bytes: float | None = None
    llr: bool = False

    def validate(self, *, mtu_bytes: int, where: str = "link") -> None:
        if self.credit_bytes is not None:
            _check(self.credit_bytes >= mtu_bytes, f"{where}.credit",
                   f"{self.credit_bytes:.0f} B is smaller than one MTU ({mtu_bytes} B)")


@dataclass(frozen=True, slots=True)
class HpccConfig:
    """HPCC (Li et al., SIGCOMM'19 §3-4): target utilization ``eta``, ``max_stage`` additive
    steps before a multiplicative one, additive step ``wai_bytes``. The default W_AI is
    BDP x (1 - eta) / N for a 100G x 13 us BDP and N = 100 concurrent flows (the paper's
    rule for choosing it): about 80 bytes."""

    eta: float = 0.95
    max_stage: int = 5
    wai_bytes: float = 80.0

    def validate(self, *, where: str = "hpcc") -> None:
        _check(0 < self.eta <= 1, f"{where}.eta", f"must be in (0, 1], got {self.eta!r}")
        _check(self.max_stage >= 0, f"{where}.max_stage", f"must be >= 0, got {self.max_stage!r}")
        _check(self.wai_bytes > 0, f"{where}.wai", f"must be > 0, got {self.wai_bytes!r}")


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """Everything the fluid transport engine needs besides the fabric and the flows.

    cc:         ``dcqcn`` (rate control of Zhu et al.), ``hpcc`` (window control of Li et
                al. on in-band telemetry), ``nscc`` (UEC sender window from delay and ECN,
                :mod:`~fabricscope.sim.transport.nscc`), ``eqds`` (receiver-driven credits,
                :mod:`~fabricscope.sim.transport.eqds`, on the same trimming switches as
                ``nscc``: their settings are ``nscc``'s ``trimming``, ``port_queue_bdp``,
                ``ecn_bdp`` and header fields) or ``none`` (senders at line rate: what PFC
                alone does)
    dcqcn:      DCQCN parameters (:data:`~fabricscope.sim.transport.dcqcn.PAPER` or
                :data:`~fabricscope.sim.transport.dcqcn.NIC_DEFAULT`)
    dt_ns:      step; ``None`` chooses ``min(500 ns, smallest link latency / 2)``
                (docs/design/sim-transport.md says why)
    mtu_bytes:  packet size for packet-counted terms (DCQCN byte counter, marks, PFC)
    max_time_ns: give up (flows left unfinished, reported) after this much simulated time
    """

    cc: CcName = "dcqcn"
    dcqcn: DcqcnParams = PAPER
    hpcc: HpccConfig = field(default_factory=HpccConfig)
    nscc: NsccConfig = field(default_factory=NsccConfig)
    eqds: EqdsConfig = field(default_factory=EqdsConfig)
    link: LinkLayerConfig = field(default_factory=LinkLayerConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    ecn: EcnConfig = field(default_factory=EcnConfig)
    pfc: PfcConfig = field(default_factory=PfcConfig)
    dt_ns: float | None = None
    mtu_bytes: int = 4096
    max_time_ns: float = 1e9

    def validate(self) -> None:
        _check(self.cc in CC_NAMES, "cc", f"unknown congestion control {self.cc!r}; known: {', '.join(CC_NAMES)}")
        _check(self.mtu_bytes > 0, "mtu", f"must be > 0, got {self.mtu_bytes!r}")
        if self.dt_ns is not None:
            _check(self.dt_ns > 0, "dt", f"must be > 0 ns, got {self.dt_ns!r}")
        _check(self.max_time_ns > 0, "max_time", f"must be > 0, got {self.max_time_ns!r}")
        self.buffer.validate(mtu_bytes=self.mtu_bytes)
        self.ecn.validate()
        self.pfc.validate()
        self.dcqcn.validate()
        self.hpcc.validate()
        self.nscc.validate()
        self.eqds.validate()
        self.link.validate(mtu_bytes=self.mtu_bytes)
        _check(not (self.link.cbfc and self.pfc.enabled), "cbfc",
               "credit-based flow control replaces PFC: turn one of them off (--no-pfc)")


def parse_ecn(text: str, *, where: str = "--ecn") -> EcnConfig:
    """``KMIN,KMAX,PMAX`` (sizes with units, e.g. ``5KB,200KB,0.01``) -> :class:`EcnConfig`."""
    from fabricscope.sim.workload import parse_size

    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3 or not all(parts):
        raise ConfigError(f"{where}: expected KMIN,KMAX,PMAX (e.g. 5KB,200KB,0.01), got {text!r}")
    sizes: list[float] = []
    for name, p in zip(("kmin", "kmax"), parts[:2], strict=True):
        if p.startswith("-"):
            raise ConfigError(f"{where}: {name} must be >= 0, got {p!r}")
        sizes.append(0.0 if p in ("0", "0B") else parse_size(p, field=f"{where} {name}", source="<flags>"))
    try:
        pmax = float(parts[2].removesuffix("%")) / (100.0 if parts[2].endswith("%") else 1.0)
    except ValueError:
        raise ConfigError(f"{where}: pmax must be a number in (0, 1], got {parts[2]!r}") from None
    cfg = EcnConfig(sizes[0], sizes[1], pmax)
    cfg.validate(where=where)
    return cfg


def transport_config_from_flags(
    *,
    cc: str,
    buffer: str | None = None,
    ecn: str | None = None,
    pfc: bool | None = None,
    dcqcn: str = "paper",
    mtu_bytes: int = 4096,
    trim: bool | None = None,
    cbfc: bool = False,
    llr: bool = False,
) -> TransportConfig | None:
    """The transport settings ``fabricscope sim --cc ... --buffer ... --ecn ... --pfc`` mean.

    ``cc="ideal"`` is the max-min engine: ``None`` is returned, and giving a transport
    option with it is an error (it would be silently ignored). With ``dcqcn`` or ``hpcc``
    PFC is on unless ``pfc=False`` (RoCE runs lossless by default). With ``nscc`` or ``eqds``
    PFC is off unless ``pfc=True`` (UEC runs lossy, htsim's switches trim: here a drop is
    re-sent, see docs/design/sim-transport.md), switches trim unless ``trim=False`` (then a
    full queue drops whole packets, found at the sender's timeout) and ECN follows htsim's
    BDP-relative default unless ``ecn`` is given. ``cbfc`` replaces PFC by credits (PFC off
    unless ``pfc=True``, which is then an error) and ``llr`` adds link-level retry.
    """
    from fabricscope.sim.transport.dcqcn import PARAM_SETS
    from fabricscope.sim.workload import parse_size

    known = ("ideal", "dcqcn", "hpcc", *LOSSY_CCS)
    if cc not in known:
        raise ConfigError(f"--cc: unknown congestion control {cc!r}; known: {', '.join(known)}")
    if cc == "ideal":
        given = [name for name, v in (("--buffer", buffer), ("--ecn", ecn), ("--pfc/--no-pfc", pfc),
                                      ("--trim/--no-trim", trim), ("--cbfc", cbfc or None), ("--llr", llr or None))
                 if v is not None]
        if given:
            raise ConfigError(f"{given[0]}: only applies with --cc {', '.join(known[1:])} (the ideal engine has no queues)")
        return None
    if trim is not None and cc not in LOSSY_CCS:
        raise ConfigError(f"--trim/--no-trim: only applies with --cc {' or '.join(LOSSY_CCS)} (switches that trim "
                          f"for UEC transports; {cc} runs on lossless or dropping switches)")
    if dcqcn not in PARAM_SETS:
        raise ConfigError(f"--dcqcn: unknown parameter set {dcqcn!r}; known: {', '.join(PARAM_SETS)}")
    buf = BufferConfig()
    if buffer is not None:
        if buffer.strip().startswith("-"):
            raise ConfigError(f"--buffer: must be > 0, got {buffer!r}")
        buf = BufferConfig(size_bytes=parse_size(buffer, field="--buffer", source="<flags>"))
        buf.validate(mtu_bytes=mtu_bytes, where="--buffer")
    e = parse_ecn(ecn) if ecn is not None else EcnConfig()
    if cbfc and pfc is True:
        raise ConfigError("--cbfc: credit-based flow control replaces PFC; not with --pfc")
    link = LinkLayerConfig(cbfc=cbfc, llr=llr)
    if cbfc:
        pfc = False
    if cc in LOSSY_CCS:
        ns = NsccConfig(trimming=trim is not False, ecn_bdp=NsccConfig().ecn_bdp if ecn is None else None)
        cfg = TransportConfig(cc="eqds" if cc == "eqds" else "nscc", buffer=buf, ecn=e,
                              pfc=PfcConfig(enabled=pfc is True), mtu_bytes=mtu_bytes, nscc=ns, link=link)
        cfg.validate()
        return cfg
    cfg = TransportConfig(cc="hpcc" if cc == "hpcc" else "dcqcn", dcqcn=PARAM_SETS[dcqcn], buffer=buf, ecn=e,
                          pfc=PfcConfig(enabled=pfc is not False), mtu_bytes=mtu_bytes, link=link)
    cfg.validate()
    return cfg
