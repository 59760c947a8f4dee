"""Communication instances: the rows of one collective / send-recv call matched across ranks.

For every instance: when the last member arrived, the transfer time (first completion minus
last arrival: everyone is present, so this is the network's share), each member's wait
(last arrival minus its own arrival: the culprit of a late arrival waits least), and how the
transfer compares with its class (same op, group size and bytes) baseline.
Following Holmes (Yao et al., NSDI'25), arrival skew and transfer slowness are separated:
the first points at a rank's compute, the second at its network (NIC, link, switch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabricscope.straggler._dense import dense_codes
from fabricscope.straggler.iterations import MAD_TO_SIGMA
from fabricscope.straggler.table import COLLECTIVE, P2P, OpTable, p2p_key

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Instances:
    """Matched communication instances of a table (``rows`` index into the table).

    Per row (length = matched rows): ``rows``, ``inst`` (its instance), ``wait`` (ns).
    Per instance: ``first``/``count`` (slice of ``rows``), ``iteration``, ``cls`` (class id),
    ``last_start``, ``first_end``, ``transfer`` (ns), ``excess`` (transfer minus class
    baseline, ns), ``slow`` (bool), ``last_rank`` (the last to arrive), ``is_p2p``.
    """

    rows: I64
    inst: I64
    wait: I64
    first: I64
    count: I64
    iteration: I64
    cls: I64
    last_start: I64
    first_end: I64
    transfer: I64
    excess: F64
    slow: npt.NDArray[np.bool_]
    last_rank: I64
    is_p2p: npt.NDArray[np.bool_]
    class_names: tuple[str, ...]
    #: per instance: 2+ members and a transfer was seen (the first completion after the
    #: last arrival); only these are network evidence, slow or fast.
    observed: npt.NDArray[np.bool_] | None = None

    @property
    def n(self) -> int:
        return int(self.first.shape[0])


def _op_keys(table: OpTable) -> I64:
    """Op code per row where both ends of a send/recv share one code."""
    names = [p2p_key(n) for n in table.op_names]
    uniq = {n: i for i, n in enumerate(dict.fromkeys(names))}
    mapping = np.array([uniq[n] for n in names] or [0], dtype=np.int64)
    return mapping[table.op] if len(table) else np.zeros(0, dtype=np.int64)


def _size(nbytes: int) -> str:
    """Message size for humans (binary units, as NCCL's and PyTorch's logs print them)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            v = nbytes / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{nbytes} B"


def _combined_key(cols: list[I64]) -> I64 | None:
    """Pack non-negative integer columns into one int64 sort key (None if it would overflow)."""
    key = np.zeros(cols[0].shape[0], dtype=np.int64)
    bits = 0
    for c in cols:
        lo = int(c.min()) if c.size else 0
        hi = int(c.max()) if c.size else 0
        if lo < 0:
            return None
        width = max(hi, 1).bit_length()
        bits += width
        if bits > 62:
            return None
        key = (key << width) | c.astype(np.int64)
    return key


