"""Custom output types named by ``ai.agent.output_schema`` in tests/session/test_custom_output_schema.py."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


class Intent(StrEnum):
    """What the user wants."""

    REFUND = "REFUND"
    ORDER_QUERY = "ORDER_QUERY"


class Decision(BaseModel):
    """A closed pydantic output type."""

    model_config = ConfigDict(extra="forbid")

    intent: Intent
    action: str
    arguments: dict[str, str]


class OpenDecision(BaseModel):
    """Open (extra keys ignored): refused as an output schema."""

    intent: Intent


TICKET_SCHEMA: dict[str, Any] = {
    "title": "Ticket",
    "type": "object",
    "properties": {
        "priority": {"enum": ["low", "high"]},
        "summary": {"type": "string"},
        "count": {"type": "integer"},
    },
    "required": ["priority", "summary", "count"],
}
"""A JSON Schema object (closed by default once loaded)."""
