"""FileTailCollector: rotation, copytruncate, partial lines, restarts, oversized lines, garbage.

Most tests step the collector with ``poll()`` so that what the files look like at each poll is
exact (no races with the poll timer); a few go through ``run()`` for the loop itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import shutil
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.tail import FileTailCollector, TailBatch


def parser(line: str) -> KernelRecord | None:
    """Test parser: ``#`` lines are not kernel lines, ``BAD`` lines are malformed."""
    if line.startswith("#"):
        return None
    if line.startswith("BAD"):
        raise ValueError(line)
    return KernelRecord(ts=1000.0 + len(line), message=line)


class Sink:
    """Stands in for the pipeline: every batch emitted is counted."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[TailBatch] = []
        self.delay = delay

    async def __call__(self, batch: TailBatch) -> None:
        self.batches.append(batch)
        if self.delay:
            await asyncio.sleep(self.delay)

    @property
    def lines(self) -> list[str]:
        # With a chunk reader, every line's message comes in order as the batch's read
        # (see chunky); the records are only those it handed back.
        return [
            m
            for b in self.batches
            for m in (b.read if isinstance(b.read, list) else [r.message for r in b.records])
        ]

    @property
    def position(self) -> dict[str, Any] | None:
        return self.batches[-1].position if self.batches else None


async def drain(c: FileTailCollector, sink: Sink, limit: int = 10_000) -> None:
    for _ in range(limit):
        if not await c.poll(sink):
            return
    raise AssertionError("collector never caught up")


def chunky(data: bytes, parse_lines: Any) -> tuple[list[str], float]:
    """Test chunk reader: reads the lines whose bytes sum to an even number itself (as the
    native scanner reads most lines) and hands the others back to the line parser.  Returns
    every line's message in order, and the newest time among the lines it read."""
    got, newest = [], 0.0
    for raw in data.split(b"\n")[:-1]:
        if sum(raw) % 2 == 0 and raw[:1] not in (b"#", b"B"):
            got.append(raw.decode("utf-8", "replace"))
            newest = max(newest, 1000.0 + len(got[-1]))
        else:
            got += [r.message for r in parse_lines(raw + b"\n")]
    return got, newest


def collector(paths: list[Path | str], chunks: bool = False, **kw: Any) -> FileTailCollector:
    return FileTailCollector(
        "files", [str(p) for p in paths], parser, chunk_reader=chunky if chunks else None, **kw
    )


