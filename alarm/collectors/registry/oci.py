"""``api: oci`` (or ``docker``): a Docker Registry HTTP API v2 / OCI distribution registry.

Follows the OCI Distribution Specification v1.1 ("Listing Tags", "Pulling manifests") and the
Docker Registry v2 API's catalog (``GET /v2/_catalog?n=<n>``): repositories from the catalog,
tags from ``/v2/<name>/tags/list?n=<n>``, both paged by the ``Link: <...>; rel="next"`` header
(RFC 8288).  Each tag's manifest digest comes from ``HEAD /v2/<name>/manifests/<tag>``
(``Docker-Content-Digest``), so a tag pushed again with other content is a new write; a tag's
identity is ``tag@digest``.

Bytes of a new tag: its manifest's length plus the ``size`` of its config and layers (for an
index, of every manifest it lists).  Layers shared with images already there are counted again:
the figure is the image's size, an upper bound on what the push wrote.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import quote, urljoin

from alarm.collectors.registry.http import GarbageResponse, PollError, Reply
from alarm.collectors.registry.listing import hashes_of
from alarm.collectors.registry.poller import Cycle

PAGE = 1000  # entries asked for per catalog or tags page
REPOS_AT_ONCE = 16
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)
INDEX_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)
_NEXT = re.compile(r'<([^>]*)>\s*;\s*rel="?next"?')


def next_link(reply: Reply) -> str | None:
    for value in reply.headers.getall("Link", []):
        match = _NEXT.search(value)
        if match:
            return urljoin(reply.url, match.group(1))
    return None


def descriptor_size(d: Any) -> int:
    size = d.get("size") if isinstance(d, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0


class OciAdapter:
    def __init__(self, cfg: Any):
        base = cfg.url if cfg.url.endswith("/") else cfg.url + "/"
        self.v2 = base if base.endswith("/v2/") else base + "v2/"
        self.page = PAGE

    async def _paged(self, cycle: Cycle, url: str, key: str) -> list[str]:
        out: list[str] = []
        trail = cycle.pages(key)  # bounded: a Link loop or endless links fail the poll
        next_url: str | None = url
        while next_url is not None:
            trail.visit(next_url)
            reply, doc = await cycle.client.get_json(next_url)
            items = doc.get(key) if isinstance(doc, dict) else None
            if items is None and isinstance(doc, dict) and key in doc:
                items = []  # "tags": null for a repository without tags
            if not isinstance(items, list):
                raise GarbageResponse(f"{key}: not a list")
            out.extend(str(i) for i in items)
            if len(out) > cycle.settings.max_items:
                cycle.counts["listing_truncated"] += 1
                raise PollError(f"{key}: more than max_items listed")
            next_url = next_link(reply)
        return out

    async def poll(self, cycle: Cycle) -> None:
        repos = await self._paged(cycle, f"{self.v2}_catalog?n={self.page}", "repositories")
        repos = sorted({r for r in repos if cycle.wanted(r)})
        for start in range(0, len(repos), REPOS_AT_ONCE):
            async with asyncio.TaskGroup() as tg:
                for repo in repos[start : start + REPOS_AT_ONCE]:
                    tg.create_task(self._repository(cycle, repo))
            await cycle.checkpoint()
        forgotten, suspicious = cycle.index.forget_missing(set(repos))
        cycle.counts["groups_forgotten"] += forgotten
        cycle.counts["listing_shrinks"] += suspicious

    def _manifest_url(self, repo: str, ref: str) -> str:
        return f"{self.v2}{quote(repo, safe='/')}/manifests/{quote(ref, safe=':@')}"

    async def _repository(self, cycle: Cycle, repo: str) -> None:
        tags = await self._paged(
            cycle, f"{self.v2}{quote(repo, safe='/')}/tags/list?n={self.page}", "tags"
        )
        cycle.counts["records_read"] += len(tags)
        digests = list(await asyncio.gather(*(self._digest(cycle, repo, t) for t in tags)))
        diff = await cycle.index.diff_off_loop(
            repo, hashes_of(f"{t}@{d}" for t, d in zip(tags, digests, strict=True))
        )
        cycle.counts["duplicate_items"] += diff.duplicates
        cycle.counts["listing_shrinks"] += diff.shrink_kept
        new = [(tags[i], digests[i]) for i in diff.new]
        sizes: list[int | None] = []
        if not cycle.learning:
            for tag, _ in new:
                sizes.append(await self._image_size(cycle, repo, tag))
        cycle.index.commit(diff)
        for (tag, digest), size in zip(new, sizes or [None] * len(new), strict=True):
            cycle.found(
                repo,
                tag,
                size,
                label=f"{repo}:{tag}" + (f"@{digest}" if digest else ""),
                receipt={
                    "name": repo,
                    "version": tag,
                    "digest": digest or None,
                    "url": self._manifest_url(repo, digest or tag),
                },
            )

    async def _digest(self, cycle: Cycle, repo: str, tag: str) -> str:
        head = await cycle.client.get(
            self._manifest_url(repo, tag),
            method="HEAD",
            headers={"Accept": MANIFEST_TYPES},
            ok=frozenset({200, 404}),
        )
        return head.headers.get("Docker-Content-Digest", "") if head.status == 200 else ""

    async def _image_size(self, cycle: Cycle, repo: str, ref: str, depth: int = 0) -> int | None:
        try:
            reply, doc = await cycle.client.get_json(
                self._manifest_url(repo, ref), headers={"Accept": MANIFEST_TYPES}
            )
        except GarbageResponse:
            cycle.counts["garbage_responses"] += 1
            return None
        if not isinstance(doc, dict):
            cycle.counts["garbage_responses"] += 1
            return None
        media = doc.get("mediaType") or reply.headers.get("Content-Type", "").split(";")[0]
        total = len(reply.body)
        if media in INDEX_TYPES or isinstance(doc.get("manifests"), list):
            if depth > 0:
                return total  # an index inside an index: not followed further
            for child in doc.get("manifests") or []:
                digest = child.get("digest") if isinstance(child, dict) else None
                if isinstance(digest, str):
                    size = await self._image_size(cycle, repo, digest, depth + 1)
                    total += size if size is not None else descriptor_size(child)
            return total
        total += descriptor_size(doc.get("config"))
        for layer in doc.get("layers") or []:
            total += descriptor_size(layer)
        return total
