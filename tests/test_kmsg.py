"""/dev/kmsg collector against the real kernel: nft-logged traffic in a throwaway network
namespace, forged records written to /dev/kmsg, restarts from a saved position, and a reader
overrun forced by stopping the drain process.

Records are told apart from everyone else's by a per-test prefix; "MARK" records injected by
the test bracket each phase, and their kernel sequence numbers make the loss accounting exact
even while other processes write to the kernel log.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest

from alarm.collectors.base import SourceUnavailable
from alarm.collectors.kernel.fence import FenceRead
from alarm.collectors.kernel.kmsg import KmsgCollector, boot_id, parse_chunk
from alarm.collectors.kernel.kmsg_drain import Drain
from alarm.collectors.kernel.records import KernelRecord
from alarm.events import Batch
from tests.kernelnet import (
    fence_netns,
    forged_fence,
    inject_kmsg,
    require_kernel,
    unique_prefix,
)
from tests.servicekit import get, metric, running_service, wait_for

LEN_RE = re.compile(r" LEN=(\d+) ")
kernel = pytest.mark.kernel


class RecordTap:
    """A reader that keeps the records the collector read (in the order of its chunks)."""

    def __init__(self) -> None:
        self.chunks: list[list[KernelRecord]] = []

    def read(self, records: list[KernelRecord]) -> FenceRead:
        self.chunks.append(list(records))
        return FenceRead(None)


def collector(**kw) -> tuple[KmsgCollector, RecordTap]:
    tap = RecordTap()
    return KmsgCollector(reader=tap, **kw), tap  # type: ignore[arg-type]


class Running:
    """A collector running in the background, keeping every record it read and every count it
    handed over."""

    def __init__(self, made: tuple[KmsgCollector, RecordTap]) -> None:
        self.collector, self.tap = made
        self.batches: list[Batch] = []
        self.records: list[KernelRecord] = []
        self.counts: dict[str, int] = {}
        self._new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def emit(self, batch: Batch) -> None:
        self.batches.append(batch)
        for chunk in self.tap.chunks:
            self.records.extend(chunk)
        self.tap.chunks.clear()
        for k, n in batch.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        self._new.set()

    def count(self, name: str) -> int:
        return self.counts.get(name, 0)

    async def __aenter__(self) -> Running:
        self._task = asyncio.create_task(self.collector.run(self.emit))
        ready = asyncio.create_task(self.collector.ready.wait())
        await asyncio.wait([self._task, ready], timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            ready.cancel()
            self._task.result()  # the collector failed: show why
        assert ready.done(), "drain never became ready"
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def until(self, pred: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if self._task is not None and self._task.done():
                self._task.result()  # surface the collector's exception
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("collector did not deliver in time")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), min(left, 0.5))

    def marker(self, prefix: str, name: str) -> KernelRecord | None:
        text = f"{prefix} MARK {name}"
        return next((r for r in self.records if r.message == text), None)

    async def mark(self, prefix: str, name: str) -> KernelRecord:
        """Inject a marker record and wait until the collector has delivered it."""
        inject_kmsg(f"{prefix} MARK {name}")
        await self.until(lambda: self.marker(prefix, name) is not None)
        rec = self.marker(prefix, name)
        assert rec is not None
        return rec

    def fence(self, prefix: str) -> list[KernelRecord]:
        """Fence records carrying ``prefix`` (markers excluded)."""
        return [r for r in self.records if r.message.startswith(prefix + " IN=")]


def len_sum(records: list[KernelRecord]) -> int:
    total = 0
    for r in records:
        m = LEN_RE.search(r.message)
        assert m, r.message
        total += int(m.group(1))
    return total


# -- real kernel ------------------------------------------------------------------------
@kernel
async def test_exact_records_and_bytes() -> None:
    require_kernel()
    with fence_netns(proto=("udp", "icmp", "tcp")) as ns:
        async with Running(collector()) as run:
            await run.mark(ns.prefix, "start")
            udp = ns.udp(40, payload=100)
            icmp = ns.icmp_echo(7, payload=56)
            ns.tcp(30000)
            await run.mark(ns.prefix, "end")
        counted = ns.counter()
        fence = run.fence(ns.prefix)
        assert len(fence) == counted.packets
        assert len_sum(fence) == counted.bytes
        assert udp.packets + icmp.packets < counted.packets  # TCP added its segments
        udp_recs = [r for r in fence if "PROTO=UDP" in r.message]
        assert (len(udp_recs), len_sum(udp_recs)) == (40, 40 * 128)
        assert len_sum([r for r in fence if "PROTO=ICMP" in r.message]) == icmp.bytes
        assert all(r.trusted and r.facility == 0 for r in fence)
        assert run.count("lost_unexplained") == 0
        health = run.collector.health
        assert health.provenance_verified and run.count("records_read") >= len(fence)
        assert abs(health.last_record_ts - time.time()) < 60
        pos = run.batches[-1].position
        assert pos == {"boot_id": boot_id(), "seq": run.records[-1].seq}


@kernel
async def test_forged_records_arrive_untrusted() -> None:
    """User space cannot write facility 0: the kernel turns <0>/<4> into facility 1."""
    require_kernel()
    with fence_netns(proto="udp") as ns:
        async with Running(collector()) as run:
            await run.mark(ns.prefix, "start")
            inject_kmsg(forged_fence(ns.prefix, 999), level=4)
            inject_kmsg(forged_fence(ns.prefix, 998), level=0)
            inject_kmsg(forged_fence(ns.prefix, 997), level=None)
            ns.udp(1, payload=10)
            await run.mark(ns.prefix, "end")
        fence = run.fence(ns.prefix)
        forged = [r for r in fence if not r.trusted]
        real = [r for r in fence if r.trusted]
        assert sorted(len_sum([r]) for r in forged) == [997, 998, 999]
        assert {r.facility for r in forged} == {1}
        assert [len_sum([r]) for r in real] == [38] and real[0].facility == 0


@kernel
async def test_restart_resumes_without_double_counting() -> None:
    require_kernel()
    with fence_netns(proto="udp") as ns:
        async with Running(collector()) as first:
            await first.mark(ns.prefix, "a")
            ns.udp(10, payload=50)
            await first.mark(ns.prefix, "a-end")
        position = first.batches[-1].position
        assert position is not None and position["seq"] == first.records[-1].seq
        # While nobody reads: more traffic, which must be counted exactly once after restart.
        ns.udp(15, payload=60)
        inject_kmsg(f"{ns.prefix} MARK b-end")
        async with Running(collector(position=position)) as second:
            await second.until(lambda: second.marker(ns.prefix, "b-end") is not None)
        seqs_a = {r.seq for r in first.records}
        seqs_b = [r.seq for r in second.records]
        assert not seqs_a & set(seqs_b)
        assert seqs_b == list(range(position["seq"] + 1, position["seq"] + 1 + len(seqs_b)))
        assert len(first.fence(ns.prefix)) == 10
        assert [len_sum([r]) for r in second.fence(ns.prefix)] == [88] * 15
        assert second.count("records_lost") == 0


@kernel
async def test_resume_counts_what_the_kernel_already_dropped() -> None:
    require_kernel()
    old = {"boot_id": boot_id(), "seq": 5}  # long overwritten on any running system
    async with Running(collector(position=old)) as run:
        await run.until(lambda: bool(run.records))
    first = run.records[0].seq
    assert first is not None and first > 6
    assert run.count("lost_resume") == first - 6
    assert run.count("records_lost") == first - 6


@kernel
async def test_other_boot_starts_at_end() -> None:
    require_kernel()
    inject_kmsg("capalarm-test before-start")
    other = {"boot_id": "00000000-0000-0000-0000-000000000000", "seq": 5}
    async with Running(collector(position=other)) as run:
        prefix = unique_prefix()
        await run.mark(prefix, "x")
    assert not any(r.message == "capalarm-test before-start" for r in run.records)
    assert run.count("records_lost") == 0


@kernel
@pytest.mark.slow
async def test_overrun_while_drain_is_stopped_is_reported() -> None:
    """SIGSTOP the drain, log far more than the ring buffer holds, SIGCONT: every record
    between the two markers was either delivered or counted lost, exactly."""
    require_kernel()
    with fence_netns(proto="udp") as ns:
        async with Running(collector()) as run:
            start = await run.mark(ns.prefix, "start")
            await asyncio.sleep(0.2)  # let the marker's batch be counted
            lost0 = run.count("records_lost")
            pid = run.collector.drain_pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                sent = ns.udp(5000, payload=20)
            finally:
                os.kill(pid, signal.SIGCONT)
            end = await run.mark(ns.prefix, "end")
        assert start.seq is not None and end.seq is not None
        got = [r for r in run.records if start.seq < (r.seq or 0) < end.seq]
        lost = run.count("records_lost") - lost0
        assert lost > 0
        assert len(got) + lost == end.seq - start.seq - 1
        assert len(run.fence(ns.prefix)) < sent.packets
        assert run.count("lost_overrun") > 0
        assert run.count("lost_unexplained") == 0


@kernel
def test_drain_dies_with_its_parent() -> None:
    require_kernel()
    code = (
        "import asyncio, os\n"
        "from alarm.collectors.kernel.kmsg import KmsgCollector\n"
        "async def main():\n"
        "    c = KmsgCollector()\n"
        "    t = asyncio.create_task(c.run(lambda b: asyncio.sleep(0)))\n"
        "    while c.drain_pid is None: await asyncio.sleep(0.01)\n"
        "    print(c.drain_pid, flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    drain = int(parent.stdout.readline())
    assert os.path.exists(f"/proc/{drain}")
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{drain}/stat") as f:
            if f.read().split(") ")[1][0] != "Z":
                time.sleep(0.05)
                continue
        break
    else:
        pytest.fail("drain outlived its parent")


@kernel
async def test_service_counts_kernel_bytes_and_forged_records(tmp_path: Path) -> None:
    """The whole service on /dev/kmsg: real fence bytes land on their surface, an injected
    look-alike is counted as forged, not as traffic."""
    require_kernel()
    with fence_netns(proto="udp", ports=(9911,)) as ns:
        config = {
            "tick": "0.2s",
            "state_dir": str(tmp_path / "state"),
            "sources": [{"name": "kern", "type": "kmsg", "prefixes": [ns.prefix]}],
            "surfaces": [{"name": "fence", "match": {"dport": [9911], "proto": ["udp"]}}],
        }
        async with running_service(config) as service:
            collector = service.collectors[0][1]
            assert isinstance(collector, KmsgCollector)
            await asyncio.wait_for(collector.ready.wait(), 20)
            sent = ns.udp(25, payload=200)
            inject_kmsg(forged_fence(ns.prefix, 999))

            async def counted() -> bool:
                _, _, text = await get(service, "/metrics")
                return (
                    metric(text, "capalarm_surface_written_bytes_total", surface="fence")
                    == sent.bytes
                    and metric(text, "capalarm_source_forged_records_total", source="kern") == 1
                )

            await wait_for(counted, timeout=20)
            _, _, text = await get(service, "/metrics")
            assert metric(text, "capalarm_source_provenance_verified", source="kern") == 1
            assert metric(text, "capalarm_source_up", source="kern") == 1


# -- no root needed -----------------------------------------------------------------------
async def test_missing_device_is_a_clear_error() -> None:
    collector = KmsgCollector(path="/nonexistent/kmsg")

    async def emit(batch: Batch) -> None:
        raise AssertionError("nothing to emit")

    with pytest.raises(SourceUnavailable, match="/nonexistent/kmsg"):
        await collector.run(emit)
    assert not collector.health.up


def test_drain_drops_beyond_its_buffer_and_reports_exactly() -> None:
    """The drain on a stand-in device (a SEQPACKET socket gives one record per read): with a
    full pipe and a tiny buffer it drops, then reports the drop in-band where the gap is."""
    src, dev = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: smallest pipe
        os.set_blocking(w, False)
        dev.setblocking(False)
        n = 300

        def feed() -> None:  # a thread: the socket buffer holds fewer than n records
            for seq in range(n):
                src.send(b"4,%d,%d,-;EGRESS_FENCE tunit LEN=%d padpadpad\n" % (seq, seq, seq))
            src.close()

        feeder = threading.Thread(target=feed)
        feeder.start()
        drain = Drain(dev.fileno(), w, limit=2000)
        drain.run(None, None)  # returns at EOF
        feeder.join()
        out = b""
        while drain.blocks or drain.current or drain.full:
            drain.flush()
            out += os.read(r, 1 << 16)
        # Walk the stream: every record is either forwarded in order or inside a reported gap
        # whose LASTSEQ matches, and the whole range is accounted for.
        expected = dropped = 0
        for line in out.split(b"\n"):
            if line.startswith(b"!lost"):
                _, count, cause, last = line.split()
                assert cause == b"drain_full"
                expected += int(count)
                dropped += int(count)
                assert int(last) == expected - 1
            elif line:
                assert int(line.split(b",")[1]) == expected
                expected += 1
        assert dropped > 0 and expected == n
    finally:
        os.close(r)
        os.close(w)
        dev.close()


def test_parse_chunk_counts_reported_and_unexplained_gaps() -> None:
    data = (
        b"4,10,1000000,-;EGRESS_FENCE a IN= OUT=lo LEN=40 \n"
        b" SUBSYSTEM=net\n"
        b"!lost 5 overrun 15\n"
        b"4,16,2000000,-;EGRESS_FENCE b\n"
        b"!warn hello\n"
        b"12,19,3000000,-;user thing\n"
        b"garbage\n"
    )
    chunk = parse_chunk(data, 100.0, 9)
    assert [r.seq for r in chunk.records] == [10, 16, 19]
    assert chunk.lost == {"overrun": 5, "unexplained": 2}
    assert chunk.warnings == ["hello"]
    assert chunk.parse_errors == 1
    assert chunk.last_seq == 19
    assert chunk.records[0].ts == pytest.approx(101.0)
    assert [r.trusted for r in chunk.records] == [True, True, False]
