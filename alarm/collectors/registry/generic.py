"""``api: json``: any board or API that lists its items as JSON (message boards, paste
sites, issue trackers, an API not listed here).

The configuration says where the list is (``items``) and which fields are the id, size,
time, repository and uploader (dotted paths).  Pages are followed by a ``next`` field (a URL,
relative to the page) or a ``Link: <...>; rel="next"`` header (RFC 8288).  Every poll reads the
whole listing and diffs it by id (listing.py), grouped by repository; an item's bytes are its
``size`` field, or the length of its JSON when there is none (a post's text is its content).

What else a board's API can tell, where the configuration names it (docs/registry-source.md):

- **Edits** (``revision``, ``updated``): an item whose revision or update time changed since
  the last poll was rewritten: one write of its new size, at its update time
  (``items_edited``).  Kept as a second, per-repository set of (id, revision) hashes.
- **Posts deleted before a poll saw them** (``sequence``, ``created_total``): numbers that
  only grow (a per-repository post number, a count of items ever created) say how many items
  were made since the last poll; those the listing does not show were written and are gone
  (or fell off a listing that shows only the newest): each is one write of unknown size
  (``items_deleted_unseen``).  A count of items *now* listed cannot tell this (what was made
  and deleted between two polls leaves it unchanged), so it is not read.
- **Deletions of seen items** are counted (``items_gone``), not metered: a listing of the
  newest items drops old ones the same way.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urljoin

import numpy as np

from alarm.collectors.registry.http import GarbageResponse, PollError
from alarm.collectors.registry.listing import Diff, identity_hash
from alarm.collectors.registry.oci import next_link
from alarm.collectors.registry.poller import Cycle, parse_time

# The per-repository set of (id, revision) hashes and the highest sequence number seen are
# kept as a second index group, named so that no repository's own group can be: repository
# names are read with any NUL replaced (``repository_of``).
REVISIONS = "\x00rev\x00"
# A sequence number or created count is believed up to this (far beyond any board, and the
# difference of two of them stays an int64).
MAX_SEQUENCE = 1 << 62
STATE_CREATED = "created_total"

# The counters this module keeps are declared with the source type (registry_type.py).


def pick(doc: Any, path: str | None) -> Any:
    if not path:
        return doc
    for part in path.split("."):
        if isinstance(doc, dict):
            doc = doc.get(part)
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return None
    return doc


def whole_number(value: Any) -> int | None:
    """A sequence number or count: an int, or a string of at most 18 digits; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_SEQUENCE else None
    if isinstance(value, str) and 0 < len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    return None


def scalar_text(value: Any) -> str | None:
    """A field's value as text for hashing and evidence; None for a missing or nested one."""
    if value is None or isinstance(value, dict | list):
        return None
    return json.dumps(value) if not isinstance(value, str) else value


class Listed:
    """One repository's items in this poll: id hashes in listing order, (id, revision)
    hashes, and sequence numbers."""

    __slots__ = ("ids", "revisions", "sequences")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.revisions: list[int] = []
        self.sequences: list[int] = []


