"""Detector: evaluates every surface and every source once per closed tick."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from alarm.collectors.base import SourceStats
from alarm.config import UNCLASSIFIED, Config, SpikeRule
from alarm.detector.alerts import AlertChange, AlertMachine, AlertState
from alarm.detector.baseline import RobustBaseline
from alarm.detector.budget import CapacityBudget, capacity_bits
from alarm.surfaces import SurfaceKey, TickTotals

# Source rules fire on any occurrence in a tick: a lost fence record is a blind spot and a
# forged one is someone trying to hide or fake traffic.  They resolve after a quiet minute.
SOURCE_RESOLVE_HOLD = 60.0
SOURCE_RULES = ("records_lost", "forged_records", "source_down")


@dataclass(slots=True)
class SurfaceFigures:
    rate: float = 0.0  # bytes/s over the last tick
    events_rate: float = 0.0
    baseline: float = 0.0
    threshold: float = 0.0
    baseline_ready: bool = False
    capacity_bps: float = 0.0  # Lampson bound, bits/s over the last tick
    budget_excess: float = 0.0
    budget_allowance: float = 0.0
    budget_tolerance: float = 0.0


class SurfaceDetector:
    __slots__ = (
        "baseline",
        "budget",
        "budget_alert",
        "figures",
        "key",
        "meta_bits",
        "spike_alert",
        "spike_rule",
    )

    def __init__(self, key: SurfaceKey, spike: SpikeRule, budget, meta_bits: float, tick: float):
        self.key = key
        target = f"{key[0]}/{key[1]}"
        self.spike_rule = spike
        self.baseline = RobustBaseline(spike, tick)
        self.budget = CapacityBudget(budget)
        self.meta_bits = meta_bits
        self.spike_alert = AlertMachine(
            target, "spike", spike.hold, spike.resolve_hold, spike.hysteresis
        )
        self.budget_alert = AlertMachine(
            target, "budget", 0.0, budget.resolve_hold, budget.hysteresis
        )
        self.figures = SurfaceFigures(
            budget_allowance=budget.allowance_bits_per_second,
            budget_tolerance=budget.tolerance_bits,
        )


Contributors = Callable[[SurfaceKey], list[tuple[str, int]]]


class Detector:
    def __init__(self, config: Config, keys: list[SurfaceKey]):
        self.tick = config.tick
        by_name = {(s.kind, s.name): s for s in config.surfaces}
        self.surfaces: dict[SurfaceKey, SurfaceDetector] = {}
        for key in keys:
            declared = by_name.get(key)
            if declared is not None:
                spike, budget, meta = (
                    declared.spike,
                    declared.effective_budget(),
                    declared.meta_bits_per_event,
                )
            else:
                assert key[1] == UNCLASSIFIED
                spike = config.unclassified_spike
                budget = config.unclassified_budget(key[0])
                meta = 64.0
            self.surfaces[key] = SurfaceDetector(key, spike, budget, meta, config.tick)
        self.source_alerts: dict[tuple[str, str], AlertMachine] = {}
        self._source_seen: dict[str, tuple[int, int]] = {}

    def evaluate(
        self, now: float, tick: float, totals: list[TickTotals], contributors: Contributors
    ) -> list[AlertChange]:
        changes: list[AlertChange] = []
        for t in totals:
            d = self.surfaces.get(t.key)
            if d is None:
                continue
            f = d.figures
            f.rate = t.bytes / tick
            f.events_rate = t.events / tick
            bits = capacity_bits(t.bytes, t.events, d.meta_bits)
            f.capacity_bps = bits / tick
            f.budget_excess = d.budget.update(bits, tick)

            base = d.baseline
            f.baseline_ready = base.ready
            if d.spike_rule.enabled and base.ready:
                threshold = base.threshold()
                f.baseline, f.threshold = base.median, threshold
                change = d.spike_alert.step(now, tick, f.rate, threshold)
                if change:
                    changes.append(
                        self._surface_change(
                            d, "spike", change, now, f.rate, threshold, contributors
                        )
                    )
            base.learn(f.rate)
            if not base.ready or not d.spike_rule.enabled:
                f.baseline, f.threshold = base.median, base.threshold()

            if d.budget.rule.enabled:
                tol = d.budget.rule.tolerance_bits
                change = d.budget_alert.step(now, tick, f.budget_excess, tol)
                if change:
                    changes.append(
                        self._surface_change(
                            d, "budget", change, now, f.budget_excess, tol, contributors
                        )
                    )
        return changes

    def _surface_change(
        self,
        d: SurfaceDetector,
        rule: str,
        change: tuple[AlertState, AlertState],
        now: float,
        value: float,
        threshold: float,
        contributors: Contributors,
    ) -> AlertChange:
        prev, new = change
        machine = d.spike_alert if rule == "spike" else d.budget_alert
        f = d.figures
        figures: dict[str, Any] = {
            "rate_bytes_per_second": f.rate,
            "events_per_second": f.events_rate,
            "baseline_bytes_per_second": f.baseline,
            "threshold_bytes_per_second": f.threshold,
            "capacity_bits_per_second": f.capacity_bps,
            "budget_excess_bits": f.budget_excess,
            "budget_allowance_bits_per_second": f.budget_allowance,
            "budget_tolerance_bits": f.budget_tolerance,
        }
        kind, name = d.key
        if rule == "spike":
            ratio = f.rate / f.baseline if f.baseline > 0 else float("inf")
            what = f"wrote {f.rate:,.0f} B/s against a baseline of {f.baseline:,.0f} B/s (x{ratio:,.1f}; threshold {threshold:,.0f} B/s)"
        else:
            what = (
                f"carried {f.budget_excess:,.0f} bits above its allowance of "
                f"{f.budget_allowance:,.0f} bit/s (tolerance {f.budget_tolerance:,.0f} bits)"
            )
        state = _state_name(new)
        summary = f"{kind} surface {name} {what}" + ("" if state != "resolved" else " — resolved")
        return AlertChange(
            fingerprint=machine.fingerprint,
            target_type="surface",
            target=name,
            kind=kind,
            rule=rule,
            state=state,
            previous=_state_name(prev),
            at=now,
            started_at=machine.started_at,
            value=value,
            threshold=threshold,
            figures=figures,
            contributors=contributors(d.key) if state != "resolved" else [],
            summary=summary,
        )

    def attach_source(self, name: str, stats: SourceStats) -> None:
        """Start judging a source from its current (possibly restored) counts, so what was
        lost or forged before this process started is not alarmed again, and nothing that
        happens after — even before the first tick — goes unalarmed."""
        self._source_seen[name] = (stats.records_lost, stats.forged_records)

    def evaluate_sources(
        self, now: float, tick: float, stats: Mapping[str, SourceStats]
    ) -> list[AlertChange]:
        changes = []
        for name, s in stats.items():
            lost0, forged0 = self._source_seen.get(name, (0, 0))
            self._source_seen[name] = (s.records_lost, s.forged_records)
            values = {
                "records_lost": s.records_lost - lost0,
                "forged_records": s.forged_records - forged0,
                "source_down": 0 if s.up else 1,
            }
            for rule, value in values.items():
                machine = self.source_alerts.get((name, rule))
                if machine is None:
                    machine = AlertMachine(f"source/{name}", rule, 0.0, SOURCE_RESOLVE_HOLD, 1.0)
                    self.source_alerts[(name, rule)] = machine
                change = machine.step(
                    now, tick, float(value), 0.0 if rule != "source_down" else 0.5
                )
                if not change:
                    continue
                prev, new = change
                what = {
                    "records_lost": f"lost {value} records this tick ({s.records_lost} in all): a blind spot",
                    "forged_records": f"rejected {value} forged records ({s.forged_records} in all): someone wrote look-alike fence lines",
                    "source_down": f"is not reading: {s.last_error or 'down'}",
                }[rule]
                changes.append(
                    AlertChange(
                        fingerprint=machine.fingerprint,
                        target_type="source",
                        target=name,
                        kind="source",
                        rule=rule,
                        state=_state_name(new),
                        previous=_state_name(prev),
                        at=now,
                        started_at=machine.started_at,
                        value=float(value),
                        threshold=0.0,
                        figures={
                            "records_lost_total": s.records_lost,
                            "forged_records_total": s.forged_records,
                        },
                        summary=f"source {name} {what}",
                    )
                )
        return changes

    def firing(self) -> list[tuple[str, str, str]]:
        out = []
        for d in self.surfaces.values():
            for m in (d.spike_alert, d.budget_alert):
                if m.state == AlertState.FIRING:
                    out.append((m.target, m.rule, m.fingerprint))
        for m in self.source_alerts.values():
            if m.state == AlertState.FIRING:
                out.append((m.target, m.rule, m.fingerprint))
        return out

    def to_state(self) -> dict:
        return {
            "surfaces": {
                f"{k[0]}/{k[1]}": {
                    "baseline": d.baseline.to_state(),
                    "budget": d.budget.to_state(),
                    "spike_alert": d.spike_alert.to_state(),
                    "budget_alert": d.budget_alert.to_state(),
                }
                for k, d in self.surfaces.items()
            },
            "sources": {f"{n}/{r}": m.to_state() for (n, r), m in self.source_alerts.items()},
        }

    def load_state(self, state: dict) -> None:
        for k, d in self.surfaces.items():
            saved = state.get("surfaces", {}).get(f"{k[0]}/{k[1]}")
            if not saved:
                continue
            d.baseline.load_state(saved.get("baseline", {}))
            d.budget.load_state(saved.get("budget", {}))
            d.spike_alert.load_state(saved.get("spike_alert", {}))
            d.budget_alert.load_state(saved.get("budget_alert", {}))
            d.figures.budget_excess = d.budget.excess


def _state_name(state: AlertState) -> str:
    return state.name.lower()
