"""The real lab: agents in network namespaces localize a random injected gray link.

Runs as root only (CI is root); everything is torn down by the fixture's finalizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fabricscope.probe import lab
from fabricscope.probe.analysis import common_window, observations_from_samples
from fabricscope.service.probe_live import analyze_observations, read_paths
from fabricscope.store.probes import read_jsonl

pytestmark = [pytest.mark.netns, pytest.mark.slow]

CLI = [sys.executable, "-c", "from fabricscope.cli import main; main()"]
EPOCH = "3600"  # one plan for the whole test (traces and agents agree on the epoch)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[lab.Lab, Path]]:
    reason = lab.available()
    if reason:
        pytest.skip(f"lab: {reason}")
    prefix = f"ft{os.getpid() % 10000:04d}"
    tmp = tmp_path_factory.mktemp("lab")
    try:
        built_lab = lab.up(prefix=prefix)
    except Exception:
        lab.down(prefix=prefix)
        raise
    try:
        # Paris traceroute of every host's flows (both directions), all hosts at once.
        procs = [subprocess.Popen(["ip", "netns", "exec", built_lab.ns(h.id), *CLI, "lab", "trace",
                                   "--prefix", prefix, "--self", h.id, "--epoch", EPOCH,
                                   "--out", str(tmp / f"paths-{h.id}.json")],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for h in built_lab.fabric.hosts]
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
        merged = [e for f in tmp.glob("paths-*.json") for e in json.loads(f.read_text())]
        (tmp / "paths.json").write_text(json.dumps(merged))
        yield built_lab, tmp
    finally:
        lab.down(prefix=prefix)
        assert not [n for n in lab._netns() if n.startswith(prefix)]


def _probe(built_lab: lab.Lab, tmp: Path, tag: str, seconds: int) -> list:  # type: ignore[type-arg]
    procs = []
    for h in built_lab.fabric.hosts:
        out = tmp / f"{tag}-{h.id}.jsonl"
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", built_lab.ns(h.id), *CLI, "probe", "agent", "-i",
             str(built_lab.inventory_path), "--self", h.id, "--jsonl", str(out), "--duration",
             str(seconds), "--epoch", EPOCH, "--rate", "100"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        assert p.returncode == 0, out
    rows = [r for f in tmp.glob(f"{tag}-*.jsonl") for r in read_jsonl(f)]
    obs = observations_from_samples([s for s, _ in rows], [st for _, st in rows])
    # Agents start and stop at different times: analyze the window where all were running.
    obs = obs.window(*common_window(obs))
    assert len(obs) > 1000
    return analyze_observations(built_lab.fabric, obs,
                                paths=read_paths(tmp / "paths.json", built_lab.fabric))


def test_lab_localizes_random_gray_link_within_60s(built: tuple[lab.Lab, Path]) -> None:
    built_lab, tmp = built
    f = built_lab.fabric
    seed = int(os.environ.get("FABRICSCOPE_LAB_SEED", "7"))
    link = f.index.edge_id(int(np.random.default_rng(seed).integers(f.index.n_edges)))
    lab.fault(built_lab, link, loss_pct=10)
    t0 = time.monotonic()
    try:
        findings = _probe(built_lab, tmp, "fault", 20)
    finally:
        lab.clear_faults(built_lab)
    elapsed = time.monotonic() - t0
    assert findings, f"no finding for {link}"
    assert (findings[0].kind, findings[0].subject) == ("gray-link", link), findings[:3]
    assert elapsed < 60


def test_lab_fault_free_run_has_no_findings(built: tuple[lab.Lab, Path]) -> None:
    built_lab, tmp = built
    assert _probe(built_lab, tmp, "clean", 15) == []
