"""Why a registry source cannot see, by cause, as ``health.blind`` says it.

Two causes, each set and cleared by its own judge: ``poll`` — no successful poll for
``blind_after`` (poller.py) — and ``canary`` — a canary not listed within its deadline, or
its uploads failing (canary.py).  ``health.blind`` is their messages joined by ``; `` (the
poll's first), ``""`` when neither holds: the one mechanism behind the service's
``surface_blind`` alarm and ``capalarm_source_blind``, whichever cause it is.
"""

from __future__ import annotations

import urllib.parse

from alarm.events import SourceHealth
from alarm.sanitize import sanitize

CAUSES = ("poll", "canary")


def age_text(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``: whole units, rounded down (a blind message's age)."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def shown_url(url: str) -> str:
    """The registry's URL for a health message: no userinfo, query or fragment (they may
    carry credentials), control characters escaped, bounded."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return sanitize(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")))


class Sight:
    """The causes of a source's blindness; writes ``health.blind`` whenever one changes."""

    def __init__(self, health: SourceHealth) -> None:
        self.health = health
        self._why: dict[str, str] = {}

    def get(self, cause: str) -> str:
        return self._why.get(cause, "")

    def set(self, cause: str, message: str) -> None:
        """``message`` is why ``cause`` makes the source blind; "" clears it."""
        assert cause in CAUSES, cause
        if message:
            self._why[cause] = message
        else:
            self._why.pop(cause, None)
        self.health.blind = "; ".join(self._why[c] for c in CAUSES if c in self._why)
