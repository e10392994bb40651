"""kill -9 of a delivery actor mid-send → its restarted incarnation completes the job from the
ledger, and the platform receives exactly one call (docs/decisions.md#delivery-ledger); since
issue #16 the step that was on the wire is recorded and the reply ends ``uncertain``
(docs/decisions.md#delivery-uncertain), where it used to end ``sent``."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from actors.delivery.pool import DeliveryResult
from runtime.delivery import ledger as ledger
from runtime.memory.db import Database
from tests.actors.edge_support import HoldingApiServer, delivery_pool, private_call, text_job

pytestmark = pytest.mark.usefixtures("ray_session")


async def test_kill_delivery_actor_mid_send_exactly_one_platform_call(
    fixtures_dir: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    job = text_job("only once", reply_id="r-crash")
    with HoldingApiServer(fixtures_dir) as api, delivery_pool(url, api.base_url) as pool:
        handle = pool.pick(job.session_key)
        first_owner = await handle.ready.remote()
        pid = await handle.pid.remote()
        call = asyncio.ensure_future(pool.deliver(job))
        # The platform has the request and has not answered: the send is on the wire.
        assert await asyncio.to_thread(api.received.wait, 60)
        os.kill(pid, signal.SIGKILL)
        api.release()
        result = await asyncio.wait_for(call, timeout=120)
        second_owner = await handle.ready.remote()
        db = Database(url)
        entry = ledger.get_entry(db, job.reply_id)
        db.dispose()
        requests = list(api.requests)
    # Another incarnation took the job over and did not send the uncertain step again.
    assert second_owner != first_owner and second_owner.startswith("0:")
    # The caller's retry either ran the takeover itself ("uncertain") or found the job already
    # finished by the restarted actor's start-up sweep ("duplicate"); either way nothing was sent again.
    assert result in (
        DeliveryResult(reply_id="r-crash", outcome="uncertain", message_ids=[None]),
        DeliveryResult(reply_id="r-crash", outcome="duplicate", message_ids=[None]),
    )
    assert [(r.path, r.json) for r in requests] == [("/send_private_msg", private_call("20002", "only once"))]
    assert entry is not None
    assert (entry.status, entry.owner, entry.steps_done, entry.message_ids) == (
        "uncertain",
        second_owner,
        1,
        [None],
    )
