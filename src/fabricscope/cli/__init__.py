"""The ``fabricscope`` command line: parses arguments and calls the service layer, nothing else.

Each command group lives in its own module exposing ``register(app)``; heavy imports
(grpc, duckdb, numpy-heavy modules) happen inside the command functions so ``--help`` is fast.
Every :class:`~fabricscope.model.errors.FabricscopeError` becomes one clear line on stderr and
exit 2, never a traceback; an OSError on a user's path names the path (exit 2); Ctrl-C exits
130 and SIGTERM 143 after the command's own cleanup ran.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import Any

# gRPC's C core writes its own log lines to stderr (absl "WARNING: All log messages before
# absl::InitializeLog() ..." and retry chatter); a terminal user should see only ours. Set
# before anything imports grpc; a user who wants them sets GRPC_VERBOSITY themselves.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import typer
import typer.exceptions

from fabricscope import __version__
from fabricscope.model.errors import FabricscopeError

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_INTERNAL = 70  # EX_SOFTWARE: a defect in fabricscope, not a user mistake

app = typer.Typer(
    name="fabricscope",
    help=(
        "Keep AI training fabrics healthy: simulate what-ifs, stream gNMI telemetry, "
        "probe every ECMP path, and localize gray links and stragglers.\n\n"
        "Start with `fabricscope demo`; every command has --help with examples."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain click help: rich markup ate "[...]" in help texts (gNMI paths, fault syntax),
    # and rich re-wrapped examples mid-command; see _protect_examples for the wrapping.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

# Command modules, each with ``register(app)``. Order is the order shown in --help.
_COMMAND_MODULES = (
    "fabricscope.cli.demo",
    "fabricscope.cli.topo",
    "fabricscope.cli.sim",
    "fabricscope.cli.design",
    "fabricscope.cli.gnmi",
    "fabricscope.cli.cluster",
    "fabricscope.cli.worker",
    "fabricscope.cli.probe",
    "fabricscope.cli.lab",
    "fabricscope.cli.straggler",
    "fabricscope.cli.optics",
    "fabricscope.cli.collective",
    "fabricscope.cli.preflight",
    "fabricscope.cli.roce",
    "fabricscope.cli.slo",
    "fabricscope.cli.supervise",
    "fabricscope.cli.diagnose",
    "fabricscope.cli.incidents",
    "fabricscope.cli.serve",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fabricscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", is_eager=True, callback=_version,
        help="Print the version and exit.",
    ),
) -> None:
    """fabricscope: simulate, observe, probe and localize on AI training fabrics."""


for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM so ``finally`` blocks and context managers run.

    A BaseException (like KeyboardInterrupt), so ``except Exception`` in library code does
    not swallow it. Services that install their own SIGTERM handler (collector, agent,
    target) override this one while they run and exit 143 themselves.
    """


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def _is_code_line(line: str) -> bool:
    s = line.strip()
    return line.startswith("  ") or s.startswith(("fabricscope ", "$ ", "FABRICSCOPE_"))


def _protect_examples(text: str | None) -> str | None:
    r"""Keep example paragraphs as written: click re-wraps every paragraph not led by ``\b``.

    A paragraph whose lines are indented (or start with ``fabricscope``) is a code example;
    wrapping it mid-command made pasted examples fail.
    """
    if not text:
        return text
    paras = text.split("\n\n")
    out = []
    for p in paras:
        lines = [ln for ln in p.split("\n") if ln.strip()]
        if lines and not p.startswith("\b") and all(_is_code_line(ln) for ln in lines):
            p = "\b\n" + p
        out.append(p)
    return "\n\n".join(out)


def _unescape(text: str | None) -> str | None:
    # Help texts written for rich markup escape "[" as "\\["; plain help shows it as is.
    return text.replace("\\[", "[") if text else text


def _element_type(label: object) -> object:
    if isinstance(label, str):
        m = re.fullmatch(r"(<?)list\[(.*)\](>?)", label)
        if m:
            return f"{m.group(1)}{m.group(2).lower()}{m.group(3)}"
    return label


def _prepare(cmd: Any) -> None:
    """Help as a user pastes it: examples unwrapped, NAME metavars, element types for lists.

    Duck-typed: typer vendors its own click, so isinstance against ``click`` would miss.
    """
    cmd.help = _protect_examples(_unescape(cmd.help))
    if getattr(cmd, "epilog", None):
        cmd.epilog = _protect_examples(_unescape(cmd.epilog))
    for param in getattr(cmd, "params", None) or []:
        param.help = _unescape(getattr(param, "help", None))
        if param.param_type_name == "argument":
            if param.metavar is None:
                param.metavar = (param.name or "ARG").upper()
            elif param.metavar.startswith("[") and param.metavar.endswith("]"):
                param.metavar = param.metavar[1:-1]  # click adds the brackets of an optional
        if getattr(param, "multiple", False) or getattr(param, "nargs", 1) != 1:
            # "<list[str]>" reads as Python; a repeatable value is shown as its element type.
            orig = param.display_type
            param.display_type = lambda ctx, _orig=orig: _element_type(_orig(ctx))
    for sub in (getattr(cmd, "commands", None) or {}).values():
        _prepare(sub)


def get_command() -> Any:
    """The click command tree of the app, with example paragraphs protected from re-wrapping."""
    cmd = typer.main.get_command(app)
    _prepare(cmd)
    return cmd


def _one_line_os_error(exc: OSError) -> str:
    what = exc.strerror or str(exc)
    where = exc.filename if exc.filename is not None else ""
    return f"{what}: {where}" if where else what


def main() -> None:
    """Console entry point: run the app, turning every failure into one line and an exit code.

    ``FabricscopeError`` and ``OSError`` (a path the user gave) are user mistakes: one line,
    exit 2. Ctrl-C exits 130, SIGTERM 143. Anything else is a defect in fabricscope: one line
    saying so (exit 70); ``FABRICSCOPE_DEBUG=1`` shows the traceback.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    cmd = get_command()
    try:
        rc = cmd.main(prog_name="fabricscope", standalone_mode=False)
    except typer.exceptions.Abort:  # click turns Ctrl-C into Abort
        typer.secho("interrupted", err=True, fg=typer.colors.YELLOW)
        sys.exit(EXIT_INTERRUPTED)
    except typer.exceptions.TyperException as exc:  # usage errors: click's own message, exit 2
        exc.show()  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", EXIT_ERROR))
    except typer.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except FabricscopeError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True, fg=typer.colors.YELLOW)
        sys.exit(EXIT_INTERRUPTED)
    except Terminated:
        typer.secho("terminated", err=True, fg=typer.colors.YELLOW)
        sys.exit(EXIT_TERMINATED)
    except BrokenPipeError:
        # `fabricscope ... | head`: the reader left; not an error worth a line.
        with contextlib.suppress(Exception):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        sys.exit(0)
    except OSError as exc:
        typer.secho(f"error: {_one_line_os_error(exc)}", err=True, fg=typer.colors.RED)
        sys.exit(EXIT_ERROR)
    except Exception as exc:  # a defect: say so in one line, keep the traceback on request
        if os.environ.get("FABRICSCOPE_DEBUG"):
            traceback.print_exc()
        typer.secho(
            f"internal error (a fabricscope bug, please report it): {type(exc).__name__}: {exc}"
            " — set FABRICSCOPE_DEBUG=1 to see the traceback",
            err=True, fg=typer.colors.RED,
        )
        sys.exit(EXIT_INTERNAL)
    sys.exit(rc if isinstance(rc, int) else 0)
