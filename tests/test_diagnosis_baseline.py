"""The knowledge-tree baseline on hand-written findings (behaviour as specified)."""

from __future__ import annotations

from fabricscope.diagnosis.baseline import knowledge_tree
from fabricscope.diagnosis.knowledge import cable_of, load_kb, parse_kb
from fabricscope.diagnosis.model import Observed, RootCause
from fabricscope.model.records import Finding

# A tiny fabric: h0/nic0 - leaf-01 - spine-01 - leaf-02 - h1/nic0
CABLES = ("leaf-01:eth10|spine-01:eth1", "leaf-02:eth10|spine-01:eth2",
          "h0/nic0:p0|leaf-01:eth1", "h1/nic0:p0|leaf-02:eth1")
PORT_CABLE = {p: c for c in CABLES for p in c.split("|")}


def _device(port: str) -> str:
    return port.split(":", 1)[0]


def _is_kind(device: str, kind: str) -> bool:
    if kind == "nic":
        return "/nic" in device
    return "/" not in device and not device.startswith("h")  # a switch


def resource_of(subject: str, kind: str) -> tuple[str, ...]:
    """A fake of the lead's inventory mapping (most direct first)."""
    cab = cable_of(subject)
    ports: tuple[str, ...]
    if cab is not None:
        a, b = (s.strip() for s in subject.replace("->", "|").split("|"))
        ports = (b, a)  # the receiver first
    elif subject in PORT_CABLE:
        cab, ports = PORT_CABLE[subject], (subject,)
    else:
        ports = ()
    if kind == "cable":
        if cab:
            return (cab,)
        return tuple(c for c in CABLES if c.startswith(subject + ":"))  # a NIC's access cable
    if kind == "port":
        return ports
    if kind in ("switch", "nic"):
        devs = [_device(p) for p in ports] if ports else [subject]
        if kind == "nic" and cab and ports:  # a leaf port implicates the NIC at the far end
            devs += [_device(p) for p in cab.split("|")]
        return tuple(dict.fromkeys(d for d in devs if _is_kind(d, kind)))
    if kind == "host":
        return (subject.split("/", 1)[0],) if subject.startswith("h") else ()
    if kind == "gpu":
        return (subject,) if "/gpu" in subject else ()
    if kind == "job":
        return (subject,) if subject.startswith("job") else ()
    return ()


def _obs(source: str, kind: str, subject: str, t: int) -> Observed:
    return Observed(source, Finding(kind, subject, 0.9, (t, t)), reported_ns=t)


def _keys(rcs: list[RootCause]) -> set[tuple[str, str]]:
    return {rc.key for rc in rcs}


def test_a_gray_link_with_its_counters_is_one_root_cause() -> None:
    kb = load_kb()
    fs = [_obs("probe", "gray-link", "leaf-01:eth10->spine-01:eth1", 2),
          _obs("telemetry", "error-counter-increase", "spine-01:eth1", 1),
          _obs("probe", "gray-link", "spine-01:eth1->leaf-01:eth10", 3)]
    rcs = knowledge_tree(fs, kb, resource_of)
    assert len(rcs) == 1
    rc = rcs[0]
    assert rc.key == ("leaf-01:eth10|spine-01:eth1", "gray-link")
    # named by the first alarm to arrive (the counter), never by a later duplicate
    assert rc.explains == (fs[1].id,) and fs[1].id in rc.evidence[0]
    assert rc.probability == 1.0 and rc.specialist == "knowledge-tree"
    assert rc.action == kb.get("gray-link").actions[0].action


def test_two_symptoms_of_one_fault_on_different_resources_give_two_root_causes() -> None:
    """A dirty connector on spine-01:eth1: the tree cannot explain the probe loss away."""
    fs = [_obs("optics", "optic-rx-low", "spine-01:eth1", 1),
          _obs("probe", "gray-link", "leaf-01:eth10->spine-01:eth1", 2)]
    rcs = knowledge_tree(fs, load_kb(), resource_of)
    assert _keys(rcs) == {("spine-01:eth1", "dirty-connector"),
                          ("leaf-01:eth10|spine-01:eth1", "gray-link")}


def test_confirmation_picks_a_later_branch_and_arrival_order_matters() -> None:
    kb = load_kb()
    flap = _obs("telemetry", "link-flap", "leaf-01:eth1", 5)
    # alone: the first branch of link-flap (prior order), on the access cable
    assert _keys(knowledge_tree([flap], kb, resource_of)) == {
        ("h0/nic0:p0|leaf-01:eth1", "link-flap")}
    # a NIC fault seen before the flap confirms the NIC firmware hang branch
    nic = _obs("probe", "nic-fault", "h0/nic0", 1)
    assert _keys(knowledge_tree([flap, nic], kb, resource_of)) == {
        ("h0/nic0", "nic-fault"), ("h0/nic0", "nic-firmware-hang")}
    # seen after it, it cannot confirm anything: each alarm is handled when it arrives
    late = _obs("probe", "nic-fault", "h0/nic0", 9)
    assert _keys(knowledge_tree([flap, late], kb, resource_of)) == {
        ("h0/nic0:p0|leaf-01:eth1", "link-flap"), ("h0/nic0", "nic-fault")}


