"""The fs source's native directory listing (alarm/collectors/fs/_dirscan.c, dirscan.py) and
its bulk insert (state.py ``observe_listing``) count exactly what ``os.scandir`` and
``observe`` entry by entry count: the same ledger at a first start, the same bytes per path
for new directories full of files, hard links, symlinks, FIFOs, sparse files and names that
are not UTF-8, and in poll mode (where every change is found by a scan).  Its parsers of
inotify and fanotify reads make what the Python ones make."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest

from alarm.collectors.fs import dirscan
from alarm.collectors.fs import fanotify as fan
from alarm.collectors.fs import inotify as ino
from alarm.collectors.fs.table import key64
from tests.test_fs_kit import Recorder, collector, quiesce, running, settings, write

needs_native = pytest.mark.skipif(
    not dirscan.available(), reason="the _dirscan extension was not built (no C compiler)"
)

LISTINGS = ["native", "scandir"]


@pytest.fixture(params=LISTINGS)
def listing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native" and not dirscan.available():
        pytest.skip("the _dirscan extension was not built (no C compiler)")
    if request.param == "scandir":
        monkeypatch.setattr(dirscan, "_native", None)
    return request.param


def fill(d: Path, tag: str) -> int:
    """Files of every kind a scan meets in ``d``; returns the bytes a new tree of them
    counts (a hard link's second name adds nothing, a sparse file counts its data)."""
    d.mkdir(parents=True)
    total = 0
    for i in range(300):
        write(d / f"{tag}{i}", os.urandom(i * 7 % 5000))
        total += i * 7 % 5000
    os.link(d / f"{tag}1", d / f"{tag}1.link")
    os.symlink(f"../{tag}-target-name", d / f"{tag}.sym")
    total += len(f"../{tag}-target-name")
    os.mkfifo(d / f"{tag}.fifo")
    with open(d / f"{tag}.sparse", "wb") as f:
        f.seek(8 << 20)
        f.write(b"end" * 1000)
    total += 3000  # its data, not its 8 MiB of holes
    write(os.fsencode(d) + b"/" + tag.encode() + b"\xff\xfe.bin", b"n" * 123)
    total += 123
    (d / f"{tag}sub").mkdir()
    write(d / f"{tag}sub" / "inner", b"i" * 777)
    return total + 777


@needs_native
def test_a_native_listing_is_what_lstat_says(tmp_path: Path) -> None:
    d = tmp_path / "d"
    fill(d, "x")
    fd = dirscan.open_dir(os.fsencode(d))
    try:
        parts = []
        while True:
            lst = dirscan.list_dir(fd, 42, 100)
            parts.append(lst)
            if lst.done:
                break
    finally:
        os.close(fd)
    assert len(parts) > 1, "a listing is read in parts, each continuing the last"
    seen = {}
    for lst in parts:
        assert not lst.err.any()
        for i, name in enumerate(lst.names):
            st = os.lstat(os.fsencode(d) + b"/" + name)
            got = lst.stat(i)
            assert (got.st_dev, got.st_ino, got.st_mode, got.st_nlink) == (
                st.st_dev,
                st.st_ino,
                st.st_mode,
                st.st_nlink,
            )
            assert (got.st_size, got.st_blocks, got.st_mtime_ns) == (
                st.st_size,
                st.st_blocks,
                st.st_mtime_ns,
            )
            assert int(lst.keys[i]) == key64((42, name))
            assert int(lst.idents[i]) == key64((st.st_dev, st.st_ino))
            seen[name] = stat.S_IFMT(st.st_mode)
    assert sorted(seen) == sorted(os.listdir(os.fsencode(d)))


def test_ledger_rows_in_bulk_are_ledger_values() -> None:
    from alarm.collectors.fs.ledger import ledger_value

    cols = [np.array(c, dtype=np.int64) for c in ([5, 5], [1, 2], [10, 0], [10, 0], [7, 8], [1, 3])]
    got: dict[str, str | None] = {}
    dirscan.ledger_rows(got, *cols)
    assert got == {"f:5:1": ledger_value(10, 10, 7), "f:5:2": ledger_value(0, 0, 8, 3)}


async def test_both_listings_count_the_same(listing: str, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    fill(tree / "old", "o")  # the starting state
    rec = Recorder()
    c = collector(settings([str(tree)], mode="inotify", settle=0.1), rec)
    async with running(c, rec):
        await quiesce(c)
        assert rec.events == [], "what is there at first start must not count"
        files = set(rec.files())
        expect = set()
        for root, _dirs, fnames in os.walk(os.fsencode(tree)):
            for n in fnames:
                st = os.lstat(os.path.join(root, n))
                expect.add(f"f:{st.st_dev}:{st.st_ino}")
        assert files == expect
        written = fill(tree / "new" / "deeper", "n")  # found by the new directories' scans
        await quiesce(c)
    assert rec.bytes_under(str(tree / "new")) == written
    assert rec.counts["hard_links"] == 1
    assert rec.by_path()[str(tree / "new" / "deeper" / "n.sparse")] == 3000
    assert rec.by_path()[str(tree / "new" / "deeper" / "nsub" / "inner")] == 777


async def test_both_listings_count_the_same_in_poll_mode(listing: str, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    write(tree / "grows", b"g" * 100)
    rec = Recorder()
    c = collector(settings([str(tree)], mode="poll", poll_interval=0.1, settle=0.1), rec)
    async with running(c, rec):
        await quiesce(c)
        written = fill(tree / "new", "p")
        write(tree / "grows", b"g" * 50, "ab")
        await quiesce(c)
        assert rec.bytes_under(str(tree / "new")) == written
        assert rec.by_path()[str(tree / "grows")] == 50
        os.unlink(tree / "new" / "p7")
        write(tree / "new" / "p8", b"r" * 10, "r+b")  # a rewrite in place, same size
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == written + 50
    assert rec.counts["rewrites"] >= 1


def test_bulk_map_operations_are_the_one_by_one_ones(listing: str) -> None:
    """U64Map.put_many / find_many (in C, or numpy without the extension) against put /
    index, through growth, tombstones and probe chains that wrap around the table."""
    from alarm.collectors.fs.table import U64Map

    rng = np.random.default_rng(7)
    bulk, single = U64Map(16), U64Map(16)
    live: dict[int, int] = {}
    for round_ in range(30):
        keys = np.unique(rng.integers(2, 1 << 63, 200, dtype=np.uint64))
        keys = keys[bulk.find_many(keys) < 0]
        vals = np.arange(len(keys), dtype=np.int64) + round_ * 1000
        bulk.put_many(keys, vals, gen=round_)
        for k, v in zip(keys.tolist(), vals.tolist(), strict=True):
            single.put(k, v, round_)
            live[k] = v
        for k in list(live)[:: 7 + round_ % 3]:  # tombstones
            assert bulk.pop(k) == single.pop(k) == live.pop(k)
        probe = np.array(
            [*live, *rng.integers(2, 1 << 63, 50, dtype=np.uint64).tolist()], np.uint64
        )
        found = bulk.find_many(probe)
        assert [bulk.vals[i] if i >= 0 else -1 for i in found.tolist()] == [
            single.get(k) for k in probe.tolist()
        ]
        assert [bulk.gens[i] for i in found.tolist() if i >= 0] == [
            single.gens[single.index(k)] for k in probe.tolist() if single.index(k) >= 0
        ]
    assert len(bulk) == len(single) == len(live)


@pytest.mark.parametrize("mode", ["inotify", "fanotify"])
async def test_a_burst_of_events_in_one_directory_counts_the_same(
    listing: str, mode: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Many entries noted in one directory in one step are looked at in bulk (touches.py)
    with the native lister: files, a hard link, a symlink, temporary names renamed at once,
    files deleted right after they were written, a sparse file."""
    if mode == "fanotify":
        from tests.test_fs_kit import mount_tmpfs

        mount_tmpfs(tmp_path / "mnt", request)
        tmp_path = tmp_path / "mnt"
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.2), rec)
    async with running(c, rec):
        await quiesce(c)
        d = tree / "d"
        total = 0
        for i in range(400):
            write(d / f"f{i}", os.urandom(i % 300))
            total += i % 300
            if i % 50 == 0:
                write(d / f"t{i}.tmp", b"t" * 1000)
                os.rename(d / f"t{i}.tmp", d / f"t{i}.whl")
                total += 1000
                write(d / f"gone{i}", b"g" * 10)
                os.unlink(d / f"gone{i}")
        os.link(d / "f299", d / "f299.link")
        os.symlink("f1", d / "sym")
        total += 2
        with open(d / "sparse", "wb") as f:
            f.seek(8 << 20)
            f.write(b"e" * 100)
        total += 100
        await quiesce(c)
    per_path = rec.by_path()
    assert sum(v for k, v in per_path.items() if "gone" not in k) == total
    assert per_path[str(d / "f299")] == 299 and per_path[str(d / "sparse")] == 100
    assert all(not k.endswith(".tmp") for k in per_path)
    assert rec.counts["hard_links"] == 1


@needs_native
async def test_a_listing_that_fails_midway_sweeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """getdents64 failing partway through a directory (EIO on a network file system): the
    entries it did not reach are not gone, so nothing is counted again when a later round
    lists them (scan_errors says what happened)."""
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    for i in range(4000):  # several getdents buffers of 64 KiB
        write(tree / "d" / f"a-file-with-a-rather-long-name-{i:05d}", b"x" * 10)
    real = dirscan.list_dir
    failing = {"on": False, "calls": 0}

    def flaky(fd: int, dir_id: int, max_entries: int) -> dirscan.Listing:
        if failing["on"] and os.readlink(f"/proc/self/fd/{fd}").endswith("/d"):
            failing["calls"] += 1
            if failing["calls"] % 2 == 0:
                raise OSError(5, "Input/output error")
        return real(fd, dir_id, min(max_entries, 100))

    monkeypatch.setattr(dirscan, "list_dir", flaky)
    rec = Recorder()
    c = collector(settings([str(tree)], mode="poll", poll_interval=0.05, settle=0.05), rec)
    async with running(c, rec):
        await quiesce(c)
        failing["on"] = True
        await quiesce(c)
        await quiesce(c)
        failing["on"] = False
        await quiesce(c)
        await quiesce(c)
    assert failing["calls"] >= 2
    assert rec.counts["scan_errors"] >= 1
    assert rec.bytes_under(str(tree)) == 0 and rec.counts["files_created"] == 0


def test_native_keys_are_the_interpreters_hashes() -> None:
    """list_dir computes hash((dir, name)) and hash((dev, ino)) in C without making the
    tuples (_dirscan.c pair_hash): they must be key64's, for any ints and names."""
    if not dirscan.available():
        pytest.skip("the extension was not built")
    rng = np.random.default_rng(29)
    for _ in range(5000):
        d = int(rng.integers(1, 1 << 62))
        name = rng.bytes(int(rng.integers(1, 60)))
        dev = int(rng.integers(-(1 << 62), 1 << 62))
        ino = int(rng.integers(0, 1 << 63)) * 2 + int(rng.integers(0, 2))
        assert dirscan._native.keys_of(d, name, dev, ino) == (key64((d, name)), key64((dev, ino)))


def test_fanotify_resolves_a_directory_it_was_not_told_of(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A directory fanotify names by a handle we do not know is resolved to its path
    (open_by_handle_at with a mount descriptor it accepts: not O_PATH, which it refuses)."""
    from alarm.collectors.fs import fanotify as fan
    from tests.test_fs_kit import mount_tmpfs

    mount_tmpfs(tmp_path / "mnt", request)
    root = os.fsencode(tmp_path / "mnt")
    try:
        group = fan.Fanotify()
        fsid = group.mark_filesystem(root)
    except OSError as exc:
        pytest.skip(f"fanotify: {exc}")
    try:
        os.mkdir(root + b"/new")
        with open(root + b"/new/f", "wb") as f:
            f.write(b"x")
        events, bad = fan.parse(os.read(group.fd, 1 << 16))
        assert not bad
        (key,) = {k for _m, _p, k, name, _k2, _n2 in events if name == b"f"}
        assert key != group.handle_key(root, fsid)
        assert key == group.handle_key(root + b"/new", fsid)
        assert group.resolve(key) == root + b"/new"
    finally:
        group.close()


# struct fanotify_event_metadata: event_len, vers, reserved, metadata_len, mask, fd, pid
FAN_METADATA = "<IBBHQii"


def fanotify_record(name: bytes, mask: int, pid: int, new: bytes | None = None) -> bytes:
    """One fanotify event as the kernel lays it out (FID mode: fd -1, DFID_NAME records)."""

    def info(kind: int, entry: bytes) -> bytes:
        handle = os.urandom(8)
        body = os.urandom(8) + handle_head(len(handle)) + handle + entry + b"\0"
        rec = bytes([kind, 0]) + b"\0\0" + body
        rec += b"\0" * (-len(rec) % 4)
        return rec[:2] + len(rec).to_bytes(2, "little") + rec[4:]

    old = fan.INFO_OLD_DFID_NAME if new is not None else fan.INFO_DFID_NAME
    infos = info(old, name) + (info(fan.INFO_NEW_DFID_NAME, new) if new is not None else b"")
    meta = struct.calcsize(FAN_METADATA)
    return struct.pack(FAN_METADATA, meta + len(infos), 3, 0, meta, mask, -1, pid) + infos


def handle_head(nbytes: int) -> bytes:
    return nbytes.to_bytes(4, "little") + (1).to_bytes(4, "little")


@needs_native
def test_native_fanotify_parse_is_the_python_one() -> None:
    """Events with names that are not UTF-8, renames (two records), masks above 32 bits, and
    every cut of the buffer (a record cut short is what the Python parse calls malformed)."""
    rnd = np.random.default_rng(3)
    data = b"".join(
        fanotify_record(
            b"f%d" % i + b"\xff" * (i % 3),
            int(rnd.integers(1, 1 << 40)),
            int(rnd.integers(1, 1 << 22)),
            new=b"g%d" % i if i % 5 == 0 else None,
        )
        for i in range(200)
    )
    assert fan.parse(data) == fan.parse_py(data)
    assert len(fan.parse(data)[0]) == 200
    for cut in range(0, len(data), 29):
        assert fan.parse(data[:cut]) == fan.parse_py(data[:cut]), cut


@needs_native
def test_native_inotify_parse_is_the_python_one(tmp_path: Path) -> None:
    """What the kernel queued for real file operations, and every cut of it."""
    watch = ino.Inotify()
    try:
        watch.add_watch(bytes(tmp_path))
        for i in range(40):
            p = tmp_path / (f"f{i}".encode() + b"\xfe" * (i % 4)).decode(errors="surrogateescape")
            write(p, b"x" * i)
            if i % 3 == 0:
                os.rename(p, tmp_path / f"r{i}")
        (tmp_path / "d").mkdir()
        data = ino.read_available(watch.fd)
    finally:
        watch.close()
    got = ino.parse(data)
    assert got == ino.parse_py(data) and len(got) > 100
    for cut in range(0, len(data), 13):
        assert ino.parse(data[:cut]) == ino.parse_py(data[:cut]), cut
