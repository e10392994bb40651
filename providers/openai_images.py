"""Image generation, separate from chat
(docs/decisions.md#llm-image-generation).

Api ``openai-images``: the OpenAI Images API (``POST {base_url}/images/generations`` for a prompt,
``POST {base_url}/images/edits`` (multipart) when input images are given), reading ``b64_json``.
Chat vision stays in :class:`~runtime.llm.types.Context` image blocks; this module never streams.

Errors are *encoded in the result* (``ImageGenerationResult.error_message``), never raised, so a
tool such as ``generate_image`` can report them to the model as they are.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import filetype
import httpx
from pydantic import BaseModel, ConfigDict, Field

from providers.common import ApiKeyError, ProviderConfigs, join_url, request_secrets, resolve_api_key
from providers.transport import error_message_from_body, get_http_client, redact
from runtime.llm.abort import AbortSignal
from runtime.llm.attribution import attributed, current_attribution
from runtime.llm.options import StreamOptions
from runtime.llm.types import ImageContent, Model, ModelCost, TextContent, Usage, now_ms
from runtime.llm.usage import CallUsage, priced, report_usage

__all__ = [
    "API",
    "ImageGenerationOptions",
    "ImageGenerationResult",
    "ImageModel",
    "generate_images",
]

API = "openai-images"
DEFAULT_BASE_URL = "https://api.openai.com/v1"


class ImageModel(BaseModel):
    """An image-generation model: id, provider alias, endpoint (``api`` is ``openai-images``)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    """e.g. ``gpt-image-1`` or ``dall-e-3``."""
    provider: str = ""
    api: str = API
    base_url: str = ""
    headers: dict[str, str] = Field(default_factory=dict)
    cost: ModelCost = Field(default_factory=ModelCost)
    """USD per million tokens (the ``models[].cost`` of the same id under the provider)."""


class ImageGenerationResult(BaseModel):
    """Images (base64 + MIME type), token usage, and the failure text if any."""

    model_config = ConfigDict(extra="forbid")

    images: list[ImageContent] = Field(default_factory=list)
    revised_prompts: list[str | None] = Field(default_factory=list)
    """One entry per image (``dall-e-3`` rewrites prompts; ``None`` otherwise)."""
    usage: Usage = Field(default_factory=Usage)
    """Tokens (``gpt-image-*`` report input/output tokens; ``dall-e-*`` report none)."""
    model: str = ""
    provider: str = ""
    error_message: str | None = None
    """Set when the call failed; ``images`` is then empty."""


@dataclass
class ImageGenerationOptions:
    """Per-call options; ``None`` fields are not sent.

    Attributes:
        n: Number of images.
        size: e.g. ``1024x1024``.
        quality: e.g. ``low`` | ``medium`` | ``high`` (gpt-image) or ``hd`` (dall-e-3).
        output_format: ``png`` | ``jpeg`` | ``webp`` (gpt-image only).
        api_key: Overrides the key lookup (never logged).
        timeout: Seconds for the whole call (default 300).
        signal: Cancellation: when it fires the request is cancelled (connection closed) and
            the result has ``error_message="aborted"``.
        extra: Extra JSON fields sent as they are.
    """

    n: int | None = None
    size: str | None = None
    quality: str | None = None
    output_format: str | None = None
    api_key: str | None = None
    timeout: float | None = None
    signal: AbortSignal | None = None
    headers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _mime(data: bytes, output_format: str | None) -> str:
    kind = filetype.guess(data)
    if kind is not None and kind.mime.startswith("image/"):
        return str(kind.mime)
    return f"image/{'jpeg' if output_format == 'jpg' else output_format or 'png'}"


