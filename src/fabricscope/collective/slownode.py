"""Slow-node search: adaptive rounds of disjoint nccl-tests runs that localize slow nodes or links.

Pure planning and analysis (no simulator, no I/O besides the small readers at the end).

Method. A test on a set of nodes (``sendrecv_perf`` / ``all_reduce_perf`` on 2 nodes, or
``all_reduce_perf`` on ``k``) is *positive* when its bus bandwidth is low: a ring collective
runs at the pace of its slowest hop, so one slow NIC bounds the whole set. Finding the
positive items is then adaptive group testing (Dorfman 1943; Hwang, "A method for detecting
all defective members in a population by group testing", JASA 67(339), 1972, the
*generalized binary splitting* algorithm). We run it round-parallel:

1. **screen**: the nodes cut into disjoint groups (``pair`` scheme: pairs; ``group``
   scheme: groups of ``2**a`` nodes, ``a = floor(log2((n - d + 1) / d))`` from Hwang for
   ``d`` expected slow nodes, capped so that the round has at least ``min_groups`` tests);
   all groups run at once.
2. **split**: every positive group of two or more nodes is halved and both halves are tested
   in the next round (in parallel, so two slow nodes cost no extra rounds unless they share
   a half); a half of one node is tested with a known-good partner (``partner``).
3. **confirm**: a node slow with one good partner is tested with a second, different good
   partner (the free good node nearest it in the node list). A node is *slow* when it is
   slow with every partner; slow with one and fine with another is a pair-specific deficit
   (a link or path): that pair is run once more and reported as such if slow again,
   *transient* if not.
4. **retest**: a positive group whose halves are both fine is run again once; positive again
   is reported *ambiguous* (the deficit needs both halves together: a path between them, or
   noise), fine again is *transient*.

Rounds: ``2 + log2(group)`` (screen, ``log2(group)`` halvings the last of which pairs each
suspect with a good partner, confirm): 8 for 512 nodes in groups of 64, 3 for the pair
scheme. Slow nodes in different halves are found in the same rounds (the halves run in
parallel); a pair-specific deficit or a contradiction costs one retest round.

Thresholding (robust, per search): the reference bus bandwidth is the median of the *healthy*
screen tests (or a given expected value): slowness is one-sided, so we start from the
fastest screen test, keep the tests within ``margin`` of it and re-centre on their median;
the noise ``sigma`` is 1.4826 x the median absolute deviation of their ratios (Hampel's MAD
estimator); a test is positive when its ratio to the reference is below ``1 - margin`` with
``margin = max(min_drop, z * sigma)``. This holds while the fast tests are the healthy ones
(a test cannot run faster than a healthy fabric allows); the verdict notes when half or more
of the screen tests are slow.

Assumption: at the chosen message size a healthy test's busbw does not depend on how many
nodes it spans (true for ring all-reduce at large sizes, where busbw tends to the per-GPU
network rate; NCCL tests' PERFORMANCE.md). When it does, pass ``expected_busbw_gbs``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fabricscope.model.errors import ConfigError, TraceFormatError
from fabricscope.model.records import Finding

Scheme = Literal["pair", "group"]
TestKind = Literal["sendrecv_perf", "all_reduce_perf"]
Purpose = Literal["screen", "split", "partner", "confirm", "retest"]
SCHEMES: tuple[str, ...] = ("pair", "group")
TEST_KINDS: tuple[str, ...] = ("sendrecv_perf", "all_reduce_perf")
LAUNCHERS: tuple[str, ...] = ("mpirun", "srun")


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """Options of a search; see the module docstring for what each threshold means."""

    scheme: Scheme = "pair"
    kind: TestKind = "all_reduce_perf"
    group_size: int = 2
    min_drop: float = 0.07
    z: float = 4.0
    expected_busbw_gbs: float | None = None
    confirmations: int = 2
    retests: int = 1


@dataclass(frozen=True, slots=True)
class PlannedTest:
    """One nccl-tests run: ``nodes`` = ``unit`` (the suspects) plus a good partner, if any."""

    test_id: str
    nodes: tuple[str, ...]
    unit: tuple[str, ...]
    purpose: Purpose
    kind: TestKind


@dataclass(frozen=True, slots=True)
class Round:
    """Disjoint tests that run at the same time."""

    index: int
    tests: tuple[PlannedTest, ...]


@dataclass(frozen=True, slots=True)
class SearchState:
    """Everything a search knows: nodes, options, the rounds run and their busbw (GB/s)."""

    nodes: tuple[str, ...]
    config: SearchConfig
    rounds: tuple[Round, ...] = ()
    results: tuple[Mapping[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """A node slow with every partner it was tested with."""

    node: str
    ratio: float  # median busbw / reference over its tests
    score: float
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PairVerdict:
    """Two nodes slow together but each fine with others: a link / path between them."""

    a: str
    b: str
    ratio: float
    score: float
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    """What a search concluded so far."""

    slow_nodes: tuple[NodeVerdict, ...]
    slow_pairs: tuple[PairVerdict, ...]
    ambiguous: tuple[tuple[str, ...], ...]
    transient: tuple[tuple[str, ...], ...]
    pending: tuple[tuple[str, ...], ...]
    rounds: int
    tests: int
    reference_gbs: float
    sigma: float
    margin: float
    notes: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        return not self.pending

    @property
    def localized(self) -> tuple[str, ...]:
        return tuple(v.node for v in self.slow_nodes)

    def to_json(self) -> dict[str, Any]:
        return {
            "done": self.done, "rounds": self.rounds, "tests": self.tests,
            "reference_gbs": self.reference_gbs, "sigma": self.sigma, "margin": self.margin,
            "slow_nodes": [{"node": v.node, "ratio": v.ratio, "score": v.score,
                            "evidence": list(v.evidence)} for v in self.slow_nodes],
            "slow_pairs": [{"a": p.a, "b": p.b, "ratio": p.ratio, "score": p.score,
                            "evidence": list(p.evidence)} for p in self.slow_pairs],
            "ambiguous": [list(u) for u in self.ambiguous],
            "transient": [list(u) for u in self.transient],
            "pending": [list(u) for u in self.pending],
            "notes": list(self.notes),
        }

    def findings(self, *, window: tuple[int, int] = (0, 0)) -> list[Finding]:
        """``slow-node`` per slow node, ``slow-node-pair`` per pair-specific deficit."""
        out = [
            Finding("slow-node", v.node, v.score, window, v.evidence,
                    "drain the node; check its NICs (ibstat, link speed, PCIe width), GPUs and "
                    "their cables", {"busbw_ratio": v.ratio})
            for v in self.slow_nodes
        ]
        out += [
            Finding("slow-node-pair", p.a, p.score, window, p.evidence,
                    f"check the path between {p.a} and {p.b} (their leaf uplinks, ECMP "
                    "collisions, a lossy cable) with a traceroute-level probe",
                    {"peer": p.b, "busbw_ratio": p.ratio})
            for p in self.slow_pairs
        ]
        return out


# ------------------------------------------------------------------ starting a search
def new_search(
    nodes: Sequence[str] | int,
    *,
    scheme: str = "pair",
    kind: str | None = None,
    group_size: int | None = None,
    expected_slow: int = 1,
    max_group: int = 64,
    min_groups: int = 8,
    min_drop: float = 0.07,
    z: float = 4.0,
    expected_busbw_gbs: float | None = None,
    confirmations: int = 2,
) -> SearchState:
    """A new search over ``nodes`` (hostnames, or a count: ``node000``...).

    ``group_size`` defaults to 2 for the pair scheme and, for the group scheme, to Hwang's
    ``2**floor(log2((n - d + 1) / d))`` for ``d = expected_slow``, capped at ``max_group``
    and at ``n / min_groups`` (the screen median needs several tests).
    """
    names = (tuple(f"node{i:03d}" for i in range(nodes)) if isinstance(nodes, int)
             else tuple(nodes))
    if len(names) < 3:
        raise ConfigError(f"slow-node: nodes: need at least 3 (a good partner), got {len(names)}")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"slow-node: nodes: {dup!r} is listed twice")
    if scheme not in SCHEMES:
        raise ConfigError(f"slow-node: scheme: unknown {scheme!r} (choose pair or group)")
    k = kind or "all_reduce_perf"
    if k not in TEST_KINDS:
        raise ConfigError(f"slow-node: kind: unknown {k!r} (choose {', '.join(TEST_KINDS)})")
    if scheme == "group" and k != "all_reduce_perf":
        raise ConfigError(f"slow-node: kind: the group scheme runs all_reduce_perf, not {k!r}")
    if not 0 < min_drop < 1:
        raise ConfigError(f"slow-node: min_drop: must be in (0, 1), got {min_drop!r}")
    if expected_slow < 1:
        raise ConfigError(f"slow-node: expected_slow: must be >= 1, got {expected_slow}")
    if confirmations < 1:
        raise ConfigError(f"slow-node: confirmations: must be >= 1, got {confirmations}")
    if expected_busbw_gbs is not None and not expected_busbw_gbs > 0:
        raise ConfigError(f"slow-node: expected_busbw_gbs: must be > 0, got {expected_busbw_gbs!r}")
    n = len(names)
    if group_size is None:
        if scheme == "pair":
            g = 2
        else:
            a = max(1, math.floor(math.log2(max(1.0, (n - expected_slow + 1) / expected_slow))))
            g = max(2, min(2**a, max_group, n // max(1, min_groups)))
    else:
        g = group_size
    if g < 2 or (scheme == "pair" and g != 2) or g > n:
        raise ConfigError(f"slow-node: group_size: {g} is not valid for the {scheme} scheme "
                          f"on {n} nodes (pair: 2; group: 2..{n})")
    cfg = SearchConfig(scheme="pair" if scheme == "pair" else "group",
                       kind="sendrecv_perf" if k == "sendrecv_perf" else "all_reduce_perf",
                       group_size=g, min_drop=min_drop, z=z,
                       expected_busbw_gbs=expected_busbw_gbs, confirmations=confirmations)
    return SearchState(names, cfg)


def record(state: SearchState, rnd: Round, results: Mapping[str, float]) -> SearchState:
    """``state`` with round ``rnd`` and its measured busbw (GB/s per test id) appended."""
    if rnd.index != len(state.rounds):
        raise ConfigError(f"slow-node: round {rnd.index}: expected round {len(state.rounds)}")
    got: dict[str, float] = {}
    for t in rnd.tests:
        if t.test_id not in results:
            raise ConfigError(f"slow-node: round {rnd.index}: no result for test {t.test_id}")
        v = float(results[t.test_id])
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"slow-node: test {t.test_id}: busbw {results[t.test_id]!r} "
                              "is not a number >= 0")
        got[t.test_id] = v
    return SearchState(state.nodes, state.config, (*state.rounds, rnd), (*state.results, got))


# ------------------------------------------------------------------ derivation
@dataclass
class _Unit:
    members: tuple[str, ...]
    outcomes: list[tuple[bool, float, str, tuple[str, ...]]] = field(default_factory=list)
    # (positive, ratio, test id, partner nodes)


@dataclass
class _Derived:
    ref: float
    sigma: float
    margin: float
    good: list[str]
    slow: list[NodeVerdict]
    pairs: list[PairVerdict]
    ambiguous: list[tuple[str, ...]]
    transient: list[tuple[str, ...]]
    todo: list[tuple[tuple[str, ...], Purpose, str | None]]  # (unit, purpose, partner)
    notes: list[str]


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _reference(state: SearchState) -> tuple[float, float, float, list[str]]:
    cfg = state.config
    notes: list[str] = []
    screen = [v for v in state.results[0].values()] if state.results else []
    if not screen and cfg.expected_busbw_gbs is None:
        return math.nan, math.nan, math.nan, notes
    if screen and not max(screen) > 0:
        raise ConfigError("slow-node: the screen round measured nothing (every test at 0 GB/s)")
    # Slowness is one-sided: start from the fastest test, keep the tests within the margin of
    # it, and re-centre on their median (twice): a minority of slow screen tests then never
    # drags the reference down, even with 4 groups of which 2 are slow.
    ref = max(screen) if screen else float(cfg.expected_busbw_gbs or 0)
    sigma = 0.02
    for _ in range(3):
        margin = max(cfg.min_drop, cfg.z * sigma)
        healthy = [v for v in screen if v >= ref * (1 - margin)]
        if cfg.expected_busbw_gbs is None:
            ref = statistics.median(healthy)
        if len(healthy) >= 3:
            ratios = [v / ref for v in healthy]
            med = statistics.median(ratios)
            sigma = 1.4826 * statistics.median(abs(r - med) for r in ratios)
    if len(screen) < 3:
        notes.append(f"only {len(screen)} screen tests: noise assumed 2%")
    if cfg.expected_busbw_gbs is not None:
        ref = cfg.expected_busbw_gbs
    margin = max(cfg.min_drop, cfg.z * sigma)
    if margin >= 0.5:
        notes.append(f"screen noise {sigma:.1%} is large: only drops over {margin:.0%} are seen")
    slow_share = sum(v / ref < 1 - margin for v in screen) / max(1, len(screen))
    if slow_share >= 0.5 and cfg.expected_busbw_gbs is None:
        notes.append(f"{slow_share:.0%} of the screen tests are slow: the fastest tests may "
                     "not be the healthy level; pass expected_busbw_gbs")
    return ref, sigma, margin, notes


def _halves(members: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    h = (len(members) + 1) // 2
    return members[:h], members[h:]


def _derive(state: SearchState) -> _Derived:
    cfg = state.config
    ref, sigma, margin, notes = _reference(state)
    units: dict[tuple[str, ...], _Unit] = {}
    order: list[tuple[str, ...]] = []
    good: dict[str, None] = {}
    for rnd, res in zip(state.rounds, state.results, strict=True):
        for t in rnd.tests:
            ratio = res[t.test_id] / ref
            pos = ratio < 1 - margin
            if t.unit not in units:
                units[t.unit] = _Unit(t.unit)
                order.append(t.unit)
            partners = tuple(x for x in t.nodes if x not in t.unit)
            units[t.unit].outcomes.append((pos, ratio, t.test_id, partners))
            if not pos:
                for x in t.nodes:
                    good.setdefault(x)
    d = _Derived(ref, sigma, margin, [], [], [], [], [], [], notes)
    eff_sigma = max(sigma, 0.005) if math.isfinite(sigma) else 0.02

    def score(ratio: float) -> float:
        # probability that the drop is real (beyond half the margin) given the noise
        return round(_normal_cdf(((1 - ratio) - margin / 2) / eff_sigma), 4)

    slow_set: set[str] = set()
    for key in order:
        u = units[key]
        last_pos = u.outcomes[-1][0]
        if len(key) == 1:
            x = key[0]
            by_partner: dict[str, list[tuple[bool, float, str, tuple[str, ...]]]] = {}
            for o in u.outcomes:
                by_partner.setdefault(",".join(o[3]), []).append(o)
            slow_p = [p for p, os in by_partner.items() if all(o[0] for o in os)]
            fine_p = [p for p, os in by_partner.items() if not any(o[0] for o in os)]
            for p in by_partner:
                if p not in slow_p and p not in fine_p:
                    d.transient.append((x, p))  # slow once with p, fine on the retest
            if not slow_p:
                continue
            if fine_p:
                # slow with some partners, fine with others: pair-specific once retested
                for p in slow_p:
                    os = by_partner[p]
                    if len(os) < 1 + cfg.retests:
                        d.todo.append((key, "retest", p))
                        continue
                    fine = by_partner[fine_p[0]][-1]
                    d.pairs.append(PairVerdict(
                        x, p, statistics.median(o[1] for o in os),
                        min(score(o[1]) for o in os),
                        (*(f"{o[2]}: {x}+{p} at {o[1]:.0%}" for o in os),
                         f"{fine[2]}: {x}+{fine_p[0]} fine at {fine[1]:.0%}")))
            elif len(slow_p) >= cfg.confirmations:
                slow_with = [by_partner[p][-1] for p in slow_p]
                r = statistics.median(o[1] for o in slow_with)
                ev = tuple(f"{o[2]}: {x}+{','.join(o[3])} at {o[1]:.0%} of {ref:.1f} GB/s"
                           for o in slow_with)
                d.slow.append(NodeVerdict(x, r, min(score(o[1]) for o in slow_with), ev))
                slow_set.add(x)
            else:
                d.todo.append((key, "confirm", None))
            continue
        if not any(o[0] for o in u.outcomes):
            continue
        kids = _halves(key)
        tested = [k in units for k in kids]
        if not all(tested):
            if last_pos:
                d.todo.extend((k, "partner" if len(k) == 1 else "split", None)
                              for k, done in zip(kids, tested, strict=True) if not done)
            continue
        kid_pos = [any(o[0] for o in units[k].outcomes) for k in kids]
        if any(kid_pos):
            continue
        retests = len(u.outcomes) - 1
        if not last_pos:
            d.transient.append(key)
        elif retests < cfg.retests:
            d.todo.append((key, "retest", None))
        elif len(key) == 2:
            o = u.outcomes[-1]
            d.pairs.append(PairVerdict(key[0], key[1], o[1], score(o[1]),
                                       tuple(f"{oo[2]}: {'+'.join(key)} at {oo[1]:.0%}"
                                             for oo in u.outcomes)
                                       + tuple(f"{units[k].outcomes[-1][2]}: {k[0]} fine"
                                               for k in kids)))
        else:
            d.ambiguous.append(key)
    d.good = [x for x in state.nodes if x in good and x not in slow_set]
    return d


# ------------------------------------------------------------------ planning
def plan(state: SearchState) -> Round | None:
    """The next round given the results so far, or None when nothing is left to test.

    Tests in a round are disjoint (no node in two tests), so they run at the same time. A
    one-node suspect needs a known-good partner that is not busy in the round; when every
    good node is taken it waits for the next round.
    """
    cfg = state.config
    idx = len(state.rounds)
    if idx == 0:
        g = cfg.group_size
        nodes = state.nodes
        groups = [nodes[i:i + g] for i in range(0, len(nodes), g)]
        if len(groups) > 1 and len(groups[-1]) < 2:
            groups[-2] = groups[-2] + groups[-1]
            groups.pop()
        return Round(0, tuple(_test(0, i, grp, grp, "screen", cfg) for i, grp in enumerate(groups)))
    d = _derive(state)
    busy: set[str] = set()
    tests: list[PlannedTest] = []
    used_partner: dict[str, set[str]] = {}
    for rnd in state.rounds:
        for t in rnd.tests:
            if len(t.unit) == 1:
                used_partner.setdefault(t.unit[0], set()).update(x for x in t.nodes
                                                                 if x not in t.unit)
    # A partner is the free good node nearest the suspect in the node list: hostnames
    # listed in rack order make that a node of the same rack / leaf, so the partner test
    # does not cross spines, where concurrent tests would collide on ECMP paths.
    pos = {x: i for i, x in enumerate(state.nodes)}
    for unit, purpose, fixed in d.todo:
        if busy.intersection(unit):
            continue
        if len(unit) >= 2:
            tests.append(_test(idx, len(tests), unit, unit, purpose, cfg))
            busy.update(unit)
            continue
        x = unit[0]
        if fixed is not None:
            partner: str | None = fixed if fixed not in busy else None
        else:
            before = used_partner.get(x, set())
            free = [g for g in d.good if g not in busy and g != x and g not in before]
            partner = min(free, key=lambda g: (abs(pos[g] - pos[x]), pos[g]), default=None)
        if partner is None:
            continue
        tests.append(_test(idx, len(tests), (x, partner), unit, purpose, cfg))
        busy.update((x, partner))
    if not tests:
        return None
    return Round(idx, tuple(tests))


def _test(r: int, i: int, nodes: Sequence[str], unit: Sequence[str], purpose: Purpose,
          cfg: SearchConfig) -> PlannedTest:
    kind: TestKind = cfg.kind if len(nodes) == 2 else "all_reduce_perf"
    return PlannedTest(f"r{r:02d}-t{i:03d}", tuple(nodes), tuple(unit), purpose, kind)


def analyze(state: SearchState) -> Verdict:
    """Which nodes are slow (with a score), which pairs have a path deficit, what is ambiguous.

    ``pending`` lists what the next round would test: the verdict is final only when it is
    empty. Raises :class:`ConfigError` when no round has results (no data is not "no slow
    node").
    """
    if not state.results:
        raise ConfigError("slow-node: analyze: no round has results yet (run the screen round)")
    d = _derive(state)
    nxt = plan(state)
    pending = tuple(t.unit for t in nxt.tests) if nxt is not None else ()
    blocked = [u for u, _, _ in d.todo if u not in pending]
    notes = list(d.notes)
    if nxt is None and blocked:
        notes.append(f"{len(blocked)} suspects wait for a good partner and none is free")
        pending = tuple(blocked)
    return Verdict(
        slow_nodes=tuple(d.slow), slow_pairs=tuple(d.pairs), ambiguous=tuple(d.ambiguous),
        transient=tuple(d.transient), pending=pending, rounds=len(state.rounds),
        tests=sum(len(r.tests) for r in state.rounds), reference_gbs=d.ref, sigma=d.sigma,
        margin=d.margin, notes=tuple(notes),
    )


# ------------------------------------------------------------------ commands
def round_script(
    rnd: Round,
    *,
    launcher: str = "mpirun",
    gpus_per_node: int = 8,
    bin_dir: str = "",
    test_args: str = "-b 256M -e 1G -f 2",
    out_dir: str = "slownode-out",
) -> str:
    """A shell script that runs a round's tests in parallel, one output file per test.

    ``mpirun`` lines follow Open MPI's ``-np N -H host:slots`` (one process per node driving
    ``-g gpus_per_node`` GPUs, nccl-tests README); ``srun`` lines Slurm's ``-N``/``-w``
    (``--ntasks-per-node=1``). Outputs go to ``OUT_DIR/<test id>.txt``, the names
    :func:`read_round_results` reads back.
    """
    if launcher not in LAUNCHERS:
        raise ConfigError(f"slow-node: launcher: unknown {launcher!r} (choose mpirun or srun)")
    if gpus_per_node < 1:
        raise ConfigError(f"slow-node: gpus_per_node: must be >= 1, got {gpus_per_node}")
    prefix = bin_dir.rstrip("/") + "/" if bin_dir else ""
    lines = ["#!/bin/sh", f"# slow-node search round {rnd.index}: {len(rnd.tests)} tests in parallel",
             f"mkdir -p {out_dir}"]
    for t in rnd.tests:
        k = len(t.nodes)
        exe = f"{prefix}{t.kind} {test_args} -g {gpus_per_node}"
        if launcher == "mpirun":
            hosts = ",".join(f"{h}:1" for h in t.nodes)
            cmd = f"mpirun -np {k} -H {hosts} {exe}"
        else:
            cmd = f"srun -N{k} -w {','.join(t.nodes)} --ntasks-per-node=1 {exe}"
        lines.append(f"{cmd} > {out_dir}/{t.test_id}.txt 2>&1 &  # {t.purpose} {' '.join(t.unit)}")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def parse_avg_busbw(text: str, *, source: str) -> float:
    """The average bus bandwidth (GB/s) of one nccl-tests output, read by the full reader.

    The last run of the output that has a size table (``fabricscope.collective.nccl_tests``: any
    collective, ``mpirun --tag-output`` prefixes, NCCL INFO / WARN lines mixed in); its own
    ``# Avg bus bandwidth`` line (an output of only that line is read too). A run that failed, printed no table, was cut before that line or
    reported wrong values raises ``TraceFormatError`` naming the file: such a test has no bandwidth to compare, and its nodes need a look of their own.
    """
    from fabricscope.collective.nccl_tests import parse_nccl_tests

    runs = parse_nccl_tests(text, source=source)
    # the last run with a table; else one with only the summary line (what `slow-node twin`
    # writes, or an excerpt kept by a job script)
    run = next((r for r in reversed(runs) if r.rows), None) or next(
        (r for r in reversed(runs) if r.avg_busbw_file is not None and not r.errors), None)
    if run is None:
        why = next((e for r in runs for e in r.errors), "no size table")
        raise TraceFormatError(f"{source}: no bus bandwidth: {why} (did the test finish?)")
    if run.truncated or run.avg_busbw_file is None:
        raise TraceFormatError(f"{source}: the output ends before the run's '# Avg bus bandwidth' line "
                               "(truncated: did the test finish?)")
    if run.out_of_bounds:
        raise TraceFormatError(f"{source}: {run.out_of_bounds} out-of-bounds values: the test's results are "
                               "wrong (data corruption on one of its nodes or links), not slow")
    v = run.avg_busbw
    if v is None or not (math.isfinite(v) and v >= 0):
        raise TraceFormatError(f"{source}: no valid bus bandwidth (average {v!r})")
    return float(v)


def read_round_results(rnd: Round, out_dir: str | Path) -> dict[str, float]:
    """Read ``OUT_DIR/<test id>.txt`` for every test of ``rnd``."""
    base = Path(out_dir)
    out: dict[str, float] = {}
    for t in rnd.tests:
        p = base / f"{t.test_id}.txt"
        if not p.is_file():
            raise TraceFormatError(f"{p}: missing: test {t.test_id} of round {rnd.index} "
                                   f"({' '.join(t.nodes)}) has no output")
        out[t.test_id] = parse_avg_busbw(p.read_text(errors="replace"), source=str(p))
    return out


# ------------------------------------------------------------------ persistence
def state_to_json(state: SearchState, *, pending: Round | None = None) -> dict[str, Any]:
    """A JSON-able form of ``state`` plus the planned round not yet run (``pending``)."""
    c = state.config
    rounds: list[dict[str, Any]] = [
        {"index": r.index, "tests": _tests_json(r), "results": dict(res)}
        for r, res in zip(state.rounds, state.results, strict=True)
    ]
    if pending is not None:
        rounds.append({"index": pending.index, "tests": _tests_json(pending), "results": None})
    return {
        "version": 1, "nodes": list(state.nodes),
        "config": {"scheme": c.scheme, "kind": c.kind, "group_size": c.group_size,
                   "min_drop": c.min_drop, "z": c.z, "expected_busbw_gbs": c.expected_busbw_gbs,
                   "confirmations": c.confirmations, "retests": c.retests},
        "rounds": rounds,
    }


def _tests_json(r: Round) -> list[dict[str, Any]]:
    return [{"id": t.test_id, "nodes": list(t.nodes), "unit": list(t.unit),
             "purpose": t.purpose, "kind": t.kind} for t in r.tests]


def state_from_json(data: Any, *, source: str) -> tuple[SearchState, Round | None]:
    """Inverse of :func:`state_to_json`: the state and its pending round (None if none).

    Bad content raises :class:`TraceFormatError` naming ``source`` and the field.
    """
    where = "config"
    try:
        c = data["config"]
        if c["scheme"] not in SCHEMES or c["kind"] not in TEST_KINDS:
            raise ValueError(f"scheme/kind {c['scheme']!r}/{c['kind']!r}")
        cfg = SearchConfig(scheme=c["scheme"], kind=c["kind"], group_size=int(c["group_size"]),
                           min_drop=float(c["min_drop"]), z=float(c["z"]),
                           expected_busbw_gbs=(None if c["expected_busbw_gbs"] is None
                                               else float(c["expected_busbw_gbs"])),
                           confirmations=int(c["confirmations"]), retests=int(c["retests"]))
        where = "nodes"
        state = SearchState(tuple(str(n) for n in data["nodes"]), cfg)
        pending: Round | None = None
        for i, r in enumerate(data["rounds"]):
            where = f"rounds[{i}]"
            if pending is not None:
                raise ValueError("a round after a round without results")
            rnd = Round(int(r["index"]), tuple(
                PlannedTest(str(t["id"]), tuple(str(x) for x in t["nodes"]),
                            tuple(str(x) for x in t["unit"]), t["purpose"], t["kind"])
                for t in r["tests"]))
            if r.get("results") is None:
                pending = rnd
                continue
            state = record(state, rnd, {str(k): float(v) for k, v in r["results"].items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"{source}: {where}: not a slow-node search state "
                               f"({type(exc).__name__}: {exc})") from None
    except ConfigError as exc:
        raise TraceFormatError(f"{source}: {where}: {exc}") from None
    return state, pending
