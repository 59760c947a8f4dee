"""Streaming telemetry: gNMI paths, processors and detectors (pure); target, collector, sinks (edge)."""
