"""Rules registered by name, each one module with its state, its judgement and its words.

``RULES`` is every surface rule, looked up by the alert's ``rule``: the core rules (spike,
budget; ``NATIVE_CORE``, judged by the native tick, engine.py), then the rules the detector
runs after it.  What lists rules elsewhere (severities, the snapshot's states, the pages, the
precedent fold) reads their class attributes here.  They share the ledger (ledger.py): weeks of
what every row carried, which the core rules' day-to-fortnight memories do not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from alarm.detector.rules.base import Rule, RuleRows, TickInput
from alarm.detector.rules.beacon import BeaconRule
from alarm.detector.rules.budget import Budget
from alarm.detector.rules.dormant import DormantRule
from alarm.detector.rules.drift import DriftRule
from alarm.detector.rules.drop import DropRule
from alarm.detector.rules.duty import DutyRule
from alarm.detector.rules.members import MembersRule
from alarm.detector.rules.newsurface import NewSurfaceRule
from alarm.detector.rules.spike import Spike

RULES: Mapping[str, type[Rule]] = MappingProxyType(
    {
        r.name: r
        for r in (
            Spike,
            Budget,
            DropRule,
            BeaconRule,
            DutyRule,
            DriftRule,
            DormantRule,
            NewSurfaceRule,
            MembersRule,
        )
    }
)


def default_severity(rule: str) -> str | None:
    """A surface rule's own severity (None: not a surface rule)."""
    registered = RULES.get(rule)
    return registered.SEVERITY if registered is not None else None


def rules_that(attribute: str) -> frozenset[str]:
    """The rules whose class sets ``attribute`` (a flag of rules/base.py's Rule)."""
    return frozenset(name for name, r in RULES.items() if getattr(r, attribute))


def rules_folded(reason: str) -> frozenset[str]:
    """The rules whose new pages rules/precedent.py folds for ``reason`` (Rule.FOLDS)."""
    return frozenset(name for name, r in RULES.items() if reason in r.FOLDS)


__all__ = [
    "RULES",
    "Rule",
    "RuleRows",
    "TickInput",
    "default_severity",
    "rules_folded",
    "rules_that",
]
