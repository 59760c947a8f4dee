"""Check output paths before long work starts: a bad ``--out`` fails in the first second.

Every command that writes files calls one of these first, so a path that cannot be written
(a missing parent, an existing file where a folder is wanted, a folder that holds another
run) is one :class:`ConfigError` naming the flag and the path, not a traceback after minutes
of work.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from fabricscope.model.errors import ConfigError


def check_output_dir(
    path: Path, *, flag: str, marker: str | None = None, force: bool = False
) -> Path:
    """Make sure ``path`` can be used as an output folder; create it.

    ``marker`` is the file a previous run of the same command leaves behind (for example
    ``summary.json``): a non-empty folder without it holds something else and is refused
    unless ``force``.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: exists and is not a folder (give a folder path)")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: folder is not writable")
        if marker is not None and not force:
            entries = [p.name for p in path.iterdir()]
            if entries and marker not in entries:
                raise ConfigError(
                    f"{flag} {path}: folder is not empty and holds no {marker} of an earlier "
                    "run; choose an empty folder or pass --force"
                )
        return path
    parent = _existing_parent(path)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot create it ({parent} is not a writable folder)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot create it ({exc.strerror})") from exc
    return path


def check_output_file(path: Path, *, flag: str, suffixes: Iterable[str] = ()) -> Path:
    """Make sure ``path`` can be written as a file (its folder exists and is writable)."""
    allowed = tuple(s.lower() for s in suffixes)
    if allowed and path.suffix.lower() not in allowed:
        raise ConfigError(
            f"{flag} {path}: unsupported file type {path.suffix or '(none)'!r}; "
            f"use one of {', '.join(allowed)}"
        )
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder (give a file path)")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag} {path}: file is not writable")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: folder {parent} is not writable")
    return path


def _existing_parent(path: Path) -> Path:
    p = path.absolute().parent
    while not p.exists() and p != p.parent:
        p = p.parent
    return p