async def generate_images(
    model: ImageModel,
    prompt_or_inputs: str | list[TextContent | ImageContent],
    options: ImageGenerationOptions | None = None,
    client: httpx.AsyncClient | None = None,
    *,
    provider_configs: ProviderConfigs | None = None,
) -> ImageGenerationResult:
    """Generate (or edit) images; never raises for provider or network failures.

    Args:
        model: From :func:`actors.models.image_tool.get_image_model`, or built directly.
        prompt_or_inputs: A prompt, or text blocks (joined as the prompt) plus input images
            (→ ``/images/edits``).
        options: See :class:`ImageGenerationOptions`.
        client: An ``httpx.AsyncClient`` (default: the shared client of the running loop).
        provider_configs: The configured providers by alias (``Config.ai.providers``), where the
            API key is looked up (:func:`providers.common.resolve_api_key`); ``None``: none.

    Returns:
        The images with MIME types sniffed from their bytes, usage in tokens (``usage.cost`` in
        USD from ``model.cost``), or ``error_message``. Every call's usage is reported to the
        usage ledger with the reason ``image`` (:func:`runtime.llm.usage.report_usage`;
        docs/decisions.md#spend-ledger).
    """
    result = await _generate(model, prompt_or_inputs, options, client, provider_configs)
    result.usage.cost = priced(model.cost, result.usage)
    with attributed(reason="image"):
        call = CallUsage(
            model=f"{model.provider}/{model.id}" if model.provider else model.id,
            api=API,
            usage=result.usage,
            cost_usd=result.usage.cost.total,
            stop_reason="error" if result.error_message is not None else "stop",
            attribution=current_attribution(),
            ts_ms=now_ms(),
        )
    await report_usage(call)
    return result


async def _generate(
    model: ImageModel,
    prompt_or_inputs: str | list[TextContent | ImageContent],
    options: ImageGenerationOptions | None,
    client: httpx.AsyncClient | None,
    provider_configs: ProviderConfigs | None,
) -> ImageGenerationResult:
    """The body of :func:`generate_images` (the one HTTP call, its errors in the result)."""
    opts = options or ImageGenerationOptions()
    result = ImageGenerationResult(model=model.id, provider=model.provider)
    prompt, images = _split_inputs(prompt_or_inputs)
    try:
        headers, secrets = _headers(model, opts, provider_configs)
        fields = _request_fields(model, opts, prompt)
        files = _input_files(images)
        payload = await _post(client or get_http_client(), model, opts, fields, files, headers, secrets)
        _read_payload(payload, result, opts.output_format)
    except _CallFailed as exc:
        result.images, result.revised_prompts = [], []
        result.error_message = str(exc)
        return result
    if not result.images:
        result.error_message = "the Images API returned no b64_json image"
    return result


class _CallFailed(Exception):
    """The call failed; the message is the result's ``error_message``."""


def _split_inputs(prompt_or_inputs: str | list[TextContent | ImageContent]) -> tuple[str, list[ImageContent]]:
    """The prompt (text blocks joined by newlines) and the input images."""
    if isinstance(prompt_or_inputs, str):
        return prompt_or_inputs, []
    prompt = "\n".join(b.text for b in prompt_or_inputs if isinstance(b, TextContent))
    return prompt, [b for b in prompt_or_inputs if isinstance(b, ImageContent)]


def _headers(
    model: ImageModel, opts: ImageGenerationOptions, provider_configs: ProviderConfigs | None
) -> tuple[dict[str, str], list[str]]:
    """The request headers (the model's, the call's, the bearer key) and the secrets to redact
    from error texts. Raises :class:`_CallFailed` when no API key is found
    (:func:`providers.common.resolve_api_key`)."""
    chat_like = Model(id=model.id, api=API, provider=model.provider, base_url=model.base_url)
    try:
        key = resolve_api_key(chat_like, StreamOptions(api_key=opts.api_key), provider_configs)
    except ApiKeyError as exc:
        raise _CallFailed(str(exc)) from None
    headers = {**model.headers, **opts.headers}
    secrets = request_secrets(key, headers)
    if key:
        headers["authorization"] = f"Bearer {key}"
    return headers, secrets


def _request_fields(model: ImageModel, opts: ImageGenerationOptions, prompt: str) -> dict[str, Any]:
    """The request's fields: model, prompt, the options set, ``b64_json`` for ``dall-e-*`` (the
    others always answer base64) and the call's ``extra`` fields last."""
    fields: dict[str, Any] = {"model": model.id, "prompt": prompt}
    for name in ("n", "size", "quality", "output_format"):
        if getattr(opts, name) is not None:
            fields[name] = getattr(opts, name)
    if model.id.startswith("dall-e"):
        fields["response_format"] = "b64_json"
    fields.update(opts.extra)
    return fields


