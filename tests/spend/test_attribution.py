"""The call attribution follows a turn into its tasks and never leaks out of its block."""

from __future__ import annotations

import asyncio

import pytest

from runtime.llm.attribution import CallAttribution, attributed, current_attribution


def test_block_sets_and_restores() -> None:
    assert current_attribution() is None
    with attributed(bot_id="b", session_key="k", user_id="u") as outer:
        assert current_attribution() == outer
        with attributed(reason="correction") as inner:
            assert inner == CallAttribution(bot_id="b", session_key="k", user_id="u", reason="correction")
        assert current_attribution() == outer
    assert current_attribution() is None


def test_unknown_field_is_an_error() -> None:
    with pytest.raises(TypeError), attributed(chat="x"):
        pass


def test_follows_tasks_started_inside() -> None:
    async def main() -> tuple[str, str]:
        async def probe() -> str:
            got = current_attribution()
            return got.session_key if got else ""

        with attributed(session_key="a"):
            first = asyncio.create_task(probe())
        with attributed(session_key="b"):
            second = asyncio.create_task(probe())
        return await first, await second

    assert asyncio.run(main()) == ("a", "b")
