"""docs/architecture.md's message path quotes the write counts the tests pin.

The figures live once in the code — :data:`runtime.session.message_cost.SQL_WRITES_PER_MESSAGE`
(counted on a real turn by ``tests/delivery/test_delivery_outbox.py``) and
:data:`runtime.delivery.ledger.REPLY_WRITES_OVER_HTTP` (``tests/delivery/test_delivery_ledger.py``)
— and every sentence of the docs that names one of them must state its value; the numbered writes
of the message-path table must be exactly ``1 … SQL_WRITES_PER_MESSAGE``.
"""

from __future__ import annotations

import re
from pathlib import Path

from runtime.delivery.ledger import REPLY_WRITES_OVER_HTTP
from runtime.session.message_cost import SQL_WRITES_PER_MESSAGE

DOCS = Path(__file__).resolve().parents[2] / "docs"
ARCHITECTURE = DOCS / "architecture.md"

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
COUNT = re.compile(r"\b(\d+|" + "|".join(WORDS) + r") (?:[\w-]+ )?write transactions\b", re.I)
CONSTANTS = {
    "SQL_WRITES_PER_MESSAGE": SQL_WRITES_PER_MESSAGE,
    "REPLY_WRITES_OVER_HTTP": REPLY_WRITES_OVER_HTTP,
}


def quoted_values(text: str, name: str) -> list[int]:
    """For each `` `name` `` in ``text``: the count of the last "<n> [word] write transactions"
    before it in the same sentence."""
    values = []
    for match in re.finditer(rf"`{name}`", text):
        start = max(text.rfind(". ", 0, match.start()), text.rfind("\n\n", 0, match.start()), 0)
        numbers = COUNT.findall(text[start : match.start()])
        assert numbers, f"no '<n> write transactions' before `{name}` in: {text[start : match.end()]!r}"
        last = numbers[-1].lower()
        values.append(int(last) if last.isdigit() else WORDS[last])
    return values


def test_architecture_quotes_both_figures() -> None:
    text = ARCHITECTURE.read_text()
    assert quoted_values(text, "SQL_WRITES_PER_MESSAGE") == [SQL_WRITES_PER_MESSAGE]
    assert REPLY_WRITES_OVER_HTTP in quoted_values(text, "REPLY_WRITES_OVER_HTTP")


def test_every_quote_in_the_docs_states_the_value_the_tests_pin() -> None:
    wrong = [
        f"{page.name}: `{name}` quoted as {value}, is {expected}"
        for page in sorted(DOCS.glob("*.md"))
        for name, expected in CONSTANTS.items()
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
