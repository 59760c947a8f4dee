"""The knowledge base (schema, packaged entries, user overrides) and the case base."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fabricscope.diagnosis.cases import (
    Case,
    CaseBase,
    case_from_incident,
    dump_case,
    load_case_base,
    load_cases,
    parse_case,
    save_case,
    seed_cases,
    signature_of,
    similarity,
)
from fabricscope.diagnosis.knowledge import (
    EMITTED,
    FAMILIES,
    KnowledgeBase,
    cable_of,
    load_kb,
    packaged_docs,
    parse_kb,
    relation,
)
from fabricscope.diagnosis.model import Incident, Observed, RootCause
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.sim.faults import FAULT_KINDS

REQUIRED = [
    "gray-link", "link-flap", "link-down", "optic-aging", "dirty-connector", "fiber-damage",
    "thermal", "pfc-storm", "pfc-deadlock", "incast-congestion", "micro-burst", "congestion",
    "ecmp-polarization", "switch-fault", "nic-fault", "nic-firmware-hang", "slow-nic",
    "slow-gpu", "cpu-starved-host", "mtu-mismatch", "pfc-priority-mismatch", "ecn-disabled",
    "config-drift", "link-degraded",
    # the integrator table, OPERATIONS.md section 4
    "pfc-static-buffer", "tcp-timewait-exhaustion", "grpc-flow-control-stall", "numa-hugepages",
    "qos-not-applied",
]

VALID = """\
faults:
  - id: t-one
    title: "a test type"
    family: physical
    specialist: link
    resource: cable
    prior: 0.02
    symptoms:
      - {signal: probe, finding: gray-link, likelihood: 0.9, at: self, primary: true}
    checks:
      - {id: c1, source: telemetry, how: "ethtool -S IF", if_true: "yes", if_false: "no"}
    root_causes: ["a cause"]
    actions:
      - {action: "cost out", risk: low, reversible: true, automation: cost-out-link}
    references: ["a paper"]
