"""The one poller every registry adapter runs under: schedule, first-poll learning, event time,
batches, proof of sight.

An adapter knows one API; each poll it is handed a :class:`Cycle` and reports what it found
(``cycle.found``), what it now knows (``cycle.index``, ledger rows) and where it is
(``cycle.state``, a small JSON dict saved in the source's position).  The poller does the rest:

- **First poll learns.**  On a first start (no saved position, or one saved for another API
  or URL) the first complete poll records the registry's current state without counting it
  (``baseline_artifacts``): no alarm storm at start.
- **Event time.**  An artifact counts at its own upload time where the API gives one, clamped
  into [start of the previous complete poll, now]: after a restart the saved start of the last
  poll is the lower bound, so uploads made while the service was down are counted at their
  own times in the outage window; in steady state nothing lands in a tick that has already
  closed; a registry clock ahead of ours is cut back to now.  Without an upload time, now.
- **Batches** carry events, counter deltas, ledger rows and (with them) the adapter's state,
  so a crash between two batches neither loses nor repeats an artifact.  Big polls are handed
  over in chunks (``checkpoint``).
- **Counted once.**  What was counted is remembered by fingerprint (recent.py, saved in the
  position), so an item that drops out of a listing and comes back unchanged (a lagging
  replica) is not counted again (``items_reappeared``).
- **Proof of sight.**  ``health.last_success_at`` at the end of every complete poll, ``up``
  and ``caught_up`` with it, ``watermark`` = the poll's start (every upload before it has been
  seen; ``health.poll_interval`` tells the pipeline to hold ticks there until the next poll,
  not at "now", so what that poll lists counts in its own tick); a failed poll is
  ``health.failed`` and ``up = False`` (it holds no ticks).  While the last successful
  poll (or, before the first, the start) is older than ``blind_after``, ``health.blind`` says
  so: the service's ``surface_blind`` alarm.  A timer of its own sets it, because the poll
  that should have succeeded may be the one that hangs (retries, ``Retry-After``).  With
  ``canary:`` the canary is a second cause of the same blindness (canary.py, sight.py), and
  the artifacts it uploads are recognised here and never counted as writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Protocol

from alarm.collectors.registry.canary import RegistryCanary
from alarm.collectors.registry.http import GarbageResponse, PollError, RegistryClient, RetryLater
from alarm.collectors.registry.listing import ArtifactIndex
from alarm.collectors.registry.paging import PageTrail
from alarm.collectors.registry.recent import RecentlyCounted, fingerprint
from alarm.collectors.registry.settings import RegistryBase
from alarm.collectors.registry.sight import Sight, age_text, shown_url
from alarm.collectors.registry.uploads import Credential
from alarm.events import Batch, Emit, Event, SourceHealth, WriteEvents
from alarm.logs import error_text
from alarm.patterns import Pattern
from alarm.sanitize import sanitize

log = logging.getLogger("capalarm.registry")

POSITION_VERSION = 1
BLIND_RECHECK = 60.0  # while blind, how often the message's age is brought up to date (s)
FLUSH_EVENTS = 2000  # events per batch, so a huge first-after-outage poll is handed over in parts
FLUSH_LEDGER_ROWS = 500
EVIDENCE_TEXT_LIMIT = 300
# The largest size believed of one artifact, edit or post: a pebibyte, far beyond anything a
# registry stores, yet small enough that the detector's int64 sums of thousands of them cannot
# overflow.  A listing claiming more is lying or broken: the item is counted as a parse error.
MAX_ARTIFACT_BYTES = 1 << 50
# Upload times are believed within datetime's range (years 1..9999); outside it a time cannot
# even be written as ISO 8601, so it is taken as unknown (the artifact counts at "now").
MIN_TIMESTAMP, MAX_TIMESTAMP = -62135596800.0, 253402300799.0

# The counters this module keeps are declared with the source type (registry_type.py).


class Adapter(Protocol):
    """One registry API."""

    async def poll(self, cycle: Cycle) -> None:
        """One complete look at the registry.  Raise :class:`PollError` when it cannot be
        completed; unexpected shapes of data are a :class:`PollError` too (garbage)."""
        ...


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def parse_time(value: Any) -> float | None:
    """ISO 8601 (``Z`` or an offset; naive is UTC) or unix seconds (or ms when huge)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        try:
            ts = float(value)
        except OverflowError:  # an int beyond float's range: no time at all
            return None
        ts = ts / 1000.0 if ts > 1e11 else ts
        return ts if MIN_TIMESTAMP <= ts <= MAX_TIMESTAMP else None  # NaN fails both
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        return dt.timestamp()
    except (OverflowError, ValueError):  # year 1 or 9999 shifted out of range by its offset
        return None


