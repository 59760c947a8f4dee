"""RoCE / InfiniBand bring-up checks: parse ibstat, iblinkinfo, ibv_devinfo, show_gids,
perftest and mlnx_qos outputs (parsers.py), judge them (checks.py), gather them live or from
saved outputs (runner.py). See docs/roce.md and docs/design/roce-checks.md.
"""

from __future__ import annotations

from fabricscope.roce.checks import (
    CheckResult,
    Evidence,
    Expectations,
    check_roce,
    exit_code,
    findings,
    merge_ports,
    summarize,
)
from fabricscope.roce.parsers import (
    BwRow,
    EcnState,
    GidEntry,
    IbPort,
    LatRow,
    LinkInfo,
    LldpNeighbor,
    ParsedFile,
    PerftestRun,
    QosConfig,
    detect_format,
    parse_text,
)

__all__ = [
    "BwRow", "CheckResult", "EcnState", "Evidence", "Expectations", "GidEntry", "IbPort",
    "LatRow", "LinkInfo", "LldpNeighbor", "ParsedFile", "PerftestRun", "QosConfig",
    "check_roce", "detect_format", "exit_code", "findings", "merge_ports", "parse_text",
    "summarize",
]
