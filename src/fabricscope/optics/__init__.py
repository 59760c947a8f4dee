"""Optics capability: transceiver DOM readings -> degrading-optic findings (pure; never the twin)."""

from fabricscope.optics.dom import KP4_BER_LIMIT, DomDetector, DomThresholds

__all__ = ["KP4_BER_LIMIT", "DomDetector", "DomThresholds"]
