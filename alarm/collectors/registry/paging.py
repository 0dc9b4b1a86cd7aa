"""The pages of one paged listing in one poll (a catalog, a tag list, an asset listing, a
change feed): how many, and whether the server is sending the poller round in circles.

A page is remembered by an 8-byte BLAKE2b hash of its URL or continuation token, never by the
text itself: a server that makes up 60 kB paging links costs 8 bytes (plus a set slot) a page,
not 60 kB.  A listing may have at most ``max_pages`` pages in one poll
(``pages_over_limit``), and a link or token longer than ``max_url_bytes`` is not followed
(``urls_too_long``); both fail the poll.  A repeated page is a loop (``garbage_responses``).
So a paged listing holds at most ``max_pages`` x ~70 bytes for its trail, whatever the server
sends.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from alarm.collectors.registry.http import GarbageResponse, PollError


class PageTrail:
    __slots__ = ("_seen", "counts", "loop", "max_pages", "max_url_bytes", "what")

    def __init__(
        self,
        what: str,
        max_pages: int,
        max_url_bytes: int,
        counts: Counter[str],
        loop: str = "pagination loops",
    ):
        self.what = what
        self.loop = loop
        self.max_pages = max_pages
        self.max_url_bytes = max_url_bytes
        self.counts = counts
        self._seen: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._seen)

    def visit(self, page: str) -> None:
        """Note the next page (its URL or token) before it is read.  Raises
        :class:`PollError` when it is too long or one too many, :class:`GarbageResponse`
        when it was read before in this poll (a loop)."""
        if len(page) > self.max_url_bytes:
            self.counts["urls_too_long"] += 1
            raise PollError(
                f"{self.what}: a paging link of {len(page)} bytes, over max_url_bytes "
                f"({self.max_url_bytes}): not followed"
            )
        key = hashlib.blake2b(page.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        if key in self._seen:
            raise GarbageResponse(f"{self.what}: {self.loop}")
        if len(self._seen) >= self.max_pages:
            self.counts["pages_over_limit"] += 1
            raise PollError(
                f"{self.what}: more than max_pages ({self.max_pages}) pages in one poll"
            )
        self._seen.add(key)
