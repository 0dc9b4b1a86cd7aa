"""Classifiers, one per surface kind: each maps a batch's subjects to the kind's declared
surfaces (first match wins; -1 is the kind's ``unclassified``).  Each kind's module in
alarm/kinds/ names its classifier (``Kind.classifier``); the pipeline builds them from there."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Classifier(Protocol):
    kind: str
    surfaces: list[str]  # declared surfaces of the kind, in rule order

    def classify(self, subjects: Any, source: str) -> np.ndarray: ...
