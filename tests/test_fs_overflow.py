"""When the watcher cannot keep up or cannot watch: queue overflow (forced by lowering
``max_queued_events``), the inotify watch limit (ENOSPC, in a user namespace with its own
lowered limit), and directories the collector may not read (run as nobody).  Each is counted,
said, and repaired or bounded, and the totals stay exact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_fs_kit import (
    CI,
    Recorder,
    collector,
    mount_tmpfs,
    need_root,
    quiesce,
    running,
    settings,
    tree_bytes,
    write,
)

REPO = Path(__file__).resolve().parent.parent

WRITER = r"""
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i % 50}")
    if i < 50:
        os.mkdir(d)
    fd = os.open(os.path.join(d, f"f{i}"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"w" * (i % 300))
    os.close(fd)
"""


class Sysctl:
    """Set a sysctl for the duration of a ``with`` (restored even if the test fails)."""

    def __init__(self, path: str, value: int) -> None:
        self.path, self.value = path, value

    def __enter__(self) -> Sysctl:
        with open(self.path) as f:
            self.old = f.read().strip()
        with open(self.path, "w") as f:
            f.write(str(self.value))
        return self

    def __exit__(self, *exc: object) -> None:
        with open(self.path, "w") as f:
            f.write(self.old)


@pytest.mark.parametrize("mode", ["inotify", "fanotify"])
async def test_queue_overflow_is_counted_and_reconciled_exactly(
    tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    need_root(f"writing /proc/sys/fs/{mode}/max_queued_events")
    base = tmp_path
    if mode == "fanotify":
        base = tmp_path / "mnt"
        mount_tmpfs(base, request)
    tree = base / "tree"
    tree.mkdir()
    rec = Recorder()
    n = 20_000
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    # The group's queue size is fixed when it is made: lowered only around that moment, so
    # nothing else on the machine gets the small queue for long.
    with Sysctl(f"/proc/sys/fs/{mode}/max_queued_events", 2):
        ctx = running(c, rec)
        await ctx.__aenter__()
    try:
        subprocess.run([sys.executable, "-c", WRITER, str(tree), str(n)], check=True)
        await quiesce(c, timeout=180)
    finally:
        await ctx.__aexit__(None, None, None)
    assert rec.counts["queue_overflows"] >= 1
    assert rec.counts["records_lost_unknown"] == rec.counts["queue_overflows"]
    assert rec.counts["files_created"] == n
    assert rec.bytes_under(str(tree)) == tree_bytes(str(tree)) == sum(i % 300 for i in range(n))
    assert len(rec.files()) == n


# Runs the collector in a child (a user namespace, or as nobody), writes in the parent's
# stead what it is told, and reports what it counted.
CHILD = r"""
import asyncio, json, os, sys
from tests.test_fs_kit import Recorder, collector, quiesce, running, settings
import concurrent.futures.thread, hashlib, secrets, select, threading  # loaded before any drop
import alarm.collectors.fs.engine, alarm.collectors.fs.source
tree, limit, user = sys.argv[1], sys.argv[2], sys.argv[3]
if limit != "-":
    with open("/proc/sys/user/max_inotify_watches", "w") as f:
        f.write(limit)
if user != "-":  # from here on an unprivileged process (no CAP_DAC_*, not root)
    os.setgroups([])
    os.setgid(int(user))
    os.setuid(int(user))

async def main():
    rec = Recorder()
    c = collector(settings([tree], mode="inotify", poll_interval=0.3, settle=0.1), rec)
    async with running(c, rec):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await quiesce(c, timeout=60)
        print(json.dumps({"counts": dict(rec.counts), "bytes": rec.bytes_under(tree),
                          "mode": c.health.mode, "up": c.health.up,
                          "errors": c.health.last_error}), flush=True)

asyncio.run(main())
"""


def _run_child(prefix: list[str], tree: Path, limit: str, user: str, act) -> dict:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", CHILD, str(tree), limit, user],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", f"child did not start: {line!r}"
        act()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        report = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    return report


def test_watch_limit_falls_back_to_polling_and_counts_exactly(tmp_path: Path) -> None:
    need_root("a user namespace with its own inotify watch limit")
    tree = tmp_path / "tree"
    for i in range(12):
        (tree / f"d{i}" / "sub").mkdir(parents=True)
    expected = 0

    def act() -> None:
        nonlocal expected
        for i in range(12):
            for where in (tree / f"d{i}", tree / f"d{i}" / "sub"):
                data = os.urandom(100 + i)
                write(where / "new.bin", data)
                expected += len(data)

    report = _run_child(["unshare", "--user", "--map-root-user"], tree, "6", "-", act)
    assert report["counts"]["watch_limit_errors"] >= 1
    assert report["counts"]["poll_fallback_dirs"] >= 1
    assert report["mode"] == "inotify+poll"
    assert report["bytes"] == expected == tree_bytes(str(tree))


def test_unreadable_directories_are_counted_as_permission_errors(
    request: pytest.FixtureRequest,
) -> None:
    need_root("making a directory nobody may read, then watching as nobody")
    # Not under tmp_path: pytest's base directory is 0700, which nobody cannot enter.
    tree = Path(tempfile.mkdtemp(prefix="capalarm-fs-perm-"))
    request.addfinalizer(lambda: shutil.rmtree(tree, ignore_errors=True))
    (tree / "open").mkdir()
    (tree / "closed").mkdir()
    os.chmod(tree, 0o777)
    os.chmod(tree / "open", 0o777)
    os.chmod(tree / "closed", 0o700)

    def act() -> None:
        write(tree / "open" / "a", b"a" * 1234)

    report = _run_child([], tree, "-", "65534", act)
    assert report["counts"].get("permission_errors", 0) >= 1, report
    assert "closed" in report["errors"]
    assert report["bytes"] == 1234


# In its own user and mount namespace: a tmpfs of its own (on which Linux 6.8+ lets the
# namespace's root place a fanotify file-system mark) and an inotify watch limit of its own.
SWITCH_CHILD = r"""
import asyncio, json, os, subprocess, sys
from tests.test_fs_kit import Recorder, collector, quiesce, running, settings, tree_bytes
base = sys.argv[1]
os.makedirs(base, exist_ok=True)
subprocess.run(["mount", "-t", "tmpfs", "capalarm-switch", base], check=True)
tree = os.path.join(base, "tree")
for i in range(12):
    os.makedirs(os.path.join(tree, f"d{i}", "sub"))
with open("/proc/sys/user/max_inotify_watches", "w") as f:
    f.write("6")

async def main():
    rec = Recorder()
    c = collector(settings([tree], mode="auto", settle=0.1), rec)
    async with running(c, rec):
        await quiesce(c)
        written = 0
        for i in range(12):
            for sub in ("", "sub", "sub/new"):
                d = os.path.join(tree, f"d{i}", sub)
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "f.bin"), "wb") as f:
                    written += f.write(os.urandom(200 + i))
        await quiesce(c)
        print(json.dumps({"counts": dict(rec.counts), "bytes": rec.bytes_under(tree),
                          "written": written, "tree": tree_bytes(tree), "mode": c.health.mode,
                          "me": os.getpid(),
                          "pids": sorted({e.evidence.get("pid", 0) for e in rec.changes("created")})}))

asyncio.run(main())
"""


def test_auto_switches_a_tree_out_of_inotify_watches_to_fanotify(tmp_path: Path) -> None:
    need_root("a user and mount namespace with its own watch limit and tmpfs")
    out = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            sys.executable,
            "-c",
            SWITCH_CHILD,
            str(tmp_path / "ns"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "fanotify" in out.stderr and "Operation not permitted" in out.stderr:
        why = "this kernel does not allow fanotify marks in a user namespace (< 6.8)"
        if CI:
            pytest.fail(f"CI's kernel must allow it: {why}")
        pytest.skip(why)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["mode"] == "fanotify"
    assert report["counts"]["watch_limit_errors"] >= 1
    assert report["counts"]["mode_switches"] == 1
    assert "poll_fallback_dirs" not in report["counts"]
    assert report["bytes"] == report["written"] == report["tree"]
    assert report["pids"] == [report["me"]]  # the writer's pid, from fanotify
