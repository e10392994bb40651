"""Telegram Bot API codec: webhook updates in, Bot API methods out.

Inbound (Bot API ``setWebhook``): Telegram POSTs each ``Update`` as JSON to
``/webhooks/telegram/{bot_id}``; with ``secret_token`` set it sends
``X-Telegram-Bot-Api-Secret-Token``, compared here in constant time. Parsing (``message``
updates in private chats and groups → :class:`InboundMessage`, entities in UTF-16 units →
canonical segments, group triggers) lives in :mod:`runtime.platforms.telegram_inbound`.

Outbound: consecutive text / markdown / mention / share / degraded segments form one
``sendMessage`` with ``parse_mode: "HTML"`` (Markdown → Telegram HTML with escaping, see
:mod:`runtime.platforms.tg_html`; mentions as ``<a href="tg://user?id=…">`` links), split into
several messages past 4,096 characters on character boundaries. Media → ``sendPhoto`` /
``sendAudio`` / ``sendVideo`` / ``sendDocument`` with the URL or ``file_id`` in JSON, or a
multipart upload of the bytes (``base64`` and ``path`` media). ``dice`` → ``sendDice``. A
``reply`` segment (or, in groups, the answered message) becomes ``reply_parameters`` of the
first call. Degraded (counted in SEGMENTS_DEGRADED): ``share`` → an HTML link, ``face`` →
``[face <id>]``, ``rps`` → ``[rock-paper-scissors]``, ``forward`` → ``[forward <id>]``.

Message ids: Bot API message ids are unique only per chat, so inbound and sent message ids are
written ``"<chat_id>:<message_id>"`` (unique per bot: the router's dedup key and the transcript's
``UNIQUE`` use them); quoting reads the native id back with :func:`native_message_id`.

Send results: ``{"ok": true, "result": {"message_id", "chat"}}``; failures carry ``"<error_code>:
<description>"``; 429 honours ``parameters.retry_after`` (or ``Retry-After``); 429/5xx retryable.
"""

from __future__ import annotations

import base64
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import filetype

from runtime.platforms.base import (
    ApiCall,
    InboundMessage,
    MultipartFile,
    RenderTarget,
    SendResult,
    SignatureError,
    count_degraded,
    header,
    read_env,
)
from runtime.platforms.common import (
    MediaPathError,
    check_trigger,
    http_send_result,
    media_filename,
    media_unavailable,
    parse_retry_after,
    read_media_path,
    setting,
    trigger_settings,
)
from runtime.platforms.telegram_inbound import PLATFORM, parse_update, utf16_slice
from runtime.platforms.tg_html import Run, link, markdown_runs, split_runs, to_html
from runtime.reply.media import file_ref_problem, refused_share_text
from runtime.reply.segments import (
    AudioSegment,
    DiceSegment,
    FaceSegment,
    FileSegment,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    Media,
    MentionSegment,
    Reply,
    ReplySegment,
    RpsSegment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)

__all__ = ["CODEC_FACTORY", "PLATFORM", "TelegramCodec", "from_config", "native_message_id", "utf16_slice"]

_SEND = {"image": ("sendPhoto", "photo"), "audio": ("sendAudio", "audio"),
         "video": ("sendVideo", "video"), "file": ("sendDocument", "document")}  # fmt: skip


MAX_MESSAGE_ID = 2**63 - 1
"""Largest message id a quote may name (Bot API ids are positive integers)."""


def native_message_id(ref: str, chat_id: str | None = None) -> int | None:
    """The Bot API ``message_id`` to quote for a message reference, or ``None`` (do not quote).

    ``ref`` is ``"<chat_id>:<message_id>"`` (the per-bot unique form of
    :attr:`InboundMessage.message_id` and of sent ids) or a bare ``"<message_id>"``. A quote can
    only name a message of the chat being answered: with ``chat_id`` given, a reference into
    another chat gives ``None``; so does anything that is not a positive integer id up to
    :data:`MAX_MESSAGE_ID` (a model-written ``reply`` segment may hold any string; a bad quote
    would make Telegram refuse the whole send)."""
    chat, sep, tail = ref.rpartition(":")
    if sep and chat_id is not None and chat != chat_id:
        return None
    if not (tail.isascii() and tail.isdigit()):
        return None
    value = int(tail)
    return value if 0 < value <= MAX_MESSAGE_ID else None


def _chat_id(raw: str) -> int | str:
    """Numeric chat ids (negative for groups) go as integers; ``@channelname`` stays a string."""
    try:
        return int(raw)
    except ValueError:
        return raw


