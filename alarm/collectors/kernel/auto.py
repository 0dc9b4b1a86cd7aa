"""``type: auto``: /dev/kmsg where it can be read, else journald.  The default source of the
embedded config (and of the Helm chart).

Falling back is not seeing: where /dev/kmsg is closed and no journal can be read either (no
journalctl, no journal files, no permission), the journald collector says so — blind, not
up, the reason in one line, beginning with why /dev/kmsg was not read — instead of following
an empty journal for ever.  ``health.mode`` names the backend used: ``kmsg`` or ``journald``."""

from __future__ import annotations

import os

from alarm.collectors.base import Collector, SourceContext
from alarm.collectors.kernel import journald, kmsg
from alarm.collectors.kernel.settings import AutoSettings, JournaldSettings, KmsgSettings


def open_error(path: str) -> str:
    """ "" when ``path`` can be opened for reading; else why not."""
    # os.access is not enough: reading /dev/kmsg also needs CAP_SYSLOG when dmesg_restrict=1.
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return ""


def can_open(path: str) -> bool:
    return not open_error(path)


def build(cfg: AutoSettings, ctx: SourceContext) -> Collector:
    why = open_error(cfg.kmsg_path)
    if not why:
        settings = KmsgSettings(**{**cfg.model_dump(), "type": "kmsg"})
        return kmsg.build(settings, ctx)
    # Whether the journal can be read is the journald collector's to find out, and to say
    # (blind) for as long as it cannot: a missing journalctl too, so that the service runs
    # and alarms instead of refusing to start on the chart's default.
    collector = journald.build(
        JournaldSettings(name=cfg.name, prefixes=cfg.prefixes, type="journald"), ctx
    )
    collector.blind_prefix = (
        f"cannot read {cfg.kmsg_path} ({why}; needs root or CAP_SYSLOG), nor the journal: "
    )
    return collector
