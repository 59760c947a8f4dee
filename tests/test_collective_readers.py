"""nccl-tests, NCCL Inspector and NCCL_DEBUG readers on real public outputs (tests/data/collective/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.collective import (
    bus_factor,
    collective_from_name,
    parse_nccl_debug,
    parse_nccl_tests,
    read_collective_file,
    read_inspector,
    read_nccl_tests,
)
from fabricscope.model.errors import TraceFormatError

DATA = Path(__file__).parent / "data" / "collective"
TEXT_SAMPLES = sorted(p for p in DATA.iterdir()
                      if p.suffix in {".log", ".txt"} and "debug" not in p.name)


def test_every_sample_is_listed_in_the_readme() -> None:
    readme = (DATA / "README.md").read_text()
    for p in DATA.iterdir():
        if p.name != "README.md":
            assert p.name in readme, p.name


@pytest.mark.parametrize("path", TEXT_SAMPLES, ids=lambda p: p.name)
def test_every_sample_parses_and_its_avg_line_matches(path: Path) -> None:
    runs = read_nccl_tests(path)
    assert runs
    for run in runs:
        assert run.collective != "unknown", run.source
        if run.avg_busbw_file is not None:
            # the file's own "# Avg bus bandwidth" equals the mean of every printed busbw
            # (both placements), within the rounding of the printed values
            assert run.avg_matches, (run.source, run.avg_busbw_file, run.avg_busbw_recomputed)
            assert not any("Avg bus bandwidth" in w for w in run.warnings)


EXPECTED = {
    # file: (collective, ranks, nodes, rows, avg line)
    "superbench_nccl_allreduce.log": ("all_reduce", 8, 1, 34, 68.4048),
    "superbench_nccl_allgather.log": ("all_gather", 8, 1, 34, 58.2651),
    "superbench_nccl_alltoall.log": ("alltoall", 8, 1, 34, 58.6481),
    "superbench_nccl_broadcast.log": ("broadcast", 8, 1, 34, 64.8653),
    "superbench_nccl_reduce.log": ("reduce", 8, 1, 34, 65.018),
    "superbench_nccl_reducescatter.log": ("reduce_scatter", 8, 1, 34, 60.168),
    "a3mega_allreduce_2node.txt": ("all_reduce", 16, 2, 31, 70.742),
    "coreweave_gb200_nvl72_allreduce_excerpt.txt": ("all_reduce", 72, 1, 5, 745.53),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_shape(name: str) -> None:
    (run,) = read_nccl_tests(DATA / name)
    coll, ranks, nodes, rows, avg = EXPECTED[name]
    assert (run.collective, run.ranks, run.nodes, len(run.rows), run.avg_busbw_file) == (
        coll, ranks, nodes, rows, avg)
    assert not run.truncated and not run.errors
    assert all(r.out_of_place and r.in_place for r in run.rows)


def test_old_layouts_without_redop_or_root() -> None:
    (bc,) = read_nccl_tests(DATA / "superbench_nccl_broadcast.log")  # "type root", no redop
    assert {(r.dtype, r.redop, r.root) for r in bc.rows} == {("float", "none", 0)}
    (ag,) = read_nccl_tests(DATA / "superbench_nccl_allgather.log")  # neither redop nor root
    assert {(r.dtype, r.redop, r.root) for r in ag.rows} == {("float", "none", None)}
    # "N/A" in the error column (validation off)
    assert all(p.wrong is None for r in ag.rows for _, p in r.placements())
    last = ag.rows[-1]
    assert last.size_bytes == 8589934592 and last.out_of_place is not None
    # the NCCL INFO lines in the table are counted, not parsed as rows
    assert ag.nccl_info_lines >= 1


def test_newer_layout_root_and_wrong_columns() -> None:
    (run,) = read_nccl_tests(DATA / "a3mega_allreduce_2node.txt")
    assert {(r.redop, r.root) for r in run.rows} == {("sum", -1)}
    assert all(p.wrong == 0 and p.wrong_kind == "count" for r in run.rows for _, p in r.placements())
    assert run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert run.header["nGpus"] == "1" and run.header["warmup_iters"] == "5"
    assert run.out_of_bounds == 0


def test_busbw_over_algbw_is_the_documented_factor() -> None:
    """busbw / algbw of the 8-GPU samples, at sizes where rounding is small, equals
    doc/PERFORMANCE.md's factor within the error the 2-decimal rounding allows."""
    for name, coll in [("superbench_nccl_allreduce.log", "all_reduce"),
                       ("superbench_nccl_allgather.log", "all_gather"),
                       ("superbench_nccl_reducescatter.log", "reduce_scatter"),
                       ("superbench_nccl_alltoall.log", "alltoall"),
                       ("superbench_nccl_broadcast.log", "broadcast"),
                       ("superbench_nccl_reduce.log", "reduce")]:
        (run,) = read_nccl_tests(DATA / name)
        factor = bus_factor(coll, run.ranks or 0)
        assert factor is not None
        checked = 0
        for r in run.rows:
            for _, p in r.placements():
                if p.algbw_gbs < 10:
                    continue
                lo = (p.busbw_gbs - 0.005) / (p.algbw_gbs + 0.005)
                hi = (p.busbw_gbs + 0.005) / (p.algbw_gbs - 0.005)
                assert lo <= factor <= hi, (name, r.size_bytes, p)
                checked += 1
        assert checked >= 10


