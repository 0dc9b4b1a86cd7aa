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

A declared budget that fires on a surface's ordinary traffic for more than
``MISCONFIGURED_SECONDS`` is reported as misconfigured (``misconfigured``) and from then on
judges what comes on top of that traffic, as a derived one does, instead of holding one page
open forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from alarm.config import BudgetRule
from alarm.detector import fused
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


class CapacityBudget:
    __slots__ = ("excess", "rule")

    def __init__(self, rule: BudgetRule):
        self.rule = rule
        self.excess = 0.0  # bits above allowance, accumulated (the CUSUM statistic)

    def update(self, bits: float, seconds: float) -> float:
        self.excess = max(0.0, self.excess + bits - self.rule.allowance_bits_per_second * seconds)
        return self.excess

    @property
    def exceeded(self) -> bool:
        return self.excess > self.rule.tolerance_bits

    def to_state(self) -> dict:
        return {"excess": self.excess}

    def load_state(self, state: dict) -> None:
        self.excess = float(state.get("excess", 0.0))


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
        self._following = np.zeros((width, n), dtype=bool)
        # Horizons a derived budget keeps (see the module docstring).
        self.fitted = self.window * tick > BURST_WINDOW

        self._forget = math.exp(-tick / ENVELOPE_MEMORY)
        self._rise = max_learn_up ** (tick / 86400.0)
        # The sum over the envelope's allowance, for every row: a declared budget may turn
        # out to be misconfigured, and then it follows what the surface carries too.
        self.follow_excess = np.zeros((width, n))
        # One window per horizon for every row (padding included): see _window_means.
        uniform = (self.window == self.window[:, :1]).all() if n else False
        self._uniform_window = self.window[:, 0].copy() if uniform else None
        self._modes_cache: tuple[tuple, _Modes] | None = None

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

    def update(
        self, bits: np.ndarray, seconds: float, now: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add one tick (ending at ``now``).  Returns (projected ratio, ratio): the largest
        S/h over the horizons with and without the one-tick look-ahead."""
        learning = self.age < LEARNING_SECONDS
        self.age += seconds
        self.window_bits += bits
        mean = self._window_means(seconds, learning)
        now_learning = self.age < LEARNING_SECONDS
        settling = learning & ~now_learning
        if settling.any():
            self._settle(settling)
        modes = self._modes(now_learning, seconds)
        native = fused.native()
        if native is not None:
            return self._update_native(native, bits, seconds, mean, modes)
        followed = self._follow(bits, seconds, mean, modes)
        # Rows that follow what they carry are judged by the sum over the envelope.
        if not self._following.any():
            before = self.excess
        elif self._following.all():
            before = followed
        else:
            before = np.where(self._following, followed, self.excess)
        after = before + bits
        after -= self.allowance * seconds
        np.maximum(after, 0.0, out=after)
        step = after - before
        ratio = after * self._inv_tolerance
        projected = look_ahead(after, step, self.last_step)
        projected *= self._inv_tolerance
        self.excess = after
        self.last_step = step
        return projected.max(axis=0), ratio.max(axis=0)

    def _update_native(
        self, native: ModuleType, bits: np.ndarray, seconds: float, mean: np.ndarray, m: _Modes
    ) -> tuple[np.ndarray, np.ndarray]:
        """``_follow`` and the sums of ``update`` in one pass over the cells (fused.py)."""
        f64 = np.float64
        cells = self.excess.shape
        declared = m.declared if m.declared is not None else np.zeros(cells, dtype=bool)
        fixed = (m.rise_floor, m.k_floor, m.allowance_floor, m.tolerance_floor, m.margin_seconds)
        fixed += (self.declared_allowance, self.declared_tolerance)
        # Written in place (both paths keep them C-contiguous float64 of the cells' shape):
        # three fresh arrays of cells each tick are page faults at 100k rows.
        out = (self.allowance, self.tolerance, self._inv_tolerance)
        projected, ratio = np.empty(bits.size), np.empty(bits.size)
        native.budget_step(
            np.ascontiguousarray(bits, dtype=f64),
            np.ascontiguousarray(mean, dtype=f64),
            *(np.ascontiguousarray(a, dtype=f64) for a in fixed),
            np.ascontiguousarray(declared, dtype=bool),
            np.ascontiguousarray(m.following, dtype=bool),
            seconds,
            self._forget,
            self._rise,
            ENVELOPE_MARGIN,
            self.envelope,
            self.follow_excess,
            self.excess,
            self.last_step,
            *out,
            projected,
            ratio,
        )
        self._following = m.following
        return projected, ratio

    def _follow(
        self, bits: np.ndarray, seconds: float, mean: np.ndarray, modes: _Modes
    ) -> np.ndarray:
        """Learn the envelope and the tail of the sum over it; set the allowance and tolerance
        of the rows that follow what they carry (derived once known, misconfigured).  Returns
        the sum over the envelope as it was before this tick."""
        # The envelope: the largest window mean, forgetting; once known, rising at most
        # max_learn_up a day (modes.rise_floor is +inf while a row is new: it follows freely).
        grown = self.envelope * self._forget
        np.maximum(grown, mean, out=grown)
        capped = self.envelope * self._rise
        np.maximum(capped, modes.rise_floor, out=capped)
        np.minimum(grown, capped, out=grown)
        self.envelope = grown
        k = ENVELOPE_MARGIN * self.envelope
        np.maximum(k, modes.k_floor, out=k)
        before = self.follow_excess
        follow_excess = before + bits
        follow_excess -= k * seconds
        np.maximum(follow_excess, 0.0, out=follow_excess)
        self.follow_excess = follow_excess
        # Rows that follow: k, and MARGIN_WINDOWS windows at k.  While new: the declared budget
        # raised to k, its tolerance never below the margin at that; declared rows: declared.
        allowance = np.maximum(modes.allowance_floor, k)
        tolerance = allowance * modes.margin_seconds
        np.maximum(tolerance, modes.tolerance_floor, out=tolerance)
        if modes.declared is not None:
            np.copyto(allowance, self.declared_allowance, where=modes.declared)
            np.copyto(tolerance, self.declared_tolerance, where=modes.declared)
        self.allowance = allowance
        self.tolerance = tolerance
        self._inv_tolerance = 1.0 / tolerance
        self._following = modes.following
        return before

    def _window_means(self, seconds: float, learning: np.ndarray) -> np.ndarray:
        """The mean capacity (bits/s) of each horizon's current windows, the larger of the two
        sets; windows that end with this tick start again.

        Shorter windows read their bits so far over the time so far: their envelope covers
        the bursts a surface makes within them (a cache's warm-ups), which are the spike
        rule's.  Windows of ``SETTLED_WINDOW`` or more, the horizons that catch drips, read
        their bits over at least half a window: one of the two sets is always that full, so
        steady traffic reads its own rate, while one write at the start of a day does not
        read as its size over a few ticks (that kept a quiet surface's day allowance at
        several times what it carries, and the day horizon learned a 10 bit/s drip faster
        than it summed it).  Rows still learning read the means so far (``_settle``)."""
        ticks = np.round(self.age / seconds).astype(np.int64)
        window = self.window
        if self._uniform_window is not None and ticks.min() == ticks.max():
            # Every row at the same phase (the usual case: surfaces declared together, one
            # window per horizon): the phase is a number per horizon, broadcast over the rows.
            ticks, window = ticks[:1], self._uniform_window[:, None]
        phase = ticks % window
        offset = np.stack([phase, (phase + window // 2) % window])
        done = offset == 0
        held = np.where(done, window, offset)
        # Windows of a day or more (the drips' horizons) are read over at least half a window.
        floor = np.where(window * seconds >= SETTLED_WINDOW, window - window // 2, 1)
        settled = (self.window_bits / (np.maximum(held, floor) * seconds)).max(axis=0)
        if learning.any():
            np.maximum(self.settled_envelope * self._forget, settled, out=self.settled_envelope)
            so_far = (self.window_bits / (held * seconds)).max(axis=0)
            mean = np.where(learning, so_far, settled)
        else:
            mean = settled
        if done.any():
            np.copyto(self.window_bits, 0.0, where=done)
        return mean

    def _settle(self, rows: np.ndarray) -> None:
        """Rows that stop learning keep the envelope of windows at least half full (a state
        saved before there was one has none: those keep the envelope they have)."""
        known = rows & (self.settled_envelope > 0).any(axis=0)
        self.envelope[:, known] = self.settled_envelope[:, known]

    def _modes(self, learning: np.ndarray, seconds: float) -> _Modes:
        """What each (horizon, row) follows this tick.  It changes only when a row stops
        learning or is found misconfigured, so it is rebuilt only then."""
        key = (np.packbits(learning).tobytes(), np.packbits(self.misconfigured).tobytes(), seconds)
        if self._modes_cache is None or self._modes_cache[0] != key:
            self._modes_cache = (key, self._build_modes(learning, seconds))
        return self._modes_cache[1]

    def _build_modes(self, learning: np.ndarray, seconds: float) -> _Modes:
        misconfigured = self.misconfigured
        follows = self.derived | misconfigured
        following = follows & self.fitted & ~learning
        padding = ~np.isfinite(self.declared_allowance)
        k_floor = np.where(
            misconfigured,
            np.maximum(self.floor_allowance, self.declared_allowance),
            self.floor_allowance,
        )
        k_floor[padding] = np.inf
        rise_floor = np.where(learning, np.inf, self.floor_allowance / ENVELOPE_MARGIN)
        off = self.derived & ~self.fitted & ~learning  # a derived budget's burst horizon
        allowance_floor = np.where(
            following, -np.inf, np.where(off, np.inf, self.declared_allowance)
        )
        tolerance_floor = np.where(
            following,
            np.where(
                misconfigured,
                np.maximum(self.floor_tolerance, self.declared_tolerance),
                self.floor_tolerance,
            ),
            self.declared_tolerance,
        )
        declared = ~follows & ~padding
        return _Modes(
            following=following,
            k_floor=k_floor,
            rise_floor=rise_floor,
            allowance_floor=allowance_floor,
            tolerance_floor=tolerance_floor,
            margin_seconds=MARGIN_WINDOWS * self.window * seconds,
            declared=declared if declared.any() else None,
        )

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


@dataclass(slots=True, frozen=True)
class _Modes:
    """Per (horizon, row), what its budget follows; fixed while no row changes mode."""

    following: np.ndarray  # bool: judged by the sum over the envelope
    k_floor: np.ndarray  # the least a followed allowance is (+inf on padding)
    rise_floor: np.ndarray  # the envelope's rise cap never below this (+inf while new)
    allowance_floor: np.ndarray  # -inf where following, +inf where off, else declared
    tolerance_floor: np.ndarray
    margin_seconds: np.ndarray  # a tolerance is this many seconds at its allowance
    declared: np.ndarray | None  # bool: rows judged by their declared budget, if any


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
