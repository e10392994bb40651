"""Telegram inbound: one webhook ``Update`` → :class:`InboundMessage` (used by
:class:`runtime.platforms.telegram.TelegramCodec`; the codec checks the secret header first).

* ``message`` updates in ``private`` chats, ``group`` and ``supergroup`` (both scene ``group``)
  → :class:`InboundMessage`. Other updates (edited messages, channel posts, callbacks…) are
  accepted and ignored (:func:`parse_update` returns None).
* Text or caption with entities (offsets in UTF-16 code units) → canonical segments:
  ``text_mention`` → ``mention {target: user.id}``; a ``mention`` entity of the bot's own
  ``@username`` → ``mention {target: bot_id}`` (other ``@username`` mentions carry no id and stay
  text — never guess an id: docs/decisions.md#reply-mention-identity); photo (largest size) / video
  / animation / audio / voice / document / sticker → media ``{kind: "file", value: file_id}`` (a
  sticker is an ``image`` whose data also has ``sticker``: its emoji, maybe ``""``); dice
  → ``dice``; ``reply_to_message`` → a leading ``reply {message_id}`` segment and ``reply_to``.
* Groups trigger per ``trigger`` (``mention`` by default): the bot is *mentioned* by a
  ``mention`` entity of its username, a ``text_mention`` of its id, or a reply to one of its
  messages; a ``bot_command`` (``/cmd`` or ``/cmd@<this bot>``) also triggers.

Message ids: Bot API message ids are unique only per chat, so the inbound message id is written
``"<chat_id>:<message_id>"`` (unique per bot); ``reply_to`` keeps the native id.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from runtime.platforms.base import InboundMessage, MalformedEvent, Sender
from runtime.platforms.common import epoch_ms, int_id, is_triggered, load_event, with_master_role

__all__ = ["HANDLED_UPDATES", "PLATFORM", "message_segments", "parse_update", "utf16_slice"]

PLATFORM = "telegram"
HANDLED_UPDATES: tuple[str, ...] = ("message",)
"""The ``Update`` fields :func:`parse_update` turns into messages (every other update is ignored):
what a polling bot asks ``getUpdates`` for by default (``allowed_updates``)."""
_INBOUND_MEDIA = (("photo", "image"), ("video", "video"), ("animation", "video"), ("audio", "audio"),
                  ("voice", "audio"), ("video_note", "video"), ("document", "file"),
                  ("sticker", "image"))  # fmt: skip


def utf16_slice(text: str, offset: int, length: int) -> str:
    """Slice ``text`` by UTF-16 code units (Telegram entity offsets/lengths)."""
    raw = text.encode("utf-16-le")
    return raw[2 * offset : 2 * (offset + length)].decode("utf-16-le", "replace")  # a cut pair → U+FFFD


def _entities(msg: dict[str, Any], field: str) -> list[tuple[int, int, dict[str, Any]]]:
    """``msg[field]`` (``entities`` / ``caption_entities``) as ``(offset, length, entity)``
    sorted by offset; absent or null → ``[]``.

    Raises:
        MalformedEvent: not a list of objects with integer ``offset`` and ``length`` ≥ 0.
    """
    raw = msg.get(field)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise MalformedEvent(f"Telegram {field} must be a list of objects")
    out: list[tuple[int, int, dict[str, Any]]] = []
    for ent in raw:
        if not isinstance(ent, dict):
            raise MalformedEvent(f"Telegram {field} must be a list of objects")
        off, length = ent.get("offset"), ent.get("length")
        for key, value in (("offset", off), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
                raise MalformedEvent(f"Telegram {field} {key} must be an integer ≥ 0")
        out.append((int(off), int(length), ent))  # type: ignore[arg-type]
    return sorted(out, key=lambda e: e[0])


def _is_bot(user: Any, bot_id: str) -> bool:
    """True when ``user`` is a Telegram ``User`` object whose ``id`` is this bot's."""
    return isinstance(user, dict) and str(user.get("id")) == bot_id


