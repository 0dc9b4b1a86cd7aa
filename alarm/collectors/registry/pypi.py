"""``api: pypi``: a Python package index through its simple repository API.

- PEP 691 JSON (``application/vnd.pypi.simple.v1+json``) where the server speaks it, PEP 503
  HTML otherwise (pypiserver serves HTML only); the index page lists projects, each project
  page its files.
- PEP 700 (api-version 1.1) gives each file's ``size`` and ``upload-time``; where the page
  does not (PEP 503 HTML, devpi's 1.0 JSON) a HEAD of the file gives ``Content-Length`` and
  ``Last-Modified`` — only for files that are new, never for the starting state.
- A file's identity is its filename and sha256 (from ``hashes`` or the ``#sha256=`` URL
  fragment of PEP 503), so a file replaced under the same name is a new upload.
- devpi (every response carries ``X-Devpi-Serial``, its changelog serial): an unchanged serial
  means nothing changed, and the poll reads only the index page.  devpi's replication
  changelog itself (``/+changelog/{serial}``) needs a replica's identity and is devpi's own
  binary format, so the serial is read from that header instead.  New files' uploaders come
  from devpi's JSON API (``/<user>/<index>/<project>``: ``+links[].log[] {what: upload, who,
  when}``).
- Project names are compared normalized (PEP 503: runs of ``-_.`` to ``-``, lower case).
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import numpy as np

from alarm.collectors.registry.decode import element_at, object_with_array, text_estimate
from alarm.collectors.registry.http import (
    PARSE_OFF_LOOP_BYTES,
    GarbageResponse,
    PollError,
    RegistryClient,
    Reply,
    safe_url,
)
from alarm.collectors.registry.listing import hashes_of, identity_hash, page_digest
from alarm.collectors.registry.names import normalize
from alarm.collectors.registry.poller import Cycle, parse_time

ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
    "text/html;q=0.1"
)
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
PROJECTS_AT_ONCE = 64  # project pages in flight at once (the client limits connections)
# JSON pages larger than this are read without decoding their array whole (decode.py): a
# page of 64 KiB is about 200 files; a real project past that is rare, a hostile one common.
STREAM_BYTES = 64 * 1024
_SDIST = (".tar.gz", ".tar.bz2", ".tgz", ".zip", ".tar.xz", ".tar")


def version_of(filename: str) -> str:
    """The version a distribution filename names (wheel: PEP 427; sdist: name-version.ext)."""
    if filename.endswith(".whl") or filename.endswith(".egg"):
        parts = filename.split("-")
        return parts[1] if len(parts) > 2 else ""
    for ext in _SDIST:
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            return stem.rsplit("-", 1)[1] if "-" in stem else ""
    return ""


class _Anchors(HTMLParser):
    """``<a href=...>text</a>`` pairs of a PEP 503 page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def anchors(html: str) -> list[tuple[str, str]]:
    parser = _Anchors()
    parser.feed(html)
    parser.close()
    return parser.links


@dataclass(slots=True)
class DistFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None
    uploaded_at: float | None

    @property
    def identity(self) -> str:
        return f"{self.filename}#{self.sha256 or ''}"


def is_json(reply: Reply) -> bool:
    return reply.headers.get("Content-Type", "").split(";")[0].strip() == JSON_TYPE


def _dist_file(base: str, f: dict[str, Any]) -> DistFile:
    """A PEP 691 file entry as a record: its URL joined and its time parsed (new files only)."""
    hashes = f.get("hashes") if isinstance(f.get("hashes"), dict) else {}
    size = f.get("size")
    return DistFile(
        f["filename"],
        urljoin(base, str(f.get("url", ""))),
        str(hashes["sha256"]) if "sha256" in hashes else None,
        size if isinstance(size, int) and not isinstance(size, bool) else None,
        parse_time(f.get("upload-time")),
    )


def _json_identity(f: Any) -> str | None:
    """``filename#sha256`` of a PEP 691 file entry; None for an entry without a filename."""
    if not isinstance(f, dict):
        return None
    filename = f.get("filename")
    if not isinstance(filename, str):
        return None
    hashes = f.get("hashes")
    if isinstance(hashes, dict) and "sha256" in hashes:
        return f"{filename}#{hashes['sha256']}"
    return f"{filename}#"


@dataclass(slots=True)
class Listing:
    """A project page's files: every file's identity, and its full record built only when
    asked for (``file(i)``: the URL joined, the time parsed) — for the new ones.  A steady
    poll of an unchanged page builds none."""

    hashes: np.ndarray  # identity hashes (listing.py), in listing order
    file: Callable[[int], DistFile]
    held: int  # bytes charged to the poll's budget while the listing is alive


def _listing_json_small(reply: Reply, doc: Any) -> Listing:
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise GarbageResponse(f"{reply.url}: no 'files' list")
    entries: list[dict[str, Any]] = []
    identities: list[str] = []
    for f in doc["files"]:
        identity = _json_identity(f)
        if identity is not None:
            entries.append(f)
            identities.append(identity)
    base = reply.url
    return Listing(hashes_of(identities), lambda i: _dist_file(base, entries[i]), 0)


