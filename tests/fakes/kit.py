"""Drive exporters/notify.py directly: alert changes in, the real outbox and workers running.

Nothing here starts the service, so the notification tests run whatever state the pipeline is
in."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from alarm.config import config_from_dict
from alarm.detector.alerts import AlertChange, fingerprint
from exporters.notify import Notifications


def change(
    target: str = "registry-proxy",
    rule: str = "spike",
    state: str = "firing",
    *,
    at: float | None = None,
    started_at: float | None = None,
    kind: str = "egress",
    target_type: str = "surface",
    contributors: list[tuple[str, int]] | None = None,
) -> AlertChange:
    at = time.time() if at is None else at
    figures = {
        "rate_bytes_per_second": 24000.0,
        "events_per_second": 40.0,
        "baseline_bytes_per_second": 1200.0,
        "threshold_bytes_per_second": 3600.0,
        "capacity_bits_per_second": 194560.0,
        "budget_excess_bits": 0.0 if rule == "spike" else 81920.0,
        "budget_allowance_bits_per_second": 1e6 if rule == "spike" else 800.0,
        "budget_tolerance_bits": 64e6 if rule == "spike" else 16000.0,
    }
    return AlertChange(
        fingerprint=fingerprint(f"{kind}/{target}", rule),
        target_type=target_type,
        target=target,
        kind=kind,
        rule=rule,
        state=state,
        previous="inactive" if state == "firing" else "firing",
        at=at,
        started_at=at - 10 if started_at is None else started_at,
        value=24000.0,
        threshold=3600.0,
        figures=figures,
        contributors=contributors if contributors is not None else [("10.20.1.10:443/tcp", 240000)],
        summary=f"{kind} surface {target} wrote 24,000 B/s against a baseline of 1,200 B/s",
    )


def learning_change() -> AlertChange:
    """A spike on a surface still learning its own threshold, fired by its absolute floor:
    the detector has no calibrated threshold (figure 0) and budget tolerances that are not
    finite numbers, which an alert document writes as null."""
    c = change()
    c.threshold = 60_000.0
    c.figures["threshold_bytes_per_second"] = 0.0
    c.figures["budget_tolerance_bits"] = float("inf")
    c.figures["budget_seasonal"] = {"judged": False, "tolerance_score": float("inf")}
    return c


# Delivery tests check when each change is sent, so resolves go out at once unless a test
# sets ``flap`` itself; the default (a resolve held ten minutes so that a flap is one page) is
# tested in test_outbox.py on a config built without this helper.
PROMPT_RESOLVES = {"reopen_window": "0s"}


def notify_config(state_dir: Path, notifications: dict[str, Any], **extra: Any) -> Any:
    notifications = {"flap": PROMPT_RESOLVES, **notifications}
    return config_from_dict(
        {
            "state_dir": str(state_dir),
            "http": {"listen": "127.0.0.1:9733"},
            "notifications": notifications,
            **extra,
        }
    )


@contextlib.asynccontextmanager
async def running_notifications(
    state_dir: Path, notifications: dict[str, Any], **extra: Any
) -> AsyncIterator[Notifications]:
    n = Notifications(notify_config(state_dir, notifications, **extra))
    task = asyncio.create_task(n.run())
    try:
        await asyncio.sleep(0)
        yield n
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        n.close()


async def record(n: Notifications, *changes: AlertChange) -> int:
    """As the service does: stored on another thread, then the workers are woken."""
    queued = await asyncio.to_thread(n.record, list(changes))
    n.wake()
    return queued


async def wait_for(
    predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.1
) -> Any:
    """Poll ``predicate`` (a function or a coroutine function) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