"""


def _obs(source: str, kind: str, subject: str, t: int = 0, score: float = 0.9) -> Observed:
    return Observed(source, Finding(kind, subject, score, (t, t)), reported_ns=t)


# --------------------------------------------------------------------------- packaged KB

def test_every_packaged_entry_loads_and_required_types_exist() -> None:
    kb = load_kb()
    docs = packaged_docs()
    for fam in ("physical", "link", "congestion", "routing", "host", "job", "config"):
        assert f"{fam}.yaml" in docs
    missing = [t for t in REQUIRED if t not in kb]
    assert not missing
    for ft in kb:
        assert ft.origin in docs
        # a family file holds only its family (the integrator table mixes them)
        stem = ft.origin.removesuffix(".yaml")
        if stem in FAMILIES:
            assert ft.family == stem, ft.id
        assert ft.primary, f"{ft.id}: no primary symptom"
        assert ft.actions and ft.checks and ft.references
    integrator = [ft for ft in kb if ft.origin == "integrator.yaml"]
    assert len(integrator) == 6
    assert sorted(ft.share for ft in integrator if ft.share) == [0.12, 0.15, 0.18, 0.22, 0.29,
                                                                  0.38]


def test_default_load_is_cached() -> None:
    assert load_kb() is load_kb()


def test_every_emitted_finding_maps_to_a_type() -> None:
    kb = load_kb()
    for signal, kinds in EMITTED.items():
        for kind in kinds:
            assert kb.for_finding(signal, kind), f"{signal} {kind}: no fault type"
            if kind != "ambiguous":  # the tree handles 'ambiguous' as its first member
                assert kb.branches(signal, kind), f"{signal} {kind}: no tree branch"


def test_every_twin_fault_kind_has_its_type_and_it_is_diagnosable() -> None:
    kb = load_kb()
    for kind in FAULT_KINDS:
        ft = kb.for_twin(kind)
        assert ft is not None, kind
        assert ft.diagnosable, ft.id
    assert kb.for_twin("no-such-kind") is None


def test_lookup_order_is_prior_then_id() -> None:
    kb = load_kb()
    pairs = kb.for_finding("telemetry", "queue-buildup")
    keys = [(-ft.prior, ft.id) for ft, _ in pairs]
    assert keys == sorted(keys)
    assert kb.get("gray-link").resource == "cable"
    with pytest.raises(ConfigError, match="'nope': not in the knowledge base"):
        kb.get("nope")


# Distinguishing the types from their symptoms: a naive-Bayes score with a leak for
# findings a type does not list, absence counted only for findings emitted today, and a
# strong penalty for excluded_by. A test helper (the coordinator is elsewhere); it checks
# the *data* separates the types the brief names.

def _score(kb: KnowledgeBase, fault: str, resource: str, findings: list[Observed]) -> float:
    ft = kb.get(fault)
    present = {(o.source, o.kind, relation(o.subject, resource)) for o in findings}
    p = math.log(ft.prior)
    listed = {(s.signal, s.finding, s.at) for s in ft.symptoms}
    for s in ft.symptoms:
        if (s.signal, s.finding, s.at) in present:
            p += math.log(s.likelihood)
        elif s.emitted:
            p += math.log(1.0 - s.likelihood) if s.likelihood < 1 else -20.0
    p += math.log(0.01) * len(present - listed)
    excl = {(x.signal, x.finding) for x in ft.excluded_by}
    p += math.log(0.05) * sum(1 for f in present if f[:2] in excl)
    return p


CABLE = "leaf-01:eth10|spine-01:eth1"
ACCESS = "h0/nic0:p0|leaf-01:eth1"
SCENARIOS = [
    # (findings, candidates (type, resource), expected winner)
    ([("optics", "optic-rx-low", "spine-01:eth1"),
      ("telemetry", "error-counter-increase", "spine-01:eth1"),
      ("probe", "gray-link", "leaf-01:eth10->spine-01:eth1")],
     [("gray-link", CABLE), ("dirty-connector", "spine-01:eth1"),
      ("optic-aging", "spine-01:eth1"), ("fiber-damage", CABLE)], "dirty-connector"),
    ([("telemetry", "error-counter-increase", "spine-01:eth1"),
      ("probe", "gray-link", "leaf-01:eth10->spine-01:eth1")],
     [("gray-link", CABLE), ("dirty-connector", "spine-01:eth1"),
      ("optic-aging", "spine-01:eth1")], "gray-link"),
    ([("optics", "optic-degrading", "spine-01:eth1"),
      ("telemetry", "error-counter-increase", "spine-01:eth1")],
     [("gray-link", CABLE), ("dirty-connector", "spine-01:eth1"),
      ("optic-aging", "spine-01:eth1"), ("thermal", "spine-01:eth1")], "optic-aging"),
    ([("telemetry", "link-down", "spine-01:eth1"), ("telemetry", "link-flap", "spine-01:eth1"),
      ("probe", "gray-link", "leaf-01:eth10->spine-01:eth1")],
     [("link-flap", CABLE), ("link-down", CABLE)], "link-flap"),
    ([("telemetry", "link-down", "spine-01:eth1")],
     [("link-flap", CABLE), ("link-down", CABLE)], "link-down"),
    ([("probe", "switch-fault", "spine-01"),
      ("probe", "gray-link", "leaf-01:eth10->spine-01:eth1"),
      ("probe", "gray-link", "leaf-02:eth10->spine-01:eth2")],
     [("switch-fault", "spine-01"), ("gray-link", CABLE),
      ("gray-link", "leaf-02:eth10|spine-01:eth2")], "switch-fault"),
    ([("straggler", "slow-nic", "h0/nic0")],
     [("slow-nic", "h0/nic0"), ("nic-fault", "h0/nic0"), ("link-degraded", ACCESS)],
     "slow-nic"),
    ([("straggler", "slow-nic", "h0/nic0"), ("probe", "nic-fault", "h0/nic0")],
     [("slow-nic", "h0/nic0"), ("nic-fault", "h0/nic0"), ("link-degraded", ACCESS)],
     "nic-fault"),
    ([("straggler", "slow-nic", "h0/nic0"), ("telemetry", "queue-buildup", "leaf-01:eth1")],
     [("slow-nic", "h0/nic0"), ("nic-fault", "h0/nic0"), ("link-degraded", ACCESS)],
     "link-degraded"),
    ([("probe", "cpu-starved", "h0"), ("probe", "slow-nic", "h0/nic0")],
     [("cpu-starved-host", "h0"), ("slow-nic", "h0/nic0")], "cpu-starved-host"),
    ([("telemetry", "pause-storm", "leaf-01:eth1"), ("telemetry", "pause-storm", "h0/nic0:p0")],
     [("pfc-storm", "leaf-01:eth1"), ("incast-congestion", "leaf-01:eth1"),
      ("micro-burst", "leaf-01:eth1")], "pfc-storm"),
]


@pytest.mark.parametrize("findings,candidates,winner", SCENARIOS,
                         ids=[s[2] + f"-{i}" for i, s in enumerate(SCENARIOS)])
def test_symptoms_distinguish_the_types(findings: list[tuple[str, str, str]],
                                        candidates: list[tuple[str, str]], winner: str) -> None:
    kb = load_kb()
    obs = [_obs(*f) for f in findings]
    scores = {c: _score(kb, c[0], c[1], obs) for c in candidates}
    best = max(scores, key=lambda c: scores[c])
    assert best[0] == winner, scores


def test_the_many_gray_links_on_one_switch_case_is_gray_links() -> None:
    """Loss with FCS errors on two cables of a switch and no switch-fault finding."""
    kb = load_kb()
    obs = [_obs("probe", "gray-link", "leaf-01:eth10->spine-01:eth1"),
           _obs("telemetry", "error-counter-increase", "spine-01:eth1"),
           _obs("probe", "gray-link", "leaf-02:eth10->spine-01:eth2"),
           _obs("telemetry", "error-counter-increase", "spine-01:eth2")]
    gl = _score(kb, "gray-link", CABLE, obs[:2])
    sw = _score(kb, "switch-fault", "spine-01", obs[:2])
    assert gl > sw


# --------------------------------------------------------------------------- schema errors

def _bad(replace: str, by: str) -> str:
    assert replace in VALID
    return VALID.replace(replace, by, 1)


BAD = [
    (_bad("    prior: 0.02\n", "    prior: 0.02\n    colour: red\n"),
     "x.yaml: faults[0] (id t-one): colour: unknown key"),
    (_bad("at: self, primary: true}", "at: self, primary: true, note: x}"),
     "x.yaml: faults[0] (id t-one): symptoms[0].note: unknown key"),
    (_bad("    title: \"a test type\"\n", ""), "x.yaml: faults[0] (id t-one): title: missing"),
    (_bad("family: physical", "family: optical"),
     "x.yaml: faults[0] (id t-one): family: 'optical' is not one of"),
    (_bad("prior: 0.02", "prior: 1.5"), "x.yaml: faults[0] (id t-one): prior: 1.5 is not in (0, 1)"),
    (_bad("likelihood: 0.9", "likelihood: 0"),
     "x.yaml: faults[0] (id t-one): symptoms[0].likelihood: 0 is not in (0, 1]"),
    (_bad("at: self", "at: far"), "x.yaml: faults[0] (id t-one): symptoms[0].at: 'far'"),
    (_bad("primary: true", "primary: 'yes'"),
     "x.yaml: faults[0] (id t-one): symptoms[0].primary: expected true or false"),
    (_bad("signal: probe", "signal: pager"),
     "x.yaml: faults[0] (id t-one): symptoms[0].signal: 'pager' is not one of"),
    (_bad("  - id: t-one", "  - id: T_One"),
     "x.yaml: faults[0] (id T_One): id: 'T_One' is not a kebab-case id"),
    (_bad("reversible: true", "reversible: false"),
     "x.yaml: faults[0] (id t-one): actions[0].automation: 'cost-out-link' needs reversible"),
    (_bad("risk: low", "risk: tiny"), "x.yaml: faults[0] (id t-one): actions[0].risk: 'tiny'"),
    (_bad("source: telemetry", "source: gut"), "x.yaml: faults[0] (id t-one): checks[0].source"),
    (_bad("    references: [\"a paper\"]\n", "    references: []\n"),
     "x.yaml: faults[0] (id t-one): references: expected a non-empty list"),
    (_bad("    root_causes", "    excluded_by:\n      - {signal: probe, finding: gray-link, "
          "why: x}\n    root_causes"),
     "x.yaml: faults[0] (id t-one): excluded_by[0]: probe gray-link is also a symptom"),
    (VALID + VALID.split("faults:\n", 1)[1],
     "x.yaml: faults[1] (id t-one): id: already defined in x.yaml"),
    ("faults:\n  - [1, 2\n", "x.yaml: line 3: invalid YAML"),
    ("types: []\n", "x.yaml: expected one top-level key 'faults'"),
    ("faults:\n  - 3\n", "x.yaml: faults[0]: entry: expected a mapping"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m.split(": ", 2)[-1][:30] for _, m in BAD])
def test_schema_errors_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_kb({"x.yaml": text})
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(message), msg


def test_the_valid_fixture_parses() -> None:
    kb = parse_kb({"x.yaml": VALID})
    ft = kb.get("t-one")
    assert ft.prior == 0.02 and ft.primary[0].finding == "gray-link" and ft.origin == "x.yaml"
    assert ft.diagnosable


# --------------------------------------------------------------------------- user folders

def test_user_folder_replaces_and_adds(tmp_path: Path) -> None:
    base = load_kb()
    (tmp_path / "mine.yaml").write_text(
        VALID.replace("t-one", "gray-link").replace("prior: 0.02", "prior: 0.4")
        + VALID.split("faults:\n", 1)[1])
    kb = load_kb([tmp_path])
    assert kb.get("gray-link").prior == 0.4
    assert kb.get("gray-link").origin == str(tmp_path / "mine.yaml")
    assert "t-one" in kb
    assert len(kb) == len(base) + 1
    # the packaged knowledge is untouched
    assert load_kb().get("gray-link").prior == base.get("gray-link").prior != 0.4


def test_later_folder_wins_and_bad_folders_are_errors(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "t.yaml").write_text(VALID)
    (b / "t.yaml").write_text(VALID.replace("prior: 0.02", "prior: 0.3"))
    assert load_kb([a, b]).get("t-one").prior == 0.3
    with pytest.raises(ConfigError, match="not a folder"):
        load_kb([tmp_path / "missing"])
    (b / "u.yaml").write_text(VALID.replace("likelihood: 0.9", "likelihood: 2"))
    with pytest.raises(ConfigError, match=r"u\.yaml: faults\[0\] \(id t-one\): symptoms\[0\]"):
        load_kb([b])


# --------------------------------------------------------------------------- ids

def test_relation_and_cable_ids() -> None:
    assert cable_of("spine-01:eth1->leaf-01:eth10") == CABLE
    assert cable_of("leaf-01") is None
    assert relation("leaf-01:eth10->spine-01:eth1", CABLE) == "self"
    assert relation("spine-01:eth1", CABLE) == "self"
    assert relation("leaf-01:eth10->spine-01:eth1", "spine-01:eth1") == "near"
    assert relation("spine-01:eth1", "spine-01") == "self"
    assert relation("spine-01", "spine-01:eth1") == "near"
    assert relation("h0/nic0:p0", "h0/nic0") == "self"
    assert relation("h0/nic0", "h0") == "near"
    assert relation("leaf-02 | spine-01", "spine-01") == "self"


# --------------------------------------------------------------------------- case base

def test_seed_cases_name_kb_types() -> None:
    kb = load_kb()
    seeds = seed_cases()
    assert len(seeds) >= 6
    for c in seeds:
        assert c.fault in kb, c.id
        assert c.resource_kind == kb.get(c.fault).resource, c.id
    assert CaseBase(seeds).unknown_faults(kb) == []


def test_each_seed_case_is_retrieved_first_for_its_own_and_perturbed_signatures() -> None:
    cb = load_case_base()
    rng = np.random.default_rng(15)
    features = sorted({(s, k, r) for s, ks in EMITTED.items() for k in ks
                       for r in ("self", "near")})
    for c in cb:
        top, sim = cb.retrieve(c.weights, k=1)[0]
        assert top.id == c.id and sim == pytest.approx(1.0)
        for _ in range(5):
            w = {f: x * float(rng.uniform(0.6, 1.0)) for f, x in c.weights.items()}
            if len(w) > 2:  # drop one feature
                del w[sorted(w)[int(rng.integers(len(w)))]]
            noise = features[int(rng.integers(len(features)))]
            w[noise] = max(w.get(noise, 0.0), 0.3)  # and add one
            got = cb.retrieve(w, k=3)
            assert got[0][0].id == c.id, (c.id, w, [(x.id, s) for x, s in got])


def test_retrieval_from_findings_without_a_resource() -> None:
    cb = load_case_base()
    obs = [_obs("probe", "gray-link", "leaf-3:eth12->spine-1:eth4"),
           _obs("telemetry", "error-counter-increase", "spine-1:eth4"),
           _obs("optics", "optic-rx-low", "spine-1:eth4")]
    sig = signature_of(obs)
    assert all(f[2] == "any" for f in sig)
    (best, s), *_ = cb.retrieve(sig)
    assert best.fault == "dirty-connector" and 0.5 < s < 1.0
    assert cb.retrieve(sig, fault="numa-hugepages") == []


def test_similarity_is_weighted_jaccard() -> None:
    a = {("probe", "gray-link", "self"): 1.0, ("telemetry", "link-flap", "self"): 0.5}
    b = {("probe", "gray-link", "self"): 0.5}
    assert similarity(a, b) == pytest.approx(0.5 / 1.5)
    assert similarity(a, b) == similarity(b, a)
    assert similarity(a, a) == pytest.approx(1.0)
    assert similarity(a, {("host", "x", "self"): 1.0}) == 0.0
    assert similarity({}, {}) == 0.0


def _incident() -> tuple[Incident, list[Observed]]:
    obs = [_obs("probe", "gray-link", "leaf-3:eth12->spine-1:eth4", 10, 0.8),
           _obs("telemetry", "error-counter-increase", "spine-1:eth4", 20, 0.95),
           _obs("optics", "optic-rx-low", "spine-1:eth4", 30, 1.0),
           _obs("straggler", "slow-nic", "host0007/nic2", 40, 0.6),
           _obs("telemetry", "micro-burst", "leaf-9:eth1", 50)]  # not in the incident
    rc = RootCause("spine-1:eth4", "dirty-connector", 0.9, explains=tuple(o.id for o in obs[:4]))
    inc = Incident(id="inc-0001", status="closed", opened_ns=10, updated_ns=40,
                   first_symptom_ns=10, detected_ns=10, root_causes=(rc,),
                   findings=tuple(o.id for o in obs[:4]), title="dirty connector on spine-1")
    return inc, obs


def test_case_from_incident_save_load_round_trip(tmp_path: Path) -> None:
    kb = load_kb()
    inc, obs = _incident()
    case = case_from_incident(inc, obs, kb=kb, resolution="cleaned both connectors",
                              date="2025-03-01")
    assert case.id == "case-inc-0001" and case.resource_kind == "port"
    assert case.weights == {("probe", "gray-link", "near"): 0.8,
                            ("telemetry", "error-counter-increase", "self"): 0.95,
                            ("optics", "optic-rx-low", "self"): 1.0,
                            ("straggler", "slow-nic", "near"): 0.6}
    path = save_case(case, tmp_path / "cases")
    assert path.name == "case-inc-0001.yaml"
    assert load_cases(tmp_path / "cases") == [case]
    assert parse_case("x", dump_case(case)) == case
    cb = load_case_base([tmp_path / "cases"])
    assert len(cb) == len(seed_cases()) + 1
    best = cb.retrieve(case.weights, k=2)
    assert best[0][0].id == case.id
    assert best[1][0].id == "case-dirty-connector-spine"


def test_case_from_incident_refuses_what_it_cannot_use() -> None:
    kb = load_kb()
    inc, obs = _incident()
    bare = Incident(id="inc-2", status="open", opened_ns=0, updated_ns=0, first_symptom_ns=0,
                    detected_ns=0)
    with pytest.raises(ConfigError, match="inc-2: no root cause"):
        case_from_incident(bare, obs, kb=kb, resolution="x", date="2025")
    with pytest.raises(ConfigError, match="resolution: empty"):
        case_from_incident(inc, obs, kb=kb, resolution=" ", date="2025")
    with pytest.raises(ConfigError, match="date: '03/2025'"):
        case_from_incident(inc, obs, kb=kb, resolution="x", date="03/2025")


CASE = textwrap.dedent("""\
    case:
      id: c-1
      title: t
      fault: gray-link
      resource_kind: cable
      date: "2024-05"
      signature:
        - {signal: probe, finding: gray-link, at: self, weight: 1.0}
      resolution: r
    """)


@pytest.mark.parametrize("replace,by,message", [
    ("title: t", "title: t\n  colour: red", "c.yaml: case.colour: unknown key"),
    ("weight: 1.0", "weight: 1.5", "c.yaml: case.signature[0].weight: 1.5 is not in (0, 1]"),
    ("at: self", "at: far", "c.yaml: case.signature[0].at: 'far'"),
    ("resource_kind: cable", "resource_kind: rack", "c.yaml: case.resource_kind: 'rack'"),
    ('date: "2024-05"', "date: May", "c.yaml: case.date: 'May'"),
    ("  resolution: r\n", "", "c.yaml: case.resolution: missing"),
])
def test_case_parse_errors(replace: str, by: str, message: str) -> None:
    assert parse_case("c.yaml", CASE) == Case(
        id="c-1", title="t", fault="gray-link", resource_kind="cable",
        signature=((("probe", "gray-link", "self"), 1.0),), resolution="r", date="2024-05")
    with pytest.raises(ConfigError) as exc:
        parse_case("c.yaml", CASE.replace(replace, by))
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_the_doc_table_lists_every_type_as_the_kb_says() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "diagnosis-kb.md").read_text()
    rows = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    kb = load_kb()
    assert set(rows) == set(kb.types)
    for fid, cells in rows.items():
        ft = kb.get(fid)
        assert cells[1:4] == [ft.family, ft.specialist, ft.resource], fid
        assert cells[6] == ("yes" if ft.diagnosable else "no"), fid
