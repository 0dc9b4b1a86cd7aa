"""Which rows the detector evaluates, and with which rules.

One row per surface the table declares, then one *aggregate* row per kind with at least
``min_members`` surfaces: the sum over every surface of that kind, named ``(all)`` — a name no
declared surface can take (names cannot hold parentheses), so it never collides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from alarm.config import (
    DEFAULT_META_BITS_PER_EVENT,
    UNCLASSIFIED,
    AggregateRule,
    BudgetRule,
    SpikeRule,
    SurfaceSettings,
)
from alarm.surfaces import SurfaceKey

if TYPE_CHECKING:  # the assembled model: importing it imports every source type's settings
    from alarm.config import Config

AGGREGATE = "(all)"


@dataclass(slots=True)
class RowPlan:
    keys: list[SurfaceKey]  # members first, then aggregates
    members: int  # rows [0, members) are table surfaces
    spike: list[SpikeRule]
    budget: list[BudgetRule]
    # Budgets derived from what the row carries (no budget declared); ``budget`` then holds
    # what protects the row while it is new.
    derived: list[bool]
    # The least a derived budget may allow: the row's kind's unclassified budget.
    floors: list[BudgetRule]
    meta_bits: np.ndarray
    # For aggregate row members + j: the member rows it sums (as an index array).
    aggregate_of: list[np.ndarray]
    # For aggregate row members + j: whether its spike rule has the members statistic.
    members_statistic: list[bool]
    # Per row, what was configured for it: the surface's settings (None for an unclassified
    # row), then each aggregate's rule.  The registered rules read their sections of it.
    settings: list[SurfaceSettings | AggregateRule | None]

    @property
    def targets(self) -> list[str]:
        return [f"{k}/{n}" for k, n in self.keys]


def plan_rows(config: Config, keys: list[SurfaceKey]) -> RowPlan:
    by_name = {(s.kind, s.name): s for s in config.surfaces}
    spike: list[SpikeRule] = []
    budget: list[BudgetRule] = []
    derived: list[bool] = []
    floors: list[BudgetRule] = []
    meta: list[float] = []
    settings: list[SurfaceSettings | AggregateRule | None] = []
    for key in keys:
        declared = by_name.get(key)
        settings.append(declared)
        floors.append(config.unclassified_budget(key[0]))
        if declared is not None:
            spike.append(declared.spike)
            budget.append(declared.effective_budget())
            derived.append(declared.budget is None)
            meta.append(declared.meta_bits_per_event)
        else:
            assert key[1] == UNCLASSIFIED, key
            spike.append(config.unclassified_spike)
            budget.append(config.unclassified_budget(key[0]))
            derived.append(False)  # default deny: what nobody declared gets the tightest
            meta.append(DEFAULT_META_BITS_PER_EVENT)

    rows = list(keys)
    aggregate_of: list[np.ndarray] = []
    members_statistic: list[bool] = []
    for kind in sorted({k for k, _ in keys}):
        rule = config.aggregates.get(kind) or AggregateRule()  # type: ignore[call-overload]
        members = np.array([i for i, k in enumerate(keys) if k[0] == kind], dtype=np.int64)
        if not rule.enabled or members.size < rule.min_members:
            continue
        rows.append((kind, AGGREGATE))
        aggregate_of.append(members)
        members_statistic.append(rule.members)
        settings.append(rule)
        spike.append(rule.spike)
        budget.append(rule.budget or derived_budget(rule, [budget[i] for i in members]))
        # Learned from what the aggregate carries where its members' are; where members have
        # budgets of their own, the share of their sum is the policy.
        declared = [i for i in members if keys[i][1] != UNCLASSIFIED]
        derived.append(rule.budget is None and all(derived[i] for i in declared))
        floors.append(config.unclassified_budget(kind))
        meta.append(0.0)  # members' bits already include their metadata allowance
    return RowPlan(
        rows,
        len(keys),
        spike,
        budget,
        derived,
        floors,
        np.array(meta),
        aggregate_of,
        members_statistic,
        settings,
    )


def derived_budget(rule: AggregateRule, members: list[BudgetRule]) -> BudgetRule:
    """``share`` x the members' summed allowance per horizon; the largest member tolerance.
    Horizons are matched by name; a member without a horizon counts with its base."""
    live = [m for m in members if m.enabled]
    if not live:
        return BudgetRule(enabled=False, allowance_bits_per_second=1.0, tolerance_bits=1.0)
    names: list[str] = []
    for m in live:
        for name in (m.horizon, *(h.horizon for h in m.horizons)):
            if name not in names:
                names.append(name)

    def of(m: BudgetRule, name: str) -> tuple[float, float]:
        for h in m.horizons:
            if h.horizon == name:
                return h.allowance_bits_per_second, h.tolerance_bits
        return m.allowance_bits_per_second, m.tolerance_bits

    figures = []
    for name in names:
        pairs = [of(m, name) for m in live]
        figures.append((name, rule.share * sum(k for k, _ in pairs), max(h for _, h in pairs)))
    (base, k0, h0), *rest = figures
    return BudgetRule(
        allowance_bits_per_second=k0,
        tolerance_bits=h0,
        horizon=base,
        horizons=[
            {"horizon": n, "allowance_bits_per_second": k, "tolerance_bits": h}  # type: ignore[misc]
            for n, k, h in rest
        ],
        resolve_hold=max(m.resolve_hold for m in live),
    )


def as_slice(members: np.ndarray) -> slice | np.ndarray:
    """Sorted member rows as a slice where they are one contiguous run, else as they are."""
    rows = np.sort(members.astype(np.int64))
    if rows.size and rows[-1] - rows[0] + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def members_in_order(aggregate_of: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every aggregate's member rows, one aggregate after the other, and the bounds of each
    (aggregate ``j``'s are ``order[bounds[j]:bounds[j + 1]]``): how the native tick sums the
    aggregates and the members rule counts their members, in one gather each."""
    order = [np.asarray(m, dtype=np.int64) for m in aggregate_of]
    bounds = np.cumsum([0] + [len(m) for m in order]).astype(np.int64)
    return (np.concatenate(order) if order else np.zeros(0, np.int64)), bounds
