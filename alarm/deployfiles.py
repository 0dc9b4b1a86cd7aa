"""The deployment files the package carries: the example config, the systemd unit, the nftables
fence, the Prometheus rules (with their promtool unit tests) and the Grafana dashboards.

A built package (wheel, or an install from the sdist) has them as package data under
``alarm/deploy_files/``, at the paths they have in the repository (setup.py copies them)::

    importlib.resources.files("alarm") / "deploy_files" / "deploy/systemd/capalarm.service"

A checkout (an editable install, or ``python -m alarm.cli`` in the tree) reads them where they
are: ``deploy/`` and ``dashboards/`` beside the package.  ``capalarm deploy-files DIR`` writes
them out under DIR, at the same paths."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

PACKAGE_DIR = "deploy_files"
# The folders of the repository the package carries (setup.py's SHIPPED says which files).
FOLDERS = ("deploy", "dashboards")


class DeployFilesError(Exception):
    """The files cannot be found or written; the message is one line."""


def root() -> Traversable:
    """Where the files are: the built package's data, else the checkout around the package."""
    packaged = resources.files("alarm").joinpath(PACKAGE_DIR)
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent
    if all((checkout / folder).is_dir() for folder in FOLDERS):
        return checkout
    raise DeployFilesError(
        f"this installation carries no deployment files (no alarm/{PACKAGE_DIR}/ and no "
        "checkout around the package): reinstall capalarm from a wheel or an sdist"
    )


def _walk(node: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.name == "__pycache__" or child.name.startswith("."):
            continue
        path = f"{prefix}/{child.name}"
        if child.is_dir():
            yield from _walk(child, path)
        elif child.is_file():
            yield path, child


def listing() -> dict[str, Traversable]:
    """Relative path (``deploy/systemd/capalarm.service``) -> the file, in path order.  In a
    checkout, only what a build would ship (the dashboards folder's *.json and *.yml)."""
    base = root()
    out: dict[str, Traversable] = {}
    for folder in FOLDERS:
        node = base.joinpath(folder)
        if node.is_dir():
            out.update(_walk(node, folder))
    return {
        rel: f
        for rel, f in sorted(out.items())
        if not rel.startswith("dashboards/") or rel.endswith((".json", ".yml"))
    }


def write(dest: Path, force: bool = False) -> list[tuple[Path, str]]:
    """Write every file under ``dest`` at its relative path.  Returns (path, what happened:
    "wrote" | "unchanged").  A file already there with other contents is left alone, and
    nothing is written, unless ``force``: an operator's edited config is not overwritten
    silently."""
    files = listing()
    if not files:
        raise DeployFilesError("no deployment files found in this installation")
    plan: list[tuple[Path, bytes, bool]] = []
    differ: list[str] = []
    for rel, src in files.items():
        out = dest / rel
        data = src.read_bytes()
        try:
            same = out.read_bytes() == data
        except FileNotFoundError:
            same = False
        except IsADirectoryError:
            raise DeployFilesError(f"{out} is a directory") from None
        except OSError as exc:
            raise DeployFilesError(f"cannot read {out}: {exc.strerror or exc}") from None
        else:
            if not same:
                differ.append(str(out))
        plan.append((out, data, same))
    if differ and not force:
        more = f" and {len(differ) - 1} more files" if len(differ) > 1 else ""
        verb = "exist" if more else "exists"
        raise DeployFilesError(
            f"{differ[0]}{more} already {verb} with other contents; nothing written "
            "(--force overwrites)"
        )
    done: list[tuple[Path, str]] = []
    for out, data, same in plan:
        if same:
            done.append((out, "unchanged"))
            continue
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        except OSError as exc:
            raise DeployFilesError(f"cannot write {out}: {exc.strerror or exc}") from None
        done.append((out, "wrote"))
    return done
