"""Optics readers: real ethtool / SONiC fixtures parse to the values printed in them; bad input warns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.optics.catalog import (
    catalog_filled,
    default_thresholds,
    fill_thresholds,
    part_class,
)
from fabricscope.optics.history import ALL_METRICS, THRESHOLD_COLUMNS, FleetHistory, module_table
from fabricscope.optics.readers import (
    parse_ethtool_json,
    parse_ethtool_module,
    read_ethtool_files,
    read_history,
    read_labels,
    read_sonic_state_db,
    write_history,
)

DATA = Path(__file__).parent / "data" / "optics"
TS = 1_700_000_000_000_000_000


def _parse(name: str):  # type: ignore[no-untyped-def]
    return parse_ethtool_module((DATA / name).read_text(), device="d", port="p", ts_ns=TS,
                                source=name)


# --- real ethtool text outputs (values typed by hand from the files) ---------------------------

def test_sff8472_i40e_fs_sr() -> None:
    m = _parse("host-i40e__eth28.txt")
    assert (m.module_type, m.vendor, m.part_number, m.serial) == (
        "SFF-8472", "FS", "SFP-10GSR-85", "F2020533679")
    assert m.media == "10GBASE-SR"
    assert m.lanes == 1
    assert m.tx_bias_ma == (6.09,) and m.tx_power_dbm == (-1.96,) and m.rx_power_dbm == (-1.88,)
    assert m.temperature_c == 39.18 and m.vcc_v == 3.3544
    assert m.thresholds["rx_power_dbm_low_alarm"] == -14.10
    assert m.thresholds["tx_bias_ma_high_warn"] == 12.0
    assert m.thresholds["vcc_v_low_warn"] == 3.135
    assert len(m.thresholds) == 20
    assert m.warnings == ()


def test_sff8472_bnxt_garbage_thresholds_dropped() -> None:
    m = _parse("host-bnxt__eth418.txt")
    assert m.tx_bias_ma == (99.168,) and m.rx_power_dbm == (4.36,) and m.vcc_v == 0.2287
    # bias high alarm 15.39 < high warning 36.006 and rx sets all -0.85: not real thresholds
    assert m.thresholds == {}
    text = "\n".join(m.warnings)
    assert "tx_bias_ma thresholds" in text and "out of order" in text
    assert "rx_power_dbm thresholds: all -0.85" in text


def test_sff8636_mellanox_qsfp28_sr4() -> None:
    m = _parse("sas2-5s50__swp14.txt")
    assert m.module_type == "SFF-8636" and m.media == "100GBASE-SR4"
    assert m.serial == "MT1708FT01255" and m.lanes == 4
    assert m.rx_power_dbm == (-0.12, -0.09, 0.55, 0.55)
    assert m.tx_power_dbm[1] == 1.20
    assert m.tx_bias_ma == (6.75,) * 4
    assert m.thresholds["rx_power_dbm_low_alarm"] == -13.31
    assert m.thresholds["tx_power_dbm_high_alarm"] == 5.40
    assert m.warnings == ()


def test_sff8636_finisar_dark_lanes_are_nan_and_warned() -> None:
    m = _parse("man1-4s7__swp13.txt")
    assert m.module_type == "SFF-8636" and m.vendor == "FINISAR CORP"
    assert m.tx_bias_ma == (0.0,) * 4
    assert all(math.isnan(v) for v in m.tx_power_dbm + m.rx_power_dbm)
    assert m.thresholds["temperature_c_high_alarm"] == 75.0
    assert m.thresholds["vcc_v_low_alarm"] == 2.84
    assert "tx_bias_ma_high_alarm" not in m.thresholds  # all 0.000 mA: not programmed
    text = "\n".join(m.warnings)
    assert "man1-4s7__swp13.txt:36: tx_power_dbm: 0.0000 mW / -inf dBm: no light" in text
    assert "(and 3 more)" in text


def test_cmis_arista_400g_xdr4_wrapped_mail_lines() -> None:
    m = _parse("cmis-arista-qdd-400g-xdr4.txt")
    assert m.module_type == "CMIS" and m.part_number == "QDD-400G-XDR4"
    assert m.serial == "XKT242211481" and m.lanes == 8
    assert m.temperature_c == 70.49  # the value line is wrapped ("158.89 \ndegrees F")
    assert m.tx_bias_ma[3] == 110.1 and m.rx_power_dbm[:4] == (3.52, 2.70, 2.65, 2.60)
    assert all(math.isnan(v) for v in m.rx_power_dbm[4:])
    assert m.thresholds["temperature_c_high_alarm"] == 75.0
    assert m.thresholds["rx_power_dbm_low_warn"] == -6.90
    assert len(m.thresholds) == 20


def test_json_sff8636_and_cmis() -> None:
    q = parse_ethtool_json((DATA / "sw-mlnx__swp13.json").read_text(), device="d", port="p",
                           ts_ns=TS, source="q")[0]
    assert q.module_type == "SFF-8636" and q.serial == "MT1915FT03913"
    assert q.rx_power_dbm[0] == pytest.approx(10 * math.log10(0.0449))
    assert q.temperature_c == 56.9805  # the reading, not the duplicate threshold object
    assert q.thresholds["temperature_c_high_alarm"] == 80.0
    assert q.thresholds["tx_bias_ma_low_alarm"] == 5.492
    assert q.thresholds["rx_power_dbm_low_warn"] == pytest.approx(10 * math.log10(0.0933))
    assert any("no light (0 mW)" in w for w in q.warnings)
    c = parse_ethtool_json((DATA / "sw-mlnx__swp23.json").read_text(), device="d", port="p",
                           ts_ns=TS, source="c")[0]
    assert c.module_type == "CMIS" and c.lanes == 8 and c.vendor == "FINISAR CORP."
    assert c.tx_power_dbm == pytest.approx((-40.0,) * 8)
    assert c.thresholds["vcc_v_high_alarm"] == 3.465


# --- broken inputs -------------------------------------------------------------------------------

def test_truncated_output_keeps_what_was_read() -> None:
    lines = (DATA / "sas2-5s50__swp14.txt").read_text().splitlines()
    m = parse_ethtool_module("\n".join(lines[:38]), device="d", port="p", ts_ns=TS, source="t")
    assert m.lanes == 4 and m.tx_bias_ma == (6.75,) * 4
    assert m.rx_power_dbm[:2] == (-0.12, -0.09) and math.isnan(m.rx_power_dbm[3])
    text = "\n".join(m.warnings)
    assert "t:38: rx_power_dbm: lane 2: missing" in text
    assert "thresholds: (none printed)" in text


def test_na_value_and_unknown_type_warned() -> None:
    text = (DATA / "sas2-5s50__swp14.txt").read_text()
    text = text.replace("0.9798 mW / -0.09 dBm", "N/A").replace("0x11 (QSFP28)", "0x7f (XYZ)")
    m = parse_ethtool_module(text, device="d", port="p", ts_ns=TS, source="x")
    assert math.isnan(m.rx_power_dbm[1]) and m.rx_power_dbm[2] == 0.55
    joined = "\n".join(m.warnings)
    assert "x:38: Rcvr signal avg optical power(Channel 2): N/A: no reading" in joined
    assert "x:1: Identifier: 0x7f (XYZ): unknown module type" in joined


def test_read_ethtool_files_names_and_header(tmp_path: Path) -> None:
    a = tmp_path / "leaf1__Ethernet4.txt"
    a.write_text((DATA / "sas2-5s50__swp14.txt").read_text())
    b = tmp_path / "anything.txt"
    b.write_text("# device=leaf2 port=Ethernet8 ts=2024-01-02T03:04:05Z\n"
                 + (DATA / "host-i40e__eth28.txt").read_text())
    h = read_ethtool_files([a, b, tmp_path / "missing__x.txt"], ts_ns=TS)
    mt = h.modules
    assert set(zip(mt.device, mt.port, strict=True)) == {("leaf1", "Ethernet4"),
                                                         ("leaf2", "Ethernet8")}
    i = mt.index()[("leaf2", "Ethernet8")]
    assert set(h.ts[h.module == i].tolist()) == {1_704_164_645_000_000_000}
    assert len(h) == 5 and sorted(mt.lanes.tolist()) == [1, 4]
    assert any("missing__x.txt: file:" in w for w in h.warnings)
    j = mt.index()[("leaf1", "Ethernet4")]
    assert mt.thresholds["rx_power_dbm_low_alarm"][j] == pytest.approx(-13.31)


# --- SONiC ---------------------------------------------------------------------------------------

def test_sonic_mock_tables() -> None:
    h = read_sonic_state_db(DATA / "sonic-utilities-state_db-transceivers.json", ts_ns=TS)
    mt = h.modules
    assert mt.port == ("Ethernet0", "Ethernet8", "Ethernet72")
    i0, i8 = mt.index()[(mt.device[0], "Ethernet0")], mt.index()[(mt.device[0], "Ethernet8")]
    rx0 = h.metrics["rx_power_dbm"][h.module == i0]
    assert rx0.tolist() == pytest.approx([0.3802, -0.4871, -0.0860, 0.3830], abs=1e-6)
    assert np.isnan(h.metrics["tx_power_dbm"][h.module == i0]).all()  # "N/A" in the file
    assert mt.serial[i8] == "INKAO2900002A" and mt.lanes[i8] == 8
    assert h.metrics["laser_temp_c"][h.module == i8][0] == pytest.approx(47.7265625)
    assert mt.thresholds["rx_power_dbm_low_alarm"][i0] == pytest.approx(-13.5067)
    assert mt.thresholds["tx_power_dbm_high_warn"][i8] == pytest.approx(4.9999)
    assert any("Ethernet0: tx_power_dbm: N/A" in w for w in h.warnings)


def test_sonic_db_dump_shape_na_inf_and_pm() -> None:
    h = read_sonic_state_db(DATA / "synthetic-sonic-db-dump.json", ts_ns=TS)
    mt = h.modules
    assert mt.device == ("synthetic-leaf01", "synthetic-leaf01")
    assert mt.media == ("100GBASE-SR4", "400GBASE-FR4")
    i0, i8 = 0, 1
    rx = h.metrics["rx_power_dbm"][h.module == i0]
    assert rx[0] == pytest.approx(-1.25) and np.isnan(rx[1]) and np.isnan(rx[2])
    assert h.metrics["pre_fec_ber"][h.module == i8][0] == pytest.approx(2.5e-8)
    assert np.isnan(h.metrics["tx_power_dbm"][h.module == i8][7])
    assert math.isnan(mt.thresholds["tx_bias_ma_high_alarm"][i0])
    text = "\n".join(h.warnings)
    assert "rx_power_dbm: -inf" in text and "Ethernet16" in text and "lanes [8]" in text


# --- history table -------------------------------------------------------------------------------

def _fleet(rng: np.random.Generator, n_mod: int = 6, n_lane: int = 4, n_t: int = 50
           ) -> FleetHistory:
    module = np.repeat(np.arange(n_mod, dtype=np.int32), n_lane * n_t)
    lane = np.tile(np.repeat(np.arange(n_lane, dtype=np.int32), n_t), n_mod)
    ts = np.tile(np.arange(n_t, dtype=np.int64) * 600_000_000_000 + TS, n_mod * n_lane)
    n = module.shape[0]
    met = {m: rng.normal(0, 1, n).astype(np.float32) for m in ALL_METRICS}
    met["fec_uncorrectable"] = np.tile(np.arange(n_t, dtype=np.float32), n_mod * n_lane)
    met["crc_errors"] = met["fec_uncorrectable"].copy()
    rows = [{"device": f"leaf{i}", "port": "Ethernet0", "vendor": "V", "part_number": "P",
             "serial": f"S{i}", "media": "400GBASE-DR4", "rx_power_dbm_low_alarm": -9.0 - i}
            for i in range(n_mod)]
    return FleetHistory(ts=ts, module=module, lane=lane, metrics=met,
                        modules=module_table(rows, lanes=[n_lane] * n_mod))


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    h = _fleet(np.random.default_rng(7))
    p = tmp_path / f"h{suffix}"
    write_history(h, p)
    g = read_history(p)
    assert g.warnings == ()
    np.testing.assert_array_equal(g.ts, h.ts)
    np.testing.assert_array_equal(g.lane, h.lane)
    assert g.modules.serial == h.modules.serial
    for m in ALL_METRICS:
        np.testing.assert_allclose(g.metrics[m], h.metrics[m], rtol=1e-6)
    np.testing.assert_allclose(g.modules.thresholds["rx_power_dbm_low_alarm"],
                               h.modules.thresholds["rx_power_dbm_low_alarm"])
    assert np.isnan(g.modules.thresholds["vcc_v_high_alarm"]).all()


def test_duplicates_clock_jump_resets_warned(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    h = _fleet(np.random.default_rng(3), n_mod=2, n_lane=1, n_t=10)
    p = tmp_path / "h.csv"
    write_history(h, p)
    t = pacsv.read_csv(p)
    n = t.num_rows
    # repeat rows 0..2 in place, swap rows 5 and 6 (clock jump), reset a counter at row 8
    idx = [0, 0, 1, 1, 2, 2, *range(3, n)]
    idx[8], idx[9] = idx[9], idx[8]
    t = t.take(pa.array(idx))
    fec = t.column("fec_uncorrectable").to_pylist()
    fec[11] = 0.0
    t = t.set_column(t.schema.get_field_index("fec_uncorrectable"), "fec_uncorrectable",
                     pa.array(fec))
    t = t.append_column("extra_col", pa.array([1] * t.num_rows))
    pacsv.write_csv(t, p)
    g = read_history(p)
    text = "\n".join(g.warnings)
    assert "3 duplicated samples" in text
    assert "1 samples go back in time" in text
    assert "fec_uncorrectable: 1 counter resets" in text
    assert "extra_col: not history columns: ignored" in text
    assert len(g) == n and bool(np.all(np.diff(g.ts[g.module == 0]) > 0))


def test_missing_column_and_iso_ts(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("ts,device,port,lane,temperature_c,vcc_v,tx_bias_ma,tx_power_dbm\n1,a,b,0,1,2,3,4\n")
    with pytest.raises(ConfigError, match=r"bad.csv: required column 'rx_power_dbm'"):
        read_history(p)
    q = tmp_path / "iso.csv"
    q.write_text("ts,device,port,lane,temperature_c,vcc_v,tx_bias_ma,tx_power_dbm,rx_power_dbm\n"
                 "2024-01-02T03:04:05Z,a,b,0,40,3.3,6,1,-2\n"
                 "2024-01-02T03:14:05+00:00,a,b,0,41,3.3,6,1,-2.5\n")
    g = read_history(q)
    assert g.ts.tolist() == [1_704_164_645_000_000_000, 1_704_165_245_000_000_000]
    assert any("ISO-8601" in w for w in g.warnings)


def test_labels(tmp_path: Path) -> None:
    p = tmp_path / "labels.csv"
    p.write_text("device,port,serial,failure_time,cause\n"
                 "leaf1,Ethernet0,S1,1704164645000000000,laser\n"
                 "leaf2,Ethernet4,S2,2024-01-02T03:04:05Z,\n"
                 ",,,2024-01-02T00:00:00Z,x\n"
                 "leaf3,Ethernet8,S3,yesterday,dirty\n")
    lb = read_labels(p)
    assert lb.device == ("leaf1", "leaf2") and lb.cause == ("laser", "")
    assert lb.failure_ts.tolist() == [1_704_164_645_000_000_000] * 2
    assert any(":4: device/port/serial" in w for w in lb.warnings)
    assert any(":5: failure_time: yesterday" in w for w in lb.warnings)
    q = tmp_path / "nolabel.csv"
    q.write_text("device,port,when\nx,y,1\n")
    with pytest.raises(ConfigError, match="serial"):
        read_labels(q)


# --- catalog -------------------------------------------------------------------------------------

def test_catalog_classes_and_fill() -> None:
    assert part_class("100GBASE-SR4").name == "100G-SR4"
    assert part_class("", "QDD-400G-XDR4").name == "400G-DR4"
    assert part_class("800G 2xFR4").name == "800G-2xFR4"
    assert part_class("something else").name == "generic"
    for media in ("100GBASE-SR4", "400GBASE-DR4", "400GBASE-SR8", "800GBASE-DR8", ""):
        d = default_thresholds(media)
        assert set(d) == set(THRESHOLD_COLUMNS)
        for m in ("temperature_c", "vcc_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm"):
            assert d[f"{m}_low_alarm"] < d[f"{m}_low_warn"] < d[f"{m}_high_warn"] \
                < d[f"{m}_high_alarm"]
    # the SR4 class reproduces the Mellanox SR4 module's own programmed tx / rx values
    own = _parse("sas2-5s50__swp14.txt").thresholds
    sr4 = default_thresholds("100GBASE-SR4")
    for c in ("tx_power_dbm_high_alarm", "tx_power_dbm_low_warn", "rx_power_dbm_high_warn"):
        assert sr4[c] == pytest.approx(own[c], abs=0.01)
    h = read_ethtool_files([DATA / "man1-4s7__swp13.txt"], ts_ns=TS)
    filled = fill_thresholds(h.modules)
    src = catalog_filled(filled)
    assert filled.thresholds["temperature_c_high_alarm"][0] == 75.0  # the module's own
    assert not src["temperature_c_high_alarm"][0]
    assert src["tx_bias_ma_high_alarm"][0] and src["rx_power_dbm_low_alarm"][0]
    assert not any(np.isnan(filled.thresholds[c][0]) for c in THRESHOLD_COLUMNS)
