"""The ``generate_image`` agent tool: an image-generation call (:mod:`providers.openai_images`,
an OpenAI-compatible Images API) whose result a reply can attach
(docs/decisions.md#llm-image-generation, docs/decisions.md#reply-media-provenance).

Offered to a session when ``ai.image_model`` is set and the session's bot has a ``media_dir``
(``actors/placement/hosts/setup.py`` wires it). Each generated image is written under the bot's media
directory as ``generated/<sha256 of the bytes>.<ext>`` (content-addressed: the same image is one file) and the
tool result names it as a ``path`` reference, in the text and in ``details``::

    details = {"images": [{"type": "image", "media": {"kind": "path", "value": "generated/3f…9a.png"},
                           "mime_type": "image/png", "bytes": 68, "revised_prompt": None}],
               "model": "oa/gpt-image-1", "usage": {"input": 12, "output": 272}}

The model attaches it with ``{"type": "image", "data": {"media": {"kind": "path", "value":
"generated/3f…9a.png"}}}``; the reply contract accepts that reference because it is a whole
reference of a tool result (media provenance), and delivery reads the file from the media
directory (``path`` media are confined to it). A failed call (the provider's error, a timeout, no
image) is an error tool result carrying the provider's message, so the model can tell the user.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from providers.common import ProviderConfigs
from providers.openai_images import ImageGenerationOptions, ImageModel, generate_images
from runtime.agent.tools import AgentTool, AgentToolResult, ToolUpdateFn
from runtime.config import Config, get_model
from runtime.llm.abort import AbortSignal

__all__ = [
    "GENERATED_SUBDIR",
    "GENERATE_IMAGE",
    "GenerateImageArgs",
    "get_image_model",
    "image_tool_for",
    "make_generate_image_tool",
]

GENERATE_IMAGE = "generate_image"
GENERATED_SUBDIR = "generated"
"""Folder under the media directory that generated images are written to."""
_EXT = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}


class GenerateImageArgs(BaseModel):
    """Arguments of ``generate_image``."""

    prompt: str = Field(min_length=1, max_length=4000, description="What the image shows, in detail.")
    size: str | None = Field(
        None,
        pattern=r"^\d{2,5}x\d{2,5}$",
        description="Optional size such as 1024x1024 (model default if unset).",
    )


def _save(media_dir: Path, data: bytes, mime: str) -> str:
    """Write ``data`` as ``generated/<sha256>.<ext>`` under ``media_dir``; return that relative path."""
    rel = f"{GENERATED_SUBDIR}/{hashlib.sha256(data).hexdigest()}.{_EXT.get(mime, 'png')}"
    target = media_dir / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_suffix(target.suffix + f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)  # atomic: a reader never sees half a file
    return rel


def make_generate_image_tool(
    model: ImageModel,
    media_dir: str | os.PathLike[str],
    *,
    provider_configs: ProviderConfigs | None = None,
    timeout_s: float = 120.0,
) -> AgentTool[GenerateImageArgs]:
    """The ``generate_image`` tool on ``model`` (see the module docstring).

    Args:
        model: From :func:`providers.openai_images.get_image_model` (``ai.image_model``).
        media_dir: The bot's media directory (absolute); images go to its ``generated/`` folder.
        provider_configs: ``Config.ai.providers`` (where the API key variable is named).
        timeout_s: Bound of one generation call in seconds.

    Returns:
        An :class:`AgentTool` whose result text names the ``path`` reference to attach. A failed
        call raises inside the tool, which the agent loop turns into an error tool result with the
        provider's message.
    """
    root = Path(media_dir)

    async def execute(
        call_id: str, params: GenerateImageArgs, signal: AbortSignal | None, on_update: ToolUpdateFn
    ) -> AgentToolResult:
        options = ImageGenerationOptions(n=1, size=params.size, timeout=timeout_s, signal=signal)
        result = await generate_images(model, params.prompt, options, provider_configs=provider_configs)
        if result.error_message is not None:
            raise RuntimeError(f"image generation failed: {result.error_message}")
        images: list[dict[str, Any]] = []
        for image, revised in zip(result.images, result.revised_prompts, strict=False):
            data = base64.b64decode(image.data)
            rel = _save(root, data, image.mime_type)
            images.append(
                {
                    "type": "image",
                    "media": {"kind": "path", "value": rel},
                    "mime_type": image.mime_type,
                    "bytes": len(data),
                    "revised_prompt": revised,
                }
            )
        refs = ", ".join(f"path={i['media']['value']}" for i in images)
        text = (
            f"generated {len(images)} image(s): {refs}. To send one, add an image segment with "
            'media {"kind": "path", "value": <that path>} to the reply.'
        )
        details = {
            "images": images,
            "model": f"{model.provider}/{model.id}" if model.provider else model.id,
            "usage": {"input": result.usage.input, "output": result.usage.output},
        }
        return AgentToolResult.text(text, details=details)

    return AgentTool(
        GENERATE_IMAGE,
        "Generate an image from a text prompt. The result names a path reference; attach it to the "
        "reply as an image segment to send the picture.",
        GenerateImageArgs,
        execute,
    )


def image_tool_for(config: Any, platform: str, bot_id: str) -> AgentTool[GenerateImageArgs] | None:
    """The ``generate_image`` tool of a session of bot ``(platform, bot_id)``: ``None`` unless
    ``config.ai.image_model`` is set and that bot has a ``media_dir`` (a generated image must be a
    file delivery may read).

    Raises:
        runtime.config.ConfigError: ``ai.image_model`` names an unknown provider alias.
    """
    ref = config.ai.image_model
    if not ref:
        return None
    bot = next((b for b in config.bots if str(b.platform) == platform and str(b.self_id) == bot_id), None)
    if bot is None or not bot.media_dir:
        return None
    alias, _, model_id = ref.partition("/")
    model = get_image_model(alias, model_id, config)
    return make_generate_image_tool(model, bot.media_dir, provider_configs=config.ai.providers)


def get_image_model(provider_alias: str, model_id: str, config: Config) -> ImageModel:
    """Return the image model ``model_id`` of ``config.ai.providers.<provider_alias>``.

    The provider's ``base_url`` and ``headers`` are used; its chat ``api`` does not matter (any
    OpenAI-compatible endpoint with an Images API works).

    Raises:
        runtime.config.ConfigError: the alias is not configured in ``config``.
    """
    chat = get_model(provider_alias, model_id, config)
    return ImageModel(
        id=model_id, provider=provider_alias, base_url=chat.base_url, headers=chat.headers, cost=chat.cost
    )
