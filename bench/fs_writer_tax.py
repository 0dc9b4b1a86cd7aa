"""Writer tax: how much slower a writer runs while its tree is watched, side by side in one run.

Two writers: one creating 100k small files (0-255 bytes, in 100 new directories), one appending
4 KiB blocks to 4 large files (256 MiB in all).  Each runs alone, under ``inotifywait -m -r``
(Debian inotify-tools; its events consumed by a reader), and under the capalarm fs collector
(inotify mode and fanotify mode, each in its own process as in the service).  Medians of
``--runs`` runs; for capalarm also whether it accounted for 100% of the files and bytes
(inotifywait sees events, not bytes) and how long after the writer finished it had.

    python bench/fs_writer_tax.py              # on a private tmpfs (needs root)
    python bench/fs_writer_tax.py --runs 3 --disk

The writer and each watcher are separate processes on this machine's cores; the figure is the
writer's own wall time, measured inside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

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

WATCHER = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[3])
from tests.test_fs_kit import collector, quiesce, running, settings
root, mode = sys.argv[1], sys.argv[2]

class Totals:
    # What the pipeline does with a batch, vectorised: sums (no per-event Python work).
    files = bytes = 0
    async def __call__(self, batch):
        self.files += batch.counts.get("files_created", 0)
        if batch.events is not None:
            self.bytes += int(batch.events.nbytes.sum())

async def main():
    rec = Totals()
    c = collector(settings([root], mode=mode, settle=0.5, receipts={"sha256_max_files": 0}))
    async with running(c, rec):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        t = time.perf_counter()
        await quiesce(c, timeout=600)
        lag = time.perf_counter() - t - 0.3  # quiesce's own wait for stability
        print(json.dumps({"files": rec.files, "bytes": rec.bytes, "lag": max(lag, 0.0),
                          "mode": c.health.mode}), flush=True)

asyncio.run(main())
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
    def __init__(self, root: Path, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WATCHER, str(root), mode, str(REPO)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"capalarm watcher failed to start: {line!r}")

    def stop(self) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        report = json.loads(self.proc.stdout.readline())
        self.proc.kill()
        self.proc.wait()
        return report


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
        watcher = Capalarm(root, condition.split("-")[1])
    if workload == "files":
        seconds, cpu = run_writer(FILES_WRITER, str(root), str(n_files))
        expect = {"files": n_files, "bytes": sum(i % 256 for i in range(n_files))}
    else:
        seconds, cpu = run_writer(APPEND_WRITER, str(root), str(blocks))
        expect = {"files": 0, "bytes": blocks * 4096}
    report = watcher.stop() if watcher is not None else {}
    shutil.rmtree(root)
    return {"seconds": seconds, "cpu": cpu, "expect": expect, **report}


def main() -> None:
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
    try:
        print(f"on {'the local disk' if args.disk else 'tmpfs'}, {args.runs} runs each, medians")
        print(
            "workload | condition | writer wall s | vs alone | writer CPU s | vs alone | "
            "accounted files | accounted bytes | counted s after writer"
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
                    files = (
                        "100%"
                        if all(r["files"] == r["expect"]["files"] for r in runs)
                        else f"{min(r['files'] for r in runs)}/{e['files']}"
                    )
                    bytes_ = (
                        "100%"
                        if all(r["bytes"] == r["expect"]["bytes"] for r in runs)
                        else f"{min(r['bytes'] for r in runs)}/{e['bytes']}"
                    )
                    lag = f"{statistics.median(r['lag'] for r in runs):.2f}"
                elif condition == "inotifywait":
                    files = f"({statistics.median(r['events'] for r in runs):.0f} event lines)"
                print(
                    f"{workload} | {condition} | {med:.3f} | {med / alone:.2f}x | {cpu:.3f} | "
                    f"{cpu / alone_cpu:.2f}x | {files} | {bytes_} | {lag}",
                    flush=True,
                )
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(base)], check=False)


if __name__ == "__main__":
    main()
