"""What a registry source counted lately, so that an item flapping in and out of a listing is
counted once.

A listing served by several replicas behind a load balancer (one of them lagging), or through
a cache that sometimes answers with an older page, shows an item, then not, then again.  The
index (listing.py) forgets what a complete listing no longer holds — it must, or a deleted
artifact re-uploaded could never be counted — so each return looked new: 7,777 B counted 7
times in 30 s.  This remembers the *fingerprint* of each artifact counted: repository,
artifact, size, capacity, upload time and receipt (digest, revision, URL), hashed to 64 bits.
An item found new again with the same fingerprint is a reappearance, not a write; one that
changed (another size, digest, revision or upload time) is a write and is counted.

Bounded: at most :data:`LIMIT` fingerprints, none older than :data:`WINDOW` since it was last
found (a fingerprint found again is kept as long as it keeps flapping), about 12 bytes each
in the source's saved position.  The cost: an identical re-upload (same name, size, digest
and, where the API gives one, upload time) within the window is not counted again.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from alarm.collectors.registry.listing import identity_hash

LIMIT = 4096  # fingerprints kept; past this the oldest are forgotten
WINDOW = 86400.0  # seconds a fingerprint is kept after it was last found


def fingerprint(
    repository: str,
    artifact: str,
    nbytes: int | None,
    capacity: int | None,
    uploaded_at: float | None,
    receipt: dict[str, Any] | None,
) -> int:
    """The 64-bit hash of everything the API told about one artifact."""
    doc = [repository, artifact, nbytes, capacity, uploaded_at, receipt or {}]
    return identity_hash(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str))


class RecentlyCounted:
    """Fingerprints by when they were last found, oldest first."""

    def __init__(self, limit: int = LIMIT, window: float = WINDOW) -> None:
        self.limit = limit
        self.window = window
        self._when: dict[int, float] = {}  # insertion order is age order (refresh re-inserts)

    def __len__(self) -> int:
        return len(self._when)

    def seen_again(self, key: int, now: float) -> bool:
        """Whether ``key`` was counted within the window; if so it is kept from now on."""
        self._expire(now)
        if self._when.pop(key, None) is None:
            return False
        self._when[key] = now
        return True

    def remember(self, key: int, now: float) -> None:
        self._when.pop(key, None)
        self._when[key] = now
        self._expire(now)

    def _expire(self, now: float) -> None:
        when = self._when
        while when:
            oldest = next(iter(when))
            if len(when) <= self.limit and now - when[oldest] <= self.window:
                break
            del when[oldest]

    def to_json(self) -> dict[str, str]:
        """For the position: hashes and whole seconds as base64 of packed arrays."""
        keys = np.fromiter(self._when.keys(), dtype=np.uint64, count=len(self._when))
        times = np.fromiter(
            (int(t) for t in self._when.values()), dtype=np.uint32, count=len(self._when)
        )
        return {
            "h": base64.b64encode(keys.astype("<u8").tobytes()).decode(),
            "t": base64.b64encode(times.astype("<u4").tobytes()).decode(),
        }

    def restore(self, doc: Any) -> bool:
        """Read back :meth:`to_json`; anything else (an older position: none) leaves it empty.
        Returns whether ``doc`` was readable."""
        self._when.clear()
        if doc is None:
            return True
        try:
            keys = np.frombuffer(base64.b64decode(doc["h"], validate=True), dtype="<u8")
            times = np.frombuffer(base64.b64decode(doc["t"], validate=True), dtype="<u4")
        except (KeyError, TypeError, ValueError):
            return False
        if len(keys) != len(times):
            return False
        order = np.argsort(times, kind="stable")[-self.limit :]
        self._when = {int(keys[i]): float(times[i]) for i in order.tolist()}
        return True
