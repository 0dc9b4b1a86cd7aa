"""Registries, boards and wikis: map an upload or edit to exactly one declared registry surface
(first match wins) by the source that saw it and the repository (package, image, namespace)
it went to; what matches none is the registry `unclassified` surface.

Subjects are ``(repository, artifact)`` pairs; ``repository`` patterns are globs or trees
(patterns.py), so ``@sandbox/*`` takes every package of the scope."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from alarm.events import KeyedSubjects
from alarm.patterns import Pattern
from alarm.settings import Strict


class RegistryMatch(Strict):
    source: list[str] = []  # registry sources by name
    repository: list[str] = []  # package, image repository or page namespace patterns


class RegistryClassifier:
    kind = "registry"

    def __init__(self, names: Sequence[str], matches: Sequence[RegistryMatch]):
        self.surfaces = list(names)
        self._rules = [
            (i, frozenset(m.source), tuple(Pattern.compile(r) for r in m.repository))
            for i, m in enumerate(matches)
        ]

    def classify_key(self, repository: str, source: str = "") -> int:
        for i, sources, repos in self._rules:
            if sources and source not in sources:
                continue
            if not repos or any(p.matches(repository) for p in repos):
                return i
        return -1

    def classify(self, subjects: KeyedSubjects, source: str) -> np.ndarray:
        return np.array(
            [self.classify_key(str(key[0]), source) for key in subjects.keys], dtype=np.int64
        )
