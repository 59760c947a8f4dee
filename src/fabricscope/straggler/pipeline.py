"""Read traces, attach the inventory, analyze: the one call the CLI and services use."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from fabricscope.model.errors import ConfigError
from fabricscope.straggler.analysis import Options, Report, analyze
from fabricscope.straggler.devices import DeviceMap, parse_placement, rank_devices
from fabricscope.straggler.readers import ReadResult, read_paths


def _placement_beside(paths: Sequence[str | Path]) -> list[tuple[str, int]] | None:
    """A ``truth.json`` / ``placement.json`` next to the traces may carry the rank placement."""
    for raw in paths:
        p = Path(raw)
        folder = p if p.is_dir() else p.parent
        for cand in (folder / "placement.json", folder / "truth.json",
                     folder.parent / "truth.json"):
            if cand.is_file():
                try:
                    obj = json.loads(cand.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                rows = obj.get("placement") if isinstance(obj, dict) else None
                if rows is None and isinstance(obj, dict) and "ranks" in obj:
                    rows = obj["ranks"]
                if rows:
                    return [(str(h), int(g)) for h, g in rows]
    return None


def analyze_paths(
    paths: Sequence[str | Path],
    *,
    inventory: str | Path | None = None,
    placement: str | Path | None = None,
    options: Options | None = None,
) -> tuple[ReadResult, Report]:
    """Read every trace under ``paths`` and localize; with an inventory, name devices.

    The rank placement comes from ``placement`` (JSON ``{"ranks": [[host, gpu], ...]}``),
    else from a ``placement.json``/``truth.json`` beside the traces, else ranks fill the
    inventory's GPUs in host order.
    """
    res = read_paths(paths)
    devices: DeviceMap | None = None
    if inventory is not None:
        from fabricscope.fabric.io import read_fabric

        fabric = read_fabric(inventory)
        rows: list[tuple[str, int]] | None
        if placement is not None:
            try:
                text = Path(placement).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{placement}: cannot read placement ({exc})") from exc
            rows = parse_placement(text, source=str(placement))
        else:
            rows = _placement_beside(paths)
        n = int(res.table.rank.max()) + 1 if len(res.table) else 0
        devices = rank_devices(fabric, rows, ranks=None if rows else n)
    report = analyze(res.table, devices=devices, options=options,
                     warnings=res.warnings + [f"unused: {u}" for u in res.unused])
    return res, report
