"""The configuration users write for fs sources, the type's registration, and the small parts
(the compact tables, mountinfo, receipts, a saved state that cannot be used)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from alarm.collectors import SOURCE_TYPES
from alarm.collectors.fs.columns import EventColumns
from alarm.collectors.fs.mounts import fs_type, polled
from alarm.collectors.fs.receipts import ReceiptBudget
from alarm.collectors.fs.settings import FsSettings, parse_bytes
from alarm.collectors.fs.table import InodeTable, U64Map, key64
from alarm.config import config_from_dict
from alarm.settings import ConfigError
from tests.test_fs_kit import (
    Recorder,
    collector,
    mount_tmpfs,
    need_root,
    quiesce,
    running,
    settings,
    write,
)

USER_CONFIG = """
sources:
  - {name: scratch-watch, type: fs, paths: [/srv/scratch, /var/cache/pip]}
  - name: caches
    type: fs
    paths: [/var/cache/npm]
    mode: inotify
    poll_interval: 10s
    canary: {interval: 60s, deadline: 30s}
    receipts: {sha256_budget_bytes: 64MiB}
surfaces:
  - {name: scratch,   kind: fs, match: {path: [/srv/scratch]}}
  - {name: pip-cache, kind: fs, match: {path: ["/var/cache/pip/**/*.whl"]}}
