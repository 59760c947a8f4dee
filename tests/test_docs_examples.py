"""Every command shown in the README, docs/ and a ``--help`` "Examples:" section runs when pasted.

Commands are extracted from fenced code blocks (README.md, docs/**/*.md) and from the help
of every command, then run through ``bash`` in order, one session per page / per command's
help, in a scratch folder holding a copy of ``examples/``. What the test changes in a
command is stated here and nowhere else:

* ``/tmp/`` becomes the session's scratch folder (a lab's own state folder,
  ``/tmp/fabricscope-lab-*``, stays), and ``--duration N`` above 8 s becomes 8 s (the shape
  of the command is what is tested, not its patience);
* ``$D`` is the shared datasets folder; an example that reads it is skipped (with the
  reason) where the datasets are absent, as the dataset tests are;
* a code block with shell constructs (a loop, a variable) runs as one script;
* a server example (``gnmi serve-twin`` without ``--duration``, ``serve``) is started in the background
  for the rest of its session (a later server replaces it) and stopped with SIGTERM at the
  end (exit 0 or 143 expected);
* a command that streams until stopped (``gnmi subscribe``, ``gnmi collect`` or ``probe
  agent`` without ``--duration``) runs for 6 s, must have printed something, and must exit
  130 on Ctrl-C (SIGINT);
* lab examples (``lab ...``, ``ip netns exec``) need root, ``nft`` and ``ip``; without them
  they are skipped with the reason (CI runs as root);
* ``PRELUDE`` makes the input files a page takes for granted (a trace folder, a running
  target); a command in ``SKIP`` is not run, with its reason; every other one must run.

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
    (r"^fabricscope cluster (status|member)\b", "needs a running nats-server with JetStream; "
     "tests/test_cluster_membership.py runs both against a real one"),
    (r"^fabricscope probe agent\b.*--nats\b", "needs a running nats-server and the host's own NIC addresses; "
     "tests/test_cluster_probes.py runs two agents on loopback against a real one"),
    (r"^fabricscope gnmi collect --cluster\b", "needs a running nats-server with JetStream; "
     "tests/test_cluster_e2e.py runs three members against a real one"),
    (r"^(FABRICSCOPE_NATS_PASSWORD=\S+ )?fabricscope worker\b", "needs a running nats-server with JetStream; "
     "tests/test_cluster_e2e.py runs it against a real one"),
]

_SERVE = "&fabricscope gnmi serve-twin --topo leaf-spine:leaves=4,hosts_per_leaf=4,spines=2"
_TRACES = [
    "fabricscope straggler twin traces-run --comm alpha-beta --iterations 6",
    "ln -s traces-run/kineto traces",
    'if [ -e "$D/bytedance-straggler/trace-AR.parquet" ]; then '
    'ln -s "$D/bytedance-straggler/trace-AR.parquet" .; fi',
]
_LOOP = ('fabricscope supervise --twin rail-optimized:servers=8 --duration 2m --fault '
         '"gray-loss:leaf-p0-r1-00:eth3->host0002/nic1:p0@30s,loss=0.03" --db incidents.duckdb')
# Files a page's examples take for granted, made before its first command runs; a line
# starting with "&" is a server kept running for the session.
PRELUDE: dict[str, list[str]] = {
    "help: incidents": [_LOOP],
    "help: incidents list": [_LOOP],
    "help: incidents show": [_LOOP],
    "help: incidents export": [_LOOP],
    "help: diagnose": [_LOOP],
    "docs/straggler.md": [*_TRACES, "fabricscope straggler twin run --comm alpha-beta --iterations 6"],
    "help: straggler": _TRACES,
    "help: straggler analyze": _TRACES,
    "help: topo show": [
        "fabricscope topo build rail-optimized:servers=128 -o rail-1k.yaml",
        "fabricscope topo build rail-optimized:servers=4096 -o rail-32k.json",
    ],
    "help: gnmi collect": [_SERVE],
    "help: gnmi get": [_SERVE],
    "help: gnmi subscribe": [_SERVE],
    "help: gnmi query": [
        _SERVE, "fabricscope gnmi collect -c collector.yaml --duration 4",
    ],
    "help: gnmi serve-twin": [
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout key.pem"
        " -out cert.pem -subj /CN=localhost -days 1"
        " -addext subjectAltName=DNS:localhost,IP:127.0.0.1",
    ],
}


@dataclass(frozen=True)
class Example:
    source: str  # "docs/sim.md" or "help: sim"
    command: str
    script: bool = False  # a whole code block run as one bash script


_CMD_START = re.compile(
    r"^(?:\$ )?(?:[A-Z_][A-Z0-9_]*=\S+ )*(?:fabricscope|make|python|ip netns exec)\b")
_SHELL = re.compile(r"^\s*(?:for |while |if |done\b|fi\b|[A-Za-z_][A-Za-z0-9_]*=\S*\s*$)")


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
            lines = block.split("\n")
            if any(_SHELL.match(ln) for ln in lines):
                out.append(Example(str(f.relative_to(ROOT)), block, script=True))
                continue
            for c in _join_lines(lines):
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
    cmd = re.sub(r"/tmp/(?!fabricscope-lab-)", f"{work}/tmp/", cmd)
    cmd = cmd.replace("$D/", f"{DATASETS}/")

    def cap(m: re.Match[str]) -> str:
        return f"--duration {min(float(m.group(1)), 8.0):g}"

    return re.sub(r"--duration[ =](\d+(?:\.\d+)?)", cap, cmd)


def _lab_ready() -> str | None:
    """None when lab examples can run here, else why not."""
    if os.geteuid() != 0:
        return "lab examples need root (CI runs as root)"
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"lab examples need `{tool}` (apt-get install iproute2 nftables)"
    return None


def _skip_reason(cmd: str) -> str | None:
    for pat, why in SKIP:
        if re.search(pat, cmd):
            return why
    if re.search(r"\bfabricscope lab (up|fault|down|trace)\b|\bip netns exec\b", cmd):
        why = _lab_ready()
        if why:
            return why
    if ("$D/" in cmd or "trace-AR.parquet" in cmd) and not DATASETS.is_dir():
        return f"needs the shared datasets ({DATASETS} is absent)"
    return None


def _is_server(cmd: str) -> bool:
    if re.search(r"^fabricscope serve\b", cmd):
        return "--help" not in cmd
    return bool(re.search(r"\bgnmi serve-twin\b", cmd)) and "--duration" not in cmd


def _is_stream(cmd: str) -> bool:
    """Runs until stopped: the user watches it and presses Ctrl-C."""
    if "--duration" in cmd:
        return False
    if re.search(r"\bgnmi subscribe\b", cmd):
        return not re.search(r"--mode[ =](once|poll)", cmd)
    return bool(re.search(r"\bgnmi collect\b|\bprobe agent\b", cmd))


def _lab_prefixes(cmd: str) -> set[str]:
    if not re.search(r"\blab up\b", cmd):
        return set()
    return set(re.findall(r"--prefix[ =](\S+)", cmd)) or {"fsl"}


def _port_of(cmd: str) -> int:
    m = re.search(r"--address[ =]\S*:(\d+)", cmd) or re.search(r"--port[ =](\d+)", cmd)
    if m:
        return int(m.group(1))
    return 8765 if re.search(r"^fabricscope serve\b", cmd) else 9339


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
    env["XDG_CONFIG_HOME"] = str(work / ".config")  # `serve` writes its token file there
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
    for sub in ("fixtures", "data"):  # docs examples read real samples (tests/data/*/README.md)
        if (ROOT / "tests" / sub).is_dir():
            shutil.copytree(ROOT / "tests" / sub, work / "tests" / sub)
    return work


def test_every_example_is_listed_or_run() -> None:
    """The extraction finds the examples (a broken extractor must not pass by finding none)."""
    n = sum(len(v) for v in SESSIONS.values())
    assert n >= 30, f"only {n} examples found"
    assert any(s.startswith("help: ") for s in SESSIONS)


def _exec(cmd: str) -> str:
    """``exec`` the command (so a signal reaches it, not a shell); env assignments via env."""
    return f"exec env {cmd}" if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd) else f"exec {cmd}"


def _stop_server(p: subprocess.Popen[str], failures: list[str]) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        failures.append("a server example did not stop within 15 s of SIGTERM")
    if p.returncode not in (0, 143) or "Traceback" in (err or ""):
        failures.append(f"server exited {p.returncode}: {(err or '')[-600:]}")


def _default_sigint() -> None:
    # A user's Ctrl-C reaches a foreground command with SIGINT at its default; a test run
    # started in the background of a non-interactive shell ignores SIGINT, and an ignored
    # signal is inherited across exec: give the command what a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_stream(cmd: str, work: Path, env: dict[str, str]) -> str | None:
    """Run a streaming command for 6 s, then Ctrl-C; None when it behaved, else why not."""
    p = subprocess.Popen(["bash", "-c", _exec(cmd)], cwd=work, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_default_sigint)
    try:
        out, err = p.communicate(timeout=6)
        return f"exited {p.returncode} before Ctrl-C: {(out + err).strip()[-600:]}"
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        return "did not stop within 20 s of Ctrl-C"
    if p.returncode != 130 or "Traceback" in out + err:
        return f"exit {p.returncode} on Ctrl-C (130 expected): {(out + err).strip()[-600:]}"
    if not (out + err).strip():
        return "printed nothing in 6 s"
    return None


@pytest.mark.parametrize("source", sorted(SESSIONS), ids=lambda s: s.replace(" ", "_"))
def test_examples_run(source: str, tmp_path: Path) -> None:
    work = _scratch(tmp_path)
    env = _env(work)
    server: subprocess.Popen[str] | None = None
    failures: list[str] = []
    skipped: list[str] = []
    labs: set[str] = set()

    def serve(cmd: str) -> subprocess.Popen[str]:
        nonlocal server
        if server is not None:  # one port, one server: the next example replaces it
            _stop_server(server, failures)
        server = subprocess.Popen(["bash", "-c", _exec(cmd)], cwd=work, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_port(_port_of(cmd), server)
        return server

    try:
        for pre in PRELUDE.get(source, []):
            if pre.startswith("&"):
                serve(pre[1:])
                continue
            r = subprocess.run(["bash", "-c", pre], cwd=work, env=env, capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, f"prelude {pre!r}: {r.stderr[-2000:]}"
        for ex in SESSIONS[source]:
            cmd = _normalize(ex.command, work)
            why = _skip_reason(ex.command)
            if why is not None:
                skipped.append(f"{ex.command.splitlines()[0]} ({why})")
                continue
            labs |= _lab_prefixes(cmd)
            if not ex.script and _is_server(cmd):
                serve(cmd)
                continue
            if not ex.script and _is_stream(cmd):
                bad = _run_stream(cmd, work, env)
                if bad:
                    failures.append(f"{ex.command}\n  -> {bad}")
                continue
            script = f"set -e\n{cmd}" if ex.script else cmd
            try:
                r = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                                   text=True, timeout=420 if ex.script else 240)
            except subprocess.TimeoutExpired:
                failures.append(f"{ex.command}\n  -> timed out")
                continue
            out = r.stdout + r.stderr
            if r.returncode != 0 or "Traceback" in out:
                failures.append(f"{ex.command}\n  -> exit {r.returncode}: {out.strip()[-600:]}")
    finally:
        if server is not None:
            _stop_server(server, failures)
        for prefix in labs:  # a failed lab example must not leave namespaces behind
            subprocess.run([str(BIN / "fabricscope"), "lab", "down", "--prefix", prefix],
                           capture_output=True, timeout=120, env=env)
    if skipped:
        print(f"{source}: not run here: " + "; ".join(skipped))
    assert not failures, f"{source}: {len(failures)} example(s) failed:\n" + "\n".join(failures)
