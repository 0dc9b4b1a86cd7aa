"""``api: oci`` against Debian's docker-registry (distribution 2.8) on loopback, images pushed
over the v2 API (blob uploads, then the manifest)."""

from __future__ import annotations

import pytest

from tests.registries import servers
from tests.registries.clients import push_image
from tests.registries.harness import Recorder, collector, poll

pytestmark = pytest.mark.slow


async def test_pushed_tags_counted_by_manifest_sizes_and_a_repushed_tag_counts_again(
    registry: servers.Server,
) -> None:
    push_image(registry.url, "sandbox/base", "v1", 2000)
    rec = Recorder()
    source = collector(rec, api="oci", url=registry.url, packages=["sandbox/*"])
    assert await poll(source, rec)
    assert rec.rows() == []
    assert rec.counts()["baseline_artifacts"] == 1

    pushed = {
        ("sandbox/base", "v2"): push_image(registry.url, "sandbox/base", "v2", 5000),
        ("sandbox/exfil", "a"): push_image(registry.url, "sandbox/exfil", "a", 20000),
    }
    push_image(registry.url, "elsewhere/app", "v1", 1000)
    rec.clear()
    assert await poll(source, rec)
    rows = rec.rows()
    assert {(r.repository, r.artifact): r.nbytes for r in rows} == pushed
    receipt = next(r.evidence for r in rows if r.artifact == "a") or {}
    assert str(receipt["digest"]).startswith("sha256:")
    assert receipt["url"].endswith(f"/v2/sandbox/exfil/manifests/{receipt['digest']}")

    # The same tag pushed again with other content is another write.
    again = push_image(registry.url, "sandbox/exfil", "a", 30000)
    rec.clear()
    assert await poll(source, rec)
    assert [(r.repository, r.artifact, r.nbytes) for r in rec.rows()] == [
        ("sandbox/exfil", "a", again)
    ]

    rec.clear()
    assert await poll(source, rec)
    assert rec.rows() == []


async def test_catalog_pages_followed_by_link_header(registry: servers.Server) -> None:
    for i in range(5):
        push_image(registry.url, f"paged/r{i}", "t", 100)
    rec = Recorder()
    source = collector(rec, api="oci", url=registry.url, packages=["paged/*"])
    # One repository per catalog page: the collector must follow Link: rel="next".
    source.adapter.page = 1  # type: ignore[attr-defined]
    assert await poll(source, rec)
    assert rec.counts()["baseline_artifacts"] == 5
