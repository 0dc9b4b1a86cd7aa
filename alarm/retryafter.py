"""``Retry-After`` (RFC 9110 §10.2.3), read once for every client that honours it: the
registry poller and the notification senders.

Two copies had drifted: one bounded the wait, the other did not, so a registry answering
``Retry-After: 99999999999`` was not polled again for three thousand years (the time is saved
with the source's position, so a restart did not help).  Both copies also took any Unicode
digit for a number (``"²".isdigit()`` is true; ``float("²")`` raises)."""

from __future__ import annotations

import email.utils
import math


def retry_after(value: str | None, now: float, limit: float) -> float | None:
    """Seconds to wait, from delay-seconds (``120``) or an HTTP-date, at most ``limit``; None
    when absent or not one of the two forms."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), limit)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if not math.isfinite(when):
        return None
    return min(max(0.0, when - now), limit)
