"""Scoring any detector on a fleet: alarms are the ticks at which an alarm *starts*.

Two scorers: the first (``score``) for the fleets of scenarios.py, the second (``incidents``,
``score_fleet``; below) for the held-out fleets of fleets.py, which counts pages as incidents.

Fleets of scenarios.py:

- false alarms: alarm starts on benign time (benign surfaces, attacked surfaces before the
  onset), per surface-week of benign time;
- per attack: detected when an alarm starts at or after the onset and before the attack ends
  (plus an hour's grace); latency from the onset to the end of the alarming tick; bits leaked
  before the alarm = payload bits sent from the onset up to and including that tick (a missed
  attack leaked all of its bits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.detection import fleets
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


# -- held-out fleets (fleets.py): pages counted as incidents --------------------------------
#
# - An *incident* is what pages: the firings of one (target, rule) that re-fire within the
#   rule's resolve window of the last resolution are one incident (issue 11: "an alert that
#   resolves and re-fires within its resolve window is the same incident").
# - A *false alarm* is an incident that starts on a target's benign time: outside every attack
#   window on that target, a window running from the onset to an hour after the attack ends
#   (HELDOUT_GRACE_S: an alert judged on the attack's last ticks may fire late).  A kind's
#   aggregate target is benign outside the windows of every attack on a surface of that kind.
# - An attack is *detected* by the first incident starting on its host (for a swarm: on any
#   member it attacked, or on the kind's aggregate) in its window; the delay runs from the
#   onset to the end of the alarming tick, and the bits leaked are the attack's payload bits
#   from the onset up to and including that tick (a missed attack leaked all of its bits).
#   Its *chance* is how likely the detector's own false-alarm rate on those targets was to
#   start an incident within that delay anyway: a detector that pages hundreds of times a week
#   "detects" most attacks by chance, and the report says how many were beyond it.
# - Targets: surface names; "(all):<kind>" for a kind's aggregate; capalarm may also fire on
#   "unclassified:<kind>" and "source:<name>", and on an aggregate of a kind with fewer
#   surfaces (its unclassified row counts as a member), which the fleet does not hold: such
#   incidents are counted (families "(unclassified)", "(source)", "(aggregate)") with no
#   surface-weeks.
# - A surface that exists only from its first write (SurfaceInfo.exists_from, longfleet.py's
#   first-write family) has no benign time before it: neither surface-weeks nor false alarms.
# - Scheduled occurrences: on every surface whose params say ``scheduled`` (longfleet.py's
#   weekly and fortnightly jobs, and late starters built on them), each of its runs (its
#   episodes) is an occurrence, *paged* when an incident starts on the surface from the run's
#   first tick to HELDOUT_GRACE_S after its last; a run overlapping an attack window on the
#   surface is left out.  Counted per family: first occurrences and later ones, and how many
#   of each paged (the floor: a scheduled event pages at most on its first occurrence).

HELDOUT_GRACE_S = 3600.0
AGGREGATE = "(all)"
AGGREGATE_FAMILY = "(aggregate)"
AGGREGATE_MIN_MEMBERS = 4  # capalarm's default aggregates.<kind>.min_members
SWARM_KINDS = ("swarm", "swarm_members")  # attacks also detected on their kind's aggregate
WEEK_S = 7 * 86400.0


def aggregate_target(kind: str) -> str:
    return f"{AGGREGATE}:{kind}"


@dataclass(slots=True)
class Incident:
    target: str
    rule: str
    start: int  # index of the tick at whose end the first firing came
    end: int | None  # tick of the last resolution; None: still firing when the replay ended
    firings: int = 1
    figures: dict[str, Any] = field(default_factory=dict)  # the first firing's


def change_target(change: Mapping[str, Any]) -> str:
    """The scorer's target name of one capalarm alert change."""
    if "source" in change:
        return f"source:{change['source']}"
    name = str(change.get("surface", ""))
    if name in (AGGREGATE, "unclassified"):
        return f"{name}:{change.get('kind', '')}"
    return name


def change_tick(at: float, clock: fleets.Clock) -> int:
    """capalarm stamps a change with the end of the tick it was evaluated in."""
    return round((at - clock.t0) / clock.tick) - 1


def incidents(
    changes: Iterable[Mapping[str, Any]],
    clock: fleets.Clock,
    resolve_window: Callable[[str, str], float],
) -> list[Incident]:
    """Alert state changes (capalarm backtest output: ``surface`` or ``source``, ``rule``,
    ``state``, ``at``, ``figures``) as incidents.  ``resolve_window(target, rule)`` gives the
    rule's resolve window in seconds.  A firing of an alert already firing (an escalation)
    counts as a firing of the open incident.  Pending changes page nobody: ignored."""
    open_: dict[tuple[str, str], Incident] = {}
    last: dict[tuple[str, str], Incident] = {}
    out: list[Incident] = []
    for change in sorted(changes, key=lambda c: float(c["at"])):
        state = change.get("state")
        key = (change_target(change), str(change.get("rule", "")))
        at = change_tick(float(change["at"]), clock)
        if state == "firing":
            inc = open_.get(key)
            if inc is None:
                prev = last.get(key)
                window = resolve_window(*key) / clock.tick
                if prev is not None and prev.end is not None and at - prev.end <= window:
                    inc = prev
                    inc.end = None
                    inc.firings += 1
                else:
                    inc = Incident(key[0], key[1], at, None, 1, dict(change.get("figures") or {}))
                    out.append(inc)
                open_[key] = inc
                last[key] = inc
            else:
                inc.firings += 1
        elif state == "resolved":
            inc = open_.pop(key, None)
            if inc is not None:
                inc.end = at
    return out


