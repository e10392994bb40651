"""Small statistics shared by the benchmark sections."""

from __future__ import annotations

__all__ = ["pct"]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")
