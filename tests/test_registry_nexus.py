"""``api: nexus`` against the local Nexus 3 (tests/fakes/nexus.py, which follows Sonatype's
Assets API page): continuationToken paging, diff by id and checksum, hostile paging."""

from __future__ import annotations

import os

import pytest

from tests.fakes.nexus import Nexus
from tests.fakes.server import serve
from tests.registries.harness import Recorder, collector, poll


@pytest.fixture
def nexus_credentials(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("NEXUS_CREDENTIALS", "admin:nexus-pass")
    return {"env": "NEXUS_CREDENTIALS"}


async def test_assets_over_many_pages_diffed_by_id_and_checksum(
    nexus_credentials: dict[str, str],
) -> None:
    nexus = Nexus()
    for i in range(25):
        nexus.upload("pypi-hosted", f"packages/base/{i}/base-{i}.tar.gz", b"x" * 10, "ci")
    async with serve(nexus.app()) as site:
        nexus.base = site.base
        rec = Recorder()
        cfg = {
            "api": "nexus",
            "url": site.base + "/",
            "repositories": ["pypi-hosted"],
            "credentials": nexus_credentials,
        }
        source = collector(rec, **cfg)
        assert await poll(source, rec)
        assert rec.rows() == [] and rec.counts()["baseline_artifacts"] == 25
        assert nexus.requests == 3, "three pages of ten"

        payload = os.urandom(3000)
        nexus.upload(
            "pypi-hosted", "packages/sandbox-pkg/1.0.1/sandbox_pkg-1.0.1.whl", payload, "alice"
        )
        nexus.upload(
            "pypi-hosted", "packages/base/3/base-3.tar.gz", b"y" * 70, "mallory"
        )  # overwrite
        rec.clear()
        assert await poll(source, rec)
        rows = sorted(rec.rows(), key=lambda r: r.nbytes)
        assert [(r.repository, r.artifact, r.nbytes) for r in rows] == [
            ("pypi-hosted/packages/base/3", "base-3.tar.gz", 70),
            ("pypi-hosted/packages/sandbox-pkg/1.0.1", "sandbox_pkg-1.0.1.whl", 3000),
        ]
        receipt = rows[1].evidence or {}
        assert receipt["uploader"] == "alice" and receipt["uploader_ip"] == "10.0.0.7"
        assert str(receipt["digest"]).startswith("sha256:")

        restarted = collector(rec, **cfg)
        rec.clear()
        assert await poll(restarted, rec)
        assert rec.rows() == [], "the listing saved in the ledger is the state after a restart"


async def test_repeating_continuation_token_fails_the_poll(
    nexus_credentials: dict[str, str],
) -> None:
    nexus = Nexus(stuck_token="5")
    for i in range(30):
        nexus.upload("raw", f"f{i}", b"x", "u")
    async with serve(nexus.app()) as site:
        rec = Recorder()
        source = collector(
            rec,
            api="nexus",
            url=site.base + "/",
            repositories=["raw"],
            credentials=nexus_credentials,
        )
        assert not await poll(source, rec)
        assert "continuationToken repeats" in source.health.last_error
        assert rec.counts()["garbage_responses"] == 1 and rec.counts()["poll_errors"] == 1
        assert rec.rows() == [] and nexus.requests == 2
