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


def _all_commands() -> list[tuple[str, object]]:
    from fabricscope.cli import get_command

    out: list[tuple[str, object]] = []

    def walk(cmd: object, prefix: list[str]) -> None:
        for name, c in (getattr(cmd, "commands", None) or {}).items():
            out.append((" ".join([*prefix, name]), c))
            walk(c, [*prefix, name])

    walk(get_command(), [])
    return out


@pytest.mark.parametrize(("name", "cmd"), _all_commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_option_and_argument_has_help(name: str, cmd: object) -> None:
    missing = [
        (p.opts[0] if getattr(p, "opts", None) else p.name)
        for p in getattr(cmd, "params", [])
        if not (getattr(p, "help", None) or "").strip()
    ]
    assert not missing, f"`fabricscope {name}`: no help text for {missing}"


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p))
def test_help_is_plain_and_pasteable(path: list[str]) -> None:
    r = _run(*path, "--help")
    out = r.stdout
    usage = out.split("\n\n", 1)[0]
    assert "[[" not in usage, usage  # an optional argument whose metavar had brackets
    assert "\\[" not in out, out  # rich-markup escapes shown literally
    assert "<bool>" not in out, out
    assert "list[" not in out, out


def test_version_and_short_help() -> None:
    from fabricscope import __version__

    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"fabricscope {__version__}"
    r = _run("sim", "-h")
    assert r.returncode == 0 and "Usage" in r.stdout


def test_usage_error_is_exit_2_without_traceback() -> None:
    r = _run("sim", "--no-such-flag")
    assert r.returncode == 2
    assert "No such option" in r.stderr and "Traceback" not in r.stderr
