"""The UEC link layer in the fluid transport engine: credit-based flow control and link-level retry."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.faults import Fault
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.transport import (
    BufferConfig,
    PfcConfig,
    TransportConfig,
    simulate_transport,
    transport_config_from_flags,
)
from fabricscope.sim.transport.config import LinkLayerConfig

_FAB = leaf_spine_fabric(leaves=4, hosts_per_leaf=8, spines=4)
_NICS = [n.id for n in _FAB.nics]
_LINK = 100e9 / 8 / 1e9  # bytes per ns


def _incast(n: int = 24, size: float = 1e6) -> Workload:
    return Workload("incast", tuple(FlowSpec(i, _NICS[i + 8], _NICS[0], size) for i in range(n)))


def test_cbfc_flags_replace_pfc_and_bad_values_are_errors() -> None:
    cfg = transport_config_from_flags(cc="dcqcn", cbfc=True)
    assert cfg is not None and cfg.link.cbfc and not cfg.pfc.enabled
    with pytest.raises(ConfigError, match="--cbfc: credit-based flow control replaces PFC"):
        transport_config_from_flags(cc="dcqcn", cbfc=True, pfc=True)
    with pytest.raises(ConfigError, match="--cbfc: only applies"):
        transport_config_from_flags(cc="ideal", cbfc=True)
    with pytest.raises(ConfigError, match="cbfc: credit-based flow control replaces PFC"):
        TransportConfig(cc="none", pfc=PfcConfig(enabled=True), link=LinkLayerConfig(cbfc=True)).validate()
    with pytest.raises(ConfigError, match=r"link\.credit: 100 B is smaller than one MTU"):
        TransportConfig(link=LinkLayerConfig(cbfc=True, credit_bytes=100.0)).validate()
    with pytest.raises(ConfigError, match="cannot back the credit"):
        simulate_transport(_FAB, _incast(2), config=TransportConfig(
            cc="none", buffer=BufferConfig(size_bytes=64e3), link=LinkLayerConfig(cbfc=True)))


def test_cbfc_is_lossless_without_pause_frames_and_holds_queues_to_the_credit() -> None:
    w = _incast()
    line = 24 * 1e6 / _LINK
    pfc = simulate_transport(_FAB, w, config=TransportConfig(cc="none", pfc=PfcConfig(enabled=True)))
    cb = simulate_transport(_FAB, w, config=TransportConfig(cc="none", link=LinkLayerConfig(cbfc=True)))
    lossy = simulate_transport(_FAB, w, config=TransportConfig(cc="none", buffer=BufferConfig(size_bytes=2e6)))
    for r in (pfc, cb):
        assert r.unfinished == 0 and r.stats.drop_bytes.sum() == 0.0
        assert line < np.nanmax(r.sim.fct_ns) < 1.05 * line  # the receiver's link stays busy
    assert pfc.stats.pause_frames.sum() > 0 and cb.stats.pause_frames.sum() == 0
    assert lossy.stats.drop_bytes.sum() > 0  # the same buffer without flow control drops
    # every switch queue stays within what credits allow: the receiver's port holds what its
    # 4 spine ingress ports were credited, the others one port's credit
    credit = 2 * _LINK * 1000 + 4 * 4096
    assert cb.stats.max_queue_bytes.max() <= 4 * credit * (1 + 1e-6)
    assert cb.stats.max_queue_bytes.max() < 0.05 * pfc.stats.max_queue_bytes.max()


def test_cbfc_is_lossless_on_a_three_tier_fat_tree_too() -> None:
    from fabricscope.fabric.builders import fat_tree_fabric

    ft = fat_tree_fabric(k=4)
    nics = [n.id for n in ft.nics]
    w = Workload("incast", tuple(FlowSpec(i, nics[i + 4], nics[0], 5e5) for i in range(12)))  # other pods
    r = simulate_transport(ft, w, config=TransportConfig(cc="dcqcn", link=LinkLayerConfig(cbfc=True)))
    line = 12 * 5e5 / _LINK
    assert r.unfinished == 0 and r.stats.drop_bytes.sum() == 0.0 and r.stats.pause_frames.sum() == 0
    assert line < np.nanmax(r.sim.fct_ns) < 1.1 * line
    credit = 2 * _LINK * 1000 + 4 * 4096
    # a switch egress holds at most what its ingress ports were credited (k/2 + k/2 ports)
    assert r.stats.max_queue_bytes.max() <= 4 * credit * (1 + 1e-6)


def test_cbfc_backs_pressure_up_to_the_senders_hop_by_hop() -> None:
    # a smaller credit still keeps every link lossless and busy enough for the incast
    w = _incast(8)
    r = simulate_transport(_FAB, w, config=TransportConfig(cc="none", link=LinkLayerConfig(cbfc=True, credit_bytes=8192)))
    assert r.unfinished == 0 and r.stats.drop_bytes.sum() == 0.0
    assert r.stats.max_queue_bytes.max() <= 4 * 8192 * (1 + 1e-6)
    # 8 KB of credit over a 2 us credit loop is below the link's 25 KB BDP: each hop runs at
    # most at 8 KB / loop, so the incast is slower than at line rate
    line = 8 * 1e6 / _LINK
    assert np.nanmax(r.sim.fct_ns) > 1.05 * line


def _gray(loss: float) -> tuple[Workload, list[Fault], int]:
    """Two flows over one host uplink that corrupts ``loss`` of its frames."""
    w = Workload("two", (FlowSpec(0, _NICS[8], _NICS[0], 2e6), FlowSpec(1, _NICS[9], _NICS[1], 2e6)))
    sub = next(f"{lk.a}|{lk.b}" for lk in _FAB.links if lk.a.startswith("host0008/"))
    e = _FAB.edge_index(sub.replace("|", "->"))
    return w, [Fault("gray-loss", sub, params={"loss": loss})], e


@pytest.mark.parametrize("cc", ["dcqcn", "nscc"])
def test_without_llr_corrupted_frames_are_lost_and_resent_end_to_end(cc: str) -> None:
    w, faults, e = _gray(0.02)
    r = simulate_transport(_FAB, w, config=TransportConfig(cc=cc), faults=faults)
    assert r.unfinished == 0
    served = r.stats.served_bytes[e]
    assert r.stats.drop_bytes[e] == pytest.approx(0.02 * served, rel=1e-6)
    assert r.stats.llr_retried_frames is not None and r.stats.llr_retried_frames.sum() == 0.0
    clean = simulate_transport(_FAB, w, config=TransportConfig(cc=cc))
    assert r.sim.fct_ns[0] > clean.sim.fct_ns[0]  # its flow re-sends what was lost
    assert r.sim.fct_ns[1] == pytest.approx(clean.sim.fct_ns[1], rel=1e-6)  # the other is untouched


def test_llr_retries_on_the_link_and_loses_nothing() -> None:
    w, faults, e = _gray(0.02)
    cfg = TransportConfig(cc="nscc", link=LinkLayerConfig(llr=True))
    r = simulate_transport(_FAB, w, config=cfg, faults=faults)
    assert r.unfinished == 0 and r.stats.drop_bytes[e] == 0.0
    assert r.stats.llr_retried_frames is not None
    retried = r.stats.llr_retried_frames[e] * 4096
    assert retried == pytest.approx(0.02 / 0.98 * r.stats.served_bytes[e], rel=0.02)
    # the link's time pays for the retries: the flow runs at ~98 % of line rate, no timeout
    clean = simulate_transport(_FAB, w, config=TransportConfig(cc="nscc"))
    e2e = simulate_transport(_FAB, w, config=TransportConfig(cc="nscc"), faults=faults)
    assert clean.sim.fct_ns[0] < r.sim.fct_ns[0] < e2e.sim.fct_ns[0]
    assert r.sim.fct_ns[0] == pytest.approx(clean.sim.fct_ns[0] / 0.98, rel=0.01)


def test_gray_loss_must_be_a_fraction_and_whole_run() -> None:
    w, _, _ = _gray(0.0)
    sub = next(f"{lk.a}|{lk.b}" for lk in _FAB.links if lk.a.startswith("host0008/"))
    with pytest.raises(ConfigError, match=r"params.loss must be in \[0, 1\)"):
        simulate_transport(_FAB, w, config=TransportConfig(cc="nscc"), faults=[Fault("gray-loss", sub, params={"loss": 1.0})])
    with pytest.raises(ConfigError, match="for the whole run only"):
        simulate_transport(_FAB, w, config=TransportConfig(cc="nscc"),
                           faults=[Fault("gray-loss", sub, start_ns=10, params={"loss": 0.1})])
