"""``api: mediawiki`` against Debian's MediaWiki 1.39 (SQLite, ``php -S``) on loopback, edited
anonymously through its action API as the July wikis allowed."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.registries import servers
from tests.registries.clients import wiki_edit
from tests.registries.harness import Recorder, collector, poll

pytestmark = pytest.mark.slow


def wiki_upload(wiki: servers.Server, name: str, data: bytes) -> None:
    """An upload by the wiki's own importImages.php (MediaWiki's API refuses anonymous
    uploads, ``mustbeloggedin``): the same upload log entry and file page, by user Admin."""
    folder = wiki.workdir / "to-upload"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)
    proc = subprocess.run(
        ["php", f"{servers.MEDIAWIKI}/maintenance/importImages.php", "--user=Admin", str(folder)],
        env={**os.environ, "MW_CONFIG_FILE": str(wiki.workdir / "LocalSettings.php")},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "Added: 1" in proc.stdout, proc.stdout + proc.stderr


async def test_edits_new_pages_and_uploads_counted_with_changed_bytes_and_capacity(
    wiki: servers.Server,
) -> None:
    wiki_edit(wiki.url, "Board/Existing", "x" * 100)
    rec = Recorder()
    source = collector(rec, api="mediawiki", url=wiki.url)
    assert await poll(source, rec)
    assert rec.rows() == [], "the wiki's history is the starting state"
    assert source.health.up

    created = wiki_edit(wiki.url, "Board/Post 1", "y" * 300)
    edited = wiki_edit(wiki.url, "Board/Existing", "x" * 100 + "z" * 1000)
    shrunk = wiki_edit(wiki.url, "Board/Post 1", "y" * 50)
    png = os.urandom(5000)
    wiki_upload(wiki, "Leak.png", b"\x89PNG\r\n\x1a\n" + png)
    rec.clear()
    assert await poll(source, rec)
    rows = {r.artifact: r for r in rec.rows() if not r.artifact.startswith("upload")}
    assert len(rows) == 3 and len(rec.rows()) == 4, [r.contributor for r in rec.rows()]
    assert (rows[f"r{created['newrevid']}"].nbytes, rows[f"r{created['newrevid']}"].capacity) == (
        300,
        300,
    )
    assert (rows[f"r{edited['newrevid']}"].nbytes, rows[f"r{edited['newrevid']}"].capacity) == (
        1000,
        1100,
    )
    # A shrinking edit writes what changed (250 bytes) and carries the page as it now is.
    assert (rows[f"r{shrunk['newrevid']}"].nbytes, rows[f"r{shrunk['newrevid']}"].capacity) == (
        250,
        250,
    )
    post = rows[f"r{created['newrevid']}"]
    assert post.repository == "Board/Post 1"
    assert (
        post.evidence and post.evidence["anonymous"] is True and post.evidence["kind"] == "new page"
    )
    assert post.contributor.endswith("by 127.0.0.1")
    assert f"diff={created['newrevid']}" in post.evidence["url"]
    (upload,) = [r for r in rec.rows() if r.artifact.startswith("upload")]
    assert upload.repository == "File:Leak.png" and upload.nbytes == len(png) + 8
    assert upload.contributor.endswith("by Admin")
    assert str((upload.evidence or {})["digest"]).startswith("sha1:")

    rec.clear()
    assert await poll(source, rec)
    assert rec.rows() == [], "the rcid cursor does not count an edit twice"
