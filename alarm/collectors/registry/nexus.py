"""``api: nexus``: Sonatype Nexus Repository 3, read through its Assets REST API.

Follows Sonatype's "Assets API" page (Nexus Repository 3 REST API): ``GET
<base>service/rest/v1/assets?repository=<name>[&continuationToken=<t>]`` answers ``{items:
[{id, downloadUrl, path, repository, format, checksum: {sha1, sha256, md5}, contentType,
lastModified, lastDownloaded, uploader, uploaderIp, fileSize, blobCreated}],
continuationToken}`` (null on the last page; "Pagination" in the same documentation).

The whole listing is read every poll and diffed by asset ``id`` and ``sha1`` (an asset
overwritten in place keeps its id, not its checksum), grouped by repository and directory
(``<repository>/<dirname of path>``: what surfaces match on).  Bytes are ``fileSize`` where
the server gives it (newer 3.x), else the download's ``Content-Length``; the time is
``blobCreated`` (else ``lastModified``); the uploader is ``uploader``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import numpy as np

from alarm.collectors.registry.http import GarbageResponse, PollError
from alarm.collectors.registry.listing import identity_hash
from alarm.collectors.registry.poller import Cycle, parse_time


def group_of(item: dict[str, Any]) -> tuple[str, str]:
    """(``<repository>/<directory>``, file name) of an asset."""
    repo = str(item.get("repository") or "")
    path = str(item.get("path") or "").strip("/")
    directory, _, name = path.rpartition("/")
    return (f"{repo}/{directory}" if directory else repo), name


class NexusAdapter:
    def __init__(self, cfg: Any):
        self.base = cfg.url if cfg.url.endswith("/") else cfg.url + "/"
        self.repositories = list(cfg.repositories)

    async def poll(self, cycle: Cycle) -> None:
        seen: set[str] = set()
        for repository in self.repositories:
            await self._repository(cycle, repository, seen)
            await cycle.checkpoint()
        forgotten, suspicious = cycle.index.forget_missing(seen)
        cycle.counts["groups_forgotten"] += forgotten
        cycle.counts["listing_shrinks"] += suspicious

    async def _repository(self, cycle: Cycle, repository: str, seen: set[str]) -> None:
        url = f"{self.base}service/rest/v1/assets?repository={quote(repository)}"
        hashes: dict[str, list[int]] = {}
        # Items not known before (candidates): their metadata is kept until the diff.
        candidates: dict[int, dict[str, Any]] = {}
        known: dict[str, set[int]] = {}
        # Tokens kept as 8-byte hashes; a repeated, endless or enormous one fails the poll.
        trail = cycle.pages("assets", "continuationToken repeats")
        listed = 0
        token: str | None = None
        while True:
            page_url = url if token is None else f"{url}&continuationToken={quote(token)}"
            _, doc = await cycle.client.get_json(page_url)
            items = doc.get("items") if isinstance(doc, dict) else None
            if not isinstance(items, list):
                raise GarbageResponse("assets: no 'items' list")
            for item in items:
                if not isinstance(item, dict) or not item.get("id"):
                    cycle.counts["parse_errors"] += 1
                    continue
                group, _ = group_of(item)
                checksum = item.get("checksum") if isinstance(item.get("checksum"), dict) else {}
                h = identity_hash(f"{item['id']}#{checksum.get('sha1', '')}")
                hashes.setdefault(group, []).append(h)
                if group not in known:
                    known[group] = (
                        set(cycle.index.groups[group].known().tolist())
                        if group in cycle.index.groups
                        else set()
                    )
                if h not in known[group] and not cycle.learning:
                    candidates.setdefault(h, item)
            listed += len(items)
            cycle.counts["records_read"] += len(items)
            if listed > cycle.settings.max_items:
                cycle.counts["listing_truncated"] += 1
                raise PollError(f"assets of {repository}: more than max_items")
            token = doc.get("continuationToken")
            if not token:
                break
            token = str(token)
            trail.visit(token)
        for group, values in hashes.items():
            if not cycle.wanted(group):
                continue
            seen.add(group)
            current = np.array(values, dtype=np.uint64)
            diff = await cycle.index.diff_off_loop(group, current)
            cycle.counts["duplicate_items"] += diff.duplicates
            cycle.counts["listing_shrinks"] += diff.shrink_kept
            new = [candidates.get(int(current[i])) for i in diff.new]
            sizes = []
            for item in new:
                size = item.get("fileSize") if item else None
                if item and not isinstance(size, int) and isinstance(item.get("downloadUrl"), str):
                    size, _ = await cycle.client.probe(item["downloadUrl"])
                sizes.append(size if isinstance(size, int) and not isinstance(size, bool) else None)
            cycle.index.commit(diff)
            for item, size in zip(new, sizes, strict=True):
                self._report(cycle, group, item, size)
            await cycle.checkpoint()

    def _report(
        self, cycle: Cycle, group: str, item: dict[str, Any] | None, size: int | None
    ) -> None:
        if item is None:  # learning: the starting state
            cycle.counts["baseline_artifacts"] += 1
            return
        _, name = group_of(item)
        checksum = item.get("checksum") if isinstance(item.get("checksum"), dict) else {}
        digest = checksum.get("sha256") or checksum.get("sha1")
        algo = "sha256" if checksum.get("sha256") else "sha1"
        cycle.found(
            group,
            name,
            size,
            label=f"{group}/{name}",
            uploaded_at=parse_time(item.get("blobCreated")) or parse_time(item.get("lastModified")),
            uploader=str(item["uploader"]) if item.get("uploader") else None,
            receipt={
                "name": str(item.get("path") or ""),
                "file": name,
                "digest": f"{algo}:{digest}" if digest else None,
                "url": item.get("downloadUrl"),
                "id": str(item["id"]),
                "uploader_ip": item.get("uploaderIp"),
            },
        )
