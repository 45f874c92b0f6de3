"""A `.gitignore` matcher: the subset of git's rules that source trees use.

Supported: comments and blank lines, `!` negation, a trailing `/` for
directories only, anchoring (a `/` at the start or in the middle ties a pattern
to the directory of its file), `*`, `?`, `[...]` and `**` (leading `**/`,
trailing `/**`, and `a/**/b`), backslash escapes and trailing-space trimming.
Not supported: `core.excludesFile` and `.git/info/exclude`.

As in git, the last matching pattern decides, patterns of a deeper
`.gitignore` override those above it, and a file inside an ignored directory
is ignored (the walker never enters that directory).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    text: str


def _translate(glob: str) -> str:
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if glob.startswith("**", i):
                j = i + 2
                at_start = i == 0 or glob[i - 1] == "/"
                if at_start and j < n and glob[j] == "/":
                    out.append("(?:.*/)?")  # `**/`: zero or more directories
                    i = j + 1
                    continue
                out.append(".*")
                i = j
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = glob.find("]", i + 2 if glob[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_pattern(line: str) -> Pattern | None:
    """One line of a .gitignore -> a Pattern, or None for blanks and comments."""
    text = line.rstrip("\n").rstrip("\r")
    # Trailing spaces are ignored unless escaped with a backslash.
    while text.endswith(" ") and not text.endswith("\\ "):
        text = text[:-1]
    if not text or text.startswith("#"):
        return None
    negate = text.startswith("!")
    if negate:
        text = text[1:]
    elif text.startswith("\\!") or text.startswith("\\#"):
        text = text[1:]
    dir_only = text.endswith("/")
    body = text.rstrip("/")
    if not body:
        return None
    anchored = "/" in body
    body = body.lstrip("/")
    prefix = "^" if anchored else "^(?:.*/)?"
    return Pattern(re.compile(prefix + _translate(body) + "$"), negate, dir_only, line.strip())


class IgnoreFile:
    """The patterns of one `.gitignore` (or the `exclude` setting), relative to `base`."""

    def __init__(self, base: str, lines: Iterable[str]):
        self.base = base.rstrip("/")
        self.patterns = [p for p in (compile_pattern(line) for line in lines) if p is not None]

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """True (ignored), False (re-included by `!`) or None (no pattern matched)."""
        verdict: bool | None = None
        for p in self.patterns:
            if p.dir_only and not is_dir:
                continue
            if p.regex.match(rel):
                verdict = not p.negate
        return verdict


def relative_to(path: str, base: str) -> str | None:
    """`path` relative to `base` with forward slashes, or None when outside it."""
    if not base:
        return path
    if path == base:
        return ""
    prefix = base + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def is_ignored(files: Iterable[IgnoreFile], path: str, is_dir: bool) -> bool:
    """Whether `path` (absolute, forward slashes) is ignored by the chain of files, outermost first."""
    verdict = False
    for f in files:
        rel = relative_to(path, f.base)
        if not rel:
            continue
        decided = f.decide(rel, is_dir)
        if decided is not None:
            verdict = decided
    return verdict


def matches_path_or_parent(f: IgnoreFile, rel: str) -> bool:
    """Whether `rel` (a file) or one of its parent directories matches (for per-file-ignores)."""
    if f.decide(rel, is_dir=False):
        return True
    parts = rel.split("/")
    return any(f.decide("/".join(parts[:i]), is_dir=True) for i in range(1, len(parts)))
