"""Fixtures of the model tests: the provider tests' replay server (the image tool calls the OpenAI
Images API through it)."""

from tests.providers.conftest import replay

__all__ = ["replay"]
