"""Localization of lossy links and devices from end-to-end probe outcomes.

Two localizers over the same observations (per-flow probes sent / lost) and path knowledge:

* :func:`vote_007` — the 007 baseline (Arzani et al., "007: Democratically Finding the Cause
  of Packet Drops", NSDI'18): every lost probe casts ``1/h`` votes on each of the ``h`` links
  of its path; links are ranked by votes.
* :func:`localize_map` (default) — a sparse MAP / maximum-likelihood estimate of per-component
  drop rates, in the spirit of NetBouncer (Tan et al., NSDI'19) but on the binomial
  likelihood instead of least squares on log-success. Probe losses of flow ``f`` are
  ``Poisson(n_f (b h_f + sum_c A_fc p_c))`` (exact to first order for small rates), where the
  *components* ``c`` form an over-complete dictionary: every directed link, every switch
  ("every path through this switch"), every NIC ("every path to this NIC"), ``A_fc`` counts how
  often flow ``f``'s request and reply traverse ``c`` and ``b`` is the learned background drop
  rate per hop. A greedy forward selection (add the component with the largest likelihood
  gain, refit the chosen ones jointly by EM, repeat while the gain is significant) gives the
  sparsest explanation: a switch fault is one switch, not thirty links; a one-way gray link is
  that direction, not the NIC. The significance of each component is its likelihood-ratio
  statistic, Bonferroni-corrected over the dictionary size, which is the finding's score.

:class:`FindingTracker` adds hysteresis: a finding opens after ``open_after`` consecutive
windows and closes after ``close_after`` windows without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix, diags, vstack
from scipy.special import chdtrc, chdtri

from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.fabric.routing import PathTable, SprayTable
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, FiveTuple

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
FlowKey = tuple[str, str, FiveTuple]
# (src NIC, dst NIC, 5-tuple) -> the directed edges of its path, or {edge: weight} over the
# candidate paths when the exact path is unknown (weights sum to 1 per hop).
PathResolver = Callable[[str, str, FiveTuple], "Sequence[int] | Mapping[int, float]"]


def reverse_tuple(ft: FiveTuple) -> FiveTuple:
    """The 5-tuple of the reply to a probe carried by ``ft``."""
    return FiveTuple(ft.dst_ip, ft.src_ip, ft.dst_port, ft.src_port, ft.proto)


class PathModel:
    """Flow -> component incidence of the request path and of the reply path, cached per flow.

    Components ``0..E-1`` are the directed links of ``fabric.index``; ``E + v`` is node ``v``
    (a NIC or a switch). A packet traverses a switch when it enters it and a NIC when it
    leaves or enters it. Flows are added one by one through ``resolver`` (live mode: paths
    from traceroute, or candidate sets) or in bulk with :meth:`bind` (twin mode: paths of a
    million flows from ``Routing.route_many``) or :meth:`bind_candidates` (no paths).

    Rows are stored as *patterns*: :attr:`patterns` is ``(P, pat_req, pat_rep)``, the distinct
    incidence rows ``P`` and, per flow, the row of ``P`` its request and its reply take. Flows
    with traced paths each have their own patterns; untraced flows of one NIC pair share one
    (the candidate split depends only on the pair), so a mesh of ~586k flows over ~68k pairs
    is solved on ~135k rows instead of ~1.2 M (docs/benchmarks/diagnosis-advisor.md).
    :attr:`matrices` materializes the per-flow rows for callers that want them.
    """

    def __init__(self, fabric: Fabric, resolver: PathResolver | None = None) -> None:
        self.fabric = fabric
        self.resolver = resolver
        ix = fabric.index
        self.n_edges = ix.n_edges
        self.n_components = ix.n_edges + ix.n_nodes
        self._row: dict[FlowKey, int] = {}
        self._n = 0
        # (patterns, request pattern per row, reply pattern per row), indices local to a block
        self._blocks: list[tuple[csr_matrix, I64, I64]] = []
        self._pending: list[tuple[dict[int, float], dict[int, float]]] = []
        self._pat: tuple[csr_matrix, I64, I64] | None = None
        self._matrix: tuple[csr_matrix, csr_matrix] | None = None
        self._bound: dict[int, tuple[Sequence[FlowKey], int]] = {}
        self._fractional = False  # set when a candidate-set (non-integer) row is added

    def component_name(self, c: int) -> tuple[str, str]:
        """(kind, inventory id) of component ``c``."""
        ix = self.fabric.index
        if c < self.n_edges:
            return "gray-link", ix.edge_id(c)
        node = ix.node_ids[c - self.n_edges]
        return ("switch-fault" if self.fabric.devices[node].is_switch else "nic-fault"), node

    def _add(self, key: FlowKey) -> int:
        if self.resolver is None:
            raise ConfigError(f"no path known for probe flow {key[0]} -> {key[1]} {key[2]}")
        src, dst, ft = key
        ix = self.fabric.index
        ws: list[dict[int, float]] = []
        for a, b, t in ((src, dst, ft), (dst, src, reverse_tuple(ft))):
            w: dict[int, float] = {}
            path = self.resolver(a, b, t)
            items = path.items() if isinstance(path, Mapping) else ((e, 1.0) for e in path)
            for e, we in items:
                w[e] = w.get(e, 0.0) + we
                v = int(ix.dst[e])
                if ix.is_switch[v]:
                    w[self.n_edges + v] = w.get(self.n_edges + v, 0.0) + we
            for nic in (a, b):
                c = self.n_edges + ix.node_of[nic]
                w[c] = w.get(c, 0.0) + 1.0
            ws.append(w)
        self._fractional = self._fractional or any(v % 1.0 for w in ws for v in w.values())
        j = self._n
        self._n += 1
        self._row[key] = j
        self._pending.append((ws[0], ws[1]))
        self._invalidate()
        return j

    def _invalidate(self) -> None:
        self._pat = None
        self._matrix = None

    def _add_block(self, mats: Sequence[csr_matrix]) -> None:
        """Append a block of per-flow (request, reply) rows: each row its own pattern."""
        n = mats[0].shape[0]
        self._blocks.append((vstack([mats[0], mats[1]]).tocsr(), np.arange(n, dtype=np.int64),
                             np.arange(n, 2 * n, dtype=np.int64)))

    def _flush(self) -> None:
        if not self._pending:
            return
        mats = []
        for d in (0, 1):
            rows = [w[d] for w in self._pending]
            lens = np.fromiter((len(w) for w in rows), dtype=np.int64, count=len(rows))
            indptr = np.r_[0, np.cumsum(lens)].astype(np.int64)
            idx = np.fromiter((k for w in rows for k in w), dtype=np.int64, count=int(indptr[-1]))
            val = np.fromiter((v for w in rows for v in w.values()), dtype=np.float64, count=int(indptr[-1]))
            mats.append(csr_matrix((val, idx, indptr), shape=(len(rows), self.n_components)))
        self._add_block(mats)
        self._pending = []

    def bind(self, flows: Sequence[FlowKey], src_node: I64, dst_node: I64,
             paths: tuple[PathTable, PathTable]) -> I64:
        """Add many flows at once from their request / reply path tables (vectorized).

        ``flows`` is remembered by identity: :meth:`rows` of that same object is then free.
        """
        self._flush()
        ix = self.fabric.index
        n = len(flows)
        mats = []
        for d, table in enumerate(paths):
            lens = np.diff(table.offsets)
            rows_e = np.repeat(np.arange(n), lens)
            e = table.edges
            v = ix.dst[e]
            sw = ix.is_switch[v]
            a, b = (src_node, dst_node) if d == 0 else (dst_node, src_node)
            r = np.concatenate([rows_e, rows_e[sw], np.arange(n), np.arange(n)])
            c = np.concatenate([e, self.n_edges + v[sw], self.n_edges + a, self.n_edges + b])
            m = csr_matrix((np.ones(r.shape[0]), (r, c)), shape=(n, self.n_components))
            m.sum_duplicates()
            mats.append(m)
        r0 = self._n
        self._add_block(mats)
        self._n += n
        self._bound[id(flows)] = (flows, r0)
        self._invalidate()
        return np.arange(r0, r0 + n, dtype=np.int64)

    def bind_candidates(self, flows: Sequence[FlowKey], src_node: I64, dst_node: I64,
                        weights: Callable[[int, int], Mapping[int, float]] | None = None, *,
                        spray: Callable[[I64, I64], SprayTable] | None = None) -> I64:
        """Add many flows whose exact paths are unknown: each (request or reply) row is the
        candidate-path weights of its node pair, computed once per pair, either by
        ``weights(a, b)`` pair by pair (e.g. ``Routing.spray_weights_nodes``) or, faster, by
        ``spray(a_nodes, b_nodes)`` for every distinct pair at once (``Routing.spray_many``,
        the same even ECMP split). The flows of one pair share one pattern (:attr:`patterns`).
        """
        if (weights is None) == (spray is None):
            raise ValueError("bind_candidates: give exactly one of weights or spray")
        self._flush()
        ix = self.fabric.index
        n = len(flows)
        s = np.asarray(src_node, dtype=np.int64)
        t = np.asarray(dst_node, dtype=np.int64)
        pairs, inv = np.unique(np.r_[s * ix.n_nodes + t, t * ix.n_nodes + s], return_inverse=True)
        a_nodes, b_nodes = pairs // ix.n_nodes, pairs % ix.n_nodes
        if spray is not None:
            per_pair = self._candidate_rows(a_nodes, b_nodes, spray(a_nodes, b_nodes))
        else:
            assert weights is not None
            rows: list[dict[int, float]] = []
            for a, b in zip(a_nodes.tolist(), b_nodes.tolist(), strict=True):
                w: dict[int, float] = {}
                for e, we in weights(a, b).items():
                    w[e] = w.get(e, 0.0) + we
                    v = int(ix.dst[e])
                    if ix.is_switch[v]:
                        w[self.n_edges + v] = w.get(self.n_edges + v, 0.0) + we
                for nic in (a, b):
                    w[self.n_edges + nic] = w.get(self.n_edges + nic, 0.0) + 1.0
                rows.append(w)
            lens = np.fromiter((len(w) for w in rows), dtype=np.int64, count=len(rows))
            indptr = np.r_[0, np.cumsum(lens)].astype(np.int64)
            idx = np.fromiter((k for w in rows for k in w), dtype=np.int64, count=int(indptr[-1]))
            val = np.fromiter((v for w in rows for v in w.values()), dtype=np.float64,
                              count=int(indptr[-1]))
            per_pair = csr_matrix((val, idx, indptr), shape=(len(rows), self.n_components))
        self._fractional = self._fractional or bool(np.any(per_pair.data % 1.0 != 0.0))
        r0 = self._n
        inv = np.asarray(inv, dtype=np.int64).ravel()
        self._blocks.append((per_pair, inv[:n].copy(), inv[n:].copy()))
        self._n += n
        self._bound[id(flows)] = (flows, r0)
        self._invalidate()
        return np.arange(r0, r0 + n, dtype=np.int64)

    def _candidate_rows(self, a: I64, b: I64, table: SprayTable) -> csr_matrix:
        """Incidence rows of node pairs ``(a[i], b[i])`` from their spray table: each edge at
        its weight, the switch it enters at the same weight, both NICs once."""
        ix = self.fabric.index
        m = a.shape[0]
        r_e = np.repeat(np.arange(m, dtype=np.int64), np.diff(table.offsets))
        e, w = table.edges, table.weights
        v = ix.dst[e]
        sw = ix.is_switch[v]
        r = np.concatenate([r_e, r_e[sw], np.arange(m), np.arange(m)])
        c = np.concatenate([e, self.n_edges + v[sw], self.n_edges + a, self.n_edges + b])
        val = np.concatenate([w, w[sw], np.ones(2 * m)])
        out = csr_matrix((val, (r, c)), shape=(m, self.n_components))
        out.sum_duplicates()
        return out

    def rows(self, flows: Sequence[FlowKey]) -> I64:
        """Row ids of ``flows`` (resolving paths of new flows)."""
        bound = self._bound.get(id(flows))
        if bound is not None and bound[0] is flows:
            return np.arange(bound[1], bound[1] + len(flows), dtype=np.int64)
        get = self._row.get
        out = np.empty(len(flows), dtype=np.int64)
        for i, k in enumerate(flows):
            j = get(k)
            out[i] = self._add(k) if j is None else j
        return out

    @property
    def patterns(self) -> tuple[csr_matrix, I64, I64]:
        """``(P, pat_req, pat_rep)``: the distinct incidence rows and, per known flow, the row
        of ``P`` of its request and of its reply (``matrices == (P[pat_req], P[pat_rep])``)."""
        if self._pat is None:
            self._flush()
            if not self._blocks:
                z = np.zeros(0, dtype=np.int64)
                self._pat = (csr_matrix((0, self.n_components)), z, z)
                return self._pat
            if len(self._blocks) > 1:
                offs = np.cumsum([0] + [b[0].shape[0] for b in self._blocks])
                self._blocks = [(vstack([b[0] for b in self._blocks]).tocsr(),
                                 np.concatenate([b[1] + o for b, o in zip(self._blocks, offs, strict=False)]),
                                 np.concatenate([b[2] + o for b, o in zip(self._blocks, offs, strict=False)]))]
            P, pf, pr = self._blocks[0]
            self._pat = (P, pf, pr)
            hp = np.asarray(P[:, : self.n_edges].sum(axis=1)).ravel()
            self._hops1 = (hp[pf], hp[pr])
        return self._pat

    @property
    def matrices(self) -> tuple[csr_matrix, csr_matrix]:
        """(request incidence, reply incidence), one row per known flow (materialized from
        :attr:`patterns` on first use)."""
        if self._matrix is None:
            P, pf, pr = self.patterns
            self._matrix = (P[pf], P[pr])
        return self._matrix

    @property
    def fractional(self) -> bool:
        """Whether some flow's path is a candidate set (weights not whole traversals)."""
        return self._fractional

    def hops_one_way(self) -> tuple[F64, F64]:
        """Link traversals of the request and of the reply path, per known flow."""
        self.patterns  # noqa: B018 - builds the cache
        return self._hops1

    @property
    def hops(self) -> F64:
        """Round-trip link traversals per known flow."""
        a, b = self.hops_one_way()
        out: F64 = a + b
        return out


