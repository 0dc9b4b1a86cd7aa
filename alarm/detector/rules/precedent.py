"""Precedent: a page of a short-memory rule is folded when the surface has done it before.

The spike rule keeps two weeks of peaks, the derived budgets forget over two weeks and the
duty rule remembers seven days, and each learns an anomaly only so far per page, so that an
attacker cannot teach them.  Over the months an operator runs capalarm that made every weekly
backup page every week, every fortnightly job every fortnight, and every sandbox's sessions
page after a lighter week.  Those are recurrences, and a recurrence is learnt from its
occurrences: a rule that fires is asked whether the surface has carried as much before, on
every scale at once, within the ledger's weeks (ledger.py).  If it has, the firing is folded:
the alert goes back to rest and nobody is paged.

Two kinds of precedent, either enough:

- **the same hour of the week**: the last hour's bits within ``CLOCK_MARGIN`` x the largest hour at
  this hour of the week (or the hour after, or the two before) in the previous weeks, and the last ten
  minutes within it too; the last day's bits and writes and the run of written ticks within
  ``CLOCK_MARGIN`` x the largest of the previous weeks, the tick's bits within ``TICK_MARGIN``.  One earlier
  occurrence is enough: a job that recurs on the clock; while there has been only one (a
  weekly job's second run, a fortnightly job's), ``FIRST_REPEAT_MARGIN`` instead of
  ``CLOCK_MARGIN``: a single run says nothing of how much the runs vary.
- **any time, in two weeks**: the last tick, ten minutes, hour and day, in bits, writes and
  written ticks, and the run, each within ``MARGIN`` x the *second* largest weekly maximum of
  the previous weeks.  The surface did as much in two different weeks before this one: one
  attack, however long, is at most one week, and the week under way is never precedent.  The tick is a scale of its own: a one-minute burst at 40x carries less in ten
  minutes than a cache's ten-minute warm-up at 20x, but no tick of the warm-up was as big.

The run of written ticks without a pause is a scale too (the duty rule's run statistic): a
weekly job that writes every tick for half an hour has done so before.

A surface's life is counted from its first write, not from when it was declared.  One that
first wrote a day or more after it was first watched (declared before it was put to use) is
young until it has lived the new-surface rule's learning (two days): the rules that learn what
is normal for it (spike, derived budget, duty, drift) learnt only its silence, however many
weeks of it, and their pages are folded; the new-surface rule's default for its kind, the
dormant rule and a declared budget judge it then.  One that wrote from its first day is
judged by those rules' own learning periods, which began with it.

What is never folded: a declared budget (the operator's own limit), the beacon rule (its
evidence is regularity, not volume), the drift rule (it has its own weeks) and the new-surface
rule (no history to be precedent).  An attacker hiding inside a scheduled window adds to it:
``CLOCK_MARGIN`` (1.4) is below the smallest addition worth hiding (half the job again); on a
job's second run, the first repeat, an addition under ``FIRST_REPEAT_MARGIN`` (2x) is folded
with it.
"""

from __future__ import annotations

import numpy as np

from alarm.detector.rules import rules_folded
from alarm.detector.rules.ledger import DAY, HORIZONS, HOUR, Ledger
from alarm.detector.rules.newsurface import LEARNING

MARGIN = 1.3  # any time, against the second largest weekly maximum
# On the clock with two earlier occurrences or more: a job's runs vary (the long fleet's jobs
# by a lognormal of sigma 0.13-0.15), and at 1.3 three of 430 later runs on the choice seeds
# (1-5, 16-20) went past the largest earlier one by 1.31-1.40x and paged; at 1.4 none did, and
# the scheduled_hide attacks (half the job again or more) were caught as at 1.3 (19/20).
CLOCK_MARGIN = 1.4
# On the clock with one earlier occurrence only: how much a job's runs vary is not known yet,
# and its second run carried 1.3-1.8x its first on the long fleet's choice seeds (a job whose
# data grows).  From two earlier occurrences on, CLOCK_MARGIN.
FIRST_REPEAT_MARGIN = 2.0
# An earlier week whose largest hour is at least this share of the slot's precedent is one
# occurrence of it.
OCCURRENCE = 0.5
# A scheduled run's largest tick varies more from run to run than its hour does (how its bytes
# fall across its ticks): on the clock, a tick may be twice the largest of earlier weeks, i.e.
# TICK_MARGIN / CLOCK_MARGIN times what its hour may.  On a first repeat the hour's margin is
# FIRST_REPEAT_MARGIN and the tick's grows with it (2.86x): a fortnightly job's second run of
# six lumps carried 1.2x its first in bytes and 2.03x in its largest tick, and paged (the long
# fleet's choice seeds 21-30).
TICK_MARGIN = 2.0
JOIN_WINDOW = 3600.0  # a surface's incident stays open this long after its last breach
MAX_INCIDENT = 6 * 3600.0
# Which rules' pages fold, and when: each rule's FOLDS (rules/base.py).
FOLDED_RULES = rules_folded("precedent")
LATE = 86400.0  # a first write this long after the row was first watched: a late start
YOUNG_FOLDED = rules_folded("young")
ON_THE_CLOCK_ONLY = rules_folded("clock_only")  # a write after silence: only a scheduled one
TICK = len(HORIZONS)  # the ledger's index of the single tick


