"""The ``fabricscope`` command line: parses arguments and calls the service layer, nothing else.

Each command group lives in its own module exposing ``register(app)``; heavy imports
(grpc, duckdb, numpy-heavy modules) happen inside the command functions so ``--help`` is fast.
Every :class:`~fabricscope.model.errors.FabricscopeError` becomes one clear line on stderr and
a non-zero exit, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer

from fabricscope.model.errors import FabricscopeError

app = typer.Typer(
    name="fabricscope",
    help=(
        "Keep AI training fabrics healthy: simulate what-ifs, stream gNMI telemetry, "
        "probe every ECMP path, and localize gray links and stragglers.\n\n"
        "Start with `fabricscope demo`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules, each with ``register(app)``. Order is the order shown in --help.
_COMMAND_MODULES = (
    "fabricscope.cli.demo",
    "fabricscope.cli.topo",
    "fabricscope.cli.sim",
    "fabricscope.cli.gnmi",
    "fabricscope.cli.probe",
    "fabricscope.cli.lab",
    "fabricscope.cli.straggler",
)



@app.callback()
def _root() -> None:
    """fabricscope: simulate, observe, probe and localize on AI training fabrics."""


for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    """Console entry point: run the app, turning our errors into one line and exit code 2."""
    try:
        app()
    except FabricscopeError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(2)