def _listing_json_streamed(reply: Reply) -> Listing:
    """A large page without decoding its ``files`` array whole: each entry is decoded,
    reduced to its identity's hash and its place in the text, and dropped; new ones are
    decoded again from there.  Holds the text (charged by the caller) and 16 bytes an
    entry."""
    text = reply.body.decode("utf-8")
    starts = array("q")
    hashes = array("Q")

    def each(f: Any, start: int, end: int) -> None:
        identity = _json_identity(f)
        if identity is not None:
            starts.append(start)
            hashes.append(identity_hash(identity))

    try:
        members = object_with_array(text, "files", each)
    except ValueError as exc:
        raise GarbageResponse(f"{safe_url(reply.url)}: not a PEP 691 page ({exc})") from None
    if members.get("files") is not True:
        raise GarbageResponse(f"{reply.url}: no 'files' list")
    base = reply.url
    found = np.frombuffer(hashes, dtype=np.uint64) if hashes else np.empty(0, np.uint64)
    return Listing(found, lambda i: _dist_file(base, element_at(text, starts[i])), 0)


def _listing_html(reply: Reply) -> Listing:
    links = anchors(reply.text())
    identities: list[str] = []
    for href, text in links:
        fragment = href.partition("#")[2]
        sha256 = fragment[7:] if fragment.startswith("sha256=") else ""
        identities.append(f"{text or _filename_of(reply.url, href)}#{sha256}")
    base = reply.url

    def file(i: int) -> DistFile:
        href, text = links[i]
        path, _, fragment = urljoin(base, href).partition("#")
        sha256 = fragment[7:] if fragment.startswith("sha256=") else None
        return DistFile(text or _filename_of(base, href), path, sha256, None, None)

    return Listing(hashes_of(identities), file, 0)


def _filename_of(base: str, href: str) -> str:
    path = urljoin(base, href).partition("#")[0]
    return unquote(urlsplit(path).path.rsplit("/", 1)[-1])


def html_estimate(body: bytes) -> int:
    """Upper estimate of what a PEP 503 page holds parsed: bytes, text and per anchor a pair
    of strings (about 160 bytes besides their text)."""
    return len(body) + 2 * text_estimate(body) + 160 * body.count(b"<a")