@dataclass(frozen=True, slots=True)
class LossCounts:
    """Probes sent and lost per flow (one window).

    ``lost_req``: of the lost, how many were lost on the request path (known from the
    responder's ``rx_count``); ``lost_unknown``: lost with no direction information. A flow
    with any ``lost_unknown`` is treated round-trip (request and reply paths together).
    """

    flows: Sequence[FlowKey]
    sent: I64
    lost: I64
    lost_req: I64 | None = None
    lost_unknown: I64 | None = None
    window: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class _System:
    """The stacked Poisson system: rows are (flow, direction) observations."""

    X: csr_matrix  # x_rc = probes through c expected on row r (n_r * A_rc)
    lost: F64
    base: F64  # background expected losses per row
    D: F64  # sum_r x_rc: expected traversals per component
    row_flow: I64  # the flow (index into counts.flows) of each row


def _row_split(counts: LossCounts) -> tuple[F64, F64, F64, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """(sent, lost, lost requests, flows whose loss direction is known, flows where it is not).

    A flow's losses split into request and reply directions only when the responder counted
    the requests it saw (``lost_req``) and no loss is of unknown direction.
    """
    sent = counts.sent.astype(np.float64)
    lost = counts.lost.astype(np.float64)
    lreq = counts.lost_req.astype(np.float64) if counts.lost_req is not None else np.zeros_like(lost)
    lunk = counts.lost_unknown if counts.lost_unknown is not None else counts.lost
    rt = (lunk > 0) | (counts.lost_req is None)
    return sent, lost, lreq, (sent > 0) & ~rt, (sent > 0) & rt


def _system(model: PathModel, counts: LossCounts, loss_per_hop: float) -> _System:
    """The lossy rows of the stacked system and, over every row, ``D = X^T 1``."""
    rows = model.rows(counts.flows)
    P, pat_f, pat_r = model.patterns
    pf, pr = pat_f[rows], pat_r[rows]
    hF, hR = model.hops_one_way()
    sent, lost, lreq, d, u = _row_split(counts)
    # Probes through each component, over every flow (lossless ones included): the probes
    # per pattern (flows sharing a pattern summed), then one sparse product.
    w = np.zeros(P.shape[0])
    w += np.bincount(pf[d], weights=sent[d], minlength=P.shape[0])
    w += np.bincount(pr[d], weights=sent[d] - lreq[d], minlength=P.shape[0])
    w += np.bincount(pf[u], weights=sent[u], minlength=P.shape[0])
    w += np.bincount(pr[u], weights=sent[u], minlength=P.shape[0])
    D = np.asarray(P.T @ w).ravel()
    fid = np.arange(len(counts.flows))
    sF = d & (lreq > 0)
    sR = d & (lost - lreq > 0)
    sU = u & (lost > 0)
    nF, nR, nU = sent[sF], sent[sR] - lreq[sR], sent[sU]
    X = vstack([diags(nF) @ P[pf[sF]], diags(nR) @ P[pr[sR]],
                diags(nU) @ (P[pf[sU]] + P[pr[sU]])]).tocsr()
    lost_rows = np.r_[lreq[sF], lost[sR] - lreq[sR], lost[sU]]
    hops = np.r_[hF[rows[sF]], hR[rows[sR]], hF[rows[sU]] + hR[rows[sU]]]
    base = np.r_[nF, nR, nU] * loss_per_hop * np.maximum(hops, 1.0)
    return _System(X, lost_rows, base, D, np.r_[fid[sF], fid[sR], fid[sU]])


def _all_rows(model: PathModel, counts: LossCounts, loss_per_hop: float,
              cols: I64) -> tuple[csr_matrix, F64, F64, F64, I64, F64]:
    """Every row of the stacked system (lossless ones too), restricted to columns ``cols``:
    (traversal weights per probe, probes, losses, background expected losses, origin node,
    multiplicity).

    Lossless rows that are equal (the same pattern and probe count: untraced flows of one
    NIC pair sent as many probes) are given once with their multiplicity, which the latent-path
    likelihoods weigh by (:mod:`~fabricscope.probe.mixture`); a lossy row stands for itself.
    """
    rows = model.rows(counts.flows)
    P, pat_f, pat_r = model.patterns
    pf, pr = pat_f[rows], pat_r[rows]
    hF, hR = model.hops_one_way()
    sent, lost, lreq, d, u = _row_split(counts)
    # Origin NIC of each row: the prober for requests, the responder for replies.
    node_of = model.fabric.index.node_of
    s_node = getattr(counts.flows, "src_node", None)
    t_node = getattr(counts.flows, "dst_node", None)
    if s_node is None or t_node is None:
        s_node = np.array([node_of[f[0]] for f in counts.flows], dtype=np.int64)
        t_node = np.array([node_of[f[1]] for f in counts.flows], dtype=np.int64)
    s_node, t_node = np.asarray(s_node, dtype=np.int64), np.asarray(t_node, dtype=np.int64)
    # Blocks: request rows and reply rows of flows whose loss direction is known, round trips
    # of the others. Per row: pattern(s), probes, losses, hops, origin.
    nd, nu = int(d.sum()), int(u.sum())
    blk = np.r_[np.zeros(nd, np.int64), np.ones(nd, np.int64), np.full(nu, 2, np.int64)]
    pa = np.r_[pf[d], pr[d], pf[u]]
    pb = np.r_[np.full(2 * nd, -1, np.int64), pr[u]]
    n = np.r_[sent[d], sent[d] - lreq[d], sent[u]]
    lo = np.r_[lreq[d], lost[d] - lreq[d], lost[u]]
    hops = np.r_[hF[rows[d]], hR[rows[d]], hF[rows[u]] + hR[rows[u]]]
    origin = np.r_[s_node[d], t_node[d], s_node[u]]
    keep = np.arange(blk.shape[0])
    mult = np.ones(blk.shape[0])
    free = np.flatnonzero(lo == 0)
    n_pat = P.shape[0] + 1
    n_max = float(n.max(initial=0.0)) + 1.0
    if free.size and 3.0 * n_pat * n_pat * n_max < 2.0**62:
        key = ((blk[free] * n_pat + (pb[free] + 1)) * n_pat + pa[free]) * int(n_max) \
            + n[free].astype(np.int64)
        _, first, cnt = np.unique(key, return_index=True, return_counts=True)
        keep = np.r_[np.flatnonzero(lo > 0), free[first]]
        mult = np.r_[np.ones(keep.shape[0] - first.shape[0]), cnt.astype(np.float64)]
    Pc = P[:, cols].tocsr()
    parts, order = [], []
    for b in (0, 1, 2):
        sel = keep[blk[keep] == b]
        m = Pc[pa[sel]]
        parts.append(m + Pc[pb[sel]] if b == 2 else m)
        order.append(np.flatnonzero(blk[keep] == b))
    pos = np.concatenate(order)
    W = vstack(parts).tocsr()
    k = keep[pos]
    return W, n[k], lo[k], n[k] * loss_per_hop * np.maximum(hops[k], 1.0), origin[k], mult[pos]


def _mixture_alternatives(model: PathModel, counts: LossCounts, loss_per_hop: float,
                          comp: int, others: Sequence[int], p_others: F64,
                          poisson_gain: F64, shortlist: int = 128) -> tuple[F64, F64, F64]:
    """Gains and drop rates of the likeliest stand-ins for ``comp`` under the latent-path
    likelihood (:mod:`~fabricscope.probe.mixture`), the ``others`` held at ``p_others``.

    Only the ``shortlist`` best components of the fast (Poisson) search are rescored: the
    truth explains the losses well under either model, so it is among them.
    """
    from fabricscope.probe.mixture import grouped_gains, mixture_gains

    g = poisson_gain.copy()
    g[list(others)] = 0.0
    cand = np.flatnonzero(g > 0)
    cand = cand[np.argsort(-g[cand], kind="stable")[:shortlist]]
    if comp not in cand:
        cand = np.r_[comp, cand]
    cols = np.r_[np.asarray(list(others), dtype=np.int64), cand].astype(np.int64)
    W, n, lo, base, origin, mult = _all_rows(model, counts, loss_per_hop, cols)
    k = len(others)
    lam = base + (np.asarray(W[:, :k] @ p_others).ravel() * n if k else 0.0)
    Wc = W[:, k:].tocsr()
    gm, pm = mixture_gains(Wc, n, lo, lam, mult=mult)
    ga = grouped_gains(Wc, n, lo, lam, origin, mult=mult)
    gain = np.zeros(model.n_components)
    rate = np.zeros(model.n_components)
    robust = np.zeros(model.n_components)
    gain[cand], rate[cand], robust[cand] = gm, pm, ga
    return gain, rate, robust


@dataclass(frozen=True, slots=True)
class Candidate:
    """One member of an estimate's credible set."""

    component: int
    kind: str
    subject: str
    posterior: float


@dataclass(frozen=True, slots=True)
class Estimate:
    """One selected component of the explanation."""

    component: int
    kind: str
    subject: str
    loss: float  # estimated drop probability per traversal (NaN for 007)
    llr: float  # log-likelihood ratio (nats) of "with it" vs "without it" (votes for 007)
    score: float  # Bonferroni-corrected significance in [0, 1] (vote share for 007)
    lost_explained: float
    evidence: tuple[str, ...] = ()
    # The credible set: every component that explains the same losses about as well, with
    # its posterior probability of being the one (``component`` is among them). One entry
    # means the data single it out; several mean the probes cannot tell them apart.
    candidates: tuple[Candidate, ...] = ()

    @property
    def ambiguous(self) -> bool:
        return len(self.candidates) > 1


def _best_single(r: I64, c: I64, x: F64, lL: F64, lam: F64, D: F64, C: int) -> tuple[F64, F64]:
    """For every column at once, the best drop rate ``p_c`` of a single addition to the model
    ``lam`` and its log-likelihood gain: maximize ``g(p) = sum_f l_f log(lam_f + x_fc p) - p D_c``
    (concave) by Newton from p = 0 (g' is convex and decreasing, so the iterates increase
    monotonically to the root)."""
    pc = np.zeros(C)
    for _ in range(40):
        den = lam[r] + x * pc[c]
        g1 = np.bincount(c, weights=lL[r] * x / den, minlength=C) - D
        g2 = np.bincount(c, weights=lL[r] * x * x / (den * den), minlength=C)
        step = np.where(g2 > 0, g1 / np.maximum(g2, 1e-300), 0.0)
        pc = np.clip(pc + step, 0.0, 1.0)
    gain = np.bincount(c, weights=lL[r] * np.log1p(x * pc[c] / lam[r]), minlength=C) - pc * D
    gain[D <= 0] = 0.0
    return pc, gain


def credible_set(gain: F64, *, level: float = 0.99, max_size: int = 64) -> tuple[tuple[int, float], ...]:
    """The smallest set of components holding ``level`` of the posterior that *one* of them
    explains the losses (uniform prior; the likelihood of component c is ``exp(gain_c)`` with
    its drop rate profiled out), as (component, posterior) pairs, most probable first.

    This is the single-effect credible set of Bayesian fine-mapping (Wang et al., "A simple
    new approach to variable selection in regression", JRSS-B 2020, SuSiE): candidates the
    probes cannot separate (the two spines of a flow whose ECMP choice is unknown, the two
    directions of a cable without the responder's rx_count) share the posterior, so none of
    them is named with a confidence the data do not give.
    """
    cand = np.flatnonzero(gain > 0)
    if cand.size == 0:
        return ()
    g = gain[cand]
    order = np.argsort(-g, kind="stable")
    w = np.exp(g[order] - g[order[0]])
    w /= w.sum()
    k = int(np.searchsorted(np.cumsum(w), level - 1e-12)) + 1
    k = min(k, max_size, w.size)
    return tuple((int(cand[order[i]]), float(w[i])) for i in range(k))


def describe_set(fabric: Fabric, cands: Sequence[Candidate]) -> tuple[str, str]:
    """(what the candidates have in common, what would tell them apart)."""
    kinds = {c.kind for c in cands}
    if kinds != {"gray-link"}:
        names = ", ".join(sorted(f"{c.kind} {c.subject}" for c in cands))
        return (f"{len(cands)} candidates of different kinds: {names}",
                "the responder's rx_count (request vs reply loss) and probes to more peers of "
                "the device separate a device fault from one of its links")
    ends = [tuple(c.subject.split("->")) for c in cands]
    src = sorted({port_device(a) for a, _ in ends})
    dst = sorted({port_device(b) for _, b in ends})
    cables = {tuple(sorted(e)) for e in ends}
    if len(cables) == 1:
        return (f"both directions of cable {'|'.join(next(iter(cables)))}",
                "the responder's rx_count (request vs reply loss) separates the directions: "
                "use agents that report it")
    role = {fabric.devices[d].role for d in (*src, *dst) if d in fabric.devices}
    if len(dst) == 1:
        common = f"one of {len(cands)} links into {dst[0]} (from {', '.join(src)})"
    elif len(src) == 1:
        common = f"one of {len(cands)} links out of {src[0]} (to {', '.join(dst)})"
    else:
        common = f"one of {len(cands)} links ({'/'.join(sorted(role))} tier)"
    return (common, "the flows' ECMP choices are unknown: trace them (`fabricscope lab trace`, "
                    "then `probe analyze --paths`); more source ports per peer only help where "
                    "the candidates' path sets differ")


def _score(llr: float, n_tests: int) -> float:
    return float(max(0.0, 1.0 - n_tests * chdtrc(1, 2.0 * max(llr, 0.0))))


def localize_map(
    model: PathModel,
    counts: LossCounts,
    *,
    loss_per_hop: float = 1e-5,
    alpha: float = 1e-4,
    min_loss: float = 1e-3,
    max_components: int = 8,
    em_iters: int = 150,
    level: float = 0.99,
) -> list[Estimate]:
    """Sparse maximum-likelihood explanation of probe losses (see the module docstring).

    Returns the selected components whose drop rate is at least ``min_loss`` and whose
    likelihood gain is significant at family-wise level ``alpha`` over all components,
    strongest first. Each carries its credible set at ``level`` (:func:`credible_set`); the
    score is the family-wise significance times the set's posterior mass, so a component
    that ties with others is reported as the set, never alone with a confidence of 1.
    """
    if int(counts.lost.sum()) == 0:
        return []
    sy = _system(model, counts, loss_per_hop)
    lossy = sy.lost > 0
    X = sy.X[np.flatnonzero(lossy)].tocsr()
    lL, base, D = sy.lost[lossy], sy.base[lossy], sy.D
    row_flow = sy.row_flow[lossy]
    Xc = X.tocoo()
    C = model.n_components
    n_tests = int(np.count_nonzero(D))
    tau = 0.5 * float(chdtri(1, alpha / max(n_tests, 1)))

    chosen: list[int] = []
    p = np.zeros(0)
    lam = base.copy()
    r, c, x = Xc.row, Xc.col, Xc.data
    for _ in range(max_components):
        # Best single addition with the current model fixed (see _best_single).
        pc, gain = _best_single(r, c, x, lL, lam, D, C)
        gain[chosen] = 0.0
        best = int(np.argmax(gain))
        if gain[best] < tau:
            break
        chosen.append(best)
        p = np.r_[p, pc[best]]
        # Joint refit of the chosen components: MAP-EM multiplicative updates (Shepp-Vardi).
        Xs = X[:, chosen]
        Ds = D[chosen]
        for _ in range(em_iters):
            lam = base + Xs @ p
            p = np.minimum(p * (Xs.T @ (lL / lam)) / np.maximum(Ds, 1e-300), 1.0)
        lam = base + Xs @ p

    out: list[Estimate] = []
    fractional = bool(chosen) and model.fractional
    ll_full = float(np.sum(lL * np.log(lam)))
    for i, comp in enumerate(chosen):
        contrib = np.asarray(X[:, comp].todense()).ravel() * p[i]
        lam_wo = lam - contrib
        llr = ll_full - float(np.sum(lL * np.log(np.maximum(lam_wo, 1e-300)))) - p[i] * D[comp]
        if p[i] < min_loss or llr < tau:
            continue
        # Which components could stand in for this one, the others held fixed: the credible
        # set. Its mass, not this component's own, is what the data say about "one of these".
        _, alt = _best_single(r, c, x, lL, lam_wo, D, C)
        others = [j for j in chosen if j != comp]
        alt[others] = 0.0
        alt[comp] = max(float(alt[comp]), llr)
        loss_i = float(p[i])
        if fractional:
            # Untraced flows: rescore the likeliest stand-ins with each flow on ONE of its
            # candidate paths (the Poisson split is only the search heuristic), which also
            # gives the drop rate unbiased by the split.
            alt, rate, robust = _mixture_alternatives(model, counts, loss_per_hop, comp, others,
                                                      np.delete(p, i), alt)
        cset = credible_set(alt, level=level) or ((comp, 1.0),)
        if fractional:
            # The even split is a prior, and a wrong one under hash polarization: add every
            # component that, with the split left free per origin NIC (grouped_gains),
            # explains the losses about as well as the set's best member does under the
            # same freedom (a likelihood-ratio test at 1 - level cannot prefer that member).
            tol = 0.5 * float(chdtri(1, 1.0 - level))
            inset = {j for j, _ in cset}
            ref = float(robust[cset[0][0]])
            extra = [int(j) for j in np.flatnonzero(robust >= ref - tol) if int(j) not in inset]
            extra.sort(key=lambda j: -robust[j])
            cset = (*cset, *((j, 0.0) for j in extra))
        mass = sum(w for _, w in cset)
        cands = tuple(Candidate(j, *model.component_name(j), w) for j, w in cset)
        if fractional and cands[0].component != comp:
            # Name the most probable member (it may not be the one the search picked) and
            # its latent-path drop rate; its evidence is the flows that cross IT, not the
            # flows of the component the search had picked.
            comp = cands[0].component
            contrib = np.asarray(X[:, comp].todense()).ravel() * p[i]
        if fractional:
            loss_i = float(rate[comp])
        kind, subject = model.component_name(comp)
        explained = float(np.sum(lL * contrib / lam))
        hit = np.flatnonzero(contrib > 0)
        ev_rows = list(dict.fromkeys(int(row_flow[r]) for r in hit[np.argsort(-lL[hit])]))[:5]
        evidence = tuple(
            f"{counts.flows[j][0]}->{counts.flows[j][1]} sport {counts.flows[j][2].src_port}: "
            f"{int(counts.lost[j])}/{int(counts.sent[j])} lost" for j in ev_rows
        )
        out.append(Estimate(comp, kind, subject, loss_i, llr,
                            _score(llr, n_tests) * min(1.0, mass), explained, evidence, cands))
    out.sort(key=lambda e: -e.llr)
    return out


def vote_007(model: PathModel, counts: LossCounts, *, min_votes: float = 2.0,
             min_share: float = 0.02) -> list[Estimate]:
    """007 voting: each lost probe gives ``1/h`` vote to each of its ``h`` path links.

    Only directed links are candidates (007 names links). A link is reported when its votes
    are at least ``min_votes`` and ``min_share`` of all votes; score is its vote share.
    """
    if int(counts.lost.sum()) == 0:
        return []
    sy = _system(model, counts, 0.0)
    lossy = sy.lost > 0
    X = sy.X[np.flatnonzero(lossy)][:, : model.n_edges].tocsr()
    A = X.copy()
    A.data[:] = 1.0  # which links each lossy row's path crosses
    h = np.maximum(np.asarray(A.sum(axis=1)).ravel(), 1.0)
    votes = np.asarray(A.T @ (sy.lost[lossy] / h)).ravel()
    total = float(votes.sum())
    order = np.argsort(-votes)
    out = []
    for e in order[:20]:
        v = float(votes[e])
        if v < min_votes or v < min_share * total:
            break
        kind, subject = model.component_name(int(e))
        out.append(Estimate(int(e), kind, subject, float("nan"), v, v / total, v))
    return out


def estimate_label(e: Estimate) -> tuple[str, str]:
    """(kind, subject) of a finding for ``e``: the component itself when the data single it
    out, else its credible set: the members' common kind (``ambiguous`` when they differ)
    and their ids joined by `` | `` in a stable (sorted) order."""
    if not e.ambiguous:
        return e.kind, e.subject
    kinds = {c.kind for c in e.candidates}
    kind = next(iter(kinds)) if len(kinds) == 1 else "ambiguous"
    return kind, " | ".join(sorted(c.subject for c in e.candidates))


def set_details(fabric: Fabric | None, e: Estimate) -> dict[str, float | int | str]:
    """Details describing ``e``'s credible set (empty when it has one member)."""
    if not e.ambiguous:
        return {}
    likely = [c for c in e.candidates if c.posterior >= 0.005]
    rest = len(e.candidates) - len(likely)
    post = ", ".join(f"{c.subject}={c.posterior:.2f}" for c in likely)
    if rest:
        post += f"; {rest} more not excluded if the ECMP hashing is polarized"
    out: dict[str, float | int | str] = {"candidates": len(e.candidates), "posterior": post}
    if fabric is not None:
        out["common"], out["separate_by"] = describe_set(fabric, e.candidates)
    return out


def estimates_to_findings(est: Sequence[Estimate], window: tuple[int, int], *,
                          method: str = "map", fabric: Fabric | None = None) -> list[Finding]:
    """Turn estimates into :class:`Finding` records (the one output type).

    An ambiguous estimate becomes one finding naming its whole credible set (see
    :func:`estimate_label`), with the set's score, each member's posterior, what the
    members share and what would separate them.
    """
    actions = {
        "gray-link": "drain or swap the optic/cable of this direction; check FEC/CRC counters",
        "switch-fault": "drain the switch and check its line cards and forwarding tables",
        "nic-fault": "check the NIC (link flaps, firmware, PCIe errors); drain the host",
    }
    out = []
    for e in est:
        kind, subject = estimate_label(e)
        extra = set_details(fabric, e)
        evidence = e.evidence
        action = actions.get(kind, "")
        if extra:
            evidence = (f"ambiguous: {extra['candidates']} candidates explain these losses "
                        f"(posterior {extra['posterior']})", *evidence)
            sep = extra.get("separate_by", "trace the probe flows' paths (--paths)")
            action = f"not yet localized to one candidate; to separate them: {sep}"
        out.append(Finding(kind=kind, subject=subject, score=round(e.score, 6), window=window,
                           evidence=evidence, action=action,
                           details={"loss": e.loss, "strength": e.llr,
                                    "lost_explained": e.lost_explained, "method": method,
                                    **extra}))
    return out


@dataclass
class FindingTracker:
    """Hysteresis: open after ``open_after`` consecutive windows with the finding (score >=
    ``open_score``), close after ``close_after`` consecutive windows without it."""

    open_after: int = 2
    close_after: int = 3
    open_score: float = 0.99
    _seen: dict[tuple[str, str], int] = field(default_factory=dict)
    _missing: dict[tuple[str, str], int] = field(default_factory=dict)
    open: dict[tuple[str, str], Finding] = field(default_factory=dict)
    opened_at: dict[tuple[str, str], int] = field(default_factory=dict)
    events: list[tuple[int, str, str, str]] = field(default_factory=list)

    def update(self, findings: Sequence[Finding], t_ns: int) -> list[Finding]:
        """Feed one window's findings; returns the open findings, strongest first."""
        now = {(f.kind, f.subject): f for f in findings if f.score >= self.open_score}
        for key, f in now.items():
            self._seen[key] = self._seen.get(key, 0) + 1
            self._missing.pop(key, None)
            if key in self.open:
                self.open[key] = f
            elif self._seen[key] >= self.open_after:
                self.open[key] = f
                self.opened_at[key] = t_ns
                self.events.append((t_ns, "open", *key))
        for key in set(self._seen) | set(self.open):
            if key in now:
                continue
            self._seen.pop(key, None)
            if key in self.open:
                self._missing[key] = self._missing.get(key, 0) + 1
                if self._missing[key] >= self.close_after:
                    self.open.pop(key)
                    self._missing.pop(key)
                    self.events.append((t_ns, "close", *key))
        return sorted(
            (replace(f, details={**f.details, "opened_ns": self.opened_at[k]})
             for k, f in self.open.items()),
            key=lambda f: -float(f.details.get("strength", 0.0)),
        )
