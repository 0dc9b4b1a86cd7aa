"""File systems: map a written path to exactly one declared fs surface (first match wins);
a path under a watched tree that matches none is the fs `unclassified` surface.

``path`` patterns are trees or globs (patterns.py).  Paths are workload-controlled and can be
sprayed: classification is cached per path in a bounded dict (cleared when full, so a miss only
costs a re-classification)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from pydantic import field_validator

from alarm.events import KeyedSubjects
from alarm.patterns import Pattern
from alarm.settings import Strict

CACHE_SIZE = 65536


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

    def classify_key(self, path: str, source: str = "") -> int:
        for i, patterns, sources in self._rules:
            if sources and source not in sources:
                continue
            if not patterns or any(p.matches(path) for p in patterns):
                return i
        return -1

    def classify(self, subjects: KeyedSubjects, source: str) -> np.ndarray:
        cache = self._cache
        out = np.empty(len(subjects.keys), dtype=np.int64)
        for j, path in enumerate(subjects.keys):
            key = (source, path)
            i = cache.get(key)
            if i is None:
                i = self.classify_key(path, source)
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[key] = i
            out[j] = i
        return out