def match_instances(
    table: OpTable, *, k_sigma: float = 6.0, rel: float = 0.25, min_abs_ns: int = 20_000
) -> Instances:
    """Group communication rows into instances and judge each instance's transfer time.

    An instance is slow when its transfer exceeds its class's lower quartile by more than
    ``max(k_sigma * sigma, rel * q25, min_abs_ns)`` (sigma: MAD scale of the class's lower
    half), so noise and microsecond jitter on tiny messages are not called slow.
    """
    comm = np.flatnonzero((table.kind == COLLECTIVE) | (table.kind == P2P))
    opk = _op_keys(table)[comm]
    grp = table.group[comm].astype(np.int64)
    it = table.iteration[comm].astype(np.int64)
    seq = table.seq[comm]
    key = _combined_key([opk, grp, it, seq])
    if key is None:
        order = np.lexsort((seq, it, grp, opk))
        keys = np.stack([opk[order], grp[order], it[order], seq[order]])
        differs = np.any(keys[:, 1:] != keys[:, :-1], axis=0)
    else:
        # One int64 key sorts ~3x faster than a four-column lexsort (8k ranks: 4M rows).
        order = np.argsort(key, kind="stable")
        ks = key[order]
        differs = ks[1:] != ks[:-1]
    rows = comm[order]
    if rows.size:
        new = np.ones(rows.size, dtype=bool)
        new[1:] = differs
        first = np.flatnonzero(new).astype(np.int64)
    else:
        first = np.zeros(0, dtype=np.int64)
    count = np.diff(np.append(first, rows.size)).astype(np.int64)
    inst = np.repeat(np.arange(first.size, dtype=np.int64), count)
    start = table.start[rows]
    end = table.end[rows]
    if first.size:
        last_start = np.maximum.reduceat(start, first)
        first_end = np.minimum.reduceat(end, first)
        # Row of the last arrival in each instance.
        is_last = start == last_start[inst]
        last_row = np.full(first.size, -1, dtype=np.int64)
        last_row[inst[is_last]] = rows[is_last]
        last_rank = table.rank[last_row].astype(np.int64)
    else:
        last_start = first_end = last_rank = np.zeros(0, dtype=np.int64)
    transfer = np.maximum(first_end - last_start, 0)
    wait = (last_start[inst] - start).astype(np.int64)
    # Only instances with two or more members tell anything about the network, and only when
    # the transfer was seen: a member that finished before the last one arrived (an eager
    # send whose receiver posted after the data landed) leaves no transfer time to judge.
    multi = (count >= 2) & (first_end > last_start)
    gsize = np.array([len(g) for g in table.groups] or [0], dtype=np.int64)
    op0 = opk[order][first] if first.size else np.zeros(0, dtype=np.int64)
    g0 = gsize[table.group[rows[first]]] if first.size else np.zeros(0, dtype=np.int64)
    b0 = table.nbytes[rows[first]] if first.size else np.zeros(0, dtype=np.int64)
    # A send/recv is compared with the same hop of the other data-parallel replicas (same
    # stage pair): fused send/recv pairs stretch with the pipeline's shape (a heavier stage
    # makes its neighbours' transfers wait), which is workload, not wire.
    sig = np.zeros(first.size, dtype=np.int64)
    if first.size:
        known = table.stage >= 0
        by_rank = np.full(int(table.rank.max()) + 1, -1, dtype=np.int64)
        by_rank[table.rank[known]] = table.stage[known]
        rank_stage = {int(r): int(v) for r, v in enumerate(by_rank.tolist()) if v >= 0}
        sig_of: dict[tuple[int, ...], int] = {}
        g_sig = np.array([sig_of.setdefault(tuple(rank_stage.get(x, -1) for x in g), len(sig_of))
                          if len(g) == 2 else 0 for g in table.groups] or [0], dtype=np.int64)
        is_pp = table.kind[rows[first]] == P2P
        # A send fused with a recv in one call (Megatron's send_forward_recv_backward) ends
        # with both: its span includes the wait for the other transfer. Fused instances are
        # compared only with fused ones.
        fused = _fused_rows(table, rows)
        inst_fused = np.maximum.reduceat(fused.astype(np.int8), first).astype(np.int64)
        sig = np.where(is_pp, 2 * g_sig[table.group[rows[first]]] + inst_fused, 0)
    if first.size:
        dense = [dense_codes(c)[1] for c in (op0, g0, b0, sig)]
        ck = _combined_key(dense)
        assert ck is not None  # dense codes are small
        _, cls = dense_codes(ck)
    else:
        cls = np.zeros(0, dtype=np.int64)
    cls = np.asarray(cls, dtype=np.int64).reshape(-1)
    excess = np.zeros(first.size, dtype=np.float64)
    slow = np.zeros(first.size, dtype=bool)
    ncls = int(cls.max()) + 1 if cls.size else 0
    if ncls:
        o = np.argsort(cls, kind="stable")
        bounds = np.searchsorted(cls[o], np.arange(ncls + 1))
        tr = transfer.astype(np.float64)
        for c in range(ncls):
            idx = o[bounds[c]:bounds[c + 1]]
            idx = idx[multi[idx]]
            if idx.size == 0:
                continue
            vals = tr[idx]
            # Baseline: the lower quartile, with the spread of the lower half. In a small job a
            # slow NIC can touch half of a class's instances, which would drag a median.
            q25, q50 = np.percentile(vals, [25, 50])
            low = vals[vals <= q50]
            sigma = MAD_TO_SIGMA * float(np.median(np.abs(low - np.median(low))))
            limit = max(k_sigma * sigma, rel * float(q25), float(min_abs_ns))
            excess[idx] = vals - q25
            # A ratio against a baseline at the timing floor is no evidence: such a class
            # (waits and completions of a few microseconds) never calls a transfer slow.
            if q25 >= min_abs_ns:
                slow[idx] = vals - q25 > limit
    names_rev = [p2p_key(n) for n in table.op_names]
    uniq = list(dict.fromkeys(names_rev))
    cls_names: list[str] = [""] * ncls
    if ncls:
        _, first_of_cls = np.unique(cls, return_index=True)
        for c_id, k in enumerate(first_of_cls.tolist()):
            size = f", {_size(int(b0[k]))}" if int(b0[k]) > 0 else ""  # 0: size not traced
            cls_names[c_id] = f"{uniq[int(op0[k])]}[{int(g0[k])} ranks{size}]"
    is_p2p = table.kind[rows[first]] == P2P if first.size else np.zeros(0, dtype=bool)
    return Instances(rows.astype(np.int64), inst, wait, first, count, it[order][first] if first.size
                     else first, cls, last_start, first_end, transfer, excess, slow & multi,
                     last_rank, is_p2p, tuple(cls_names), multi)


