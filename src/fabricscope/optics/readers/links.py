"""The cabling that per-direction link loss needs: ``device:port`` -> the far end's.

A links CSV (``device_a, port_a, device_b, port_b``, as ``optics twin`` writes it and as an
inventory export gives it), or a fabric inventory's ``peer_port`` (the same ``device:port``
form). Bad rows are warned (file and line) and skipped.
"""

from __future__ import annotations

import csv
import os

from fabricscope.model.errors import ConfigError

__all__ = ["read_links"]

_COLS = ("device_a", "port_a", "device_b", "port_b")


def read_links(path: str | os.PathLike[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """Peers in both directions from a links CSV, and the warnings about skipped rows."""
    p = os.fspath(path)
    peers: dict[str, str] = {}
    warnings: list[str] = []
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            rd = csv.DictReader(fh)
            missing = [c for c in _COLS if c not in (rd.fieldnames or ())]
            if missing:
                raise ConfigError(f"{p}: column {missing[0]!r} missing (need {', '.join(_COLS)})")
            for line, row in enumerate(rd, start=2):
                vals = [(row.get(c) or "").strip() for c in _COLS]
                if not all(vals):
                    warnings.append(f"{p}:{line}: link: empty field: row skipped")
                    continue
                a, b = f"{vals[0]}:{vals[1]}", f"{vals[2]}:{vals[3]}"
                if a in peers and peers[a] != b:
                    warnings.append(f"{p}:{line}: {a}: cabled twice ({peers[a]}, {b}): kept the first")
                    continue
                peers.setdefault(a, b)
                peers.setdefault(b, a)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read links file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a UTF-8 CSV file") from None
    return peers, tuple(warnings)
