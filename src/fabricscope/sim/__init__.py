"""The simulator: flow-level engine, load balancing, workloads, faults, and the twin."""
