"""Fixtures of the delivery's wire tests (helpers: tests/delivery/wire_support.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.delivery.wire_support import Recorder


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder()
    rec.server = await asyncio.start_server(rec.handle, "127.0.0.1", 0)
    port = rec.server.sockets[0].getsockname()[1]
    yield rec, f"http://127.0.0.1:{port}"
    rec.server.close()
    await rec.server.wait_closed()
