"""The step writes of the delivery ledger (:mod:`runtime.delivery.ledger` has the rules and the
claims, and re-exports every public name here): mark a step on the wire, renew a lease, record a
confirmed or an uncertain step, close a reply. Plus the row types both modules share.

Every function is blocking and one whole transaction: call it through
:meth:`runtime.memory.db.Database.run_write`. Each checks that ``owner`` still owns the reply
(``pending`` and ``owner`` match), else raises :class:`LostLeaseError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, Literal

from sqlalchemy import Connection, Table, bindparam, update
from sqlalchemy import select as core_select

from runtime.delivery.tables import DeliveryLedgerRow, DeliveryUncertainRow
from runtime.llm.types import now_ms
from runtime.memory.db import Database

__all__ = [
    "FINAL",
    "LEDGER_TABLE",
    "UNCERTAIN_TABLE",
    "FinalStatus",
    "LedgerEntry",
    "LedgerStatus",
    "LostLeaseError",
    "RowView",
    "StepExtra",
    "begin_step",
    "finish",
    "finish_step",
    "record_uncertain",
    "renew",
    "skip_uncertain_step",
]

StepExtra = Callable[[Connection, list[str | None]], None]
"""``(conn, message_ids) -> None`` run last in the transaction that closes a reply with its last
confirmed step (:func:`finish_step`'s ``also``: the outbound transcript row)."""
LedgerStatus = Literal["queued", "pending", "sent", "failed", "uncertain"]
FinalStatus = Literal["sent", "failed", "uncertain"]
FINAL: frozenset[str] = frozenset({"sent", "failed", "uncertain"})


class LostLeaseError(RuntimeError):
    """Another delivery actor took over this reply (our lease expired); stop sending it."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A copy of one ledger row (times in Unix ms)."""

    reply_id: str
    session_key: str
    platform: str
    bot_id: str
    partition: int
    job_json: str
    status: LedgerStatus
    owner: str
    lease_until: int
    steps_total: int
    steps_done: int
    in_flight: int
    message_ids: list[str | None]
    error: str | None
    created_at: int = 0

    @classmethod
    def of(cls, row: Any) -> LedgerEntry:
        """Copy ``row`` (a :class:`DeliveryLedgerRow`, or a Core result row of the table)."""
        copied = {f.name: getattr(row, f.name) for f in dataclass_fields(cls) if f.name != "message_ids"}
        return cls(**copied, message_ids=json.loads(row.message_ids))


LEDGER_TABLE: Table = DeliveryLedgerRow.__table__  # type: ignore[attr-defined]
"""``delivery_ledger`` as a Core table."""
UNCERTAIN_TABLE: Table = DeliveryUncertainRow.__table__  # type: ignore[attr-defined]
"""``delivery_uncertain`` as a Core table."""
_OWNED = (
    (LEDGER_TABLE.c.reply_id == bindparam("r"))
    & (LEDGER_TABLE.c.owner == bindparam("o"))
    & (LEDGER_TABLE.c.status == "pending")
)
"""The row is ours: it exists, ``owner`` holds it and it is still ``pending``."""
_SELECT_OWNED = core_select(
    LEDGER_TABLE.c.message_ids, LEDGER_TABLE.c.in_flight, LEDGER_TABLE.c.steps_done
).where(_OWNED)
_SELECT_OWNED_FOR_UPDATE = _SELECT_OWNED.with_for_update()
_BEGIN = (
    update(LEDGER_TABLE)
    .where(_OWNED)
    .values(
        in_flight=bindparam("step"),
        steps_total=bindparam("total"),
        lease_until=bindparam("lease"),
        updated_at=bindparam("now"),
    )
)
_RENEW = (
    update(LEDGER_TABLE).where(_OWNED).values(lease_until=bindparam("lease"), updated_at=bindparam("now"))
)
_STEP_DONE = (
    update(LEDGER_TABLE)
    .where(_OWNED)
    .values(
        message_ids=bindparam("ids"), steps_done=bindparam("done"), in_flight=-1, updated_at=bindparam("now")
    )
)
_STEP_DONE_LAST = _STEP_DONE.values(status=bindparam("st"), error=None)
_FIRST_DONE = _STEP_DONE.where(LEDGER_TABLE.c.steps_done == 0)
_FIRST_DONE_LAST = _STEP_DONE_LAST.where(LEDGER_TABLE.c.steps_done == 0)
"""Step 0 done while no step was: its ``message_ids`` are known without reading the row."""
_FINISH = (
    update(LEDGER_TABLE)
    .where(_OWNED)
    .values(status=bindparam("st"), error=bindparam("err"), in_flight=-1, updated_at=bindparam("now"))
    .returning(*LEDGER_TABLE.c)
)
_RESENT = (
    update(UNCERTAIN_TABLE)
    .where((UNCERTAIN_TABLE.c.reply_id == bindparam("r")) & (UNCERTAIN_TABLE.c.step == bindparam("s")))
    .values(state="resent", owner=bindparam("o"), updated_at=bindparam("now"))
)


_UPSERT_UNCERTAIN: dict[str, Any] = {}
"""``INSERT … ON CONFLICT (reply_id, step) DO UPDATE`` of ``delivery_uncertain`` per dialect."""


def _lost(reply_id: str, owner: str) -> LostLeaseError:
    return LostLeaseError(f"delivery {reply_id!r} is no longer owned by {owner!r}")


class RowView:
    """Attribute view of a dict of column values (for :meth:`LedgerEntry.of`)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def begin_step(db: Database, reply_id: str, owner: str, step: int, steps_total: int, lease_ms: int) -> None:
    """Mark step ``step`` (0-based) of ``steps_total`` as on the wire; renews the lease.

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    now = now_ms()
    params = {
        "r": reply_id,
        "o": owner,
        "step": step,
        "total": steps_total,
        "lease": now + lease_ms,
        "now": now,
    }
    with db.connection(write=True) as conn:
        if conn.execute(_BEGIN, params).rowcount == 0:
            raise _lost(reply_id, owner)


def renew(db: Database, reply_id: str, owner: str, lease_ms: int) -> int:
    """Extend the lease to ``now + lease_ms`` (an owner waiting out an outage); returns the new
    ``lease_until`` (Unix ms).

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    now = now_ms()
    with db.connection(write=True) as conn:
        if (
            conn.execute(_RENEW, {"r": reply_id, "o": owner, "lease": now + lease_ms, "now": now}).rowcount
            == 0
        ):
            raise _lost(reply_id, owner)
    return now + lease_ms


def _owned(conn: Connection, db: Database, reply_id: str, owner: str) -> tuple[list[str | None], int, int]:
    """``(message_ids, in_flight, steps_done)`` of the owned row."""
    stmt = _SELECT_OWNED if db.is_sqlite else _SELECT_OWNED_FOR_UPDATE
    row = conn.execute(stmt, {"r": reply_id, "o": owner}).first()
    if row is None:
        raise _lost(reply_id, owner)
    return json.loads(row.message_ids), int(row.in_flight), int(row.steps_done)


def finish_step(
    db: Database,
    reply_id: str,
    owner: str,
    step: int,
    message_id: str | None,
    *,
    last: bool = False,
    final: Literal["sent", "uncertain"] = "sent",
    also: StepExtra | None = None,
) -> None:
    """Record that the platform confirmed step ``step`` (with its message id, if any). A step
    below ``steps_done`` is a resent uncertain step: its id replaces the recorded ``null`` and its
    ``delivery_uncertain`` row becomes ``resent``. With ``last`` the reply is closed as ``final``
    in the same transaction (one SQLite write fewer), and ``also(conn, message_ids)`` runs last in
    it (the reply's outbound transcript row; it must not raise for a row it could not write).

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    _record_step(db, reply_id, owner, step, message_id, last=last, final=final, also=also)


def record_uncertain(
    db: Database,
    reply_id: str,
    owner: str,
    step: int | None = None,
    *,
    last: bool = False,
    final: Literal["sent", "uncertain"] = "uncertain",
) -> int:
    """Record step ``step`` (``None``: the step on the wire) as uncertain (rule 2): a
    ``delivery_uncertain`` row in state ``uncertain``, the step counted as handled with a ``null``
    id; with ``last`` the reply is closed as ``final`` in the same transaction. Returns the step.

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    return _record_step(db, reply_id, owner, step, None, last=last, final=final, uncertain=True)


def skip_uncertain_step(db: Database, reply_id: str, owner: str) -> int:
    """:func:`record_uncertain` of the step a dead owner left on the wire; returns its index.

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    return record_uncertain(db, reply_id, owner)


def _record_step(
    db: Database,
    reply_id: str,
    owner: str,
    step: int | None,
    message_id: str | None,
    *,
    last: bool,
    final: str,
    uncertain: bool = False,
    also: StepExtra | None = None,
) -> int:
    """Handle one step in one transaction (see :func:`finish_step`, :func:`record_uncertain`).
    Step 0 confirmed while no step was handled (a one-step reply's close) is one ``UPDATE``
    without reading the row first; any other case reads it."""
    now = now_ms()
    with db.connection(write=True) as conn:
        if step == 0 and not uncertain and _first_done(conn, reply_id, owner, message_id, last, final, now):
            if last and also is not None:
                also(conn, [message_id])
            return 0
        ids, in_flight, done = _owned(conn, db, reply_id, owner)
        index = in_flight if step is None else step
        if index < 0:
            raise ValueError(f"delivery {reply_id!r}: no step on the wire to record")
        if index >= done:  # the next step in order
            ids.append(message_id)
            done = index + 1
        else:  # a step sent again (or again cut off) after an operator's retry
            ids[index] = message_id
            if not uncertain:
                conn.execute(_RESENT, {"r": reply_id, "s": index, "o": owner, "now": now})
        params: dict[str, Any] = {"r": reply_id, "o": owner, "ids": json.dumps(ids), "done": done, "now": now}
        if last:
            params["st"] = final
        conn.execute(_STEP_DONE_LAST if last else _STEP_DONE, params)
        if uncertain:
            row = {"reply_id": reply_id, "step": index, "state": "uncertain", "owner": owner}
            conn.execute(_upsert_uncertain(db), {**row, "created_at": now, "updated_at": now})
        if last and also is not None:
            also(conn, ids)
        return index


def _first_done(
    conn: Connection, reply_id: str, owner: str, message_id: str | None, last: bool, final: str, now: int
) -> bool:
    """Step 0 recorded done as the row's first handled step, when it is (one ``UPDATE``)."""
    params: dict[str, Any] = {
        "r": reply_id, "o": owner, "ids": json.dumps([message_id]), "done": 1, "now": now,
    }  # fmt: skip
    if last:
        params["st"] = final
    return bool(conn.execute(_FIRST_DONE_LAST if last else _FIRST_DONE, params).rowcount == 1)


def _upsert_uncertain(db: Database) -> Any:
    stmt = _UPSERT_UNCERTAIN.get(db.dialect)
    if stmt is None:
        base = db.insert(UNCERTAIN_TABLE)
        stmt = _UPSERT_UNCERTAIN[db.dialect] = base.on_conflict_do_update(
            index_elements=["reply_id", "step"],
            set_={
                "state": base.excluded.state,
                "owner": base.excluded.owner,
                "updated_at": base.excluded.updated_at,
            },
        )
    return stmt


def finish(db: Database, reply_id: str, owner: str, status: FinalStatus, error: str | None) -> LedgerEntry:
    """Close the reply as ``sent``, ``failed`` or ``uncertain`` (final: never sent again by itself).

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    params = {"r": reply_id, "o": owner, "st": status, "err": error, "now": now_ms()}
    with db.connection(write=True) as conn:
        row = conn.execute(_FINISH, params).first()
        if row is None:
            raise _lost(reply_id, owner)
        return LedgerEntry.of(row)
