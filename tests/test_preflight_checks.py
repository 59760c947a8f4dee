"""Checks and profiles: tuned tree passes, untuned tree fails where its files say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.preflight import exit_code, findings, load_profile, run_preflight
from fabricscope.preflight.checks import compare_value
from fabricscope.preflight.profiles import PROFILES, CheckSpec

DATA = Path(__file__).parent / "data" / "preflight"


def _by(results: list, check: str, subject_end: str = "") -> object:
    got = [r for r in results if r.check == check and r.subject.endswith(subject_end)]
    assert len(got) == 1, (check, subject_end, got)
    return got[0]


def test_tuned_host_passes_everything() -> None:
    _, results, _ = run_preflight(PROFILES["training"], root=DATA / "tuned")
    bad = [(r.check, r.subject, r.status) for r in results if r.status != "pass"]
    assert bad == []
    assert exit_code(results) == 0


def test_untuned_host_fails_where_its_files_differ() -> None:
    root = DATA / "untuned"
    prof = PROFILES["training"]
    _, results, _ = run_preflight(prof, root=root)
    for spec in prof.checks:
        if spec.kind != "sysctl":
            continue
        cur = " ".join((root / spec.path).read_text().split())
        r = _by(results, spec.id)
        assert r.current == cur
        assert (r.status == "pass") == compare_value(cur, spec)
        if r.status != "pass":
            assert r.status == spec.severity and r.fix.startswith("sysctl -w ")
    assert _by(results, "thp").status == "fail"
    assert _by(results, "nic.irq_affinity", "/ens1f0np0").status == "fail"
    assert _by(results, "nic.irq_affinity", "/eno1").status == "fail"
    assert _by(results, "irqbalance").status == "warn"
    assert _by(results, "nic.ring", "/eno1").fix == "ethtool -G eno1 rx 4096 tx 4096"
    assert _by(results, "hugepages").status == "warn"  # node1 has none free
    assert exit_code(results) == 1
    fs = findings(results, hostname="gpu-train-12", now_ns=5)
    assert {f.details["check"] for f in fs} == {r.check for r in results if r.status == "fail"}
    assert all(f.kind == "host-misconfig" and f.subject == "gpu-train-12" for f in fs)


def test_irq_affinity_pass_requires_subset_of_node(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "h"
    shutil.copytree(DATA / "tuned", root)
    (root / "proc/irq/101/smp_affinity_list").write_text("15-16\n")  # one CPU on node1
    _, results, _ = run_preflight(PROFILES["training"], root=root)
    r = _by(results, "nic.irq_affinity", "/ens1f0np0")
    assert r.status == "fail" and "101->15-16" in r.current


def test_compare_value() -> None:
    spec = CheckSpec("x", "sysctl", "1024 65535", "range_covers", path="proc/sys/x")
    assert compare_value("1000 65535", spec) and not compare_value("32768 60999", spec)
    assert compare_value("70000", CheckSpec("y", "sysctl", "65535", "ge"))
    assert not compare_value("n/a", CheckSpec("y", "sysctl", "65535", "ge"))


def test_inference_profile_differs() -> None:
    _, results, _ = run_preflight(PROFILES["inference"], root=DATA / "tuned")
    cc = _by(results, "sysctl.net.ipv4.tcp_congestion_control")
    assert cc.status == "warn" and cc.recommended == "bbr"


def test_yaml_override_and_add(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("base: training\ndisable: [nic.mtu]\nchecks:\n"
                 "  - id: sysctl.net.core.somaxconn\n    recommended: 4096\n"
                 "  - id: sysctl.vm.swappiness\n    kind: sysctl\n"
                 "    path: proc/sys/vm/swappiness\n    recommended: 10\n    compare: le\n")
    prof = load_profile(str(p))
    assert prof.check("nic.mtu") is None
    assert prof.check("sysctl.net.core.somaxconn").recommended == "4096"  # type: ignore[union-attr]
    _, results, _ = run_preflight(prof, root=DATA / "untuned")
    assert _by(results, "sysctl.net.core.somaxconn").status == "pass"
    assert _by(results, "sysctl.vm.swappiness").status == "skip"  # not in the tree


@pytest.mark.parametrize("text,match", [
    ("checks:\n  - id: a\n    kind: nope\n    recommended: 1\n", r"checks\[0\]\.kind: 'nope'"),
    ("checks:\n  - id: a\n    kind: sysctl\n    path: etc/x\n    recommended: 1\n",
     r"checks\[0\]\.path: 'etc/x'"),
    ("base: hpc\n", r"base: 'hpc'"),
    ("checks: [\n", r"line \d+ not valid YAML"),
])
def test_yaml_errors_name_field(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_profile(str(p))