class JsonAdapter:
    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.edits = bool(cfg.revision or cfg.updated)

    def repository_of(self, item: dict[str, Any], source: str) -> str:
        cfg = self.cfg
        repo = pick(item, cfg.repository) if cfg.repository else source
        repo = str(repo) if repo is not None and not isinstance(repo, dict | list) else ""
        return repo.replace("\x00", "\ufffd")

    def revision_of(self, ident: str, item: dict[str, Any]) -> int:
        cfg = self.cfg
        parts = [ident]
        for path in (cfg.revision, cfg.updated):
            if path:
                parts.append(scalar_text(pick(item, path)) or "")
        return identity_hash("\x00".join(parts))

    async def poll(self, cycle: Cycle) -> None:
        cfg = self.cfg
        groups: dict[str, Listed] = {}
        candidates: dict[int, tuple[str, dict[str, Any]]] = {}
        # Bounded by the source's max_pages and max_url_bytes, pages kept as hashes.
        pages = cycle.pages("board")
        url: str | None = cfg.url
        listed = 0
        created: int | None = None
        while url is not None:
            pages.visit(url)
            reply, doc = await cycle.client.get_json(url, headers={"Accept": "application/json"})
            items = pick(doc, cfg.items)
            if not isinstance(items, list):
                raise GarbageResponse(f"{cfg.items or 'body'}: not a list")
            if cfg.created_total and len(pages) == 1:
                created = whole_number(pick(doc, cfg.created_total))
                if created is None:
                    raise GarbageResponse(f"{cfg.created_total}: not a whole number")
            for item in items:
                ident = pick(item, cfg.id)
                if ident is None or isinstance(ident, dict | list):
                    cycle.counts["parse_errors"] += 1
                    continue
                repo = self.repository_of(item, cycle.poller.name)
                group = groups.get(repo)
                if group is None:
                    group = groups[repo] = Listed()
                h = identity_hash(f"{ident}")
                group.ids.append(h)
                if self.edits:
                    group.revisions.append(self.revision_of(str(ident), item))
                if cfg.sequence:
                    n = whole_number(pick(item, cfg.sequence))
                    if n is None:
                        cycle.counts["sequence_unreadable"] += 1
                    else:
                        group.sequences.append(n)
                if not cycle.learning:
                    candidates.setdefault(h, (str(ident), item))
            listed += len(items)
            cycle.counts["records_read"] += len(items)
            if listed > cycle.settings.max_items:
                cycle.counts["listing_truncated"] += 1
                raise PollError("more items than max_items")
            nxt = pick(doc, cfg.next) if cfg.next else None
            url = urljoin(reply.url, nxt) if isinstance(nxt, str) and nxt else next_link(reply)
        seen = set()
        new_items = 0
        for repo, group in groups.items():
            if not cycle.wanted(repo):
                continue
            seen.add(repo)
            current = np.array(group.ids, dtype=np.uint64)
            known = cycle.index.groups.get(repo)
            relearn = repo in cycle.index.relearn
            diff = await cycle.index.diff_off_loop(repo, current)
            cycle.counts["duplicate_items"] += diff.duplicates
            cycle.counts["listing_shrinks"] += diff.shrink_kept
            if known is not None and not (diff.shrink_kept or relearn):
                # Known before and still listed: the distinct listed ones that are not new.
                still = len(current) - diff.duplicates - len(diff.new)
                cycle.counts["items_gone"] += max(0, len(known.hashes) // 8 - still)
            new_items += len(diff.new)
            if self.edits or cfg.sequence:
                seen.add(REVISIONS + repo)
                await self._revisions(cycle, repo, group, diff, candidates, new=known is None)
            cycle.index.commit(diff)
            for i in diff.new:
                self._report(cycle, repo, candidates.get(int(current[i])))
            await cycle.checkpoint()
        if cfg.created_total and created is not None:
            self._created(cycle, created, new_items)
        forgotten, suspicious = cycle.index.forget_missing(seen)
        cycle.counts["groups_forgotten"] += forgotten
        cycle.counts["listing_shrinks"] += suspicious

    async def _revisions(
        self,
        cycle: Cycle,
        repo: str,
        group: Listed,
        ids: Diff,
        candidates: dict[int, tuple[str, dict[str, Any]]],
        new: bool,
    ) -> None:
        """Edits (a known id listed with another revision) and sequence gaps of one
        repository.  The repository's second group holds its (id, revision) hashes and, as
        its validator, the highest sequence number seen."""
        index = cycle.index
        name = REVISIONS + repo
        saved = index.groups.get(name)
        if saved is None:
            # Never kept (a first sight, or kept by a version without edits): learned, so a
            # board's every post is not an edit at once.
            index.relearn.add(name)
        top = saved.validator.get("seq") if saved is not None and saved.validator else None
        highest = whole_number(top)
        seqs = group.sequences
        validator = None
        if seqs:
            listed_top = max(seqs)
            validator = {"seq": str(max(listed_top, highest or 0))}
            if not cycle.learning and (highest is not None or new):
                self._gaps(cycle, repo, seqs, highest, listed_top)
        elif highest is not None:
            validator = {"seq": str(highest)}
        current = np.array(group.revisions, dtype=np.uint64)
        diff = await index.diff_off_loop(name, current, validator)
        index.commit(diff)
        if not self.edits or not len(diff.new) or cycle.learning:
            return
        fresh = set(ids.new.tolist())
        for i in diff.new.tolist():
            if i in fresh:
                continue  # a new item, reported as new
            candidate = candidates.get(group.ids[i])
            if candidate is not None:
                cycle.counts["items_edited"] += 1
                self._report(cycle, repo, candidate, edit=True)

    def _gaps(
        self, cycle: Cycle, repo: str, seqs: list[int], highest: int | None, listed_top: int
    ) -> None:
        """Numbers above the highest seen before that the listing does not show (a
        repository first seen after the first poll numbers from 1, or 0)."""
        floor = highest if highest is not None else 0
        if listed_top <= floor:
            return
        shown = len({n for n in seqs if n > floor})
        self._unseen(cycle, repo, listed_top - floor - shown, f"{repo} #{floor + 1}-{listed_top}")

    def _created(self, cycle: Cycle, created: int, new_items: int) -> None:
        """The board's count of items ever created against the new items listed."""
        state = cycle.state
        before = whole_number(state.get(STATE_CREATED))
        state[STATE_CREATED] = created
        if cycle.learning or before is None or created <= before:
            return
        self._unseen(
            cycle,
            cycle.poller.name,
            created - before - new_items,
            f"{cycle.poller.name} created {before + 1}-{created}",
        )

    def _unseen(self, cycle: Cycle, repo: str, count: int, label: str) -> None:
        if count <= 0:
            return
        limit = cycle.settings.max_items
        if count > limit:
            cycle.counts["sequence_jumps"] += 1
            count = limit
        cycle.counts["items_deleted_unseen"] += count
        cycle.found(
            repo,
            label,
            None,
            label=f"{label}: {count} unseen",
            events=count,
            receipt={"name": repo, "unseen": count, "url": self.cfg.url},
        )

    def _report(
        self,
        cycle: Cycle,
        repo: str,
        candidate: tuple[str, dict[str, Any]] | None,
        edit: bool = False,
    ) -> None:
        cfg = self.cfg
        if candidate is None:  # learning: the starting state
            cycle.counts["baseline_artifacts"] += 1
            return
        ident, item = candidate
        size = pick(item, cfg.size) if cfg.size else None
        if not (isinstance(size, int) and not isinstance(size, bool)):
            size = len(json.dumps(item, separators=(",", ":")).encode()) if not cfg.size else None
        uploader = pick(item, cfg.uploader) if cfg.uploader else None
        at = pick(item, cfg.time) if cfg.time else None
        receipt: dict[str, Any] = {"name": repo, "id": ident, "url": cfg.url}
        if edit:
            at = pick(item, cfg.updated) if cfg.updated else None
            receipt["edited"] = True
        for key, path in (("revision", cfg.revision), ("updated", cfg.updated)):
            if path:
                receipt[key] = scalar_text(pick(item, path))
        cycle.found(
            repo,
            ident,
            size,
            label=f"{repo} {ident}" + (" (edit)" if edit else ""),
            uploaded_at=parse_time(at) if at is not None else None,
            uploader=str(uploader) if isinstance(uploader, str | int) else None,
            receipt=receipt,
        )
