"""The console entry point: help everywhere, one clear error line, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabricscope.cli import app


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120,
    )


def test_top_level_help_lists_demo() -> None:
    r = _run("--help")
    assert r.returncode == 0
    assert "demo" in r.stdout


def _command_paths() -> list[list[str]]:
    import typer.main

    root = typer.main.get_command(app)
    paths: list[list[str]] = []

    def walk(cmd: object, prefix: list[str]) -> None:
        sub = getattr(cmd, "commands", None)
        if isinstance(sub, dict):
            for name, c in sub.items():
                paths.append([*prefix, name])
                walk(c, [*prefix, name])

    walk(root, [])
    return paths


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p))
def test_every_command_has_help(path: list[str]) -> None:
    r = _run(*path, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout


def test_bad_value_is_one_line_not_a_traceback() -> None:
    r = _run("demo", "--part", "no-such-part", "--out", "/tmp/fabricscope-test-demo")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "unknown part 'no-such-part'" in r.stderr
