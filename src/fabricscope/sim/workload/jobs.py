"""A hybrid DP x TP x PP training job: rank layout (Megatron-style) and one iteration's flows.

Layout follows Megatron-LM (Shoeybi et al. 2019; Narayanan et al., SC'21): global rank
``r = t + tp * (d + dp * p)`` for tensor-parallel index ``t``, data-parallel index ``d`` and
pipeline stage ``p``; ranks are placed in order on GPU slots, so a TP group lives inside one
server (its all-reduces are NVLink traffic, not fabric flows), a pipeline stage is a block
of ``dp * tp`` consecutive GPUs, and DP groups (same ``p``, ``t``) span servers on one rail.

One iteration (pipeline with ``microbatches`` micro-batches):

* forward: stage ``p`` sends micro-batch ``m``'s activations to stage ``p+1``
  (``activation_bytes / tp`` per TP rank) ``fwd_compute_ns`` after it received them and
  after its previous send (one micro-batch at a time);
* backward (1F1B-like): the last stage starts micro-batch ``m``'s backward when its forward
  arrived; stage ``p`` sends the gradient of ``m`` to ``p-1`` ``bwd_compute_ns`` after it
  received it from ``p+1``;
* data-parallel gradient sync per (stage, TP index): a ring all-reduce (or reduce-scatter,
  ZeRO / FSDP style) of ``grad_bytes / (pp * tp)`` among the DP replicas, once the stage's
  last backward is done.

Compute phases are ``gap_ns`` of the flows they precede. Simplification: a stage's forward
and backward compute are not serialized against each other (the flow model has no compute
resource), so the DAG is a lower bound on a real 1F1B schedule's time.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import WorkloadError
from fabricscope.sim.flows import Workload
from fabricscope.sim.workload.build import FlowList, connection_port
from fabricscope.sim.workload.collectives import add_ring, ring_steps
from fabricscope.sim.workload.placement import Placement, place_ranks


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Parallelism degrees and per-iteration sizes / compute times of a training job."""

    dp: int
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    grad_bytes: float = 1 << 30  # all gradients of the model (bf16), split over pp * tp
    activation_bytes: float = 16 << 20  # one micro-batch's activations between stages
    fwd_compute_ns: int = 0  # per micro-batch, per stage
    bwd_compute_ns: int = 0
    dp_collective: str = "allreduce"  # or "reducescatter" (ZeRO / FSDP)
    channels: int = 1  # rings per DP group

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def rank(self, d: int, t: int, p: int) -> int:
        """Megatron global rank of data-parallel index ``d``, TP index ``t``, stage ``p``."""
        return t + self.tp * (d + self.dp * p)

    def validate(self, gpus_per_host: int) -> None:
        for k in ("dp", "tp", "pp", "microbatches", "channels"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise WorkloadError(f"job: {k}: must be an integer >= 1, got {v!r}")
        if gpus_per_host % self.tp:
            raise WorkloadError(
                f"job: tp: {self.tp} does not divide the {gpus_per_host} GPUs of a server "
                "(TP groups must stay inside a server)"
            )
        if self.dp_collective not in ("allreduce", "reducescatter"):
            raise WorkloadError(
                f"job: dp_collective: unknown {self.dp_collective!r} (allreduce or reducescatter)"
            )
        for k in ("grad_bytes", "activation_bytes"):
            if not getattr(self, k) > 0:
                raise WorkloadError(f"job: {k}: must be > 0, got {getattr(self, k)!r}")
        for k in ("fwd_compute_ns", "bwd_compute_ns"):
            if getattr(self, k) < 0:
                raise WorkloadError(f"job: {k}: must be >= 0, got {getattr(self, k)!r}")


def place_job(fabric: Fabric, job: JobSpec) -> Placement:
    """Megatron rank -> GPU mapping: ranks in order on GPU slots (TP inside a server)."""
    placement = place_ranks(fabric, job.world_size, policy="in-order")
    gpus = len(placement.rail_nics[placement.host(0)])
    job.validate(gpus)
    return placement


def job_iteration(fabric: Fabric, job: JobSpec, *, name: str | None = None) -> Workload:
    """The fabric flows of one training iteration of ``job`` on ``fabric``."""
    pl = place_job(fabric, job)
    fl = FlowList()
    dp, tp, pp, mb = job.dp, job.tp, job.pp, job.microbatches
    act = job.activation_bytes / tp

    def p2p(a: int, b: int, deps: list[int], gap: int, tag: str) -> int | None:
        """One stage-to-stage transfer; None when both ranks share a host (NVLink)."""
        if pl.host(a) == pl.host(b):
            return None
        s, t = pl.nic(a), pl.nic(b)
        return fl.add(s, t, act, deps=deps, gap_ns=gap, tag=tag,
                      src_port=connection_port(s, t, tag))

    # fwd[m][p][(d,t)]: id of the flow carrying micro-batch m from stage p to p+1 (or None)
    last_done: dict[tuple[int, int, int], list[int]] = {}  # (d, t, p) -> deps ending stage p's work
    for d in range(dp):
        for t in range(tp):
            prev_fwd: list[int | None] = [None] * pp
            prev_bwd: list[int | None] = [None] * pp
            fwd_in: list[list[int | None]] = [[None] * pp for _ in range(mb)]
            for m in range(mb):
                for p in range(pp - 1):
                    deps = _ids(fwd_in[m][p], prev_fwd[p])
                    # Without a dependency (first micro-batch, or inputs that came over
                    # NVLink) the stage is ready after the pipeline's m + p + 1 forwards.
                    f = p2p(job.rank(d, t, p), job.rank(d, t, p + 1), deps,
                            job.fwd_compute_ns * (1 if deps else m + p + 1), f"pp-fwd/s{p}")
                    fwd_in[m][p + 1] = f
                    prev_fwd[p] = f if f is not None else prev_fwd[p]
            bwd_in: list[list[int | None]] = [[None] * pp for _ in range(mb)]
            for m in range(mb):
                for p in range(pp - 1, 0, -1):
                    arrive = fwd_in[m][p] if p == pp - 1 else bwd_in[m][p]
                    deps = _ids(arrive, prev_bwd[p])
                    gap = job.bwd_compute_ns + (job.fwd_compute_ns if p == pp - 1 else 0)
                    f = p2p(job.rank(d, t, p), job.rank(d, t, p - 1), deps, gap, f"pp-bwd/s{p}")
                    bwd_in[m][p - 1] = f
                    prev_bwd[p] = f if f is not None else prev_bwd[p]
            for p in range(pp):
                done = prev_bwd[p] if p > 0 else bwd_in[mb - 1][0]
                last_done[(d, t, p)] = [] if done is None else [done]
    # Data-parallel gradient sync, one ring per (stage, TP index).
    grad = job.grad_bytes / (pp * tp)
    steps = ring_steps(job.dp_collective, dp) if dp > 1 else 0
    idle_ns = mb * (job.fwd_compute_ns + job.bwd_compute_ns)
    for p in range(pp):
        for t in range(tp):
            members = [job.rank(d, t, p) for d in range(dp)]
            after = sorted({i for d in range(dp) for i in last_done[(d, t, p)]})
            # Stage p > 0 is done when its last gradient send left; stage 0 (and a pipeline
            # without fabric hops) ends with a backward compute no flow carries: add it.
            gap = (job.bwd_compute_ns if p == 0 else 0) if after else idle_ns
            for c in range(job.channels):
                add_ring(fl, pl, members, steps=steps, chunk_bytes=grad / (job.channels * dp),
                         channel=c, rail_aligned=False, after=after, gap_ns=gap,
                         tag=f"dp-{job.dp_collective}/s{p}/t{t}/ch{c}")
    if not len(fl):
        raise WorkloadError(
            f"job dp={dp} tp={tp} pp={pp}: every transfer stays inside a server: no fabric flows"
        )
    return Workload(
        name=name or f"job-dp{dp}-tp{tp}-pp{pp}",
        flows=fl.flows(),
        collective="none",
        n_ranks=job.world_size,
        size_bytes=grad,
        meta={"dp": dp, "tp": tp, "pp": pp, "microbatches": mb, "dp_collective": job.dp_collective,
              "grad_bytes_per_group": grad, "activation_bytes_per_rank": act,
              "tp_traffic": "NVLink (not in the fabric)"},
    )


def _ids(*xs: int | None) -> list[int]:
    return [x for x in xs if x is not None]
