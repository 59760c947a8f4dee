"""The real lab, no traced paths: 5 % random drop (nftables ``numgen random mod 100 < 5``) on
one spine->leaf port. Without traceroute every flow into that leaf may cross either spine,
so the analysis must report the tie, never one of the two links at score >= 0.99.

Runs as root only (CI is root); the lab is torn down by the fixture's finalizer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricscope.probe import lab
from fabricscope.probe.analysis import check_inputs, common_window, observations_from_samples
from fabricscope.service.probe_live import analyze_observations
from fabricscope.store.probes import read_jsonl

pytestmark = [pytest.mark.netns, pytest.mark.slow]

CLI = [sys.executable, "-c", "from fabricscope.cli import main; main()"]
LINK = "spine-01:eth3->leaf-002:eth4"  # the port
TWIN = "spine-00:eth3->leaf-002:eth3"  # the other spine's downlink into leaf-002


@pytest.fixture(scope="module")
def built() -> Iterator[lab.Lab]:
    reason = lab.available()
    if reason:
        pytest.skip(f"lab: {reason}")
    prefix = f"fa{os.getpid() % 10000:04d}"
    try:
        built_lab = lab.up(prefix=prefix)
    except Exception:
        lab.down(prefix=prefix)
        raise
    try:
        yield built_lab
    finally:
        lab.down(prefix=prefix)
        assert not [n for n in lab._netns() if n.startswith(prefix)]


def test_lab_untraced_tie_is_reported_as_the_set(built: lab.Lab, tmp_path: Path) -> None:
    f = built.fabric
    f.edge_index(LINK)  # the lab's shape is the (4 leaves x 2 spines)
    desc = lab.fault(built, LINK, loss_pct=5)
    assert "5% random drop" in desc
    try:
        procs = [subprocess.Popen(
            ["ip", "netns", "exec", built.ns(h.id), *CLI, "probe", "agent", "-i",
             str(built.inventory_path), "--self", h.id, "--jsonl", str(tmp_path / f"{h.id}.jsonl"),
             "--duration", "25", "--epoch", "3600", "--rate", "100"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for h in f.hosts]
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
    finally:
        lab.clear_faults(built)
    rows = [r for x in tmp_path.glob("*.jsonl") for r in read_jsonl(x)]
    obs = observations_from_samples([s for s, _ in rows], [st for _, st in rows])
    check_inputs(f, obs, source="lab")
    obs = obs.window(*common_window(obs))
    assert len(obs) > 5000
    found = analyze_observations(f, obs)  # no paths: candidate ECMP sets only
    assert found, "the 5 % drop was not detected"
    for x in found:
        if x.score >= 0.99:
            assert LINK in x.subject.split(" | "), f"confident and wrong: {x.kind} {x.subject} {x.score}"
    top = found[0].subject.split(" | ")
    assert LINK in top
    assert TWIN in top, "the two spines' downlinks are indistinguishable without paths"
    assert found[0].details["candidates"] == len(top) >= 2
