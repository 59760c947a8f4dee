"""The time-advancing digital twin: state and counters, probe transport, trace generator (uses sim)."""
