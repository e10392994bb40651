"""A tiny dependency-free PNG line chart (zlib + struct), for the benchmark's latency-vs-load plot.

matplotlib is not a dependency of sessionray; this draws axes, ticks with numeric labels (a 3×5
pixel digit font), one polyline per series and optional horizontal reference lines. The legend
goes into the PNG's ``tEXt`` chunk and is printed by the caller.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from pathlib import Path

Color = tuple[int, int, int]

_FONT = {
    "0": ["111", "101", "101", "101", "111"], "1": ["010", "110", "010", "010", "111"],
    "2": ["111", "001", "111", "100", "111"], "3": ["111", "001", "111", "001", "111"],
    "4": ["101", "101", "111", "001", "001"], "5": ["111", "100", "111", "001", "111"],
    "6": ["111", "100", "111", "101", "111"], "7": ["111", "001", "010", "010", "010"],
    "8": ["111", "101", "111", "101", "111"], "9": ["111", "101", "111", "001", "111"],
    ".": ["000", "000", "000", "000", "010"],
}  # fmt: skip


class Canvas:
    """An RGB pixel buffer ``width`` × ``height`` (white)."""

    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def set(self, x: int, y: int, c: Color) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i : i + 3] = bytes(c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: Color, thick: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            x = round(x0 + (x1 - x0) * s / steps)
            y = round(y0 + (y1 - y0) * s / steps)
            for dx in range(thick):
                for dy in range(thick):
                    self.set(x + dx, y + dy, c)

    def text(self, x: int, y: int, s: str, c: Color, scale: int = 2) -> None:
        for k, ch in enumerate(s):
            rows = _FONT.get(ch)
            if rows is None:
                continue
            for r, row in enumerate(rows):
                for q, bit in enumerate(row):
                    if bit == "1":
                        for a in range(scale):
                            for b in range(scale):
                                self.set(x + (k * 4 + q) * scale + a, y + r * scale + b, c)

    def png(self, text: dict[str, str] | None = None) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3 : (y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
        for key, value in (text or {}).items():
            out += chunk(b"tEXt", key.encode("latin-1") + b"\x00" + value.encode("latin-1", "replace"))
        return out + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _fmt(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def line_chart(
    path: Path,
    xs: list[float],
    series: dict[str, tuple[list[float], Color]],
    hlines: dict[str, tuple[float, Color]] | None = None,
    legend: str = "",
    width: int = 640,
    height: int = 400,
) -> None:
    """Write a PNG line chart of ``series`` (name → (ys, color)) over ``xs`` (x positions are
    evenly spaced by index, labelled with the x values), with horizontal ``hlines``."""
    c = Canvas(width, height)
    left, right, top, bottom = 60, width - 20, 20, height - 40
    ymax = (
        max([max(ys) for ys, _ in series.values()] + [v for v, _ in (hlines or {}).values()] + [1e-9]) * 1.1
    )
    black, grey = (0, 0, 0), (200, 200, 200)

    def px(i: int, y: float) -> tuple[int, int]:
        x = left + (right - left) * (i / max(1, len(xs) - 1))
        return round(x), round(bottom - (bottom - top) * (y / ymax))

    for k in range(6):  # y grid + labels
        yv = ymax * k / 5
        _, yy = px(0, yv)
        c.line(left, yy, right, yy, grey)
        c.text(4, yy - 5, _fmt(yv), black)
    for i, xv in enumerate(xs):  # x ticks + labels
        xx, _ = px(i, 0)
        c.line(xx, bottom, xx, bottom + 6, black)
        c.text(xx - 6, bottom + 10, _fmt(xv), black)
    c.line(left, top, left, bottom, black, 2)
    c.line(left, bottom, right, bottom, black, 2)
    for value, color in (hlines or {}).values():
        _, yy = px(0, value)
        for x in range(left, right, 8):
            c.line(x, yy, x + 4, yy, color, 2)
    for ys, color in series.values():
        pts = [px(i, y) for i, y in enumerate(ys)]
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            c.line(x0, y0, x1, y1, color, 2)
        for x, y in pts:
            for dx in range(-3, 4):
                for dy in range(-3, 4):
                    c.set(x + dx, y + dy, color)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(c.png({"Title": "sessionray latency vs offered load", "Description": legend}))