def write(path: Path, data: str | bytes, mode: str = "ab") -> None:
    with open(path, mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def lines(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(start, start + n)]


def text(ls: list[str]) -> str:
    return "".join(line + "\n" for line in ls)


@pytest.mark.parametrize("chunks", [False, True])
async def test_lines_partial_line_and_stats(tmp_path: Path, chunks: bool) -> None:
    log = tmp_path / "kern.log"
    write(log, "one\n#not kernel\nBAD line\ntw")
    c = collector([log], chunks)
    sink = Sink()
    await drain(c, sink)
    assert sink.lines == ["one"]  # "tw" waits for its newline
    assert c.totals["records_read"] == 3 and c.totals["parse_errors"] == 1
    entry = sink.position["files"][str(log)]  # type: ignore[index]
    assert entry["offset"] == len("one\n#not kernel\nBAD line\n")
    write(log, "o\nthree\n")
    await drain(c, sink)
    assert sink.lines == ["one", "two", "three"]
    assert c.totals["records_read"] == 5
    assert c.health.last_record_ts == 1005.0
    assert c.health.provenance_verified is False
    await c.close()


async def test_position_format(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    body = text(lines("line-", 200))
    write(log, body)
    c = collector([log])
    sink = Sink()
    await drain(c, sink)
    st_ = os.stat(log)
    head = body.encode()[:1024]
    assert sink.position == {
        "files": {
            str(log): {
                "dev": st_.st_dev,
                "ino": st_.st_ino,
                "fingerprint": hashlib.sha256(head).hexdigest(),
                "fp_len": 1024,
                "offset": len(body),
            }
        }
    }
    await c.close()


@pytest.mark.parametrize("pattern", ["kern.log", "kern.log*"])
@pytest.mark.parametrize("chunks", [False, True])
async def test_rotation_by_rename_reads_late_writes_to_old_file(
    tmp_path: Path, pattern: str, chunks: bool
) -> None:
    log = tmp_path / "kern.log"
    old = lines("old-", 3)
    write(log, text(old))
    c = collector([tmp_path / pattern], chunks)
    sink = Sink()
    await drain(c, sink)
    late = lines("late-", 4)
    # The daemon's descriptor stays on the old file after the rename.
    with open(log, "ab") as writer:
        os.rename(log, tmp_path / "kern.log.1")
        writer.write(text(late).encode() + b"unterminated")
    new = lines("new-", 2)
    write(log, text(new))
    await drain(c, sink)
    if pattern == "kern.log":
        # Old file finished (its unterminated tail flushed), then the new one from 0.
        assert sink.lines == old + late + ["unterminated"] + new
        assert list(sink.position["files"]) == [str(log)]  # type: ignore[index]
    else:
        # kern.log.1 still matches: followed on, its partial line still waits.
        assert sorted(sink.lines) == sorted(old + late + new)
        assert len(sink.position["files"]) == 2  # type: ignore[index]
    assert c.totals["rotations"] == 1
    assert c.totals["truncations"] == 0
    await c.close()


async def test_rotation_old_file_finished_before_new_one(tmp_path: Path) -> None:
    """With a small batch the old file takes several polls; the new file waits for it."""
    log = tmp_path / "kern.log"
    write(log, text(lines("a-", 1)))
    c = collector([log], batch_lines=3)
    sink = Sink()
    await drain(c, sink)
    write(log, text(lines("a-", 20, 1)))
    os.rename(log, tmp_path / "kern.log.1")
    write(log, text(lines("b-", 5)))
    await drain(c, sink)
    assert sink.lines == lines("a-", 21) + lines("b-", 5)
    assert all(len(b.records) <= 3 for b in sink.batches)
    assert c.totals["rotations"] == 1
    await c.close()
    # Restarting from any batch's position, even one taken while both files were open (the
    # old one under a "path#dev:ino" key), reads every remaining line exactly once.
    both = [i for i, b in enumerate(sink.batches) if len(b.position["files"]) == 2]  # type: ignore[index]
    assert both
    for i in range(1, len(sink.batches)):
        rest = Sink()
        c2 = collector([log], position=sink.batches[i].position)
        await drain(c2, rest)
        done = [r.message for b in sink.batches[: i + 1] for r in b.records]
        assert done + rest.lines == sink.lines, i
        await c2.close()


@pytest.mark.parametrize("chunks", [False, True])
async def test_copytruncate(tmp_path: Path, chunks: bool) -> None:
    log = tmp_path / "kern.log"
    write(log, text(lines("a-", 5)))
    c = collector([log], chunks)
    sink = Sink()
    await drain(c, sink)
    write(log, "half-writ")  # read as a partial line...
    await drain(c, sink)
    shutil.copyfile(log, tmp_path / "kern.log.1")
    os.truncate(log, 0)  # ...whose end is gone: a known loss
    write(log, text(lines("b-", 2)))
    await drain(c, sink)
    assert sink.lines == lines("a-", 5) + lines("b-", 2)
    assert c.totals["truncations"] == 1
    assert c.totals["records_lost"] == 1
    assert c.totals["truncation_possible_loss"] == 1

    # Truncated and written past our offset before we looked: the first bytes changed.
    os.truncate(log, 0)
    write(log, text(lines("c-", 50)))
    await drain(c, sink)
    assert sink.lines[-50:] == lines("c-", 50)
    assert c.totals["truncations"] == 2
    assert c.totals["records_lost"] == 1  # nothing known unread this time
    await c.close()


@pytest.mark.parametrize("chunks", [False, True])
async def test_restart_mid_file_exactly_once(tmp_path: Path, chunks: bool) -> None:
    log = tmp_path / "kern.log"
    first = lines("x-", 100)
    write(log, text(first))
    c = collector([log], chunks, batch_lines=10)
    sink = Sink()
    for _ in range(5):
        await c.poll(sink)
    assert len(sink.lines) == 50
    await c.close()
    more = lines("x-", 50, 100)
    write(log, text(more))
    c2 = collector([log], chunks, position=sink.position, batch_lines=10)
    await drain(c2, sink)
    assert sink.lines == first + more
    await c2.close()


async def test_restart_through_run_cancelled_anywhere(tmp_path: Path) -> None:
    """Cancel ``run()`` at arbitrary moments (mid-thread, mid-emit, asleep) and restart from
    the last batch the sink counted: every line exactly once."""
    log = tmp_path / "kern.log"
    expected = lines("r-", 3000)
    write(log, text(expected[:2000]) + "r-020")  # the writer is mid-line
    sink = Sink(delay=0.001)
    position = None
    rng = random.Random(7)
    for i in range(8):
        if i == 3:
            write(log, "00\n" + text(expected[2001:]))
        c = collector([log], position=position, batch_lines=rng.choice([7, 50, 300]))
        c.poll_interval = 0.01
        task = asyncio.create_task(c.run(sink))
        await asyncio.sleep(rng.uniform(0.0, 0.03))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c.health.up is False
        position = sink.position
    c = collector([log], position=position)
    await drain(c, sink)
    assert sink.lines == expected
    await c.close()


async def test_restart_after_rotation_while_stopped(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    write(log, text(lines("a-", 6)))
    c = collector([log], batch_lines=3)
    sink = Sink()
    await c.poll(sink)
    assert sink.lines == lines("a-", 3)
    await c.close()
    # Stopped: more lines, rotation (twice over), a new file.
    write(log, text(lines("a-", 2, 6)))
    os.rename(log, tmp_path / "kern.log.1")
    write(log, text(lines("b-", 4)))
    c2 = collector([log], position=sink.position)
    await drain(c2, sink)
    assert sink.lines == lines("a-", 8) + lines("b-", 4)
    assert c2.totals["rotations"] == 1
    await c2.close()


async def test_restart_after_rotated_file_deleted(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    write(log, text(lines("a-", 6)))
    c = collector([log])
    sink = Sink()
    await drain(c, sink)
    await c.close()
    os.rename(log, tmp_path / "kern.log.1")
    write(log, text(lines("b-", 4)))  # created while the old inode lives: not reused
    os.unlink(tmp_path / "kern.log.1")  # compressed away, say
    c2 = collector([log], position=sink.position)
    await drain(c2, sink)
    assert sink.lines == lines("a-", 6) + lines("b-", 4)
    assert c2.totals["resume_file_missing"] == 1
    await c2.close()


async def test_restart_after_truncation_while_stopped(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    write(log, text(lines("a-", 60)))
    c = collector([log])
    sink = Sink()
    await drain(c, sink)
    await c.close()
    os.truncate(log, 0)
    write(log, text(lines("b-", 3)))  # smaller than the saved offset
    c2 = collector([log], position=sink.position)
    await drain(c2, sink)
    assert sink.lines[60:] == lines("b-", 3)
    assert c2.totals["truncations"] == 1
    await c2.close()
    os.truncate(log, 0)
    write(log, text(lines("c-", 100)))  # bigger than the saved offset, other first bytes
    c3 = collector([log], position=sink.position)
    await drain(c3, sink)
    assert sink.lines[63:] == lines("c-", 100)
    assert c3.totals["truncations"] == 1
    await c3.close()


@pytest.mark.parametrize("chunks", [False, True])
async def test_ten_megabyte_line_bounded_memory(tmp_path: Path, chunks: bool) -> None:
    log = tmp_path / "kern.log"
    max_line = 1 << 20
    before, after = lines("pre-", 100), lines("post-", 100)
    with open(log, "wb") as f:
        f.write(text(before).encode())
        for _ in range(10):
            f.write(b"y" * (1 << 20))
        f.write(b"\n" + text(after).encode())
    c = collector([log], chunks, max_line_bytes=max_line)
    sink = Sink()
    tracemalloc.start()
    try:
        await drain(c, sink)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sink.lines == before + after
    assert c.totals["parse_errors"] == 1
    assert c.totals["oversized_lines"] == 1
    assert peak < 2 * max_line, peak
    await c.close()


@pytest.mark.parametrize("chunks", [False, True])
async def test_oversized_line_arriving_across_polls_and_small_limit(
    tmp_path: Path, chunks: bool
) -> None:
    log = tmp_path / "kern.log"
    c = collector([log], chunks, max_line_bytes=1000)
    sink = Sink()
    write(log, "ok-1\n")
    await drain(c, sink)
    for _ in range(5):
        write(log, "z" * 700)  # no newline yet: more than the limit after two writes
        await drain(c, sink)
    write(log, "zzz\nok-2\n" + "q" * 1500 + "\nok-3\n")  # a complete long line in one chunk
    await drain(c, sink)
    assert sink.lines == ["ok-1", "ok-2", "ok-3"]
    assert c.totals["oversized_lines"] == 2
    # While the long line was being skipped, the position stayed at its start.
    offsets = [b.position["files"][str(log)]["offset"] for b in sink.batches]  # type: ignore[index]
    assert offsets[0] == 5 and offsets == sorted(offsets)
    await c.close()


async def test_binary_garbage_never_crashes(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    rng = random.Random(1)
    expected = []
    with open(log, "wb") as f:
        for i in range(300):
            f.write(rng.randbytes(rng.randint(0, 400)) + b"\x00\xff\xfe\xc3(\n")
            f.write(f"good-{i}\n".encode())
            expected.append(f"good-{i}")

    def picky(line: str) -> KernelRecord | None:
        if line.startswith("good-"):
            return KernelRecord(ts=1.0, message=line)
        if "\x00" in line:
            raise ValueError("NUL")
        if len(line) % 7 == 0:
            raise IndexError("parser bug")  # must be counted, not crash the source
        return None

    c = FileTailCollector("files", [str(log)], picky)
    sink = Sink()
    await drain(c, sink)
    assert sink.lines == expected
    assert c.totals["parse_errors"] >= 300
    assert c.totals["records_read"] >= 600
    await c.close()


async def test_real_syslog_parser(tmp_path: Path) -> None:
    kf = pytest.importorskip("alarm.collectors.kernel.formats")
    data = Path(__file__).resolve().parent / "data/kernel-fence/dmesg-lines.txt"
    msgs = [m.split("] ", 1)[1].rstrip() for m in data.read_text().splitlines() if "] " in m]
    log = tmp_path / "kern.log"
    write(log, "Jul  1 12:00:00 host sshd[1]: Accepted publickey\n")
    for i, m in enumerate(msgs):
        write(log, f"Jul  1 12:00:{i % 60:02d} host kernel: [  455.{i:06d}] {m}\n")
    write(log, "\x00\xff garbage\n")
    c = FileTailCollector("kern", [str(log)], lambda line: kf.parse_syslog_line(line, 2026))
    sink = Sink()
    await drain(c, sink)
    assert [r.message for r in sink.batches[0].records] == msgs
    assert c.totals["records_read"] == len(msgs) + 2
    assert c.totals["parse_errors"] == 1
    await c.close()


async def test_glob_picks_up_new_file_with_run(tmp_path: Path) -> None:
    write(tmp_path / "a.log", text(lines("a-", 3)))
    c = collector([tmp_path / "*.log"], poll_interval=0.02)
    sink = Sink()
    task = asyncio.create_task(c.run(sink))

    async def until(n: int) -> None:
        for _ in range(250):
            if len(sink.lines) >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(sink.lines)

    await until(3)
    assert c.health.up is True
    write(tmp_path / "b.log", text(lines("b-", 2)))
    write(tmp_path / "c.log.gz", b"\x1f\x8b binary\n")  # compressed rotations are not followed
    await until(5)
    write(tmp_path / "a.log", text(lines("a-", 1, 3)))
    await until(6)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(sink.lines) == sorted(lines("a-", 4) + lines("b-", 2))
    assert set(sink.position["files"]) == {str(tmp_path / "a.log"), str(tmp_path / "b.log")}  # type: ignore[index]


@pytest.mark.parametrize("chunks", [False, True])
async def test_start_at_end_for_new_files(tmp_path: Path, chunks: bool) -> None:
    write(tmp_path / "a.log", text(lines("old-", 10)) + "being-wr")
    c = collector([tmp_path / "*.log"], chunks, start_at_end_for_new_files=True)
    sink = Sink()
    await drain(c, sink)
    assert sink.lines == []
    write(tmp_path / "a.log", "itten\n")
    write(tmp_path / "b.log", text(lines("b-", 2)))  # appeared later: read whole
    await drain(c, sink)
    assert sink.lines == ["being-written", *lines("b-", 2)]
    await c.close()


# -- random interleavings ------------------------------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 6)),
    st.tuples(st.just("partial"), st.integers(1, 30)),
    st.tuples(st.just("rotate"), st.just(0)),
    st.tuples(st.just("truncate"), st.just(0)),
    st.tuples(st.just("poll"), st.integers(1, 3)),
    st.tuples(st.just("restart"), st.just(0)),
)
LINE = re.compile(r"^L\d{6}-x*$")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(OPS, min_size=1, max_size=30),
    pattern=st.sampled_from(["kern.log", "kern.log*"]),
    batch_lines=st.sampled_from([2, 5, 5000]),
    pad=st.integers(0, 200),
    chunks=st.booleans(),
)
def test_random_interleavings(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, int]],
    pattern: str,
    batch_lines: int,
    pad: int,
    chunks: bool,
) -> None:
    d = tmp_path_factory.mktemp("tail")
    asyncio.run(_interleave(d, ops, pattern, batch_lines, pad, chunks))


async def _interleave(
    d: Path, ops: list[tuple[str, int]], pattern: str, batch_lines: int, pad: int, chunks: bool
) -> None:
    log = d / "kern.log"
    log.touch()
    written: list[str] = []
    partial = ""  # the part of a line the writer has written without its newline
    writer = os.open(log, os.O_WRONLY | os.O_APPEND)
    reopen = False  # rotated: the writer reopens (after finishing its line) before a poll
    rotated = 0
    truncated = False
    sink = Sink()
    c = collector([d / pattern], chunks, batch_lines=batch_lines)
    # Following from the start: a file rotated away before we ever looked is not ours to read.
    await c.poll(sink)

    def line() -> str:
        s = f"L{len(written):06d}-" + "x" * ((len(written) * 37 + pad) % 120)
        written.append(s)
        return s

    def finish_partial() -> None:
        nonlocal partial
        if partial:
            os.write(writer, (partial + "\n").encode())
            partial = ""

    for op, n in ops:
        if op == "append":
            finish_partial()
            os.write(writer, text([line() for _ in range(n)]).encode())
        elif op == "partial" and not partial:
            full = line()
            n = min(n, len(full) - 1)  # the rest is never empty: a newline is still owed
            partial, head = full[n:], full[:n]
            os.write(writer, head.encode())
        elif op == "rotate":
            rotated += 1
            os.rename(log, d / f"kern.log.{rotated}")
            log.touch()  # logrotate's "create"
            reopen = True
        elif op == "truncate":
            if pattern == "kern.log":  # a copy the globs match would be read again (documented)
                shutil.copyfile(log, d / f"kern.log.c{rotated}")
            os.truncate(log, 0)
            truncated = True
        elif op == "poll":
            if reopen:
                finish_partial()
                os.close(writer)
                writer = os.open(log, os.O_WRONLY | os.O_APPEND)
                reopen = False
            for _ in range(n):
                await c.poll(sink)
        elif op == "restart":
            await c.close()
            c = collector([d / pattern], chunks, batch_lines=batch_lines, position=sink.position)

    finish_partial()
    os.close(writer)
    await drain(c, sink)
    await c.close()

    got = sink.lines
    whole = [s for s in got if LINE.match(s)]
    assert len(whole) == len(set(whole)), Counter(whole).most_common(3)
    assert set(whole) <= set(written)
    if not truncated:
        assert got == whole  # never a half line
        assert sorted(whole) == sorted(written)
        assert c.totals["records_lost"] == 0
