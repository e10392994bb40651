"""Telegram Bot API codec: webhook updates in, Bot API methods out.

Inbound (Bot API ``setWebhook``): Telegram POSTs each ``Update`` as JSON to
``/webhooks/telegram/{bot_id}``; with ``secret_token`` set it sends
``X-Telegram-Bot-Api-Secret-Token``, compared here in constant time. Parsing (``message``
updates in private chats and groups → :class:`InboundMessage`, entities in UTF-16 units →
canonical segments, group triggers) lives in :mod:`runtime.platforms.telegram_inbound`.

Outbound (:mod:`runtime.platforms.telegram_render`): text / markdown / mention / share / degraded
segments form ``sendMessage`` calls with ``parse_mode: "HTML"`` (Markdown → Telegram HTML with
valid entity nesting, :mod:`runtime.platforms.tg_markdown` and :mod:`runtime.platforms.tg_html`;
mentions as ``<a href="tg://user?id=…">`` links), split past 4,096 UTF-16 code units between
grapheme clusters and never inside a link. Media → ``sendPhoto`` / ``sendAudio`` / ``sendVideo`` /
``sendDocument``, or ``sendMediaGroup`` for 2-10 consecutive items Telegram may group, with the
adjacent text as HTML ``caption`` when it fits 1,024 UTF-16 units; by URL or ``file_id`` in JSON,
or a multipart upload of the bytes (``base64`` and ``path`` media). ``dice`` → ``sendDice``. A
``reply`` segment (or, in groups, the answered message) becomes ``reply_parameters`` of the first
call. Degraded (counted in SEGMENTS_DEGRADED): ``share`` → an HTML link, ``face`` → ``[face <id>]``,
``rps`` → ``[rock-paper-scissors]``, ``forward`` → ``[forward <id>]``.

Message ids: Bot API message ids are unique only per chat, so inbound and sent message ids are
written ``"<chat_id>:<message_id>"`` (unique per bot: the router's dedup key and the transcript's
``UNIQUE`` use them); quoting reads the native id back with :func:`native_message_id`.

Send results: ``{"ok": true, "result": {"message_id", "chat"}}`` (``sendMediaGroup``: a list of
such messages, the first one's id is kept); failures carry ``"<error_code>:
<description>"``; 429 honours ``parameters.retry_after`` (or ``Retry-After``); 429/5xx retryable.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.platforms.base import (
    ApiCall,
    InboundMessage,
    RenderTarget,
    SendResult,
    SignatureError,
    header,
    read_env,
)
from runtime.platforms.common import (
    check_trigger,
    http_send_result,
    parse_retry_after,
    setting,
    trigger_settings,
)
from runtime.platforms.telegram_inbound import PLATFORM, parse_update, utf16_slice
from runtime.platforms.telegram_render import MAX_MESSAGE_ID, TelegramRenderer, native_message_id
from runtime.reply.segments import Reply

__all__ = [
    "CODEC_FACTORY",
    "MAX_MESSAGE_ID",
    "PLATFORM",
    "TelegramCodec",
    "from_config",
    "native_message_id",
    "utf16_slice",
]


def _sent_message_id(result: Any) -> str | None:
    """The id of a sent ``Message`` in the per-bot unique form ``"<chat.id>:<message_id>"`` (as
    inbound ids; outbound transcript rows are keyed by it); the bare id when the answer has no
    integer ``chat.id``; None without a ``message_id``. ``sendMediaGroup`` answers a list of
    messages: the album's first message is its id."""
    if isinstance(result, list):
        result = result[0] if result else None
    mid = result.get("message_id") if isinstance(result, dict) else None
    if mid is None:
        return None
    chat = result.get("chat") if isinstance(result, dict) else None
    chat_id = chat.get("id") if isinstance(chat, dict) else None
    if isinstance(chat_id, int) and not isinstance(chat_id, bool):
        return f"{chat_id}:{mid}"
    return str(mid)


