"""Budget rule: more bits carried above a surface's allowance than its tolerance, on any
horizon (a CUSUM per horizon, declared or derived from what the surface carries), or on the
seasonal budget where it is on (docs/detector.md, "Capacity budgets").

One numeric definition: the native tick (``budgets`` of _whole_tick.c with ``_fused.c``'s
``budget_loop``; the seasonal budget's projection joins it there from relative.py); the
budgets' settings and state are budget.py (``BudgetBank``) and relative.py.  This module is
what the rule is in the registry: its severity, which of its pages fold, and what its alert
says.
"""

from __future__ import annotations

from typing import Any, ClassVar

from alarm.detector.rules.base import CoreFigures, CoreRule
from alarm.detector.views import SurfaceFigures


class Budget(CoreRule):
    name: ClassVar[str] = "budget"
    # A budget overrun is information already leaving.
    SEVERITY: ClassVar[str] = "critical"

    def describe_alert(
        self,
        row: int,
        core: CoreFigures,
        f: SurfaceFigures,
        figures: dict[str, Any],
        seasonal_binds: bool,
    ) -> tuple[float, float, str]:
        if seasonal_binds:
            seasonal = figures["budget_seasonal"]
            value, threshold = seasonal["excess_score"], seasonal["tolerance_score"]
            level = seasonal["seasonal_level_bits_per_second"]
            what = (
                f"carried {seasonal['carried_bits']:,.0f} bits in a sustained run above what "
                f"it usually carries at this hour ({level:,.1f} bit/s; seasonal budget "
                f"{value:,.1f} of {threshold:,.1f})"
            )
            return value, threshold, what
        excess, tol = figures["budget_excess_bits"], figures["budget_tolerance_bits"]
        allow, horizon = figures["budget_allowance_bits_per_second"], figures["budget_horizon"]
        # The budget fires a tick ahead, when the next tick at this rate would pass it.
        ahead = "; on course to pass it next tick" if excess <= tol else ""
        what = (
            f"carried {excess:,.0f} bits above its {horizon} allowance of {allow:,.0f} "
            f"bit/s (tolerance {tol:,.0f} bits{ahead})"
        )
        return excess, tol, what
