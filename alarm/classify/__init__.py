"""Classifiers, one per surface kind: each maps a batch's subjects to the kind's declared
surfaces (first match wins; -1 is the kind's ``unclassified``).  Selected by kind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from alarm.classify.egress import EgressClassifier, EgressMatch
from alarm.classify.fs import FsClassifier, FsMatch
from alarm.classify.registry import RegistryClassifier, RegistryMatch


class Classifier(Protocol):
    kind: str
    surfaces: list[str]  # declared surfaces of the kind, in rule order

    def classify(self, subjects: Any, source: str) -> np.ndarray: ...


# kind -> (match model, classifier)
CLASSIFIERS: Mapping[str, tuple[type, Any]] = MappingProxyType(
    {
        "egress": (EgressMatch, EgressClassifier),
        "fs": (FsMatch, FsClassifier),
        "registry": (RegistryMatch, RegistryClassifier),
    }
)


def build_classifier(kind: str, names: Sequence[str], matches: Sequence[Any]) -> Classifier:
    return CLASSIFIERS[kind][1](names, matches)
