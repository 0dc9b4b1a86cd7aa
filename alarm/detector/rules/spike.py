"""Spike rule: a tick, or the rate over five or thirty minutes, far above what the surface
writes, each against its own seasonal level with a threshold calibrated for
``spike.false_alarms_per_week`` (docs/detector.md, "Spike rule").

One numeric definition: the native tick (``do_rules``/``do_learn`` of _whole_tick.c with
``_fused.c``'s loops); the rule's settings and state are spike.py (``SpikeModel``), its levels
seasonal.py and its tails tail.py.  This module is what the rule is in the registry: its
severity, which of its pages fold, and what its alert says.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from alarm.detector.rules.base import CoreFigures, CoreRule
from alarm.detector.views import SurfaceFigures


class Spike(CoreRule):
    name: ClassVar[str] = "spike"
    # A spike may still be a busy build: a warning, where a budget overrun is critical.
    SEVERITY: ClassVar[str] = "warning"

    def describe_alert(
        self,
        row: int,
        core: CoreFigures,
        f: SurfaceFigures,
        figures: dict[str, Any],
        seasonal_binds: bool,
    ) -> tuple[float, float, str]:
        figures |= core.spike_figures_of(row)
        rate, baseline = f.rate, f.baseline
        threshold = core.spike_threshold_of(row)
        ratio = f"x{rate / baseline:,.1f}" if baseline > 0 else "from nothing"
        against = f"threshold {threshold:,.0f} B/s"
        absolute = core.spike_absolute_of(row)
        if absolute < threshold:
            # Still learning its own threshold (or the floor is the lower one): the
            # configured absolute floor is what the rate passed.
            threshold = absolute
            against = f"absolute floor {absolute:,.0f} B/s"
            if not f.baseline_ready:
                against += ", its own threshold still being learned"
        elif not math.isfinite(threshold):
            threshold = 0.0
            against = "its own threshold still being learned"
        what = (
            f"wrote {rate:,.0f} B/s against a baseline of {baseline:,.0f} B/s ({ratio}; {against})"
        )
        if row >= core.members:
            what = core.members_figures(row - core.members, figures) or what
        return rate, threshold, what
