"""Registration (docs/decisions.md#llm-api-registry): importing registers nothing;
register_builtin_providers does it all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import providers, providers.openai_completions, providers.anthropic_messages
import providers.google_generative_ai, providers.openai_images, providers.faux
from runtime.llm.registry import list_api_providers
print(list_api_providers())
print(providers.register_builtin_providers())
print(list_api_providers())
"""


def test_import_has_no_side_effects_and_register_registers_all() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True)
    apis = ["anthropic-messages", "faux", "google-generative-ai", "openai-completions"]
    assert out.stdout.splitlines() == ["[]", str(apis), str(apis)]
