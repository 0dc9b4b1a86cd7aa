"""``type: kmsg``: /dev/kmsg, read by a drain process with proof of origin and exact loss
(kmsg.py).  The registration: imported without the reader."""

from __future__ import annotations

from alarm.collectors.base import SourceType

# The drain's loss causes (kmsg_drain.py), each its own counter besides records_lost.
LOSS_CAUSES = {
    "overrun": "the kernel overwrote records before they were read (ring buffer overrun)",
    "resume": "records the kernel overwrote while the service was stopped (found at the resume point)",
    "drain_full": "records the drain dropped because the service fell too far behind",
    "unexplained": "sequence gaps the drain did not report",
}
COUNTERS = {f"lost_{c}": f"Records lost: {why}." for c, why in LOSS_CAUSES.items()}
SOURCE = SourceType(
    "kmsg",
    "alarm.collectors.kernel.settings:KmsgSettings",
    "alarm.collectors.kernel.kmsg:build",
    kind="egress",
    counters=COUNTERS,
    forgeable=True,
)
