"""Synthetic fence traffic from a script of phases: for the demo and for tests of the service
without a kernel.  It proves nothing about provenance (``provenance_verified`` is False).  Its
lines go through the same fence reader as the kernel's."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.events import Batch, Emit, SourceHealth


@dataclass(slots=True, frozen=True)
class Flow:
    dst: str
    dport: int
    proto: str  # "TCP" or "UDP"
    packets_per_second: float
    packet_bytes: int
    start: float = 0.0  # seconds after the collector starts
    end: float = float("inf")


def fence_line(prefix: str, dst: str, dport: int, proto: str, length: int, sport: int) -> str:
    """A netfilter LOG line as the kernel prints it for an IPv4 packet."""
    tail = (
        f"PROTO=TCP SPT={sport} DPT={dport} WINDOW=64240 RES=0x00 ACK PSH URGP=0"
        if proto == "TCP"
        else f"PROTO=UDP SPT={sport} DPT={dport} LEN={length - 20}"
    )
    return (
        f"{prefix} IN= OUT=eth0 SRC=10.99.0.2 DST={dst} LEN={length} TOS=0x00 PREC=0x00 "
        f"TTL=64 ID={sport} DF {tail} UID=1000 GID=1000"
    )


class SyntheticCollector:
    def __init__(
        self,
        name: str,
        flows: list[Flow],
        prefix: str = "EGRESS_FENCE",
        interval: float = 0.1,
        seed: int = 1,
        tick: float = 1.0,
    ):
        self.name = name
        self.flows = flows
        self.prefix = prefix
        self.interval = interval
        self.health = SourceHealth()
        self.reader = FenceReader((prefix,), require_trusted=False, tick=tick)
        self._rng = random.Random(seed)

    async def run(self, emit: Emit) -> None:
        self.health.up = True
        self.health.caught_up = True
        start = time.time()
        carry = [0.0] * len(self.flows)
        try:
            while True:
                await asyncio.sleep(self.interval)
                now = time.time()
                elapsed = now - start
                records = []
                for i, flow in enumerate(self.flows):
                    if not flow.start <= elapsed < flow.end:
                        continue
                    carry[i] += (
                        flow.packets_per_second * self.interval * self._rng.uniform(0.7, 1.3)
                    )
                    count, carry[i] = int(carry[i]), carry[i] - int(carry[i])
                    for _ in range(count):
                        line = fence_line(
                            self.prefix,
                            flow.dst,
                            flow.dport,
                            flow.proto,
                            flow.packet_bytes,
                            self._rng.randint(32768, 60999),
                        )
                        records.append(KernelRecord(ts=now, message=line))
                if records:
                    read = self.reader.read(records)
                    counts = {"records_read": len(records), "parse_errors": read.parse_errors}
                    await emit(Batch(read.events, counts, watermark=now))
                    self.health.last_record_ts = now
        finally:
            self.health.up = False
            self.health.caught_up = False
