"""Capability profiles of OpenAI-compatible servers, kept apart from the wire adapter.

Adding an OpenAI-compatible vendor is a *profile*, not a new adapter
(docs/decisions.md#provider-split-by-concern). :func:`openai_compat` picks defaults from the model's
``base_url`` and overlays the ``compat`` mapping from configuration (provider-level, then
model-level), so every flag can be forced per model in ``sessionray.yaml``.

Keys (all optional in ``compat``):

* ``profile`` (``openai`` | ``deepseek`` | ``openrouter`` | ``qwen`` | ``mistral`` | ``local`` |
  ``generic``): start from this vendor's defaults instead of guessing from ``base_url`` (useful
  behind a proxy or for a local replay of a vendor).

* ``supports_developer_role`` (bool): send the system prompt as ``developer`` for reasoning models.
* ``max_tokens_field`` (``max_tokens`` | ``max_completion_tokens``).
* ``supports_usage_in_streaming`` (bool): send ``stream_options.include_usage``.
* ``supports_json_schema`` (bool): ``response_format={"type": "json_schema"}`` is understood;
  ``supports_strict_mode`` (bool): ``strict: true`` on the ``response_format`` schema is understood
  (tools are sent without ``strict``: arbitrary tool schemas rarely meet its rules).
* ``reasoning_format`` (``openai`` | ``openrouter`` | ``qwen`` | ``deepseek`` | ``none``): how the
  unified reasoning level is sent (``reasoning_effort``, ``reasoning: {effort}``,
  ``enable_thinking``, nothing).
* ``send_reasoning_content`` (bool): replay the assistant's own thinking as ``reasoning_content``
  (DeepSeek requires it with tool calls; older servers reject the field).
* ``tool_result_needs_name`` (bool): ``tool`` messages carry ``name`` (some Mistral-style servers).
* ``supports_tool_choice_required`` (bool): ``tool_choice: "required"`` is understood.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from runtime.llm.types import Model

__all__ = ["PROFILES", "OpenAICompat", "openai_compat"]


@dataclass(frozen=True)
class OpenAICompat:
    """Resolved OpenAI-compatible capability flags (see the module docstring for each key)."""

    supports_developer_role: bool = False
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    supports_usage_in_streaming: bool = True
    supports_json_schema: bool = True
    supports_strict_mode: bool = True
    reasoning_format: Literal["openai", "openrouter", "qwen", "deepseek", "none"] = "none"
    send_reasoning_content: bool = False
    tool_result_needs_name: bool = False
    supports_tool_choice_required: bool = True


_OPENAI = OpenAICompat(
    supports_developer_role=True, max_tokens_field="max_completion_tokens", reasoning_format="openai"
)
_DEEPSEEK = OpenAICompat(
    reasoning_format="deepseek",
    send_reasoning_content=True,
    supports_strict_mode=False,
    supports_json_schema=False,
)
_OPENROUTER = OpenAICompat(reasoning_format="openrouter")
_LOCAL = OpenAICompat(supports_strict_mode=False)  # Ollama, vLLM, llama.cpp, LM Studio
_QWEN = OpenAICompat(reasoning_format="qwen", supports_strict_mode=False)
_MISTRAL = OpenAICompat(tool_result_needs_name=True, supports_strict_mode=False)

_BY_HOST: tuple[tuple[str, OpenAICompat], ...] = (
    ("api.openai.com", _OPENAI),
    ("openai.azure.com", _OPENAI),
    ("api.deepseek.com", _DEEPSEEK),
    ("openrouter.ai", _OPENROUTER),
    ("dashscope", _QWEN),
    ("api.mistral.ai", _MISTRAL),
    ("127.0.0.1", _LOCAL),
    ("localhost", _LOCAL),
    ("0.0.0.0", _LOCAL),
    (":11434", _LOCAL),
)


PROFILES: dict[str, OpenAICompat] = {
    "openai": _OPENAI,
    "deepseek": _DEEPSEEK,
    "openrouter": _OPENROUTER,
    "qwen": _QWEN,
    "mistral": _MISTRAL,
    "local": _LOCAL,
    "generic": OpenAICompat(),
}
"""Named vendor profiles selectable with ``compat: {profile: <name>}``."""


def _by_base_url(base_url: str) -> OpenAICompat:
    url = base_url.lower()
    for needle, profile in _BY_HOST:
        if needle in url:
            return profile
    return OpenAICompat()


def openai_compat(model: Model) -> OpenAICompat:
    """Return the capability flags for ``model``: base-URL defaults overlaid with ``model.compat``.

    Unknown ``compat`` keys are ignored here (they may belong to another api); values of known
    keys are checked (booleans must be ``true``/``false``, not ``"yes"``).

    Raises:
        ValueError: ``compat.profile`` names no profile in :data:`PROFILES`, or a known flag has a
            value of the wrong type (the message names ``ai.providers.<alias>.compat.<key>``).
    """
    name = model.compat.get("profile")
    if name is not None:
        if name not in PROFILES:
            raise ValueError(f"unknown compat profile {name!r}; known: {', '.join(sorted(PROFILES))}")
        base = PROFILES[name]
    else:
        base = _by_base_url(model.base_url or "https://api.openai.com/v1")
    names = {f.name for f in fields(OpenAICompat)}
    overrides: dict[str, Any] = {k: v for k, v in model.compat.items() if k in names}
    for key, value in overrides.items():
        choices = _CHOICES.get(key)
        if choices is not None and value not in choices:
            problem = f"{value!r} is not one of {', '.join(choices)}"
        elif choices is None and not isinstance(value, bool):
            problem = f"expected true or false, got {value!r}"
        else:
            continue
        raise ValueError(f"ai.providers.{model.provider}.compat.{key} (model {model.id}): {problem}")
    return replace(base, **overrides) if overrides else base


_CHOICES: dict[str, tuple[str, ...]] = {
    "max_tokens_field": ("max_tokens", "max_completion_tokens"),
    "reasoning_format": ("openai", "openrouter", "qwen", "deepseek", "none"),
}
"""Allowed values of the non-boolean flags (every other flag is a bool)."""