def _plausible_size(nbytes: int | None) -> bool:
    """None (unknown) or a byte count one artifact can have."""
    return nbytes is None or 0 <= nbytes <= MAX_ARTIFACT_BYTES


class Cycle:
    """One poll's working set, as the adapter sees it."""

    def __init__(
        self,
        poller: RegistryPoller,
        client: RegistryClient,
        emit: Emit,
        started: float,
    ):
        self.poller = poller
        self.client = client
        self.settings = poller.settings
        self.index = poller.index
        self.state: dict[str, Any] = poller.state
        self.learning = poller.learning
        self.counts = poller.counts
        self.since = poller.since  # start of the previous complete poll (0: none)
        self.started = started
        self._emit = emit
        self._events: list[Event] = []

    def wanted(self, repository: str) -> bool:
        return self.poller.wanted(repository)

    def pages(self, what: str, loop: str = "pagination loops") -> PageTrail:
        """The trail of one paged listing in this poll (paging.py): bounded, loop-proof;
        ``loop`` is what a repeated page is called in the poll's error."""
        s = self.settings
        return PageTrail(what, s.max_pages, s.max_url_bytes, self.counts, loop)

    def stamp(self, uploaded_at: float | None) -> float:
        now = time.time()
        if uploaded_at is None:
            return now
        return min(max(uploaded_at, self.since or uploaded_at), now)

    def found(
        self,
        repository: str,
        artifact: str,
        nbytes: int | None,
        *,
        label: str,
        uploaded_at: float | None = None,
        uploader: str | None = None,
        capacity: int | None = None,
        receipt: dict[str, Any] | None = None,
        events: int = 1,  # that many writes, of nbytes together (posts never seen)
    ) -> None:
        """A new artifact, edit or post.  In the learning poll it is only counted as the
        starting state; one of this source's canaries is counted apart (canary.py).  One
        whose size is out of range (negative, or over :data:`MAX_ARTIFACT_BYTES`) is one
        ``parse_errors``, not an event: the index already holds it, so it is counted once,
        and the poll, the batch and every later poll go on as if it were not listed."""
        if self.learning:
            self.counts["baseline_artifacts"] += 1
            return
        canary = self.poller.canary
        if canary is not None:
            digest = (receipt or {}).get("digest")
            if canary.claim(repository, artifact, digest if isinstance(digest, str) else None):
                return
        if not (_plausible_size(nbytes) and _plausible_size(capacity)):
            self.counts["parse_errors"] += 1
            return
        # A listing that dropped this very artifact and lists it again (recent.py) is not a
        # second write; one changed in any way the API tells is.
        now = time.time()
        key = fingerprint(repository, artifact, nbytes, capacity, uploaded_at, receipt)
        if self.poller.recent.seen_again(key, now):
            self.counts["items_reappeared"] += 1
            return
        self.poller.recent.remember(key, now)
        if nbytes is None:
            self.counts["sizes_unknown"] += 1
        size = max(0, int(nbytes or 0))
        evidence: dict[str, Any] = {
            "source": self.poller.name,
            "repository": sanitize(repository, EVIDENCE_TEXT_LIMIT),
            "artifact": sanitize(artifact, EVIDENCE_TEXT_LIMIT),
            "bytes": size if nbytes is not None else None,
            "uploaded_at": iso(uploaded_at),
        }
        if uploader:
            evidence["uploader"] = sanitize(uploader, EVIDENCE_TEXT_LIMIT)
        for k, v in (receipt or {}).items():
            if v is not None:
                evidence[k] = sanitize(v, EVIDENCE_TEXT_LIMIT) if isinstance(v, str) else v
        contributor = label + (f" by {uploader}" if uploader else "")
        self._events.append(
            Event(
                ts=self.stamp(uploaded_at),
                key=(repository, artifact),
                nbytes=size,
                events=max(1, events),
                contributor=sanitize(contributor, EVIDENCE_TEXT_LIMIT),
                evidence=evidence,
                capacity=None if capacity is None else max(size, int(capacity)),
            )
        )

    async def checkpoint(self, force: bool = False) -> None:
        """Hand over what was found so far, with the state and ledger rows that go with it,
        once there is enough of it (or now: ``force``).  Call it only where ``state`` and
        the index describe exactly the artifacts reported so far."""
        if (
            force
            or len(self._events) >= FLUSH_EVENTS
            or len(self.index.changed) >= FLUSH_LEDGER_ROWS
        ):
            await self.flush(final=False)

    async def flush(self, *, final: bool) -> None:
        events, self._events = self._events, []
        await self.poller.hand_over(self._emit, events, final=final, started=self.started)


