"""Writer tax: how much slower a writer runs while its tree is watched, side by side in one run.

Two writers: one creating 100k small files (0-255 bytes, in 100 new directories), one appending
4 KiB blocks to 4 large files (256 MiB in all).  Each runs alone, under ``inotifywait -m -r``
(Debian inotify-tools; its events consumed by a reader), and under the service as users run
it: ``capalarm run --config ...`` (the installed console command on ``PATH``: fs source,
pipeline, detector, /metrics), one ``type: fs`` source on the tree in ``mode: inotify`` and in
``mode: fanotify`` and one surface, started as bench/fs_watcher_cpu.py starts it (its
``Capalarm`` class) and waited for until /metrics shows its first scan done.  Medians of
``--runs`` runs; for capalarm also whether its /metrics counted every byte written and every
event (each file and each new directory; appends: bytes only, since appends between two
looks are one growth), the read mode /metrics names (``capalarm_source_info``), and how long
after the writer finished /metrics showed it all (polled every 0.1 s).  inotifywait sees
events, not bytes.

    python bench/fs_writer_tax.py              # on a private tmpfs (needs root)
    python bench/fs_writer_tax.py --runs 3 --disk

The writer and each watcher are separate processes on this machine's cores; the figure is the
writer's own wall time and CPU, measured inside it.  Before (until 2026-12-04) the capalarm
condition was a test kit (tests/test_fs_kit.py's collector) summing batches into a stub in its
own process, not the service.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from fs_watcher_cpu import Capalarm as Service
from fs_watcher_cpu import scrape

FILES_WRITER = r"""
import os, sys, time
root, n = sys.argv[1], int(sys.argv[2])
t, c = time.perf_counter(), time.process_time()
for i in range(n):
    if i % 1000 == 0:
        d = os.path.join(root, f"d{i // 1000:03d}")
        os.mkdir(d)
        base = d + "/"
    fd = os.open(base + f"f{i:06d}", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"w" * (i % 256))
    os.close(fd)
print(time.perf_counter() - t, time.process_time() - c)
"""

APPEND_WRITER = r"""
import os, sys, time
root, blocks = sys.argv[1], int(sys.argv[2])
fds = [os.open(os.path.join(root, f"big{k}"), os.O_WRONLY | os.O_APPEND) for k in range(4)]
block = os.urandom(4096)
t, c = time.perf_counter(), time.process_time()
for i in range(blocks):
    os.write(fds[i % 4], block)
for fd in fds:
    os.close(fd)
