"""The user's line as evidence: `{"path", "line", "function"}` of the innermost frame that is the user's."""

from __future__ import annotations

import sys
from typing import Any

from torchdoctor.probes.patches import user_site


def here(start: Any = None) -> dict[str, Any] | None:
    """The user's frame around the caller (library, torch and torchdoctor frames skipped), as a dict."""
    return as_dict(user_site(start or sys._getframe(1)))


def as_dict(site: tuple[str, int, str] | None) -> dict[str, Any] | None:
    if site is None:
        return None
    return {"path": site[0], "line": site[1], "function": site[2]}
