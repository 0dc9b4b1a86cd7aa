"""``type: auto``: /dev/kmsg where it can be read, else journald (auto.py); the default
source of the embedded config.  The registration: imported without either reader."""

from __future__ import annotations

from alarm.collectors.base import SourceType
from alarm.collectors.kernel import journald_type, kmsg_type

SOURCE = SourceType(
    "auto",
    "alarm.collectors.kernel.settings:AutoSettings",
    "alarm.collectors.kernel.auto:build",
    kind="egress",
    counters={**kmsg_type.COUNTERS, **journald_type.COUNTERS},
    forgeable=True,
)
