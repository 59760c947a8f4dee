"""Workload generators (collectives, placement, jobs, traffic matrices); public API in ``sim.workloads``."""
