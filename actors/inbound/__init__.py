"""A message arrives: the ingress app and its transport-independent event path (verify → decode
→ size and storability checks → policy → store → submit; :mod:`~actors.inbound.ingress`, with
its guards :mod:`~actors.inbound.guard`, the inbox gate :mod:`~actors.inbound.inbox` and the
policy's notice :mod:`~actors.inbound.notice`), and the transports beside the webhook: the OneBot
v11 reverse WebSocket (:mod:`~actors.inbound.onebot_ws`) and Telegram long polling
(:mod:`~actors.inbound.telegram_poll`, its status :mod:`~actors.inbound.telegram_poll_status`).
Above :mod:`actors.http` (the app mounts the admin and console routes) and :mod:`actors.placement`
(events are submitted to sessions); below :mod:`actors.serve`, which hosts the app. Nothing is
re-exported here (import the module you need).
"""

__all__ = ["ingress", "telegram_poll"]
"""The modules other wings import."""
