"""Recording: alert changes in, the router's decisions and the rows they produce out, written
in one outbox transaction.

For each firing or resolved change the alert's memory is read (``notify_alerts``, and what
each destination was last sent, ``notify_sent``), folded with the change and put to every
destination's route (``exporters/routing.py``); each notification becomes one row per
channel of its destination.  A reconcile pass does the same for every remembered alert with no
change: repeats that are due, silences that ended, flapping alerts that settled; it also
forgets resolved alerts nobody needs any more.  The plan is written back with its rows in the
same transaction, so a crash never separates a decision from its notification.

A change older than the alert's remembered one is a *replay*, and is skipped: a service
restarted after a crash (or after its state could not be saved, a full disk) evaluates again
the ticks since its last state save, and gives again the changes it gave then, at the same
tick times.  The router already decided on those; deciding again would page again (a firing
replayed after its resolve is a new state to the router).  A tick's changes carry its end time
(event time), so an alert's changes come in order of ``at``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from alarm.detector.rules import default_severity
from exporters.destinations import BuiltDestination, DestinationSet
from exporters.outbox import NewRow, Transaction
from exporters.routing import AlertMemory, Sent, decide, forgettable, observe


def idem_key(channel: str, fp: str, event: str, started_at: Any, seq: int) -> str:
    """Chosen once per notification, stored with it, sent with every attempt."""
    text = f"{channel}\x00{fp}\x00{event}\x00{started_at}\x00{seq}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(slots=True)
class Plan:
    """What one pass decided: rows to queue and the router memory to write with them."""

    rows: list[NewRow] = field(default_factory=list)
    alerts: dict[str, AlertMemory] = field(default_factory=dict)
    sent: dict[tuple[str, str], Sent] = field(default_factory=dict)  # (destination, fp)
    drops: set[str] = field(default_factory=set)
    replayed: int = 0  # changes older than the alert's remembered state: skipped


def plan_changes(
    tx: Transaction,
    dests: DestinationSet,
    changes: list[dict[str, Any]],
    now: float,
    reconcile: bool,
) -> Plan:
    """Decide what ``changes`` (and, when ``reconcile``, the passing of time) mean for every
    destination.  Reads only: the caller writes the plan with ``write_plan``, or, when the disk
    is full, holds its rows in memory."""
    plan = Plan()
    flap = dests.config.flap

    def memory(fp: str) -> AlertMemory | None:
        if fp in plan.alerts:
            return plan.alerts[fp]
        stored = tx.alert(fp)
        if stored is None:
            return None
        return AlertMemory(fp, stored[0], stored[1], stored[2], stored[3])

    for change in changes:
        fp = str(change["fingerprint"])
        known = memory(fp)
        if known is not None and float(change.get("at", 0.0)) < known.changed:
            plan.replayed += 1
            continue
        m = observe(known, change, flap)
        if m is None:
            continue
        plan.alerts[fp] = m
        _route(tx, dests, m, now, plan)
    if reconcile:
        for fp, state, change, changed, transitions in tx.alerts():
            if fp in plan.alerts:
                continue
            m = AlertMemory(fp, state, change, changed, transitions)
            if forgettable(m, _sent(tx, fp, plan), flap, now):
                plan.drops.add(fp)
                continue
            _route(tx, dests, m, now, plan)
    return plan


def write_plan(tx: Transaction, plan: Plan, delivered: Collection[str], now: float) -> None:
    """Store the plan; rows whose idempotency key is in ``delivered`` (already sent from memory
    while the disk was full) are not queued again."""
    for fp, m in plan.alerts.items():
        tx.put_alert(fp, m.state, m.change, m.changed, m.transitions)
    for (dest, fp), s in plan.sent.items():
        tx.put_sent(dest, fp, s.state, s.at, s.seq)
    for fp in plan.drops:
        tx.drop_alert(fp)
    tx.insert([r for r in plan.rows if r.idem_key not in delivered], now)


def dead_letter_orphans(tx: Transaction, known: Collection[str], now: float) -> dict[str, int]:
    """Rows queued for a channel that is no longer configured move to the dead letters:
    visible, not lost.  Returns how many, per channel."""
    moved = {}
    for channel in tx.channels_with_rows():
        if channel not in known:
            moved[channel] = tx.dead_channel(
                channel, "destination removed from the configuration", now
            )
    return moved


def _sent(tx: Transaction, fp: str, plan: Plan) -> dict[str, Sent]:
    sent = {dest: Sent(*v) for dest, v in tx.sent(fp).items()}
    for (dest, f), s in plan.sent.items():
        if f == fp:
            sent[dest] = s
    return sent


def _route(tx: Transaction, dests: DestinationSet, m: AlertMemory, now: float, plan: Plan) -> None:
    cfg = dests.config
    rule = str(m.change.get("rule"))
    severity = cfg.severity(rule, default_severity(rule))
    sent = _sent(tx, m.fingerprint, plan)
    for d in dests.destinations:
        _route_to(tx, d, m, sent.get(d.route.name), severity, dests, now, plan)


def _route_to(
    tx: Transaction,
    d: BuiltDestination,
    m: AlertMemory,
    prev: Sent | None,
    severity: str,
    dests: DestinationSet,
    now: float,
    plan: Plan,
) -> None:
    channels = [ch for ch, _ in d.targets]
    event = decide(
        d.route,
        m,
        prev,
        severity,
        silences=dests.config.silences,
        flap=dests.config.flap,
        now=now,
        queued=lambda: any(tx.has_pending(c, m.fingerprint) for c in channels),
    )
    if event is None:
        return
    seq = (prev.seq if prev else 0) + 1
    body = {
        "event": event,
        "severity": severity,
        "destination": d.route.name,
        "seq": seq,
        "change": m.change,
    }
    started = m.change.get("started_at")
    for ch in channels:
        key = idem_key(ch, m.fingerprint, event, started, seq)
        plan.rows.append(NewRow(ch, m.fingerprint, key, event, body))
    state = "resolved" if event == "resolved" else "firing"
    plan.sent[(d.route.name, m.fingerprint)] = Sent(state, now, seq)
