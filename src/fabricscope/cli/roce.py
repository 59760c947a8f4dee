"""``fabricscope roce``: RoCE / InfiniBand bring-up checks (ibstat, iblinkinfo, perftest, QoS)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer

_CHECK_HELP = """Check RoCE bring-up: every port Active / LinkUp at the expected rate, link layer, MTU (active_mtu 4096, netdev >= 4200), a RoCE v2 GID at the index used, the same GID index at both ends of a perftest, perftest bandwidth >= 90% of line rate and latency <= 1.2 us x 1.5, PFC on priority 3 only, trust dscp, ECN on, and (with --inventory) the neighbour is the inventory's switch port.

Without --from it runs ibstat, ibv_devinfo -v, show_gids, iblinkinfo, lldpctl -f json and mlnx_qos where they are on PATH and reads /sys/class/infiniband and /sys/class/net (under --root); what is absent is a skip with the reason. perftest needs both ends, so it is read from saved outputs only: --from DIR takes any files of saved outputs (formats detected from the text) and a sys/ tree if present.

Each result: pass / warn / fail / skip, what was expected, what was seen, and the command that fixes it. Exit codes: 0 nothing failed (warn / skip allowed), 1 a check failed, 2 nothing could be checked at all (no data is an error) or bad input.

Examples:

  fabricscope roce check --from tests/data/roce/healthy --expect-rate 200

  fabricscope roce check --from tests/data/roce/roce400 --expect-rate 400 --json
"""

_PARSE_HELP = """Parse one saved tool output (ibstat, iblinkinfo, ibv_devinfo, show_gids, perftest, mlnx_qos, lldpctl -f json; the format is detected) and print its records.

Examples:

  fabricscope roce parse tests/data/roce/ibstat-roce-dgx-spark.txt

  fabricscope roce parse tests/data/roce/ib_read_lat-roce-gid12.txt --json
