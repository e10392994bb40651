"""Image generation (docs/decisions.md#llm-image-generation) against the replay server."""

from __future__ import annotations

import asyncio
import base64
import json

from providers.openai_images import ImageGenerationOptions, ImageModel, generate_images
from runtime.llm.types import ImageContent, TextContent
from tests.providers.replay_server import ReplayServer, Reply

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PNG_B64 = base64.b64encode(PNG).decode()


def _ok(n: int = 1) -> Reply:
    payload = {
        "created": 1,
        "data": [{"b64_json": PNG_B64, "revised_prompt": None} for _ in range(n)],
        "usage": {"input_tokens": 12, "output_tokens": 272, "total_tokens": 284},
    }
    return Reply(body=json.dumps(payload).encode(), content_type="application/json")


async def test_generate_from_prompt(replay: ReplayServer) -> None:
    replay.enqueue(_ok(2))
    model = ImageModel(id="gpt-image-1", provider="oa", base_url=replay.base_url + "/v1")
    result = await generate_images(
        model, "a red fox", ImageGenerationOptions(n=2, size="1024x1024", api_key="sk-img-123456")
    )
    assert result.model_dump() == {
        "images": [{"type": "image", "data": PNG_B64, "mime_type": "image/png"}] * 2,
        "revised_prompts": [None, None],
        "usage": {
            "input": 12,
            "output": 272,
            "cache_read": 0,
            "cache_write": 0,
            "total_tokens": 284,
            "cost": {"input": 0.0, "output": 0.0, "cache_read": 0.0, "cache_write": 0.0, "total": 0.0},
        },
        "model": "gpt-image-1",
        "provider": "oa",
        "error_message": None,
    }
    req = replay.requests[0]
    assert req.path == "/v1/images/generations"
    assert req.headers["authorization"] == "Bearer sk-img-123456"
    assert req.json() == {"model": "gpt-image-1", "prompt": "a red fox", "n": 2, "size": "1024x1024"}


async def test_edit_with_input_image_is_multipart(replay: ReplayServer) -> None:
    replay.enqueue(_ok())
    model = ImageModel(id="gpt-image-1", base_url=replay.base_url + "/v1")
    inputs = [TextContent(text="add a hat"), ImageContent(data=PNG_B64, mime_type="image/png")]
    result = await generate_images(model, inputs, ImageGenerationOptions(api_key="k-123456"))
    assert result.error_message is None and len(result.images) == 1
    req = replay.requests[0]
    assert req.path == "/v1/images/edits"
    assert req.headers["content-type"].startswith("multipart/form-data")
    assert b'name="prompt"\r\n\r\nadd a hat' in req.body and PNG in req.body and b'name="image[]"' in req.body


async def test_errors_are_in_the_result_not_raised(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply.error(
            400,
            {
                "error": {
                    "message": "Your request was rejected by the safety system.",
                    "type": "image_generation_user_error",
                }
            },
        )
    )
    model = ImageModel(id="dall-e-3", base_url=replay.base_url + "/v1")
    result = await generate_images(model, "x", ImageGenerationOptions(api_key="k-123456"))
    assert (result.images, result.error_message) == (
        [],
        "HTTP 400: image_generation_user_error: Your request was rejected by the safety system.",
    )
    assert replay.requests[0].json() == {"model": "dall-e-3", "prompt": "x", "response_format": "b64_json"}
    unreachable = ImageModel(id="gpt-image-1", base_url="http://127.0.0.1:9/v1")
    result = await generate_images(unreachable, "x", ImageGenerationOptions(api_key="k-123456"))
    assert result.error_message is not None and result.error_message.startswith(
        "connection error: ConnectError"
    )


async def test_abort_cancels_the_request(replay: ReplayServer) -> None:
    from runtime.llm.abort import AbortController

    slow = _ok()
    slow.splits, slow.delay_s = [5], 5.0  # the body would take 5 s to arrive
    replay.enqueue(slow)
    ctl = AbortController()
    model = ImageModel(id="gpt-image-1", base_url=replay.base_url + "/v1")
    task = asyncio.ensure_future(
        generate_images(model, "x", ImageGenerationOptions(api_key="k-123456", signal=ctl.signal))
    )
    while not replay.requests:  # wait until the request reached the server
        await asyncio.sleep(0.01)
    ctl.abort()
    result = await task
    assert (result.images, result.error_message) == ([], "aborted")
    # the answer had not arrived: the client hung up (connection closed), nothing was completed
    assert await asyncio.to_thread(replay.requests[0].finished.wait, 10)
    assert replay.requests[0].outcome == "disconnected"