def test_unconfirmed_alarm_takes_the_highest_prior_branch() -> None:
    kb = load_kb()
    q = _obs("telemetry", "queue-buildup", "leaf-01:eth10", 3)
    assert _keys(knowledge_tree([q], kb, resource_of)) == {
        ("leaf-01:eth10|spine-01:eth1", "congestion")}
    mb = _obs("telemetry", "micro-burst", "leaf-01:eth10", 1)
    # the burst seen first confirms the queue-buildup branch's first type that lists it
    # (congestion: a standing queue usually starts as bursts)
    assert _keys(knowledge_tree([mb, q], kb, resource_of)) == {
        ("leaf-01:eth10", "micro-burst"), ("leaf-01:eth10|spine-01:eth1", "congestion")}


def test_the_order_comes_from_the_knowledge_base() -> None:
    doc = """\
faults:
  - id: aa-type
    title: a
    family: link
    specialist: link
    resource: cable
    prior: {pa}
    symptoms:
      - {{signal: probe, finding: gray-link, likelihood: 0.9, at: self, primary: true}}
    checks: [{{id: c, source: probe, how: h, if_true: t, if_false: f}}]
    root_causes: [r]
    actions: [{{action: act-a, risk: low, reversible: true, automation: none}}]
    references: [x]
  - id: bb-type
    title: b
    family: link
    specialist: link
    resource: port
    prior: {pb}
    symptoms:
      - {{signal: probe, finding: gray-link, likelihood: 0.9, at: near, primary: true}}
      - {{signal: telemetry, finding: link-flap, likelihood: 0.9, at: self}}
    checks: [{{id: c, source: probe, how: h, if_true: t, if_false: f}}]
    root_causes: [r]
    actions: [{{action: act-b, risk: low, reversible: true, automation: none}}]
    references: [x]
"""
    g = _obs("probe", "gray-link", "leaf-01:eth10->spine-01:eth1", 2)
    for pa, pb, want in [(0.2, 0.1, ("leaf-01:eth10|spine-01:eth1", "aa-type")),
                         (0.1, 0.2, ("spine-01:eth1", "bb-type"))]:
        kb = parse_kb({"t.yaml": doc.format(pa=pa, pb=pb)})
        assert _keys(knowledge_tree([g], kb, resource_of)) == {want}
    # a confirmed later branch beats the first one
    kb = parse_kb({"t.yaml": doc.format(pa=0.2, pb=0.1)})
    flap = _obs("telemetry", "link-flap", "spine-01:eth1", 1)
    rcs = knowledge_tree([flap, g], kb, resource_of)
    assert _keys(rcs) == {("spine-01:eth1", "bb-type")}
    assert rcs[0].action == "act-b" and flap.id in rcs[0].evidence[0]


def test_ambiguous_findings_take_their_first_member() -> None:
    kb = load_kb()
    fs = [_obs("probe", "ambiguous", "leaf-01:eth10->spine-01:eth1 | spine-01", 1),
          _obs("probe", "ambiguous", "h1/nic0 | leaf-02", 2),
          _obs("probe", "ambiguous", "spine-01 | h0/nic0", 3),
          _obs("probe", "gray-link", "leaf-02:eth10->spine-01:eth2 | h1/nic0:p0->leaf-02:eth1",
               4)]
    assert _keys(knowledge_tree(fs, kb, resource_of)) == {
        ("leaf-01:eth10|spine-01:eth1", "gray-link"), ("h1/nic0", "nic-fault"),
        ("spine-01", "switch-fault"), ("leaf-02:eth10|spine-01:eth2", "gray-link")}


def test_alarms_without_a_branch_or_a_resource_name_nothing() -> None:
    kb = load_kb()
    fs = [_obs("probe", "not-a-kind", "spine-01", 1),
          _obs("straggler", "slow-gpu", "leaf-01", 2)]  # no GPU implicated by a switch
    assert knowledge_tree(fs, kb, resource_of) == []
    assert knowledge_tree([], kb, resource_of) == []


def test_every_twin_diagnosable_alarm_names_its_type_alone() -> None:
    """One alarm of a type's primary finding on a fitting subject names a KB type."""
    kb = load_kb()
    subjects = {"cable": "leaf-01:eth10->spine-01:eth1", "port": "spine-01:eth1",
                "switch": "spine-01", "nic": "h0/nic0", "host": "h0", "gpu": "h0/gpu3",
                "job": "job-llama"}
    for ft in kb:
        for s in ft.primary:
            if not s.emitted or s.at != "self":
                continue
            rcs = knowledge_tree([_obs(s.signal, s.finding, subjects[ft.resource], 1)], kb,
                                 resource_of)
            assert len(rcs) == 1, (ft.id, s)
            assert rcs[0].fault in kb and rcs[0].explains