print(time.perf_counter() - t, time.process_time() - c)
"""


def run_writer(code: str, *args: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the writer itself: user + system, which is where the
    kernel's work for each event is charged)."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args], check=True, capture_output=True, text=True
    )
    wall, cpu = out.stdout.split()
    return float(wall), float(cpu)


class Inotifywait:
    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [
                "inotifywait",
                "-m",
                "-r",
                "-e",
                "create,modify,close_write,moved_to,delete",
                str(root),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.proc.stderr is not None and self.proc.stdout is not None
        while b"Watches established" not in self.proc.stderr.readline():
            if self.proc.poll() is not None:
                raise RuntimeError("inotifywait failed to start")
        self.lines = 0
        self._t = threading.Thread(target=self._consume, daemon=True)
        self._t.start()

    def _consume(self) -> None:
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            self.lines += 1

    def stop(self) -> dict:
        time.sleep(0.5)
        self.proc.terminate()
        self.proc.wait()
        self._t.join(5)
        return {"events": self.lines}


class Capalarm:
    """``capalarm run`` with one fs source on ``root`` (bench/fs_watcher_cpu.py's way)."""

    def __init__(self, root: Path, work: Path, mode: str) -> None:
        self.service = Service(root, work, mode, settle="0.5s")
        try:
            self.service.wait_scanned()
        except BaseException:
            self.service.stop()
            raise

    def stop(self, expect: dict) -> dict:
        """Waits until /metrics shows what was written (at most 300 s), then stops it."""
        s = self.service
        t = time.perf_counter()
        try:
            try:
                s.wait_handled(expect["bytes"], expect["events"])
                handled = True
            except RuntimeError as exc:
                print(f"  capalarm {exc}", file=sys.stderr)
                handled = False
            lag = time.perf_counter() - t
            text = scrape(s.port) or ""
            nbytes, events = s.totals()
            info = re.search(r'capalarm_source_info\{[^}]*source="fs"[^}]*\}', text)
            mode = re.search(r'mode="([^"]*)"', info.group(0)) if info else None
        finally:
            s.stop()
        return {
            "bytes": int(nbytes),
            "events": int(events),
            "handled": handled,
            "lag": lag,
            "mode": mode.group(1) if mode else "?",
        }


def service_path() -> str:
    """The ``capalarm`` the service runs as (first on ``PATH``, as fs_watcher_cpu.py starts
    it) and where its interpreter imports ``alarm`` from."""
    exe = shutil.which("capalarm")
    if exe is None:
        sys.exit("no capalarm on PATH (pip install the package)")
    with open(exe, "rb") as fh:
        first = fh.readline().decode(errors="replace").strip()
    if not first.startswith("#!") or "python" not in first:
        return f"{exe} (a wrapper, not a Python script: where it imports alarm from is not known)"
    python = first[2:].split()[0]
    probe = "import alarm; print(alarm.__file__)"
    where = subprocess.run(
        [python, "-c", probe], cwd="/", capture_output=True, text=True, check=True
    ).stdout.strip()
    return f"{exe} run (alarm from {Path(where).parent})"


def one_run(base: Path, workload: str, condition: str, n_files: int, blocks: int) -> dict:
    root = base / "w"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    if workload == "append":
        for k in range(4):
            (root / f"big{k}").write_bytes(b"")
    watcher = None
    if condition == "inotifywait":
        watcher = Inotifywait(root)
    elif condition.startswith("capalarm"):
        watcher = Capalarm(root, base, condition.split("-")[1])
    if workload == "files":
        seconds, cpu = run_writer(FILES_WRITER, str(root), str(n_files))
        # Every file and every new directory (1,000 files each) is an event.
        dirs = (n_files + 999) // 1000
        expect = {"bytes": sum(i % 256 for i in range(n_files)), "events": n_files + dirs}
    else:
        seconds, cpu = run_writer(APPEND_WRITER, str(root), str(blocks))
        expect = {"bytes": blocks * 4096, "events": None}
    if isinstance(watcher, Capalarm):
        report = watcher.stop(expect)
    else:
        report = watcher.stop() if watcher is not None else {}
    shutil.rmtree(root)
    return {"seconds": seconds, "cpu": cpu, "expect": expect, **report}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--blocks", type=int, default=65_536, help="4 KiB appends (65536 = 256 MiB)")
    ap.add_argument("--disk", action="store_true", help="the local disk under /tmp, not tmpfs")
    args = ap.parse_args()
    base = Path("/tmp/capalarm-bench-tax")
    base.mkdir(exist_ok=True)
    mounted = False
    if not args.disk and not os.path.ismount(base):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2g", "bench-tax", str(base)], check=True
        )
        mounted = True
    # capalarm-inotify is what mode: auto takes on a local file system.
    conditions = ["alone", "inotifywait", "capalarm-inotify", "capalarm-fanotify"]
    service = service_path()
    exact = True
    try:
        print(f"on {'the local disk' if args.disk else 'tmpfs'}, {args.runs} runs each, medians")
        print(f"capalarm conditions: {service}, one type: fs source, mode inotify / fanotify")
        print(
            "workload | condition | writer wall s | vs alone | writer CPU s | vs alone | "
            "events in /metrics | bytes in /metrics | /metrics exact s after writer"
        )
        for workload in ("files", "append"):
            # Round-robin: background load that drifts during the run hits every condition.
            results: dict[str, list[dict]] = {c: [] for c in conditions}
            for _ in range(args.runs):
                for condition in conditions:
                    results[condition].append(
                        one_run(base, workload, condition, args.files, args.blocks)
                    )
            alone = statistics.median(r["seconds"] for r in results["alone"])
            alone_cpu = statistics.median(r["cpu"] for r in results["alone"])
            for condition in conditions:
                runs = results[condition]
                med = statistics.median(r["seconds"] for r in runs)
                cpu = statistics.median(r["cpu"] for r in runs)
                files = bytes_ = lag = "-"
                if condition.startswith("capalarm"):
                    e = runs[0]["expect"]
                    bytes_ = (
                        "100%"
                        if all(r["bytes"] == e["bytes"] for r in runs)
                        else f"{min(r['bytes'] for r in runs)}/{e['bytes']}"
                    )
                    if e["events"] is None:
                        files = f"{statistics.median(r['events'] for r in runs):.0f} events"
                    else:
                        files = (
                            "100%"
                            if all(r["events"] == e["events"] for r in runs)
                            else f"{min(r['events'] for r in runs)}/{e['events']}"
                        )
                    modes = sorted({r["mode"] for r in runs})
                    files += f" (mode {','.join(modes)})"
                    lag = f"{statistics.median(r['lag'] for r in runs):.2f}"
                    exact &= all(r["handled"] for r in runs)
                elif condition == "inotifywait":
                    files = f"({statistics.median(r['events'] for r in runs):.0f} event lines)"
                print(
                    f"{workload} | {condition} | {med:.3f} | {med / alone:.2f}x | {cpu:.3f} | "
                    f"{cpu / alone_cpu:.2f}x | {files} | {bytes_} | {lag}",
                    flush=True,
                )
        print(f"every capalarm run counted exactly what was written: {'yes' if exact else 'NO'}")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(base)], check=False)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
