"""``capalarm --version`` says what a bug report needs (version, revision, Python, which
native paths this install has) and ``--help`` shows defaults."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from alarm import __version__, buildinfo

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "alarm.cli"]


def capalarm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_version_names_revision_python_and_native_paths() -> None:
    res = capalarm("--version")
    assert res.returncode == 0 and not res.stderr
    out = res.stdout
    assert out.startswith(f"capalarm {__version__}\n")
    assert f"python:   {platform.python_version()}" in out
    for native in ("event-line reader", "kernel scanner", "detector natives", "metrics writer"):
        assert f"    {native} (" in out, out
    if shutil.which("git") and (ROOT / ".git").exists():
        described = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--tags"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert f"revision: {described}" in out, out


def test_native_paths_say_built_or_not_as_the_modules_are() -> None:
    from alarm.detector import fused

    paths = {what: state for what, _, state in buildinfo.native_paths()}
    assert paths["detector natives"].startswith("built") == (fused.built is not None)
    assert set(paths) == {
        "event-line reader",
        "kernel scanner",
        "detector natives",
        "metrics writer",
        "state chunk hash",
    }


def test_without_a_checkout_the_revision_is_said_to_be_unknown(tmp_path: Path) -> None:
    assert buildinfo.revision(tmp_path).startswith("unknown (")


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("git"), reason="needs git")
def test_a_build_records_the_revision_in_the_package(tmp_path: Path) -> None:
    """An installed wheel has no .git to ask: setup.py's build_py writes git describe into
    the package, where --version reads it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "alarm", src / "alarm", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    shutil.copytree(
        ROOT / "exporters", src / "exporters", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    for folder in ("deploy", "dashboards"):  # the deployment files a build must carry
        shutil.copytree(ROOT / folder, src / folder)
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "setup.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = tmp_path / "dist"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    [wheel] = out.glob("capalarm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        recorded = zf.read(f"alarm/{buildinfo.REVISION_FILE}").decode().strip()
    assert recorded.startswith(head)  # "-dirty": the rest of the copy is not committed


def test_help_shows_defaults() -> None:
    demo = capalarm("demo", "--help").stdout
    assert "seconds to run (default: 60.0)" in " ".join(demo.split())
    top = " ".join(capalarm("--help").stdout.split())
    assert "(default: info)" in top and "(default: plain)" in top
    run = " ".join(capalarm("run", "--help").stdout.split())
    assert "(default: None)" not in run  # nothing shown where there is nothing to show
    assert "embedded default" in run
