"""Traffic matrices and user flow lists (CSV / JSON) with collected, located errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fabricscope.fabric.builders import fat_tree_fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.workload import (
    all_to_all_matrix,
    incast,
    parse_flow_csv,
    parse_flow_json,
    permutation,
    random_derangement,
    read_flow_list,
)


@pytest.fixture(scope="module")
def ft():
    return fat_tree_fabric(k=4)


def test_derangement_has_no_fixed_point_and_is_uniformish():
    rng = np.random.default_rng(0)
    n, trials = 5, 4000
    counts = np.zeros((n, n))
    for _ in range(trials):
        p = random_derangement(n, rng)
        assert sorted(p) == list(range(n))
        assert all(p[i] != i for i in range(n))
        counts[np.arange(n), p] += 1
    # Uniform over derangements: each off-diagonal cell has probability 1/(n-1) = 0.25.
    # Binomial sd = sqrt(trials * 0.25 * 0.75) ~ 27; allow 5 sd over 20 cells.
    off = counts[~np.eye(n, dtype=bool)]
    assert np.all(np.abs(off - trials / (n - 1)) < 5 * np.sqrt(trials * 0.25 * 0.75))


def test_permutation(ft):
    w = permutation(ft, 2e6, seed=3)
    assert len(w.flows) == 16
    assert sorted(f.src for f in w.flows) == sorted(f.dst for f in w.flows)
    assert all(f.src != f.dst for f in w.flows)
    assert [f.dst for f in w.flows] == [f.dst for f in permutation(ft, 2e6, seed=3).flows]


def test_incast(ft):
    w = incast(ft, 1e5, senders=15, receiver="host0003/nic0")
    assert len(w.flows) == 15 and {f.dst for f in w.flows} == {"host0003/nic0"}
    assert "host0003/nic0" not in {f.src for f in w.flows}
    with pytest.raises(WorkloadError, match="senders"):
        incast(ft, 1e5, senders=16)
    with pytest.raises(WorkloadError, match="receiver"):
        incast(ft, 1e5, senders=2, receiver="host9999/nic0")


def test_nic_all_to_all(ft):
    w = all_to_all_matrix(ft, 1000)
    assert len(w.flows) == 16 * 15


def test_csv_flow_list(ft, tmp_path):
    p = tmp_path / "flows.csv"
    p.write_text("# my flows\nsrc,dst,size,start\nhost0000/nic0,host0005/nic0,2MiB,10us\n"
                 "host0001,198.18.0.3,1000,\n")
    w = read_flow_list(ft, p)
    assert [(f.src, f.dst, f.size_bytes, f.start_ns) for f in w.flows] == [
        ("host0000/nic0", "host0005/nic0", 2 * 2**20, 10_000),
        ("host0001/nic0", ft.nic_by_address["198.18.0.3"].id, 1000, 0),
    ]


def test_csv_errors_are_collected_with_row_field_value(ft):
    text = ("src,dst,size\n"
            "host0000/nic0,host0001/nic0,1MB\n"
            "host0000/nic0,nowhere,1MB\n"
            "host0002/nic0,host0003/nic0,lots\n"
            "host0004/nic0,host0004/nic0,1MB\n")
    with pytest.raises(ConfigError) as ei:
        parse_flow_csv(ft, text, source="flows.csv")
    msg = str(ei.value)
    assert "3 error(s)" in msg
    assert "flows.csv: row 3: dst: 'nowhere'" in msg
    assert "flows.csv: row 4: size" in msg and "'lots'" in msg
    assert "row 5: dst: same NIC" in msg
    assert "\n" not in msg  # one error line on the command line


def test_csv_header_and_extra_cells(ft):
    with pytest.raises(ConfigError, match="missing column"):
        parse_flow_csv(ft, "from,to,bytes\na,b,1\n", source="x.csv")
    with pytest.raises(ConfigError, match="row 2: unknown field"):
        parse_flow_csv(ft, "src,dst,size\nhost0000/nic0,host0001/nic0,1,9,9\n", source="x.csv")


def test_json_flow_list(ft, tmp_path):
    p = tmp_path / "f.json"
    p.write_text(json.dumps({"flows": [{"src": "host0000/nic0", "dst": "host0001/nic0", "size": "4KiB"},
                                       {"src": "host0002/nic0", "dst": "host0001/nic0", "size": 10, "start": 5}]}))
    w = read_flow_list(ft, p)
    assert len(w.flows) == 2 and w.flows[1].start_ns == 5


def test_json_errors(ft):
    with pytest.raises(ConfigError, match="line 1 column"):
        parse_flow_json(ft, "[{", source="f.json")
    with pytest.raises(ConfigError) as ei:
        parse_flow_json(ft, json.dumps([3, {"src": "host0000/nic0", "dst": "x", "size": 1},
                                        {"src": "host0000/nic0", "dst": "host0001/nic0", "size": 1,
                                         "color": "red"}]), source="f.json")
    msg = str(ei.value)
    assert "f.json: flows[0]: expected an object" in msg
    assert "f.json: flows[1]: dst: 'x'" in msg
    assert "f.json: flows[2]: unknown field 'color'" in msg


def test_missing_and_empty_files(ft, tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        read_flow_list(ft, tmp_path / "nope.csv")
    (tmp_path / "e.csv").write_text("# nothing\n")
    with pytest.raises(WorkloadError, match="empty"):
        read_flow_list(ft, tmp_path / "e.csv")


def test_many_errors_are_capped(ft):
    rows = "".join("a,b,1\n" for _ in range(50))
    with pytest.raises(ConfigError) as ei:
        parse_flow_csv(ft, "src,dst,size\n" + rows, source="big.csv")
    assert "100 error(s)" in str(ei.value) and "and 80 more" in str(ei.value)