async def project_names(client: RegistryClient, reply: Reply) -> list[str]:
    if not is_json(reply):
        need = html_estimate(reply.body)
        client.budget.take(need, reply.url, "parsing the index page")
        try:
            return [text for _, text in anchors(reply.text()) if text]
        finally:
            client.budget.give(need)
    if len(reply.body) <= STREAM_BYTES:
        doc = await client.decode(reply)
        if not isinstance(doc, dict) or not isinstance(doc.get("projects"), list):
            raise GarbageResponse(f"{reply.url}: no 'projects' list")
        return [str(p["name"]) for p in doc["projects"] if isinstance(p, dict) and "name" in p]
    names: list[str] = []

    def each(p: Any, start: int, end: int) -> None:
        if isinstance(p, dict) and "name" in p:
            names.append(str(p["name"]))

    need = len(reply.body) + text_estimate(reply.body)
    client.budget.take(need, reply.url, "reading the index page")
    try:
        members = await asyncio.to_thread(
            object_with_array, reply.body.decode("utf-8"), "projects", each
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise GarbageResponse(f"{safe_url(reply.url)}: not a PEP 691 index ({exc})") from None
    finally:
        client.budget.give(need)
    if members.get("projects") is not True:
        raise GarbageResponse(f"{reply.url}: no 'projects' list")
    return names


async def listing_of(client: RegistryClient, reply: Reply) -> Listing:
    """A project page's listing, its memory charged to the poll's budget: a small JSON page
    while it is decoded, a large one (streamed) and an HTML one for as long as the listing
    lives (the caller gives ``held`` back)."""
    if is_json(reply) and len(reply.body) <= STREAM_BYTES:
        return _listing_json_small(reply, await client.decode(reply))
    if is_json(reply):
        need = len(reply.body) + text_estimate(reply.body) + 16 * reply.body.count(b"{")
        parse: Callable[[Reply], Listing] = _listing_json_streamed
    else:
        need = html_estimate(reply.body)
        parse = _listing_html
    client.budget.take(need, reply.url, "reading the project page")
    try:
        if len(reply.body) > PARSE_OFF_LOOP_BYTES:
            listing = await asyncio.to_thread(parse, reply)
        else:
            listing = parse(reply)
    except UnicodeDecodeError as exc:
        client.budget.give(need)
        raise GarbageResponse(f"{safe_url(reply.url)}: not UTF-8 ({exc})") from None
    except BaseException:
        client.budget.give(need)
        raise
    listing.held = need
    return listing


def devpi_project_url(index_url: str, project: str) -> str | None:
    """``.../<user>/<index>/+simple/`` -> ``.../<user>/<index>/<project>`` (devpi JSON API)."""
    base, sep, _ = index_url.rpartition("/+simple/")
    return f"{base}/{project}" if sep else None


def devpi_uploads(doc: Any) -> dict[str, tuple[str | None, float | None]]:
    """filename -> (who, when) from devpi's project JSON."""
    out: dict[str, tuple[str | None, float | None]] = {}
    result = doc.get("result") if isinstance(doc, dict) else None
    if not isinstance(result, dict):
        return out
    for version in result.values():
        links = version.get("+links") if isinstance(version, dict) else None
        for link in links if isinstance(links, list) else []:
            if not isinstance(link, dict) or link.get("rel") != "releasefile":
                continue
            name = str(link.get("href", "")).rsplit("/", 1)[-1]
            for entry in link.get("log") or []:
                if isinstance(entry, dict) and entry.get("what") == "upload":
                    when = entry.get("when")
                    ts = None
                    if isinstance(when, list) and len(when) == 6:
                        ts = parse_time("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}Z".format(*when))
                    out[name] = (str(entry.get("who")) if entry.get("who") else None, ts)
    return out


class PypiAdapter:
    def __init__(self, url: str):
        self.index_url = url if url.endswith("/") else url + "/"

    async def poll(self, cycle: Cycle) -> None:
        reply = await cycle.client.get(
            self.index_url,
            headers={"Accept": ACCEPT},
            validator=cycle.state.get("index_validator"),
        )
        serial = reply.headers.get("X-Devpi-Serial")
        if serial is not None and serial == cycle.state.get("serial") and not cycle.learning:
            return  # devpi: nothing changed since the last complete poll
        if reply.status == 304:
            names = [g for g, _ in cycle.index.items()]
        else:
            names = sorted({normalize(n) for n in await project_names(cycle.client, reply)})
        if len(names) > cycle.settings.max_items:
            cycle.counts["listing_truncated"] += 1
            raise PollError(f"{len(names)} projects listed, over max_items")
        names = [n for n in names if cycle.wanted(n)]
        devpi = serial is not None
        for start in range(0, len(names), PROJECTS_AT_ONCE):
            chunk = names[start : start + PROJECTS_AT_ONCE]
            async with asyncio.TaskGroup() as tg:
                for name in chunk:
                    tg.create_task(self._project(cycle, name, devpi))
            await cycle.checkpoint()
        if reply.status != 304:
            forgotten, suspicious = cycle.index.forget_missing(set(names))
            cycle.counts["groups_forgotten"] += forgotten
            cycle.counts["listing_shrinks"] += suspicious
        if reply.status != 304:
            cycle.state["index_validator"] = reply.validator or None
        if serial is not None:
            cycle.state["serial"] = serial

    async def _project(self, cycle: Cycle, name: str, devpi: bool) -> None:
        page = await cycle.client.get(
            f"{self.index_url}{name}/",
            headers={"Accept": ACCEPT},
            validator=cycle.index.validator(name),
            ok=frozenset({200, 404}),
        )
        if page.status in (304, 404):
            return  # unchanged; or gone between the index and now (the index decides)
        digest = page_digest(page.body)
        if cycle.index.same_page(name, digest, page.validator):
            cycle.counts["pages_unchanged"] += 1
            return  # the very page read last time: the same files
        listing = await listing_of(cycle.client, page)
        try:
            await self._files(cycle, name, devpi, page, listing)
        finally:
            cycle.client.budget.give(listing.held)
        cycle.index.note_page(name, digest)

    async def _files(
        self, cycle: Cycle, name: str, devpi: bool, page: Reply, listing: Listing
    ) -> None:
        cycle.counts["records_read"] += len(listing.hashes)
        diff = await cycle.index.diff_off_loop(name, listing.hashes, page.validator)
        cycle.counts["duplicate_items"] += diff.duplicates
        cycle.counts["listing_shrinks"] += diff.shrink_kept
        if len(diff.new) and cycle.learning:
            cycle.counts["baseline_artifacts"] += len(diff.new)
            cycle.index.commit(diff)
            return
        new = [listing.file(int(i)) for i in diff.new]
        uploads: dict[str, tuple[str | None, float | None]] = {}
        if new:
            for f in new:
                if f.size is None or f.uploaded_at is None:
                    size, modified = await cycle.client.probe(f.url)
                    f.size = f.size if f.size is not None else size
                    f.uploaded_at = f.uploaded_at if f.uploaded_at is not None else modified
            url = devpi_project_url(self.index_url, name) if devpi else None
            if url is not None:
                try:
                    _, doc = await cycle.client.get_json(
                        url, headers={"Accept": "application/json"}
                    )
                    uploads = devpi_uploads(doc)
                except PollError:
                    uploads = {}  # the uploader is a nicety; the listing is the truth
        # Commit and report together, with no await in between (see Cycle.checkpoint).
        cycle.index.commit(diff)
        for f in new:
            who, when = uploads.get(f.filename, (None, None))
            version = version_of(f.filename)
            cycle.found(
                name,
                f.filename,
                f.size,
                label=f"{name} {version} {f.filename}".replace("  ", " "),
                uploaded_at=f.uploaded_at or when,
                uploader=who,
                receipt={
                    "name": name,
                    "version": version,
                    "file": f.filename,
                    "digest": f"sha256:{f.sha256}" if f.sha256 else None,
                    "url": f.url,
                },
            )
