"""The docstring examples of the core modules run as tests."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["providers.faux", "runtime.agent.tools", "runtime.agent.agent"])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert (result.failed, result.attempted > 0) == (0, True)
