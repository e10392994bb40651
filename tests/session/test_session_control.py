"""The typed control request (`docs/decisions.md#typed-control-request`): a ``ControlRequest`` is
checked where it is made, :func:`run_control` carries each kind out on a real ``SessionCore``
(SQLite, the scripted model) and answers a ``ControlReply``, and each refusal has one HTTP status
(``actors.http.admin.ERROR_STATUS``). Routing through the router shard and the session host on Ray is
covered by test_session_runtime.py, test_host_churn.py and test_admin_archive_stored.py."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from actors.http.admin import error_status
from runtime.delivery.job import DeliveryJob
from runtime.keys import SessionKeyError
from runtime.memory.repository import ContextRepository
from runtime.session.control import (
    BadControlRequest,
    ControlKind,
    ControlReply,
    ControlRequest,
    MalformedKeyError,
    NotMasterError,
    UnknownSessionError,
    run_control,
)
from runtime.session.core import SessionCore
from tests.actors.session_scripts import ScriptedSetup
from tests.actors.session_support import eventually

KEY = "onebot11:10001:private:20003"


def test_a_steer_or_follow_up_needs_text_and_a_sender() -> None:
    for kind in ("steer", "follow_up"):
        with pytest.raises(BadControlRequest, match=f"^{kind} needs a non-empty text and sender_id$"):
            ControlRequest(kind=kind, session_key=KEY, text="  ", sender_id="9000")
        with pytest.raises(BadControlRequest):
            ControlRequest(kind=kind, session_key=KEY, text="hi", sender_id="")
    abort = ControlRequest(kind="abort", session_key=KEY)
    assert (abort.kind, abort.text, abort.sender_id) == (ControlKind.ABORT, "", "")
    with pytest.raises(pydantic.ValidationError):
        ControlRequest(kind="pause", session_key=KEY)
    assert [k.value for k in ControlKind if k.master_only] == ["steer", "follow_up"]


async def test_run_control_carries_out_each_kind_on_the_session_core(
    repo: ContextRepository, tmp_path: Path
) -> None:
    jobs: list[DeliveryJob] = []

    async def deliver(job: DeliveryJob) -> None:
        jobs.append(job)

    setup = ScriptedSetup(str(tmp_path / "markers"))(KEY)
    core = await SessionCore.open(KEY, repo, setup, deliver, max_concurrent_turns=4)
    follow = ControlRequest(kind="follow_up", session_key=KEY, text="echo later", sender_id="9000")
    # no turn is running: the follow-up runs as a turn of its own, with its own reply
    assert await run_control(core, follow) == ControlReply(
        kind="follow_up", session_key=KEY, result="started"
    )
    await eventually(lambda: core.idle and jobs, 30, "the follow-up's reply")
    assert [(j.reply_id.split("/")[0], j.reply.preview_text(), j.reply_to) for j in jobs] == [
        (f"{KEY}#1", "later", None)
    ]
    abort = await run_control(core, ControlRequest(kind="abort", session_key=KEY))
    assert abort == ControlReply(kind="abort", session_key=KEY, result=0)
    archive = await run_control(core, ControlRequest(kind="archive", session_key=KEY))
    assert (archive, core.session_id) == (
        ControlReply(kind="archive", session_key=KEY, result=f"{KEY}#2"),
        f"{KEY}#2",
    )
    await core.close()


def test_each_refusal_has_one_http_status() -> None:
    assert [
        error_status(exc)
        for exc in (
            NotMasterError("not a master"),
            UnknownSessionError("no live session"),
            BadControlRequest("steer needs a non-empty text and sender_id"),
            MalformedKeyError("malformed session key 'x'"),
            SessionKeyError("bad key"),
            RuntimeError("boom"),
        )
    ] == [403, 404, 400, 400, 400, None]
