"""Blast radius: what one failure of each component class takes out, averaged over its units.

Every unit of every class in :data:`~fabricscope.design.model.COMPONENTS` present in the
fabric is failed alone, exactly (sparse matrix products, no sampling), and the outcome is
averaged into one :class:`~fabricscope.design.model.BlastRow` per class. A GPU is reached
through the NIC whose ``gpu`` field names it (``w_n`` GPUs behind NIC ``n``: 1 in every
builder; a host's GPUs with no such NIC are spread over its untagged NICs).

Definitions (``s_nL`` = share of NIC ``n``'s capacity cabled to leaf ``L``):

* ``gpu``: cuts its own GPU. ``nic``: cuts the GPUs behind it.
* ``leaf`` and ``link:host-leaf``: a NIC that loses all of its capacity (every port on the
  failed leaf / its only port on the failed cable) is cut; a multi-homed NIC keeps its other
  ports and is *degraded* with ``bandwidth_lost = s_nL`` (the failed ports' share), failover
  ``dual-tor`` (two ToRs of one plane, ``homes=2``) or ``multi-plane`` (planes share
  nothing above the NIC), as in Alibaba HPN (Qian et al., "Alibaba HPN: A Data Center
  Network for Large Language Model Training", SIGCOMM'24), whose dual-ToR turns a ToR
  failure from a job stop into half the NIC's bandwidth.
* ``spine``, ``core``, ``link:leaf-spine``, ``link:spine-core``: ECMP in a folded Clos
  (Al-Fares et al., "A Scalable, Commodity Data Center Network Architecture", SIGCOMM'08)
  spreads a GPU's upward traffic uniformly over equal-cost next hops, weighted by
  capacity: at leaf ``L`` a spine ``S`` gets ``f_LS = cap(L->S) / cap(L up)``, at spine
  ``S`` a core ``C`` gets ``g_SC = cap(S->C) / cap(S up)``. The share of NIC ``n``'s upward
  traffic that crossed the failed element is

      spine S:            sum_L s_nL f_LS
      core C:             sum_L s_nL sum_S f_LS g_SC   (of the traffic leaving the pod)
      leaf-spine link l:  s_nL cap(l) / cap(L up)
      spine-core link l:  sum_L s_nL f_LS cap(l) / cap(S up)

  and is lost until the repair (fast reroute moves the flows onto the remaining next hops
  within ~50 ms, failover ``fast-reroute``; the capacity stays gone). A NIC whose share is
  the whole (a leaf whose only uplink died) is counted as cut: its GPUs lose every path
  leaving the leaf.

``gpus_cut`` and ``gpus_degraded`` are means over the units of a class (GPUs per failure);
``bandwidth_lost`` is the GPU-weighted mean loss of the degraded GPUs, so
``gpus_degraded x bandwidth_lost`` is the GPU-equivalents of bandwidth a failure removes.
A multi-homed NIC counts as one degraded GPU losing the NIC-wide share (a multi-plane NIC
behind a failed plane-0 spine loses ``f_LS / 2``). Upward traffic only: traffic between
GPUs of one leaf never crosses a spine. Cables that skip a tier (a NIC on a spine, a leaf on
a core; no builder makes them) are not analysed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy.sparse import coo_matrix, csr_matrix

from fabricscope.design.bom import link_class
from fabricscope.design.model import COMPONENTS, BlastRow, Failover
from fabricscope.fabric.inventory import TIER_OF_ROLE, Fabric

__all__ = ["blast_radius"]

_EPS = 1e-9
_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]


def blast_radius(fabric: Fabric) -> tuple[BlastRow, ...]:
    """One :class:`BlastRow` per component class present in ``fabric``, in COMPONENTS order.

    Exact over every unit (see the module docstring for the definitions); O(links) to
    index plus sparse products whose size is (distinct NIC homing patterns) x (elements).
    """
    nics = fabric.nics
    nic_of = {n.id: i for i, n in enumerate(nics)}
    idx: dict[str, dict[str, int]] = {r: {} for r in ("leaf", "spine", "core")}
    for d in fabric.switches:
        idx[d.role][d.id] = len(idx[d.role])
    w = _gpu_weights(fabric)
    dev_of = {pid: p.device for pid, p in fabric.ports.items()}
    role = {d.id: d.role for d in fabric.devices.values()}
    hl: list[tuple[int, int, float]] = []
    ls: list[tuple[int, int, float]] = []
    sc: list[tuple[int, int, float]] = []
    for ln in fabric.links:
        da, db = dev_of[ln.a], dev_of[ln.b]
        cls = link_class(role[da], role[db])
        lo, hi = (da, db) if TIER_OF_ROLE[role[da]] <= TIER_OF_ROLE[role[db]] else (db, da)
        if cls == "host-leaf":
            hl.append((nic_of[lo], idx["leaf"][hi], ln.capacity_gbps))
        elif cls == "leaf-spine":
            ls.append((idx["leaf"][lo], idx["spine"][hi], ln.capacity_gbps))
        elif cls == "spine-core":
            sc.append((idx["spine"][lo], idx["core"][hi], ln.capacity_gbps))
    n_nic, n_leaf = len(nics), len(idx["leaf"])
    n_spine, n_core = len(idx["spine"]), len(idx["core"])
    rows: dict[str, BlastRow] = {}
    if fabric.gpu_count:
        rows["gpu"] = BlastRow("gpu", fabric.gpu_count, 1.0, 0.0, 0.0, "none")
    if n_nic:
        rows["nic"] = BlastRow("nic", n_nic, float(w.sum()) / n_nic, 0.0, 0.0, "none")
    hn, hleaf, hcap = _cols(hl)
    nic_cap = np.bincount(hn, weights=hcap, minlength=n_nic)
    share = hcap / np.where(nic_cap[hn] > 0, nic_cap[hn], 1.0)  # per host-leaf link
    multi = _multi_homed_failover(fabric)
    if n_leaf:
        a = csr_matrix((share, (hn, hleaf)), shape=(n_nic, n_leaf))
        rows["leaf"] = _row("leaf", n_leaf, a, w, multi)
    if len(hl):
        per_link = csr_matrix((share, (hn, np.arange(len(hl)))), shape=(n_nic, len(hl)))
        rows["link:host-leaf"] = _row("link:host-leaf", len(hl), per_link, w, multi)
    if n_spine and ls:
        # Compress NICs by homing pattern (row of A): NICs with equal rows fare alike.
        a_sig, w_sig = _signatures(csr_matrix((share, (hn, hleaf)), shape=(n_nic, n_leaf)), w)
        lleaf, lsp, lcap = _cols(ls)
        up_leaf = np.bincount(lleaf, weights=lcap, minlength=n_leaf)
        f_frac = lcap / up_leaf[lleaf]
        f = csr_matrix((f_frac, (lleaf, lsp)), shape=(n_leaf, n_spine))
        rows["spine"] = _row("spine", n_spine, a_sig @ f, w_sig, "fast-reroute")
        if n_core and sc:
            sspine, score, scap = _cols(sc)
            up_spine = np.bincount(sspine, weights=scap, minlength=n_spine)
            g_frac = scap / up_spine[sspine]
            g = csr_matrix((g_frac, (sspine, score)), shape=(n_spine, n_core))
            rows["core"] = _row("core", n_core, a_sig @ (f @ g), w_sig, "fast-reroute")
        h_ls = csr_matrix((f_frac, (lleaf, np.arange(len(ls)))), shape=(n_leaf, len(ls)))
        rows["link:leaf-spine"] = _row("link:leaf-spine", len(ls), a_sig @ h_ls, w_sig,
                                       "fast-reroute")
        if sc:
            h_sc = csr_matrix((g_frac, (sspine, np.arange(len(sc)))), shape=(n_spine, len(sc)))
            rows["link:spine-core"] = _row("link:spine-core", len(sc), a_sig @ (f @ h_sc),
                                           w_sig, "fast-reroute")
    return tuple(rows[c] for c in COMPONENTS if c in rows)


def _cols(triples: Sequence[tuple[int, int, float]]) -> tuple[_I64, _I64, _F64]:
    if not triples:
        e = np.zeros(0, dtype=np.int64)
        return e, e.copy(), np.zeros(0, dtype=np.float64)
    arr = np.array(triples, dtype=np.float64)
    return arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2]


def _gpu_weights(fabric: Fabric) -> _F64:
    """GPUs behind each NIC (fabric.nics order)."""
    w = np.zeros(len(fabric.nics), dtype=np.float64)
    pos = {n.id: i for i, n in enumerate(fabric.nics)}
    for h in fabric.hosts:
        mine = fabric.nics_of_host.get(h.id, ())
        tagged = [n for n in mine if n.gpu is not None and n.gpu < h.gpus]
        for n in tagged:
            w[pos[n.id]] = 1.0
        rest = [n for n in mine if n not in tagged]
        left = h.gpus - len({n.gpu for n in tagged})
        if rest and left > 0:
            for n in rest:
                w[pos[n.id]] = left / len(rest)
    return w


def _multi_homed_failover(fabric: Fabric) -> Failover:
    """How a multi-homed NIC keeps its other ports: separate planes or two ToRs of one."""
    planes = fabric.meta.get("planes")
    if isinstance(planes, int) and planes > 1:
        return "multi-plane"
    homes = fabric.meta.get("homes")
    if isinstance(homes, int) and homes > 1:
        return "dual-tor"
    for leaves in fabric.leaves_of_nic.values():
        if len(leaves) > 1:
            seen = {fabric.devices[x].plane for x in leaves}
            return "multi-plane" if len(seen) > 1 and None not in seen else "dual-tor"
    return "dual-tor"


def _signatures(a: csr_matrix, w: _F64) -> tuple[csr_matrix, _F64]:
    """Distinct rows of ``a`` and the summed weight of the NICs having each one."""
    a = a.tocsr()
    a.sum_duplicates()
    a.sort_indices()
    keys: dict[tuple[tuple[int, ...], tuple[float, ...]], int] = {}
    ptr, ind, dat = a.indptr, a.indices, a.data
    rows_of: list[int] = []
    sig_w: list[float] = []
    for i in range(a.shape[0]):
        s, e = int(ptr[i]), int(ptr[i + 1])
        key = (tuple(ind[s:e].tolist()), tuple(dat[s:e].tolist()))
        j = keys.get(key)
        if j is None:
            j = keys[key] = len(rows_of)
            rows_of.append(i)
            sig_w.append(0.0)
        sig_w[j] += float(w[i])
    return a[np.array(rows_of, dtype=np.int64)], np.array(sig_w, dtype=np.float64)


def _row(component: str, count: int, loss: csr_matrix, w: _F64, failover: Failover) -> BlastRow:
    """Average over the ``count`` columns of ``loss`` (row = NIC or NIC pattern of weight
    ``w``; entry = the share of that NIC's capacity the column's failure removes)."""
    m = coo_matrix(loss)
    m.sum_duplicates()
    val = m.data
    wt = w[m.row]
    cut = val >= 1.0 - _EPS
    deg = ~cut & (val > _EPS)
    cut_t = float(wt[cut].sum())
    deg_t = float(wt[deg].sum())
    lost = float((wt[deg] * val[deg]).sum()) / deg_t if deg_t > 0 else 0.0
    return BlastRow(
        component=component, count=count, gpus_cut=cut_t / count, gpus_degraded=deg_t / count,
        bandwidth_lost=lost, failover=failover if deg_t > 0 else "none",
    )
