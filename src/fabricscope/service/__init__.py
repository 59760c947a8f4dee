"""Composition: wires sources -> pipeline -> store -> analysis; the demo's closed loop."""
