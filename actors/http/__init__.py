"""The HTTP route groups the ingress app mounts besides the webhooks, one module per group. The
admin API (:mod:`~actors.http.admin` composes it): the guard every ``/admin`` route passes
(:mod:`~actors.http.admin_guard`), the session reads (:mod:`~actors.http.admin_sessions`), the
session controls (:mod:`~actors.http.admin_control`), the models (:mod:`~actors.http.models`) and
the deliveries (:mod:`~actors.http.deliveries`). The web console (:mod:`~actors.http.console`
composes it over :mod:`~actors.http.console_context` and the fan-out hub
:mod:`~actors.http.console_hub`): the page and its assets (:mod:`~actors.http.console_page`,
files in ``static/``), who the browser is (:mod:`~actors.http.console_login`), history
(:mod:`~actors.http.console_history`), the live stream (:mod:`~actors.http.console_stream`), what
the hub fans out (:mod:`~actors.http.console_publish`) and the masters' controls
(:mod:`~actors.http.console_control`, with :mod:`~actors.http.console_masters`). Plus the input
checks shared with the webhook (:mod:`~actors.http.input_checks`). They act through a
``SessionRuntime`` handed to them, so they sit above :mod:`actors.placement` and
:mod:`actors.delivery` and below :mod:`actors.inbound`, whose ingress app assembles them. Nothing
is re-exported here (import the module you need).
"""

__all__ = ["admin", "console", "input_checks"]
"""The modules other wings import."""
