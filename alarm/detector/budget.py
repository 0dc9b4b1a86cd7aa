"""Lampson capacity budget: a one-sided CUSUM on the bits a surface could have carried.

Each tick adds the tick's capacity bound (8 x bytes + a metadata allowance per event) and
subtracts what the surface may carry (allowance k x tick length).  The sum never goes below 0,
so quiet time earns no credit beyond zero; when it exceeds the tolerance h, more than h bits
above the allowance have gone through: the largest leak tolerated has been reached.  Active from
the first tick — no learning period excuses an open channel.

Budgets that fit the surface.  A declared surface without a budget of its own (and a kind's
aggregate) gets one *derived from what it carries*, horizon by horizon:

- the allowance is its envelope — the largest mean capacity over a window of the horizon
  (two sets of windows, the second half a window later, so that no boundary splits a job
  shorter than half a window), the current windows included, forgetting over two weeks —
  times ``ENVELOPE_MARGIN``, never below
  the unclassified surface's allowance (the tightest budget there is).  While the surface is
  new (``LEARNING_SECONDS``) the envelope follows the traffic freely; after that it may rise by
  at most ``max_learn_up`` a day, so a drip on a quiet surface outruns it;
- the tolerance, the margin in bits, is ``MARGIN_WINDOWS`` windows at that allowance (never
  below the unclassified tolerance): to fire, a window must carry four times what the
  allowance lets through, five times the most the surface carried in a window of the
  horizon.  A quiet surface, whose envelope is a few stray packets an hour, gets a small one,
  and a drip of 10 bit/s is caught within hours; a busy one a large one;
- while the surface is new, the kind's default budget (what ``rules`` holds) protects it,
  its allowance raised to the envelope (a busy surface is not a leak); after that a horizon
  as short as ``BURST_WINDOW`` is off: bursts are the spike rule's, whose thresholds are
  calibrated, while a minute's envelope cannot know a cache's next warm-up.

One numeric definition: a tick of the budgets is ``budgets`` in alarm/detector/_whole_tick.c
(the windows' means, each cell's mode, then ``budget_loop`` of _fused.c per horizon), run by
the whole native tick; this module holds the budgets' settings, state and figures.

A declared budget that fires on a surface's ordinary traffic for more than
``MISCONFIGURED_SECONDS`` is reported as misconfigured (``misconfigured``) and from then on
judges what comes on top of that traffic, as a derived one does, instead of holding one page
open forever.
"""

from __future__ import annotations

import math

import numpy as np

from alarm.config import BudgetRule
from alarm.settings import parse_duration

ENVELOPE_MARGIN = 1.25  # a derived allowance is this much above the envelope
# A derived tolerance is this many windows at the allowance: to fire, a window must carry four
# times the allowance, five times the most the surface carried in one (a cache's warm-up
# carries a few times an ordinary hour).
MARGIN_WINDOWS = 3.0
BURST_WINDOW = 60.0  # derived budgets have no horizon this short (bursts are spikes)
ENVELOPE_MEMORY = 14 * 86400.0  # the envelope forgets with this time constant
LEARNING_SECONDS = 86400.0
SETTLED_WINDOW = 86400.0  # windows this long are read over at least half a window
MISCONFIGURED_SECONDS = 86400.0
WINDOW_MAX = 7 * 86400.0


def horizon_window(name: str, allowance: float, tolerance: float) -> float:
    """A horizon's window in seconds: its name where it is a duration ("1m", "1h", "1d"),
    else the CUSUM's own time scale, tolerance / allowance."""
    try:
        return min(WINDOW_MAX, max(1.0, parse_duration(name)))
    except ValueError:
        return min(WINDOW_MAX, max(1.0, tolerance / max(allowance, 1e-9)))


def capacity_bits(nbytes: int, events: int, meta_bits_per_event: float) -> float:
    return 8.0 * nbytes + meta_bits_per_event * events


