"""Precedent: a page of a short-memory rule is folded when the surface has done it before.

The spike rule keeps two weeks of peaks, the derived budgets forget over two weeks and the
duty rule remembers seven days, and each learns an anomaly only so far per page, so that an
attacker cannot teach them.  Over the months an operator runs capalarm that made every weekly
backup page every week, every fortnightly job every fortnight, and every sandbox's sessions
page after a lighter week.  Those are recurrences, and a recurrence is learnt from its
occurrences: a rule that fires is asked whether the surface has carried as much before, on
every scale at once, within the ledger's weeks (ledger.py).  If it has, the firing is folded:
the alert goes back to rest, nobody is paged, and the fold is counted.

Two kinds of precedent, either enough:

- **the same hour of the week**: the last hour's bits within ``MARGIN`` x the largest hour at
  this hour of the week (or the hours either side) in the previous weeks, and the last ten
  minutes within it too; the last day's bits and writes, the tick's bits and the run of
  written ticks within ``MARGIN`` x the largest of the previous weeks.  One earlier
  occurrence is enough: a job that recurs on the clock.
- **any time, in two weeks**: the last tick, ten minutes, hour and day, in bits, writes and
  written ticks, and the run, each within ``MARGIN`` x the *second* largest weekly maximum of
  the previous weeks.  The surface did as much in two different weeks before this one: one
  attack, however long, is at most one week, and the week under way is never precedent.  The tick is a scale of its own: a one-minute burst at 40x carries less in ten
  minutes than a cache's ten-minute warm-up at 20x, but no tick of the warm-up was as big.

The run of written ticks without a pause is a scale too (the duty rule's run statistic): a
weekly job that writes every tick for half an hour has done so before.

What is never folded: a declared budget (the operator's own limit), the beacon rule (its
evidence is regularity, not volume), the drift rule (it has its own weeks) and the new-surface
rule (no history to be precedent).  An attacker hiding inside a scheduled window adds to it:
``MARGIN`` (1.3) is below the smallest addition worth hiding (half the job again).
"""

from __future__ import annotations

import numpy as np

from alarm.detector.rules.ledger import DAY, HORIZONS, HOUR, Ledger

MARGIN = 1.3
FOLDED_RULES = frozenset({"spike", "budget", "duty", "dormant"})
ON_THE_CLOCK_ONLY = frozenset({"dormant"})  # a write after silence: only a scheduled one
TICK = len(HORIZONS)  # the ledger's index of the single tick


class Precedent:
    def __init__(self, ledger: Ledger, derived: np.ndarray):
        self.ledger = ledger
        self.derived = derived
        self.folded = np.zeros(len(derived), dtype=np.int64)  # firings folded, per row

    def foldable(self, rule: str, row: int) -> bool:
        return rule in FOLDED_RULES and (rule != "budget" or bool(self.derived[row]))

    def recurs(self, rule: str, row: int, start: float) -> bool:
        """Whether what ``row`` carries now has a precedent (see the module docstring)."""
        ledger = self.ledger
        rows = np.array([row])
        now = ledger.current(rows)[:, :, 0]  # (horizon, quantity)
        top, second = (a[:, :, 0] for a in ledger.weekly(rows))
        slot = float(ledger.hour_of_week(start, rows)[0])
        on_the_clock = (
            slot > 0.0
            and now[TICK, 0] <= MARGIN * top[TICK, 0]
            and now[TICK, 2] <= MARGIN * top[TICK, 2]
            and now[HOUR, 0] <= MARGIN * slot
            and now[0, 0] <= MARGIN * slot
            and bool((now[DAY, :2] <= MARGIN * top[DAY, :2]).all())
        )
        if on_the_clock or rule in ON_THE_CLOCK_ONLY:
            return on_the_clock
        return bool((now <= MARGIN * second).all()) and second[DAY, 0] > 0.0
