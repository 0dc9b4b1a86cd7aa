"""The pipeline failing over and over: counted, shown, and after a while a reason to stop.

A bug in one evaluation (or in counting one batch) must not stop the alarm: the tick is
logged, counted in ``capalarm_internal_errors_total`` and the next one tried; a source whose
batch could not be applied is restarted, from its position.  But a pipeline that fails every
time counts and judges nothing while it still answers scrapes, and looks alive: a broken
native extension after an upgrade did exactly that (0 ticks for an hour, a source restarted
every 30 s, nothing paged).  So once every call has failed for ``STOP_AFTER`` seconds (and at
least ``STOP_AFTER_CALLS`` times in a row) the service stops with exit status 1 and one line
naming the error: systemd or Kubernetes restart it, and a crash loop is what an operator and
the ``CapalarmDown`` rule see.  One call that works starts the count again; ticks and
batches are counted apart (the service keeps one run of each), since ticks that always fail
while batches count judge nothing either.
"""

from __future__ import annotations

from dataclasses import dataclass

STOP_AFTER = 300.0  # seconds of nothing but failures
STOP_AFTER_CALLS = 5


@dataclass(slots=True)
class FailureRun:
    """The failures of the pipeline's calls since the last one that worked."""

    total: int = 0  # every failure since start (capalarm_internal_errors_total)
    in_a_row: int = 0
    since: float = 0.0  # when the first of the run failed
    last: str = ""  # "ExceptionName: message" of the last

    def failed(self, exc: BaseException, now: float) -> None:
        self.total += 1
        if not self.in_a_row:
            self.since = now
        self.in_a_row += 1
        self.last = f"{type(exc).__name__}: {exc}"

    def worked(self) -> None:
        self.in_a_row = 0

    def why_stop(self, now: float) -> str:
        """Why the service must stop ("" to go on)."""
        if self.in_a_row < STOP_AFTER_CALLS or now - self.since < STOP_AFTER:
            return ""
        return (
            f"the pipeline failed {self.in_a_row} times in a row for {now - self.since:.0f} s, "
            f"so nothing was counted or judged (last: {self.last}); stopping"
        )
