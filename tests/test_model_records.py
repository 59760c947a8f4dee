"""Records and the error tree: small invariants every layer relies on."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.model import (
    ConfigError,
    FabricscopeError,
    Finding,
    FiveTuple,
    InventoryError,
    OpTiming,
    ProbeSample,
    UnroutableError,
)


def test_error_tree_is_one_family() -> None:
    assert issubclass(InventoryError, ConfigError)
    assert issubclass(ConfigError, FabricscopeError)
    assert issubclass(UnroutableError, FabricscopeError)


@given(
    send=st.integers(0, 10**15),
    out=st.integers(0, 10**9),
    proc=st.integers(0, 10**9),
    back=st.integers(0, 10**9),
)
def test_network_rtt_excludes_responder_time(send: int, out: int, proc: int, back: int) -> None:
    s = ProbeSample(
        "a", "b", FiveTuple("198.18.0.1", "198.18.0.2", 1000, 2000), 1,
        t_send_ns=send, t_resp_rx_ns=send + out, t_resp_tx_ns=send + out + proc,
        t_recv_ns=send + out + proc + back,
    )
    assert s.network_rtt_ns == out + back
    assert not s.lost


def test_lost_probe_has_no_rtt() -> None:
    s = ProbeSample("a", "b", FiveTuple("x", "y", 1, 2), 0, 5, None, None, None)
    assert s.lost and s.network_rtt_ns is None


def test_records_are_frozen() -> None:
    f = Finding("gray-link", "a:eth1->b:eth2", 0.9, (0, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.score = 0.1  # type: ignore[misc]
    op = OpTiming("job", 3, 1, "allreduce", (0, 1, 2, 3), 0, 100, 350, 1 << 20)
    assert op.duration_ns == 250