class TelegramCodec:
    """The Telegram :class:`~runtime.platforms.base.PlatformCodec` (see module docstring).

    Args:
        bot_id: The bot's user id (the digits before ``:`` in its token).
        token: The bot token (goes into the API path ``/bot<token>/<method>``; never logged).
        username: The bot's ``@username`` without ``@`` (for mention detection).
        api_base: Bot API server, default ``https://api.telegram.org``.
        secret_token: Expected ``X-Telegram-Bot-Api-Secret-Token`` (None: not checked).
        trigger: ``always`` | ``mention`` | ``keyword``.
        keywords: Words that trigger in ``keyword`` mode.
        masters: User ids allowed to steer (``"master"`` role).
        media_dir: Directory that ``path`` media must lie under.
    """

    platform = PLATFORM
    supported_segments = frozenset(
        {"text", "markdown", "mention", "image", "audio", "video", "file", "reply", "dice"}
    )

    def __init__(
        self,
        *,
        bot_id: str,
        token: str,
        username: str | None = None,
        api_base: str = "https://api.telegram.org",
        secret_token: str | None = None,
        trigger: str = "mention",
        keywords: list[str] | tuple[str, ...] = (),
        masters: list[str] | tuple[str, ...] = (),
        media_dir: Path | str | None = None,
    ) -> None:
        check_trigger("telegram", trigger)
        self.bot_id = str(bot_id)
        self._token = token
        self.username = (username or "").lstrip("@") or None
        self.api_base = api_base
        self._secret = secret_token
        self.trigger = trigger
        self.keywords = tuple(keywords)
        self.masters = frozenset(str(m) for m in masters)
        self.media_dir = Path(media_dir) if media_dir else None

    # ------------------------------------------------------------------ inbound

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Compare ``X-Telegram-Bot-Api-Secret-Token`` with the configured secret
        (docs/decisions.md#security-webhook-auth).

        Raises:
            SignatureError: a secret is configured and the header is missing or different.
        """
        if not self._secret:
            return
        got = header(headers, "X-Telegram-Bot-Api-Secret-Token")
        if not got:
            raise SignatureError("missing X-Telegram-Bot-Api-Secret-Token header")
        if not hmac.compare_digest(got.encode("utf-8", "replace"), self._secret.encode()):
            raise SignatureError("X-Telegram-Bot-Api-Secret-Token does not match")

    def parse(self, headers: Mapping[str, str], body: bytes) -> InboundMessage | None:
        """Parse one ``Update`` with this bot's settings; None for updates other than ``message``
        (see :func:`runtime.platforms.telegram_inbound.parse_update` for ids and strict types).

        Raises:
            MalformedEvent: a non-JSON body, missing fields, or a value of the wrong type or range.
        """
        return parse_update(
            headers,
            body,
            bot_id=self.bot_id,
            username=self.username,
            masters=self.masters,
            trigger=self.trigger,
            keywords=self.keywords,
        )

    # ------------------------------------------------------------------ outbound

    def method_path(self, method: str) -> str:
        """The Bot API path of ``method``: ``/bot<token>/<method>`` (holds the token: never log it)."""
        return f"/bot{self._token}/{method}"

    def _call(self, method: str, kind: str, **fields: Any) -> ApiCall:
        return ApiCall(base_url=self.api_base, path=self.method_path(method), kind=kind, **fields)

    def render(
        self, reply: Reply, target: RenderTarget, attachments: Mapping[int, Any] | None = None
    ) -> list[ApiCall]:
        """Turn a reply into Bot API calls in order
        (:meth:`runtime.platforms.telegram_render.TelegramRenderer.render`)."""
        return TelegramRenderer(self._call, self.media_dir).render(reply, target, attachments)

    def parse_send_result(self, status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
        """Read a Bot API answer (``{"ok", "result"}`` or ``{"ok": false, "error_code",
        "description", "parameters": {"retry_after"}}``)."""
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return http_send_result(status, headers, body)
        retryable = status == 429 or status >= 500
        if status == 200 and answer.get("ok") is True:
            return SendResult(ok=True, message_id=_sent_message_id(answer.get("result")))
        params = answer.get("parameters") if isinstance(answer.get("parameters"), dict) else {}
        assert isinstance(params, dict)
        retry_after = params.get("retry_after")
        code = answer.get("error_code", status)
        return SendResult(
            ok=False,
            error=f"{code}: {answer.get('description', 'request failed')}",
            retry_after_s=float(retry_after)
            if isinstance(retry_after, int | float)
            else parse_retry_after(header(headers, "Retry-After")),
            retryable=retryable or code == 429,
        )


def from_config(bot: Any) -> TelegramCodec:
    """Build the codec from a ``bots:`` entry (``platform: telegram``).

    Reads ``token_env`` (required), ``self_id`` (default: the token's digits before ``:``),
    ``username``, ``api_base``, ``secret_env``, ``trigger``, ``keyword``, ``masters``, ``media_dir``.

    Raises:
        ValueError: ``token_env`` missing or its variable unset, or a bad ``trigger``.
    """
    token = read_env(setting(bot, "token_env", None), what="Telegram bot token")
    if not token:
        raise ValueError("telegram bot needs token_env (the environment variable holding the bot token)")
    self_id = setting(bot, "self_id", None) or token.split(":", 1)[0]
    return TelegramCodec(
        bot_id=str(self_id),
        token=token,
        username=setting(bot, "username", None),
        api_base=setting(bot, "api_base", None) or "https://api.telegram.org",
        secret_token=read_env(setting(bot, "secret_env", None), what="Telegram webhook secret token"),
        **trigger_settings(bot),
    )


CODEC_FACTORY = from_config
"""Registry hook used by :func:`runtime.platforms.base.get_codec`."""
