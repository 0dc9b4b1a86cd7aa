"""Proof of sight by upload: every ``canary.interval`` one tiny artifact, named for that round
only, is uploaded through the registry's own upload API (uploads.py) with the canary's own
credentials, and a later poll must list it within ``canary.deadline``.

What it proves that a successful poll does not: that what the polls read is current and
complete — not a cache that stopped refreshing, a replica that stopped replicating, an index
behind a filter or a proxy that hides new uploads, an upload path that goes somewhere the
polls do not look.  A canary not listed in time is ``canary_missed`` and the source blind
(``canary not seen within <deadline>: ...``, the service's ``surface_blind`` through the same
``health.blind`` as an old poll: sight.py); so are uploads that fail ``FAILURES_BLIND`` times
in a row (``canary upload failed ...``).  A canary listed within its deadline clears it.

The canary is never a write: :meth:`RegistryCanary.claim` recognises it when the poll
reports it and it is counted apart (``canary_seen``).  Only the exact repository, artifact
and digest this process generated are recognised (the last ``RECENT``): a workload's upload
named like a canary, or one that overwrote a canary's name with other content, is counted as
the write it is.  Canaries not yet listed are saved with the source's position, so one
uploaded just before a restart is still recognised after it.

Uploads begin once the first poll has learned the registry (a canary listed by the learning
poll would be starting state, never seen), and never run while a poll lists the registry
(``lock``, which the poller holds while it lists): a poll that listed the canary between the
server storing it and its answer arriving would not know it yet, and count it as a write.
Where the name and digest are known before the upload they are remembered before it is sent,
so a canary stored by a server whose answer was lost is still recognised.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from alarm.collectors.registry.http import PollError, RegistryClient
from alarm.collectors.registry.settings import RegistryBase
from alarm.collectors.registry.sight import Sight, age_text, shown_url
from alarm.collectors.registry.uploads import PUBLISHERS, Credential, Target, Upload
from alarm.events import SourceHealth
from alarm.logs import error_text

log = logging.getLogger("capalarm.registry")

RECENT = 256  # canaries remembered (recognised when listed)
FAILURES_BLIND = 2  # uploads failed in a row that make the source blind
SAVED = 64  # canaries not yet listed, saved with the position

# The counters this module keeps are declared with the source type (registry_type.py).


@dataclass(slots=True)
class Sent:
    upload: Upload
    uploaded_at: float
    seen_at: float | None = None
    # Not to be judged (again): missed, superseded by a later canary under the same name,
    # restored from a saved position, or an upload that failed (recognised, never missed).
    judged: bool = False


class Canaries:
    """The canaries uploaded (the last ``RECENT``), by the (repository, artifact) a poll
    reports them under; which were listed, and which are overdue.  No I/O."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._order: deque[Sent] = deque()
        self._by_name: dict[tuple[str, str], list[Sent]] = {}

    def __len__(self) -> int:
        return len(self._order)

    def add(self, sent: Sent) -> None:
        if len(self._order) == RECENT:
            old = self._order.popleft()
            key = (old.upload.repository, old.upload.artifact)
            same = self._by_name[key]
            same.remove(old)
            if not same:
                del self._by_name[key]
        self._order.append(sent)
        self._by_name.setdefault((sent.upload.repository, sent.upload.artifact), []).append(sent)

    def claim(self, repository: str, artifact: str, digest: str | None) -> Sent | None:
        """The canary a poll reports under this name, or None: not ours.  Where both the
        canary and the poll have a digest they must be equal (a canary's name overwritten
        with other content is a write)."""
        for sent in reversed(self._by_name.get((repository, artifact), ())):
            theirs = sent.upload.digest
            if theirs is None or digest is None or theirs == digest:
                return sent
        return None

    def supersede(self, seen: Sent) -> None:
        """Earlier canaries under the same name (an image tag pushed again) are replaced by
        the one listed: not missed."""
        for sent in self._by_name.get((seen.upload.repository, seen.upload.artifact), ()):
            if sent is seen:
                break
            if sent.seen_at is None:
                sent.judged = True

    def overdue(self, now: float) -> list[Sent]:
        """Canaries not listed within the deadline, each returned once."""
        late = [
            s
            for s in self._order
            if not s.judged and s.seen_at is None and now > s.uploaded_at + self.deadline
        ]
        for s in late:
            s.judged = True
        return late

    def next_deadline(self) -> float | None:
        waiting = [s.uploaded_at for s in self._order if not s.judged and s.seen_at is None]
        return min(waiting) + self.deadline if waiting else None

    def unseen(self) -> list[list[Any]]:
        """The canaries not yet listed (the newest ``SAVED``), for the position."""
        rows = [
            [
                s.upload.repository,
                s.upload.artifact,
                s.upload.digest,
                s.upload.nbytes,
                s.uploaded_at,
            ]
            for s in self._order
            if s.seen_at is None
        ]
        return rows[-SAVED:]

    def restore(self, rows: Any) -> None:
        for row in rows if isinstance(rows, list) else ():
            try:
                repository, artifact, digest, nbytes, at = row
                upload = Upload(str(repository), str(artifact), digest and str(digest), int(nbytes))
                self.add(Sent(upload, float(at), judged=True))
            except (TypeError, ValueError):
                continue  # a row this version cannot read: that canary would count, once