"""


def test_the_users_configuration_loads() -> None:
    cfg = config_from_dict(yaml.safe_load(USER_CONFIG))
    first, second = cfg.sources
    assert isinstance(first, FsSettings) and first.mode == "auto"
    assert first.paths == ["/srv/scratch", "/var/cache/pip"]
    assert second.canary is not None and second.canary.deadline == 30.0
    assert second.receipts.sha256_budget_bytes == 64 << 20
    assert second.poll_interval == 10.0
    assert SOURCE_TYPES["fs"].kind == "fs"
    assert set(SOURCE_TYPES["fs"].counters) >= {
        "queue_overflows",
        "watch_limit_errors",
        "permission_errors",
        "canary_missed",
        "watch_lost",
        "tree_missing",
        "deleted_before_measured",
    }


@pytest.mark.parametrize(
    ("paths", "extra", "message"),
    [
        (["srv/scratch"], {}, "not an absolute path"),
        (["/srv", "/srv/scratch"], {}, "is inside /srv"),
        (["/srv/a", "/srv/a/"], {}, "listed twice"),
        (["/srv/a"], {"mode": "magic"}, "mode"),
        (["/srv/a"], {"typo": 1}, "typo"),
        (["/srv/a"], {"receipts": {"sha256_budget_bytes": "lots"}}, "is not a size"),
        (
            ["/srv/a"],
            {"mode": "poll", "poll_interval": "60s", "canary": {"deadline": "30s"}},
            "deadline must exceed poll_interval",
        ),
    ],
)
def test_bad_configuration_names_the_key(paths: list[str], extra: dict, message: str) -> None:
    src = {"name": "w", "type": "fs", "paths": paths, **extra}
    with pytest.raises(ConfigError) as exc:
        config_from_dict({"sources": [src]})
    assert message in str(exc.value)
    assert "sources[0]" in str(exc.value)


def test_sizes() -> None:
    assert parse_bytes("64MiB") == 64 << 20
    assert parse_bytes("1GB") == 10**9
    assert parse_bytes("512k") == 512_000
    assert parse_bytes("2 KiB") == 2048
    assert parse_bytes(7) == 7
    for bad in ("-1", "MiB", "1 parsec", True):
        with pytest.raises(ValueError):
            parse_bytes(bad)


@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 300)), max_size=3000))
def test_u64map_behaves_like_a_dict(ops: list[tuple[bool, int]]) -> None:
    m = U64Map(16)
    ref: dict[int, int] = {}
    for n, (put, k) in enumerate(ops):
        key = key64(("k", k))
        if put:
            m.put(key, n)
            ref[key] = n
        else:
            assert m.pop(key) == ref.pop(key, -1)
    assert len(m) == len(ref)
    for key, value in ref.items():
        assert m.get(key) == value
    assert m.get(key64(("absent", 1))) == -1


def test_inode_table_reuses_rows_and_finds_by_identity() -> None:
    t = InodeTable(4)
    rows = [t.add(1, i, i, i, i, i, 0) for i in range(1000)]
    assert len(set(rows)) == 1000 and len(t) == 1000
    for i in random.Random(1).sample(range(1000), 400):
        t.remove(rows[i])
    again = [t.add(2, i, 0, 0, 0, 0, 0) for i in range(400)]
    assert t.top == 1000, "removed rows are reused"
    assert t.find(2, 5) == again[5] and t.find(3, 5) == -1
    assert len(t) == 1000
    assert t.nbytes / len(t) < 120


def test_mountinfo_type_of_the_longest_mount_point(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        textwrap.dedent(
            """\
            22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
            40 22 0:45 / /srv/nfs rw,relatime shared:20 - nfs4 server:/export rw
            41 22 0:46 / /srv/with\\040space rw - fuse.sshfs host: rw
            42 40 0:47 / /srv/nfs/local rw - tmpfs tmpfs rw
            """
        )
    )
    assert fs_type("/srv/nfs/a/b", str(info)) == "nfs4"
    assert fs_type("/srv/nfs/local/x", str(info)) == "tmpfs"
    assert fs_type("/srv/with space/x", str(info)) == "fuse.sshfs"
    assert fs_type("/srv/nfsx", str(info)) == "ext4"
    assert polled("nfs4") and polled("fuse.sshfs") and not polled("ext4")


def test_receipts_hash_the_largest_writes_within_the_budget(tmp_path: Path) -> None:
    events = EventColumns()
    for i, n in enumerate([5000, 100, 3000, 20_000]):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(n))
        st_ = p.stat()
        events.add(0.0, str(p), n, "created", st_.st_dev, st_.st_ino, n, st_.st_mtime_ns)
    budget = ReceiptBudget(budget_bytes=9000, max_files=2, tick=10.0)
    hashed, skipped = budget.add(events, now=100.0)
    assert (hashed, skipped) == (2, 2)
    got = {events.paths[i]: events.evidence(i).get("sha256") for i in range(len(events))}
    assert got[str(tmp_path / "f0")] == hashlib.sha256((tmp_path / "f0").read_bytes()).hexdigest()
    assert got[str(tmp_path / "f2")] is not None
    assert got[str(tmp_path / "f3")] is None  # over the budget
    # A file replaced since it was measured gets no receipt (it is not what was counted).
    (tmp_path / "f1").unlink()
    (tmp_path / "f1").write_bytes(b"other")
    one = EventColumns()
    one.add(0.0, events.paths[1], 100, "created", events.dev[1], events.ino[1], 100, 0)
    assert ReceiptBudget(1 << 20, 10, 10.0).add(one, now=200.0) == (0, 0)
    assert one.evidence(0).get("sha256") is None


async def test_a_saved_state_that_cannot_be_used_starts_from_a_baseline(tmp_path: Path) -> None:
    write(tmp_path / "a", b"a" * 10)
    rec = Recorder()
    rec.position = {"v": 99, "garbage": True}
    rec.ledger = {"f:x:y": "[1,2,3]", "f:1:2": "not json", "zz": "1"}
    c = collector(settings([str(tmp_path)], mode="inotify"), rec)
    async with running(c, rec):
        await quiesce(c)
    assert rec.counts["position_invalid"] == 1
    assert rec.counts["ledger_rows_invalid"] == 3
    assert not {"f:x:y", "f:1:2", "zz"} & set(rec.ledger)
    assert rec.events == []  # the baseline: what is there is the starting state


async def test_the_writer_pid_is_evidence_with_fanotify(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    need_root("fanotify file-system marks need CAP_SYS_ADMIN")
    # A file system of the test's own: a fanotify mark sees every writer on the file system,
    # and on / the machine's other writers kept the collector from going quiet (issue 30).
    tmp_path = tmp_path / "mnt"
    mount_tmpfs(tmp_path, request, size="16m")
    rec = Recorder()
    c = collector(settings([str(tmp_path)], mode="fanotify", settle=0.05), rec)
    async with running(c, rec):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import os, sys, time; open(sys.argv[1], 'wb').write(b'p' * 99); "
            "print(os.getpid(), flush=True); time.sleep(1)",
            str(tmp_path / "by-child"),
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        pid = int((await proc.stdout.readline()).decode())
        await quiesce(c)
        await proc.wait()
    (ev,) = rec.events
    assert ev.evidence["pid"] == pid
    assert ev.evidence["comm"].startswith("python")