def incident_starts(incs: Iterable[Incident]) -> dict[str, np.ndarray]:
    """Start ticks per target, sorted (incidents of every rule of the target)."""
    by: dict[str, list[int]] = {}
    for inc in incs:
        by.setdefault(inc.target, []).append(inc.start)
    return {t: np.sort(np.array(v, dtype=np.int64)) for t, v in by.items()}


def mask_starts(mask: np.ndarray, window_ticks: int) -> np.ndarray:
    """Incident starts of per-tick alarm masks (ticks x targets): a tick alarming after more
    than ``window_ticks`` clear ticks (or first).  Returns a boolean array like ``mask``."""
    m = mask.astype(bool)
    cs = np.zeros((m.shape[0] + 1, *m.shape[1:]), dtype=np.int32)
    np.cumsum(m, axis=0, out=cs[1:])
    t = np.arange(m.shape[0])
    lo = np.maximum(t - window_ticks - 1, 0)
    recent = cs[t] - cs[lo]  # alarming ticks in [t - window - 1, t - 1]
    return m & (recent == 0)


@dataclass(slots=True)
class AttackOutcome:
    """One attack's result for one detector."""

    attack: str
    host: str
    fleet: str
    detected: bool
    delay_ticks: int  # -1 when missed
    delay_s: float  # inf when missed
    leaked_bits: float
    total_bits: float
    beats: int  # ticks carrying payload up to the alarm (all of them when missed)
    params: dict[str, Any] = field(default_factory=dict)
    by: str = ""  # the target that detected it
    figures: dict[str, Any] = field(default_factory=dict)  # the detecting incident's
    # The chance that the detector's own false-alarm rate on these targets (incidents per
    # benign tick) starts an incident within the same delay: 1 - exp(-rate x delay).  A
    # detection with a chance near 1 is background firing that happened to land there.
    chance: float = 1.0


@dataclass(slots=True)
class FleetScore:
    false_alarms: dict[str, int] = field(default_factory=dict)  # by family
    weeks: dict[str, float] = field(default_factory=dict)  # benign surface-weeks by family
    outcomes: list[AttackOutcome] = field(default_factory=list)
    # By family of scheduled surfaces: [first occurrences, of them paged, later occurrences,
    # of them paged].
    scheduled: dict[str, list[int]] = field(default_factory=dict)

    def add(self, other: FleetScore) -> None:
        for fam, n in other.false_alarms.items():
            self.false_alarms[fam] = self.false_alarms.get(fam, 0) + n
        for fam, w in other.weeks.items():
            self.weeks[fam] = self.weeks.get(fam, 0.0) + w
        self.outcomes += other.outcomes
        for fam, counts in other.scheduled.items():
            mine = self.scheduled.setdefault(fam, [0, 0, 0, 0])
            for i, n in enumerate(counts):
                mine[i] += n

    def later_paged(self) -> tuple[int, int]:
        """(scheduled occurrences after the first that paged, such occurrences)."""
        return (
            sum(c[3] for c in self.scheduled.values()),
            sum(c[2] for c in self.scheduled.values()),
        )

    def rate(self, family: str | None = None) -> float:
        """False alarms per surface-week, of one family or overall."""
        if family is not None:
            w = self.weeks.get(family, 0.0)
            n = self.false_alarms.get(family, 0)
            return n / w if w else (float("inf") if n else 0.0)
        w = sum(self.weeks.values())
        return sum(self.false_alarms.values()) / w if w else 0.0


def unheld_family(target: str) -> str:
    """The family a target the fleet does not hold is counted under."""
    if target.startswith("source:"):
        return "(source)"
    if target.startswith(f"{AGGREGATE}:"):
        return AGGREGATE_FAMILY  # an aggregate capalarm formed with its unclassified row
    return "(unclassified)"


def targets(fleet: fleets.Fleet) -> list[tuple[str, str, tuple[int, ...]]]:
    """(target, family, member columns) of the fleet: every surface, then each kind's
    aggregate where the kind has AGGREGATE_MIN_MEMBERS surfaces or more."""
    out = [(s.name, s.family, (j,)) for j, s in enumerate(fleet.surfaces)]
    for kind in fleets.KINDS:
        cols = tuple(j for j, s in enumerate(fleet.surfaces) if s.kind == kind)
        if len(cols) >= AGGREGATE_MIN_MEMBERS:
            out.append((aggregate_target(kind), AGGREGATE_FAMILY, cols))
    return out


