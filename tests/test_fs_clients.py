"""Real clients writing into watched caches, no network beyond loopback: ``pip download`` from a
local wheel directory, ``pip install --cache-dir`` from a PyPI-like index served on 127.0.0.1,
``npm cache add`` of a local tarball.  What the collector counts per surface (through the real
fs classifier) equals an independent accounting: the artifacts' own sizes and digests and the
sizes of the files the clients left."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import http.server
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from alarm.classify.fs import FsClassifier, FsMatch
from alarm.events import WriteEvents
from tests.test_fs_kit import (
    CI,
    MODES,
    Recorder,
    collector,
    make_space,
    mount_tmpfs,
    quiesce,
    running,
    settings,
    tree_bytes,
)

space = pytest.fixture(params=MODES)(make_space)


def make_wheel(out: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A minimal valid wheel (PEP 427): a module, METADATA, WHEEL and RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n" + os.urandom(3000).hex().encode() + b"\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: capalarm-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def pip_env() -> dict[str, str]:
    """pip with no configuration of this machine (no extra indexes, no find-links)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "-q", "--isolated", *args],
        check=True,
        env=pip_env(),
        stdout=subprocess.DEVNULL,
    )


class CachingIndex(http.server.SimpleHTTPRequestHandler):
    """A simple-index directory served as PyPI serves files: immutable, cacheable."""

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "max-age=365000000, immutable, public")
        super().end_headers()

    def log_message(self, *args: object) -> None:
        pass


def surface_bytes(rec: Recorder, surfaces: dict[str, list[str]]) -> Counter[str]:
    """Bytes per surface, classified by the real fs classifier (first match wins)."""
    names = list(surfaces)
    clf = FsClassifier(names, [FsMatch(path=p) for p in surfaces.values()])
    ev = WriteEvents.of("fs", rec.events)
    rows = clf.classify(ev.subjects, "fs-test")  # type: ignore[arg-type]
    out: Counter[str] = Counter()
    for j in range(len(ev)):
        i = int(rows[int(ev.subject[j])])
        out[names[i] if i >= 0 else "unclassified"] += int(ev.nbytes[j])
    return out


async def test_pip_download_and_install_into_watched_caches(space, tmp_path: Path) -> None:
    mode, tree, _ = space
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = make_wheel(wheels)
    wheel_bytes = wheel.read_bytes()
    index = tmp_path / "simple"
    (index / "tinypkg").mkdir(parents=True)
    shutil.copy(wheel, index / "tinypkg")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(CachingIndex, directory=str(index))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.3), rec)
    try:
        async with running(c, rec):
            pip(
                "download",
                "--no-index",
                "--find-links",
                str(wheels),
                "-d",
                str(tree / "dl"),
                "tinypkg",
            )
            pip(
                "install",
                "--cache-dir",
                str(tree / "pip"),
                "--index-url",
                url,
                "--trusted-host",
                "127.0.0.1",
                "--target",
                str(tmp_path / "site"),
                "tinypkg",
            )
            await quiesce(c)
    finally:
        server.shutdown()
    per_surface = surface_bytes(
        rec,
        {
            "wheels": [f"{tree}/dl/**/*.whl"],
            "pip-bodies": [f"{tree}/pip/http-v2/**/*.body"],
            "pip-cache": [f"{tree}/pip"],
        },
    )
    bodies = [p for p in (tree / "pip").rglob("*.body")]
    assert per_surface["wheels"] == len(wheel_bytes)
    assert per_surface["pip-bodies"] == sum(p.stat().st_size for p in bodies)
    assert per_surface["wheels"] + per_surface["pip-bodies"] + per_surface[
        "pip-cache"
    ] == tree_bytes(str(tree))
    assert per_surface["unclassified"] == 0
    # The cached wheel body is the wheel, byte for byte: its receipt says so.
    digest = hashlib.sha256(wheel_bytes).hexdigest()
    receipts = {e.key: e.evidence.get("sha256") for e in rec.events if e.nbytes}
    assert receipts[str(tree / "dl" / wheel.name)] == digest
    assert digest in {receipts[str(p)] for p in bodies}


