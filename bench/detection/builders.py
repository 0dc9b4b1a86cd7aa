"""The fleets the detection benches build, by name: fleets.py's two-week *main* and *sandbox*
fleets and longfleet.py's six-week *long* fleet.  A module of its own because the long fleet
builds on fleets.py's families: the registry of both cannot live in either without the two
importing each other."""

from __future__ import annotations

from collections.abc import Callable

from bench.detection import fleets, longfleet
from bench.detection.fleets import TICK, Fleet


def long_fleet(
    seed: int, days: float | None = None, tick: float = TICK, attacks: bool = True
) -> Fleet:
    """Six weeks of an organisation's schedules (longfleet.py)."""
    return longfleet.long_fleet(seed, longfleet.LONG_DAYS if days is None else days, tick, attacks)


FLEETS: dict[str, Callable[..., Fleet]] = {
    "main": fleets.main_fleet,
    "sandbox": fleets.sandbox_fleet,
    "long": long_fleet,
}
# What heldout.py, false_pages.py and tick_pages.py run unless told otherwise (the long fleet
# is three times as long: its own runs, ``--fleets long``).
DEFAULT_FLEETS: tuple[str, ...] = ("main", "sandbox")
DEFAULT_DAYS: dict[str, float] = {"main": fleets.DAYS, "sandbox": fleets.DAYS, "long": 42.0}
