"""Diagnosis: findings from every instrument joined into incidents, explained by specialists
over a knowledge base (ARCHITECTURE.md, "diagnosis"). Pure: sees findings and the inventory,
never the twin or the simulator."""
