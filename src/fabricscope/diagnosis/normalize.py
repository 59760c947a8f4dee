"""Findings in the diagnosis' terms: one meaning per finding kind, the subject the evidence
points at.

Instruments name what they measured; the diagnosis needs what it means:

* ``error-counter-increase`` on a discard counter (``in-discards``, ``out-discards``,
  ``dropped-pkts``) is a full queue tail-dropping, not a corrupting link: it becomes
  ``discard-increase`` (CorrOpt, Zhuo et al. SIGCOMM'17, separates corruption from congestion
  loss the same way: they have different causes and different repairs);
* ``pause-storm`` on a port that *receives* the pause frames is evidence about the port that
  *sends* them, its cable peer (IEEE 802.1Qbb: a PFC pause travels one hop): the subject
  becomes the peer port, and the evidence says so.

Pure; the inventory tells the peer port.
"""

from __future__ import annotations

from dataclasses import replace

from fabricscope.diagnosis.model import Observed
from fabricscope.fabric.inventory import Fabric

DISCARD_COUNTERS = frozenset({"in-discards", "out-discards", "dropped-pkts"})


def normalize(o: Observed, fabric: Fabric) -> Observed:
    """``o`` with its kind / subject in the diagnosis' terms (the id is kept)."""
    f = o.finding
    if f.kind == "error-counter-increase" and str(f.details.get("counter", "")) in DISCARD_COUNTERS:
        return replace(o, finding=replace(f, kind="discard-increase"))
    if f.kind == "pause-storm" and f.details.get("direction") == "receives":
        peer = fabric.peer_port.get(f.subject)
        if peer is not None:
            ev = (f"pause frames received on {f.subject} are sent by its peer {peer}", *f.evidence)
            return replace(o, finding=replace(f, subject=peer, evidence=ev))
    return o
