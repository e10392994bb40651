"""What the bot spends and what limits it: the usage and cost ledger of every LLM call, quotas per
user / chat / bot / global, and the Ray-free side of the provider limits shared by the cluster
(docs/decisions.md#spend-ledger, docs/decisions.md#spend-quotas,
docs/decisions.md#spend-provider-limits).

Everything here is Ray-free and talks to SQL through :class:`runtime.memory.Database`; the actors
only host it (the provider-limit lease actor lives in ``actors/``).
"""

__all__: list[str] = []
