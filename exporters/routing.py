"""Routing and noise: which destination hears about which alert, and when.

Pure decisions over an alert's remembered state and what a destination was last sent; the
caller (exporters/notify.py) reads that memory from the outbox database and writes back the
decisions together with the rows they produce.

- **One notification per state change**: only ``firing`` and ``resolved`` are announced; a
  destination is sent a state it was not already sent.
- **Escalation**: a firing alert re-announced by the detector (its rate passed the one it
  fired with by the rule's ``escalate_ratio``) is sent once more, at once, as ``escalated``.
- **Repeat**: an alert that stays firing is sent again every ``repeat_interval`` (Alertmanager
  needs this so its alerts never expire; a pager gets a reminder), unless a notification for it
  is still queued — that one refreshes the receiver anyway.
- **Filters** per destination: target (wildcards), kind, rule, severity.
- **Silences**: time windows in the config.  A silenced firing is held, and sent if the alert
  is still firing when the window ends.  A resolve is never silenced once its firing was sent:
  a page that was opened is always closed.
- **Flap damping**: more than ``max_changes`` transitions within ``window`` and the alert is
  flapping; its changes are held until it has been stable for ``settle``, then its state at
  that moment is sent if it differs from what was last sent.
- **Incidents, not flaps** (``reopen_window``, off by default): a resolve waits until the
  alert has stayed resolved that long; one that fires again meanwhile is the same incident,
  so a destination that was paged is not paged again, and the incident keeps the first
  firing's start.  The count of pages is the count of incidents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from alarm.notify_config import SEVERITY_ORDER, Filter, FlapDamping, Silence

NOTIFIABLE = ("firing", "resolved")
TARGET_KEYS = ("surface", "source", "service")


@dataclass(slots=True)
class AlertMemory:
    fingerprint: str
    state: str  # firing | resolved
    change: dict[str, Any]  # the change that set this state
    changed: float
    transitions: list[float] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class Sent:
    state: str  # firing | resolved: what the destination was last sent
    at: float  # when it was queued
    seq: int  # notifications queued for this alert to this destination, ever


def target_of(change: dict[str, Any]) -> str:
    for key in TARGET_KEYS:
        if key in change:
            return str(change[key])
    return ""


def matches(f: Filter, change: dict[str, Any], severity: str) -> bool:
    if f.targets and not any(fnmatchcase(target_of(change), p) for p in f.targets):
        return False
    if f.kinds and str(change.get("kind")) not in f.kinds:
        return False
    if f.rules and str(change.get("rule")) not in f.rules:
        return False
    if f.severities and severity not in f.severities:
        return False
    return not (
        f.min_severity and SEVERITY_ORDER.index(severity) < SEVERITY_ORDER.index(f.min_severity)
    )


def active_silence(
    silences: list[Silence], change: dict[str, Any], severity: str, now: float
) -> Silence | None:
    for s in silences:
        if s.starts <= now < s.ends and matches(s.match, change, severity):
            return s
    return None


def observe(
    memory: AlertMemory | None, change: dict[str, Any], flap: FlapDamping
) -> AlertMemory | None:
    """Fold one alert change into the alert's memory.  None: not a change anyone is told of
    (pending, or a pending that cleared)."""
    state = change.get("state")
    if state not in NOTIFIABLE:
        return memory
    at = float(change.get("at", 0.0))
    if memory is None:
        return AlertMemory(str(change["fingerprint"]), state, change, at, [at])
    transitions = [t for t in memory.transitions if t > at - flap.window]
    if state != memory.state:
        transitions.append(at)
    if reopens(memory, state, at, flap) or (
        flap.reopen_window > 0 and state == "resolved" and memory.state == "firing"
    ):
        # The same incident, to its end: it started when it first fired.
        change = {**change, "started_at": memory.change.get("started_at", change.get("at"))}
    return AlertMemory(memory.fingerprint, state, change, at, transitions)


def reopens(memory: AlertMemory, state: str, at: float, flap: FlapDamping) -> bool:
    """A firing within ``reopen_window`` of its resolve: the incident goes on."""
    return (
        state == "firing"
        and memory.state == "resolved"
        and flap.reopen_window > 0
        and at - memory.changed < flap.reopen_window
    )


def flapping(memory: AlertMemory, flap: FlapDamping, now: float) -> bool:
    if not flap.enabled or not memory.transitions:
        return False
    recent = [t for t in memory.transitions if t > now - flap.window]
    return len(recent) > flap.max_changes and now - memory.transitions[-1] < flap.settle


@dataclass(slots=True, frozen=True)
class Route:
    """One destination as the router sees it."""

    name: str
    filter: Filter
    repeat_interval: float


def decide(
    route: Route,
    memory: AlertMemory,
    sent: Sent | None,
    severity: str,
    *,
    silences: list[Silence],
    flap: FlapDamping,
    now: float,
    queued: Callable[[], bool],
) -> str | None:
    """What to queue for this destination now: 'firing', 'escalated', 'repeat', 'resolved' or
    None."""
    if not matches(route.filter, memory.change, severity):
        return None
    if flapping(memory, flap, now):
        return None
    last = sent.state if sent else None
    if memory.state == "firing":
        if active_silence(silences, memory.change, severity, now):
            return None
        if last != "firing":
            return "firing"
        assert sent is not None
        if memory.change.get("figures", {}).get("escalated") and memory.changed > sent.at:
            return "escalated"
        if route.repeat_interval > 0 and now - sent.at >= route.repeat_interval and not queued():
            return "repeat"
        return None
    # resolved: only a destination that was told it fired is told it resolved, and only
    # once the alert cannot reopen the incident any more (reconcile sends it then).
    if last != "firing":
        return None
    if flap.reopen_window > 0 and now - memory.changed < flap.reopen_window:
        return None
    return "resolved"


def forgettable(memory: AlertMemory, sent: dict[str, Sent], flap: FlapDamping, now: float) -> bool:
    """A resolved alert nobody still thinks is firing, outside the flap window, can go."""
    return (
        memory.state == "resolved"
        and now - memory.changed > flap.window
        and all(s.state != "firing" for s in sent.values())
    )
