"""fabricscope: keep AI training and inference fabrics healthy.

Layers (see docs/design/architecture.md): ``model`` -> ``fabric`` -> ``sim`` (pure core),
capabilities (``telemetry``, ``probe``, ``straggler``) with pure logic separate from edge I/O,
``store`` (DuckDB), ``service`` (composition) and ``cli`` (entry point).
"""

__version__ = "0.1.0"
