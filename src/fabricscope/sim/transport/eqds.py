"""Receiver-driven credits (EQDS / NDP-like, UEC receiver credit CC) on the fluid.

The scheme follows EQDS (Olteanu et al., "An edge-queued datagram service for all datacenter
traffic", NSDI'22) as the UEC reference simulator runs it with ``-receiver_cc_only``
(github.com/ultraethernet/uet-htsim @ 40ccb05, ``htsim/sim/uec.cpp``: ``UecPullPacer``,
``UecSink::pull``, ``UecSrc::computePullTarget``, ``handlePull``, ``stopSpeculating``,
``initRccc``); this is an independent re-statement for a fluid, not a copy:

* a sender starts with *speculative* credit of ``W_max`` = 1.5 network BDPs (the whole flow if
  it is shorter) and sends it at line rate, unsolicited;
* its first packet tells the receiver what it still needs (the *pull target*: backlog plus
  retransmissions minus the credit it holds, capped so that credit held and requested stays
  under ``W_max``);
* each receiver NIC runs one *pull pacer* that grants credit at ``pull_rate`` (0.99) of its
  link rate, round robin over the senders that still need some (in the fluid: an equal share
  per step, water-filled so that a sender needing less leaves its share to the others);
* a grant reaches the sender one way later; the first one ends speculation (unspent
  speculative credit is dropped) and from then on every byte sent, retransmissions included,
  spends credit;
* the network is the lossy UEC switch of :mod:`~fabricscope.sim.transport.nscc` (per-port
  queues of one network BDP, trimming): a trimmed packet's header reaches the receiver, which
  NACKs it and pulls for its retransmission; a packet whose header is dropped too is re-sent
  after the sender's timeout and pulled for then.

Not modelled: ECN at the receiver (htsim's ``OversubscribedCC`` is off with
``-receiver_cc_only`` on a 1:1 fabric) and the pacer's *slow pulls* of speculative credit to
senders that have nothing queued (they only matter for a sender that later sends more).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import ConfigError

# columns of the per-flow state array
EQ_SPEC, EQ_SPEC_DONE, EQ_GRANTED, EQ_NEED = range(4)
N_EQ = 4
FILL_ROUNDS = 3  # water-filling rounds of a pacer's share per step


@dataclass(frozen=True, slots=True)
class EqdsConfig:
    """Receiver credit parameters (defaults: uet-htsim's ``UecPullPacer`` and ``initRccc``).

    pull_rate:      a receiver grants credit at this fraction of its link rate (htsim 0.99)
    max_window_bdp: speculative credit at start, and the cap on credit held plus requested,
                    in network BDPs (htsim 1.5)
    speculative:    send the first ``max_window_bdp`` unsolicited (EQDS); off: wait one RTT
                    for the first credit (NDP-style request first)
    """

    pull_rate: float = 0.99
    max_window_bdp: float = 1.5
    speculative: bool = True

    def validate(self, where: str = "eqds") -> None:
        if not 0 < self.pull_rate <= 1:
            raise ConfigError(f"{where}.pull_rate: must be in (0, 1], got {self.pull_rate!r}")
        if not self.max_window_bdp > 0:
            raise ConfigError(f"{where}.max_window_bdp: must be > 0, got {self.max_window_bdp!r}")


def init_state(wire_bytes: npt.NDArray[np.float64], max_window_bytes: float,
               cfg: EqdsConfig) -> npt.NDArray[np.float64]:
    """Per-flow state: speculative credit ``min(W_max, flow)`` (0 when not speculative)."""
    st = np.zeros((wire_bytes.shape[0], N_EQ))
    st[:, EQ_SPEC] = np.minimum(wire_bytes, max_window_bytes) if cfg.speculative else 0.0
    return st


@numba.njit(cache=True)
def sender_credit(est, f, sent, granted_arrived):  # type: ignore[no-untyped-def]
    """Credit flow ``f`` may spend now, given the cumulative grants that reached it. The first
    grant ends speculation: what was not yet sent of the speculative credit is dropped."""
    if granted_arrived > 0.0 and est[f, EQ_SPEC_DONE] == 0.0:
        est[f, EQ_SPEC_DONE] = 1.0
        est[f, EQ_SPEC] = min(sent, est[f, EQ_SPEC])
    return est[f, EQ_SPEC] + granted_arrived - sent


@numba.njit(cache=True)
def pull(est, f_state, f_size, f_rx, f_rtt_steps, start_step, sent, lost, hist_r,  # type: ignore[no-untyped-def]
         rx_rate, rx_scr, step, lcc, dt, wmax):
    """One step of every receiver's pull pacer: grant credit to the flows that need it.

    A receiver knows a flow once its first byte could have arrived (half the base RTT after
    it started). What it still needs is its bytes on the wire plus what was lost, minus the
    speculative bytes and the grants so far, capped so that unspent credit (held or on its
    way) stays under ``wmax``. Each receiver splits ``rx_rate x dt`` equally among the flows
    with a need, in ``FILL_ROUNDS`` rounds so that a small need leaves its share to the rest
    (``rx_scr`` rows: budget left, flows needing, share). The cumulative grant of each flow
    is written to ``hist_r[step % lcc]``: the sender reads it one way later.
    """
    n_f = f_size.shape[0]
    h = step % lcc
    left, cnt, share = rx_scr[0], rx_scr[1], rx_scr[2]
    for f in range(n_f):
        if f_state[f] != 1:
            continue
        r = f_rx[f]
        left[r] = rx_rate[r] * dt
        est[f, EQ_NEED] = 0.0
        d1 = max(min(f_rtt_steps[f] // 2, lcc - 1), 1)
        if step - start_step[f] < d1:
            continue
        spec = est[f, EQ_SPEC] if est[f, EQ_SPEC_DONE] != 0.0 else min(sent[f], est[f, EQ_SPEC])
        g = est[f, EQ_GRANTED]
        need = f_size[f] + lost[f] - spec - g
        unspent = g - (sent[f] - spec)
        need = min(need, wmax - unspent)
        if need > 1e-9:
            est[f, EQ_NEED] = need
    for _ in range(FILL_ROUNDS):
        for f in range(n_f):
            if f_state[f] == 1:
                cnt[f_rx[f]] = 0.0
        any_need = False
        for f in range(n_f):
            if f_state[f] == 1 and est[f, EQ_NEED] > 1e-9 and left[f_rx[f]] > 1e-9:
                cnt[f_rx[f]] += 1.0
                any_need = True
        if not any_need:
            break
        for f in range(n_f):
            if f_state[f] == 1 and cnt[f_rx[f]] > 0.0:
                share[f_rx[f]] = left[f_rx[f]] / cnt[f_rx[f]]
        for f in range(n_f):
            if f_state[f] != 1 or est[f, EQ_NEED] <= 1e-9:
                continue
            r = f_rx[f]
            if cnt[r] <= 0.0:
                continue
            x = min(est[f, EQ_NEED], share[r])
            est[f, EQ_GRANTED] += x
            est[f, EQ_NEED] -= x
            left[r] -= x
    for f in range(n_f):
        if f_state[f] == 1:
            hist_r[h, f] = est[f, EQ_GRANTED]