def make_npm_tarball(out: Path) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {
            "package/package.json": b'{"name": "tinynpm", "version": "1.0.0"}\n',
            "package/index.js": b"module.exports = " + os.urandom(2000).hex().encode() + b";\n",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = out / "tinynpm-1.0.0.tgz"
    path.write_bytes(buf.getvalue())
    return path


async def test_npm_cache_add_into_a_watched_cache(space, tmp_path: Path) -> None:
    mode, tree, _ = space
    if shutil.which("npm") is None:
        if CI:
            pytest.fail("npm is part of the CI image (Debian npm)")
        pytest.skip("npm not installed")
    tarball = make_npm_tarball(tmp_path)
    cache = tree / "npm"
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.3), rec)
    async with running(c, rec):
        subprocess.run(
            [
                "npm",
                "cache",
                "add",
                str(tarball),
                "--cache",
                str(cache),
                "--offline",
                "--loglevel=warn",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "npm_config_update_notifier": "false"},
        )
        await quiesce(c)
    content = cache / "_cacache" / "content-v2"
    index = cache / "_cacache" / "index-v5"
    per_surface = surface_bytes(
        rec, {"npm-content": [str(content)], "npm-index": [str(index)], "npm": [str(cache)]}
    )
    # cacache stores the tarball itself, under its sha512 (written to tmp/, then moved).
    assert per_surface["npm-content"] == tarball.stat().st_size == tree_bytes(str(content))
    assert per_surface["npm-index"] == tree_bytes(str(index))
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert digest in {e.evidence.get("sha256") for e in rec.events if e.evidence}
    # npm's unpacked temporaries were written and removed: each counted once (as measured,
    # or flagged deleted before measured), never more than was written.
    assert per_surface["npm"] >= tree_bytes(str(cache)) - tree_bytes(str(content)) - tree_bytes(
        str(index)
    )


def npm_pack(out: Path, name: str) -> Path:
    """A package made by ``npm pack`` itself (a source directory with ~27 kB of JS)."""
    src = out / "src" / name
    src.mkdir(parents=True)
    (src / "package.json").write_text(f'{{"name": "{name}", "version": "1.0.0"}}\n')
    (src / "index.js").write_text("module.exports = '" + os.urandom(13_000).hex() + "';\n")
    subprocess.run(
        ["npm", "pack", "--pack-destination", str(out), "--silent"],
        cwd=src,
        check=True,
        stdout=subprocess.DEVNULL,
        env=npm_env(out / "pack-cache"),
    )
    return out / f"{name}-1.0.0.tgz"


def npm_env(cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "npm_config_cache": str(cache),
        "npm_config_update_notifier": "false",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
    }


@pytest.mark.parametrize("settle", [0.5, 3.0])
@pytest.mark.parametrize("mode", MODES)
async def test_npm_install_into_a_watched_cache_counts_every_byte_once(
    tmp_path: Path, request: pytest.FixtureRequest, mode: str, settle: float
) -> None:
    # npm's cacache writes each artifact as _cacache/tmp/<uuid> and renames it into a
    # directory it has just made (content-v2/sha512/ab/cd/, index-v5/ab/cd/), which nobody
    # watches yet when the rename happens: each file's bytes must count once, whatever names
    # it had, with the default settle and with one longer than the whole install.
    if shutil.which("npm") is None:
        if CI:
            pytest.fail("npm is part of the CI image (Debian npm)")
        pytest.skip("npm not installed")
    # A tmpfs of its own: no other writer, and no inode number given to two files in turn
    # (ext4 reuses them at once), so that device:inode names one file for the whole test.
    base = tmp_path / "mnt"
    mount_tmpfs(base, request, size="256m")
    tree = base / "tree"
    tree.mkdir()
    tarballs = [npm_pack(tmp_path, name) for name in ("tiny-a", "tiny-b", "tiny-c")]
    project = tmp_path / "proj"
    project.mkdir()
    (project / "package.json").write_text('{"name": "proj", "version": "1.0.0"}\n')
    cache = tree / "npm"
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=settle), rec)
    async with running(c, rec):
        await asyncio.to_thread(
            subprocess.run,
            ["npm", "install", "--offline", "--loglevel=warn", *map(str, tarballs)],
            cwd=project,
            check=True,
            stdout=subprocess.DEVNULL,
            env=npm_env(cache),
        )
        await quiesce(c)
    assert (project / "node_modules" / "tiny-c" / "index.js").exists()
    # Per file (device:inode), whatever names it had: the files npm left (content-v2,
    # index-v5, its log) count their size, those it wrote and removed (what it unpacked, the
    # copies of an artifact it already had) at most their size: every byte once.
    per_inode: Counter[str] = Counter()
    largest: Counter[str] = Counter()
    for e in rec.events:
        if e.nbytes:
            per_inode[e.evidence["dev_ino"]] += e.nbytes
            largest[e.evidence["dev_ino"]] = max(largest[e.evidence["dev_ino"]], e.evidence["size"])
    left = {}
    for d, _, files in os.walk(cache):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            left[f"{st.st_dev}:{st.st_ino}"] = st.st_size
    for ident, n in left.items():
        assert per_inode[ident] == n, ident
    for ident, n in per_inode.items():
        assert n <= largest[ident], ident
    content = cache / "_cacache" / "content-v2"
    assert tree_bytes(str(content)) == sum(t.stat().st_size for t in tarballs)
