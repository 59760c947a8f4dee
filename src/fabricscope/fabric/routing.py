"""Equal-cost shortest-path routing on a fabric: next-hop sets, ECMP paths, spraying weights.

Distances are computed once on the *switch* graph from every leaf (a BFS per leaf with
``scipy.sparse.csgraph``); a NIC's distance is that of the leaves it is cabled to. Next-hop
sets are then derived per (switch, destination attachment) and cached, so no path is ever
enumerated unless asked for (:meth:`Routing.paths`), and path *counts* come from a DP over
the shortest-path DAG. This stays linear in the fabric size at 32k GPUs.

Bulk work goes through :meth:`Routing.route_many` (ECMP paths of millions of flows as CSR
arrays, bit-exact with :meth:`Routing.path`) and :meth:`Routing.spray_many` (per-hop even
split, equal to :meth:`Routing.spray_weights`): all flows advance one hop per numpy step. See
``docs/design/fabric-routing.md``.

Failures are a view: ``Routing(fabric, failed_links=...)`` removes those cables from every
next-hop set (a router's reroute after the link goes down); the fabric itself is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from fabricscope.fabric.hashing import HashConfig, _ip_bytes, hash_key
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import InventoryError, RoutingError, UnroutableError
from fabricscope.model.records import FiveTuple

ROCE_PORT = 4791
EPHEMERAL_PORT = 49152
MAX_HOPS = 64


class SprayTable(NamedTuple):
    """Sprayed flows in CSR form: flow ``i`` puts ``weights[j]`` of its bytes on ``edges[j]``
    for ``j`` in ``offsets[i]:offsets[i+1]``; ``ok[i]`` is False when it is unroutable."""

    offsets: npt.NDArray[np.int64]
    edges: npt.NDArray[np.int64]
    weights: npt.NDArray[np.float64]
    ok: npt.NDArray[np.bool_]

    def weights_of(self, i: int) -> dict[int, float]:
        """Flow ``i`` as ``{edge: fraction}`` (the form :meth:`Routing.spray_weights` returns)."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return {int(e): float(w) for e, w in zip(self.edges[lo:hi], self.weights[lo:hi], strict=True)}


class PathTable(NamedTuple):
    """Paths of many flows in CSR form: flow ``i`` takes ``edges[offsets[i]:offsets[i+1]]``.

    ``ok[i]`` is False when flow ``i`` is unroutable (its slice is then empty).
    """

    offsets: npt.NDArray[np.int64]
    edges: npt.NDArray[np.int64]
    ok: npt.NDArray[np.bool_]

    def path(self, i: int) -> tuple[int, ...]:
        """The directed edges of flow ``i``."""
        return tuple(int(e) for e in self.edges[self.offsets[i] : self.offsets[i + 1]])


