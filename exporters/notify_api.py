"""The body of ``GET /api/v1/notifications``: delivery as an operator needs to see it.

``outbox`` (its path, a write error and what is held in memory because of it, failed
housekeeping passes), ``channels``
(counters, queue depth and age, the first queued rows with attempts and last error, worker
restarts), ``dead_letters`` (newest first), ``alerts`` (each remembered alert's state,
severity, whether it is flapping and which silence holds it) and ``silences``.

Built on the outbox thread from one snapshot of the running configuration, so a reload in the
middle of it changes nothing it shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from alarm.detector.rules import default_severity
from exporters.channels import ChannelSet
from exporters.delivery import Channel
from exporters.destinations import DestinationSet
from exporters.diskfull import HeldChanges
from exporters.outbox import ChannelStats, Outbox
from exporters.routing import AlertMemory, active_silence, flapping, target_of


def notifications_body(
    outbox: Outbox,
    dests: DestinationSet,
    channels: ChannelSet,
    held: HeldChanges,
    stats: Mapping[str, ChannelStats],
    now: float,
    *,
    housekeeping_errors: int = 0,
    dead_limit: int = 50,
    head_limit: int = 20,
) -> dict[str, Any]:
    error = held.error
    return {
        "outbox": {
            "path": str(outbox.path),
            "write_error": error.error if error else None,
            "write_errors": held.errors,
            "unpersisted_changes": len(held.changes),
            "housekeeping_errors": housekeeping_errors,
        },
        "channels": [_channel(outbox, ch, stats, now, head_limit) for ch in channels.views],
        "dead_letters": outbox.dead_letters(None, dead_limit),
        "alerts": _alerts(outbox, dests, now),
        "silences": [
            {
                "match": s.match.model_dump(exclude_defaults=True),
                "starts": s.starts,
                "ends": s.ends,
                "comment": s.comment,
                "active": s.starts <= now < s.ends,
            }
            for s in dests.config.silences
        ],
    }


def _channel(
    outbox: Outbox, ch: Channel, stats: Mapping[str, ChannelStats], now: float, head_limit: int
) -> dict[str, Any]:
    st = stats.get(ch.name, ChannelStats())
    return {
        "channel": ch.name,
        "destination": ch.destination,
        "type": ch.type,
        "target": ch.target,
        "sent": ch.sent,
        "failed": ch.failed,
        "retried": ch.retried,
        "dropped": ch.dropped,
        "restarts": ch.restarts,
        "queue_depth": st.depth,
        "oldest_queued_age_seconds": now - st.oldest_created if st.oldest_created else 0.0,
        "unpersisted": ch.unpersisted,
        "dead_letters": st.dead,
        "queued": outbox.head(ch.name, head_limit),
    }


def _alerts(outbox: Outbox, dests: DestinationSet, now: float) -> list[dict[str, Any]]:
    cfg = dests.config
    with outbox.reading() as tx:
        alerts = tx.alerts()
    tracked = []
    for fp, state, change, changed, transitions in alerts:
        m = AlertMemory(fp, state, change, changed, transitions)
        rule = str(change.get("rule"))
        severity = cfg.severity(rule, default_severity(rule))
        silence = active_silence(cfg.silences, change, severity, now)
        tracked.append(
            {
                "fingerprint": fp,
                "state": state,
                "rule": change.get("rule"),
                "target": target_of(change),
                "severity": severity,
                "changed_at": changed,
                "flapping": flapping(m, cfg.flap, now),
                "silenced_by": (silence.comment or "silence") if silence else None,
            }
        )
    return tracked
