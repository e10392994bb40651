"""docs/architecture.md's message path quotes the counts the tests pin on real runs.

The figures live once in the code — :data:`actors.placement.submit.RAY_CALLS_PER_MESSAGE`
(counted by ``tests/actors/placement/test_message_ray_calls.py``),
:data:`runtime.session.message_cost.SQL_WRITES_PER_MESSAGE` (``tests/delivery/test_delivery_outbox.py``)
and :data:`runtime.delivery.ledger.REPLY_WRITES_OVER_HTTP` (``tests/delivery/test_delivery_ledger.py``)
— and every sentence of the docs that names one of them must state its value; the numbered writes
of the message-path table must be exactly ``1 … SQL_WRITES_PER_MESSAGE``.
"""

from __future__ import annotations

import re
from pathlib import Path

from actors.placement.submit import RAY_CALLS_PER_MESSAGE
from runtime.delivery.ledger import REPLY_WRITES_OVER_HTTP
from runtime.session.message_cost import SQL_WRITES_PER_MESSAGE

DOCS = Path(__file__).resolve().parents[2] / "docs"
ARCHITECTURE = DOCS / "architecture.md"

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
CONSTANTS = {  # name → (value, what it counts)
    "RAY_CALLS_PER_MESSAGE": (RAY_CALLS_PER_MESSAGE, "Ray actor calls"),
    "SQL_WRITES_PER_MESSAGE": (SQL_WRITES_PER_MESSAGE, "write transactions"),
    "REPLY_WRITES_OVER_HTTP": (REPLY_WRITES_OVER_HTTP, "write transactions"),
}


def quoted_values(text: str, name: str) -> list[int]:
    """For each `` `name` `` in ``text``: the count of the last "<n> [word] <what it counts>"
    before it in the same sentence (the number in digits or as a word)."""
    count = re.compile(rf"\b(\d+|{'|'.join(WORDS)}) (?:[\w-]+ )?{CONSTANTS[name][1]}\b", re.I)
    values = []
    for match in re.finditer(rf"`{name}`", text):
        start = max(text.rfind(". ", 0, match.start()), text.rfind("\n\n", 0, match.start()), 0)
        numbers = count.findall(text[start : match.start()].replace("*", ""))
        assert numbers, f"no count before `{name}` in: {text[start : match.end()]!r}"
        last = numbers[-1].lower()
        values.append(int(last) if last.isdigit() else WORDS[last])
    return values


def test_architecture_quotes_every_figure() -> None:
    text = ARCHITECTURE.read_text()
    for name, (value, _) in CONSTANTS.items():
        assert value in quoted_values(text, name), name


def test_every_quote_in_the_docs_states_the_value_the_tests_pin() -> None:
    wrong = [
        f"{page.name}: `{name}` quoted as {value}, is {expected}"
        for page in sorted(DOCS.glob("*.md"))
        for name, (expected, _) in CONSTANTS.items()
        for value in quoted_values(page.read_text(), name)
        if value != expected
    ]
    assert wrong == []


def test_the_message_path_table_numbers_every_write() -> None:
    text = ARCHITECTURE.read_text()
    section = text[text.index("## The path of one message") : text.index("## The path of one steer")]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| "))
    numbered = [int(n) for n in re.findall(r"\(write (\d+)\b", table)]
    assert numbered == list(range(1, SQL_WRITES_PER_MESSAGE + 1))
