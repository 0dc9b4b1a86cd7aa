"""``api: artifactory`` against the local Artifactory (tests/fakes/artifactory.py, which
follows JFrog's AQL pages): the AQL cursor, overwrites, restarts, a restored instance."""

from __future__ import annotations

import time
from pathlib import Path

from tests.fakes.artifactory import Artifactory
from tests.fakes.server import serve
from tests.registries.harness import Recorder, collector, poll


def config(base: str, key_file: Path, **extra: object) -> dict[str, object]:
    return {
        "api": "artifactory",
        "url": f"{base}/artifactory/",
        "credentials": {"file": str(key_file), "header": "X-JFrog-Art-Api"},
        **extra,
    }


async def test_new_and_overwritten_files_counted_once_each(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("ak-test-key\n")
    art = Artifactory()
    art.deploy(
        "pypi-local", "sandbox-pkg/1.0", "sandbox_pkg-1.0.tar.gz", 4000, "alice", time.time() - 100
    )
    async with serve(art.app()) as site:
        rec = Recorder()
        source = collector(rec, **config(site.base, key))
        assert await poll(source, rec)
        assert rec.rows() == [] and source.health.up
        assert len(art.queries) == 2, "the starting state costs the newest timestamp, not a scan"

        art.deploy("pypi-local", "sandbox-pkg/1.1", "sandbox_pkg-1.1.tar.gz", 5000, "alice")
        art.deploy("npm-local", ".", "exfil-1.0.0.tgz", 7000, "mallory")
        rec.clear()
        assert await poll(source, rec)
        rows = sorted(rec.rows(), key=lambda r: r.nbytes)
        assert [(r.repository, r.artifact, r.nbytes) for r in rows] == [
            ("pypi-local/sandbox-pkg/1.1", "sandbox_pkg-1.1.tar.gz", 5000),
            ("npm-local", "exfil-1.0.0.tgz", 7000),
        ]
        assert rows[1].contributor == "npm-local/exfil-1.0.0.tgz by mallory"
        assert str((rows[1].evidence or {})["digest"]).startswith("sha256:")

        rec.clear()
        assert await poll(source, rec)
        assert rec.rows() == [], "the files at the cursor are not counted again"

        time.sleep(0.01)
        art.deploy("npm-local", ".", "exfil-1.0.0.tgz", 9000, "mallory")  # overwritten
        rec.clear()
        assert await poll(source, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("exfil-1.0.0.tgz", 9000)]


async def test_pages_of_one_timestamp_and_a_restart(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("ak-test-key")
    art = Artifactory()
    async with serve(art.app()) as site:
        rec = Recorder()
        cfg = config(site.base, key, page_size=3)
        assert await poll(collector(rec, **cfg), rec)
        at = time.time()
        for i in range(8):  # more files at one millisecond than a page holds
            art.deploy("generic-local", "drop", f"part{i}", 100 + i, "bot", at)
        restarted = collector(rec, **cfg)
        rec.clear()
        assert await poll(restarted, rec)
        assert sorted(r.artifact for r in rec.rows()) == [f"part{i}" for i in range(8)]
        assert all(abs(r.ts - at) < 0.01 for r in rec.rows()), "counted at their own time"


async def test_restored_instance_is_a_cursor_regression_not_a_storm(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("ak-test-key")
    art = Artifactory()
    art.deploy("r", ".", "a", 1, "u", time.time())
    async with serve(art.app()) as site:
        rec = Recorder()
        source = collector(rec, **config(site.base, key))
        assert await poll(source, rec)
        art.items = []  # restored from an older backup: everything older than the cursor
        art.deploy("r", ".", "old", 1, "u", time.time() - 3600)
        rec.clear()
        assert await poll(source, rec)
        assert rec.rows() == []
        assert rec.counts()["cursor_regressions"] == 1
        art.deploy("r", ".", "after-restore", 10, "u")
        rec.clear()
        assert await poll(source, rec)
        assert [r.artifact for r in rec.rows()] == ["after-restore"]


async def test_wrong_key_is_a_failed_poll_that_names_no_secret(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("not-the-key")
    async with serve(Artifactory().app()) as site:
        rec = Recorder()
        source = collector(rec, **config(site.base, key, retries=0))
        assert not await poll(source, rec)
        assert not source.health.up and "HTTP 401" in source.health.last_error
        assert "not-the-key" not in source.health.last_error
        assert rec.counts()["poll_errors"] == 1
