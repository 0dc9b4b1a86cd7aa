#!/usr/bin/env python3
"""Figure: CPU the watcher spends per new file and per append, and the time of a first scan,
for the service as users run it, beside inotifywait, watchdog and ``find`` in the same run.

Per-event CPU: each watcher is its own process on a private tmpfs (needs root):

- ``capalarm run --config ...`` (the installed console command, the whole service: fs source,
  pipeline, detector, /metrics), one ``type: fs`` source in ``mode: inotify`` and in
  ``mode: fanotify``, one surface on the tree;
- ``inotifywait -m -r`` (Debian inotify-tools), its output read by this script;
- watchdog 7.1's inotify observer (`pip install watchdog`) with a handler that ``os.stat``s every created or
  modified file (the design's original choice, doing the least a byte counter must).

A separate writer process creates ``--files`` files of 0-255 bytes (1,000 per new
directory), or makes ``--appends`` 4 KiB appends round-robin to 4 files.  The figure is the
watcher process's user + system CPU (``/proc/<pid>/stat``, all its threads) from just before
the writer starts until it has handled everything (capalarm: its /metrics shows the exact
bytes and events; the others: no CPU for 0.5 s), minus its idle CPU over the same time
(measured for 3 s before), divided by the events written.  Conditions are interleaved
round-robin over ``--runs`` runs; medians.

The fs source lists directories natively (alarm/collectors/fs/_dirscan.c: getdents64 + fstatat,
new entries added to its tables in bulk) where the extension was built, else with os.scandir;
the script prints which one the installed package has.

First scan: ``capalarm run`` on a tree of ``--scan-files`` files (first start, no state),
from the process start to its /metrics showing the first scan completed, minus the same
process's time to serve /metrics on an empty tree (interpreter start and imports), beside
``find TREE -printf '%s\\n'`` (a stat of every file) on the same tree, page cache warm.

    python bench/fs_watcher_cpu.py [--runs 5] [--files 20000] [--appends 20000]
                                   [--scan-files 100000]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

CLK_TCK = os.sysconf("SC_CLK_TCK")
SURFACE = "tree"

FILES_WRITER = r"""
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    if i % 1000 == 0:
        base = os.path.join(root, f"d{i // 1000:03d}")
        os.mkdir(base)
        base += "/"
    fd = os.open(base + f"f{i:06d}", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"w" * (i % 256))
    os.close(fd)
"""

APPEND_WRITER = r"""
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
fds = [os.open(os.path.join(root, f"big{k}"), os.O_WRONLY | os.O_APPEND) for k in range(4)]
block = b"a" * 4096
for i in range(n):
    os.write(fds[i % 4], block)
"""

WATCHDOG = r"""
import os, sys, time
from watchdog.events import FileSystemEventHandler
from watchdog.observers.inotify import InotifyObserver

class Sizes(FileSystemEventHandler):
    total = 0
    def on_created(self, event):
        self.look(event)
    def on_modified(self, event):
        self.look(event)
    def look(self, event):
        if not event.is_directory:
            try:
                self.total += os.stat(event.src_path).st_size
            except OSError:
                pass

obs = InotifyObserver()
obs.schedule(Sizes(), sys.argv[1], recursive=True)
obs.start()
print("ready", flush=True)
sys.stdin.readline()
"""


def _ticks(stat_path: str) -> int:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def cpu_seconds(pid: int) -> float:
    """The process's CPU (all its threads, those that ended too)."""
    return _ticks(f"/proc/{pid}/stat") / CLK_TCK


