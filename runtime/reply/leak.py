"""Outbound leak check: no configured secret and no common key format leaves in a reply
(docs/decisions.md#security-leak-check).

Entry point: ``scan_reply(reply, policy)`` → :class:`LeakResult`. Every string anywhere in the
reply is scanned — text, Markdown content, mention targets, media values, share titles and URLs,
any nested string — for

* the literal secrets of :class:`LeakPolicy` (provider API keys, platform tokens, webhook secrets,
  the admin and console API tokens — the values of the variables config names, plus
  ``$SESSIONRAY_CONSOLE_API_TOKEN``; build it with :meth:`LeakPolicy.from_config` or
  :meth:`LeakPolicy.from_env`), and
* common key formats (:data:`KEY_PATTERNS`: OpenAI/Anthropic ``sk-…``, AWS ``AKIA…``, GitHub
  ``ghp_…``, Slack ``xox?-…``, Google ``AIza…``, Telegram bot tokens, JWTs, PEM private keys).

Literal secrets match case-insensitively and also in their URL-encoded spellings
(``quote``/``quote_plus``), so ``?t=TG%2DSECRET`` is caught. Text is also read the way a client
shows it (:func:`runtime.reply.textnorm.normalized_view`): HTML numeric
and named entities decoded (``&#65;&#68;…``), NFKC applied (full-width ``ＡＤＭＩＮ…``), invisible
format/combining characters dropped; key formats are matched on that view. A literal secret of at
least :data:`NORMALIZED_MIN_CHARS` characters is further matched with whitespace removed (spaced
out ``T G W E B…``), reversed, and base64-encoded (standard or URL-safe alphabet, at any byte
alignment inside a longer base64 text; case-sensitive); a shorter one only literally, as before,
to keep false positives low. A secret split across consecutive ``text``/``markdown`` segments
(the user sees them joined) is caught on the joined text.

A hit either redacts or blocks (``action="block"``: the whole reply becomes one text segment
``policy.blocked_text``). Redaction (``action="redact"``) replaces the match by
``policy.redaction`` inside free text (``text``, ``markdown`` content, ``share`` title); a hit in a
*reference* (mention target, media value, share URL, reply/forward id, face id) makes the reference
unusable, so that whole segment becomes one text segment ``policy.redaction`` — a mention of
``[redacted]`` or a broken URL is never sent. Each string (or cross-segment span) that matched
increments ``sessionray_leak_hits_total{action}`` and logs a warning that names the pattern,
never the secret.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, quote_plus

from runtime import metrics
from runtime.reply.segments import MarkdownSegment, Reply, Segment, ShareData, ShareSegment, TextSegment
from runtime.reply.textnorm import normalized_view

__all__ = [
    "KEY_PATTERNS",
    "NORMALIZED_MIN_CHARS",
    "LeakPolicy",
    "LeakResult",
    "scan_reply",
    "scan_text",
    "scrub",
]

CONSOLE_API_TOKEN_ENV = "SESSIONRAY_CONSOLE_API_TOKEN"
"""The environment variable holding the console's internal-endpoint token. Every worker has it,
so every policy built from config withholds it; the console codec
(:mod:`runtime.platforms.console`) reads its token from the same name."""

log = logging.getLogger(__name__)

KEY_PATTERNS: dict[str, re.Pattern[str]] = {
    "openai_or_anthropic_key": re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"),
    "aws_access_key": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "github_token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})"),
    "slack_token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "google_api_key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),
    "telegram_bot_token": re.compile(r"\b\d{8,10}:AA[A-Za-z0-9_-]{33}\b"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    "private_key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
}
"""Common secret formats, by name (the name is what gets logged)."""

NORMALIZED_MIN_CHARS = 8
"""Shortest literal secret also matched spaced out, reversed and base64-encoded (shorter ones
match only literally: a short value spread over words would redact ordinary text)."""

SECRET_PART_MIN_CHARS = 16
"""Shortest ``:``-separated part of a secret value that is also a secret on its own (the
``<secret>`` half of a Telegram ``<bot id>:<secret>`` token)."""


@dataclass
class LeakPolicy:
    """What counts as a secret and what to do on a hit.

    Attributes:
        secrets: Literal secret values (shorter than ``min_secret_chars`` are ignored, to avoid
            redacting common words).
        action: ``redact`` (replace each match) or ``block`` (withhold the whole reply).
        use_patterns: Also match :data:`KEY_PATTERNS`.
        redaction: Replacement text for a redacted match.
        blocked_text: The text sent instead of a blocked reply.
        min_secret_chars: Minimum length of a literal secret.
    """

    secrets: list[str] = field(default_factory=list)
    action: Literal["redact", "block"] = "redact"
    use_patterns: bool = True
    redaction: str = "[redacted]"
    blocked_text: str = "[reply withheld: it contained a secret]"
    min_secret_chars: int = 8

    @classmethod
    def from_env(
        cls,
        env_names: Iterable[str],
        *,
        values: Iterable[str] = (),
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> LeakPolicy:
        """Build a policy from the values of the environment variables ``env_names`` (e.g. every
        ``api_key_env``/``access_token_env``/``secret_env`` named in config) plus literal ``values``.
        Unset variables are skipped. ``kwargs`` go to the constructor.

        A value made of ``:``-separated parts (a Telegram bot token is ``<bot id>:<secret>``) also
        contributes each part of at least :data:`SECRET_PART_MIN_CHARS` characters, so the secret
        half leaks no more than the whole token (the bot id alone is public)."""
        env = os.environ if environ is None else environ
        found = [env[name] for name in env_names if env.get(name)]
        every = [*found, *values]
        parts = [p for v in every if ":" in v for p in v.split(":") if len(p) >= SECRET_PART_MIN_CHARS]
        return cls(secrets=list(dict.fromkeys([*every, *parts])), **kwargs)

    @classmethod
    def from_config(
        cls, config: Any, *, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> LeakPolicy:
        """Build a policy from a :class:`runtime.config.Config` (duck-typed): the values of every
        secret variable it names — ``ai.providers.*.api_key_env``, ``bots[*].access_token_env`` /
        ``secret_env`` / ``token_env`` / ``master_token_env`` and ``server.admin_token_env`` — plus
        ``$SESSIONRAY_CONSOLE_API_TOKEN`` (:data:`CONSOLE_API_TOKEN_ENV`, the
        console's internal-endpoint token, which every worker has in its environment whether or
        not a console bot is configured; docs/decisions.md#security-leak-check). Unset or empty
        variables are skipped.

        Args:
            config: The configuration (only the attributes above are read).
            environ: Environment to read (default ``os.environ``).
            kwargs: Passed to the constructor (``action``, ``redaction``…).
        """
        names: list[str] = []
        providers = getattr(getattr(config, "ai", None), "providers", None) or {}
        for p in providers.values() if isinstance(providers, Mapping) else providers:
            names.append(getattr(p, "api_key_env", None) or "")
        for bot in getattr(config, "bots", None) or []:
            keys = ("access_token_env", "secret_env", "token_env", "master_token_env")
            names += [getattr(bot, k, None) or "" for k in keys]
        names.append(getattr(getattr(config, "server", None), "admin_token_env", None) or "")
        names.append(CONSOLE_API_TOKEN_ENV)
        return cls.from_env(list(dict.fromkeys(n for n in names if n)), environ=environ, **kwargs)

    def _literal_pattern(self) -> re.Pattern[str] | None:
        values = {s for s in self.secrets if len(s) >= self.min_secret_chars}
        spellings = {v for s in values for v in (s, quote(s, safe=""), quote_plus(s, safe=""))}
        return _alternation(spellings, re.IGNORECASE)

    def _folded_patterns(self) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
        """``(folded, base64)`` patterns for the whitespace-free view: each long secret as that
        view spells it and reversed (case-insensitive); its base64 fragments (case-sensitive)."""
        key = (tuple(self.secrets), self.min_secret_chars)
        cached = _FOLDED_CACHE.get(key)
        if cached is not None:
            return cached
        long = {s for s in self.secrets if len(s) >= max(self.min_secret_chars, NORMALIZED_MIN_CHARS)}
        folded = {f for s in long if len(f := normalized_view(s, drop_space=True)[0]) >= NORMALIZED_MIN_CHARS}
        encoded = {frag for s in long for frag in _base64_fragments(s.encode())}
        cached = (
            _alternation(folded | {f[::-1] for f in folded}, re.IGNORECASE),
            _alternation(encoded, 0),
        )
        if len(_FOLDED_CACHE) > 64:
            _FOLDED_CACHE.clear()
        _FOLDED_CACHE[key] = cached
        return cached


_FOLDED_CACHE: dict[tuple[tuple[str, ...], int], tuple[re.Pattern[str] | None, re.Pattern[str] | None]] = {}


def _alternation(values: Iterable[str], flags: int) -> re.Pattern[str] | None:
    ordered = sorted(set(values), key=len, reverse=True)
    return re.compile("|".join(re.escape(v) for v in ordered), flags) if ordered else None


def _base64_fragments(secret: bytes) -> set[str]:
    """The base64 characters that encode only ``secret``'s bytes, at each of the three byte
    alignments it can have inside a longer encoded text, in the standard and URL-safe alphabets
    (fragments shorter than :data:`NORMALIZED_MIN_CHARS` + 2 are dropped as too common)."""
    out: set[str] = set()
    for shift, skip in ((0, 0), (1, 2), (2, 3)):  # leading filler bytes → characters touching them
        encoded = base64.b64encode(bytes(shift) + secret).decode()
        fragment = encoded[skip : (shift + len(secret)) * 8 // 6]
        if len(fragment) >= NORMALIZED_MIN_CHARS + 2:
            out |= {fragment, fragment.replace("+", "-").replace("/", "_")}
    return out


@dataclass
class LeakResult:
    """Outcome of :func:`scan_reply`.

    Attributes:
        reply: The reply to send (redacted, or replaced when blocked; unchanged without hits).
        hits: Strings that matched.
        blocked: True when the reply was withheld.
        patterns: Names of what matched (``configured_secret`` or a :data:`KEY_PATTERNS` key).
    """

    reply: Reply
    hits: int = 0
    blocked: bool = False
    patterns: list[str] = field(default_factory=list)


def _raw_matches(text: str, policy: LeakPolicy) -> list[tuple[int, int, str]]:
    found: list[tuple[int, int, str]] = []
    literal = policy._literal_pattern()
    if literal is not None:
        found += [(m.start(), m.end(), "configured_secret") for m in literal.finditer(text)]
    if policy.use_patterns:
        for name, pattern in KEY_PATTERNS.items():
            found += [(m.start(), m.end(), name) for m in pattern.finditer(text)]
    return found


def _folded_matches(text: str, policy: LeakPolicy) -> list[tuple[int, int, str]]:
    folded, encoded = policy._folded_patterns()
    found: list[tuple[int, int, str]] = []
    for pattern in (folded, encoded):
        if pattern is not None:
            found += [(m.start(), m.end(), "configured_secret") for m in pattern.finditer(text)]
    return found


def _mapped(hits: list[tuple[int, int, str]], spans: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """Hits in a :func:`normalized_view` mapped back onto the original text."""
    return [(spans[a][0], spans[b - 1][1], n) for a, b, n in hits if b > a]


def _matches(text: str, policy: LeakPolicy) -> list[tuple[int, int, str]]:
    """Every ``(start, end, name)`` hit in ``text`` — literally, in the view a reader sees
    (entities decoded, NFKC, invisible characters dropped) and, for long secrets, in that view
    without whitespace (also reversed / base64) — mapped back onto ``text``, sorted and with
    overlaps merged."""
    found = _raw_matches(text, policy)
    if not text.isascii() or "&" in text:  # else the view is the text itself
        view, spans = normalized_view(text)
        if view != text:
            found += _mapped(_raw_matches(view, policy), spans)
    if any(len(s) >= NORMALIZED_MIN_CHARS for s in policy.secrets):
        bare, bare_spans = normalized_view(text, drop_space=True)
        found += _mapped(_folded_matches(bare, policy), bare_spans)
    found = [f for f in found if f[1] > f[0]]
    found.sort()
    merged: list[tuple[int, int, str]] = []
    for start, end, name in found:
        if merged and start < merged[-1][1]:
            s0, e0, n0 = merged[-1]
            merged[-1] = (s0, max(e0, end), n0 if n0 == name else f"{n0}+{name}")
        else:
            merged.append((start, end, name))
    return merged


def _names(hits: list[tuple[int, int, str]]) -> list[str]:
    return sorted({n for _, _, name in hits for n in name.split("+")})


def scan_text(text: str, policy: LeakPolicy) -> tuple[str, list[str]]:
    """Return ``(redacted text, names of what matched)`` for one string (no metrics)."""
    hits = _matches(text, policy)
    out, pos = [], 0
    for start, end, _ in hits:
        out += [text[pos:start], policy.redaction]
        pos = end
    out.append(text[pos:])
    return "".join(out), _names(hits)


def scrub(value: Any, policy: LeakPolicy) -> Any:
    """``value`` (JSON-shaped: dicts, lists, strings, numbers) with every string — dict values
    and list items at any depth, not keys — passed through :func:`scan_text` (matches replaced by
    ``policy.redaction``). Other values are returned unchanged; the input is not modified. Used for
    what the console shows: history and live agent events
    (docs/decisions.md#security-console-leak-check)."""
    if isinstance(value, str):
        return scan_text(value, policy)[0]
    if isinstance(value, dict):
        return {k: scrub(v, policy) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, policy) for v in value]
    return value


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _scan_segment(seg: Segment, policy: LeakPolicy, found: list[list[str]]) -> Segment:
    """Redact one segment: free text in place, a reference-bearing segment replaced whole."""
    if isinstance(seg, TextSegment | MarkdownSegment):
        body = seg.data.text if isinstance(seg, TextSegment) else seg.data.content
        cleaned, names = scan_text(body, policy)
        if not names:
            return seg
        found.append(names)
        return TextSegment.of(cleaned) if isinstance(seg, TextSegment) else MarkdownSegment.of(cleaned)
    hits = [names for v in _strings(seg.data.model_dump(mode="json")) if (names := scan_text(v, policy)[1])]
    if not hits:
        return seg
    found.extend(hits)
    if isinstance(seg, ShareSegment) and not scan_text(seg.data.url, policy)[1]:
        title = scan_text(seg.data.title, policy)[0]
        return ShareSegment(data=ShareData(url=seg.data.url, title=title))
    return TextSegment.of(policy.redaction)


def _text_of(seg: Segment) -> str | None:
    if isinstance(seg, TextSegment):
        return seg.data.text
    if isinstance(seg, MarkdownSegment):
        return seg.data.content
    return None


def _with_text(seg: Segment, text: str) -> Segment:
    return TextSegment.of(text) if isinstance(seg, TextSegment) else MarkdownSegment.of(text)


def _scan_runs(segs: list[Segment], policy: LeakPolicy, found: list[list[str]]) -> list[Segment]:
    """Catch secrets split across consecutive text/markdown segments: hits on the joined text that
    span two or more segments are cut out of each, the redaction placed where the hit starts."""
    out = list(segs)
    i = 0
    while i < len(out):
        if _text_of(out[i]) is None:
            i += 1
            continue
        j = i
        while j < len(out) and _text_of(out[j]) is not None:
            j += 1
        texts = [_text_of(s) or "" for s in out[i:j]]
        bounds, pos = [], 0
        for t in texts:
            bounds.append((pos, pos + len(t)))
            pos += len(t)
        cuts: list[list[tuple[int, int, str]]] = [[] for _ in texts]
        for start, end, name in _matches("".join(texts), policy):
            touched = [k for k, (a, b) in enumerate(bounds) if a < end and start < b]
            if len(touched) < 2:
                continue  # inside one segment: already redacted by _scan_segment
            found.append(name.split("+"))
            for n, k in enumerate(touched):
                a, b = bounds[k]
                cuts[k].append((max(start, a) - a, min(end, b) - a, policy.redaction if n == 0 else ""))
        for k, segment_cuts in enumerate(cuts):
            text = texts[k]
            for a, b, insert in sorted(segment_cuts, reverse=True):
                text = text[:a] + insert + text[b:]
            if segment_cuts:
                out[i + k] = _with_text(out[i + k], text)
        i = j
    return out


def scan_reply(reply: Reply, policy: LeakPolicy) -> LeakResult:
    """Scan every string of ``reply`` (nested ones, and text split across adjacent text/markdown
    segments) and redact or block per ``policy`` (see the module docstring).

    Returns:
        :class:`LeakResult`. Each matching string (or cross-segment span) counts once in
        ``LEAKS(action)``; ``hits`` is that count.
    """
    found: list[list[str]] = []
    segs = [_scan_segment(seg, policy, found) for seg in reply.segments]
    segs = _scan_runs(segs, policy, found)
    if not found:
        return LeakResult(reply=reply)
    names = sorted({n for group in found for n in group})
    metrics.LEAKS.inc(len(found), action=policy.action)
    log.warning("leak check: %d outbound string(s) matched %s; action=%s", len(found), names, policy.action)
    if policy.action == "block":
        return LeakResult(
            reply=Reply.of_text(policy.blocked_text), hits=len(found), blocked=True, patterns=names
        )
    return LeakResult(reply=Reply(segments=segs), hits=len(found), patterns=names)
