"""``api: pypi`` against real indexes on loopback: pypiserver (PEP 503 HTML only, sizes by HEAD)
and devpi-server (PEP 691 JSON, X-Devpi-Serial, uploaders from its JSON API), packages
uploaded with twine.  Each test works on project names of its own (``packages:``), so the
servers are shared by the module."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from tests.registries import servers
from tests.registries.clients import make_wheel, twine_upload
from tests.registries.harness import Recorder, collector, poll

pytestmark = pytest.mark.slow


def upload(server: servers.Server, tmp_path: Path, name: str, version: str, payload: int) -> Path:
    wheel = make_wheel(tmp_path, name, version, payload)
    twine_upload(server, wheel)
    return wheel


@pytest.mark.parametrize("which", ["pypiserver", "devpi"])
async def test_counts_each_upload_once_with_its_size_and_receipt(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server: servers.Server = request.getfixturevalue(which)
    prefix = f"first-{which}"
    old = upload(server, tmp_path, f"{prefix}-old", "0.9", 2000)
    rec = Recorder()
    source = collector(rec, api="pypi", url=server.url, packages=[f"{prefix}-*"])

    assert await poll(source, rec)
    assert rec.rows() == [], "the first poll learns what is there without counting it"
    assert rec.counts()["baseline_artifacts"] == 1
    assert source.health.up and source.health.last_success_at > 0
    assert rec.position is not None and rec.ledger, "listing saved for a restart"

    before = time.time()
    wheels = [
        upload(server, tmp_path, f"{prefix}-pkg", "1.0.1", 3000),
        upload(server, tmp_path, f"{prefix}-pkg", "1.0.2", 7000),
        upload(server, tmp_path, f"{prefix}-other", "2.0", 500),
    ]
    rec.clear()
    assert await poll(source, rec)
    rows = rec.rows()
    assert sorted(r.artifact for r in rows) == sorted(w.name for w in wheels)
    assert sum(r.nbytes for r in rows) == sum(w.stat().st_size for w in wheels)
    by_file = {r.artifact: r for r in rows}
    pkg = by_file[wheels[0].name]
    assert pkg.repository == f"{prefix}-pkg"
    assert pkg.nbytes == wheels[0].stat().st_size
    receipt = pkg.evidence or {}
    assert receipt["name"] == f"{prefix}-pkg" and receipt["version"] == "1.0.1"
    assert receipt["file"] == wheels[0].name
    assert receipt["digest"] == "sha256:" + hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    assert receipt["url"].startswith(server.base)
    assert pkg.contributor.startswith(f"{prefix}-pkg 1.0.1 {wheels[0].name}")
    # Counted at the upload time the server reports (Last-Modified), not later.
    assert before - 2 <= pkg.ts <= time.time()
    assert old.name not in by_file

    rec.clear()
    assert await poll(source, rec)
    assert rec.rows() == [], "nothing new: nothing counted again"


async def test_devpi_names_the_uploader_and_skips_work_when_its_serial_is_unchanged(
    devpi: servers.Server, tmp_path: Path
) -> None:
    rec = Recorder()
    source = collector(rec, api="pypi", url=devpi.url, packages=["who-*"])
    assert await poll(source, rec)
    wheel = upload(devpi, tmp_path, "who-pkg", "1.0", 1000)
    rec.clear()
    assert await poll(source, rec)
    (row,) = rec.rows()
    assert row.evidence and row.evidence["uploader"] == "alice"
    assert row.contributor.endswith(" by alice")
    assert row.nbytes == wheel.stat().st_size

    rec.clear()
    assert await poll(source, rec)
    # X-Devpi-Serial has not moved: no project page was read.
    assert rec.counts()["records_read"] == 0
    assert rec.rows() == []


async def test_restart_counts_what_was_uploaded_while_down_at_its_upload_time(
    pypiserver: servers.Server, tmp_path: Path
) -> None:
    rec = Recorder()
    cfg = {"api": "pypi", "url": pypiserver.url, "packages": ["down-*"]}
    source = collector(rec, **cfg)
    upload(pypiserver, tmp_path, "down-pkg", "1.0", 1000)
    assert await poll(source, rec)
    last_poll_started = rec.position["since"]  # type: ignore[index]
    del source  # the service stops

    time.sleep(1.1)
    wheel = upload(pypiserver, tmp_path, "down-pkg", "1.1", 4000)
    uploaded = time.time()
    time.sleep(1.1)

    restarted = collector(rec, **cfg)
    rec.clear()
    assert await poll(restarted, rec)
    (row,) = rec.rows()
    assert row.artifact == wheel.name and row.nbytes == wheel.stat().st_size
    assert last_poll_started <= row.ts <= uploaded + 1, "counted when it was uploaded"
    assert rec.counts()["baseline_artifacts"] == 0, "a restart does not learn again"
