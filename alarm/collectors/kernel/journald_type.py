"""``type: journald``: kernel records through ``journalctl`` (journald.py).  The
registration: imported without the reader."""

from __future__ import annotations

from alarm.collectors.base import SourceType

COUNTERS = {
    "cursor_resets": "Saved journal cursors journalctl refused (journal vacuumed): a gap of unknown size.",
}
SOURCE = SourceType(
    "journald",
    "alarm.collectors.kernel.settings:JournaldSettings",
    "alarm.collectors.kernel.journald:build",
    kind="egress",
    counters=COUNTERS,
    forgeable=True,
)
