"""File systems: map a written path to exactly one declared fs surface (first match wins);
a path under a watched tree that matches none is the fs `unclassified` surface.

``path`` patterns are trees or globs (patterns.py).  A batch of new files holds many files of
few directories, so the surface is decided once per directory where the directory decides it:
a file ``D/name`` is under a tree pattern ``T`` whenever ``D`` is (``D == T`` or below it), and
under no tree that is neither ``D/name`` itself (then ``T``'s parent is ``D``) nor above ``D``;
a glob's regex (``body`` then any ``/...``) matches ``D/name`` whenever it matches ``D``.  Where
the name may still decide (a tree or glob that ``D`` does not match but ``D/name`` might), the
path is classified whole, as before.  Paths are workload-controlled and can be sprayed: both
caches are bounded dicts (cleared when full, so a miss only costs a re-classification)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from pydantic import field_validator

from alarm.events import KeyedSubjects
from alarm.patterns import Pattern
from alarm.settings import Strict

CACHE_SIZE = 65536
BY_NAME = -2  # a directory whose files' surface depends on their names


class FsMatch(Strict):
    """``path``: trees or globs, any of which may match; ``source``: names of fs sources."""

    path: list[str] = []
    source: list[str] = []

    @field_validator("path")
    @classmethod
    def _absolute(cls, values: list[str]) -> list[str]:
        for v in values:
            if not str(v).startswith("/"):
                raise ValueError(f"{v!r} is not an absolute path or glob")
        return [os.path.normpath(v) if "**" not in v else v for v in values]


class FsClassifier:
    kind = "fs"

    def __init__(self, names: Sequence[str], matches: Sequence[FsMatch]):
        self.surfaces = list(names)
        self._rules = [
            (i, tuple(Pattern.compile(p) for p in m.path), frozenset(m.source))
            for i, m in enumerate(matches)
        ]
        self._cache: dict[tuple[str, str], int] = {}
        self._dirs: dict[tuple[str, str], int] = {}

    def classify_dir(self, directory: str, source: str = "") -> int:
        """The surface of every file directly in ``directory`` (its path without the
        trailing ``/``; "" for ``/``), or BY_NAME when a file's name may decide it."""
        for i, patterns, sources in self._rules:
            if sources and source not in sources:
                continue
            if not patterns:
                return i
            by_name = False
            for p in patterns:
                if p.regex is not None:
                    if p.regex.fullmatch(directory) is not None:
                        return i
                    by_name = True
                    continue
                tree = p.tree
                if tree == "/" or directory == tree or directory.startswith(f"{tree}/"):
                    return i
                if tree is not None and tree.rpartition("/")[0] == directory:
                    by_name = True  # the tree is a file in it
            if by_name:
                return BY_NAME
        return -1

    def classify_key(self, path: str, source: str = "") -> int:
        for i, patterns, sources in self._rules:
            if sources and source not in sources:
                continue
            if not patterns or any(p.matches(path) for p in patterns):
                return i
        return -1

    def classify(self, subjects: KeyedSubjects, source: str) -> np.ndarray:
        cache = self._cache
        dirs = self._dirs
        out = np.empty(len(subjects.keys), dtype=np.int64)
        for j, path in enumerate(subjects.keys):
            directory, sep, _ = path.rpartition("/")
            i = BY_NAME
            if sep and directory[:1] in "/":  # an absolute path: its directory decides
                dkey = (source, directory)
                known = dirs.get(dkey)
                if known is None:
                    known = self.classify_dir(directory, source)
                    if len(dirs) >= CACHE_SIZE:
                        dirs.clear()
                    dirs[dkey] = known
                i = known
            if i == BY_NAME:
                key = (source, path)
                i = cache.get(key)
                if i is None:
                    i = self.classify_key(path, source)
                    if len(cache) >= CACHE_SIZE:
                        cache.clear()
                    cache[key] = i
            out[j] = i
        return out