class Precedent:
    def __init__(self, ledger: Ledger, derived: np.ndarray):
        self.ledger = ledger
        self.derived = derived

    def foldable(self, rule: str, row: int) -> bool:
        return rule in FOLDED_RULES and (rule != "budget" or bool(self.derived[row]))

    def young(self, rule: str, row: int, start: float) -> bool:
        """Whether ``rule``'s page on ``row`` comes before the row has lived LEARNING."""
        if rule not in YOUNG_FOLDED or (rule == "budget" and not self.derived[row]):
            return False
        ledger = self.ledger
        life = start - float(ledger.born_at[row])
        return life < LEARNING and ledger.late(np.array([row]), start, LATE).size > 0

    def recurs(self, rule: str, row: int, start: float) -> bool:
        """Whether what ``row`` carries now has a precedent (see the module docstring)."""
        ledger = self.ledger
        rows = np.array([row])
        now = ledger.current(rows)[:, :, 0]  # (horizon, quantity)
        top, second = (a[:, :, 0] for a in ledger.weekly(rows))
        slot = float(ledger.hour_of_week(start, rows)[0])
        occurrences = int((ledger.weekly_hours(rows)[:, 0] >= OCCURRENCE * slot).sum())
        margin = CLOCK_MARGIN if occurrences >= 2 else FIRST_REPEAT_MARGIN
        tick_margin = TICK_MARGIN * margin / CLOCK_MARGIN
        on_the_clock = (
            slot > 0.0
            and now[TICK, 0] <= tick_margin * top[TICK, 0]
            and now[TICK, 2] <= margin * top[TICK, 2]
            and now[HOUR, 0] <= margin * slot
            and now[0, 0] <= margin * slot
            and bool((now[DAY, :2] <= margin * top[DAY, :2]).all())
        )
        if on_the_clock or rule in ON_THE_CLOCK_ONLY:
            return on_the_clock
        return bool((now <= MARGIN * second).all()) and second[DAY, 0] > 0.0


class Incidents:
    """One incident on a surface is one page.  A surface's incident opens with a page and
    stays open while its rules keep breaching, until a quiet ``JOIN_WINDOW``; a page of
    another rule on the surface meanwhile joins it, for as long as that rule keeps breaching.
    A rule that first breaches more than ``MAX_INCIDENT`` into an incident pages (an attack
    that starts while a surface's budget drains a big job for a day is not hidden behind it).
    A weekly job's first run fires spike, budget, duty and drift over its half hour and its
    day budget drains for a day: one page, not four."""

    STATE = ("opened_at", "open_until", "joined", "paged")

    def __init__(self, n: int, rules: list[str]):
        self.bit = {rule: np.uint32(1 << i) for i, rule in enumerate(rules)}
        self.opened_at = np.full(n, -np.inf)
        self.open_until = np.full(n, -np.inf)
        self.joined = np.zeros(n, dtype=np.uint32)  # the rules of the open incident
        self.paged = np.zeros(n, dtype=np.uint32)  # those of them that paged

    def joins(self, rule: str, row: int, now: float) -> bool:
        """Whether a page of ``rule`` on ``row`` now is part of its open incident (which it
        then keeps open).  A rule that paged in this incident pages again as itself (its
        alert resolved and fired again: the notification router's reopen window makes that
        one page, updated)."""
        if now > self.open_until[row]:
            return False
        bit = self.bit[rule]
        if self.paged[row] & bit:
            self.open_until[row] = now + JOIN_WINDOW
            return False
        if not self.joined[row] & bit:
            if now - self.opened_at[row] > MAX_INCIDENT:
                return False
            self.joined[row] |= bit
        self.open_until[row] = now + JOIN_WINDOW
        return True

    def opened(self, rule: str, row: int, now: float) -> None:
        """``rule`` paged on ``row``: the incident opens, or goes on."""
        if now > self.open_until[row]:
            self.opened_at[row] = now
            self.joined[row] = 0
            self.paged[row] = 0
        self.joined[row] |= self.bit[rule]
        self.paged[row] |= self.bit[rule]
        self.open_until[row] = now + JOIN_WINDOW
