"""The egress canary: proof that the fence still logs and that its log still reaches capalarm.

Every ``interval`` capalarm sends one small UDP datagram to a configured address and port
that the fence logs, from the host or from inside a named network namespace (the socket is
made by a short-lived thread that enters the namespace with setns(2) and then ends, so no
thread of the service ever stays in another namespace).  Each kernel source must then read
that datagram's fence record within ``deadline``; if one does not, the service marks the
source blind (``surface_blind``, see alarm/detector/sources.py), and clears it when the source
reads the next canary.  Nothing else shows that the fence rule is still there, that
``net.netfilter.nf_log_all_netns`` is still set, and that the log still reaches the reader.

A canary's record is known by what the kernel logs of it, not by its payload (which the log
does not show): the destination and port, protocol UDP, its IP length, and a source port
drawn at random for each canary from ``source_ports`` (by default outside Linux's ephemeral
range, 32768-60999, so ordinary sockets never get one).  Only a record matching a canary
that is still outstanding for that source is taken: it is counted apart (seen, latency) and
never as a surface's write.  A workload that sends look-alikes gains nothing: it would have
to hit the one source port of an outstanding canary, and even then takes a single 44-byte
slot while the real canary's record is counted as an ordinary write.  A record the source
cannot vouch for (a user-space /dev/kmsg write) never counts as a canary.
"""

from __future__ import annotations

import asyncio
import ctypes
import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from alarm.collectors.kernel.netfilter import FenceParseError, parse_fence
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.settings import EgressCanarySettings
from alarm.snapshot import CanarySourceView, CanaryView

log = logging.getLogger("capalarm.canary")
T = TypeVar("T")

CLONE_NEWNET = 0x40000000
PAYLOAD = b"capalarm canary\n"
UDP_HEADER = 8
IP_HEADER = {4: 20, 6: 40}
BIND_TRIES = 8  # source ports tried per canary (one may be taken)


@dataclass(slots=True)
class Outstanding:
    sport: int
    sent_at: float


class CanaryClaims:
    """The canaries one kernel source has still to read.  The source's fence reader calls
    :meth:`divert` in a worker thread; the canary task adds and expires on the event loop:
    a lock keeps them apart."""

    def __init__(self, source: str, settings: EgressCanarySettings):
        ip = ipaddress.ip_address(settings.address)
        self.source = source
        self.dst = ip.compressed
        # The kernel prints IPv6 addresses in full (%pI6), IPv4 dotted.
        self._dst_text = f"DST={ip.exploded if ip.version == 6 else ip.compressed} "
        self._dpt_text = f" DPT={settings.port} "
        self.port = settings.port
        self.length = IP_HEADER[ip.version] + UDP_HEADER + len(PAYLOAD)
        self._lock = threading.Lock()
        self._outstanding: dict[int, Outstanding] = {}
        self.seen = 0
        self.missed = 0
        self.last_seen = 0.0
        self.last_latency = 0.0
        self.blind = ""  # what this canary set the source's health.blind to ("": nothing)
        self.blind_since = 0.0

    def expecting(self) -> bool:
        return bool(self._outstanding)

    def add(self, sport: int, sent_at: float) -> None:
        with self._lock:
            self._outstanding[sport] = Outstanding(sport, sent_at)

    def withdraw(self, sport: int) -> None:
        """A canary that was never sent (the send failed after its claim was made)."""
        with self._lock:
            self._outstanding.pop(sport, None)

    def expire(self, now: float, deadline: float) -> list[Outstanding]:
        """Canaries not read within ``deadline``: forgotten (their records, should they still
        come, are ordinary writes) and returned."""
        with self._lock:
            late = [o for o in self._outstanding.values() if now > o.sent_at + deadline]
            for o in late:
                del self._outstanding[o.sport]
            self.missed += len(late)
        return late

    def divert(
        self, records: list[KernelRecord], prefixes: tuple[str, ...], require_trusted: bool
    ) -> list[KernelRecord]:
        """``records`` without the records of outstanding canaries, which are counted here."""
        dst_text, dpt_text = self._dst_text, self._dpt_text
        keep: list[KernelRecord] = []
        for i, rec in enumerate(records):
            msg = rec.message
            if dpt_text not in msg or dst_text not in msg or not msg.startswith(prefixes):
                keep.append(rec)
                continue
            if not self._claim(rec, prefixes, require_trusted):
                keep.append(rec)
            elif not self._outstanding:
                keep.extend(records[i + 1 :])  # nothing more to look for
                break
        return keep

    def _claim(self, rec: KernelRecord, prefixes: tuple[str, ...], require_trusted: bool) -> bool:
        if require_trusted and not rec.trusted:
            return False  # counted as forged by the reader, never as a canary
        try:
            fence = parse_fence(rec.message, prefixes)
        except FenceParseError:
            return False
        if (
            fence is None
            or fence.dst != self.dst
            or fence.dpt != self.port
            or fence.proto != "UDP"
            or fence.length != self.length
            or fence.spt is None
        ):
            return False
        now = time.time()
        with self._lock:
            hit = self._outstanding.pop(fence.spt, None)
            if hit is None:
                return False
            self.seen += 1
            self.last_seen = now
            self.last_latency = now - hit.sent_at
        return True


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


