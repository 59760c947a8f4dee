"""Ring collectives (all-reduce, all-gather, reduce-scatter) and all-to-all as FlowSpec DAGs.

Ring all-reduce follows NCCL (and Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 2009): the per-rank buffer ``S`` is split
over ``channels`` rings; on each ring it is cut into ``n`` chunks and every rank sends one
chunk of ``S / (channels * n)`` bytes to its ring successor in each of ``2(n-1)`` steps
(``n-1`` reduce-scatter steps then ``n-1`` all-gather steps). All-gather and reduce-scatter
are the ``n-1``-step halves. Byte counts therefore match nccl-tests: a rank sends
``2(n-1)/n * S`` for all-reduce and ``(n-1)/n * S`` for the others.

Dependencies: the step-``k`` transfer of hop ``a -> b`` waits for the hop's own step
``k-1`` (one connection, in order) and for the step ``k-1`` transfer *into* ``a`` (a rank
forwards what it received). Hops between ranks of one host run over NVLink, which is not in
the fabric: they are not flows, and treated as instantaneous, so a fabric hop's upstream
dependency skips back over them (``d`` hops back, step ``k-d``).

Rail alignment (NCCL's PXN / rail-local rings): with ``rail_aligned=True`` channel ``c``
crosses between servers on the NICs of rail ``c`` at both ends, whatever GPU sits at the
ring position; with ``ring_order="host"`` the ring visits the ranks of a server
consecutively (NCCL's topology-aware ring), so a channel crosses each server boundary once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fabricscope.model.errors import WorkloadError
from fabricscope.sim.flows import Collective, FlowSpec, Workload
from fabricscope.sim.workload.build import FlowList, connection_port
from fabricscope.sim.workload.placement import Placement

RingOrder = Literal["host", "rank"]
RING_COLLECTIVES: tuple[str, ...] = ("allreduce", "allgather", "reducescatter")


def ring_steps(collective: str, n: int) -> int:
    """Steps of a ring ``collective`` over ``n`` ranks: 2(n-1) for all-reduce, else n-1."""
    if collective == "allreduce":
        return 2 * (n - 1)
    if collective in ("allgather", "reducescatter"):
        return n - 1
    raise WorkloadError(
        f"ring: collective: unknown {collective!r} (choose one of {', '.join(RING_COLLECTIVES)})"
    )


def default_channels(placement: Placement, rail_aligned: bool) -> int:
    """NCCL-like default: one channel per rail (NICs per server) when rail-aligned, else 1."""
    if not rail_aligned:
        return 1
    return max(len(placement.rail_nics[h]) for h in placement.hosts)


def ring_order(placement: Placement, order: str = "host") -> tuple[int, ...]:
    """The ranks in ring order: by host (topology-aware, NCCL) or by rank number."""
    if order == "rank":
        return tuple(range(placement.n_ranks))
    if order == "host":
        return tuple(r for h in placement.hosts for r in placement.ranks_of_host[h])
    raise WorkloadError(f"ring: ring_order: unknown {order!r} (choose 'host' or 'rank')")


def cross_hops(placement: Placement, members: Sequence[int]) -> list[int]:
    """Positions ``j`` of the ring hops ``members[j] -> members[j+1]`` that change host."""
    slots = placement.slots
    hosts = [slots[r].host for r in members]
    return [j for j in range(len(hosts)) if hosts[j] != hosts[(j + 1) % len(hosts)]]


def fabric_hops(
    placement: Placement,
    members: Sequence[int],
    *,
    channel: int,
    rail_aligned: bool,
    cross: Sequence[int] | None = None,
) -> list[tuple[int, str, str, int]]:
    """The hops of a ring that cross the fabric: ``(j, src_nic, dst_nic, d)``.

    ``j`` is the hop's position (member ``j`` -> member ``j+1``), ``d`` how many hops back
    the previous fabric hop sits (``len(members)`` when it is the only one). ``cross``
    (from :func:`cross_hops`) saves recomputing the host changes for every channel.
    """
    m = len(members)
    slots = placement.slots
    js = cross_hops(placement, members) if cross is None else cross
    out: list[tuple[int, str, str, int]] = []
    for i, j in enumerate(js):
        a, b = slots[members[j]], slots[members[(j + 1) % m]]
        if rail_aligned:
            s, t = placement.rail_nic(a.host, channel), placement.rail_nic(b.host, channel)
        else:
            s, t = a.nic, b.nic
        out.append((j, s, t, (j - js[i - 1]) % m or m))
    return out


def add_ring(
    fl: FlowList,
    placement: Placement,
    members: Sequence[int],
    *,
    steps: int,
    chunk_bytes: float,
    channel: int,
    rail_aligned: bool,
    after: Sequence[int] = (),
    gap_ns: int = 0,
    tag: str = "ring",
    cross: Sequence[int] | None = None,
) -> list[int]:
    """Append one ring channel's flows to ``fl``; return the ids of its last-step flows.

    ``after``/``gap_ns`` gate the first step (a compute phase before the collective). When
    no hop crosses the fabric (all members on one host) nothing is added and ``after`` is
    returned, so callers can chain through an NVLink-only collective.
    """
    hops = fabric_hops(placement, members, channel=channel, rail_aligned=rail_aligned, cross=cross)
    if not hops or steps <= 0:
        return list(after)
    pos = {j: i for i, (j, _, _, _) in enumerate(hops)}
    prev = [pos[(j - d) % len(members)] for (j, _, _, d) in hops]
    ports = [connection_port(s, t, tag, channel) for (_, s, t, _) in hops]
    ids: list[list[int]] = []  # ids[k][i]: hop i at step k
    first = tuple(after)
    for k in range(steps):
        row: list[int] = []
        for i, (_, s, t, d) in enumerate(hops):
            deps: list[int] = [ids[k - 1][i]] if k else list(first)
            if k - d >= 0:
                deps.append(ids[k - d][prev[i]])
            row.append(
                fl.add(s, t, chunk_bytes, deps=deps, gap_ns=0 if k else gap_ns, tag=tag,
                       src_port=ports[i])
            )
        ids.append(row)
    return ids[-1]


def _ring_setup(
    placement: Placement,
    size_bytes: float,
    collective: str,
    channels: int | None,
    rail_aligned: bool,
    order: str,
) -> tuple[int, int, int, tuple[int, ...], float, list[int]]:
    """Validate a ring request; return (n, steps, channels, ring members, chunk bytes, hops)."""
    n = placement.n_ranks
    if n < 2:
        raise WorkloadError(f"ring {collective}: ranks: need at least 2, got {n}")
    if not size_bytes > 0:
        raise WorkloadError(f"ring {collective}: size: must be > 0, got {size_bytes!r}")
    steps = ring_steps(collective, n)
    ch = default_channels(placement, rail_aligned) if channels is None else channels
    if ch < 1:
        raise WorkloadError(f"ring {collective}: channels: must be >= 1, got {ch}")
    members = ring_order(placement, order)
    return n, steps, ch, members, size_bytes / (ch * n), cross_hops(placement, members)


def ring_collective(
    placement: Placement,
    size_bytes: float,
    *,
    collective: str = "allreduce",
    channels: int | None = None,
    rail_aligned: bool = True,
    order: str = "host",
    name: str | None = None,
) -> Workload:
    """The full FlowSpec DAG of a ring ``collective`` of ``size_bytes`` per rank.

    Flows: ``steps * (fabric hops per channel) * channels`` with ``steps`` from
    :func:`ring_steps`; each carries ``size_bytes / (channels * n)``.
    """
    n, steps, ch, members, chunk, cross = _ring_setup(
        placement, size_bytes, collective, channels, rail_aligned, order
    )
    fl = FlowList()
    hops_per_channel: list[int] = []
    for c in range(ch):
        before = len(fl)
        add_ring(fl, placement, members, steps=steps, chunk_bytes=chunk, channel=c,
                 rail_aligned=rail_aligned, tag=f"ring-{collective}/ch{c}", cross=cross)
        hops_per_channel.append((len(fl) - before) // steps)
    if not len(fl):
        raise WorkloadError(
            f"ring {collective}: all {n} ranks are on one host: no fabric traffic (NVLink only)"
        )
    return Workload(
        name=name or f"ring-{collective}-{n}",
        flows=fl.flows(),
        collective=_as_collective(collective),
        n_ranks=n,
        size_bytes=size_bytes,
        meta={
            "algorithm": "ring", "channels": ch, "steps": steps, "chunk_bytes": chunk,
            "fabric_hops_per_channel": hops_per_channel, "rail_aligned": rail_aligned,
            "ring_order": order, "placement": placement.policy,
            "nvlink_bytes": chunk * steps * sum(n - h for h in hops_per_channel),
        },
    )


def ring_steady_state(
    placement: Placement,
    size_bytes: float,
    *,
    collective: str = "allreduce",
    channels: int | None = None,
    rail_aligned: bool = True,
    order: str = "host",
    name: str | None = None,
) -> Workload:
    """One step of a ring collective: every fabric hop's chunk, all starting at t = 0.

    A pipelined ring moves in lock step, so its bandwidth term is fixed by the rates these
    concurrent flows get (one max-min solve instead of ``steps`` chained ones): see
    :func:`fabricscope.sim.workload.alphabeta.ring_time_from_rates` for the completion time.
    ``meta["channel_flows"]`` lists each channel's ``(first id, end id)``; flows carry
    ``size_bytes / (channels * n)`` like one step of :func:`ring_collective`. The workload's
    ``collective`` is ``"none"`` (the collective and ``S`` are in ``meta``) so that nobody
    reads a busbw off a one-step run; use :func:`ring_busbw_from_rates`.
    """
    n, steps, ch, members, chunk, cross = _ring_setup(
        placement, size_bytes, collective, channels, rail_aligned, order
    )
    fl = FlowList()
    bounds: list[tuple[int, int]] = []
    for c in range(ch):
        lo = len(fl)
        tag = f"ring-{collective}/ch{c}"
        for _, s, t, _ in fabric_hops(placement, members, channel=c, rail_aligned=rail_aligned,
                                      cross=cross):
            fl.add(s, t, chunk, tag=tag, src_port=connection_port(s, t, tag, c))
        bounds.append((lo, len(fl)))
    if not len(fl):
        raise WorkloadError(
            f"ring {collective}: all {n} ranks are on one host: no fabric traffic (NVLink only)"
        )
    # collective "none" and size 0: simulating these flows to completion times ONE step, so
    # a busbw computed from it would be wrong; the collective and S live in meta instead.
    return Workload(
        name=name or f"ring-{collective}-{n}-steady",
        flows=fl.flows(),
        collective="none",
        n_ranks=n,
        size_bytes=0.0,
        meta={
            "algorithm": "ring", "steady_state": True, "collective": collective,
            "size_bytes": size_bytes, "channels": ch, "steps": steps,
            "chunk_bytes": chunk, "channel_flows": bounds, "rail_aligned": rail_aligned,
            "ring_order": order, "placement": placement.policy,
        },
    )


def all_to_all(
    placement: Placement,
    size_bytes: float,
    *,
    rail_aligned: bool = True,
    name: str | None = None,
) -> Workload:
    """All-to-all: every rank sends ``size_bytes / n`` to every other rank, all at t = 0.

    Pairs on one host use NVLink (no flow). With ``rail_aligned`` (NCCL's PXN) the data first
    moves over NVLink to the sender-host GPU on the destination's rail, so the fabric flow
    stays on one rail: ``rail_nic(src host, gpu(dst)) -> nic(dst)``.
    """
    n = placement.n_ranks
    if n < 2:
        raise WorkloadError(f"alltoall: ranks: need at least 2, got {n}")
    if not size_bytes > 0:
        raise WorkloadError(f"alltoall: size: must be > 0, got {size_bytes!r}")
    per = size_bytes / n
    # ~n^2 flows (a million at 1,024 GPUs): a tight loop with FlowSpec built directly.
    dests = [(s.host, s.gpu, s.nic) for s in placement.slots]
    flows: list[FlowSpec] = []
    append = flows.append
    fid = 0
    for si in placement.slots:
        host, own = si.host, si.nic
        rails = placement.rail_nics[host]
        nr = len(rails)
        for hj, gj, nj in dests:
            if hj == host:
                continue
            append(FlowSpec(fid, rails[gj % nr] if rail_aligned else own, nj, per, 0, (), 0,
                            "alltoall", None))
            fid += 1
    if not flows:
        raise WorkloadError(f"alltoall: all {n} ranks are on one host: no fabric traffic")
    return Workload(
        name=name or f"alltoall-{n}",
        flows=tuple(flows),
        collective="alltoall",
        n_ranks=n,
        size_bytes=size_bytes,
        meta={"algorithm": "pairwise-concurrent", "rail_aligned": rail_aligned,
              "placement": placement.policy, "pair_bytes": per},
    )


def _as_collective(name: str) -> Collective:
    if name == "allreduce":
        return "allreduce"
    if name == "allgather":
        return "allgather"
    if name == "reducescatter":
        return "reducescatter"
    raise WorkloadError(f"collective: unknown {name!r}")
