"""Reading and validating what a user pastes or pipes into `torchdoctor ask`."""

from __future__ import annotations

import re
import sys

MAX_BYTES = 512 * 1024  # a traceback is a few KiB; a whole log should be cut to its end

# Control characters a pasted log may carry (a terminal bell, a form feed, a stray escape): stripped like
# ANSI colour codes. Only when they are a sizeable share of the text is it binary rather than a log.
_CONTROL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
BINARY_SHARE = 0.05  # more control characters than this share of the text: binary, not a pasted log
BINARY_MIN = 8  # ... and at least this many (a short paste with one bell is still text)


class InputError(ValueError):
    """A one-line, user-facing reason the input cannot be triaged."""


def read_stdin(limit: int = MAX_BYTES, hint: str = "pipe the text in, e.g. `python train.py 2>&1 | torchdoctor ask -`") -> bytes:
    """Up to `limit + 1` bytes of standard input (one more than allowed, so callers can tell it was too long).

    Bounded, so an endless stream (`yes | …`, `< /dev/zero`) is refused instead of filling memory;
    a closed standard input (`<&-`: Python sets sys.stdin to None) or a read error is an InputError.
    """
    stream = sys.stdin
    if stream is None or getattr(stream, "buffer", None) is None:
        raise InputError(f"standard input is closed: {hint}.")
    try:
        return stream.buffer.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read standard input: {exc.strerror or exc}.") from None


def is_terminal(stream) -> bool:
    """Whether a standard stream is an open terminal (a closed one is None)."""
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


def decode(data: bytes, where: str = "standard input") -> str:
    if len(data) > MAX_BYTES:
        raise InputError(
            f"{where} is over {MAX_BYTES // 1024} KiB; torchdoctor reads at most {MAX_BYTES // 1024} KiB. "
            "Pass the end of the log, e.g. `python train.py 2>&1 | tail -n 200 | torchdoctor ask -`."
        )
    if b"\x00" in data:
        raise InputError(f"{where} contains NUL bytes: it looks like a binary file, not text.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where} is not UTF-8 text (invalid byte at offset {exc.start}).") from None
    return clean(text, where)


def _overwritten(text: str) -> str:
    """Keep what a terminal would show of `\r` progress bars: the last segment of each line."""
    if "\r" not in text:
        return text
    lines = []
    for line in text.split("\n"):
        segments = [s for s in line.split("\r") if s.strip()]
        lines.append(segments[-1] if segments else "")
    return "\n".join(lines)


def clean(text: str, where: str = "the text") -> str:
    """Strip terminal colour codes, carriage returns and stray control characters; refuse binary."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # argv bytes that were not UTF-8 arrive as lone surrogates
        raise InputError(f"{where} is not UTF-8 text (invalid byte at character {exc.start}).") from None
    if size > MAX_BYTES:
        raise InputError(f"{where} is longer than {MAX_BYTES // 1024} KiB; pass the end of the log instead.")
    if "\x00" in text:
        raise InputError(f"{where} contains NUL bytes: it looks like a binary file, not text.")
    text = _overwritten(_ANSI.sub("", text).replace("\r\n", "\n"))
    controls = len(_CONTROL.findall(text))
    if controls > max(BINARY_MIN, len(text) * BINARY_SHARE):
        raise InputError(f"{where} is mostly control characters ({controls} of {len(text)}): it looks binary, not text.")
    if controls:
        text = _CONTROL.sub(_control_replacement, text)
    if not text.strip():
        raise InputError(f"{where} is empty: describe the problem or paste the error message.")
    return text


def _control_replacement(match: re.Match[str]) -> str:
    """A vertical tab or form feed separates lines; every other control character is dropped."""
    return "\n" if match.group() in "\x0b\x0c" else ""