def benign_masks(fleet: fleets.Fleet) -> dict[str, np.ndarray]:
    """Per target, the ticks outside every attack window on it."""
    grace = fleets.ticks_per(HELDOUT_GRACE_S, fleet.clock.tick)
    out = {}
    for name, _, cols in targets(fleet):
        m = np.ones(fleet.ticks, dtype=bool)
        if len(cols) == 1 and name == fleet.surfaces[cols[0]].name:
            m[: fleet.surfaces[cols[0]].exists_from] = False
        for a in fleet.attacks:
            if set(a.columns) & set(cols):
                m[a.onset : a.end + grace] = False
        out[name] = m
    return out


def score_fleet(
    fleet: fleets.Fleet,
    starts: Mapping[str, np.ndarray],
    figures: Mapping[tuple[str, int], dict[str, Any]] | None = None,
    benign: Mapping[str, np.ndarray] | None = None,
) -> FleetScore:
    """False alarms by family and attack outcomes of one detector on one fleet, from its
    incident start ticks per target.  ``figures[(target, start)]``: what the incident that
    started there reported (capalarm: its first firing's figures)."""
    benign = benign if benign is not None else benign_masks(fleet)
    figures = figures or {}
    tick = fleet.clock.tick
    res = FleetScore()
    families = {name: fam for name, fam, _ in targets(fleet)}
    for name, fam in families.items():
        res.weeks[fam] = res.weeks.get(fam, 0.0) + benign[name].sum() * tick / WEEK_S
        res.false_alarms.setdefault(fam, 0)
    for name, s in starts.items():
        s = np.asarray(s, dtype=np.int64)
        s = s[(s >= 0) & (s < fleet.ticks)]
        if name in families:
            fam = families[name]
            n = int(benign[name][s].sum())
        else:
            fam = unheld_family(name)
            n = int(s.size)
        res.false_alarms[fam] = res.false_alarms.get(fam, 0) + n
    grace = fleets.ticks_per(HELDOUT_GRACE_S, tick)
    for a in fleet.attacks:
        hosts = [fleet.surfaces[c].name for c in a.columns]
        if a.kind in SWARM_KINDS:
            kinds = {fleet.surfaces[c].kind for c in a.columns}
            hosts += [aggregate_target(k) for k in sorted(kinds)]
        first, by = None, ""
        background = 0.0  # benign incidents per tick on the hosts
        for h in hosts:
            s = np.asarray(starts.get(h, ()), dtype=np.int64)
            s = s[(s >= 0) & (s < fleet.ticks)]
            if h in benign and benign[h].any():
                background += benign[h][s].sum() / benign[h].sum()
            hit = s[(s >= a.onset) & (s < a.end + grace)]
            if hit.size and (first is None or hit.min() < first):
                first, by = int(hit.min()), h
        per_tick = a.bits.sum(axis=1)
        total = float(per_tick.sum())
        if first is None:
            res.outcomes.append(
                AttackOutcome(
                    a.kind,
                    a.host_family,
                    fleet.name,
                    False,
                    -1,
                    float("inf"),
                    total,
                    total,
                    int((per_tick > 0).sum()),
                    dict(a.params),
                )
            )
            continue
        upto = per_tick[: first - a.onset + 1]
        res.outcomes.append(
            AttackOutcome(
                a.kind,
                a.host_family,
                fleet.name,
                True,
                first - a.onset + 1,
                (first - a.onset + 1) * tick,
                float(upto.sum()),
                total,
                int((upto > 0).sum()),
                dict(a.params),
                by,
                dict(figures.get((by, first), {})),
                float(-np.expm1(-background * (first - a.onset + 1))),
            )
        )
    res.scheduled = scheduled_pages(fleet, starts, benign)
    return res


def scheduled_pages(
    fleet: fleets.Fleet, starts: Mapping[str, np.ndarray], benign: Mapping[str, np.ndarray]
) -> dict[str, list[int]]:
    """Per family of scheduled surfaces: [first occurrences, paged, later ones, paged]."""
    grace = fleets.ticks_per(HELDOUT_GRACE_S, fleet.clock.tick)
    out: dict[str, list[int]] = {}
    for s in fleet.surfaces:
        if not s.params.get("scheduled"):
            continue
        counts = out.setdefault(s.family, [0, 0, 0, 0])
        at = np.asarray(starts.get(s.name, ()), dtype=np.int64)
        ok = benign[s.name]
        for k, (a, b, _) in enumerate(sorted(s.episodes)):
            hi = min(fleet.ticks, b + grace)
            if not ok[a:hi].all():
                continue  # an attack's window: not a benign occurrence
            paged = bool(((at >= a) & (at < hi)).any())
            slot = 0 if k == 0 else 2
            counts[slot] += 1
            counts[slot + 1] += paged
    return out
