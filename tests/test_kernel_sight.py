"""Sight of the kernel sources: the default ``auto`` source, where /dev/kmsg is closed, falls
back to the journal; where there is no journal to read (no journalctl, no journal files, no
permission) it must say it is blind, not report up and ready for ever.  And each kernel source
names the backend it reads (``mode``).

journalctl is the real one where the case can be made with it (an empty ``-D`` directory);
where the test needs journalctl to behave on cue (no journal, then one), it is the fake of
tests/test_journald.py, which answers as journald 252 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from alarm.collectors.base import SourceContext, SourceUnavailable
from alarm.collectors.kernel import auto, file, journald
from alarm.collectors.kernel.journald import JournaldCollector
from alarm.events import Batch
from tests.test_journald import FENCE, entry, fake_journalctl

CLOSED_KMSG = "/nonexistent/kmsg"  # as /dev/kmsg is to a user without CAP_SYSLOG


def auto_source(**cfg: object) -> object:
    settings = auto.AutoSettings(name="kernel", **cfg)  # type: ignore[arg-type]
    return auto.build(settings, SourceContext(tick=1.0))


async def emit(batch: Batch) -> None:
    pass


async def until(pred: Callable[[], bool], task: asyncio.Task[None], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if task.done():
            task.result()
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(collector: JournaldCollector):  # type: ignore[no-untyped-def]
    task = asyncio.create_task(collector.run(emit))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_auto_without_kmsg_or_journalctl_is_blind_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no journalctl
    source = auto_source(kmsg_path=CLOSED_KMSG)
    assert isinstance(source, JournaldCollector)
    with pytest.raises(SourceUnavailable, match="journalctl"):  # the service retries it
        await source.run(emit)
    health = source.health
    assert not health.up and health.mode == "journald"
    assert health.blind.startswith(f"cannot read {CLOSED_KMSG} (No such file or directory")
    assert "'journalctl' not found" in health.blind and "\n" not in health.blind


async def test_auto_falling_back_to_no_journal_is_blind_until_one_can_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # journalctl -f with no journal: says so on stderr and runs on, reading nothing (real
    # journalctl 252 does exactly this); started again, it reads a kernel entry.
    fake_journalctl(
        tmp_path,
        [["!ERR No journal files were found."], [entry(1, FENCE.format(100))]],
        [-1, -1],
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    runtime, persistent = tmp_path / "run-log-journal", tmp_path / "var-log-journal"
    persistent.mkdir()  # as on a host with Storage=auto and no journald running
    source = auto_source(kmsg_path=CLOSED_KMSG)
    assert isinstance(source, JournaldCollector)
    source.journal_roots = (str(runtime), str(persistent))
    source.sight_recheck = 0.1
    health = source.health
    async with running(source) as task:
        await until(lambda: bool(health.blind), task)
        await asyncio.sleep(0.3)  # and it stays so: never up while it cannot see
        assert not health.up and health.mode == "journald"
        assert health.blind.startswith(f"cannot read {CLOSED_KMSG} (")
        assert f"no journal files in {persistent}" in health.blind
        assert health.blind in health.last_error, "source_down says why too"

        machine = persistent / "0123456789abcdef0123456789abcdef"
        machine.mkdir()
        (machine / "system.journal").write_bytes(b"LPKSHHRH")  # journald starts writing
        await until(lambda: health.up and not health.blind, task)
    assert source.restarts == 0, "reopened to read the new journal, not failed"


async def test_journalctl_saying_it_has_no_journal_is_believed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_journalctl(tmp_path, [["!ERR No journal files were found."]], [-1])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    machine = tmp_path / "journal" / "0123456789abcdef0123456789abcdef"
    machine.mkdir(parents=True)
    (machine / "system.journal").write_bytes(b"LPKSHHRH")  # there, yet journalctl finds none
    source = JournaldCollector(journal_roots=(str(tmp_path / "journal"),), sight_recheck=3600)
    health = source.health
    async with running(source) as task:
        await until(lambda: bool(health.blind), task)
        assert not health.up and health.blind == "journalctl: No journal files were found."


async def test_journald_on_an_empty_journal_directory_is_blind(tmp_path: Path) -> None:
    if shutil.which("journalctl") is None:
        pytest.skip("needs journalctl (Debian: systemd)")
    empty = tmp_path / "journal"
    empty.mkdir()
    source = JournaldCollector(directory=str(empty), retry_max=0.1)
    health = source.health
    async with running(source) as task:
        await until(lambda: bool(health.blind), task)
        for _ in range(20):  # through journalctl's exits and restarts
            assert not health.up and f"no journal files in {empty}" in health.blind
            await asyncio.sleep(0.05)


def sight_as_nobody(roots: tuple[str, ...]) -> str:
    """journal_sight as a user outside systemd-journal: as root (CI), in a forked child that
    has become nobody (65534), since root reads every file; otherwise here."""
    if os.geteuid() != 0:
        return journald.journal_sight(None, roots)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, answer through the pipe, never return
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, journald.journal_sight(None, roots).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        answer = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return answer


def test_unreadable_journal_files_are_named_as_such() -> None:
    # Not under tmp_path: nobody cannot enter pytest's directories (0700, root's).
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        machine = Path(top) / "journal" / "0123456789abcdef0123456789abcdef"
        machine.mkdir(parents=True)
        (machine / "system.journal").write_bytes(b"LPKSHHRH")
        (machine / "system.journal").chmod(0)
        why = sight_as_nobody((str(Path(top) / "journal"),))
        assert why.startswith("cannot read the journal") and "systemd-journal" in why
        (machine / "system.journal").chmod(0o644)  # readable: the same check sees a journal
        assert sight_as_nobody((str(Path(top) / "journal"),)) == ""


def test_user_journals_alone_carry_no_kernel_records(tmp_path: Path) -> None:
    machine = tmp_path / "journal" / "0123456789abcdef0123456789abcdef"
    machine.mkdir(parents=True)
    (machine / "user-1000.journal").write_bytes(b"LPKSHHRH")
    roots = (str(tmp_path / "nothing"), str(tmp_path / "journal"))
    assert journald.journal_sight(None, roots).startswith("no journal files in")
    (machine / "system.journal").write_bytes(b"LPKSHHRH")
    assert journald.journal_sight(None, roots) == ""
    assert journald.journal_sight(None, (str(tmp_path / "nothing"),)).startswith("no journal: no ")


def test_each_kernel_source_names_its_backend(tmp_path: Path) -> None:
    readable = tmp_path / "kmsg"
    readable.write_text("")
    assert auto_source(kmsg_path=str(readable)).health.mode == "kmsg"  # type: ignore[attr-defined]
    assert auto_source(kmsg_path=CLOSED_KMSG).health.mode == "journald"  # type: ignore[attr-defined]
    settings = file.FileSettings(name="kern", type="file", paths=[str(tmp_path / "kern.log")])
    assert file.build(settings, SourceContext(tick=1.0)).health.mode == "file"


async def test_the_service_on_the_default_source_with_nothing_to_read_is_blind_and_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.servicekit import get, metric, running_service, wait_for

    monkeypatch.setenv("PATH", str(tmp_path))  # no journalctl
    cfg = {
        "tick": "0.2s",
        # A source that never read holds evaluation back this long (then it counts late).
        "event_time": {"lateness": "1s"},
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "type": "auto", "kmsg_path": CLOSED_KMSG}],
        "surfaces": [{"name": "proxy", "match": {"dport": [443], "proto": ["tcp"]}}],
    }
    async with running_service(cfg) as service:

        async def blind_alarm() -> bool:
            _, _, text = await get(service, "/metrics")
            return metric(text, "capalarm_alert_state", rule="surface_blind", target="kernel") == 2

        await wait_for(blind_alarm, 10)
        _, _, text = await get(service, "/metrics")
        assert metric(text, "capalarm_source_up", source="kernel") == 0
        assert metric(text, "capalarm_source_blind", source="kernel") == 1
        assert metric(text, "capalarm_source_info", source="kernel", mode="journald") == 1
        status, _, body = await get(service, "/readyz")
        assert status == 503 and "kernel" in body
        _, _, body = await get(service, "/api/v1/alerts")
        (fired,) = [c for c in json.loads(body)["changes"] if c["rule"] == "surface_blind"]
        assert f"cannot read {CLOSED_KMSG}" in fired["summary"]
        assert "'journalctl' not found" in fired["summary"]
