"""What a surface kind is: one ``Kind``, declared by one module in alarm/kinds/ (the kind's
name is the module's).  Everything that differs by kind reads it from the registry,
``alarm.kinds.KINDS``: the config's ``kind:`` union and per-kind keys, the classifier the
pipeline runs, the default budgets, and where the Helm chart runs the kind's sources.

A leaf module (the kinds import it; it imports no kind), so a kind module never imports the
package that discovers it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel


class Classifier(Protocol):
    """What a kind's classifier does (alarm/classify/): map a batch's subjects to the kind's
    declared surfaces, first match wins, -1 for the kind's ``unclassified``."""

    kind: str
    surfaces: list[str]  # declared surfaces of the kind, in rule order

    def classify(self, subjects: Any, source: str) -> np.ndarray: ...


# A kind is a label value and a config key: short and plain.  ``source`` and ``service`` are
# the other values a notification route's ``kinds`` filter takes; ``unclassified`` and
# ``named`` are surface and event names of their own.
KIND_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
RESERVED = frozenset({"source", "service", "unclassified", "named"})
# Where the chart runs a kind's sources: one per node (the node's kernel log, its
# directories) or one for the cluster (pollers of services).
Workload = Literal["daemonset", "deployment"]


def horizons(
    allowance: float, tolerance: float, hour: tuple[float, float], day: tuple[float, float]
) -> Mapping[str, Any]:
    """A default budget of three horizons, a token-bucket envelope (docs/detector.md): over
    a minute a surface may burst (``allowance`` bit/s, ``tolerance`` bits); over an hour and
    a day, (allowance, tolerance) pairs that average far less."""
    return MappingProxyType(
        {
            "allowance_bits_per_second": allowance,
            "tolerance_bits": tolerance,
            "horizon": "1m",
            "horizons": (
                {"horizon": "1h", "allowance_bits_per_second": hour[0], "tolerance_bits": hour[1]},
                {"horizon": "1d", "allowance_bits_per_second": day[0], "tolerance_bits": day[1]},
            ),
        }
    )


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of surface.

    - ``match``: the model of a surface's ``match:`` (a Strict pydantic model whose fields
      all have defaults: a surface without ``match`` matches nothing of its own).
    - ``classifier``: ``classifier(surface names, their matches)``, an object with
      ``classify(subjects, source) -> surface index per subject (-1: unclassified)``
      (alarm/classify/__init__.py, ``Classifier``).
    - ``budget``: the capacity budget of a declared surface that states none (a BudgetRule's
      fields; ``horizons`` above).
    - ``newsurface``: (allowance bit/s, tolerance bits) a new surface starts from under rule
      ``newsurface`` when it states none.
    - ``workload``: where the Helm chart runs the sources that feed the kind.
    - ``summary``: what the kind's surfaces are, for messages and docs.
    - ``classifier_counters``: counters the classifier keeps (``name``: an int attribute
      of it, and its help text); what each source's batches add to one is that source's
      counter ``classifier_<name>``, exported as ``capalarm_source_classifier_<name>_total``."""

    name: str
    match: type[BaseModel]
    classifier: Callable[[Sequence[str], Sequence[Any]], Classifier]
    budget: Mapping[str, Any]
    newsurface: tuple[float, float]
    workload: Workload
    summary: str
    classifier_counters: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not KIND_NAME.match(self.name) or self.name in RESERVED:
            raise ValueError(
                f"kind {self.name!r}: a kind is named [a-z][a-z0-9_]* (at most 32) and is not "
                f"one of {sorted(RESERVED)}"
            )
        if self.workload not in ("daemonset", "deployment"):
            raise ValueError(f"kind {self.name!r}: workload must be daemonset or deployment")
        try:
            self.match()
        except Exception as exc:
            raise ValueError(f"kind {self.name!r}: its match model needs no fields: {exc}") from exc

    @property
    def model_name(self) -> str:
        """The config model's name for the kind's surfaces: ``fs`` -> ``FsSurface``."""
        return "".join(part.capitalize() for part in self.name.split("_")) + "Surface"