def _sent_message_id(result: Any) -> str | None:
    """The id of a sent ``Message`` in the per-bot unique form ``"<chat.id>:<message_id>"`` (as
    inbound ids; outbound transcript rows are keyed by it); the bare id when the answer has no
    integer ``chat.id``; None without a ``message_id``."""
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
        """Turn a reply into Bot API calls in order (see module docstring).

        Args:
            reply: The validated reply.
            target: Chat and the message being answered.
            attachments: Optional bytes already read by ``runtime.reply.media.check_reply_media``
                (segment index → object with ``.data``/``.mime``), reused for uploads.

        An attachment that cannot be read (``path`` outside the media directory, bad base64, a
        ``file`` reference that is a URI or a path) becomes the "attachment unavailable" text, and a
        ``share`` link that is not http(s) "<title> [link unavailable]"; both counted in MEDIA_REJECTED.
        """
        chat_id = _chat_id(target.scene_id)
        calls: list[ApiCall] = []
        runs: list[Run] = []
        quoted = [s.data.message_id for s in reply.segments if isinstance(s, ReplySegment)]
        quote: str | None = quoted[0] if quoted else None
        if quote is None and target.scene_type != "private" and target.reply_to:
            quote = target.reply_to

        def reply_params() -> dict[str, Any]:
            nonlocal quote
            if quote is None:
                return {}
            native = native_message_id(quote, target.scene_id)
            quote = None  # only the first message quotes
            return {} if native is None else {"reply_parameters": {"message_id": native}}

        def flush() -> None:
            nonlocal runs
            if "".join(r.text for r in runs).strip():
                for piece in split_runs(runs):
                    body = {"chat_id": chat_id, "text": to_html(piece), "parse_mode": "HTML"}
                    body.update(reply_params())
                    calls.append(self._call("sendMessage", "message", json_body=body))
            runs = []

        for index, seg in enumerate(reply.segments):
            if isinstance(seg, TextSegment):
                runs.append(Run(seg.data.text))
            elif isinstance(seg, MarkdownSegment):
                runs.extend(markdown_runs(seg.data.content))
            elif isinstance(seg, MentionSegment):
                runs.append(link("@" + seg.data.target, f"tg://user?id={seg.data.target}"))
            elif isinstance(seg, ShareSegment):
                refused = refused_share_text(PLATFORM, seg)  # javascript:, data:, … never become a link
                if refused is not None:
                    runs.append(Run(refused))
                    continue
                count_degraded(PLATFORM, "share")
                runs.append(link(seg.data.title or seg.data.url, seg.data.url))
            elif isinstance(seg, FaceSegment):
                count_degraded(PLATFORM, "face")
                runs.append(Run(f"[face {seg.data.id}]"))
            elif isinstance(seg, RpsSegment):
                count_degraded(PLATFORM, "rps")
                runs.append(Run("[rock-paper-scissors]"))
            elif isinstance(seg, ForwardSegment):
                count_degraded(PLATFORM, "forward")
                runs.append(Run(f"[forward {seg.data.forward_id}]"))
            elif isinstance(seg, DiceSegment):
                flush()
                calls.append(self._call("sendDice", "dice", json_body={"chat_id": chat_id, **reply_params()}))
            elif isinstance(seg, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                try:
                    upload = self._upload(seg.type, seg.data.media, (attachments or {}).get(index))
                except MediaPathError as exc:
                    runs.append(Run(media_unavailable(PLATFORM, seg.type, exc)))
                    continue
                flush()
                calls.append(self._media_call(seg.type, seg.data.media, chat_id, reply_params(), upload))
        flush()
        return calls

    def _upload(self, seg_type: str, media: Media, resolved: Any) -> MultipartFile | None:
        """The file to upload for ``base64``/``path`` media (None for ``url``/``file``: sent by reference).

        Raises:
            MediaPathError: unreadable ``path`` (outside the media directory, missing), bad base64,
                or a ``file`` reference that is a URI or a path (``bad_file_ref``; a local Bot API
                server would read ``file://`` values from its disk).
        """
        if media.kind == "file":
            problem = file_ref_problem(media.value)
            if problem is not None:
                raise MediaPathError(problem, "bad_file_ref")
        if media.kind in ("url", "file"):
            return None
        field = _SEND[seg_type][1]
        data: bytes | None = getattr(resolved, "data", None)
        mime: str | None = getattr(resolved, "mime", None)
        if data is None:
            if media.kind == "base64":
                try:
                    data = base64.b64decode(media.value, validate=True)
                except ValueError as exc:
                    raise MediaPathError(f"bad base64: {exc}", "bad_base64") from None
            else:
                data = read_media_path(media.value, self.media_dir)
        if mime is None:
            guess = filetype.guess(data)
            mime = guess.mime if guess is not None else "application/octet-stream"
        name = media_filename(media.kind, media.value)
        if name == "file":
            ext = filetype.get_type(mime=mime)
            name = f"{field}.{ext.extension}" if ext is not None else field
        return MultipartFile(filename=name, content_type=mime, data=data)

    def _media_call(
        self,
        seg_type: str,
        media: Media,
        chat_id: int | str,
        extra: dict[str, Any],
        upload: MultipartFile | None,
    ) -> ApiCall:
        """sendPhoto/sendAudio/sendVideo/sendDocument by URL/file_id (JSON) or upload (multipart)."""
        method, field = _SEND[seg_type]
        if upload is None:
            return self._call(method, field, json_body={"chat_id": chat_id, field: media.value, **extra})
        form = {"chat_id": str(chat_id)}
        form.update({k: json.dumps(v) for k, v in extra.items()})
        return self._call(method, field, form=form, files={field: upload})

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
