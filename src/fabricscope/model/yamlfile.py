"""Read a user's YAML file: one ConfigError line naming the file, the position and the problem.

PyYAML's own message quotes the offending text, which can be a secret in a config file, so
only its problem and position are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fabricscope.model.errors import ConfigError

__all__ = ["parse_yaml", "read_yaml"]


def parse_yaml(text: str, *, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """``yaml.safe_load(text)``; malformed YAML is ``error("SOURCE:LINE:COL: malformed YAML: ...")``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{source}{where}: malformed YAML: {problem}") from None
    except RecursionError:
        raise error(f"{source}: malformed YAML: nested too deeply") from None


def read_yaml(path: str | Path, *, what: str, error: type[ConfigError] = ConfigError) -> Any:
    """Read and parse the YAML file ``path`` (``what`` names it in errors: "design file")."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{p}: cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{p}: not UTF-8 text (byte {exc.start}); expected a YAML {what}") from None
    return parse_yaml(text, source=str(p), error=error)