class RegistryPoller:
    """The collector of one ``type: registry`` source."""

    def __init__(
        self,
        settings: RegistryBase,
        adapter: Adapter,
        position: dict[str, Any] | None,
        ledger: Callable[[], Iterable[tuple[str, str]]],
        authorization: Any = None,
        canary: Credential | None = None,
    ):
        self.name = settings.name
        self.settings = settings
        self.adapter = adapter
        self.authorization = authorization
        # A poller: the pipeline holds ticks at the start of its last successful poll (the
        # watermark it hands over), not at "now", while its next poll is due (eventtime.py).
        self.health = SourceHealth(poll_interval=settings.interval)
        self.sight = Sight(self.health)
        self.counts: Counter[str] = Counter()
        # Set once a poll has learned the registry (or a saved position says one had): the
        # canary uploads only from then on.
        self.learned = asyncio.Event()
        self.canary: RegistryCanary | None = None
        if settings.canary is not None:
            self.canary = RegistryCanary(
                settings, canary or Credential(), self.counts, self.health, self.sight
            )
        self.index = ArtifactIndex()
        # What was counted lately, saved in the position with the state it goes with.
        self.recent = RecentlyCounted()
        self._patterns = tuple(Pattern.compile(p) for p in settings.packages)
        self.lag = 0.0  # how late the last poll started against its schedule (s)
        # Until the first successful poll, sight is counted from when the source was built
        # (not from each run: a collector that fails and is restarted must still go blind).
        self.watching_since = time.time()
        self._url_shown = shown_url(settings.url)
        ours = (
            isinstance(position, dict)
            and position.get("v") == POSITION_VERSION
            and position.get("api") == self.api
            and position.get("url") == settings.url
        )
        if ours:
            assert position is not None
            self.learning = False
            self.since = float(position.get("since") or 0.0)
            self.state = dict(position.get("state") or {})
            self.not_before = float(position.get("not_before") or 0.0)
            self.index.load(ledger())
            self.recent.restore(position.get("counted"))
            self.counts["ledger_rows_invalid"] += self.index.bad_rows
            if self.canary is not None:
                self.canary.canaries.restore(position.get("canaries"))
            self.learned.set()
        else:
            self.learning = True
            self.since = 0.0
            self.state = {}
            self.not_before = 0.0
            # Rows saved for another registry or API describe nothing here.
            for key, _ in ledger():
                self.index.changed[key] = None

    @property
    def api(self) -> str:
        return str(getattr(self.settings, "api", ""))

    def wanted(self, repository: str) -> bool:
        return not self._patterns or any(p.matches(repository) for p in self._patterns)

    def position(self) -> dict[str, Any]:
        out = {
            "v": POSITION_VERSION,
            "api": self.api,
            "url": self.settings.url,
            "since": self.since,
            "not_before": self.not_before,
            "state": self.state,
            "counted": self.recent.to_json(),
        }
        if self.canary is not None:
            out["canaries"] = self.canary.canaries.unseen()
        return out

    async def hand_over(
        self, emit: Emit, events: list[Event], *, final: bool, started: float
    ) -> None:
        if final:
            self.since = started
        counts = {k: n for k, n in self.counts.items() if n}
        self.counts.clear()
        ledger = self.index.take_changes()
        # Learning polls save no position until complete: a restart mid-way learns again.
        position = None if (self.learning and not final) else self.position()
        await emit(
            Batch(
                WriteEvents.of("registry", events) if events else None,
                counts,
                position,
                watermark=started if final else None,
                ledger=ledger or None,
            )
        )

    def client(self) -> RegistryClient:
        """The HTTP client this source polls with (an async context manager)."""
        return RegistryClient(self.settings, self.counts, self.authorization)

    async def run(self, emit: Emit) -> None:
        sight = asyncio.create_task(self.watch_sight(), name=f"registry {self.name}: sight")
        helpers = [sight]
        if self.canary is not None:
            helpers.append(
                asyncio.create_task(
                    self.canary.run(self.learned), name=f"registry {self.name}: canary"
                )
            )
        try:
            async with self.client() as client:
                next_at = time.time()
                while True:
                    wait = max(next_at, self.not_before) - time.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    started = time.time()
                    self.lag = max(0.0, started - next_at)
                    next_at = max(next_at + self.settings.interval, started)
                    await self.poll_once(client, emit, started)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.wait(helpers)

    def blind_for(self, now: float) -> float | None:
        """How long the source has gone without a successful poll, once that is longer than
        ``blind_after``; None while it sees."""
        age = now - max(self.health.last_success_at, self.watching_since)
        return age if age >= self.settings.blind_seconds else None

    async def watch_sight(self) -> None:
        """Keep ``health.blind`` true to the age of the last successful poll: set at the
        moment it passes ``blind_after`` (whatever the poll is doing then), its age brought up
        to date while it lasts; a successful poll clears it (``poll_once``)."""
        after = self.settings.blind_seconds
        health = self.health
        while True:
            now = time.time()
            age = self.blind_for(now)
            if age is None:
                self.sight.set("poll", "")
                seen = max(health.last_success_at, self.watching_since)
                await asyncio.sleep(max(0.01, seen + after - now))
                continue
            self.sight.set("poll", f"no successful poll of {self._url_shown} for {age_text(age)}")
            await asyncio.sleep(min(after, BLIND_RECHECK))

    async def poll_once(self, client: RegistryClient, emit: Emit, started: float) -> bool:
        client.begin_poll()
        cycle = Cycle(self, client, emit, started)
        try:
            if self.canary is None:
                await self.adapter.poll(cycle)
            else:
                async with self.canary.lock:  # no canary is half-uploaded while listing
                    await self.adapter.poll(cycle)
        except asyncio.CancelledError:
            raise
        except PollError as exc:
            if isinstance(exc, GarbageResponse):
                self.counts["garbage_responses"] += 1
            if isinstance(exc, RetryLater):
                self.not_before = exc.not_before
            await self._failed(cycle, str(exc))
            return False
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as exc:
            # A shape of data the adapter did not expect: a lying or broken server.
            self.counts["garbage_responses"] += 1
            # The class alone ("KeyError") does not say which key or value was wrong.
            await self._failed(cycle, f"unexpected data: {error_text(exc)}")
            return False
        self.counts["polls"] += 1
        await cycle.flush(final=True)
        self.learning = False
        now = time.time()
        self.health.up = True
        self.health.caught_up = True
        self.health.last_success_at = now
        self.sight.set("poll", "")
        self.health.read_seconds = now - started
        self.learned.set()
        return True

    async def _failed(self, cycle: Cycle, message: str) -> None:
        self.counts["poll_errors"] += 1
        now = time.time()
        self.health.failed(f"{self.name}: {message}", now)
        self.health.up = False
        self.health.caught_up = False
        self.health.read_seconds = now - cycle.started
        log.warning("registry source %s: poll failed: %s", self.name, message)
        # What was found is consistent with the state and index as they stand (adapters
        # update them together): hand it over, so the next poll does not find it again.
        await cycle.flush(final=False)
