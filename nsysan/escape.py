"""Escaping of strings that come from a trace (kernel, NVTX, API and GPU names, paths), one
helper per output format. A trace is input from whoever recorded it: a name such as
``<script>``, ``<img onerror=...>``, ``[x](javascript:...)``, ``<!--``, a backtick, a ``|`` or a
newline must show as text, never become markup.

- Markdown prose (finding messages, notes): `md_code` puts the string in a code span, whose
  content Markdown never interprets; the fence is longer than any backtick run inside.
- Markdown table cells, headings and list items: `md_text` backslash-escapes every character
  that could start Markdown or HTML (CommonMark lets any ASCII punctuation be escaped; GFM
  tables then also keep ``|`` inside the cell). A code span in a table cell:
  ``md_code(..., in_table=True)``; nsysan's own Markdown in a cell: `md_cell`.
- Both make the string one line (a newline could end a table row or a paragraph) and show
  control characters as ``\\xNN`` (a terminal would run an escape sequence in ``cat
  findings.md``).
- HTML: `html.escape` (the report escapes every string it writes).
- JSON: nothing to do (``json.dumps`` escapes).
- SQL LIKE: `like_escape` for a literal part of a pattern, used with ``ESCAPE '\\'``.
"""

from __future__ import annotations

import re

#: C0 and C1 control characters other than the whitespace that `_one_line` folds
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
#: what `md_text` escapes: every ASCII character that can start Markdown or an HTML construct
#: inline (emphasis, code, links and images — "[" —, raw HTML and autolinks — "<" —, entities,
#: tables, heading ends, strikethrough) and the backslash itself; "(", "!" and "{" start
#: nothing without an unescaped "[" and stay readable
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&])")
_BACKTICKS = re.compile(r"`+")
LIKE_ESCAPE = "\\"


def _one_line(text: object, limit: int | None) -> str:
    s = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", " ".join(str(text).split()))
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "…"
    return s


def md_code(text: object, limit: int | None = None, *, in_table: bool = False) -> str:
    """``text`` as one Markdown code span: shown literally wherever Markdown is rendered.

    One line, at most ``limit`` characters (cut with "…"); the fence is one backtick longer
    than the longest backtick run of the text, and a space pads a text that starts or ends
    with a backtick (CommonMark strips one such space from each side). ``in_table``: for a
    GFM table cell, which splits on ``|`` even inside a code span unless it is escaped."""
    s = _one_line(text, limit)
    if not s:
        return "` `"
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(s)), default=0) + 1)
    pad = " " if s[0] == "`" or s[-1] == "`" else ""
    span = f"{fence}{pad}{s}{pad}{fence}"
    return md_cell(span) if in_table else span


def md_cell(markdown: str) -> str:
    """Markdown that nsysan wrote (e.g. a message whose trace strings are `md_code` spans) made
    fit for one GFM table cell: one line, every ``|`` escaped (inside code spans too)."""
    return " ".join(markdown.split()).replace("|", "\\|")


def md_text(text: object, limit: int | None = None) -> str:
    """``text`` as inert Markdown text, one line (for table cells, headings, list items):
    every character that could start markup is backslash-escaped. ``limit`` cuts the text
    (before escaping) to that many characters."""
    return _MD_SPECIAL.sub(r"\\\1", _one_line(text, limit))


def like_escape(text: str) -> str:
    """``text`` as a literal part of a SQL LIKE pattern (with ``ESCAPE '\\'``): ``%``, ``_``
    and the escape character itself lose their meaning."""
    return (text.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2).replace("%", LIKE_ESCAPE + "%")
            .replace("_", LIKE_ESCAPE + "_"))


def like_glob(pattern: str) -> str:
    """A LIKE pattern (``ESCAPE '\\'``) for a glob where ``*`` matches any run of characters
    and every other character is itself."""
    return "%".join(like_escape(part) for part in pattern.split("*"))
