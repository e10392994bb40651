"""Provider limits for the whole cluster: one small named Ray actor per provider alias grants the
leases (:mod:`actors.limits.granter_actor`), and :class:`~actors.limits.cluster_gate.ClusterProviderGate`
is the gate every session host installs (docs/decisions.md#spend-provider-limits)."""

from actors.limits.cluster_gate import ClusterProviderGate, install_provider_gate
from actors.limits.granter_actor import ProviderLimitsActor, limits_actor_name

__all__ = ["ClusterProviderGate", "ProviderLimitsActor", "install_provider_gate", "limits_actor_name"]
