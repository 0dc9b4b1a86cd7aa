"""Kernel log records as the collectors hand them over, before any netfilter parsing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class KernelRecord:
    """One kernel log record.

    ``ts`` is unix seconds when the source knows wall time (kmsg with the boot time added,
    journald, syslog), otherwise seconds since boot (dmesg text).  ``facility`` is ``None``
    when the source cannot tell who wrote the record (dmesg text, plain files).  ``trusted``
    is True only when the source proved kernel origin: /dev/kmsg facility 0 or journald
    ``_TRANSPORT=kernel``.  ``message`` is the text after the record header, without newline.
    """

    ts: float
    message: str
    facility: int | None = None
    seq: int | None = None
    trusted: bool = False
