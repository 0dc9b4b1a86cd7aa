"""Rules registered by name, each one module with its state, its judgement and its words.

``RULES`` is every rule the detector runs after the core tick (spike, budget and the
aggregates' members statistic: engine.py), looked up by the alert's ``rule``.  They share the ledger (ledger.py): weeks of
what every row carried, which the core rules' day-to-fortnight memories do not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from alarm.detector.rules.base import Rule, RuleRows, TickInput
from alarm.detector.rules.beacon import BeaconRule
from alarm.detector.rules.dormant import DormantRule
from alarm.detector.rules.drift import DriftRule
from alarm.detector.rules.drop import DropRule
from alarm.detector.rules.duty import DutyRule
from alarm.detector.rules.members import MembersRule
from alarm.detector.rules.newsurface import NewSurfaceRule

RULES: Mapping[str, type[Rule]] = MappingProxyType(
    {
        r.name: r
        for r in (
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

__all__ = ["RULES", "Rule", "RuleRows", "TickInput"]
