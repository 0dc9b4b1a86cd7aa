"""``api: json``: any board or API that lists its items as JSON (message boards, paste
sites, issue trackers, an API not listed here).

The configuration says where the list is (``items``) and which fields are the id, size,
time, repository and uploader (dotted paths).  Pages are followed by a ``next`` field (a URL,
relative to the page) or a ``Link: <...>; rel="next"`` header (RFC 8288).  Every poll reads the
whole listing and diffs it by id (listing.py), grouped by repository; an item's bytes are its
``size`` field, or the length of its JSON when there is none (a post's text is its content).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urljoin

import numpy as np

from alarm.collectors.registry.http import GarbageResponse, PollError
from alarm.collectors.registry.listing import identity_hash
from alarm.collectors.registry.oci import next_link
from alarm.collectors.registry.poller import Cycle, parse_time

MAX_PAGES = 100_000


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


class JsonAdapter:
    def __init__(self, cfg: Any):
        self.cfg = cfg

    async def poll(self, cycle: Cycle) -> None:
        cfg = self.cfg
        hashes: dict[str, list[int]] = {}
        candidates: dict[int, tuple[str, dict[str, Any]]] = {}
        pages: set[str] = set()
        url: str | None = cfg.url
        listed = 0
        while url is not None:
            if url in pages or len(pages) >= MAX_PAGES:
                raise GarbageResponse("pagination loops")
            pages.add(url)
            reply, doc = await cycle.client.get_json(url, headers={"Accept": "application/json"})
            items = pick(doc, cfg.items)
            if not isinstance(items, list):
                raise GarbageResponse(f"{cfg.items or 'body'}: not a list")
            for item in items:
                ident = pick(item, cfg.id)
                if ident is None or isinstance(ident, dict | list):
                    cycle.counts["parse_errors"] += 1
                    continue
                repo = pick(item, cfg.repository) if cfg.repository else cycle.poller.name
                repo = str(repo) if repo is not None and not isinstance(repo, dict | list) else ""
                h = identity_hash(f"{ident}")
                hashes.setdefault(repo, []).append(h)
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
        for repo, values in hashes.items():
            if not cycle.wanted(repo):
                continue
            seen.add(repo)
            current = np.array(values, dtype=np.uint64)
            diff = await cycle.index.diff_off_loop(repo, current)
            cycle.counts["duplicate_items"] += diff.duplicates
            cycle.counts["listing_shrinks"] += diff.shrink_kept
            cycle.index.commit(diff)
            for i in diff.new:
                self._report(cycle, repo, candidates.get(int(current[i])))
            await cycle.checkpoint()
        forgotten, suspicious = cycle.index.forget_missing(seen)
        cycle.counts["groups_forgotten"] += forgotten
        cycle.counts["listing_shrinks"] += suspicious

    def _report(
        self, cycle: Cycle, repo: str, candidate: tuple[str, dict[str, Any]] | None
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
        cycle.found(
            repo,
            ident,
            size,
            label=f"{repo} {ident}",
            uploaded_at=parse_time(pick(item, cfg.time)) if cfg.time else None,
            uploader=str(uploader) if isinstance(uploader, str | int) else None,
            receipt={"name": repo, "id": ident, "url": cfg.url},
        )
