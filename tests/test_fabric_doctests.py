"""The examples in the fabric docstrings run and give what they show."""

from __future__ import annotations

import doctest

import pytest

from fabricscope.fabric import builders, catalog


@pytest.mark.parametrize("module", [builders, catalog])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0