class BudgetBank:
    """Capacity budgets of every row on every horizon at once: ``S[H, n]``.

    Rows with fewer horizons than the widest are padded with an infinite allowance and
    tolerance, which keeps their sum at 0 and their ratio at 0.  The alarm looks one tick
    ahead: it fires when the sum would pass the tolerance on the next tick at the current
    rate, so a steady leak is stopped before h bits above the allowance, not a tick after.
    Only a rise sustained over two ticks is projected: a single legitimate burst is judged on
    what it carried, not on what it would carry if it went on.
    """

    STATE = (
        "excess",
        "last_step",
        "follow_excess",
        "envelope",
        "settled_envelope",
        "window_bits",
        "age",
        "misconfigured",
    )

    def __init__(
        self,
        rules: list[BudgetRule],
        tick: float = 10.0,
        derived: list[bool] | None = None,
        floors: list[BudgetRule] | None = None,
        max_learn_up: float = 4.0,
    ):
        """``derived``: rows whose budget is derived from what they carry (``rules`` holds
        what protects them while they are new); ``floors``: per row, the least a derived
        budget may allow, horizon by horizon (the unclassified budget of its kind)."""
        horizons = [_horizon_list(r) for r in rules]
        width = max((len(h) for h in horizons), default=1)
        n = len(rules)
        self.tick = tick
        self.names: list[list[str]] = [[name for name, _, _ in h] for h in horizons]
        self.declared_allowance = np.full((width, n), np.inf)
        self.declared_tolerance = np.full((width, n), np.inf)
        self.window = np.ones((width, n), dtype=np.int64)  # ticks
        for row, hs in enumerate(horizons):
            for i, (name, k, h) in enumerate(hs):
                self.declared_allowance[i, row] = k
                self.declared_tolerance[i, row] = h
                self.window[i, row] = max(1, round(horizon_window(name, k, h) / tick))
        self.derived = np.array(derived if derived is not None else [False] * n, dtype=bool)
        self.floor_allowance = np.zeros((width, n))
        self.floor_tolerance = np.zeros((width, n))
        for row, floor in enumerate(floors or []):
            fl = _horizon_list(floor)
            for i in range(width):
                _, k, h = fl[min(i, len(fl) - 1)]
                self.floor_allowance[i, row] = k
                self.floor_tolerance[i, row] = h
        self.enabled = np.array([r.enabled for r in rules], dtype=bool)
        self.allowance = self.declared_allowance.copy()
        self.tolerance = self.declared_tolerance.copy()
        self._inv_tolerance = 1.0 / self.tolerance  # 0 on padding
        self.excess = np.zeros((width, n))
        self.last_step = np.zeros((width, n))
        self.envelope = np.zeros((width, n))  # bits/s
        # While a row is new its envelope follows the windows' means so far, the first ticks
        # of a window included (a busy surface must not overrun its default budget on day 0);
        # the envelope it keeps afterwards is this one, of windows at least half full.
        self.settled_envelope = np.zeros((width, n))
        # Bits so far in the current windows: [0] aligned to the start, [1] half a window on.
        self.window_bits = np.zeros((2, width, n))
        self.age = np.zeros(n)
        self.misconfigured = np.zeros(n, dtype=bool)
        # Horizons a derived budget keeps (see the module docstring).
        self.fitted = self.window * tick > BURST_WINDOW

        self._forget = math.exp(-tick / ENVELOPE_MEMORY)
        self._rise = max_learn_up ** (tick / 86400.0)
        # The sum over the envelope's allowance, for every row: a declared budget may turn
        # out to be misconfigured, and then it follows what the surface carries too.
        self.follow_excess = np.zeros((width, n))

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        names = ("excess", "last_step", "follow_excess", "envelope", "settled_envelope")
        names += ("window_bits", "age", "misconfigured", "declared_allowance")
        names += ("declared_tolerance", "window", "derived", "floor_allowance")
        names += ("floor_tolerance", "enabled", "allowance", "tolerance", "fitted")
        out = {f"budget.{a}": getattr(self, a) for a in names}
        out["budget.inv_tolerance"] = self._inv_tolerance
        return out

    def tick_constants(self) -> dict[str, float]:
        """The scalars the whole native tick needs of the budgets (fused.py)."""
        return {
            "learning_seconds": LEARNING_SECONDS,
            "settled_window": SETTLED_WINDOW,
            "envelope_margin": ENVELOPE_MARGIN,
            "margin_windows": MARGIN_WINDOWS,
            "forget": self._forget,
            "rise": self._rise,
        }

    def nbytes(self) -> int:
        fixed = (self.allowance, self.tolerance, self.declared_allowance, self.window)
        return sum(a.nbytes for a in fixed) + sum(getattr(self, a).nbytes for a in self.STATE)

    def mark_misconfigured(self, rows: np.ndarray) -> None:
        """Declared budgets that fired on ordinary traffic for too long: judge from now on what
        comes on top of it (the sum starts again, so the page closes)."""
        if not rows.size:
            return
        self.misconfigured[rows] = True
        self.excess[:, rows] = 0.0
        self.follow_excess[:, rows] = 0.0
        self.last_step[:, rows] = 0.0

    def start_again(self, row: int) -> None:
        """A derived budget's page was folded (rules/precedent.py): what it summed is known
        traffic or part of an incident already paged, so its sums start again and it judges
        what comes on top."""
        self.excess[:, row] = 0.0
        self.follow_excess[:, row] = 0.0
        self.last_step[:, row] = 0.0

    def binding(self, row: int) -> int:
        """The horizon closest to (or furthest past) its tolerance."""
        return int(np.argmax(self.excess[:, row] / self.tolerance[:, row]))


def look_ahead(after: np.ndarray, step: np.ndarray, last_step: np.ndarray) -> np.ndarray:
    """The CUSUM one tick ahead: ``after`` plus the rise sustained over the last two ticks (a
    single tick's rise, a burst, is not projected).  A new array."""
    projected = np.minimum(step, last_step)
    np.maximum(projected, 0.0, out=projected)
    projected += after
    return projected


def _horizon_list(rule: BudgetRule) -> list[tuple[str, float, float]]:
    out = [(rule.horizon, rule.allowance_bits_per_second, rule.tolerance_bits)]
    out += [(h.horizon, h.allowance_bits_per_second, h.tolerance_bits) for h in rule.horizons]
    return out
