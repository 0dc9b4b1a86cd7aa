"""What a registry held at the last complete look, kept small, and diffed against what it holds now.

Listings (PyPI project pages, npm ``time`` maps, image tags, Nexus assets, JSON boards) are
compared, not replayed: an artifact is *new* when its identity was not there before.  The
identity is the adapter's choice and includes the content's digest where the API gives one,
so a tag moved to a new manifest or a file overwritten in place is a new write.

Memory: each artifact is one 64-bit BLAKE2b hash of its identity (collisions: about 1 in
10^19 per pair, irrelevant at registry scale), held per *group* (a project, package, image
repository, directory) as the bytes of a sorted ``uint64`` array, with the group's HTTP
validator for a conditional re-read.  A group is one ledger row (``g:<group>``), written only
when it changed, so a restart reads back exactly what was known and nothing else.

Shrinks are not trusted blindly: a group whose listing suddenly loses more than half of what
it had (a server glitch, a cache returning an empty page) keeps the missing identities
(``listing_shrinks``), so that when they reappear they are not a storm of false "new".  The
cost: an identical re-upload (same name and digest) after a large real deletion is not
counted again.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

LEDGER_PREFIX = "g:"
# A group must have had this many artifacts before a shrink is judged suspicious.
SHRINK_MIN_KNOWN = 4
SMALL_GROUP = 256  # groups up to this size are diffed with sets, larger ones with numpy


def identity_hash(identity: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
        "little",
    )


def _shrunk(known: int, missing: int) -> bool:
    return known >= SHRINK_MIN_KNOWN and missing * 2 > known


def _diff_small(
    current: np.ndarray, known: np.ndarray, relearn: bool
) -> tuple[list[int], np.ndarray, int, bool]:
    """Sets: for the common small group, numpy's per-call cost would dominate."""
    known_set = set(known.tolist())
    seen: set[int] = set()
    new: list[int] = []
    for i, h in enumerate(current.tolist()):
        if h in seen:
            continue
        seen.add(h)
        if h not in known_set and not relearn:
            new.append(i)
    duplicates = len(current) - len(seen)
    shrink_kept = _shrunk(len(known_set), len(known_set - seen))
    keep = seen | known_set if shrink_kept else seen
    return new, np.array(sorted(keep), dtype=np.uint64), duplicates, shrink_kept


def _diff_large(
    current: np.ndarray, known: np.ndarray, relearn: bool
) -> tuple[np.ndarray, np.ndarray, int, bool]:
    unique = np.unique(current)
    duplicates = len(current) - len(unique)
    if relearn:
        new = np.empty(0, dtype=np.intp)
    else:
        new = np.flatnonzero(~np.isin(current, known))
        if duplicates and len(new):  # of a repeated new identity only its first listing
            _, first = np.unique(current[new], return_index=True)
            new = np.sort(new[first])
    missing = len(np.setdiff1d(known, unique, assume_unique=True))
    shrink_kept = _shrunk(len(known), missing)
    keep = np.union1d(unique, known) if shrink_kept else unique
    return new, keep, duplicates, shrink_kept


def page_digest(body: bytes | bytearray) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


def hashes_of(identities: Iterable[str]) -> np.ndarray:
    return np.fromiter((identity_hash(i) for i in identities), dtype=np.uint64)


@dataclass(slots=True)
class Group:
    hashes: bytes  # sorted uint64, native order
    validator: dict[str, str] | None = None
    # A 16-byte BLAKE2b digest of the page this group was last read from (in memory only):
    # the same bytes again list the same artifacts, so the page need not be parsed, hashed
    # or diffed (a validator computed here, for servers that send none).
    page: bytes | None = None

    def known(self) -> np.ndarray:
        return np.frombuffer(self.hashes, dtype=np.uint64)

    def to_json(self) -> str:
        doc: dict[str, object] = {"h": base64.b64encode(self.hashes).decode()}
        if self.validator:
            doc["v"] = self.validator
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Group:
        doc = json.loads(text)
        raw = base64.b64decode(doc["h"])
        if len(raw) % 8:
            raise ValueError("hash bytes not a multiple of 8")
        validator = doc.get("v")
        if validator is not None and not isinstance(validator, dict):
            raise ValueError("validator is not an object")
        return cls(raw, validator)


@dataclass(slots=True)
class Diff:
    """A group's listing against what was known; nothing is remembered until
    :meth:`ArtifactIndex.commit` (so an adapter can look sizes up first, then commit the
    group together with the events it reports)."""

    group: str
    new: np.ndarray  # indices into the current listing of identities not known before
    duplicates: int  # identities listed more than once
    shrink_kept: bool  # the listing lost most of the group: missing identities are kept
    keep: Group | None  # what to remember; None: unchanged