def fs_thread_seconds(pid: int) -> float:
    """CPU of capalarm's fs source threads: the reader (fs-inotify, fs-fanotify) and the
    engine's step thread (fs-step), named so in the kernel by the source."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if not f.read().startswith("fs-"):
                    continue
            total += _ticks(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return total / CLK_TCK


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def metric(text: str, name: str, **labels: str) -> float | None:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    return None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Capalarm:
    """``capalarm run`` on ``tree`` with one fs source and one surface."""

    def __init__(self, tree: Path, work: Path, mode: str, settle: str = "0.5s") -> None:
        self.port = free_port()
        state = work / f"state-{mode}"
        shutil.rmtree(state, ignore_errors=True)
        cfg = {
            "tick": "1s",
            "state_dir": str(state),
            "http": {"listen": f"127.0.0.1:{self.port}"},
            "sources": [
                {"name": "fs", "type": "fs", "paths": [str(tree)], "mode": mode, "settle": settle}
            ],
            "surfaces": [{"name": SURFACE, "kind": "fs", "match": {"path": [str(tree)]}}],
        }
        path = work / f"capalarm-{mode}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            ["capalarm", "run", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=open(work / f"capalarm-{mode}.log", "a"),  # noqa: SIM115
        )
        self.pid = self.proc.pid

    def scans_done(self) -> float:
        text = scrape(self.port)
        if text is None:
            return -1.0
        return metric(text, "capalarm_source_scans_completed_total", source="fs") or 0.0

    def wait_scanned(self, timeout: float = 600) -> float:
        """Seconds from the process start until /metrics shows the first scan done."""
        deadline = time.monotonic() + timeout
        while self.scans_done() < 1:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("capalarm did not finish its first scan")
            time.sleep(0.01)
        return time.perf_counter() - self.started

    def totals(self) -> tuple[float, float]:
        text = scrape(self.port) or ""
        b = metric(text, "capalarm_surface_written_bytes_total", surface=SURFACE, kind="fs")
        e = metric(text, "capalarm_surface_write_events_total", surface=SURFACE, kind="fs")
        return b or 0.0, e or 0.0

    def wait_handled(self, nbytes: int, events: int | None, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            b, e = self.totals()
            if b == nbytes and (events is None or e == events):
                return
            if b > nbytes or (events is not None and e > events):
                raise RuntimeError(f"capalarm counted {b} B / {e} events, wrote {nbytes}/{events}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"capalarm counted {b} B / {e} events of {nbytes}/{events}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class Inotifywait:
    def __init__(self, tree: Path) -> None:
        self.proc = subprocess.Popen(
            ["inotifywait", "-m", "-r", "-e", "create,modify,close_write,moved_to,delete",
             str(tree)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stderr is not None and self.proc.stdout is not None
        while b"Watches established" not in self.proc.stderr.readline():
            if self.proc.poll() is not None:
                raise RuntimeError("inotifywait failed to start")
        self.pid = self.proc.pid
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        while self.proc.stdout.read(1 << 16):
            pass

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Watchdog:
    def __init__(self, tree: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(tree)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("watchdog failed to start")
        self.pid = self.proc.pid

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def wait_idle(pid: int, idle_rate: float, quiet: float = 0.5, timeout: float = 300) -> None:
    """Until the process has spent no more than its idle CPU for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = cpu_seconds(pid)
        if now - last <= idle_rate * quiet + 1.5 / CLK_TCK:
            return
        last = now


def idle_rate(pid: int, seconds: float = 3.0) -> float:
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)


