"""What ``capalarm --version`` says: the version, the source revision where it is known, the
Python running it, and which native paths this install has.

The natives are optional (setup.py builds them where a compiler is, and the pure-Python paths
give the same results slower), so two installs of one version can differ by a factor of ten
in speed: a bug report needs to say which it ran."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import platform
import subprocess
from importlib import resources
from pathlib import Path

from alarm import __version__

# Written into the built package by setup.py (from ``git describe``), for installs made from
# a checkout; an editable install or a run from the checkout asks git instead.
REVISION_FILE = "_revision.txt"
# git describe on a checkout answers at once; a hung filesystem must not hang --version.
GIT_TIMEOUT = 5.0


def git_revision(root: Path) -> str | None:
    """``git describe --always --dirty`` of the checkout at ``root``; None when ``root`` is no
    checkout or git is missing or fails."""
    if not (root / ".git").exists():
        return None
    try:
        res = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--tags"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = res.stdout.strip()
    return rev if res.returncode == 0 and rev else None


def packaged_revision() -> str | None:
    """The revision setup.py wrote into the built package, if it did."""
    try:
        rev = resources.files("alarm").joinpath(REVISION_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return rev or None


def revision(root: Path | None = None) -> str:
    """Where this code came from, or why that is not known."""
    checkout = root if root is not None else Path(__file__).resolve().parents[1]
    rev = git_revision(checkout)
    if rev is not None:
        return f"{rev} (git checkout {checkout})"
    if root is None:
        rev = packaged_revision()
        if rev is not None:
            return f"{rev} (recorded at build time)"
    return "unknown (not run from a git checkout, and no revision recorded at build time)"


def extension_loads(dotted: str) -> bool:
    """Whether the C extension ``dotted`` (``alarm.collectors.kernel._fastscan``) of this
    install loads, as the module that uses it would find.  Loaded from its file, without
    importing the packages above it: ``alarm.collectors`` imports every source type, and
    importing the modules that use the natives made ``--version`` cost ~0.5 s of CPU."""
    parts = dotted.split(".")
    root = Path(__file__).resolve().parent  # the alarm package
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = root.joinpath(*parts[1:-1], parts[-1] + suffix)
        if not path.is_file():
            continue
        spec = importlib.util.spec_from_file_location(dotted, path)
        if spec is None or spec.loader is None:
            return False
        try:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except ImportError:
            return False
        return True
    return False


def native_paths() -> list[tuple[str, str, str]]:
    """(what, its C source, built or why not) for each native path."""
    from alarm.detector import fused
    from exporters import textformat

    def built(ok: bool) -> str:
        return "built" if ok else "not built (pure-Python path, same results, slower)"

    if textformat.native_module is None:
        writer = built(False)
    elif textformat.native_series() is None:
        writer = "built, not used (formats values unlike the installed prometheus_client)"
    else:
        writer = built(True)
    return [
        ("event-line reader", "alarm/_eventscan.c", built(extension_loads("alarm._eventscan"))),
        (
            "kernel scanner",
            "alarm/collectors/kernel/_fastscan.c",
            built(extension_loads("alarm.collectors.kernel._fastscan")),
        ),
        (
            "detector natives",
            "alarm/detector/_fused.c, _whole_tick.c",
            built(fused.built is not None),
        ),
        ("metrics writer", "exporters/_textformat.c", writer),
        ("state chunk hash", "alarm/_chunkhash.c", built(extension_loads("alarm._chunkhash"))),
    ]


def version_text() -> str:
    lines = [
        f"capalarm {__version__}",
        f"  revision: {revision()}",
        f"  python:   {platform.python_version()} ({platform.python_implementation()})",
        "  native paths:",
    ]
    lines += [f"    {what} ({src}): {state}" for what, src, state in native_paths()]
    return "\n".join(lines)