def _fused_rows(table: OpTable, rows: I64, eps_ns: int = 2_000) -> npt.NDArray[np.bool_]:
    """Communication rows that share their span with another one on the same rank (a fused call)."""
    if rows.size < 2:
        return np.zeros(rows.size, dtype=bool)
    st = table.start[rows]
    span = int(st.max()) - int(st.min()) + 1
    lane = table.rank[rows].astype(np.int64) * (int(table.iteration[rows].max()) + 1) \
        + table.iteration[rows]
    if int(lane.max()) + 1 < (1 << 62) // max(span, 1) and int(table.iteration[rows].min()) >= 0:
        o = np.argsort(lane * span + (st - int(st.min())), kind="stable")
    else:
        o = np.lexsort((st, table.iteration[rows], table.rank[rows]))
    r, it = table.rank[rows][o], table.iteration[rows][o]
    s, e = table.start[rows][o], table.end[rows][o]
    same = ((r[1:] == r[:-1]) & (it[1:] == it[:-1]) & (np.abs(s[1:] - s[:-1]) <= eps_ns)
            & (np.abs(e[1:] - e[:-1]) <= eps_ns))
    f = np.zeros(rows.size, dtype=bool)
    f[:-1] |= same
    f[1:] |= same
    out = np.zeros(rows.size, dtype=bool)
    out[o] = f
    return out


def clock_offsets(table: OpTable, inst: Instances, *, tol_ns: int = 200_000) -> dict[int, int]:
    """Per-rank clock offset estimated from collective completions (which are simultaneous).

    For each row: its end minus the instance's median end; a rank's offset is the median of
    those. Ranks whose offset exceeds ``tol_ns`` (and 5x the typical spread) are returned.
    Needs instances with 3+ members to outvote a shifted rank.
    """
    if inst.rows.size == 0:
        return {}
    end = table.end[inst.rows]
    big = inst.count[inst.inst] >= 3
    if not big.any():
        return {}
    # Median end per instance via sort within instance (one packed key: instance, then the
    # end relative to the instance's first completion, clipped to ~1 s).
    rel_end = np.clip(end - inst.first_end[inst.inst], 0, (1 << 30) - 1)
    if inst.n < (1 << 32):
        o = np.argsort((inst.inst << 30) | rel_end, kind="stable")
    else:
        o = np.lexsort((end, inst.inst))
    pos_in = np.arange(o.size) - inst.first[inst.inst[o]]
    mid = inst.count[inst.inst[o]] // 2
    med_end = np.zeros(inst.n, dtype=np.int64)
    sel = pos_in == mid
    med_end[inst.inst[o][sel]] = end[o][sel]
    d = (end - med_end[inst.inst]).astype(np.float64)
    rk = table.rank[inst.rows]
    d, rk = d[big], rk[big]
    spread = float(np.median(np.abs(d))) if d.size else 0.0
    out: dict[int, int] = {}
    o2 = np.argsort(rk, kind="stable")
    rks, starts = np.unique(rk[o2], return_index=True)
    bounds = np.append(starts, rk.size)
    for j, r in enumerate(rks.tolist()):
        off = float(np.median(d[o2[bounds[j]:bounds[j + 1]]]))
        if abs(off) > max(tol_ns, 5 * spread):
            out[int(r)] = round(off)
    return out
