"""One way to shorten a text for a report: cut at a limit, with an ellipsis that says so."""

from __future__ import annotations


def clip(text: str, limit: int, one_line: bool = False) -> str:
    """`text` cut to at most `limit` characters, the last one `…` when something was cut.

    `one_line` first folds every run of whitespace (newlines included) into one space: a quoted
    command line or error message then fits in a sentence.
    """
    if one_line:
        text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
