"""Scoring any detector on a fleet: alarms are the ticks at which an alarm *starts*.

- false alarms: alarm starts on benign time (benign surfaces, attacked surfaces before the
  onset), per surface-week of benign time;
- per attack: detected when an alarm starts at or after the onset and before the attack ends
  (plus an hour's grace); latency from the onset to the end of the alarming tick; bits leaked
  before the alarm = payload bits sent from the onset up to and including that tick (a missed
  attack leaked all of its bits).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.detection.scenarios import DAY_TICKS, TICK, Fleet

GRACE = 60  # ticks


@dataclass(slots=True)
class Outcome:
    pattern: str
    host: str
    detected: bool
    latency_s: float  # inf when missed
    leaked_bits: float
    total_bits: float


def starts(mask: np.ndarray) -> np.ndarray:
    """Ticks where an alarm starts (the mask rises)."""
    m = mask.astype(bool)
    prev = np.concatenate([[False], m[:-1]])
    return np.flatnonzero(m & ~prev)


def score(
    fleet: Fleet, alarms: dict[str, np.ndarray], group_alarms: np.ndarray | None = None
) -> tuple[int, float, list[Outcome]]:
    """``alarms``: per trace name, alarm start ticks.  ``group_alarms``: start ticks of the
    fleet-level (aggregate) alarm, which counts for every attack in the fleet and as a false
    alarm outside attacks.  Returns (false alarms, surface-weeks, outcomes)."""
    fa = 0
    weeks = 0.0
    outcomes: list[Outcome] = []
    onset_all = [t.attack.onset for t in fleet.traces if t.attack]
    end_all = [t.attack.end for t in fleet.traces if t.attack]
    for t in fleet.traces:
        a = np.asarray(alarms.get(t.name, np.zeros(0, dtype=np.int64)))
        if t.attack is None:
            fa += int(a.size)
            weeks += fleet.ticks / (7 * DAY_TICKS)
            continue
        att = t.attack
        fa += int((a < att.onset).sum())
        weeks += att.onset / (7 * DAY_TICKS)
        candidates = a[(a >= att.onset) & (a < att.end + GRACE)]
        if group_alarms is not None:
            g = group_alarms[(group_alarms >= att.onset) & (group_alarms < att.end + GRACE)]
            candidates = np.concatenate([candidates, g])
        total = float(att.bits.sum())
        host = t.archetype
        if candidates.size:
            first = int(candidates.min())
            outcomes.append(
                Outcome(
                    att.pattern,
                    host,
                    True,
                    (first - att.onset + 1) * TICK,
                    float(att.bits[att.onset : first + 1].sum()),
                    total,
                )
            )
        else:
            outcomes.append(Outcome(att.pattern, host, False, float("inf"), total, total))
    if group_alarms is not None:
        g = np.asarray(group_alarms)
        if onset_all:
            lo, hi = min(onset_all), max(end_all) + GRACE
            fa += int(((g < lo) | (g >= hi)).sum())
            weeks += (fleet.ticks - (hi - lo)) / (7 * DAY_TICKS)
        else:
            fa += int(g.size)
            weeks += fleet.ticks / (7 * DAY_TICKS)
    return fa, weeks, outcomes