"""

_MARK = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def _nic_map(pairs: list[str], inventory: Path | None, host: str | None, devices: list[str]
             ) -> tuple[dict[str, str], dict[str, float], dict[str, str], list[Any]]:
    """Device -> NIC id, expected rate and expected peer port, from --nic and the inventory."""
    from fabricscope.model.errors import ConfigError
    from fabricscope.roce.checks import CheckResult

    notes: list[Any] = []
    nic_of: dict[str, str] = {}
    for p in pairs:
        dev, sep, nic = p.partition("=")
        if not sep or not dev or not nic:
            raise ConfigError(f"--nic: {p!r}: expected DEVICE=NIC (mlx5_0=host0042/nic0)")
        nic_of[dev] = nic
    if inventory is None:
        if host is not None:
            raise ConfigError("--host: needs --inventory (the file that lists the host's NICs)")
        return nic_of, {}, {}, notes
    from fabricscope.fabric.io import read_fabric

    fab = read_fabric(inventory)
    if host is None:
        raise ConfigError(f"--inventory: {str(inventory)!r}: give --host NAME (which host's "
                          "NICs these devices are)")
    if host not in fab.nics_of_host:
        raise ConfigError(f"--host: {host!r}: not a host of {str(inventory)!r}")
    nics = [n.id for n in fab.nics_of_host[host]]
    for nic in nic_of.values():
        if nic not in fab.devices:
            raise ConfigError(f"--nic: {nic!r}: not a device of {str(inventory)!r}")
    if not nic_of:
        if len(devices) == len(nics) and devices:
            nic_of = dict(zip(devices, nics, strict=True))
            notes.append(CheckResult(
                "nic-mapping", host, "warn", "--nic DEVICE=NIC for each device",
                "mapped by order: " + ", ".join(f"{d}={n}" for d, n in nic_of.items()),
                "give --nic to be explicit (order is an assumption)"))
        else:
            notes.append(CheckResult(
                "nic-mapping", host, "warn", f"{len(nics)} device(s) for {len(nics)} NIC(s)",
                f"{len(devices)} device(s) seen: {devices}", "give --nic DEVICE=NIC; "
                "subjects stay device names and inventory checks are skipped"))
    rate_of: dict[str, float] = {}
    peer_of: dict[str, str] = {}
    for dev, nic in nic_of.items():
        for pid in fab.ports_of.get(nic, ()):
            if pid in fab.peer_port:
                rate_of[dev] = fab.ports[pid].speed_gbps
                peer_of[dev] = fab.peer_port[pid]
                break
    return nic_of, rate_of, peer_of, notes


def _print(results: list[Any], warnings: tuple[str, ...], summary: dict[str, int]) -> None:
    out = sys.stdout
    w_name = max([len(r.name) for r in results] + [5])
    w_subj = max([len(r.subject) for r in results] + [7])
    for r in results:
        out.write(f"{_MARK[r.status]:<4}  {r.name:<{w_name}}  {r.subject:<{w_subj}}  "
                  f"expected {r.expected}; seen {r.seen}\n")
        if r.fix and r.status in ("fail", "warn"):
            out.write(f"{'':<4}  {'':<{w_name}}  fix: {r.fix}\n")
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    out.write(", ".join(f"{v} {k}" for k, v in summary.items()) + "\n")


def register(app: typer.Typer) -> None:
    """Add the ``roce`` command group (``roce check``, ``roce parse``)."""
    roce = typer.Typer(help="RoCE / InfiniBand bring-up checks: ports, MTU, GIDs, perftest, PFC / ECN.",
                       no_args_is_help=True)
    app.add_typer(roce, name="roce")

    @roce.command("check", help=_CHECK_HELP)
    def check(
        from_dir: Path | None = typer.Option(None, "--from", help="Folder of saved tool outputs (and an optional sys/ tree) instead of running the tools."),
        inventory: Path | None = typer.Option(None, "--inventory", help="Fabric inventory (YAML / JSON): expected rate and neighbour of each NIC."),
        host: str | None = typer.Option(None, "--host", help="The inventory host these devices belong to."),
        nic: list[str] = typer.Option([], "--nic", help="DEVICE=NIC mapping, e.g. mlx5_0=host0042/nic0 (repeatable; default: by order)."),
        expect_rate: float | None = typer.Option(None, "--expect-rate", help="Expected port rate in Gb/s (default: the inventory NIC speed)."),
        link_layer: str = typer.Option("Ethernet", "--link-layer", help="Expected link layer: Ethernet (RoCE) or InfiniBand."),
        bw_fraction: float = typer.Option(0.9, "--bw-fraction", help="perftest bandwidth must reach this fraction of line rate."),
        lat_us: float = typer.Option(1.2, "--lat-us", help="Expected perftest latency in us (OPERATIONS.md: ~1.2 us)."),
        lat_factor: float = typer.Option(1.5, "--lat-factor", help="Latency fails above --lat-us x this factor."),
        pfc_priority: int = typer.Option(3, "--pfc-priority", help="The RoCE lossless priority (PFC on it only)."),
        trust: str = typer.Option("dscp", "--trust", help="Expected QoS trust state."),
        no_ecn: bool = typer.Option(False, "--no-ecn", help="Do not require ECN on the RoCE priority."),
        gid_index: int | None = typer.Option(None, "--gid-index", help="The GID index jobs use (checked to be RoCE v2)."),
        root: Path = typer.Option(Path("/"), "--root", help="Root holding sys/ for the live checks (a fixture tree for tests)."),
        timeout_s: float = typer.Option(20.0, "--timeout", help="Seconds each tool may run."),
        as_json: bool = typer.Option(False, "--json", help="Print results, summary and findings as JSON."),
        db: Path | None = typer.Option(None, "--db", help="Add the findings of failed checks to this DiagnosisStore (DuckDB)."),
    ) -> None:
        from fabricscope.model.errors import ConfigError
        from fabricscope.roce.checks import (
            Expectations,
            check_roce,
            exit_code,
            findings,
            merge_ports,
            summarize,
        )
        from fabricscope.roce.runner import collect_live, collect_saved

        if not 0 < bw_fraction <= 1:
            raise ConfigError(f"--bw-fraction: {bw_fraction!r}: must be in (0, 1]")
        if lat_us <= 0 or lat_factor <= 0:
            raise ConfigError(f"--lat-us / --lat-factor: {lat_us!r} / {lat_factor!r}: must be > 0")
        if not 0 <= pfc_priority <= 7:
            raise ConfigError(f"--pfc-priority: {pfc_priority!r}: must be 0..7")
        if expect_rate is not None and expect_rate <= 0:
            raise ConfigError(f"--expect-rate: {expect_rate!r}: must be > 0 (Gb/s)")
        if link_layer.lower() not in ("ethernet", "infiniband"):
            raise ConfigError(f"--link-layer: {link_layer!r}: expected Ethernet or InfiniBand")
        ex = Expectations(rate_gbps=expect_rate, link_layer=link_layer, bw_fraction=bw_fraction,
                          lat_us=lat_us, lat_factor=lat_factor, pfc_priority=pfc_priority,
                          trust=trust.lower(), ecn=not no_ecn, gid_index=gid_index)
        ev = collect_saved(from_dir) if from_dir is not None else collect_live(
            root=root, timeout_s=timeout_s)
        seen = [p.device for p in merge_ports(ev.ports)] or sorted(
            {r.device for r in ev.runs if r.device})
        devices = list(dict.fromkeys(seen))  # merge_ports sorts devices naturally
        nic_of, rate_of, peer_of, notes = _nic_map(nic, inventory, host, devices)
        results = [*notes, *check_roce(ev, expect=ex, nic_of=nic_of, rate_of=rate_of,
                                       peer_of=peer_of)]
        code = exit_code(results)
        summary = summarize(results)
        now = time.time_ns()
        fnd = findings(results, at_ns=now, host=host)
        if as_json:
            print(json.dumps({
                "host": host, "source": str(from_dir) if from_dir else "live",
                "summary": summary, "exit_code": code,
                "results": [r.to_json() for r in results],
                "findings": [{"kind": f.kind, "subject": f.subject, "score": f.score,
                              "evidence": list(f.evidence), "action": f.action}
                             for f in fnd],
                "warnings": list(ev.warnings)}, indent=2))
        else:
            _print(results, ev.warnings, summary)
        if db is not None and fnd:
            from fabricscope.diagnosis.model import Observed
            from fabricscope.store.findings import DiagnosisStore

            with DiagnosisStore(db) as store:
                n = store.add_findings([Observed(source="host", finding=f, reported_ns=now)
                                        for f in fnd])
            print(f"added {n} finding(s) to {db}", file=sys.stderr)
        if code == 2:
            print("roce check: nothing could be checked (every source is absent: "
                  + "; ".join(why for _, why in ev.skips[:4]) + ")", file=sys.stderr)
        raise typer.Exit(code)

    @roce.command("parse", help=_PARSE_HELP)
    def parse(
        file: Path = typer.Argument(..., help="A saved tool output."),
        as_json: bool = typer.Option(False, "--json", help="Print the records as JSON."),
    ) -> None:
        from dataclasses import asdict

        from fabricscope.model.errors import ConfigError
        from fabricscope.roce.parsers import parse_text

        try:
            text = file.read_text(errors="replace")
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None
        pf = parse_text(text, source=str(file))
        if as_json:
            d = asdict(pf)
            d["truncated"] = pf.truncated
            print(json.dumps(d, indent=2, default=str))
            return
        print(f"{file}: {pf.format}" + (" (truncated)" if pf.truncated else ""))
        recs: list[Any] = [*pf.ports, *pf.gids, *pf.links, *pf.runs, *pf.qos, *pf.lldp]
        for rec in recs:
            print("  " + ", ".join(f"{k}={v}" for k, v in asdict(rec).items()
                                   if v not in (None, (), "", {}) and k != "source"))
