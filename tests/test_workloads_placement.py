"""Rank placement and unit parsing of the workload generators."""

from __future__ import annotations

import pytest

from fabricscope.fabric.builders import fat_tree_fabric, leaf_spine_fabric, rail_optimized_fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.workload import parse_duration_ns, parse_size, place_ranks


@pytest.fixture(scope="module")
def rail16():
    return rail_optimized_fabric(16)


def test_in_order_fills_servers_gpu_by_gpu(rail16):
    pl = place_ranks(rail16, 20)
    assert [(s.host, s.gpu) for s in pl.slots[:9]] == [("host0000", g) for g in range(8)] + [("host0001", 0)]
    # GPU i is served by NIC i (rail i), as the inventory says.
    for s in pl.slots:
        assert rail16.devices[s.nic].gpu == s.gpu and rail16.devices[s.nic].host == s.host


def test_random_is_seeded_and_distinct(rail16):
    a = place_ranks(rail16, 64, policy="random", seed=7)
    b = place_ranks(rail16, 64, policy="random", seed=7)
    c = place_ranks(rail16, 64, policy="random", seed=8)
    assert a.slots == b.slots
    assert a.slots != c.slots
    assert len(set(a.slots)) == 64


def test_rail_aware_puts_local_rank_on_its_rail(rail16):
    pl = place_ranks(rail16, 24, policy="rail-aware", ranks_per_host=4)
    assert pl.hosts == ("host0000", "host0001", "host0002", "host0003", "host0004", "host0005")
    for r, s in enumerate(pl.slots):
        assert s.gpu == r % 4
        assert rail16.devices[s.nic].rail == r % 4


def test_hosts_follow_lowest_rank(rail16):
    pl = place_ranks(rail16, 32, policy="random", seed=3)
    first = {}
    for r, s in enumerate(pl.slots):
        first.setdefault(s.host, r)
    assert list(pl.hosts) == sorted(first, key=first.__getitem__)


def test_single_gpu_hosts():
    ft = fat_tree_fabric(k=4)
    pl = place_ranks(ft)
    assert pl.n_ranks == 16 and len(pl.hosts) == 16


def test_multi_nic_leaf_spine_hosts():
    ls = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2, nics_per_host=2)
    # two NICs, GPUs 0 and 1 each have their own
    pl = place_ranks(ls)
    assert pl.n_ranks == 8 and pl.nic(1) == "host0000/nic1"


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"n_ranks": 0}, "ranks"), ({"n_ranks": 10_000}, "do not fit"),
     ({"policy": "scatter"}, "'scatter'"), ({"policy": "rail-aware", "ranks_per_host": 0}, "ranks_per_host")],
)
def test_placement_errors_name_field_and_value(rail16, kw, needle):
    with pytest.raises(WorkloadError, match=needle):
        place_ranks(rail16, **kw)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2MiB", 2 * 2**20), ("32MB", 32e6), ("256KiB", 262144), ("1.5GiB", 1.5 * 2**30),
     ("128M", 128 * 2**20), (4096, 4096), ("100 KB", 1e5), ("7B", 7)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["2 parsecs", "", "-3MB", 0, True, None, "MiB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ConfigError, match=r"workload\.size"):
        parse_size(bad, field="workload.size")


@pytest.mark.parametrize(
    ("text", "ns"), [("10us", 10_000), ("1.5ms", 1_500_000), ("200ns", 200), (50, 50), ("2s", 2_000_000_000)]
)
def test_parse_duration(text, ns):
    assert parse_duration_ns(text) == ns


def test_parse_duration_rejects():
    with pytest.raises(ConfigError, match=r"fwd_compute.*'3 days'"):
        parse_duration_ns("3 days", field="fwd_compute")