class ArtifactIndex:
    """Known identities by group.  ``changed`` collects the ledger rows to write."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.changed: dict[str, str | None] = {}
        self.bad_rows = 0
        # Groups whose saved row was unreadable: their next listing is learned, not counted.
        self.relearn: set[str] = set()

    def load(self, rows: Iterable[tuple[str, str]]) -> None:
        for key, text in rows:
            if not key.startswith(LEDGER_PREFIX):
                continue
            try:
                self.groups[key[len(LEDGER_PREFIX) :]] = Group.from_json(text)
            except (ValueError, KeyError, TypeError):
                self.bad_rows += 1
                self.relearn.add(key[len(LEDGER_PREFIX) :])

    def __len__(self) -> int:
        return len(self.groups)

    def artifacts(self) -> int:
        return sum(len(g.hashes) // 8 for g in self.groups.values())

    def validator(self, group: str) -> dict[str, str] | None:
        g = self.groups.get(group)
        return g.validator if g is not None else None

    def same_page(self, group: str, page: bytes, validator: dict[str, str] | None) -> bool:
        """Whether ``group`` was last read from exactly this page (its digest, see
        :func:`page_digest`) with the same validator: then nothing in it changed."""
        g = self.groups.get(group)
        return (
            g is not None
            and g.page is not None
            and g.page == page
            and g.validator == (validator or None)
            and group not in self.relearn
        )

    def note_page(self, group: str, page: bytes) -> None:
        """After :meth:`commit`: the group now describes the page with this digest."""
        g = self.groups.get(group)
        if g is not None:
            g.page = page

    def diff(
        self, group: str, current: np.ndarray, validator: dict[str, str] | None = None
    ) -> Diff:
        """Compare a group's complete current listing (hashes, in listing order) with what
        was known, and say which entries are new."""
        old = self.groups.get(group)
        known = old.known() if old is not None else np.empty(0, dtype=np.uint64)
        validator = validator or None
        relearn = group in self.relearn
        if len(current) <= SMALL_GROUP and len(known) <= SMALL_GROUP:
            new_list, keep, duplicates, shrink_kept = _diff_small(current, known, relearn)
            new = np.array(new_list, dtype=np.intp)
        else:
            new, keep, duplicates, shrink_kept = _diff_large(current, known, relearn)
        unchanged = (
            old is not None
            and not relearn
            and validator == old.validator
            and np.array_equal(keep, known)
        )
        return Diff(
            group,
            new,
            duplicates,
            shrink_kept,
            None if unchanged else Group(keep.tobytes(), validator),
        )

    async def diff_off_loop(
        self, group: str, current: np.ndarray, validator: dict[str, str] | None = None
    ) -> Diff:
        """:meth:`diff`, in a worker thread when the group is large (numpy on 10^5-10^6
        hashes takes tens to hundreds of ms).  Reads the group only: commits stay on the
        loop."""
        if len(current) <= SMALL_GROUP:
            return self.diff(group, current, validator)
        return await asyncio.to_thread(self.diff, group, current, validator)

    def commit(self, diff: Diff) -> None:
        self.relearn.discard(diff.group)
        if diff.keep is not None:
            self.set(diff.group, diff.keep)

    def set(self, group: str, value: Group) -> None:
        self.groups[group] = value
        self.changed[LEDGER_PREFIX + group] = value.to_json()

    def forget(self, groups: Iterable[str]) -> int:
        n = 0
        for group in groups:
            if self.groups.pop(group, None) is not None:
                self.changed[LEDGER_PREFIX + group] = None
                n += 1
        return n

    def forget_missing(self, seen: set[str]) -> tuple[int, bool]:
        """After a complete listing of every group: forget groups no longer listed, unless
        they held most of what was known (then they are kept: a glitch, not a purge).
        Returns (forgotten, kept_because_suspicious)."""
        missing = [g for g in self.groups if g not in seen]
        lost = sum(len(self.groups[g].hashes) // 8 for g in missing)
        if lost >= SHRINK_MIN_KNOWN and lost * 2 > self.artifacts():
            return 0, True
        return self.forget(missing), False

    def take_changes(self) -> dict[str, str | None]:
        out, self.changed = self.changed, {}
        return out

    def items(self) -> Iterator[tuple[str, Group]]:
        return iter(self.groups.items())
