"""The kernel family's settings: each kernel source type's ``sources:`` entry and the fence
canary's ``egress_canary:``.  A leaf module (pydantic only): the config reads these models
without importing a reader, and each type's registration (``*_type.py``) names its model here.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator, model_validator

from alarm.collectors.base import SourceSettings
from alarm.settings import Duration, Strict


class KernelSettings(SourceSettings):
    """What every kernel source has: the log prefixes that mark fence records."""

    prefixes: list[str] = Field(default_factory=lambda: ["EGRESS_FENCE"], min_length=1)


class AutoSettings(KernelSettings):
    type: Literal["auto"] = "auto"
    kmsg_path: str = "/dev/kmsg"
    start_at_end: bool = True
    nice: int = Field(-10, ge=-20, le=19)


class KmsgSettings(KernelSettings):
    """``type: kmsg``: /dev/kmsg, with proof of origin and exact loss."""

    type: Literal["kmsg"]
    kmsg_path: str = "/dev/kmsg"
    start_at_end: bool = True  # first start without saved state: skip what is already logged
    # Drain process priority; the kernel ring buffer gives a reader little slack.
    nice: int = Field(-10, ge=-20, le=19)


class JournaldSettings(KernelSettings):
    """``type: journald``: kernel records through journalctl, where /dev/kmsg is closed."""

    type: Literal["journald"]
    journal_directory: str | None = None  # read journal files there (-D) instead of the system's


class FileSettings(KernelSettings):
    """``type: file``: text kernel logs, followed across rotation and truncation."""

    type: Literal["file"]
    paths: list[str] = Field(min_length=1)  # paths or globs
    format: Literal["auto", "syslog", "dmesg", "kmsg"] = "auto"
    # First start without saved state: skip what the files already hold.  Off by default: a
    # file is a record, and what it holds is evaluated tick by tick on its own timestamps.
    start_at_end: bool = False
    poll_interval: float = Field(0.25, gt=0, le=60)

    @model_validator(mode="after")
    def _paths_given(self) -> FileSettings:
        if not all(p.strip() for p in self.paths):
            raise ValueError("paths: an empty path matches nothing")
        return self


class EgressCanarySettings(Strict):
    """``egress_canary:`` in the config (off when absent)."""

    address: str
    port: int = Field(9, ge=1, le=65535)  # 9: the discard service
    interval: Duration = Field(60.0, ge=0.1)
    deadline: Duration = Field(30.0, gt=0)
    # A network namespace under /run/netns (``ip netns add NAME``) to send from; None: the
    # service's own namespace.
    netns: str | None = Field(None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
    source_ports: tuple[int, int] = (61000, 61999)
    # Kernel sources that must read the canaries (default: every kernel source).
    sources: list[str] = []

    @field_validator("address")
    @classmethod
    def _ip(cls, value: str) -> str:
        try:
            return ipaddress.ip_address(value).compressed
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 or IPv6 address") from None

    @field_validator("source_ports")
    @classmethod
    def _port_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        lo, hi = value
        if not 1 <= lo <= hi <= 65535:
            raise ValueError("[low, high] with 1 <= low <= high <= 65535")
        return value
