"""The docstring examples of the memory modules run as tests."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    ["runtime.reply.sender", "runtime.memory.transcripts", "runtime.session.chat_history"],
)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert (result.failed, result.attempted > 0) == (0, True)