class RegistryCanary:
    """The canary of one registry source: uploads on its schedule, judges what the polls
    listed, and sets the source's ``canary`` blindness (sight.py)."""

    def __init__(
        self,
        settings: RegistryBase,
        credential: Credential,
        counts: Counter[str],
        health: SourceHealth,
        sight: Sight,
    ) -> None:
        canary = settings.canary
        assert canary is not None
        url = settings.canary_upload_url()
        assert url is not None  # the settings' validator made sure
        self.settings = settings
        self.name = settings.name
        self.interval = canary.interval
        self.deadline = settings.canary_deadline
        self.repository = canary.repository
        self.url = url
        self.credential = credential
        self.publish = PUBLISHERS[str(getattr(settings, "api", ""))]
        self.counts = counts
        self.health = health
        self.sight = sight
        self.canaries = Canaries(self.deadline)
        self.failures = 0  # uploads failed in a row
        self.last_error = ""
        # Held while a canary is uploaded, and by the poller while it lists the registry.
        self.lock = asyncio.Lock()

    # -- what the polls report ---------------------------------------------------------
    def claim(self, repository: str, artifact: str, digest: str | None) -> bool:
        """Whether the artifact a poll found is one of this source's canaries (then it is
        not a write).  A canary listed within its deadline proves sight: clears the blind."""
        sent = self.canaries.claim(repository, artifact, digest)
        if sent is None:
            return False
        if sent.seen_at is None:
            now = time.time()
            sent.seen_at = now
            self.counts["canary_seen"] += 1
            self.canaries.supersede(sent)
            if not sent.judged and now <= sent.uploaded_at + self.deadline:
                self.sight.set("canary", "")
        return True

    # -- uploads -------------------------------------------------------------------------
    def client(self) -> RegistryClient:
        """A client for one round: the canary's credential, to the upload URL's origin only;
        a fresh session (and cookie jar, for a wiki login) each time."""
        return RegistryClient(
            self.settings,
            self.counts,
            self.credential.header,
            home=self.url,
            cookies=self.credential.login is not None,
        )

    def serial(self, now: float) -> str:
        """This round's unique part: a version number PEP 440 and semver both accept."""
        return f"0.{int(now)}.{secrets.randbelow(10**9)}"

    async def upload_once(self) -> Upload | None:
        """One canary; None when the upload failed (counted, and blind once it keeps
        failing)."""
        target = Target(self.url, self.repository, self.serial(time.time()), self.credential)
        announced: list[Sent] = []

        def expect(upload: Upload) -> None:
            sent = Sent(upload, time.time(), judged=True)  # judged once the upload is done
            self.canaries.add(sent)
            announced.append(sent)

        async with self.lock:
            try:
                async with self.client() as client:
                    upload = await self.publish(client, target, expect)
            except asyncio.CancelledError:
                raise
            except PollError as exc:
                self._failed(str(exc))
                return None
            except Exception as exc:  # a server's odd answer must not stop the canary
                log.exception("registry source %s: canary upload", self.name)
                self._failed(f"unexpected: {error_text(exc)}")
                return None
            # The deadline runs from the confirmed upload: a poll from now on may list it.
            if announced and announced[-1].upload == upload:
                announced[-1].uploaded_at = time.time()
                announced[-1].judged = False
            else:
                self.canaries.add(Sent(upload, time.time()))
        self.counts["canary_uploaded"] += 1
        self.failures = 0
        return upload

    def _failed(self, why: str) -> None:
        self.counts["canary_upload_errors"] += 1
        self.failures += 1
        self.last_error = why
        now = time.time()
        self.health.failed(f"{self.name}: canary upload failed: {why}", now)
        log.warning("registry source %s: canary upload failed: %s", self.name, why)
        if self.failures >= FAILURES_BLIND:
            self.sight.set(
                "canary",
                f"canary upload failed {self.failures} times in a row (every "
                f"{age_text(self.interval)}): {why}",
            )

    # -- judging -------------------------------------------------------------------------
    def judge(self, now: float) -> None:
        late = self.canaries.overdue(now)
        if not late:
            return
        self.counts["canary_missed"] += len(late)
        last = late[-1]
        at = time.strftime("%H:%M:%SZ", time.gmtime(last.uploaded_at))
        self.sight.set(
            "canary",
            f"canary not seen within {age_text(self.deadline)}: {last.upload.repository} "
            f"{last.upload.artifact} uploaded to {shown_url(self.url)} at {at} is not "
            "listed by the polls",
        )

    async def run(self, learned: asyncio.Event) -> None:
        """Upload every ``interval`` (keeping the cadence; a round whose predecessor is still
        uploading, or waiting for a long poll, is skipped), and judge each canary at its
        deadline, whatever an upload is doing then."""
        await learned.wait()
        next_at = time.time()
        uploading: asyncio.Task[Upload | None] | None = None
        try:
            while True:
                now = time.time()
                if now >= next_at:
                    if uploading is None or uploading.done():
                        uploading = asyncio.create_task(
                            self.upload_once(), name=f"registry {self.name}: canary upload"
                        )
                    next_at = max(next_at + self.interval, now)
                self.judge(time.time())
                wake = min(next_at, self.canaries.next_deadline() or next_at)
                await asyncio.sleep(max(0.01, wake - time.time() + 0.001))
        finally:
            if uploading is not None:
                uploading.cancel()
                await asyncio.wait([uploading])
