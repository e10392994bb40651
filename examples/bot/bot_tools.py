"""The example bot's Python tools (``ai.python_tools: ["examples.bot.bot_tools:TOOLS"]``).

* ``convert_units`` — an :class:`~runtime.agent.tools.AgentTool`: a pydantic model declares the
  arguments (the model sees its JSON Schema; a call is validated leniently, so ``"5"`` is
  accepted for a number), an async function does the work and returns the text the model reads.
* :func:`text_stats` — a plain function, the handler of ``tools/text_stats.tool.md`` (a
  ``*.tool.md`` file declares the tool's name, description and schema; the function only gets
  the arguments as a dict).

Both are deterministic and need nothing external.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from runtime import AbortSignal, AgentTool, AgentToolResult

__all__ = ["TOOLS", "ConvertArgs", "convert", "text_stats"]

Unit = Literal["km", "mi", "m", "ft", "kg", "lb", "c", "f"]

_TO_BASE: dict[str, tuple[str, float]] = {
    "km": ("length", 1000.0),
    "mi": ("length", 1609.344),
    "m": ("length", 1.0),
    "ft": ("length", 0.3048),
    "kg": ("mass", 1.0),
    "lb": ("mass", 0.45359237),
}
"""Unit → (dimension, size in the dimension's base unit: metres or kilograms)."""


class ConvertArgs(BaseModel):
    """Arguments of ``convert_units``."""

    value: float = Field(description="The amount to convert.")
    from_unit: Unit = Field(
        description="Unit of the amount: km, mi, m, ft, kg, lb, c (Celsius), f (Fahrenheit)."
    )
    to_unit: Unit = Field(description="Unit to convert to (same kinds as from_unit).")


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Convert ``value`` between two units of one dimension.

    Raises:
        ValueError: the units measure different things (e.g. ``km`` to ``kg``).

    >>> round(convert(5, "km", "mi"), 3)
    3.107
    >>> convert(100, "c", "f")
    212.0
    """
    temps = {"c", "f"}
    if from_unit in temps or to_unit in temps:
        if not {from_unit, to_unit} <= temps:
            raise ValueError(
                f"cannot convert {from_unit} to {to_unit}: a temperature converts only to a temperature"
            )
        celsius = value if from_unit == "c" else (value - 32) * 5 / 9
        return celsius if to_unit == "c" else celsius * 9 / 5 + 32
    (dim_from, size_from), (dim_to, size_to) = _TO_BASE[from_unit], _TO_BASE[to_unit]
    if dim_from != dim_to:
        raise ValueError(f"cannot convert {from_unit} ({dim_from}) to {to_unit} ({dim_to})")
    return value * size_from / size_to


async def _convert_units(
    call_id: str,
    params: ConvertArgs,
    signal: AbortSignal | None,
    on_update: Callable[[AgentToolResult], None],
) -> AgentToolResult:
    result = convert(params.value, params.from_unit, params.to_unit)  # a ValueError → an error result
    text = f"{params.value:g} {params.from_unit} = {result:.4g} {params.to_unit}"
    return AgentToolResult.text(text, details={"result": result})


TOOLS: list[AgentTool[Any]] = [
    AgentTool(
        "convert_units",
        "Convert an amount between units of length (km, mi, m, ft), mass (kg, lb) or temperature (c, f).",
        ConvertArgs,
        _convert_units,
        label="Unit converter",
    )
]
"""What ``ai.python_tools`` names: a list of ``AgentTool`` (a single tool or a function returning
either works too)."""


def text_stats(args: dict[str, Any]) -> dict[str, int]:
    """Handler of ``tools/text_stats.tool.md``: word, character and line counts of ``args["text"]``.

    The tool result the model reads is this dict as JSON.

    >>> text_stats({"text": "hello big world"})
    {'words': 3, 'characters': 15, 'lines': 1}
    """
    text = str(args["text"])
    return {"words": len(text.split()), "characters": len(text), "lines": len(text.splitlines()) or 1}