def message_segments(
    msg: dict[str, Any], *, bot_id: str, username: str | None
) -> tuple[list[dict[str, Any]], bool, bool]:
    """Segments of a ``Message``'s media, dice and text/caption (reply not included).

    Args:
        msg: The ``message`` object of an update.
        bot_id: This bot's user id (``text_mention`` of it → mentioned).
        username: This bot's username without ``@`` (a ``mention`` entity of it → mentioned;
            ``/cmd@<username>`` → command); None: only ``text_mention`` and bare commands count.

    Returns:
        ``(segments, mentioned_bot, command)``; segments are canonical dicts
        (``{"type", "data"}``), media first, then text pieces and mentions in text order.

    Raises:
        MalformedEvent: a non-string ``text``/``caption``/``file_id``, bad ``entities``, or a
            ``text_mention`` ``user.id`` that is not an int64 integer.
    """
    segments: list[dict[str, Any]] = []
    mentioned = command = False
    for field, seg_type in _INBOUND_MEDIA:
        item = msg.get(field)
        if isinstance(item, list) and item:  # photo: sizes ascending, take the largest
            item = item[-1]
        if isinstance(item, dict) and "file_id" in item:
            if not isinstance(item["file_id"], str) or not item["file_id"]:
                raise MalformedEvent(f"Telegram {field}.file_id must be a non-empty string")
            data: dict[str, Any] = {"media": {"kind": "file", "value": item["file_id"]}}
            if field == "sticker":  # the model reads "[sticker 😀 file=…]" (runtime.platforms.placeholders)
                emoji = item.get("emoji")
                data["sticker"] = emoji if isinstance(emoji, str) else ""
            segments.append({"type": seg_type, "data": data})
            break
    if isinstance(msg.get("dice"), dict):
        segments.append({"type": "dice", "data": {}})
    for key in ("text", "caption"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise MalformedEvent(f"Telegram message {key} must be a string")
    text = msg.get("text") if isinstance(msg.get("text"), str) else msg.get("caption")
    if not isinstance(text, str):
        return segments, mentioned, command
    entities = _entities(msg, "entities" if "text" in msg else "caption_entities")
    cursor = 0  # in UTF-16 units
    units = text.encode("utf-16-le")  # encoded once: entity slices are linear in total
    text_units = len(units) // 2
    own_name = (username or "").lower()

    def utf16(start: int, length: int) -> str:
        return units[2 * start : 2 * (start + length)].decode("utf-16-le", "replace")

    out: list[dict[str, Any]] = []

    def plain(start: int, end: int) -> None:
        if end > start:
            out.append({"type": "text", "data": {"text": utf16(start, end - start)}})

    for off, length, ent in entities:
        etype = ent.get("type")
        piece = utf16(off, min(length, 128))  # usernames/commands are short; bounds the work
        target: str | None = None
        if etype == "text_mention" and isinstance(ent.get("user"), dict):
            target = int_id(ent["user"].get("id"), "text_mention user.id", "Telegram")
            mentioned = mentioned or target == bot_id
        elif etype == "mention" and own_name and piece[1:].lower() == own_name:
            target = bot_id
            mentioned = True
        elif etype == "bot_command":
            _, _, addressee = piece.partition("@")
            command = command or not addressee or addressee.lower() == own_name
        if target is not None and off >= cursor:
            plain(cursor, off)
            out.append({"type": "mention", "data": {"target": target}})
            cursor = off + length
    plain(cursor, text_units)
    return segments + out, mentioned, command


def _message(update: Any) -> dict[str, Any] | None:
    """The ``message`` of a decoded update, checked to be an object with ``message_id``, ``date``
    and ``chat {id, type}``; None for an update without one. Raises :class:`MalformedEvent` for
    an update that is not an object, a bad ``update_id`` or a message of the wrong shape."""
    if not isinstance(update, dict):
        raise MalformedEvent("Telegram update must be a JSON object")
    int_id(update.get("update_id"), "update_id", "Telegram")
    msg = update.get("message")
    if msg is None:
        return None
    if not isinstance(msg, dict):
        raise MalformedEvent("Telegram 'message' must be an object")
    chat = msg.get("chat")
    if not isinstance(chat, dict) or "id" not in chat or "type" not in chat:
        raise MalformedEvent("Telegram message lacks chat {id, type}")
    if "message_id" not in msg or "date" not in msg:
        raise MalformedEvent("Telegram message lacks message_id or date")
    return msg


def _scene_type(chat_type: Any) -> Literal["private", "group"] | None:
    """A ``private`` chat, or a ``group``/``supergroup`` (a group); None for other chats (channels)."""
    if chat_type == "private":
        return "private"
    if chat_type in ("group", "supergroup"):
        return "group"
    return None


def _sender(msg: dict[str, Any], chat_id: str, masters: Collection[str]) -> Sender:
    """The message's ``from`` (the chat itself when absent) with its display name and roles
    (``bot``, ``master``). Raises :class:`MalformedEvent` for a ``from`` that is not an object
    or a bad ``from.id``."""
    user = msg.get("from", {})
    if not isinstance(user, dict):
        raise MalformedEvent("Telegram message 'from' must be an object")
    sender_id = int_id(user["id"], "from.id", "Telegram") if "id" in user else chat_id
    parts = (user.get("first_name"), user.get("last_name"))
    name = " ".join(p for p in parts if isinstance(p, str) and p)
    roles = with_master_role(["bot"] if user.get("is_bot") is True else [], sender_id, masters)
    return Sender(id=sender_id, name=name, roles=roles)


def _quote(msg: dict[str, Any], segments: list[dict[str, Any]], bot_id: str) -> tuple[str | None, bool]:
    """The native id of the message ``msg`` answers (inserted first in ``segments`` as a
    ``reply`` segment) and whether that message is the bot's; ``(None, False)`` for no
    ``reply_to_message``. Raises :class:`MalformedEvent` for one without a ``message_id``."""
    reply_msg = msg.get("reply_to_message")
    if reply_msg is None:
        return None, False
    if not isinstance(reply_msg, dict) or "message_id" not in reply_msg:
        raise MalformedEvent("Telegram reply_to_message must be an object with a message_id")
    reply_to = int_id(reply_msg["message_id"], "reply_to_message.message_id", "Telegram")
    segments.insert(0, {"type": "reply", "data": {"message_id": reply_to}})
    return reply_to, _is_bot(reply_msg.get("from"), bot_id)


def parse_update(
    headers: Mapping[str, str],
    body: bytes,
    *,
    bot_id: str,
    username: str | None,
    masters: Collection[str],
    trigger: str,
    keywords: tuple[str, ...] | list[str],
) -> InboundMessage | None:
    """Parse one ``Update``; None for updates other than ``message`` (and non-message chats).

    The message id is made unique per bot: ``message_id = "<chat.id>:<message_id>"`` (Bot
    API message ids are unique only within a chat; the router's dedup key and the transcript's
    ``UNIQUE`` use it). ``reply_to`` and ``reply`` segments keep the native id (they quote
    within the same chat; :func:`runtime.platforms.telegram.native_message_id` reads both forms).

    Strict types at the boundary: ``update_id``, ``message_id``, ``chat.id``, ``from.id``,
    ``reply_to_message.message_id`` and a ``text_mention``'s ``user.id`` are integers within
    int64; ``date`` is an integer of Unix seconds in ``0..2**32``; ``entities`` /
    ``caption_entities`` are lists of objects with integer ``offset``/``length`` ≥ 0; text,
    caption and ``file_id`` are strings. Lone surrogates become U+FFFD
    (:func:`~runtime.platforms.common.load_event`).

    Args:
        headers: Request headers (Content-Type is checked).
        body: The raw request body (bytes).
        bot_id: This bot's user id.
        username: This bot's username without ``@`` (None: unknown).
        masters: Sender ids given the ``"master"`` role.
        trigger: ``always`` | ``mention`` | ``keyword`` (groups only; private chats always trigger).
        keywords: Words that trigger in ``keyword`` mode.

    Raises:
        MalformedEvent: a non-JSON Content-Type or body, not a JSON object, a ``message``
            without ``message_id``, ``date`` or ``chat {id, type}``, or any value above of
            the wrong type or range (the message names the field).
    """
    msg = _message(load_event(headers, body, "Telegram"))
    if msg is None:
        return None
    chat_id = int_id(msg["chat"]["id"], "chat.id", "Telegram")
    message_id = int_id(msg["message_id"], "message_id", "Telegram")
    time_ms = epoch_ms(msg["date"], "date", "Telegram")
    scene_type = _scene_type(msg["chat"]["type"])
    if scene_type is None:
        return None
    sender = _sender(msg, chat_id, masters)
    segments, mentioned, command = message_segments(msg, bot_id=bot_id, username=username)
    reply_to, quotes_bot = _quote(msg, segments, bot_id)
    mentioned = mentioned or quotes_bot
    text = "".join(
        s["data"]["text"] if s["type"] == "text" else "@" + s["data"]["target"]
        for s in segments
        if s["type"] in ("text", "mention")
    )
    triggered = is_triggered(scene_type, trigger, mentioned or command, text, keywords)
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot_id,
        message_id=f"{chat_id}:{message_id}",
        scene_type=scene_type,
        scene_id=chat_id,
        sender=sender,
        text=text,
        segments=segments,
        reply_to=reply_to,
        mentioned_bot=mentioned,
        triggered=triggered,
        time_ms=time_ms,
    )
