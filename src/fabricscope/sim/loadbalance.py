"""Load balancing: which directed links (and what fraction of its bytes) each flow uses.

Schemes (all over the shortest-path next-hop sets of :class:`~fabricscope.fabric.routing.Routing`,
so a failed link is simply absent and traffic reroutes around it):

``ecmp``     per-flow hashing of the 5-tuple at every hop, the switch-like hash of
             :mod:`fabricscope.fabric.hashing` (identical to ``Routing.path``).
``random``   a uniformly random next hop per flow at every hop (seeded); on a symmetric Clos
             this is a uniformly random shortest path, the model of SIMULATION.md §1.
``spray``    per-packet spraying: an even split at every hop (``Routing.spray_weights``).
``flowlet``  ECMP re-hashed at every flowlet boundary (every ``flowlet_bytes``) with a new
             UDP source port (Kandula et al., "Dynamic load balancing without packet
             reordering", CCR 2007; the fluid model has no idle gaps, so flowlets are chunks).
``dlb``      dynamic load balancing: at every flowlet boundary each switch places the flowlet
             on the next hop whose path ahead is least loaded, a path's load being its most
             loaded link in active flows per unit of its current capacity (CONGA, Alizadeh
             et al., SIGCOMM'14: leaf-to-leaf path congestion = max over the path's links).
``stripe``   multi-plane striping: a flow is split evenly over its NIC's planes (uplinks) and
             ECMP-hashed inside each plane (a single-homed NIC behaves like ``ecmp``).
``oblivious:paths=N``  oblivious spraying over N entropy values (UEC packet spraying as
             uet-htsim's ``UecMpOblivious`` does it): the sender cycles its packets over N
             entropies, every switch hashes (flow, entropy) onto its next hops, so a flow is
             split evenly over N hashed paths, which collide (unlike ``spray``'s perfectly
             even split). The switch hash is a uniform mixing function (splitmix64 with a
             per-switch salt, as htsim's salted freeBSD hash): a CRC of consecutive entropy
             values is affine and would spread them exactly evenly over 2^k ports.

The per-hop walk is vectorized over all flows: flows are grouped by (current switch,
destination attachment) and the crc32 hash is computed with a table-driven numpy CRC that is
bit-identical to :func:`zlib.crc32`, so a million flows route in seconds.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.hashing import hash_key
from fabricscope.fabric.routing import ROCE_PORT, Routing
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple

Scheme = Literal["ecmp", "random", "spray", "flowlet", "dlb", "stripe", "oblivious", "reps", "ar"]
SCHEMES: tuple[Scheme, ...] = ("ecmp", "random", "spray", "flowlet", "dlb", "stripe")
DYNAMIC_SCHEMES: frozenset[str] = frozenset({"flowlet", "dlb"})
PARAMETRIC_SCHEMES: tuple[str, ...] = ("oblivious:paths=N", "reps[:paths=N]")
#: Schemes that react to ECN marks (``reps``) or to switch queues (``ar``: adaptive routing):
#: only the transport engine (``--cc`` other than ideal) runs them.
TRANSPORT_SCHEMES: tuple[str, ...] = ("reps", "ar")
REPS_DEFAULT_PATHS = 128
"""Schemes with a parameter: ``check_scheme`` returns the full name (``oblivious:paths=128``)."""
MAX_ENTROPIES = 65536

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_MAX_HOPS = 64
_CRC_TABLE = np.array(
    [zlib.crc32(bytes([i]), 0xFFFFFFFF) ^ 0xFFFFFFFF for i in range(256)], dtype=np.uint32
)


def check_scheme(name: str, *, source: str = "lb") -> Scheme:
    """Validate a scheme name (error names the source and the value).

    ``oblivious:paths=N`` is returned as given (typed as ``Scheme``; :func:`oblivious_paths`
    reads N back)."""
    if name.startswith("oblivious"):
        oblivious_paths(name, source=source)
        return cast(Scheme, name)
    if name == "reps" or name.startswith("reps:"):
        reps_paths(name, source=source)
        return cast(Scheme, name)
    if name == "ar":
        return "ar"
    if name not in SCHEMES:
        raise ConfigError(f"{source}: unknown load-balancing scheme {name!r}; choose one of "
                          f"{', '.join((*SCHEMES, *PARAMETRIC_SCHEMES, 'ar'))}")
    return name


def reps_paths(name: str, *, source: str = "lb") -> int:
    """N of ``reps`` (128) or ``reps:paths=N``: REPS recycles N entropies (the transport
    engine's :func:`fabricscope.sim.transport.kernel._reps`)."""
    if name == "reps":
        return REPS_DEFAULT_PATHS
    try:
        return oblivious_paths("oblivious" + name.removeprefix("reps"), source=source)
    except ConfigError:
        raise ConfigError(f"{source}: {name!r}: expected reps or reps:paths=N with N a whole number, "
                          "e.g. reps:paths=128") from None


def is_transport_only(name: str) -> bool:
    """Schemes that need ECN marks (the transport engine), e.g. ``reps``."""
    return name.split(":", 1)[0] in TRANSPORT_SCHEMES


def oblivious_paths(name: str, *, source: str = "lb") -> int:
    """N of ``oblivious:paths=N`` (1 <= N <= 65536); a clear error naming the value otherwise."""
    head, _, arg = name.partition(":")
    key, _, val = arg.partition("=")
    if head != "oblivious" or key.strip() != "paths" or not val.strip().isdigit():
        raise ConfigError(f"{source}: {name!r}: expected oblivious:paths=N with N a whole number, "
                          "e.g. oblivious:paths=128")
    n = int(val)
    if not 1 <= n <= MAX_ENTROPIES:
        raise ConfigError(f"{source}: {name!r}: paths must be in 1..{MAX_ENTROPIES}, got {n}")
    return n


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finalizer (Steele, Lea & Flood, OOPSLA 2014), vectorized: a uniform
    mixing hash of 64-bit keys."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return out


def crc32_vec(keys: npt.NDArray[np.uint8], init: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    """``zlib.crc32(keys[i], init[i])`` for every row, vectorized (reflected table CRC-32)."""
    c = init.astype(np.uint32) ^ np.uint32(0xFFFFFFFF)
    for j in range(keys.shape[1]):
        c = _CRC_TABLE[(c ^ keys[:, j]) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
    out: npt.NDArray[np.uint32] = c ^ np.uint32(0xFFFFFFFF)
    return out


@dataclass(frozen=True, slots=True)
class PathTable:
    """Routes of a batch of flows as CSR rows: flow ``i`` uses ``edges[indptr[i]:indptr[i+1]]``
    carrying ``weights[...]`` of its bytes; ``unroutable[i]`` marks partitioned flows (empty row).
    """

    indptr: IntArray
    edges: IntArray
    weights: FloatArray
    unroutable: npt.NDArray[np.bool_]

    @property
    def n_flows(self) -> int:
        return int(self.indptr.shape[0] - 1)

    def row(self, i: int) -> tuple[IntArray, FloatArray]:
        a, b = int(self.indptr[i]), int(self.indptr[i + 1])
        return self.edges[a:b], self.weights[a:b]


def _from_rows(rows: Sequence[tuple[IntArray, FloatArray] | None]) -> PathTable:
    lens = np.array([0 if r is None else r[0].shape[0] for r in rows], dtype=np.int64)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    e = [r[0] for r in rows if r is not None]
    w = [r[1] for r in rows if r is not None]
    return PathTable(
        indptr,
        np.concatenate(e).astype(np.int64) if e else np.zeros(0, np.int64),
        np.concatenate(w).astype(np.float64) if w else np.zeros(0, np.float64),
        np.array([r is None for r in rows], dtype=bool),
    )


class PathFinder:
    """Vectorized route computation for one :class:`Routing` (one set of failed links)."""

    def __init__(self, routing: Routing) -> None:
        self.routing = routing
        fab = routing.fabric
        ix = fab.index
        self.ix = ix
        n = ix.n_nodes
        self.n_nodes = n
        # Per-node hash seeds, exactly what Routing uses.
        self.seed = np.array(
            [routing.hash.device_seed(i) for i in ix.node_ids], dtype=np.uint64
        ).astype(np.uint32)
        # 4-byte address of every node that is a NIC (hash key layout of hashing.hash_key).
        addr = np.zeros((n, 4), dtype=np.uint8)
        for v, nid in enumerate(ix.node_ids):
            if ix.is_switch[v]:
                continue
            a = fab.devices[nid].address or nid
            addr[v] = np.frombuffer(hash_key(FiveTuple(a, a, 0, 0, 17))[:4], dtype=np.uint8)
        self.addr = addr
        usable = routing.usable
        # Attachment signature of each NIC: the set of switches it hangs off (usable cables).
        delivery: dict[int, list[int]] = {}
        for e in range(ix.n_edges):
            s, d = int(ix.src[e]), int(ix.dst[e])
            if usable[e] and ix.is_switch[s] and not ix.is_switch[d]:
                delivery.setdefault(d, []).append(e)
        att_ids: dict[tuple[int, ...], int] = {}
        self.att_of = np.full(n, -1, dtype=np.int64)
        self.att_rep: list[int] = []
        self.att_sets: list[frozenset[int]] = []
        width = max((len(v) for v in delivery.values()), default=1)
        self.in_edges = np.full((n, width), -1, dtype=np.int64)
        for v, es in delivery.items():
            sig = tuple(sorted({int(ix.src[e]) for e in es}))
            if sig not in att_ids:
                att_ids[sig] = len(att_ids)
                self.att_rep.append(v)
                self.att_sets.append(frozenset(sig))
            self.att_of[v] = att_ids[sig]
            self.in_edges[v, : len(es)] = es
        self.n_att = max(len(att_ids), 1)
        self._spray_cache: dict[tuple[int, int], tuple[IntArray, FloatArray, IntArray, FloatArray]] = {}
        self._dlb_cache: dict[tuple[int, int], list[tuple[int, int]]] = {}

    # ------------------------------------------------------------------ keys
    def keys(self, src: IntArray, dst: IntArray, sport: IntArray) -> npt.NDArray[np.uint8]:
        """Hash keys (n x 13 bytes): src ip, dst ip, proto, src port, dst port."""
        k = np.empty((src.shape[0], 13), dtype=np.uint8)
        k[:, 0:4] = self.addr[src]
        k[:, 4:8] = self.addr[dst]
        k[:, 8] = 17
        sp = sport.astype(np.int64) & 0xFFFF
        k[:, 9] = sp >> 8
        k[:, 10] = sp & 0xFF
        k[:, 11] = (ROCE_PORT >> 8) & 0xFF
        k[:, 12] = ROCE_PORT & 0xFF
        return k

    # ------------------------------------------------------------------ walk
    def walk(
        self,
        start: IntArray,
        dst: IntArray,
        *,
        keys: npt.NDArray[np.uint8] | None = None,
        rng: np.random.Generator | None = None,
        entropy: npt.NDArray[np.uint64] | None = None,
    ) -> tuple[list[IntArray], npt.NDArray[np.bool_]]:
        """Walk every flow from node ``start[i]`` to NIC ``dst[i]``.

        The next hop is chosen by the switch hash of ``keys[i]`` (ECMP), uniformly with
        ``rng``, or by :func:`mix64` of ``entropy[i]`` salted per switch (oblivious spraying).
        Returns the chosen edge per hop (-1 once arrived) and an unroutable mask.
        """
        ix = self.ix
        n = start.shape[0]
        cur = start.astype(np.int64).copy()
        failed = np.zeros(n, dtype=bool)
        hops: list[IntArray] = []
        use_hash = keys is not None
        if not use_hash and rng is None and entropy is None:
            raise ValueError("walk: give keys (hashing), rng (random) or entropy")
        if use_hash and self.routing.hash.function != "crc32":
            return self._walk_scalar(start, dst, keys)  # type: ignore[arg-type]
        for _ in range(_MAX_HOPS):
            failed |= (cur != dst) & (self.att_of[dst] < 0)
            live = np.flatnonzero((cur != dst) & ~failed)
            if live.shape[0] == 0:
                break
            c = cur[live]
            d = dst[live]
            a = self.att_of[d]
            gkey = c * self.n_att + np.maximum(a, 0)
            uk, inv = np.unique(gkey, return_inverse=True)
            g_node = uk // self.n_att
            g_att = uk % self.n_att
            g_off = np.zeros(uk.shape[0], dtype=np.int64)
            g_len = np.zeros(uk.shape[0], dtype=np.int64)
            g_deliver = np.zeros(uk.shape[0], dtype=bool)
            flat: list[int] = []
            for g in range(uk.shape[0]):
                node, aid = int(g_node[g]), int(g_att[g])
                if node in self.att_sets[aid]:
                    g_deliver[g] = True
                    continue
                nh = self.routing.next_hops(node, self.att_rep[aid])
                g_off[g] = len(flat)
                g_len[g] = len(nh)
                flat.extend(nh)
            flat_a = np.array(flat, dtype=np.int64)
            chosen = np.full(live.shape[0], -1, dtype=np.int64)
            deliver = g_deliver[inv]
            if deliver.any():
                cand = self.in_edges[d[deliver]]  # (m, width)
                ok = (cand >= 0) & (ix.src[np.maximum(cand, 0)] == c[deliver][:, None])
                first = np.argmax(ok, axis=1)
                has = ok[np.arange(cand.shape[0]), first]
                chosen[np.flatnonzero(deliver)] = np.where(has, cand[np.arange(cand.shape[0]), first], -1)
            fwd = ~deliver
            if fwd.any():
                lens = g_len[inv[fwd]]
                offs = g_off[inv[fwd]]
                pick = np.zeros(lens.shape[0], dtype=np.int64)
                multi = lens > 1
                if multi.any():
                    if use_hash:
                        assert keys is not None
                        h = crc32_vec(keys[live[fwd][multi]], self.seed[c[fwd][multi]]).astype(np.int64)
                        pick[multi] = (h ^ (h >> 16)) % lens[multi]
                    elif entropy is not None:
                        salt = mix64(self.seed[c[fwd][multi]].astype(np.uint64))
                        h64 = mix64(entropy[live[fwd][multi]] ^ salt)
                        pick[multi] = (h64 % lens[multi].astype(np.uint64)).astype(np.int64)
                    else:
                        assert rng is not None
                        pick[multi] = (rng.random(int(multi.sum())) * lens[multi]).astype(np.int64)
                e = np.full(lens.shape[0], -1, dtype=np.int64)
                has_nh = lens > 0
                if has_nh.any():
                    e[has_nh] = flat_a[offs[has_nh] + pick[has_nh]]
                chosen[np.flatnonzero(fwd)] = e
            bad = chosen < 0
            failed[live[bad]] = True
            step = np.full(n, -1, dtype=np.int64)
            good = live[~bad]
            step[good] = chosen[~bad]
            cur[good] = ix.dst[chosen[~bad]]
            hops.append(step)
        failed |= cur != dst
        return hops, failed

    def _walk_scalar(
        self, start: IntArray, dst: IntArray, keys: npt.NDArray[np.uint8]
    ) -> tuple[list[IntArray], npt.NDArray[np.bool_]]:
        """Per-flow fallback for hash functions without a vectorized form (crc16, xor)."""
        from fabricscope.model.errors import UnroutableError

        n = start.shape[0]
        paths: list[tuple[int, ...]] = []
        failed = np.zeros(n, dtype=bool)
        cfg = self.routing.hash
        for i in range(n):
            s, t = int(start[i]), int(dst[i])
            key = bytes(keys[i])
            node, out = s, []
            try:
                for _ in range(_MAX_HOPS):
                    if node == t:
                        break
                    nh = self.routing.next_hops(node, t)
                    if not nh:
                        raise UnroutableError("")
                    e = nh[cfg.bucket(key, int(self.seed[node]), len(nh))] if len(nh) > 1 else nh[0]
                    out.append(e)
                    node = int(self.ix.dst[e])
                if node != t:
                    raise UnroutableError("")
            except UnroutableError:
                failed[i] = True
                out = []
            paths.append(tuple(out))
        width = max((len(p) for p in paths), default=0)
        hops = [np.array([p[j] if j < len(p) else -1 for p in paths], dtype=np.int64) for j in range(width)]
        return hops, failed

    # ------------------------------------------------------------------ schemes
    def single_paths(
        self,
        src: IntArray,
        dst: IntArray,
        sport: IntArray,
        *,
        rng: np.random.Generator | None = None,
    ) -> PathTable:
        """One path per flow: ECMP by hash (``rng`` None) or uniformly random (``rng``)."""
        if rng is None and hasattr(self.routing, "route_many"):
            # The fabric's own vectorized ECMP (one numpy pass per hop for all flows).
            pt = self.routing.route_many(src, dst, sport, strict=False)
            edges = np.asarray(pt.edges, dtype=np.int64)
            return PathTable(
                np.asarray(pt.offsets, dtype=np.int64), edges,
                np.ones(edges.shape[0]), ~np.asarray(pt.ok, dtype=bool),
            )
        keys = None if rng is not None else self.keys(src, dst, sport)
        hops, failed = self.walk(src, dst, keys=keys, rng=rng)
        return _stack(hops, failed, src.shape[0])

    def spray(self, src: IntArray, dst: IntArray) -> PathTable:
        """Even split at every hop (per-packet spraying), cached per (first switch, dst attachment)."""
        rows: list[tuple[IntArray, FloatArray] | None] = []
        for s, t in zip(src.tolist(), dst.tolist(), strict=True):
            rows.append(self._spray_one(s, t))
        return _from_rows(rows)

    def _spray_one(self, s: int, t: int) -> tuple[IntArray, FloatArray] | None:
        aid = int(self.att_of[t])
        if aid < 0 or s == t:
            return None
        first = self.routing.next_hops(s, t)
        if not first:
            return None
        es: list[IntArray] = []
        ws: list[FloatArray] = []
        k = 1.0 / len(first)
        for e in first:
            v = int(self.ix.dst[e])
            es.append(np.array([e], dtype=np.int64))
            ws.append(np.array([k]))
            if v == t:
                continue
            part = self._spray_from(v, aid)
            if part is None:
                return None
            pe, pw, dl, dw = part
            es.append(pe)
            ws.append(pw * k)
            # Delivery edges: leaf -> this destination.
            cand = self.in_edges[t]
            for leaf, frac in zip(dl.tolist(), dw.tolist(), strict=True):
                m = [c for c in cand.tolist() if c >= 0 and int(self.ix.src[c]) == leaf]
                if not m:
                    return None
                es.append(np.array([m[0]], dtype=np.int64))
                ws.append(np.array([frac * k]))
        e_all = np.concatenate(es)
        w_all = np.concatenate(ws)
        uniq, inv = np.unique(e_all, return_inverse=True)
        return uniq.astype(np.int64), np.bincount(inv, weights=w_all).astype(np.float64)

    def _spray_from(self, v: int, aid: int) -> tuple[IntArray, FloatArray, IntArray, FloatArray] | None:
        key = (v, aid)
        hit = self._spray_cache.get(key)
        if hit is not None:
            return hit
        rep = self.att_rep[aid]
        if v in self.att_sets[aid]:
            out = (np.zeros(0, np.int64), np.zeros(0), np.array([v], np.int64), np.array([1.0]))
        else:
            from fabricscope.model.errors import UnroutableError

            try:
                w = self.routing.spray_weights_nodes(v, rep)
            except UnroutableError:
                return None
            inner = [(e, f) for e, f in w.items() if int(self.ix.dst[e]) != rep]
            dl = [(int(self.ix.src[e]), f) for e, f in w.items() if int(self.ix.dst[e]) == rep]
            out = (
                np.array([e for e, _ in inner], dtype=np.int64),
                np.array([f for _, f in inner], dtype=np.float64),
                np.array([x for x, _ in dl], dtype=np.int64),
                np.array([f for _, f in dl], dtype=np.float64),
            )
        self._spray_cache[key] = out
        return out

    def oblivious(self, src: IntArray, dst: IntArray, sport: IntArray, n_paths: int,
                  rng: np.random.Generator) -> PathTable:
        """Oblivious spraying over ``n_paths`` entropies per flow (uet-htsim ``UecMpOblivious``).

        A flow's entropy values are ``n_paths`` distinct 16-bit numbers sharing random upper
        bits (drawn from ``rng``, as htsim draws ``_path_random``); every switch maps (flow,
        entropy) to a next hop with a salted uniform hash, so the flow's bytes split evenly
        over ``n_paths`` hashed paths, duplicates adding up (collisions). Rows are the union
        of the paths' links with weight (paths through the link) / ``n_paths``.
        """
        n = src.shape[0]
        if n == 0:
            return PathTable(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, bool))
        mask = (1 << max(int(n_paths - 1).bit_length(), 0)) - 1
        upper: IntArray = np.asarray(rng.integers(0, 1 << 16, size=n, dtype=np.int64), dtype=np.int64) & (~mask & 0xFFFF)
        j = np.arange(n_paths, dtype=np.int64)
        ev = (upper[:, None] | j[None, :]).ravel()  # n * n_paths entropy values
        fid = np.repeat(np.arange(n, dtype=np.int64), n_paths)
        # flow identity (endpoints, source port) and the entropy: the switch hash input
        flow_key = mix64((src.astype(np.uint64) << np.uint64(40)) ^ (dst.astype(np.uint64) << np.uint64(16))
                         ^ (sport.astype(np.uint64) & np.uint64(0xFFFF)))
        key = mix64(flow_key[fid] ^ (ev.astype(np.uint64) << np.uint64(48)))
        s_rep, d_rep = src[fid], dst[fid]
        hops, failed = self.walk(s_rep, d_rep, entropy=key)
        tab = _stack(hops, failed, fid.shape[0])
        bad = np.zeros(n, dtype=bool)
        np.logical_or.at(bad, fid, tab.unroutable)
        rows = np.repeat(fid, np.diff(tab.indptr))
        ne = self.ix.n_edges
        code = rows * ne + tab.edges
        keep = ~bad[rows]
        uniq, counts = np.unique(code[keep], return_counts=True)
        f_of = uniq // ne
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(f_of, minlength=n), out=indptr[1:])
        return PathTable(indptr, (uniq % ne).astype(np.int64), counts.astype(np.float64) / n_paths, bad)

    def stripe(self, src: IntArray, dst: IntArray, sport: IntArray) -> PathTable:
        """Even split over the source NIC's usable uplinks, ECMP inside each plane."""
        ix = self.ix
        n = src.shape[0]
        firsts: list[tuple[int, ...]] = [self.routing.next_hops(int(s), int(t)) for s, t in zip(src, dst, strict=True)]
        width = max((len(f) for f in firsts), default=0)
        rows: list[list[tuple[IntArray, FloatArray]]] = [[] for _ in range(n)]
        bad = np.array([len(f) == 0 for f in firsts], dtype=bool)
        for j in range(width):
            sel = np.array([i for i in range(n) if len(firsts[i]) > j], dtype=np.int64)
            if sel.shape[0] == 0:
                continue
            e0 = np.array([firsts[i][j] for i in sel], dtype=np.int64)
            start = ix.dst[e0]
            keys = self.keys(src[sel], dst[sel], sport[sel] + j)
            hops, failed = self.walk(start, dst[sel], keys=keys)
            tab = _stack(hops, failed, sel.shape[0])
            for r, i in enumerate(sel.tolist()):
                if tab.unroutable[r]:
                    bad[i] = True
                    continue
                k = 1.0 / len(firsts[i])
                es, _ = tab.row(r)
                rows[i].append((np.concatenate([[firsts[i][j]], es]).astype(np.int64), np.full(es.shape[0] + 1, k)))
        out: list[tuple[IntArray, FloatArray] | None] = []
        for i in range(n):
            if bad[i] or not rows[i]:
                out.append(None)
                continue
            e = np.concatenate([r[0] for r in rows[i]])
            w = np.concatenate([r[1] for r in rows[i]])
            uniq, inv = np.unique(e, return_inverse=True)
            out.append((uniq.astype(np.int64), np.bincount(inv, weights=w).astype(np.float64)))
        return _from_rows(out)

    def least_loaded(
        self, src: IntArray, dst: IntArray, sport: IntArray, load: FloatArray,
        capacity_bps: FloatArray | None = None,
    ) -> PathTable:
        """DLB: each flow, in turn, takes the next hop whose best remaining path is least loaded.

        Port quality follows CONGA (Alizadeh et al., SIGCOMM'14): a path's congestion is the
        maximum over its links, and a switch picks the next hop whose path to the destination
        leaf has the smallest one (CONGA's leaf-to-leaf feedback; Broadcom DLB's port quality
        is the local term of it). A link's metric is what its load *would be* with this
        flowlet on it, ``(flows + 1) / capacity``: the inverse of the share max-min fairness
        would give the flowlet, so an idle link at 25 % is worse than an idle one at 100 %,
        and a degraded link attracts proportionally less traffic.

        ``load`` (per directed edge, active flows per 100 Gb/s of ``capacity_bps``, the
        current capacity) is updated in place as flows are placed, so a batch of simultaneous
        flowlets spreads out. Ties are broken by the switch hash so that equal loads do not
        all pick the first port.
        """
        ix = self.ix
        # The CURRENT capacity (a degraded link counts its flows against what is left):
        # with the nominal one a flow on a 25 % link added a quarter of what its removal
        # subtracted, the metric went negative and DLB piled flows onto the degraded link.
        cap = (ix.capacity_bps if capacity_bps is None else capacity_bps) / 1e11
        inc = (1.0 / np.maximum(cap, 1e-300)).tolist()
        # Python floats: the walk touches a handful of links per hop, where numpy scalars cost
        # more than the arithmetic.
        lo = load.tolist()
        keys = self.keys(src, dst, sport)
        rows: list[tuple[IntArray, FloatArray] | None] = []
        hops = self._dlb_hops
        inf = float("inf")
        for i in range(src.shape[0]):
            s, t = int(src[i]), int(dst[i])
            memo: dict[int, float] = {t: 0.0}

            def ahead(v: int, t: int = t, memo: dict[int, float] = memo) -> float:
                """Smallest path metric (max over links) from ``v`` to ``t``; inf if none."""
                hit = memo.get(v)
                if hit is not None:
                    return hit
                memo[v] = inf  # a cycle (never on shortest paths) counts as no path
                best = inf
                for x, k in hops(v, t):
                    m = lo[x] + inc[x]
                    a = memo.get(k)
                    if a is None:
                        a = ahead(k)
                    if a > m:
                        m = a
                    if m < best:
                        best = m
                memo[v] = best
                return best

            node, path = s, []
            ok = True
            for _ in range(_MAX_HOPS):
                if node == t:
                    break
                nh = hops(node, t)
                if not nh:
                    ok = False
                    break
                if len(nh) == 1:
                    e, node = nh[0]
                else:
                    get = memo.get
                    lv = [max(lo[x] + inc[x], a if (a := get(k)) is not None else ahead(k)) for x, k in nh]
                    floor = min(lv) * (1 + 1e-9) + 1e-12
                    best = [j for j, m in enumerate(lv) if m <= floor]
                    j = best[0]
                    if len(best) > 1:
                        h = zlib.crc32(bytes(keys[i]), int(self.seed[node]))
                        j = best[(h ^ (h >> 16)) % len(best)]
                    e, node = nh[j]
                path.append(e)
            if not ok or node != t:
                rows.append(None)
                continue
            for e in path:
                lo[e] += inc[e]
            rows.append((np.array(path, dtype=np.int64), np.ones(len(path))))
        load[:] = lo
        return _from_rows(rows)

    def _dlb_hops(self, v: int, t: int) -> list[tuple[int, int]]:
        """(edge, node it leads to) of ``v``'s next hops towards NIC ``t`` (cached)."""
        key = (v, t)
        hit = self._dlb_cache.get(key)
        if hit is None:
            hit = [(int(e), int(self.ix.dst[e])) for e in self.routing.next_hops(v, t)]
            self._dlb_cache[key] = hit
        return hit


def _stack(hops: list[IntArray], failed: npt.NDArray[np.bool_], n: int) -> PathTable:
    if not hops:
        return PathTable(np.zeros(n + 1, np.int64), np.zeros(0, np.int64), np.zeros(0), failed.copy())
    h = np.stack(hops, axis=1)  # n x hops
    h[failed] = -1
    mask = h >= 0
    lens = mask.sum(axis=1)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    edges = h[mask]  # row-major: flow order, hop order
    return PathTable(indptr, edges.astype(np.int64), np.ones(edges.shape[0]), failed.copy())


def route_flows(
    finder: PathFinder,
    scheme: Scheme,
    src: IntArray,
    dst: IntArray,
    sport: IntArray,
    *,
    rng: np.random.Generator | None = None,
    load: FloatArray | None = None,
    capacity_bps: FloatArray | None = None,
) -> PathTable:
    """Routes for a batch of flows under ``scheme`` (``flowlet``/``dlb`` route one flowlet:
    pass the flowlet's source port; ``dlb`` needs ``load``)."""
    if scheme in ("ecmp", "flowlet"):
        return finder.single_paths(src, dst, sport)
    if scheme == "random":
        return finder.single_paths(src, dst, sport, rng=rng or np.random.default_rng(0))
    if scheme in ("spray", "ar"):  # ar: every equal-cost path; the switches re-weight by queue
        return finder.spray(src, dst)
    if scheme == "stripe":
        return finder.stripe(src, dst, sport)
    if scheme.startswith("oblivious"):
        return finder.oblivious(src, dst, sport, oblivious_paths(scheme), rng or np.random.default_rng(0))
    if scheme.startswith("reps"):  # the entropies it starts from; the transport engine recycles them
        return finder.oblivious(src, dst, sport, reps_paths(scheme), rng or np.random.default_rng(0))
    if scheme == "dlb":
        if load is None:
            load = np.zeros(finder.ix.n_edges)
        return finder.least_loaded(src, dst, sport, load, capacity_bps)
    raise ConfigError(f"lb: unknown scheme {scheme!r}")
