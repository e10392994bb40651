"""The ``generate_image`` tool against a loopback stub of the OpenAI Images API: the image lands
in the bot's media directory, the tool result names it as a ``path`` reference, and a reply that
attaches it passes the reply contract (media provenance) and the outbound media check
(docs/decisions.md#llm-image-generation, docs/decisions.md#reply-media-provenance)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from actors.models.image_tool import (
    GenerateImageArgs,
    get_image_model,
    image_tool_for,
    make_generate_image_tool,
)
from providers.faux import faux_assistant_message, faux_text, faux_tool_call, register_faux_provider
from providers.openai_images import ImageModel
from runtime.config import Config, parse_config
from runtime.llm.types import AgentMessage
from runtime.reply.capability import CapabilityCache
from runtime.reply.media import MediaPolicy, check_reply_media
from runtime.reply.segments import Reply
from runtime.session.features import AgentFeatures
from runtime.session.turn import SessionSetup, TurnInput
from runtime.session.turn_agent import TurnControl, run_agent
from tests.providers.replay_server import ReplayServer
from tests.providers.replay_server import Reply as Http

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
GENERATED = f"generated/{hashlib.sha256(PNG).hexdigest()}.png"
FAIL = "Sorry, no picture this time."


def images_ok() -> Http:
    payload = {
        "created": 1,
        "data": [{"b64_json": base64.b64encode(PNG).decode(), "revised_prompt": "a red fox, watercolour"}],
        "usage": {"input_tokens": 12, "output_tokens": 272, "total_tokens": 284},
    }
    return Http(
        body=json.dumps(payload).encode(), content_type="application/json", path="/images/generations"
    )


def tool(replay: ReplayServer, media_dir: Path) -> Any:
    model = ImageModel(id="gpt-image-1", provider="oa", base_url=replay.base_url + "/v1")
    return make_generate_image_tool(model, media_dir, provider_configs=None)


async def test_the_tool_saves_the_image_and_names_its_path(
    replay: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-img-test-123456")
    replay.enqueue(images_ok())
    result = await tool(replay, tmp_path).execute(
        "c1", GenerateImageArgs(prompt="a red fox"), None, lambda _: None
    )
    assert (tmp_path / GENERATED).read_bytes() == PNG
    assert result.details == {
        "images": [
            {
                "type": "image",
                "media": {"kind": "path", "value": GENERATED},
                "mime_type": "image/png",
                "bytes": len(PNG),
                "revised_prompt": "a red fox, watercolour",
            }
        ],
        "model": "oa/gpt-image-1",
        "usage": {"input": 12, "output": 272},
    }
    assert f"path={GENERATED}." in result.content[0].text
    request = replay.requests[0]
    assert request.path == "/v1/images/generations"
    assert request.json() == {"model": "gpt-image-1", "prompt": "a red fox", "n": 1}


async def test_a_provider_error_is_the_tool_error(replay: ReplayServer, tmp_path: Path) -> None:
    body = json.dumps({"error": {"message": "prompt rejected by the safety system"}}).encode()
    replay.enqueue(Http(status=400, body=body, content_type="application/json"))
    with pytest.raises(
        RuntimeError, match=r"image generation failed: .*prompt rejected by the safety system"
    ):
        await tool(replay, tmp_path).execute("c1", GenerateImageArgs(prompt="x"), None, lambda _: None)
    assert not (tmp_path / "generated").exists()


async def run_turn(replay: ReplayServer, media_dir: Path, reply_path: str) -> tuple[Reply, Any]:
    answer = json.dumps(
        {
            "segments": [
                {"type": "text", "data": {"text": "here is your fox"}},
                {"type": "image", "data": {"media": {"kind": "path", "value": reply_path}}},
            ]
        }
    )
    faux = register_faux_provider(
        [
            faux_assistant_message(
                [faux_tool_call("generate_image", {"prompt": "a red fox"})], stop_reason="toolUse"
            ),
            faux_assistant_message([faux_text(answer)]),
            faux_assistant_message([faux_text(answer)]),  # the correction call, when there is one
        ],
        provider="image-faux",
    )
    cache = CapabilityCache()
    cache.record(faux.get_model(), "native")
    setup = SessionSetup(model=faux.get_model(), tools=[tool(replay, media_dir)], features=AgentFeatures(),
                         capabilities=cache, failure_text=FAIL)  # fmt: skip
    turn = TurnInput(seq=1, session_key="console:console:private:ann", platform="console", bot_id="console",
                     message_id="m1", scene_type="private", scene_id="ann", sender={"id": "ann"},
                     text="draw a fox")  # fmt: skip
    recorded: list[AgentMessage] = []

    async def record(messages: Any) -> None:
        recorded.extend(messages)

    ctl = TurnControl(turn, "one-at-a-time", "one-at-a-time")
    reply = await run_agent(setup, [turn.user_message()], "private", ctl, record)
    return reply, faux


async def test_a_generated_image_goes_out_as_an_image_segment(
    replay: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-img-test-123456")
    replay.enqueue(images_ok())
    reply, faux = await run_turn(replay, tmp_path, GENERATED)
    assert [s.type for s in reply.segments] == ["text", "image"]
    assert faux.call_count == 2  # accepted on the first try: the path is a tool result's reference
    checked = await check_reply_media(reply, MediaPolicy(media_dir=tmp_path), "console")
    assert (checked.rejected, checked.attachments[1].data, checked.attachments[1].mime) == (
        [],
        PNG,
        "image/png",
    )


async def test_a_path_the_tool_did_not_return_is_refused(
    replay: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-img-test-123456")
    replay.enqueue(images_ok())
    reply, faux = await run_turn(replay, tmp_path, "generated/fox.png")
    assert (reply, faux.call_count) == (Reply.of_text(FAIL), 3)  # one correction call, then the failure text


def test_offered_only_with_an_image_model_and_a_media_dir(tmp_path: Path) -> None:
    def config(**ai: Any) -> Config:
        return Config.model_validate(
            {
                "database": {"url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
                "ai": {
                    "providers": {"oa": {"api": "openai-completions", "base_url": "http://127.0.0.1:9/v1"}},
                    **ai,
                },
                "bots": [
                    {"platform": "console", "media_dir": str(tmp_path / "media")},
                    {"platform": "onebot11", "self_id": 10001},
                ],
            }
        )

    with_model = config(image_model="oa/gpt-image-1")
    offered = image_tool_for(with_model, "console", "console")
    assert offered is not None and offered.name == "generate_image"
    assert image_tool_for(with_model, "onebot11", "10001") is None  # no media_dir
    assert image_tool_for(config(), "console", "console") is None  # no image model
    with pytest.raises(ValueError, match="image_model"):
        config(image_model="nope/gpt-image-1")

    from actors.placement.hosts.setup import ConfigSetupFactory

    factory = ConfigSetupFactory(with_model)
    try:
        names = {t.name for t in factory("console:console:private:ann").tools}
        assert "generate_image" in names
        assert "generate_image" not in {t.name for t in factory("onebot11:10001:private:20002").tools}
    finally:
        factory._db.dispose()


def test_get_image_model_from_config() -> None:
    config = parse_config(
        {
            "ai": {
                "providers": {
                    "oa": {
                        "api": "openai-completions",
                        "base_url": "http://h/v1",
                        "headers": {"x-org": "o"},
                    }
                }
            }
        }
    )
    assert get_image_model("oa", "gpt-image-1", config) == ImageModel(
        id="gpt-image-1", provider="oa", base_url="http://h/v1", headers={"x-org": "o"}
    )