def test_tag_output_prefixes_and_several_runs_in_one_file() -> None:
    runs = read_nccl_tests(DATA / "ncclebpf_socket-thread-validation.md.txt")
    assert len(runs) == 15
    assert all(r.avg_matches for r in runs)
    assert {r.collective for r in runs} == {"all_reduce", "all_gather"}
    assert all(r.ranks == 2 and r.nodes == 1 for r in runs)
    assert runs[0].source.endswith("#1") and runs[0].avg_busbw_file == 1.57614


def test_hand_edited_average_is_a_warning_naming_file_and_line() -> None:
    runs = read_nccl_tests(DATA / "ncclebpf_p3-allgather-reducescatter-sweep.md.txt")
    bad = [w for r in runs for w in r.warnings if "'~2.0'" in w]
    assert bad and "ncclebpf_p3-allgather-reducescatter-sweep.md.txt: line 260" in bad[0]
    aborted = [r for r in runs if r.avg_busbw_file is None and r.rows]
    assert aborted and all(r.truncated for r in aborted)


def test_missing_row_makes_the_average_mismatch_a_warning() -> None:
    text = (DATA / "superbench_nccl_allreduce.log").read_text().splitlines()
    cut = [ln for ln in text if not ln.strip().startswith("8589934592")]
    (run,) = parse_nccl_tests("\n".join(cut), source="edited.log")
    assert run.avg_matches is False
    assert any(w.startswith("edited.log: Avg bus bandwidth 68.4048") for w in run.warnings)


def test_truncated_run_with_failure() -> None:
    (run,) = read_nccl_tests(DATA / "nccltests_issue322_allreduce_truncated_failure.txt")
    assert run.truncated and run.avg_busbw_file is None
    assert run.sizes == [1073741824, 2147483648, 4294967296, 8589934592, 17179869184]
    assert len(run.errors) == 4 and "Test NCCL failure common.cu:1204" in run.errors[0]


def test_markdown_stripped_lines_and_a_cut_last_line() -> None:
    (run,) = read_nccl_tests(DATA / "nccltests_issue280_allreduce_markdown_truncated.txt")
    assert run.sizes == [8, 16, 32] and run.partial_sizes == (64,)
    assert run.truncated and run.ranks == 3
    assert run.errors and "common.cu:1005" in run.errors[0]


def test_in_place_na_and_warn_lines_between_listing_and_table() -> None:
    (sr,) = read_nccl_tests(DATA / "nccltests_issue214_sendrecv_excerpt.txt")
    assert sr.collective == "sendrecv" and sr.ranks == 2 and sr.nodes == 2
    assert all(r.in_place is not None and r.in_place.wrong is None for r in sr.rows)
    assert all(r.out_of_place is not None and r.out_of_place.wrong == 0 for r in sr.rows)
    assert sr.truncated  # an excerpt: no footer
    (bc,) = read_nccl_tests(DATA / "nccltests_issue82_broadcast_excerpt.txt")
    assert (bc.collective, bc.ranks, bc.nodes, bc.sizes) == ("broadcast", 2, 2, [8])
    assert bc.rows[0].root == 0 and len(bc.nccl_warn_lines) == 2


def test_failure_before_any_size() -> None:
    (run,) = read_nccl_tests(DATA / "nccl_issue473_allreduce_init_failure.txt")
    assert run.rows == () and run.truncated and run.ranks == 4
    assert "unhandled system error" in run.errors[0]


