"""The output folder of ``straggler twin``: refuse to mix two runs, replace one on ``--force``.

A twin run is ``kineto/rank<N>.json.gz``, ``trace.jsonl``, ``truth.json`` and
``inventory.json``. Writing a 16-rank run over a 32-rank one used to leave 16 stale rank
files that ``straggler analyze`` then read as part of the new job. So a folder that already
holds any of these is refused unless ``--force``; with ``--force`` the old rank files the new
run does not overwrite are removed after it is written, and a ``kineto/`` that holds files
``straggler twin`` never writes is refused (they are someone else's, not ours to delete).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fabricscope.model.errors import ConfigError

RUN_FILES = ("kineto", "trace.jsonl", "truth.json", "inventory.json")
_RANK_FILE = re.compile(r"rank(\d+)\.json\.gz")


def prepare_twin_folder(outdir: Path, *, force: bool) -> None:
    """Check (and create) ``outdir`` before the twin runs; ``ConfigError`` names the problem."""
    if outdir.exists() and not outdir.is_dir():
        raise ConfigError(f"straggler twin: {outdir} exists and is not a folder; give a folder")
    if outdir.is_dir():
        held = sorted(n for n in RUN_FILES if (outdir / n).exists())
        if held and not force:
            raise ConfigError(
                f"straggler twin: {outdir} already holds a run ({', '.join(held)}); choose an "
                f"empty folder or pass --force to replace it")
        for name in RUN_FILES[1:]:
            if (outdir / name).exists() and not (outdir / name).is_file():
                raise ConfigError(f"straggler twin: {outdir / name} is not a file; remove it "
                                  f"or choose another folder")
        kdir = outdir / "kineto"
        if kdir.exists() and not kdir.is_dir():
            raise ConfigError(f"straggler twin: {kdir} is a file, not the kineto/ folder; "
                              f"remove it or choose another folder")
        if kdir.is_dir():
            foreign = sorted(p.name for p in kdir.iterdir()
                             if not (_RANK_FILE.fullmatch(p.name) and p.is_file()))
            if foreign:
                raise ConfigError(
                    f"straggler twin --force: {kdir} holds {foreign[0]!r}"
                    f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}, which "
                    f"straggler twin does not write; remove it yourself or choose another folder")
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        probe = outdir / ".fabricscope-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"straggler twin: cannot write into {outdir} "
                          f"({exc.strerror or exc})") from exc
    if not os.access(outdir, os.W_OK | os.X_OK):
        raise ConfigError(f"straggler twin: {outdir} is not writable")


def remove_stale_ranks(outdir: Path, world_size: int) -> list[Path]:
    """Delete ``kineto/rank<N>.json.gz`` with ``N >= world_size`` (left by a larger run)."""
    kdir = outdir / "kineto"
    stale: list[Path] = []
    if kdir.is_dir():
        for p in kdir.iterdir():
            m = _RANK_FILE.fullmatch(p.name)
            if m and p.is_file() and int(m.group(1)) >= world_size:
                stale.append(p)
    stale.sort(key=lambda p: int(p.name[4:].split(".")[0]))
    for p in stale:
        p.unlink()
    return stale
