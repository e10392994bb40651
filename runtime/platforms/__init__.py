"""Platform codecs (Ray-free): OneBot v11, Telegram Bot API, and the built-in web console.

The interface lives in :mod:`runtime.platforms.base`; one module per platform implements it and
exposes ``CODEC_FACTORY`` for :func:`~runtime.platforms.base.get_codec`.
"""

from runtime.platforms.base import (
    ApiCall,
    InboundMessage,
    MalformedEvent,
    MultipartFile,
    PlatformCodec,
    RenderTarget,
    Sender,
    SendResult,
    SignatureError,
    UnknownPlatformError,
    get_codec,
    register_codec,
)

__all__ = [
    "ApiCall",
    "InboundMessage",
    "MalformedEvent",
    "MultipartFile",
    "PlatformCodec",
    "RenderTarget",
    "SendResult",
    "Sender",
    "SignatureError",
    "UnknownPlatformError",
    "get_codec",
    "register_codec",
]
