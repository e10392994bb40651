"""Incremental Server-Sent-Events decoding over raw bytes (docs/decisions.md#llm-transport).

Whole lines are buffered before UTF-8 decoding, so a multi-byte character split across two reads
comes out intact. Used by :mod:`providers.transport` (and re-exported there).
"""

from __future__ import annotations

__all__ = ["SSEDecoder"]


class SSEDecoder:
    """Incremental Server-Sent-Events decoder over raw bytes.

    ``feed(chunk)`` returns the events completed by that chunk as ``(event, data)`` tuples:
    ``event`` is the last ``event:`` field value (``None`` when absent) and ``data`` the ``data:``
    lines joined by ``\\n``. Comments (``:``) and ``id``/``retry`` fields are ignored. Bytes are
    decoded only once a whole line is buffered (UTF-8 safe).
    """

    __slots__ = ("_buf", "_data", "_event", "_first", "_parts")

    def __init__(self) -> None:
        self._buf = b""
        self._parts: list[bytes] = []  # reads of a line longer than one read, joined once
        self._event: str | None = None
        self._data: list[str] = []
        self._first = True  # the stream's first line may start with a byte-order mark

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        """Consume ``chunk`` (any byte boundary) and return the events it completed.

        Linear in the input: a multi-megabyte line (a Gemini ``inlineData`` image) that arrives
        in many reads is joined once, when its end arrives.
        """
        cut = chunk.rfind(b"\n")
        if cut < 0:
            if chunk:
                self._parts.append(chunk)
            return []
        if self._parts:
            buf = b"".join([self._buf, *self._parts, chunk])
            cut += len(buf) - len(chunk)
            self._parts = []
        else:
            buf = self._buf + chunk if self._buf else chunk
            cut += len(buf) - len(chunk)
        self._buf = buf[cut + 1 :]
        return self._lines(buf[:cut].decode("utf-8", "replace").split("\n"))

    def flush(self) -> list[tuple[str | None, str]]:
        """End of body: treat a trailing unterminated line and a pending event as complete."""
        out: list[tuple[str | None, str]] = []
        if self._parts:
            self._buf = b"".join([self._buf, *self._parts])
            self._parts = []
        if self._buf:
            out = self._lines([self._buf.decode("utf-8", "replace")])
            self._buf = b""
        if self._data:
            out.append((self._event, "\n".join(self._data)))
            self._event, self._data = None, []
        return out

    def _lines(self, lines: list[str]) -> list[tuple[str | None, str]]:
        out: list[tuple[str | None, str]] = []
        data = self._data
        if self._first and lines:
            self._first = False
            lines[0] = lines[0].removeprefix("\ufeff")  # SSE spec: one leading BOM is ignored
        for line in lines:
            if line and line[-1] == "\r":
                line = line[:-1]
            if not line:
                if data:
                    out.append((self._event, "\n".join(data)))
                    data = self._data = []
                self._event = None
                continue
            if line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
            elif line.startswith("event:"):
                self._event = line[6:].strip()
            # comments (":"), id:, retry: and unknown fields are ignored (SSE spec)
        return out
