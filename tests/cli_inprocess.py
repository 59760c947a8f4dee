"""Run the ``fabricscope`` console entry point in-process (a subprocess costs seconds)."""

from __future__ import annotations

import sys

import pytest


def run_main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
             *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``fabricscope ARGS`` through ``cli.main``."""
    from fabricscope.cli import main

    monkeypatch.setattr(sys, "argv", ["fabricscope", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
