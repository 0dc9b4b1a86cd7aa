"""``type: fs``: the configuration users write.

```yaml
sources:
  - {name: scratch-watch, type: fs, paths: [/srv/scratch, /var/cache/pip]}
  - name: caches
    type: fs
    paths: [/var/cache/pip]
    mode: auto            # auto | fanotify | inotify | poll
    poll_interval: 5s     # poll mode's rounds; every mode checks its tree roots this often
    settle: 500ms         # a new file is counted this long after it appeared, where it is then
    canary: {interval: 60s, deadline: 30s}
    receipts: {sha256_budget_bytes: 64MiB, sha256_max_files: 256}   # per tick
```
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from alarm.collectors.base import SourceSettings
from alarm.settings import Duration, Strict

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_bytes(value: Any) -> int:
    """'64MiB', '1.5GB', '512k', 4096 -> bytes (KiB/MiB/GiB/TiB are powers of 1024)."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 64MiB")
    if isinstance(value, int):
        n = value
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a size like 64MiB, 512k, 4096")
        unit = (match.group(2) or "").lower()
        base = unit[:1]
        scale = 1024 ** "bkmgt".index(base) if "i" in unit else _UNITS[base]
        n = int(float(match.group(1)) * scale)
    if n < 0:
        raise ValueError("a size cannot be negative")
    return n


ByteSize = Annotated[int, BeforeValidator(parse_bytes)]


class CanarySettings(Strict):
    interval: Duration = Field(60.0, gt=0)
    deadline: Duration = Field(30.0, gt=0)


class ReceiptSettings(Strict):
    """sha256 of the largest writes, within a budget per tick."""

    sha256_budget_bytes: ByteSize = 64 << 20
    sha256_max_files: int = Field(256, ge=0)


class FsSettings(SourceSettings):
    """``type: fs``: every byte written into directory trees."""

    type: Literal["fs"]
    paths: list[str] = Field(min_length=1)
    mode: Literal["auto", "fanotify", "inotify", "poll"] = "auto"
    poll_interval: Duration = Field(5.0, ge=0.05, le=3600)
    settle: Duration = Field(0.5, ge=0, le=60)
    canary: CanarySettings | None = None
    receipts: ReceiptSettings = ReceiptSettings()
    # Events held in memory between the reader thread and a step; beyond it the kernel's
    # queue overflows, which is counted and repaired by a reconcile scan.
    queue_limit: int = Field(1 << 18, ge=1024)

    @field_validator("paths")
    @classmethod
    def _trees(cls, values: list[str]) -> list[str]:
        out: list[str] = []
        for v in values:
            if not v.startswith("/"):
                raise ValueError(f"{v!r} is not an absolute path")
            if "\0" in v:
                raise ValueError(f"{v!r} contains a NUL byte")
            out.append(os.path.normpath(v))
        for a in out:
            for b in out:
                if a != b and (b.startswith(a.rstrip("/") + "/") or a == "/"):
                    raise ValueError(f"{b} is inside {a}: list each tree once")
        if len(set(out)) != len(out):
            raise ValueError("a path is listed twice")
        return out

    @model_validator(mode="after")
    def _canary_sees_a_poll(self) -> FsSettings:
        c = self.canary
        if c is not None and self.mode == "poll" and c.deadline <= self.poll_interval:
            raise ValueError(
                "canary.deadline must exceed poll_interval in poll mode (a poll round is how "
                "the canary is seen)"
            )
        return self
