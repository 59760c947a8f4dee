"""Bill of materials and catalog: counts from the builders' parameters, reach policy, overrides."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from fabricscope.design.bom import bill_of_materials
from fabricscope.design.catalog import SwitchModel, default_catalog, load_catalog
from fabricscope.fabric.builders import (
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError

CAT = default_catalog()


def _rail_counts(f: Fabric, homes_or_planes: int) -> tuple[int, int, int, int]:
    """(host-leaf links, leaves, leaf-spine links, spines) of a 2-tier rail fabric, by hand."""
    m = f.meta
    servers, rails = int(m["servers"]), int(m["rails"])
    spl, up = int(m["servers_per_leaf"]), int(m["leaf_uplinks"])
    leaves = rails * math.ceil(servers / spl) * homes_or_planes
    spines = int(m["spines_per_group"]) * (homes_or_planes if m["kind"] == "multi-plane" else 1)
    return servers * rails * homes_or_planes, leaves, leaves * up, spines


@pytest.mark.parametrize(
    ("build", "copies", "gbps"),
    [
        (lambda: rail_optimized_fabric(16), 1, 400.0),
        (lambda: dual_tor_fabric(16), 2, 200.0),
        (lambda: multi_plane_fabric(16, planes=2), 2, 200.0),
    ],
    ids=["rail", "dual-tor", "multi-plane"],
)
def test_rail_family_counts_and_cost(build: object, copies: int, gbps: float) -> None:
    f = build()  # type: ignore[operator]
    hl, leaves, ls, spines = _rail_counts(f, copies)
    b = bill_of_materials(f, CAT)
    assert b.gpus == 16 * 8
    assert b.link_count("host-leaf") == hl and b.link_count("leaf-spine") == ls
    assert b.link_count("spine-core") == 0 and b.tier("core") is None
    leaf, spine = b.tier("leaf"), b.tier("spine")
    assert leaf is not None and spine is not None
    assert (leaf.count, spine.count) == (leaves, spines)
    assert leaf.ports_used == hl + ls and spine.ports_used == ls
    assert b.switch_ports_used == hl + 2 * ls
    model = CAT.switch_for(64, gbps)
    assert leaf.model == model.name and leaf.ports_free == leaves * model.radix - (hl + ls)
    # Rail layout, two tiers of <= 2,048 GPUs: every cable in-row, multimode optics.
    assert dict(b.reach) == {"host-leaf": "in-row", "leaf-spine": "in-row",
                             "spine-core": "cross-row"}
    med = CAT.medium_for("in-row", gbps)
    assert med.kind == "optic"
    links = hl + ls
    assert (b.transceivers, b.cables, b.fibers, b.nic_ports) == (2 * links, 0, links, hl)
    want = ((leaves + spines) * model.price_usd + 2 * links * med.price_usd
            + links * med.fiber_usd + hl * CAT.nic.port_price_usd * gbps / CAT.nic.port_gbps)
    assert b.cost_usd == pytest.approx(want)
    assert b.cost_per_gpu_usd == pytest.approx(want / b.gpus)
    want_w = ((leaves + spines) * model.watts + 2 * links * med.watts
              + hl * CAT.nic.port_watts * gbps / CAT.nic.port_gbps)
    assert b.watts == pytest.approx(want_w) and b.watts_per_gpu == pytest.approx(want_w / b.gpus)
    assert sum(b.cost_breakdown.values()) == pytest.approx(b.cost_usd)


def test_standard_leaf_spine_uses_copper_in_rack_and_rounds_radix_to_a_model() -> None:
    leaves, hpl, spines, lps, nics = 4, 3, 2, 2, 2
    f = leaf_spine_fabric(leaves=leaves, hosts_per_leaf=hpl, spines=spines,
                          links_per_spine=lps, nics_per_host=nics)
    b = bill_of_materials(f, CAT)
    hl, ls = leaves * hpl * nics, leaves * spines * lps
    # No radix in meta: the busiest switch (a leaf: hpl*nics down + spines*lps up) decides.
    model = CAT.switch_for(hpl * nics + spines * lps, 100.0)
    assert b.radix == model.radix
    leaf, spine = b.tier("leaf"), b.tier("spine")
    assert leaf is not None and spine is not None
    assert leaf.ports_free == leaves * model.radix - (hl + ls)
    assert spine.ports_free == spines * model.radix - ls
    assert b.reach["host-leaf"] == "in-rack"
    dac = CAT.medium_for("in-rack", 100.0)
    assert dac.kind == "cable"
    assert (b.cables, b.transceivers, b.fibers) == (hl, 2 * ls, ls)
    assert b.cost_breakdown["cables"] == pytest.approx(hl * dac.price_usd)


def test_fat_tree_three_tiers_and_reach_classes() -> None:
    k = 4
    f = fat_tree_fabric(k=k)
    b = bill_of_materials(f, CAT)
    pods, half = k, k // 2
    assert b.link_count("host-leaf") == pods * half * half
    assert b.link_count("leaf-spine") == pods * half * half
    assert b.link_count("spine-core") == pods * half * half
    core = b.tier("core")
    assert core is not None and core.count == half * half
    assert [r.reach for r in b.links] == ["in-rack", "in-row", "cross-row"]
    assert b.links[2].medium == CAT.medium_for("cross-row", 100.0).name


def test_counts_follow_the_inventory_not_the_builder() -> None:
    f = leaf_spine_fabric(leaves=4, hosts_per_leaf=2, spines=2)
    drop = {ln.id for ln in f.links if ln.a.startswith("leaf-000:") and "spine" in ln.b}
    cut = Fabric.create(f.name, f.devices.values(), f.ports.values(),
                        [ln for ln in f.links if ln.id not in drop], meta=f.meta)
    b0, b1 = bill_of_materials(f, CAT), bill_of_materials(cut, CAT)
    assert len(drop) == 2
    assert b1.link_count("leaf-spine") == b0.link_count("leaf-spine") - len(drop)
    assert b1.switch_ports_used == b0.switch_ports_used - 2 * len(drop)


def test_radix_argument_and_a_switch_too_small() -> None:
    f = rail_optimized_fabric(16)
    b = bill_of_materials(f, CAT, radix=128)
    leaf = b.tier("leaf")
    assert leaf is not None and leaf.model == "51.2T-128x400G"
    assert leaf.ports_free == leaf.count * 128 - leaf.ports_used
    tiny = SwitchModel("16x400G", 16, 400.0, 6.4, 1.0, 1.0, "[estimate: test]")
    small = dataclasses.replace(CAT, switches=(tiny,))
    with pytest.raises(ConfigError, match=r"leaf 'leaf-p0-r\d-00' cables 32 ports, more than the 16"):
        bill_of_materials(f, small, radix=16)
    with pytest.raises(ConfigError, match="radix >= 64 and port_gbps >= 400"):
        bill_of_materials(f, small)


def test_servers_and_preferred_media_change_the_cost() -> None:
    f = fat_tree_fabric(k=4)
    base = bill_of_materials(f, CAT)
    with_servers = bill_of_materials(f, CAT.merged({"nic": {"server_price_usd": 1000.0}}))
    assert with_servers.cost_breakdown["servers"] == pytest.approx(len(f.hosts) * 1000.0)
    assert base.cost_breakdown["servers"] == 0.0
    aec = CAT.merged({"prefer": {"in-rack": "AEC"}})
    # The preference picks among the media of the link's speed: no 100G AEC is listed.
    assert bill_of_materials(f, aec).links[0].medium == "100G QSFP28 DAC"
    b = bill_of_materials(fat_tree_fabric(k=4, gbps=400.0), aec)
    assert b.links[0].medium == "400G AEC"
    assert b.cost_breakdown["cables"] == pytest.approx(16 * aec.medium_for("in-rack", 400.0).price_usd)
    assert b.watts_breakdown["cables"] == pytest.approx(2 * 16 * aec.medium_for("in-rack", 400.0).watts)
    json.dumps(b.to_json())
    assert b.to_json()["tiers"][0]["role"] == "leaf"


# ---------------------------------------------------------------------- catalog
def test_switch_for_exact_then_smallest_fit_then_error() -> None:
    assert CAT.switch_for(64, 400).name == "25.6T-64x400G"
    assert CAT.switch_for(128, 800).name == "102.4T-128x800G"
    assert CAT.switch_for(40, 400).name == "25.6T-64x400G"  # smallest chip that fits
    assert CAT.switch_for(65, 400).name == "51.2T-128x400G"
    assert CAT.switch_for(64, 300).name == "25.6T-64x400G"
    with pytest.raises(ConfigError, match="radix >= 1000 and port_gbps >= 400"):
        CAT.switch_for(1000, 400)


def test_medium_for_takes_the_next_faster_speed_then_errors() -> None:
    assert CAT.medium_for("in-row", 300).gbps == 400
    with pytest.raises(ConfigError, match="no campus medium of >= 3200 Gb/s"):
        CAT.medium_for("campus", 3200)


def test_every_default_figure_has_a_labelled_source() -> None:
    recs = [*CAT.switches, *CAT.media, CAT.nic]
    for r in recs:
        assert "[V]" in r.source or "[estimate" in r.source, r
    for reach in ("in-rack", "in-row", "cross-row", "campus"):
        for gbps in (100, 200, 400, 800, 1600):
            assert CAT.medium_for(reach, gbps).gbps >= gbps


def test_reach_policy_per_layout_and_overrides() -> None:
    rail = rail_optimized_fabric(16)  # 128 GPUs, two tiers
    assert CAT.reach_for(rail)["leaf-spine"] == "in-row"
    at = CAT.merged({"reach": {"row_gpus": rail.gpu_count}})
    above = CAT.merged({"reach": {"row_gpus": rail.gpu_count - 1}})
    assert at.reach_for(rail)["leaf-spine"] == "in-row"
    assert above.reach_for(rail)["leaf-spine"] == "cross-row"
    three = rail_optimized_fabric(16, servers_per_pod=8)
    assert three.meta["tiers"] == 3
    assert above.reach_for(three) == {"host-leaf": "in-row", "leaf-spine": "in-row",
                                      "spine-core": "cross-row"}
    std = dataclasses.replace(rail, meta={**rail.meta, "layout": "standard"})
    assert CAT.reach_for(std)["host-leaf"] == "in-rack"
    forced = CAT.merged({"reach": {"host-leaf": "campus", "leaf-spine": {"two-tier": "cross-row"}}})
    assert forced.reach_for(rail)["host-leaf"] == "campus"
    assert forced.reach_for(fat_tree_fabric(k=4))["host-leaf"] == "campus"
    assert forced.reach_for(rail)["leaf-spine"] == "cross-row"
    assert forced.reach_for(three)["leaf-spine"] == "in-row"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cat.yaml"
    p.write_text(text)
    return p


def test_load_catalog_merges_a_subset(tmp_path: Path) -> None:
    p = _write(tmp_path, """
