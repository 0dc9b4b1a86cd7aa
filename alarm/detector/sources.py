"""The source rules: a source that lost records, read forged ones, stopped reading, or cannot
see what it watches.  One alert machine per (source, rule), judged once a tick from what each
source did (``SourceJudgement``), saved with the detector's state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from alarm.detector.alerts import AlertChange, AlertMachine, AlertState, state_name

# Source rules fire on any occurrence in a tick: a lost fence record is a blind spot and a
# forged one is someone trying to hide or fake traffic.  They resolve after a quiet minute.
SOURCE_RESOLVE_HOLD = 60.0
# A source that has not been up yet since the service started is not down before this: its
# reader may take a few seconds to open (a cold start, a first import), and that is no page.
# Counted from when the service first judged it, on the wall clock: a restart after a
# downtime evaluates the ticks it missed (up to max_backlog) in a second or two, and counted
# in their times the grace was over before the reader had opened (a source_down page at
# every restart after more than a few seconds down).
SOURCE_START_GRACE = 10.0
SOURCE_RULES = ("records_lost", "forged_records", "source_down", "surface_blind")
REMOVED = "removed from the configuration"


@dataclass(slots=True, frozen=True)
class SourceJudgement:
    """What one source did in one tick, for the source rules."""

    name: str
    up: bool
    last_error: str
    lost: int  # records known lost this tick
    lost_unknown: int  # gaps of unknown size this tick
    forged: int
    lost_total: int
    forged_total: int
    blind: str = ""  # why the source cannot see ("" while it sees)


class SourceRules:
    """Every source's alert machines, by (source, rule)."""

    def __init__(self) -> None:
        self.alerts: dict[tuple[str, str], AlertMachine] = {}
        # Per source: when it was first judged, while it has not been up yet (see
        # SOURCE_START_GRACE); -inf once it has.
        self._starting: dict[str, float] = {}

    def evaluate(
        self,
        now: float,
        tick: float,
        judged: Sequence[SourceJudgement],
        wall: float | None = None,
    ) -> list[AlertChange]:
        """The source rules at the tick ending ``now``; ``wall``: the wall clock, when the
        ticks are live (not a backtest): a source's start grace runs from it."""
        changes = []
        for j in judged:
            starting = self._starting.setdefault(j.name, now if wall is None else wall)
            if j.up:
                self._starting[j.name] = -math.inf
                if not (j.lost or j.lost_unknown or j.forged or j.blind) and self._at_rest(j.name):
                    continue  # up, seeing, nothing lost or forged, no alert: nothing to step
            down = not j.up and now - starting >= SOURCE_START_GRACE
            values = {
                "records_lost": j.lost + j.lost_unknown,
                "forged_records": j.forged,
                "source_down": 1 if down else 0,
                "surface_blind": 1 if j.blind else 0,
            }
            for rule, value in values.items():
                machine = self.alerts.get((j.name, rule))
                if machine is None:
                    machine = _machine(j.name, rule)
                    self.alerts[(j.name, rule)] = machine
                level = 0.5 if rule in ("source_down", "surface_blind") else 0.0
                change = machine.step(now, tick, float(value), level)
                if change:
                    changes.append(_change(j, rule, change, machine, now))
        return changes

    def quiet(self, source: str) -> bool:
        """Whether judging ``source`` while it is up, sees and lost or forged nothing can
        change nothing: it has been up, and every alert of its rules is at rest."""
        return self._starting.get(source) == -math.inf and self._at_rest(source)

    def _at_rest(self, source: str) -> bool:
        """Whether every source rule of ``source`` has its machine, and each is inactive."""
        machines = self.alerts
        return all(
            (m := machines.get((source, rule))) is not None and m.state == AlertState.INACTIVE
            for rule in SOURCE_RULES
        )

    def resolve_removed(self, live: set[str], now: float) -> list[AlertChange]:
        """Sources no longer declared: their firing alerts resolve, and they are forgotten."""
        changes = []
        for (name, rule), machine in list(self.alerts.items()):
            if name in live:
                continue
            del self.alerts[(name, rule)]
            if machine.state == AlertState.FIRING:
                changes.append(
                    AlertChange(
                        fingerprint=machine.fingerprint,
                        target_type="source",
                        target=name,
                        kind="source",
                        rule=rule,
                        state="resolved",
                        previous="firing",
                        at=now,
                        started_at=machine.started_at,
                        value=0.0,
                        threshold=0.0,
                        figures={"removed": True},
                        summary=f"source {name} was {REMOVED} — resolved",
                    )
                )
        return changes

    def firing(self) -> list[tuple[str, str, str]]:
        """(target, rule, fingerprint) of every firing source alert."""
        return [
            (m.target, m.rule, m.fingerprint)
            for m in self.alerts.values()
            if m.state == AlertState.FIRING
        ]

    def to_state(self) -> dict[str, Any]:
        return {f"{n}/{r}": m.to_state() for (n, r), m in self.alerts.items()}

    def load(self, saved: Any) -> None:
        """Source alerts as saved: one that was firing resolves after a quiet minute, so the
        destinations that were told it fired are told it resolved (a restart must not leave
        a page open forever)."""
        if not isinstance(saved, dict):
            return
        for key, state in saved.items():
            name, _, rule = str(key).rpartition("/")
            if rule not in SOURCE_RULES or not name or not isinstance(state, dict):
                continue
            machine = _machine(name, rule)
            try:
                machine.load_state(state)
            except (TypeError, ValueError):
                continue
            self.alerts[(name, rule)] = machine


def _change(
    j: SourceJudgement,
    rule: str,
    change: tuple[AlertState, AlertState],
    machine: AlertMachine,
    now: float,
) -> AlertChange:
    prev, new = change
    if rule == "records_lost":
        if j.lost_unknown and not j.lost:
            what = "lost an unknown number of records (a gap it cannot measure): a blind spot"
        else:
            unknown = " and a gap of unknown size" if j.lost_unknown else ""
            what = f"lost {j.lost} records this tick{unknown} ({j.lost_total} in all): a blind spot"
        value = j.lost + j.lost_unknown
    elif rule == "forged_records":
        what = (
            f"rejected {j.forged} forged records ({j.forged_total} in all): someone wrote "
            "look-alike fence lines"
        )
        value = j.forged
    elif rule == "surface_blind":
        what = f"cannot see what it watches: {j.blind or 'blind'}"
        value = 1 if j.blind else 0
    else:
        what = f"is not reading: {j.last_error or 'down'}"
        value = 0 if j.up else 1
    return AlertChange(
        fingerprint=machine.fingerprint,
        target_type="source",
        target=j.name,
        kind="source",
        rule=rule,
        state=state_name(new),
        previous=state_name(prev),
        at=now,
        started_at=machine.started_at,
        value=float(value),
        threshold=0.0,
        figures={
            "records_lost_total": j.lost_total,
            "forged_records_total": j.forged_total,
            **({"gap_unknown": True} if j.lost_unknown else {}),
        },
        summary=f"source {j.name} {what}",
    )


def _machine(name: str, rule: str) -> AlertMachine:
    return AlertMachine(f"source/{name}", rule, 0.0, SOURCE_RESOLVE_HOLD, 1.0)


__all__ = [
    "REMOVED",
    "SOURCE_RESOLVE_HOLD",
    "SOURCE_RULES",
    "SOURCE_START_GRACE",
    "SourceJudgement",
    "SourceRules",
]
