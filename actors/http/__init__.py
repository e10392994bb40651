"""The HTTP route groups the ingress app mounts besides the webhooks: the admin API
(:mod:`~actors.http.admin` with its delivery and model groups :mod:`~actors.http.deliveries`,
:mod:`~actors.http.models`), the web console (:mod:`~actors.http.console`, its history
:mod:`~actors.http.console_history`, its master tokens :mod:`~actors.http.console_masters` and
the page's assets in ``static/``) and the input checks shared with the webhook
(:mod:`~actors.http.input_checks`). They act through a ``SessionRuntime`` handed to them, so they
sit above :mod:`actors.placement` and :mod:`actors.delivery` and below :mod:`actors.inbound`,
whose ingress app assembles them. Nothing is re-exported here (import the module you need).
"""

__all__ = ["admin", "console", "input_checks"]
"""The modules other wings import."""
