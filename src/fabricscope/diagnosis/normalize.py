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

* the health checks (issue 16) name what they compared; the knowledge base names the
  symptom: ``collective-busbw-low`` is the ``busbw-low`` of ``diagnosis/kb``; a failed RoCE
  MTU check is ``mtu-mismatch``, a PFC priority or trust check ``pfc-priority-mismatch`` and an
  ECN check ``ecn-disabled``, all configuration evidence (source ``config``) whatever
  instrument read them.

Pure; the inventory tells the peer port.
"""

from __future__ import annotations

from dataclasses import replace

from fabricscope.diagnosis.model import Observed
from fabricscope.fabric.inventory import Fabric

DISCARD_COUNTERS = frozenset({"in-discards", "out-discards", "dropped-pkts"})


#: finding kind -> (source, kind) of the knowledge base; RoCE PFC checks split by check name
_HEALTH_KINDS: dict[str, tuple[str, str]] = {
    "collective-busbw-low": ("collective", "busbw-low"),
    "roce-mtu": ("config", "mtu-mismatch"),
}


def _roce_pfc(check: str) -> tuple[str, str]:
    return ("config", "ecn-disabled") if check.startswith("ecn") else ("config", "pfc-priority-mismatch")


def normalize(o: Observed, fabric: Fabric) -> Observed:
    """``o`` with its kind / subject in the diagnosis' terms (the id is kept)."""
    f = o.finding
    health = _HEALTH_KINDS.get(f.kind)
    if health is None and f.kind == "roce-pfc-config":
        health = _roce_pfc(str(f.details.get("check", "")))
    if health is not None:
        return replace(o, source=health[0], finding=replace(f, kind=health[1]))
    if f.kind == "error-counter-increase" and str(f.details.get("counter", "")) in DISCARD_COUNTERS:
        return replace(o, finding=replace(f, kind="discard-increase"))
    if f.kind == "pause-storm" and f.details.get("direction") == "receives":
        peer = fabric.peer_port.get(f.subject)
        if peer is not None:
            ev = (f"pause frames received on {f.subject} are sent by its peer {peer}", *f.evidence)
            return replace(o, finding=replace(f, subject=peer, evidence=ev))
    return o