switches:
  - {name: 25.6T-64x400G, price_usd: 1234}
  - {name: my-64x400G, radix: 64, port_gbps: 400, chip_tbps: 25.6, price_usd: 10,
     watts: 5, source: "[estimate: test]"}
media:
  - {reach: in-row, gbps: 400, family: SR, price_usd: 7}
nic: {port_price_usd: 99}
""")
    c = load_catalog(p)
    old = next(m for m in CAT.switches if m.name == "25.6T-64x400G")
    new = next(m for m in c.switches if m.name == "25.6T-64x400G")
    assert new.price_usd == 1234 and new.watts == old.watts and new.source == old.source
    assert len(c.switches) == len(CAT.switches) + 1
    assert c.medium_for("in-row", 400).price_usd == 7
    assert c.nic.port_price_usd == 99 and c.nic.port_watts == CAT.nic.port_watts
    assert len(c.media) == len(CAT.media)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("switches:\n  - {name: a}\n  - {name: b}\n  - {name: 25.6T-64x400G, price_usd: -5}\n",
         "switches[0].radix: missing"),
        ("switches:\n  - {name: 12.8T-32x400G}\n  - {name: 25.6T-64x400G}\n"
         "  - {name: 51.2T-64x800G, price_usd: -5}\n",
         "switches[2].price_usd: must be >= 0, got -5"),
        ("switches:\n  - {name: 12.8T-32x400G, radix: 0}\n",
         "switches[0].radix: must be an integer >= 1, got 0"),
        ("switches:\n  - {name: 12.8T-32x400G, colour: red}\n", "switches[0].colour: unknown field"),
        ("media:\n  - {reach: in-row, gbps: 400, family: SR, kind: laser}\n",
         "media[0].kind: must be cable or optic, got 'laser'"),
        ("media:\n  - {reach: moon, gbps: 400, family: SR, name: x, kind: optic, max_m: 1,"
         " price_usd: 1, watts: 1, fiber_usd: 1, source: s}\n",
         "media[0].reach: must be one of in-rack, in-row, cross-row, campus, got 'moon'"),
        ("reach: {host-leaf: nearby}\n", "reach.host-leaf.standard: must be one of"),
        ("reach: {row_gpus: -1}\n", "reach.row_gpus: must be an integer >= 1, got -1"),
        ("nic: {port_watts: many}\n", "nic.port_watts: must be a number, got 'many'"),
        ("prefer: {orbit: DAC}\n", "prefer.orbit: unknown reach class"),
        ("optics: {}\n", "optics: unknown catalog section"),
        ("switches: {a: 1}\n", "switches: must be a list"),
        ("switches: [\n", "malformed YAML"),
        ("- 1\n- 2\n", "expected a mapping"),
    ],
)
def test_bad_catalog_values_name_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_catalog(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}:") and message in msg and "\n" not in msg


def test_missing_catalog_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read catalog"):
        load_catalog(tmp_path / "nope.yaml")


def test_merged_per_design_overrides_name_their_source() -> None:
    with pytest.raises(ConfigError, match=r"^design.yaml: catalog: switches\[0\].watts: must be >= 0"):
        CAT.merged({"switches": [{"name": "25.6T-64x400G", "watts": -1}]},
                   source="design.yaml: catalog")
    assert CAT.merged({}) == CAT
