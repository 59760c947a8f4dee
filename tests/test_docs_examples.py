"""Every command shown in the README, docs/ and a ``--help`` "Examples:" section runs when pasted.

Commands are extracted from fenced code blocks (README.md, docs/**/*.md) and from the help
of every command, then run through ``bash`` in order, one session per page / per command's
help, in a scratch folder holding a copy of ``examples/``. What the test changes in a
command is stated here and nowhere else:

* ``/tmp/`` becomes the session's scratch folder, and ``--duration N`` above 4 s becomes 4 s
  (the shape of the command is what is tested, not its patience);
* ``$D`` is the shared datasets folder;
* a server example (``gnmi serve-twin`` without ``--duration``) is started in the background
  for the rest of its session and stopped with SIGTERM at the end (exit 0 or 143 expected);
* a command in ``SKIP`` is not run, with its reason; one that matches no rule must run.

A new example that fails, or that nobody listed, fails this test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FABRICSCOPE_SHARED", ROOT.parent / "shared"))
DATASETS = SHARED / "datasets"
BIN = Path(sys.executable).parent

# (regex on the normalized command, reason): commands that are not run here, each with why.
SKIP: list[tuple[str, str]] = [
    (r"^make test$", "is this test suite itself (CI runs it)"),
    (r"^make demo$", "creates .venv and runs `fabricscope demo`, which runs below (docs/probe.md)"),
    (r"^python benchmarks/", "benchmarks take minutes; their figures and commands are in docs/benchmarks/"),
]

# Files a page's examples take for granted, made before its first command runs.
PRELUDE: dict[str, list[str]] = {}


@dataclass(frozen=True)
class Example:
    source: str  # "docs/sim.md" or "help: sim"
    command: str


_CMD_START = re.compile(r"^(?:\$ )?(?:[A-Z_][A-Z0-9_]*=\S+ )*(?:fabricscope|make|python)\b")


def _join_lines(lines: list[str]) -> list[str]:
    out: list[str] = []
    buf = ""
    for raw in lines:
        ln = raw.strip()
        buf = f"{buf} {ln}".strip() if buf else ln
        if buf.endswith("\\"):
            buf = buf[:-1].rstrip()
            continue
        if _CMD_START.match(buf):
            out.append(buf[2:] if buf.startswith("$ ") else buf)
        buf = ""
    return out


def _strip_comment(cmd: str) -> str:
    # A " # ..." tail outside quotes is a comment.
    quote = ""
    for i, ch in enumerate(cmd):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and cmd[i - 1].isspace():
            return cmd[:i].rstrip()
    return cmd


def doc_examples() -> list[Example]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "examples" / "README.md"]
    out: list[Example] = []
    for f in files:
        if not f.exists():
            continue
        text = f.read_text()
        for block in re.findall(r"```[a-zA-Z]*\n(.*?)```", text, re.S):
            for c in _join_lines(block.split("\n")):
                out.append(Example(str(f.relative_to(ROOT)), _strip_comment(c)))
    return out


def help_examples() -> list[Example]:
    from fabricscope.cli import get_command

    out: list[Example] = []

    def walk(cmd: object, path: list[str]) -> None:
        text = getattr(cmd, "help", None) or ""
        if "Examples:" in text:
            body = text.split("Examples:", 1)[1]
            lines = [ln for ln in body.replace("\b", "").split("\n")]
            for c in _join_lines(lines):
                out.append(Example("help: " + " ".join(path), _strip_comment(c)))
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, [*path, name])

    walk(get_command(), [])
    return out


def _normalize(cmd: str, work: Path) -> str:
    cmd = cmd.replace("/tmp/", f"{work}/tmp/")
    cmd = cmd.replace("$D/", f"{DATASETS}/")

    def cap(m: re.Match[str]) -> str:
        return f"--duration {min(float(m.group(1)), 4.0):g}"

    return re.sub(r"--duration[ =](\d+(?:\.\d+)?)", cap, cmd)


def _skip_reason(cmd: str) -> str | None:
    for pat, why in SKIP:
        if re.search(pat, cmd):
            return why
    return None


def _is_server(cmd: str) -> bool:
    return bool(re.search(r"\bgnmi serve-twin\b", cmd)) and "--duration" not in cmd


def _port_of(cmd: str) -> int:
    m = re.search(r"--address[ =]\S*:(\d+)", cmd)
    return int(m.group(1)) if m else 9339


def _wait_port(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"server did not listen on {port} within {timeout} s")


def _sessions() -> dict[str, list[Example]]:
    sessions: dict[str, list[Example]] = {}
    for ex in [*doc_examples(), *help_examples()]:
        sessions.setdefault(ex.source, []).append(ex)
    return sessions


SESSIONS = _sessions()


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICSCOPE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    env["D"] = str(DATASETS)
    env["FABRICSCOPE_GNMI_PASSWORD"] = "s3cret-test"
    env["GNMI_PASSWORD"] = "s3cret-test"
    return env


def _scratch(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    (work / "tmp").mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    for f in (ROOT / "examples").iterdir():  # the examples also by bare name (fabric.yaml)
        if f.is_file():
            shutil.copy(f, work / f.name)
    if (ROOT / "tests" / "fixtures").is_dir():
        shutil.copytree(ROOT / "tests" / "fixtures", work / "tests" / "fixtures")
    return work


def test_every_example_is_listed_or_run() -> None:
    """The extraction finds the examples (a broken extractor must not pass by finding none)."""
    n = sum(len(v) for v in SESSIONS.values())
    assert n >= 30, f"only {n} examples found"
    assert any(s.startswith("help: ") for s in SESSIONS)


@pytest.mark.parametrize("source", sorted(SESSIONS), ids=lambda s: s.replace(" ", "_"))
def test_examples_run(source: str, tmp_path: Path) -> None:
    work = _scratch(tmp_path)
    env = _env(work)
    servers: list[subprocess.Popen[str]] = []
    failures: list[str] = []
    try:
        for pre in PRELUDE.get(source, []):
            r = subprocess.run(["bash", "-c", pre], cwd=work, env=env, capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, f"prelude {pre!r}: {r.stderr[-2000:]}"
        for ex in SESSIONS[source]:
            cmd = _normalize(ex.command, work)
            why = _skip_reason(ex.command)
            if why is not None:
                continue
            if _is_server(cmd):
                p = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=work, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                servers.append(p)
                _wait_port(_port_of(cmd), p)
                continue
            try:
                r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True,
                                   text=True, timeout=240)
            except subprocess.TimeoutExpired:
                failures.append(f"{ex.command}\n  -> timed out")
                continue
            out = r.stdout + r.stderr
            if r.returncode != 0 or "Traceback" in out:
                failures.append(f"{ex.command}\n  -> exit {r.returncode}: {out.strip()[-600:]}")
    finally:
        for p in servers:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                failures.append("a server example did not stop within 15 s of SIGTERM")
            err = p.stderr.read() if p.stderr else ""
            if p.returncode not in (0, 143, -signal.SIGTERM) or "Traceback" in err:
                failures.append(f"server exited {p.returncode}: {err[-600:]}")
    assert not failures, f"{source}: {len(failures)} example(s) failed:\n" + "\n".join(failures)