class Routing:
    """Shortest-path ECMP routing over ``fabric`` with some cables failed.

    Parameters
    ----------
    fabric:
        The inventory.
    hash_config:
        How switches (and multi-homed NICs) hash a 5-tuple onto a next hop.
    failed_links:
        Link ids (``a|b``) or directed ids (``a->b``, meaning the whole cable) that are down.
    """

    def __init__(
        self,
        fabric: Fabric,
        *,
        hash_config: HashConfig | None = None,
        failed_links: Iterable[str] = (),
    ) -> None:
        self.fabric = fabric
        self.hash = hash_config or HashConfig()
        ix = fabric.index
        self._ix = ix
        usable = np.ones(ix.n_edges, dtype=bool)
        failed: set[str] = set()
        for lid in failed_links:
            e = fabric.edge_index(lid.replace("|", "->")) if "|" in lid else fabric.edge_index(lid)
            usable[e] = usable[e ^ 1] = False
            failed.add(fabric.links[e // 2].id)
        self.failed_links: frozenset[str] = frozenset(failed)
        self.usable = usable
        self._nh_cache: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}
        self._seed = [self.hash.device_seed(n) for n in ix.node_ids]
        self._key_cache: dict[FiveTuple, bytes] = {}

    # ------------------------------------------------------------------ distances
    @cached_property
    def _switch_nodes(self) -> npt.NDArray[np.int64]:
        return np.flatnonzero(self._ix.is_switch)

    @cached_property
    def _leaf_nodes(self) -> npt.NDArray[np.int64]:
        """Switches with at least one usable edge to a NIC."""
        ix = self._ix
        mask = self.usable & ix.is_switch[ix.src] & ~ix.is_switch[ix.dst]
        return np.unique(ix.src[mask])

    @cached_property
    def _dist(self) -> tuple[npt.NDArray[np.float64], dict[int, int], dict[int, int]]:
        """Hop distances between switches: D[switch_row, leaf_col]."""
        ix = self._ix
        sw = self._switch_nodes
        row_of = {int(n): i for i, n in enumerate(sw)}
        leaves = self._leaf_nodes
        col_of = {int(n): j for j, n in enumerate(leaves)}
        mask = self.usable & ix.is_switch[ix.src] & ix.is_switch[ix.dst]
        r = np.array([row_of[int(s)] for s in ix.src[mask]], dtype=np.int64)
        c = np.array([row_of[int(d)] for d in ix.dst[mask]], dtype=np.int64)
        g = csr_matrix((np.ones(r.shape[0]), (r, c)), shape=(sw.shape[0], sw.shape[0]))
        if leaves.shape[0] == 0:
            return np.zeros((sw.shape[0], 0)), row_of, col_of
        d = shortest_path(
            g, method="D", directed=True, unweighted=True,
            indices=[row_of[int(n)] for n in leaves],
        )
        # shortest_path gives D[leaf, switch] from leaf; the graph is symmetric, so transpose.
        return np.ascontiguousarray(d.T), row_of, col_of

    def _attach(self, nic: int) -> tuple[int, ...]:
        """Leaf columns a NIC is reachable from (usable cables only)."""
        ix = self._ix
        _, _, col_of = self._dist
        cols = []
        for e in ix.out_edges[nic]:
            if self.usable[e]:
                cols.append(col_of[int(ix.dst[e])])
        return tuple(sorted(cols))

    # ------------------------------------------------------------------ next hops
    def next_hops(self, node: int, dst_nic: int) -> tuple[int, ...]:
        """Usable directed edges out of ``node`` on a shortest path to NIC ``dst_nic``."""
        att = self._attach(dst_nic)
        return self._next_hops(node, dst_nic, att)

    def _next_hops(self, node: int, dst_nic: int, att: tuple[int, ...]) -> tuple[int, ...]:
        ix = self._ix
        _, _, col_of = self._dist
        col = col_of.get(node)
        if col is not None and col in att:
            # The destination hangs off this leaf: deliver directly.
            dkey = (node, (-1 - dst_nic,))
            hit = self._nh_cache.get(dkey)
            if hit is None:
                hit = tuple(
                    e for e in ix.out_edges[node] if self.usable[e] and int(ix.dst[e]) == dst_nic
                )
                self._nh_cache[dkey] = hit
            return hit
        key = (node, att)
        hit = self._nh_cache.get(key)
        if hit is not None:
            return hit
        out: tuple[int, ...] = ()
        if att:
            # One numpy pass over the node's out-edges (in port order, which the hash indexes).
            d = self._dist[0]
            ptr, oe, row = self._out_csr
            es = oe[ptr[node] : ptr[node + 1]]
            v = ix.dst[es]
            m = self.usable[es] & ix.is_switch[v]
            if m.any():
                es, rows = es[m], row[v[m]]
                dist = d[rows, att[0]] if len(att) == 1 else d[np.ix_(rows, np.asarray(att, dtype=np.int64))].min(axis=1)
                best = dist.min()
                if np.isfinite(best):
                    out = tuple(es[dist == best].tolist())
        self._nh_cache[key] = out
        return out

    # ------------------------------------------------------------------ paths
    def node(self, device_id: str) -> int:
        try:
            return self._ix.node_of[device_id]
        except KeyError:
            raise InventoryError(f"{self.fabric.name}: no NIC or switch {device_id!r}") from None

    def flow_tuple(self, src: str, dst: str, *, src_port: int = 49152, dst_port: int = ROCE_PORT) -> FiveTuple:
        """The 5-tuple a RoCEv2 flow from NIC ``src`` to NIC ``dst`` would carry."""
        s = self.fabric.devices[src].address or src
        t = self.fabric.devices[dst].address or dst
        return FiveTuple(s, t, src_port, dst_port, 17)

    def path(self, src: str, dst: str, flow: FiveTuple | None = None) -> tuple[int, ...]:
        """The directed edges a 5-tuple takes from NIC ``src`` to NIC ``dst`` under ECMP.

        Raises :class:`UnroutableError` when the endpoints are partitioned.
        """
        return self.path_nodes(self.node(src), self.node(dst), flow or self.flow_tuple(src, dst))

    def path_nodes(self, s: int, t: int, flow: FiveTuple) -> tuple[int, ...]:
        """:meth:`path` on node indices (the fast path used by the simulator)."""
        ix = self._ix
        key = self._key_cache.get(flow)
        if key is None:
            key = hash_key(flow)
            if len(self._key_cache) < 1_000_000:
                self._key_cache[flow] = key
        att = self._attach(t)
        out: list[int] = []
        node = s
        for _ in range(64):
            if node == t:
                return tuple(out)
            nh = self._next_hops(node, t, att)
            if not nh:
                break
            e = nh[self.hash.bucket(key, self._seed[node], len(nh))] if len(nh) > 1 else nh[0]
            out.append(e)
            node = int(ix.dst[e])
        raise UnroutableError(self._unroutable_msg(s, t))

    def reachable(self, src: str, dst: str) -> bool:
        try:
            self.path(src, dst)
        except UnroutableError:
            return False
        return True

    def _dag_order(self, s: int, t: int) -> list[int]:
        """Nodes of the shortest-path DAG from s to t, in topological order."""
        ix = self._ix
        att = self._attach(t)
        order: list[int] = []
        seen = {s}
        frontier = [s]
        while frontier:
            order.extend(frontier)
            nxt: list[int] = []
            for u in frontier:
                if u == t:
                    continue
                for e in self._next_hops(u, t, att):
                    v = int(ix.dst[e])
                    if v not in seen:
                        seen.add(v)
                        nxt.append(v)
            frontier = nxt
        if t not in seen:
            raise UnroutableError(
                f"{self.fabric.name}: no path from {ix.node_ids[s]} to {ix.node_ids[t]}"
            )
        return order

    def path_count(self, src: str, dst: str) -> int:
        """Number of equal-cost shortest paths (a DP over the DAG; nothing is enumerated)."""
        s, t = self.node(src), self.node(dst)
        att = self._attach(t)
        count: dict[int, int] = {s: 1}
        for u in self._dag_order(s, t):
            if u == t:
                continue
            c = count.get(u, 0)
            for e in self._next_hops(u, t, att):
                v = int(self._ix.dst[e])
                count[v] = count.get(v, 0) + c
        return count.get(t, 0)

    def spray_weights(self, src: str, dst: str) -> Mapping[int, float]:
        """Fraction of a sprayed flow's bytes on each directed edge (even split per hop).

        On symmetric Clos fabrics an even split per hop equals an even split over paths.
        """
        return self.spray_weights_nodes(self.node(src), self.node(dst))

    def spray_weights_nodes(self, s: int, t: int) -> Mapping[int, float]:
        att = self._attach(t)
        frac: dict[int, float] = {s: 1.0}
        w: dict[int, float] = {}
        for u in self._dag_order(s, t):
            if u == t:
                continue
            nh = self._next_hops(u, t, att)
            share = frac.get(u, 0.0) / len(nh)
            for e in nh:
                w[e] = w.get(e, 0.0) + share
                v = int(self._ix.dst[e])
                frac[v] = frac.get(v, 0.0) + share
        return w

    def paths(self, src: str, dst: str, *, limit: int = 10_000) -> list[tuple[int, ...]]:
        """Enumerate equal-cost paths (edge tuples), at most ``limit`` of them."""
        s, t = self.node(src), self.node(dst)
        att = self._attach(t)
        self._dag_order(s, t)  # raises if unroutable
        out: list[tuple[int, ...]] = []
        stack: list[tuple[int, tuple[int, ...]]] = [(s, ())]
        while stack and len(out) < limit:
            u, acc = stack.pop()
            if u == t:
                out.append(acc)
                continue
            for e in reversed(self._next_hops(u, t, att)):
                stack.append((int(self._ix.dst[e]), (*acc, e)))
        return out

    # ------------------------------------------------------------------ bulk routing
    @cached_property
    def _node_ip(self) -> list[bytes]:
        devs = self.fabric.devices
        return [_ip_bytes(devs[n].address or n) for n in self._ix.node_ids]

    @cached_property
    def _seed_terms(self) -> npt.NDArray[np.int64]:
        """Per node, the xor that turns a flow's seed-0 hash into this node's hash."""
        return np.array([self.hash.seed_term(sd, 13) for sd in self._seed], dtype=np.int64)

    def flow_keys(
        self,
        src_nodes: npt.ArrayLike,
        dst_nodes: npt.ArrayLike,
        src_ports: npt.ArrayLike | None = None,
        dst_ports: npt.ArrayLike | None = None,
        proto: int = 17,
    ) -> npt.NDArray[np.uint8]:
        """The :func:`hash_key` bytes of many RoCEv2 flows, one row each (IPv4 endpoints)."""
        s = np.asarray(src_nodes, dtype=np.int64)
        t = np.asarray(dst_nodes, dtype=np.int64)
        n = s.shape[0]
        sp = np.broadcast_to(np.asarray(EPHEMERAL_PORT if src_ports is None else src_ports,
                                        dtype=np.int64), (n,))
        dp = np.broadcast_to(np.asarray(ROCE_PORT if dst_ports is None else dst_ports,
                                        dtype=np.int64), (n,))
        ips = np.frombuffer(b"".join(self._node_ip), dtype=np.uint8).reshape(-1, 4)
        keys = np.empty((n, 13), dtype=np.uint8)
        keys[:, 0:4] = ips[s]
        keys[:, 4:8] = ips[t]
        keys[:, 8] = proto & 0xFF
        keys[:, 9] = (sp >> 8) & 0xFF
        keys[:, 10] = sp & 0xFF
        keys[:, 11] = (dp >> 8) & 0xFF
        keys[:, 12] = dp & 0xFF
        return keys

    @cached_property
    def _class_tables(self) -> tuple[dict[tuple[int, ...], int], list[tuple[int, ...]]]:
        return {}, []

    def _dst_classes(self, dst: npt.NDArray[np.int64]) -> tuple[
        npt.NDArray[np.int64], list[tuple[int, ...]], npt.NDArray[np.int64]
    ]:
        """Per flow, the id of its destination's attachment set (the next-hop cache key),
        the attachment sets, and per class the attached leaf nodes (padded with -1)."""
        class_of, classes = self._class_tables
        uniq, inv = np.unique(dst, return_inverse=True)
        ucls = np.empty(uniq.shape[0], dtype=np.int64)
        for i, t in enumerate(uniq.tolist()):
            att = self._attach(t)
            c = class_of.get(att)
            if c is None:
                c = class_of[att] = len(classes)
                classes.append(att)
            ucls[i] = c
        leaves = self._leaf_nodes
        width = max((len(a) for a in classes), default=1) or 1
        class_leaves = np.full((len(classes), width), -1, dtype=np.int64)
        for c, att in enumerate(classes):
            class_leaves[c, : len(att)] = leaves[list(att)]
        return ucls[inv.reshape(-1)], classes, class_leaves

    def route_many(
        self,
        src_nodes: npt.ArrayLike,
        dst_nodes: npt.ArrayLike,
        src_ports: npt.ArrayLike | None = None,
        *,
        dst_ports: npt.ArrayLike | None = None,
        proto: int = 17,
        strict: bool = True,
    ) -> PathTable:
        """ECMP paths of many flows at once, exactly the edges :meth:`path_nodes` gives each.

        Flows are RoCEv2 5-tuples ``(addr(src), addr(dst), src_port, dst_port, proto)``
        (defaults: source port 49152, destination port 4791, as :meth:`flow_tuple`). All
        flows advance one hop per step: the (node, destination class) pairs of a step are
        deduplicated with ``np.unique``, their next-hop sets come from the same cache as
        :meth:`next_hops`, and the hash of every flow at every hop is one xor (see
        :meth:`HashConfig.seed_term`). Cost: O(flows x hops) numpy work plus one Python call
        per distinct (node, class) pair.

        With ``strict`` (default) an unroutable flow raises :class:`UnroutableError`; without
        it the flow's ``ok`` entry is False and its path empty.
        """
        ix = self._ix
        s = np.ascontiguousarray(src_nodes, dtype=np.int64).reshape(-1)
        t = np.ascontiguousarray(dst_nodes, dtype=np.int64).reshape(-1)
        n = s.shape[0]
        if t.shape[0] != n:
            raise RoutingError(f"route_many: {n} sources but {t.shape[0]} destinations")
        if n and (min(s.min(), t.min()) < 0 or max(s.max(), t.max()) >= ix.n_nodes):
            raise RoutingError(f"route_many: node index out of range 0..{ix.n_nodes - 1}")
        ok = np.ones(n, dtype=bool)
        if n == 0:
            return PathTable(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), ok)
        if any(len(b) != 4 for b in self._node_ip):  # IPv6 endpoints: the exact slow path
            return self._route_each(s, t, src_ports, dst_ports, proto, strict)
        base = self.hash.base_hashes(self.flow_keys(s, t, src_ports, dst_ports, proto))
        cls, classes, class_leaves = self._dst_classes(t)
        n_cls = max(len(classes), 1)
        class_cols = np.full(class_leaves.shape, -1, dtype=np.int64)
        for ci, att in enumerate(classes):
            class_cols[ci, : len(att)] = att
        terms = self._seed_terms
        cur = s.copy()
        steps: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
        length = np.zeros(n, dtype=np.int64)
        active = np.flatnonzero(cur != t)
        for _ in range(MAX_HOPS):
            if active.shape[0] == 0:
                break
            c = cur[active]
            act, live, ln, gl, starts, flat_arr = self._hop_step(
                active, c, t, cls, n_cls, class_leaves, class_cols, ok
            )
            c = c[live]
            b = self.hash.buckets(base[act] ^ terms[c], ln)
            e = flat_arr[starts[gl] + b]
            steps.append((act, e))
            length[act] += 1
            cur[act] = ix.dst[e]
            active = act[cur[act] != t[act]]
        if active.shape[0]:
            ok[active] = False  # a forwarding loop longer than MAX_HOPS: treat as unroutable
        length[~ok] = 0
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(length, out=offsets[1:])
        edges = np.empty(int(offsets[-1]), dtype=np.int64)
        for hop, (act, e) in enumerate(steps):
            keep = ok[act]
            edges[offsets[act[keep]] + hop] = e[keep]
        if strict and not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise UnroutableError(self._unroutable_msg(int(s[bad]), int(t[bad]))
                                  + f" (flow {bad} of {n}; {int((~ok).sum())} unroutable)")
        return PathTable(offsets, edges, ok)

    @cached_property
    def _out_csr(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Out-edges of every node in :attr:`FabricIndex.out_edges` order (CSR), and each
        node's row in the distance matrix (-1 for NICs)."""
        ix = self._ix
        deg = np.array([len(o) for o in ix.out_edges], dtype=np.int64)
        ptr = np.zeros(ix.n_nodes + 1, dtype=np.int64)
        np.cumsum(deg, out=ptr[1:])
        flat = np.fromiter((e for o in ix.out_edges for e in o), dtype=np.int64, count=int(ptr[-1]))
        _, row_of, _ = self._dist
        row = np.full(ix.n_nodes, -1, dtype=np.int64)
        for node, r in row_of.items():
            row[node] = r
        return ptr, flat, row

    def _hop_step(
        self,
        flows: npt.NDArray[np.int64],
        node: npt.NDArray[np.int64],
        t: npt.NDArray[np.int64],
        cls: npt.NDArray[np.int64],
        n_cls: int,
        class_leaves: npt.NDArray[np.int64],
        class_cols: npt.NDArray[np.int64],
        ok: npt.NDArray[np.bool_],
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64],
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
    ]:
        """One hop of :meth:`route_many` / :meth:`_spray_chunk` for the flows ``flows`` now at
        ``node``: group them by (node, destination class, or destination when ``node`` is
        one of its class's leaves), look up each group's next hops once, and mark flows with
        none not ``ok`` (in place). Returns, for the live flows only: their indices, the live
        mask over ``flows`` (to filter per-flow state alike), their next-hop counts, their
        group ids, and the groups' (starts, flat edge array) from :meth:`_next_hops_many`."""
        tt, k = t[flows], cls[flows]
        deliver = (class_leaves[k] == node[:, None]).any(axis=1)
        code = node * (n_cls + self._ix.n_nodes) + np.where(deliver, n_cls + tt, k)
        _, first, ginv = np.unique(code, return_index=True, return_inverse=True)
        ginv = ginv.reshape(-1)
        starts, lens, flat = self._next_hops_many(
            node[first], tt[first], k[first], deliver[first], class_cols
        )
        ln = lens[ginv]
        dead = ln == 0
        if dead.any():
            ok[flows[dead]] = False
        live = ~dead
        return flows[live], live, ln[live], ginv[live], starts, flat

    def _next_hops_many(
        self,
        nodes: npt.NDArray[np.int64],
        dsts: npt.NDArray[np.int64],
        cls: npt.NDArray[np.int64],
        deliver: npt.NDArray[np.bool_],
        class_cols: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """:meth:`_next_hops` for many (node, destination) groups at once, same edges in the
        same order: (starts, lengths, flat edge array)."""
        ix = self._ix
        dmat, _, _ = self._dist
        ptr, oe, row = self._out_csr
        g = nodes.shape[0]
        deg = ptr[nodes + 1] - ptr[nodes]
        gstart = np.zeros(g, dtype=np.int64)
        np.cumsum(deg[:-1], out=gstart[1:])
        grp = np.repeat(np.arange(g, dtype=np.int64), deg)
        pos = np.arange(grp.shape[0], dtype=np.int64) - gstart[grp] + ptr[nodes][grp]
        e = oe[pos]
        v = ix.dst[e]
        usable = self.usable[e]
        dl = deliver[grp]
        cand = usable & ~dl & ix.is_switch[v]
        dist = np.full(e.shape[0], np.inf)
        if cand.any() and dmat.shape[1]:
            cc = class_cols[cls[grp[cand]]]
            dd = dmat[row[v[cand]][:, None], np.maximum(cc, 0)]
            dd[cc < 0] = np.inf
            dist[cand] = dd.min(axis=1)
        best = np.full(g, np.inf)
        nz = deg > 0
        if grp.shape[0]:
            best[nz] = np.minimum.reduceat(dist, gstart[nz])
        sel = np.where(dl, usable & (v == dsts[grp]), cand & (dist == best[grp]) & np.isfinite(dist))
        lens = np.bincount(grp[sel], minlength=g).astype(np.int64)
        starts = np.zeros(g, dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        return starts, lens, e[sel]

    def spray_many(
        self,
        src_nodes: npt.ArrayLike,
        dst_nodes: npt.ArrayLike,
        *,
        strict: bool = True,
        chunk: int = 1 << 16,
    ) -> SprayTable:
        """:meth:`spray_weights_nodes` of many flows at once (per-hop even split), as CSR.

        Flow ``i`` puts fraction ``weights[j]`` of its bytes on edge ``edges[j]`` for ``j`` in
        ``offsets[i]:offsets[i+1]``. The DAG is walked one hop per step for all flows of a
        chunk together (fractions reaching the same node merge), with next-hop sets from
        the same computation as :meth:`route_many`. ``chunk`` bounds memory (entries per step
        are at most ``chunk`` x the widest ECMP fan-out).
        """
        s = np.ascontiguousarray(src_nodes, dtype=np.int64).reshape(-1)
        t = np.ascontiguousarray(dst_nodes, dtype=np.int64).reshape(-1)
        n = s.shape[0]
        if t.shape[0] != n:
            raise RoutingError(f"spray_many: {n} sources but {t.shape[0]} destinations")
        if n and (min(s.min(), t.min()) < 0 or max(s.max(), t.max()) >= self._ix.n_nodes):
            raise RoutingError(f"spray_many: node index out of range 0..{self._ix.n_nodes - 1}")
        flows: list[npt.NDArray[np.int64]] = []
        edges: list[npt.NDArray[np.int64]] = []
        weights: list[npt.NDArray[np.float64]] = []
        ok = np.ones(n, dtype=bool)
        for lo in range(0, n, max(chunk, 1)):
            f, e, w, good = self._spray_chunk(s[lo : lo + chunk], t[lo : lo + chunk])
            flows.append(f + lo)
            edges.append(e)
            weights.append(w)
            ok[lo : lo + chunk] = good
        f_all = np.concatenate(flows) if flows else np.zeros(0, dtype=np.int64)
        e_all = np.concatenate(edges) if edges else np.zeros(0, dtype=np.int64)
        w_all = np.concatenate(weights) if weights else np.zeros(0)
        keep = ok[f_all]
        f_all, e_all, w_all = f_all[keep], e_all[keep], w_all[keep]
        order = np.argsort(f_all, kind="stable")
        counts = np.bincount(f_all, minlength=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if strict and not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise UnroutableError(self._unroutable_msg(int(s[bad]), int(t[bad]))
                                  + f" (flow {bad} of {n}; {int((~ok).sum())} unroutable)")
        return SprayTable(offsets, e_all[order], w_all[order], ok)

    def _spray_chunk(
        self, s: npt.NDArray[np.int64], t: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        ix = self._ix
        n = s.shape[0]
        ok = np.ones(n, dtype=bool)
        if n == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros(0), ok
        cls, classes, class_leaves = self._dst_classes(t)
        n_cls = max(len(classes), 1)
        class_cols = np.full(class_leaves.shape, -1, dtype=np.int64)
        for ci, att in enumerate(classes):
            class_cols[ci, : len(att)] = att
        fl = np.flatnonzero(s != t)
        node = s[fl]
        frac = np.ones(fl.shape[0])
        out_f: list[npt.NDArray[np.int64]] = []
        out_e: list[npt.NDArray[np.int64]] = []
        out_w: list[npt.NDArray[np.float64]] = []
        for _ in range(MAX_HOPS):
            if fl.shape[0] == 0:
                break
            fl, live, ln, gl, starts, flat = self._hop_step(
                fl, node, t, cls, n_cls, class_leaves, class_cols, ok
            )
            frac = frac[live]
            rep = np.repeat(np.arange(fl.shape[0]), ln)
            first_of = np.zeros(fl.shape[0], dtype=np.int64)
            np.cumsum(ln[:-1], out=first_of[1:])
            e = flat[starts[gl][rep] + np.arange(rep.shape[0]) - first_of[rep]]
            w = (frac / ln)[rep]
            ef = fl[rep]
            out_f.append(ef)
            out_e.append(e)
            out_w.append(w)
            # Fractions that reach the same node of the same flow merge before the next hop.
            v = ix.dst[e]
            moving = v != t[ef]
            key = ef[moving] * ix.n_nodes + v[moving]
            uk, inv = np.unique(key, return_inverse=True)
            frac = np.asarray(
                np.bincount(inv.reshape(-1), weights=w[moving], minlength=uk.shape[0]), dtype=np.float64
            )
            fl, node = uk // ix.n_nodes, uk % ix.n_nodes
        if fl.shape[0]:
            ok[fl] = False
        return (np.concatenate(out_f) if out_f else np.zeros(0, dtype=np.int64),
                np.concatenate(out_e) if out_e else np.zeros(0, dtype=np.int64),
                np.concatenate(out_w) if out_w else np.zeros(0), ok)

    def _route_each(
        self, s: npt.NDArray[np.int64], t: npt.NDArray[np.int64], src_ports: npt.ArrayLike | None,
        dst_ports: npt.ArrayLike | None, proto: int, strict: bool,
    ) -> PathTable:
        n = s.shape[0]
        sp = np.broadcast_to(np.asarray(EPHEMERAL_PORT if src_ports is None else src_ports), (n,))
        dp = np.broadcast_to(np.asarray(ROCE_PORT if dst_ports is None else dst_ports), (n,))
        ok = np.ones(n, dtype=bool)
        paths: list[tuple[int, ...]] = []
        for i in range(n):
            a, z = self._ix.node_ids[int(s[i])], self._ix.node_ids[int(t[i])]
            flow = self.flow_tuple(a, z, src_port=int(sp[i]), dst_port=int(dp[i]))
            try:
                paths.append(self.path_nodes(int(s[i]), int(t[i]), flow._replace(proto=proto)))
            except UnroutableError:
                if strict:
                    raise
                ok[i] = False
                paths.append(())
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(p) for p in paths], out=offsets[1:])
        edges = np.fromiter((e for p in paths for e in p), dtype=np.int64, count=int(offsets[-1]))
        return PathTable(offsets, edges, ok)

    def _unroutable_msg(self, s: int, t: int) -> str:
        ix = self._ix
        return (
            f"{self.fabric.name}: no path from {ix.node_ids[s]} to {ix.node_ids[t]}"
            + (f" (failed links: {', '.join(sorted(self.failed_links))})" if self.failed_links else "")
        )

    def edge_ids(self, edges: Iterable[int]) -> list[str]:
        """Directed link ids of edge indices."""
        return [self._ix.edge_id(e) for e in edges]