async def in_netns(name: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a new thread that has entered /run/netns/NAME and then ends (a pool thread
    must never be moved: it would stay in the namespace for whatever runs on it next)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if done.cancelled():
            if ok and isinstance(value, socket.socket):
                value.close()
            return
        (done.set_result if ok else done.set_exception)(value)

    def body() -> None:
        try:
            _setns(f"/run/netns/{name}")
            result: Any = fn()
            ok = True
        except BaseException as exc:  # handed to the awaiting task
            result, ok = exc, False
        loop.call_soon_threadsafe(settle, ok, result)

    threading.Thread(target=body, name=f"canary-netns-{name}", daemon=True).start()
    return await done


class EgressCanary:
    """Sends the canaries and judges, per kernel source, whether each was read in time.

    ``collectors()`` gives the running collectors by source name (a reload replaces them):
    those with a fence reader (``.reader``) are the kernel sources it attaches to."""

    def __init__(self, settings: EgressCanarySettings, collectors: Callable[[], Mapping[str, Any]]):
        self.settings = settings
        self._collectors = collectors
        self.claims: dict[str, CanaryClaims] = {}
        self.family = socket.AF_INET6 if ":" in settings.address else socket.AF_INET
        self.sent = 0
        self.send_errors = 0
        self.last_sent = 0.0
        self.last_error = ""

    # -- attaching to the kernel sources ---------------------------------------------
    def watched(self) -> dict[str, Any]:
        """The kernel collectors that must read the canaries, by name."""
        wanted = set(self.settings.sources)
        out = {}
        for name, c in self._collectors().items():
            if getattr(c, "reader", None) is None or not hasattr(c.reader, "canary"):
                continue
            if not wanted or name in wanted:
                out[name] = c
        return out

    def attach(self) -> dict[str, Any]:
        watched = self.watched()
        for name in list(self.claims):
            if name not in watched:
                del self.claims[name]
        for name, c in watched.items():
            claims = self.claims.get(name)
            if claims is None:
                claims = self.claims[name] = CanaryClaims(name, self.settings)
            if c.reader.canary is not claims:
                c.reader.canary = claims
        return watched

    # -- sending -------------------------------------------------------------------------
    def _bind_and_send(self, claim: Callable[[int, float], None]) -> int:
        """One canary from a fresh socket bound to a random source port of the range.
        ``claim(sport, sent_at)`` runs between bind and send: the kernel logs the datagram as
        it is sent, and the reader may read the record before this call returns, so the
        canary must be outstanding already or its record would be counted as a write."""
        lo, hi = self.settings.source_ports
        s = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            for attempt in range(BIND_TRIES):
                sport = lo + secrets.randbelow(hi - lo + 1)
                try:
                    s.bind(("::" if self.family == socket.AF_INET6 else "0.0.0.0", sport))
                    break
                except OSError:
                    if attempt == BIND_TRIES - 1:
                        raise
            claim(sport, time.time())
            s.sendto(PAYLOAD, (self.settings.address, self.settings.port))
            return sport
        finally:
            s.close()

    async def send(self, watched: Mapping[str, Any]) -> None:
        up = [name for name, c in watched.items() if c.health.up]
        if not up:
            return  # a source that is not reading is source_down already
        claims = [self.claims[name] for name in up]
        claimed: list[int] = []

        def claim(sport: int, sent_at: float) -> None:
            claimed.append(sport)
            for c in claims:
                c.add(sport, sent_at)

        def bind_and_send() -> int:
            return self._bind_and_send(claim)

        now = time.time()
        try:
            if self.settings.netns:
                await in_netns(self.settings.netns, bind_and_send)
            else:
                await asyncio.to_thread(bind_and_send)
        except OSError as exc:
            for sport in claimed:
                for c in claims:
                    c.withdraw(sport)
            self.send_errors += 1
            self.last_error = f"cannot send the egress canary: {exc.strerror or exc}"
            log.error("%s", self.last_error)
            for name in up:
                self._set_blind(name, watched[name], self.last_error)
            return
        self.sent += 1
        self.last_sent = now

    # -- judging -----------------------------------------------------------------------
    def _set_blind(self, name: str, collector: Any, why: str) -> None:
        """Another cause (a watched tree gone, say) is never overwritten or cleared here."""
        claims = self.claims[name]
        health = collector.health
        if health.blind in ("", claims.blind):
            if not claims.blind:
                claims.blind_since = time.time()
            health.blind = why
            claims.blind = why

    def judge(self, watched: Mapping[str, Any], now: float) -> None:
        s = self.settings
        for name, c in watched.items():
            claims = self.claims[name]
            late = claims.expire(now, s.deadline)
            if late and c.health.up:
                sent = time.strftime("%H:%M:%SZ", time.gmtime(late[-1].sent_at))
                where = f" from netns {s.netns}" if s.netns else ""
                self._set_blind(
                    name,
                    c,
                    f"egress canary to {s.address}:{s.port}{where} sent at {sent} was not read "
                    f"within {s.deadline:g}s: is the fence rule there and logging "
                    "(net.netfilter.nf_log_all_netns=1 for a namespace)?",
                )
            elif claims.blind and claims.last_seen > claims.blind_since:
                # A canary was read since the source went blind: it sees again.
                if c.health.blind == claims.blind:
                    c.health.blind = ""
                claims.blind = ""

    async def run(self) -> None:
        s = self.settings
        next_send = time.time()
        step = min(1.0, s.deadline / 4, s.interval / 2)
        while True:
            try:
                watched = self.attach()
                now = time.time()
                if now >= next_send:
                    await self.send(watched)
                    # Keep the cadence; after a stall, the next one is one interval from now.
                    next_send = max(next_send + s.interval, now)
                self.judge(watched, time.time())
            except Exception as exc:  # a bug here must not stop the service
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("egress canary failed")
            await asyncio.sleep(max(0.01, min(step, next_send - time.time())))

    def view(self) -> CanaryView:
        s = self.settings
        return CanaryView(
            address=s.address,
            port=s.port,
            netns=s.netns or "",
            interval=s.interval,
            deadline=s.deadline,
            sent=self.sent,
            send_errors=self.send_errors,
            last_sent=self.last_sent,
            last_error=self.last_error,
            sources=[
                CanarySourceView(
                    source=name,
                    seen=c.seen,
                    missed=c.missed,
                    last_seen=c.last_seen,
                    last_latency=c.last_latency,
                    blind=c.blind,
                )
                for name, c in sorted(self.claims.items())
            ],
        )


__all__ = ["CanaryClaims", "EgressCanary", "EgressCanarySettings", "in_netns"]
