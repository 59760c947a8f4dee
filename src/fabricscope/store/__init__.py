"""Storage: the embedded DuckDB file (edge)."""
