"""Double-binary-tree all-reduce (NCCL's tree algorithm) as a FlowSpec DAG.

Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and
scan" (Parallel Computing, 2009): two binary trees over the same nodes such that (almost)
every node is a leaf in one of them, each tree reducing then broadcasting half the buffer.
Like NCCL, the trees span *servers* (ranks inside a server are chained over NVLink, which
is not in the fabric); tree 0 is the balanced in-order tree over the server positions
``0..m-1`` (leaves are the even positions) and tree 1 the same tree with every position
shifted by one (its leaves are the odd positions), NCCL's construction for the "shift"
case.

Each tree carries ``S / (2 * channels)`` per channel, pipelined in ``chunks`` pieces: chunk
``j`` goes up an edge once the children's chunk ``j`` arrived (and the edge's chunk
``j-1`` left), and down once the parent holds the reduced chunk ``j``.
"""

from __future__ import annotations

from fabricscope.model.errors import WorkloadError
from fabricscope.sim.flows import Workload
from fabricscope.sim.workload.build import FlowList, connection_port
from fabricscope.sim.workload.collectives import default_channels
from fabricscope.sim.workload.placement import Placement


def inorder_tree(m: int) -> list[int]:
    """Parent of each position in the balanced in-order binary tree over ``0..m-1`` (root: -1)."""
    parent = [-1] * m
    stack: list[tuple[int, int, int]] = [(0, m, -1)]
    while stack:
        lo, hi, par = stack.pop()
        if lo >= hi:
            continue
        mid = (lo + hi) // 2
        parent[mid] = par
        stack.append((lo, mid, mid))
        stack.append((mid + 1, hi, mid))
    return parent


def double_binary_tree(m: int) -> tuple[list[int], list[int]]:
    """Parent arrays of NCCL-style tree 0 and tree 1 (tree 0 shifted by one position)."""
    t0 = inorder_tree(m)
    t1 = [-1] * m
    for i, p in enumerate(t0):
        t1[(i + 1) % m] = -1 if p < 0 else (p + 1) % m
    return t0, t1


def tree_allreduce(
    placement: Placement,
    size_bytes: float,
    *,
    channels: int | None = None,
    chunks: int = 8,
    rail_aligned: bool = True,
    name: str | None = None,
) -> Workload:
    """Double-binary-tree all-reduce of ``size_bytes`` per rank over the placement's servers.

    Flows: per channel, tree and chunk, one up and one down flow per tree edge:
    ``channels * 2 * chunks * 2 * (servers - 1)``, each ``S / (2 * channels * chunks)``.
    """
    n = placement.n_ranks
    hosts = placement.hosts
    m = len(hosts)
    if m < 2:
        raise WorkloadError(
            f"tree allreduce: ranks: {n} ranks on {m} host(s); the tree needs 2 hosts or more"
        )
    if not size_bytes > 0:
        raise WorkloadError(f"tree allreduce: size: must be > 0, got {size_bytes!r}")
    if chunks < 1:
        raise WorkloadError(f"tree allreduce: chunks: must be >= 1, got {chunks}")
    ch = default_channels(placement, rail_aligned) if channels is None else channels
    if ch < 1:
        raise WorkloadError(f"tree allreduce: channels: must be >= 1, got {ch}")
    piece = size_bytes / (2 * ch * chunks)
    fl = FlowList()
    for c in range(ch):
        if rail_aligned:
            nic = [placement.rail_nic(h, c) for h in hosts]
        else:
            nic = [placement.nic(placement.ranks_of_host[h][0]) for h in hosts]
        for t, parent in enumerate(double_binary_tree(m)):
            _add_tree(fl, parent, nic, piece, chunks, tag=f"tree{t}/ch{c}", channel=c)
    return Workload(
        name=name or f"tree-allreduce-{n}",
        flows=fl.flows(),
        collective="allreduce",
        n_ranks=n,
        size_bytes=size_bytes,
        meta={"algorithm": "double-binary-tree", "channels": ch, "chunks": chunks,
              "hosts": m, "piece_bytes": piece, "rail_aligned": rail_aligned,
              "placement": placement.policy},
    )


def _add_tree(
    fl: FlowList, parent: list[int], nic: list[str], piece: float, chunks: int,
    *, tag: str, channel: int,
) -> None:
    m = len(parent)
    children: list[list[int]] = [[] for _ in range(m)]
    root = -1
    for u, p in enumerate(parent):
        if p < 0:
            root = u
        else:
            children[p].append(u)
    # Post-order (children before parents) for the reduce, the reverse for the broadcast.
    order: list[int] = []
    stack = [root]
    while stack:
        u = stack.pop()
        order.append(u)
        stack.extend(children[u])
    up_order = order[::-1]
    up: dict[tuple[int, int], int] = {}
    down: dict[tuple[int, int], int] = {}
    up_port = {u: connection_port(nic[u], nic[parent[u]], tag, channel) for u in up_order if u != root}
    dn_port = {u: connection_port(nic[parent[u]], nic[u], tag, channel) for u in up_order if u != root}
    for j in range(chunks):
        for u in up_order:
            if u == root:
                continue
            deps = [up[(v, j)] for v in children[u]]
            if j:
                deps.append(up[(u, j - 1)])
            up[(u, j)] = fl.add(nic[u], nic[parent[u]], piece, deps=deps, tag=f"{tag}/up",
                                src_port=up_port[u])
        for u in order:
            if u == root:
                continue
            p = parent[u]
            deps = [up[(v, j)] for v in children[p]] if p == root else [down[(p, j)]]
            if j:
                deps.append(down[(u, j - 1)])
            down[(u, j)] = fl.add(nic[p], nic[u], piece, deps=deps, tag=f"{tag}/down",
                                  src_port=dn_port[u])