def test_not_nccl_tests_is_an_error_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("hello\nworld\n")
    with pytest.raises(TraceFormatError, match=r"notes\.txt: no nccl-tests output"):
        read_nccl_tests(p)
    with pytest.raises(TraceFormatError, match="cannot read"):
        read_nccl_tests(tmp_path / "absent.log")


# Documented-format fixtures (no public sample found): the -I 1 per-iteration columns and -T
# timestamps (src/util.cu of nccl-tests 2.19), RCCL's '*' on an error over its threshold.
PER_ITER = """# Collective test starting: all_reduce_perf
# nThread 1 nGpus 2 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 1 iters: 5
#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%
        1024           256     float     sum      -1    10.00    0.10    0.10       0     9.00    11.00    11.00     5.00    10.00    0.10    0.10       0     9.00    11.00    11.00     5.00
        2048           512     float     sum      -1    10.00    0.20    0.20       3     9.00    11.00    11.00     5.00    10.00    0.20    0.20       0     9.00    11.00    11.00     5.00
# Out of bounds values : 3 FAILED
# Avg bus bandwidth    : 0.15
"""


def test_per_iteration_columns_and_wrong_counts_documented_format() -> None:
    (run,) = parse_nccl_tests(PER_ITER, source="per-iter.log")
    assert run.sizes == [1024, 2048] and run.avg_matches
    p = run.rows[1].out_of_place
    assert p is not None and p.wrong == 3 and p.failed_check
    assert p.iter_stats == {"i_min_us": 9.0, "i_max_us": 11.0, "i_p99_us": 11.0, "i_cv_pct": 5.0}
    assert run.out_of_bounds == 3


def test_timestamps_and_rccl_asterisks_documented_format() -> None:
    text = ("# Collective test starting: reduce_scatter_perf\n"
            "  1048576  131072  float  sum  -1  20.0  52.43  45.88  2e-01*  19.0  55.19  48.29  0e+00"
            "  2025-01-01 10:00:00\n# Avg bus bandwidth    : 47.085\n")
    (run,) = parse_nccl_tests(text, source="rccl.log")
    oop, ip = run.rows[0].out_of_place, run.rows[0].in_place
    assert oop is not None and ip is not None
    assert oop.over_threshold and oop.wrong_kind == "error" and oop.failed_check
    assert not ip.failed_check and run.avg_matches


def test_collective_names() -> None:
    assert collective_from_name("./build/reduce_scatter_perf -b 8") == "reduce_scatter"
    assert collective_from_name("nccl_allreduce.log") == "all_reduce"
    assert collective_from_name("AllGather") == "all_gather"
    assert collective_from_name("alltoallv_perf") == "alltoallv"
    assert collective_from_name("notes") is None


def test_inspector_jsonl() -> None:
    runs = read_inspector(DATA / "nccl_inspector_readme_example.jsonl")
    by = {r.collective: r for r in runs}
    assert set(by) == {"reduce_scatter", "all_reduce"}
    rs, ar = by["reduce_scatter"], by["all_reduce"]
    assert (rs.ranks, rs.fmt, rs.sizes) == (32, "nccl-inspector", [65536])
    assert ar.ranks == 3
    # the plugin's busbw / algbw is the nccl-tests factor (six printed digits)
    for run in (rs, ar):
        p = run.rows[0].out_of_place
        assert p is not None
        factor = bus_factor(run.collective, run.ranks or 0)
        assert factor is not None
        assert abs(p.busbw_gbs / p.algbw_gbs - factor) < 5e-6 / p.algbw_gbs * 2 + 1e-5
    assert read_collective_file(str(DATA / "nccl_inspector_readme_example.jsonl"))[0].fmt == "nccl-inspector"


