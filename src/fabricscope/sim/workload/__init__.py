"""Workload generators (collectives, placement, jobs, traffic matrices, specs): the public API: collectives, placement, jobs, traffic matrices, specs.

See ``docs/workloads.md``. Everything here is pure: randomness comes in as ``seed``.
"""

from __future__ import annotations

from fabricscope.sim.workload.alphabeta import (
    alpha_beta_time,
    path_latency_s,
    ring_busbw_from_rates,
    ring_time_from_rates,
)
from fabricscope.sim.workload.collectives import (
    all_to_all,
    ring_collective,
    ring_steady_state,
    ring_steps,
)
from fabricscope.sim.workload.jobs import JobSpec, job_iteration, place_job
from fabricscope.sim.workload.placement import (
    PLACEMENT_POLICIES,
    GpuSlot,
    Placement,
    gpu_slots,
    place_ranks,
)
from fabricscope.sim.workload.spec import KINDS, estimate_flows, workload_from_spec
from fabricscope.sim.workload.traffic import (
    all_to_all_matrix,
    incast,
    parse_flow_csv,
    parse_flow_json,
    permutation,
    random_derangement,
    read_flow_list,
)
from fabricscope.sim.workload.trees import double_binary_tree, tree_allreduce
from fabricscope.sim.workload.units import parse_duration_ns, parse_size

__all__ = [
    "KINDS",
    "PLACEMENT_POLICIES",
    "GpuSlot",
    "JobSpec",
    "Placement",
    "all_to_all",
    "all_to_all_matrix",
    "alpha_beta_time",
    "double_binary_tree",
    "estimate_flows",
    "gpu_slots",
    "incast",
    "job_iteration",
    "parse_duration_ns",
    "parse_flow_csv",
    "parse_flow_json",
    "parse_size",
    "path_latency_s",
    "permutation",
    "place_job",
    "place_ranks",
    "random_derangement",
    "read_flow_list",
    "ring_busbw_from_rates",
    "ring_collective",
    "ring_steady_state",
    "ring_steps",
    "ring_time_from_rates",
    "tree_allreduce",
    "workload_from_spec",
]
