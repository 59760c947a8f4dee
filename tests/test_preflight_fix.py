"""--fix: real writes into a copy of the untuned tree, then the undo script restores it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fabricscope.preflight import apply_fixes, plan_fixes, read_host, run_preflight
from fabricscope.preflight.fix import FixError
from fabricscope.preflight.profiles import PROFILES

DATA = Path(__file__).parent / "data" / "preflight"
PROF = PROFILES["training"]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _facts(root: Path) -> object:
    paths = [c.path for c in PROF.checks if c.kind == "sysctl"]
    return read_host(root, sysctl_paths=paths)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "untuned"
    shutil.copytree(DATA / "untuned", root)
    return root


def test_fix_then_undo_restores(host: Path, tmp_path: Path) -> None:
    before_bytes = _snapshot(host)
    before = _facts(host)
    _, results, _ = run_preflight(PROF, root=host)
    plan = plan_fixes(results, allow_commands=False)
    refused = {r.check for r, _ in plan.refused}
    assert {"nic.mtu", "nic.speed", "iommu", "irqbalance", "hugepages"} <= refused
    assert "nic.ring" in refused  # ethtool -G never runs against a fixture root
    undo = tmp_path / "undo.sh"
    n = apply_fixes(plan, root=str(host), undo_path=undo, hostname="h", written_at="t")
    assert n == len(plan.actions) > 0
    # the undo script exists, is plain sh, and holds every previous value
    text = undo.read_text()
    assert text.startswith("#!/bin/sh\n")
    for a in plan.actions:
        assert a.path in text
    # the changed checks now pass, the refused ones still do not
    _, after, _ = run_preflight(PROF, root=host)
    fixed = {(r.check, r.subject) for r, _ in plan.apply}
    for r in after:
        if (r.check, r.subject) in fixed:
            assert r.status == "pass", (r.check, r.subject, r.current)
    assert (host / "proc/sys/net/ipv4/tcp_tw_reuse").read_text() == "1\n"
    subprocess.run(["sh", str(undo)], check=True)
    assert _facts(host) == before
    # sysctl, affinity and governor files come back byte for byte; THP's enabled file is
    # written as the bare mode, as the kernel takes it, so only its value is restored
    after_bytes = _snapshot(host)
    diff = sorted(k for k in before_bytes if before_bytes[k] != after_bytes[k])
    assert diff == ["sys/kernel/mm/transparent_hugepage/enabled"]


def test_ring_commands_with_undo(host: Path, tmp_path: Path) -> None:
    _, results, _ = run_preflight(PROF, root=host)
    plan = plan_fixes([r for r in results if r.check == "nic.ring"], allow_commands=True)
    ran: list[tuple[str, ...]] = []
    undo = tmp_path / "undo.sh"
    apply_fixes(plan, root=str(host), undo_path=undo, hostname="h", written_at="t",
                run_command=lambda argv: ran.append(tuple(argv)))
    assert ran == [("ethtool", "-G", "eno1", "rx", "4096", "tx", "4096"),
                   ("ethtool", "-G", "ens1f0np0", "rx", "8192", "tx", "8192")]
    # the undo script runs ethtool with the previous sizes: use a fake ethtool on PATH
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "log"
    (bindir / "ethtool").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bindir / "ethtool").chmod(0o755)
    import os

    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    subprocess.run(["sh", str(undo)], check=True, env=env)
    assert log.read_text().splitlines() == ["-G ens1f0np0 rx 1024 tx 1024",
                                            "-G eno1 rx 1024 tx 1024"]


def test_failed_write_stops_and_names_undo(host: Path, tmp_path: Path) -> None:
    _, results, _ = run_preflight(PROF, root=host)
    plan = plan_fixes(results, allow_commands=False)
    victim = host / plan.actions[1].path
    victim.unlink()
    victim.mkdir()  # writing to a directory fails like a read-only /proc file
    undo = tmp_path / "u.sh"
    with pytest.raises(FixError, match=r"1 of \d+ change\(s\) applied; undo with: sh "):
        apply_fixes(plan, root=str(host), undo_path=undo, hostname="h", written_at="t")
    assert undo.exists()