def one(condition: str, workload: str, work: Path, n: int) -> tuple[float, float]:
    """Microseconds of the watcher's CPU per event written: the process's, and (capalarm)
    its fs source threads' (else the same)."""
    tree = work / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir()
    if workload == "append":
        for k in range(4):
            (tree / f"big{k}").write_bytes(b"")
    if condition.startswith("capalarm"):
        w: Capalarm | Inotifywait | Watchdog = Capalarm(tree, work, condition.split("-", 1)[1])
        w.wait_scanned()
    elif condition == "inotifywait":
        w = Inotifywait(tree)
    else:
        w = Watchdog(tree)
    try:
        time.sleep(1.0)  # settled after start
        rate = idle_rate(w.pid)
        fs = isinstance(w, Capalarm)
        f0 = fs_thread_seconds(w.pid) if fs else 0.0
        c0, t0 = cpu_seconds(w.pid), time.perf_counter()
        code = FILES_WRITER if workload == "files" else APPEND_WRITER
        subprocess.run([sys.executable, "-c", code, str(tree), str(n)], check=True)
        if isinstance(w, Capalarm):
            if workload == "files":
                # 1,000 files per directory: the files and their directories are events.
                w.wait_handled(sum(i % 256 for i in range(n)), n + (n + 999) // 1000)
            else:
                # Appends between two looks are one growth: the bytes are exact, the events
                # are as many as the looks that saw growth.
                w.wait_handled(4096 * n, None)
                wait_idle(w.pid, rate)
        else:
            wait_idle(w.pid, rate)
        spent = cpu_seconds(w.pid) - c0 - rate * (time.perf_counter() - t0)
        threads = fs_thread_seconds(w.pid) - f0 if fs else spent
        return spent / n * 1e6, threads / n * 1e6
    finally:
        w.stop()


def make_tree(root: Path, files: int) -> None:
    for d in range((files + 999) // 1000):
        sub = root / f"d{d:04d}"
        sub.mkdir()
        base = str(sub) + "/"
        for i in range(min(1000, files - d * 1000)):
            fd = os.open(base + f"f{i:04d}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"x" * (i % 61))
            os.close(fd)


def first_scan(work: Path, mode: str, files: int) -> tuple[float, float]:
    """(seconds of capalarm's first scan of the tree, seconds of ``find -printf %s``)."""
    empty = work / "empty"
    empty.mkdir(exist_ok=True)
    c = Capalarm(empty, work, mode)
    try:
        base = c.wait_scanned()  # start-up: interpreter, imports, an empty first scan
    finally:
        c.stop()
    tree = work / "big"
    c = Capalarm(tree, work, mode)
    try:
        scanned = c.wait_scanned() - base
    finally:
        c.stop()
    t = time.perf_counter()
    subprocess.run(["find", str(tree), "-printf", "%s\n"], check=True, stdout=subprocess.DEVNULL)
    return scanned, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--appends", type=int, default=20_000)
    ap.add_argument("--scan-files", type=int, default=100_000)
    ap.add_argument("--only", choices=["events", "scan"], help="one half of the figure")
    ap.add_argument(
        "--conditions",
        default="capalarm-inotify,capalarm-fanotify,inotifywait,watchdog",
        help="comma-separated subset",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: a private tmpfs, and fanotify")
    from alarm.collectors.fs import dirscan

    listing = "native getdents64 + fstatat (_dirscan)" if dirscan.available() else "os.scandir"
    print(f"fs source directory listing: {listing}")
    work = Path(tempfile.mkdtemp(prefix="capalarm-watcher-cpu-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "bench-cpu", str(work)], check=True)
    try:
        conditions = args.conditions.split(",")
        if "watchdog" in conditions and importlib.util.find_spec("watchdog") is None:
            # An anchor that is not installed is left out and said so, not a crash mid-run.
            print("watchdog anchor left out: watchdog is not installed (pip install watchdog)")
            conditions.remove("watchdog")
        if args.only != "scan":
            print(f"tmpfs, {args.runs} runs interleaved, medians; microseconds of watcher CPU")
            print(
                "workload | condition | us per event, process (median) | fs threads (median) "
                "| process, each run"
            )
            for workload, n in (("files", args.files), ("append", args.appends)):
                res: dict[str, list[tuple[float, float]]] = {c: [] for c in conditions}
                for _ in range(args.runs):
                    for c in conditions:
                        res[c].append(one(c, workload, work, n))
                for c in conditions:
                    proc = statistics.median(r[0] for r in res[c])
                    threads = statistics.median(r[1] for r in res[c])
                    shown = f"{threads:.1f}" if c.startswith("capalarm") else "-"
                    runs = ", ".join(f"{r[0]:.1f}" for r in res[c])
                    print(f"{workload} | {c} | {proc:.1f} | {shown} | {runs}", flush=True)
        if args.only != "events":
            tree = work / "big"
            tree.mkdir()
            make_tree(tree, args.scan_files)
            subprocess.run(["find", str(tree), "-printf", "%s\n"], stdout=subprocess.DEVNULL)
            print(f"first scan of {args.scan_files} files | capalarm s | find -printf %s s | ratio")
            for mode in [c.split("-", 1)[1] for c in conditions if c.startswith("capalarm")]:
                rows = [first_scan(work, mode, args.scan_files) for _ in range(args.runs)]
                s = statistics.median(r[0] for r in rows)
                f = statistics.median(r[1] for r in rows)
                print(f"{mode} | {s:.3f} | {f:.3f} | {s / f:.2f}x")
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