def test_inspector_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"header": {}}\n{not json\n')
    with pytest.raises(TraceFormatError, match=r"x\.jsonl: not NCCL Inspector output"):
        read_inspector(p)
    p.write_text('{"coll_perf": {"coll": "AllReduce", "coll_msg_size_bytes": "big", '
                 '"coll_exec_time_us": 1, "coll_busbw_gbs": 1}}\n'
                 '{"coll_perf": {"coll": "AllReduce", "coll_msg_size_bytes": 8, '
                 '"coll_exec_time_us": 1, "coll_busbw_gbs": 1}}\n')
    (run,) = read_inspector(p)
    assert run.sizes == [8]
    assert any("line 1: coll_msg_size_bytes" in w for w in run.warnings)


def test_nccl_debug_rings_trees_and_net() -> None:
    topo = parse_nccl_debug((DATA / "nccl_issue1412_debug_info_excerpt.log").read_text())
    assert sorted(topo.rings) == [0, 1, 2, 3, 4]
    assert all(sorted(r) == list(range(16)) for r in topo.rings.values())
    assert topo.nranks == 16 and topo.nnodes == 2 and len(topo.trees) == 8
    net = parse_nccl_debug((DATA / "nccl_issue629_debug_net_excerpt.log").read_text())
    assert net.net_devices == ("mlx5_0:1/RoCE", "mlx5_1:1/RoCE", "mlx5_2:1/RoCE", "mlx5_3:1/RoCE")
    assert (net.net_transport, net.network) == ("IB", "IB")
    assert len(net.hosts) == 2
    conn = parse_nccl_debug((DATA / "nccl_issue1814_debug_conn_excerpt.log").read_text())
    assert conn.transports == {"NET/IBext_v8/2": 3, "NET/IBext_v8/1": 2}
    assert conn.crosses_network is True
    assert parse_nccl_debug("nothing here").crosses_network is None


def _lines_of(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()



_SOURCES = ["superbench_nccl_allgather.log", "a3mega_allreduce_2node.txt",
            "ncclebpf_socket-thread-validation.md.txt", "superbench_nccl_broadcast.log"]
_JUNK = st.sampled_from([
    "host:1:2 [0] NCCL INFO Channel 00/02 :    0   1", "host:1:2 [0] NCCL WARN Net : Connection closed",
    "Test NCCL failure common.cu:1204 'unhandled cuda error'", "        8   N/A  float", "#", "",
    "garbage \x00 \ufffd", "  1024  256  float  sum  -1  N/A  N/A  N/A  N/A", "# Avg bus bandwidth    : nan",
    "12 34 float sum -1 1 2 3 4 5 6 7 8 9 10 11 12", "-1 -2 x"])


@settings(max_examples=60, deadline=None)
@given(src=st.sampled_from(_SOURCES), cut=st.floats(0, 1), drop=st.sets(st.integers(0, 400), max_size=8),
       junk=st.lists(st.tuples(st.integers(0, 400), _JUNK), max_size=6), chop=st.integers(0, 120))
def test_hostile_edits_never_crash(src: str, cut: float, drop: set[int],
                                   junk: list[tuple[int, str]], chop: int) -> None:
    """Truncation, dropped lines, junk lines and a line cut mid-way: the reader returns runs
    (or one TraceFormatError) and every row it returns is a size of the original file."""
    lines = [ln for i, ln in enumerate(_lines_of(src)) if i not in drop]
    for pos, text in junk:
        lines.insert(min(pos, len(lines)), text)
    lines = lines[: int(len(lines) * cut)]
    if lines:
        lines[-1] = lines[-1][:chop]
    sizes = {r.size_bytes for run in read_nccl_tests(DATA / src) for r in run.rows} | {1024, 12}
    try:
        runs = parse_nccl_tests("\n".join(lines), source="edited")
    except TraceFormatError as exc:
        assert str(exc).startswith("edited: ") and "\n" not in str(exc)
        return
    for run in runs:
        assert {r.size_bytes for r in run.rows} <= sizes
        assert all(w.startswith("edited") for w in run.warnings)
        if run.avg_busbw_file is not None and run.avg_matches is False:
            assert any("Avg bus bandwidth" in w for w in run.warnings)


def test_info_line_between_the_two_halves_of_a_row() -> None:
    """nccl-tests prints out-of-place and in-place without a newline between; an NCCL INFO
    line of another thread can land in between. Built from a real row (a3mega sample)."""
    lines = _lines_of("a3mega_allreduce_2node.txt")
    i = next(k for k, ln in enumerate(lines) if ln.strip().startswith("8589934592"))
    row = lines[i]
    cut = row.index("47743")
    lines[i:i + 1] = [row[:cut], "ztan-mig-235z:6899:6899 [0] NCCL INFO comm 0x1 rank 0 - Destroy COMPLETE",
                      row[cut:]]
    (run,) = parse_nccl_tests("\n".join(lines), source="split.txt")
    last = run.rows[-1]
    assert last.in_place is not None and last.in_place.busbw_gbs == 337.35
    assert run.avg_matches and not run.truncated
