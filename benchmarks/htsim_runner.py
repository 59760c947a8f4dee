"""Run the packet-level reference htsim (ultraethernet/uet-htsim, ``htsim_uec``) on the same
flows as a fabricscope workload, side by side (docs/benchmarks/transport.md).

htsim is built outside the repository (SIMULATION.md §6: ``cmake -S htsim/sim -B build
-DCMAKE_BUILD_TYPE=Release && cmake --build build --target htsim_uec``); this module only
writes its connection-matrix file, runs the binary in a scratch directory and reads each flow's
``finished at`` time. NIC *i* of a fabricscope leaf-spine or fat tree is htsim host *i* (both
number hosts under their ToR in order), so the same file means the same pairs on both sides.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.flows import Workload

_FINISHED = re.compile(r"finished at ([0-9.]+)")


@dataclass(frozen=True)
class HtsimRun:
    fct_us: npt.NDArray[np.float64]  # completion time of every flow that finished (start 0)
    n_flows: int
    wall_s: float  # process start to exit


def write_connection_matrix(fabric: Fabric, workload: Workload, path: Path) -> None:
    """htsim's ``-tm`` file: ``SRC->DST start US size BYTES`` per flow, hosts numbered as NICs."""
    idx = {n.id: i for i, n in enumerate(fabric.nics)}
    lines = [f"Nodes {len(fabric.nics)}", f"Connections {len(workload.flows)}"]
    for f in workload.flows:
        if f.deps:
            raise ValueError("htsim side by side: flows with dependencies are not written")
        lines.append(f"{idx[f.src]}->{idx[f.dst]} start {int(f.start_ns // 1000)} size {int(f.size_bytes)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class Htsim:
    """``htsim_uec`` at ``binary`` with the topology files of ``topologies``."""

    def __init__(self, binary: Path, topologies: Path) -> None:
        if not binary.is_file():
            raise SystemExit(f"error: --htsim {binary}: no such file (build htsim_uec first, SIMULATION.md §6)")
        if not (topologies / "leaf_spine_1024.topo").is_file():
            raise SystemExit(f"error: --htsim-topologies {topologies}: leaf_spine_1024.topo not found there")
        self.binary = binary.resolve()
        self.topologies = topologies.resolve()

    def run(self, fabric: Fabric, workload: Workload, topo: str, args: list[str], *,
            end_us: int = 400_000) -> HtsimRun:
        """Run ``workload`` on ``topo`` (a file name in the topologies folder) with ``args``
        (e.g. ``-receiver_cc_only -paths 1``)."""
        with tempfile.TemporaryDirectory(prefix="htsim-") as tmp:
            cm = Path(tmp) / "flows.cm"
            write_connection_matrix(fabric, workload, cm)
            cmd = [str(self.binary), "-tm", str(cm), "-topo", str(self.topologies / topo), *args,
                   "-end", str(end_us)]
            t = time.perf_counter()
            out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t
        if out.returncode != 0:
            raise SystemExit(f"error: htsim failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
        fct = np.array([float(m.group(1)) for m in _FINISHED.finditer(out.stdout)])
        return HtsimRun(fct, len(workload.flows), wall)
