"""Workload-controlled text (hostnames, paths, package names) made safe to show: no control
characters, bounded length.  Used wherever such text leaves the process (JSON, logs, alerts,
the status page), never as a metric label.

And, once, where such text enters (``shown``, ``shown_evidence``): no lone surrogate.  A
file name that is not UTF-8 comes from ``os.fsdecode`` with its bytes as surrogate escapes
(U+DC80-U+DCFF), and JSON may carry a lone ``\\ud800``; neither can be encoded as UTF-8, so
one of them among the contributors made the status page answer 500 and put text in the API
and the alerts that strict JSON readers reject.  An escaped byte is shown as ``\\xNN`` (what
``ls -b`` prints), any other lone surrogate as U+FFFD."""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def shown(text: str) -> str:
    """``text`` with every lone surrogate made visible (``\\xNN`` for a byte that was not
    UTF-8, U+FFFD for any other): encodable as UTF-8 whatever it came from."""
    if text.isascii():
        return text
    return _SURROGATE.sub(_surrogate, text)


def shown_evidence(value: Any) -> Any:
    """``shown`` applied to every string of an evidence record (keys, values, nested)."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown_evidence(k): shown_evidence(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown_evidence(v) for v in value]
    if isinstance(value, tuple):
        return tuple(shown_evidence(v) for v in value)
    return value


def sanitize(text: str, limit: int = 200) -> str:
    text = _CONTROL.sub("?", shown(text))
    return text if len(text) <= limit else text[:limit] + "…"