def _input_files(images: list[ImageContent]) -> list[tuple[str, tuple[str, bytes, str]]]:
    """The multipart ``image[]`` parts of the input images. Raises :class:`_CallFailed` for an
    image whose data is not valid base64."""
    files = []
    for i, b in enumerate(images):
        try:
            raw_input = base64.b64decode(b.data, validate=True)
        except ValueError:
            raise _CallFailed(f"input image {i} is not valid base64") from None
        files.append(("image[]", (f"input{i}.{b.mime_type.split('/')[-1]}", raw_input, b.mime_type)))
    return files


async def _post(
    http: httpx.AsyncClient,
    model: ImageModel,
    opts: ImageGenerationOptions,
    fields: dict[str, Any],
    files: list[tuple[str, tuple[str, bytes, str]]],
    headers: dict[str, str],
    secrets: list[str],
) -> Any:
    """``POST images/edits`` (multipart) with ``files``, else ``POST images/generations`` (JSON),
    within ``opts.timeout`` seconds (default 300) and cancelled by ``opts.signal``; returns the
    decoded JSON. Raises :class:`_CallFailed` naming the failure: an HTTP status of 400 or more,
    ``aborted``, a timeout, a connection error (secrets redacted) or a body that is not JSON."""
    base = model.base_url or DEFAULT_BASE_URL
    total_s = opts.timeout or 300.0
    # httpx's own per-read bound stays above the whole-call bound so the latter decides
    timeout = httpx.Timeout(total_s + 5.0, connect=min(10.0, total_s))
    try:
        if files:
            data = {k: str(v) for k, v in fields.items()}
            call = http.post(
                join_url(base, "images/edits"), headers=headers, data=data, files=files, timeout=timeout
            )
        else:
            call = http.post(
                join_url(base, "images/generations"), headers=headers, json=fields, timeout=timeout
            )
        resp = await _abortable(call, opts.signal, total_s)
        if resp.status_code >= 400:
            raise _CallFailed(redact(error_message_from_body(resp.status_code, resp.content), secrets))
        return json.loads(resp.content)
    except _Aborted:
        raise _CallFailed("aborted") from None
    except TimeoutError:
        raise _CallFailed(f"timeout: no complete response within {total_s:g} s") from None
    except httpx.HTTPError as exc:
        raise _CallFailed(redact(f"connection error: {type(exc).__name__}: {exc}", secrets)) from None
    except ValueError as exc:
        raise _CallFailed(f"invalid JSON from the Images API: {exc}") from None


def _read_payload(payload: Any, result: ImageGenerationResult, output_format: str | None) -> None:
    """Fill ``result`` from an ``images`` response. Raises :class:`_CallFailed` for valid JSON of
    the wrong shape."""
    try:
        _read_images(payload, result, output_format)
    except (AttributeError, TypeError, ValueError) as exc:
        raise _CallFailed(f"unexpected response from the Images API: {type(exc).__name__}: {exc}") from None


def _read_images(payload: Any, result: ImageGenerationResult, output_format: str | None) -> None:
    """The images and usage of an ``images`` response into ``result``; raises on a payload of the
    wrong shape (AttributeError, TypeError, ValueError)."""
    for item in payload.get("data") or []:
        b64 = item.get("b64_json")
        if not b64:
            continue
        raw = base64.b64decode(b64, validate=True)
        result.images.append(ImageContent(data=b64, mime_type=_mime(raw, output_format)))
        result.revised_prompts.append(item.get("revised_prompt"))
    u = payload.get("usage") or {}
    result.usage.input = int(u.get("input_tokens") or 0)
    result.usage.output = int(u.get("output_tokens") or 0)
    result.usage.total_tokens = result.usage.input + result.usage.output


class _Aborted(Exception):
    pass


async def _abortable(
    call: Coroutine[Any, Any, httpx.Response], signal: AbortSignal | None, total_s: float
) -> httpx.Response:
    """Await ``call`` unless ``signal`` fires or ``total_s`` seconds pass first (then cancel it,
    which closes the connection, and raise :class:`_Aborted` or :class:`TimeoutError`)."""
    if signal is not None and signal.aborted:
        call.close()
        raise _Aborted
    task = asyncio.ensure_future(call)
    waiter = asyncio.ensure_future(signal.wait()) if signal is not None else None
    try:
        await asyncio.wait(
            {task} | ({waiter} if waiter else set()), timeout=total_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        if waiter is not None:
            waiter.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if signal is not None and signal.aborted:
            raise _Aborted
        raise TimeoutError
    return task.result()
