"""``type: auto``: /dev/kmsg where it can be read, else journald, else a clear error naming
what to do.  The default source of the embedded config."""

from __future__ import annotations

import os
import shutil
from typing import Literal

from pydantic import Field

from alarm.collectors.base import Collector, SourceContext, SourceType, SourceUnavailable
from alarm.collectors.kernel import journald, kmsg
from alarm.collectors.kernel.fence import KernelSettings


def can_open(path: str) -> bool:
    # os.access is not enough: reading /dev/kmsg also needs CAP_SYSLOG when dmesg_restrict=1.
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


class AutoSettings(KernelSettings):
    type: Literal["auto"] = "auto"
    kmsg_path: str = "/dev/kmsg"
    start_at_end: bool = True
    nice: int = Field(-10, ge=-20, le=19)


def build(cfg: AutoSettings, ctx: SourceContext) -> Collector:
    if can_open(cfg.kmsg_path):
        settings = kmsg.KmsgSettings(**{**cfg.model_dump(), "type": "kmsg"})
        return kmsg.build(settings, ctx)
    if shutil.which("journalctl"):
        keep = {"name": cfg.name, "prefixes": cfg.prefixes, "type": "journald"}
        return journald.build(journald.JournaldSettings(**keep), ctx)
    raise SourceUnavailable(
        f"source {cfg.name!r}: cannot read {cfg.kmsg_path} (run as root or grant CAP_SYSLOG) "
        "and journalctl is not installed; configure a file source (type: file) instead"
    )


SOURCE = SourceType(
    "auto",
    AutoSettings,
    build,
    kind="egress",
    counters={**kmsg.SOURCE.counters, **journald.SOURCE.counters},
    forgeable=True,
)
