"""OneBot v11 codec (go-cqhttp, NapCat, Lagrange): HTTP POST event reporting in, HTTP API out.

Inbound (OneBot v11 spec, ``communication/http-post.md``): the implementation POSTs each event as
JSON to ``/webhooks/onebot11/{self_id}``; with a secret configured it signs the body with
``X-Signature: sha1=<hex HMAC-SHA1(secret, body)>``, verified here in constant time.

* ``post_type: message`` with ``message_type`` ``private`` | ``group`` → :class:`InboundMessage`;
  ``message`` may be the **array** form or the **CQ-code string** form (with CQ escaping; see
  :mod:`runtime.platforms.cqcode`) — both give the same segments.
* ``notice``, ``request``, ``meta_event`` (heartbeat, lifecycle) and ``message_sent`` (the bot's
  own messages) are accepted and ignored (``parse`` returns None).
* Groups trigger a turn per ``trigger``: ``always``; ``mention`` (default: an ``at`` of the
  bot's ``self_id``); ``keyword`` (a configured keyword in the text, or a mention).

Outbound (``api/public.md``): ``POST {api_base}/send_private_msg`` ``{"user_id", "message"}`` or
``/send_group_msg`` ``{"group_id", "message"}`` with the message as a segment array, and
``Authorization: Bearer <access_token>`` when configured. Segment mapping:

============ ==================================================================
canonical    OneBot v11
============ ==================================================================
text         ``text {text}``
markdown     ``text {text: content}`` — **degraded** (no Markdown on QQ), counted
mention      ``at {qq: target}``
image        ``image {file}``: url as is, ``base64://…``, ``file:///abs`` (path
             under the media directory), platform ref as is
audio        ``record {file}`` (same ``file`` forms)
video        ``video {file}``
file         ``file {file, name}``
reply        ``reply {id}``
forward      with ``forward_api``: a separate ``send_group_forward_msg`` /
             ``send_private_forward_msg`` call (below); otherwise **degraded**
             to the text ``[forward <id>]``, counted
face         ``face {id}`` (id as a string)
dice / rps   ``dice {}`` / ``rps {}``
share        ``share {url, title}``
============ ==================================================================

``forward`` is receive-only in OneBot v11 (docs/decisions.md#platform-forward-api). With
``forward_api: true`` (the implementation has the forward-message API: NapCat, Lagrange, LLOneBot)
a reply is cut into runs in order: each run of other segments is one ``send_*_msg`` call, each run
of consecutive forwards one ``POST {api_base}/send_group_forward_msg`` ``{"group_id", "messages"}``
(``/send_private_forward_msg`` ``{"user_id", "messages"}``) whose ``messages`` holds one custom
node per forward: ``{"type": "node", "data": {"user_id": <self_id>, "nickname": <self_id>, "uin":
"<self_id>", "name": <self_id>, "content": [{"type": "forward", "data": {"id": <forward_id>}}]}}``
— both name pairs, as go-cqhttp/NapCat read ``user_id``/``nickname`` and Lagrange.OneBot reads
``uin``/``name`` (docs/decisions.md#platform-forward-api).

Send results: HTTP 200 with ``retcode`` 0 (ok) or 1 (queued, no message id) is a success; any
other ``retcode`` is a failed send carrying the platform's wording (``wording`` / ``message`` /
``msg``); HTTP 429 and 5xx are retryable, honouring ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from runtime.platforms import cqcode
from runtime.platforms.base import (
    ApiCall,
    InboundMessage,
    MalformedEvent,
    RenderTarget,
    Sender,
    SendResult,
    SignatureError,
    header,
    read_env,
)
from runtime.platforms.common import (
    check_trigger,
    epoch_ms,
    http_send_result,
    int_id,
    is_triggered,
    load_event,
    setting,
    trigger_settings,
    with_master_role,
)
from runtime.platforms.onebot11_segments import PLATFORM, from_onebot_segments, plain_text, to_onebot_segments
from runtime.reply.segments import Reply

__all__ = ["CODEC_FACTORY", "MAX_SEGMENTS", "OneBot11Codec", "from_onebot_segments", "to_onebot_segments"]

_IGNORED_POST_TYPES = frozenset({"notice", "request", "meta_event", "message_sent"})
MAX_SEGMENTS = 5_000
"""Most segments one inbound message may have (array items, or CQ codes plus the text between
them); more is a malformed event (docs/decisions.md#platform-linear-parsing: a ~1 MB body of 80,000
codes took seconds of the event loop). Real QQ messages stay far below (a text, a few mentions,
faces and images); a message at the limit parses in a few tens of ms."""


def _runs(message: list[dict[str, Any]]) -> list[tuple[bool, list[dict[str, Any]]]]:
    """``message`` cut into maximal runs, in order: ``(True, forwards)`` for consecutive ``forward``
    segments, ``(False, others)`` for the rest."""
    runs: list[tuple[bool, list[dict[str, Any]]]] = []
    for seg in message:
        forward = seg["type"] == "forward"
        if runs and runs[-1][0] == forward:
            runs[-1][1].append(seg)
        else:
            runs.append((forward, [seg]))
    return runs


def _id_value(raw: str) -> int | str:
    """OneBot ids are numbers on the wire; keep non-numeric ids as strings."""
    return int(raw) if raw.isdigit() else raw


def _onebot_segments(raw: Any) -> list[Any]:
    """The OneBot segments of an event's ``message``: a segment array as it is, a CQ-code string
    parsed leniently (a code that does not parse stays text). Raises :class:`MalformedEvent` for
    another type, or more than :data:`MAX_SEGMENTS` segments (a string's counted before parsing:
    a 1 MB body stays cheap)."""
    if isinstance(raw, str):
        if raw.count("[CQ:") > MAX_SEGMENTS:
            raise MalformedEvent(f"OneBot message has more than {MAX_SEGMENTS} segments")
        segments = cqcode.parse_cq(raw)
    elif isinstance(raw, list):
        segments = raw
    else:
        raise MalformedEvent("OneBot 'message' must be a segment array or a CQ-code string")
    if len(segments) > MAX_SEGMENTS:
        raise MalformedEvent(f"OneBot message has more than {MAX_SEGMENTS} segments")
    return segments


def _scene(event: dict[str, Any], user_id: str) -> tuple[Literal["private", "group"], str]:
    """``(scene_type, scene_id)`` of a message event: the peer of a private message, the
    ``group_id`` of a group one. Raises :class:`MalformedEvent` for another ``message_type`` or
    a group message without a valid ``group_id``."""
    message_type = event["message_type"]
    if message_type == "private":
        return "private", user_id
    if message_type == "group":
        if "group_id" not in event:
            raise MalformedEvent("OneBot group message lacks group_id")
        return "group", int_id(event["group_id"], "group_id", "OneBot", digit_strings=True, positive=True)
    raise MalformedEvent(f"unsupported OneBot message_type {message_type!r}")


def _sender(event: dict[str, Any], user_id: str, masters: frozenset[str]) -> Sender:
    """The sender: its group card, else its nickname; its group ``role`` and ``master``."""
    sender_obj = event.get("sender") if isinstance(event.get("sender"), dict) else {}
    assert isinstance(sender_obj, dict)
    names = (sender_obj.get("card"), sender_obj.get("nickname"))
    name = next((n for n in names if isinstance(n, str) and n), "")
    own = [sender_obj["role"]] if isinstance(sender_obj.get("role"), str) and sender_obj["role"] else []
    return Sender(id=user_id, name=name, roles=with_master_role(own, user_id, masters))


class OneBot11Codec:
    """The OneBot v11 :class:`~runtime.platforms.base.PlatformCodec` (see module docstring).

    Args:
        self_id: The bot's QQ id (``self_id``), as a string.
        api_base: The implementation's HTTP API base URL, e.g. ``http://127.0.0.1:5700``.
        secret: HMAC secret for ``X-Signature`` (None: signatures are not checked).
        access_token: Bearer token for the HTTP API (None: no ``Authorization`` header).
        trigger: ``always`` | ``mention`` | ``keyword`` — when group messages start a turn.
        keywords: Words that trigger in ``keyword`` mode (case-insensitive substring match).
        masters: User ids allowed to steer; their inbound ``sender.roles`` get ``"master"``.
        media_dir: Directory that ``path`` media must lie under.
        forward_api: The implementation has ``send_group_forward_msg`` /
            ``send_private_forward_msg``: ``forward`` segments are sent through them (else as text).
    """

    platform = PLATFORM
    supported_segments = frozenset(
        {"text", "mention", "image", "audio", "video", "file", "reply", "face", "dice", "rps", "share"}
    )
    """Sent natively; with ``forward_api`` the instance's set also has ``forward``."""

    def __init__(
        self,
        *,
        self_id: str,
        api_base: str = "http://127.0.0.1:5700",
        secret: str | None = None,
        access_token: str | None = None,
        trigger: str = "mention",
        keywords: list[str] | tuple[str, ...] = (),
        masters: list[str] | tuple[str, ...] = (),
        media_dir: Path | str | None = None,
        forward_api: bool = False,
    ) -> None:
        check_trigger("onebot11", trigger)
        self.self_id = str(self_id)
        self.api_base = api_base
        self._secret = secret
        self._access_token = access_token
        self.trigger = trigger
        self.keywords = tuple(keywords)
        self.masters = frozenset(str(m) for m in masters)
        self.media_dir = Path(media_dir) if media_dir else None
        self.forward_api = forward_api
        if forward_api:
            self.supported_segments = OneBot11Codec.supported_segments | {"forward"}

    # ------------------------------------------------------------------ inbound

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Check ``X-Signature: sha1=<hex>`` = HMAC-SHA1(secret, body) (OneBot v11 HTTP POST;
        docs/decisions.md#security-webhook-auth).

        The comparison is of bytes, so a header with non-ASCII characters is a mismatch (401),
        not a ``TypeError``.

        Raises:
            SignatureError: a secret is configured and the header is missing or wrong.
        """
        if not self._secret:
            return
        got = header(headers, "X-Signature")
        if not got:
            raise SignatureError("missing X-Signature header")
        want = b"sha1=" + hmac.new(self._secret.encode(), body, hashlib.sha1).hexdigest().encode()
        if not hmac.compare_digest(got.strip().lower().encode("utf-8", "replace"), want):
            raise SignatureError("X-Signature does not match the body")

    def parse(self, headers: Mapping[str, str], body: bytes) -> InboundMessage | None:
        """Parse one OneBot v11 event (array or CQ-string ``message``).

        Returns None for notices, requests, meta events and the bot's own ``message_sent``.

        Ids (``self_id``, ``user_id``, ``group_id``, ``message_id``) must be integers or decimal
        strings within int64 (:func:`~runtime.platforms.common.int_id`; booleans and floats are
        refused) and ``time`` a number of Unix seconds in ``0..2**32`` (absent: 0). Lone
        surrogates in strings become U+FFFD (:func:`~runtime.platforms.common.load_event`).

        Raises:
            MalformedEvent: a non-JSON Content-Type or body, not a JSON object, no ``post_type``,
                a message event lacking ``self_id``/``message_type``/``message_id``/``user_id``/
                ``message``, a bad id or time, an unknown ``message_type``, a ``group`` message
                without ``group_id``, a bad array segment, or an event for another ``self_id``. A
                CQ code that does not parse is never an error: it stays literal text
                (:mod:`runtime.platforms.cqcode`).
        """
        event = load_event(headers, body, "OneBot")
        if not isinstance(event, dict) or not isinstance(event.get("post_type"), str):
            raise MalformedEvent("OneBot event must be a JSON object with a string 'post_type'")
        post_type = event["post_type"]
        if post_type in _IGNORED_POST_TYPES:
            return None
        if post_type != "message":
            raise MalformedEvent(f"unknown OneBot post_type {post_type!r}")
        required = ("self_id", "message_type", "message_id", "user_id", "message")
        missing = [k for k in required if k not in event]
        if missing:
            raise MalformedEvent(f"OneBot message event lacks {', '.join(missing)}")
        self_id = int_id(event["self_id"], "self_id", "OneBot", digit_strings=True, positive=True)
        if self_id != self.self_id:
            raise MalformedEvent(f"event for self_id {self_id} posted to bot {self.self_id}")
        message_id = int_id(event["message_id"], "message_id", "OneBot", digit_strings=True)
        user_id = int_id(event["user_id"], "user_id", "OneBot", digit_strings=True, positive=True)
        time_s = event.get("time")
        time_ms = 0 if time_s is None else epoch_ms(time_s, "time", "OneBot", floats=True)
        segments = from_onebot_segments(_onebot_segments(event["message"]))
        scene_type, scene_id = _scene(event, user_id)
        sender = _sender(event, user_id, self.masters)
        text = plain_text(segments)
        mentioned = any(s["type"] == "mention" and s["data"]["target"] == self.self_id for s in segments)
        reply_to = next((s["data"]["message_id"] for s in segments if s["type"] == "reply"), None)
        triggered = is_triggered(scene_type, self.trigger, mentioned, text, self.keywords)
        return InboundMessage(
            platform=PLATFORM,
            bot_id=self.self_id,
            message_id=message_id,
            scene_type=scene_type,
            scene_id=scene_id,
            sender=sender,
            text=text,
            segments=segments,
            reply_to=reply_to,
            mentioned_bot=mentioned,
            triggered=triggered,
            time_ms=time_ms,
        )

    # ------------------------------------------------------------------ outbound

    def render(self, reply: Reply, target: RenderTarget) -> list[ApiCall]:
        """One ``send_private_msg`` / ``send_group_msg`` call carrying every segment, in order —
        with ``forward_api``, one such call per run of non-forward segments and one
        ``send_*_forward_msg`` call (``kind="forward"``) per run of forwards, in reply order.

        In group scenes ``target.reply_to`` is quoted (a leading ``reply`` segment of the first
        message call) unless the reply already has a ``reply`` segment. Empty reply → ``[]``.
        """
        if reply.is_empty():
            return []
        message = to_onebot_segments(reply, self.media_dir, forward_api=self.forward_api)
        has_reply = any(s["type"] == "reply" for s in message)
        quote = target.scene_type != "private" and bool(target.reply_to) and not has_reply
        headers = {"Authorization": f"Bearer {self._access_token}"} if self._access_token else {}
        private = target.scene_type == "private"
        where = {"user_id" if private else "group_id": _id_value(target.scene_id)}
        calls: list[ApiCall] = []
        for forwards, run in _runs(message):
            if forwards:
                kind, api = "forward", "_forward_msg"
                body = {**where, "messages": [self._node(seg) for seg in run]}
            else:
                if quote:
                    run.insert(0, {"type": "reply", "data": {"id": target.reply_to}})
                    quote = False
                kind, api, body = "message", "_msg", {**where, "message": run}
            path = f"/send_{'private' if private else 'group'}{api}"
            call = ApiCall(base_url=self.api_base, path=path, json_body=body, headers=headers, kind=kind)
            calls.append(call)
        return calls

    def _node(self, forward: dict[str, Any]) -> dict[str, Any]:
        """A custom forward node, sent as the bot, that carries one ``forward`` segment; the sender
        is named twice (``user_id``/``nickname`` and ``uin``/``name``:
        docs/decisions.md#platform-forward-api)."""
        me, name = _id_value(self.self_id), self.self_id
        sender = {"user_id": me, "nickname": name, "uin": name, "name": name}
        return {"type": "node", "data": {**sender, "content": [forward]}}

    def parse_send_result(self, status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
        """Read an HTTP API answer: retcode 0/1 ok (message_id from ``data``); other retcodes fail
        with ``"retcode <n>: <wording>"``; HTTP 429/5xx retryable (``Retry-After`` honoured)."""
        if status != 200:
            return http_send_result(status, headers, body)
        try:
            answer = json.loads(body)
        except ValueError:
            return SendResult(ok=False, error=f"OneBot API answered non-JSON: {body[:200]!r}")
        if not isinstance(answer, dict):
            return SendResult(ok=False, error=f"OneBot API answered {answer!r}")
        retcode = answer.get("retcode")
        if retcode in (0, 1):
            data = answer.get("data")
            mid = data.get("message_id") if isinstance(data, dict) else None
            return SendResult(ok=True, message_id=None if mid is None else str(mid))
        wording = answer.get("wording") or answer.get("message") or answer.get("msg") or answer.get("status")
        return SendResult(ok=False, error=f"retcode {retcode}: {wording}")


def from_config(bot: Any) -> OneBot11Codec:
    """Build the codec from a ``bots:`` entry (``platform: onebot11``).

    Reads ``self_id``, ``api_base``, ``secret_env``, ``access_token_env``, ``trigger``,
    ``keyword``, ``masters``, ``media_dir``, ``forward_api``.

    Raises:
        ValueError: a named environment variable is unset, or a bad ``trigger``.
    """
    return OneBot11Codec(
        self_id=str(bot.self_id),
        api_base=setting(bot, "api_base", None) or "http://127.0.0.1:5700",
        secret=read_env(setting(bot, "secret_env", None), what="OneBot X-Signature secret"),
        access_token=read_env(setting(bot, "access_token_env", None), what="OneBot access token"),
        forward_api=bool(setting(bot, "forward_api", False)),
        **trigger_settings(bot),
    )


CODEC_FACTORY = from_config
"""Registry hook used by :func:`runtime.platforms.base.get_codec`."""
