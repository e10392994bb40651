"""What the bot spends and what limits it: the usage and cost ledger of every LLM call, quotas per
user / chat / bot / global, and the Ray-free side of the provider limits shared by the cluster
(docs/decisions.md#spend-ledger, docs/decisions.md#spend-quotas,
docs/decisions.md#spend-provider-limits).

Everything here is Ray-free and talks to SQL through :class:`runtime.memory.Database`; the actors
only host it (the provider-limit lease actor lives in ``actors/``).

Modules: :mod:`runtime.spend.ledger` (the ``llm_usage`` table, one row per call, and the observer
that writes it), :mod:`runtime.spend.quotas` (windows, limits, the check before a turn),
:mod:`runtime.spend.report` (usage grouped by user / chat / bot / model, ``parse_since``).
Importing the package registers the ledger table for ``Database.create_tables``.
"""

from runtime.spend.ledger import UsageLedgerRow, install_ledger
from runtime.spend.quotas import Quotas, QuotaStatus, window_bounds
from runtime.spend.report import UsageRow, parse_since, usage_report

__all__ = [
    "QuotaStatus",
    "Quotas",
    "UsageLedgerRow",
    "UsageRow",
    "install_ledger",
    "parse_since",
    "usage_report",
    "window_bounds",
]
