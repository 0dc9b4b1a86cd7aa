"""Workload-controlled text (hostnames, paths, package names) made safe to show: no control
characters, bounded length.  Used wherever such text leaves the process (JSON, logs, alerts,
the status page), never as a metric label."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def sanitize(text: str, limit: int = 200) -> str:
    text = _CONTROL.sub("?", text)
    return text if len(text) <= limit else text[:limit] + "…"
