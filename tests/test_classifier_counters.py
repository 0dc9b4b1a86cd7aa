"""What a kind's classifier counts is exported per source: the egress classifier's memo
evictions (flow keys dropped to keep its memo within ``memo_limit``) as
``capalarm_source_classifier_memo_evictions_total{source}``, counted for the source whose
batch made the classifier drop them."""

from __future__ import annotations

import asyncio
import time

from alarm.classify.egress import COLUMN_RULES, MEMO_LIMIT
from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.synthetic import fence_line
from alarm.config import config_from_dict
from alarm.events import Batch, SourceHealth
from alarm.pipeline import Pipeline
from tests.servicekit import get, metric, running_service, wait_for

PFX = ("EGRESS_FENCE",)
METRIC = "capalarm_source_classifier_memo_evictions_total"
# More rules than the classifier takes column by column: flows go through its memo.
SURFACES = [
    {"name": f"s{i}", "match": {"dst": [f"10.200.{i}.0/24"], "dport": [443]}}
    for i in range(COLUMN_RULES + 6)
]


def flows(first: int, n: int, ts: float) -> list[KernelRecord]:
    """``n`` records, each to a destination of its own (10.0.0.0/8 from index ``first``)."""
    out = []
    for i in range(first, first + n):
        dst = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        out.append(KernelRecord(ts, fence_line(PFX[0], dst, 443, "TCP", 60, 40000), 0, 0, True))
    return out


def test_pipeline_counts_memo_evictions_for_the_source_that_caused_them() -> None:
    config = {
        "sources": [{"name": "a", "type": "kmsg"}, {"name": "b", "type": "kmsg"}],
        "surfaces": SURFACES,
    }
    pipe = Pipeline(config_from_dict(config))
    classifier = pipe.classifiers["egress"]
    classifier.memo_limit = 64
    reader = FenceReader(PFX, True, tick=1.0)
    now = time.time()
    pipe.apply("a", Batch(reader.read(flows(0, 50, now)).events), now)
    assert pipe.sources["a"].counters["classifier_memo_evictions"] == 0
    pipe.apply("b", Batch(reader.read(flows(50, 200, now)).events), now)
    pipe.apply("a", Batch(reader.read(flows(0, 50, now)).events), now)  # some forgotten
    a, b = (pipe.sources[s].counters["classifier_memo_evictions"] for s in "ab")
    assert b > 0 and a + b == classifier.memo_evictions
    # Declared for every egress source, so it is exported at 0 before the first eviction;
    # sources of other kinds do not have it.
    assert "classifier_memo_evictions" in pipe.sources["a"].declared_counters
    fs = Pipeline(config_from_dict({"sources": [{"name": "w", "type": "fs", "paths": ["/x"]}]}))
    assert "classifier_memo_evictions" not in fs.sources["w"].declared_counters


class Batches:
    """A kernel source handing over one batch of records each time ``go`` is set."""

    def __init__(self, name: str, batches: list[list[KernelRecord]]):
        self.name = name
        self.batches = batches
        self.reader = FenceReader(PFX, require_trusted=True, tick=1.0)
        self.health = SourceHealth(provenance_verified=True, up=True, caught_up=True)
        self.go = asyncio.Event()
        self.sent = 0

    async def run(self, emit) -> None:
        for records in self.batches:
            await self.go.wait()
            self.go.clear()
            read = self.reader.read(records)
            await emit(Batch(read.events, {"records_read": len(records)}))
            self.sent += 1
        await asyncio.Event().wait()


async def test_service_exports_memo_evictions_when_flows_pass_memo_limit(tmp_path) -> None:
    """More distinct flows than the classifier's memo holds (its default limit), through
    the service: the exported counter is 0 before and rises after."""
    now = time.time()
    source = Batches("kernel", [flows(0, 1000, now), flows(1000, MEMO_LIMIT + 1000, now)])
    config = {
        "tick": "1s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "prefixes": list(PFX)}],
        "surfaces": [*SURFACES, {"name": "proxy", "match": {"dst": ["10.0.0.0/8"]}}],
    }

    async def scraped() -> float | None:
        _, _, body = await get(service, "/metrics")
        return metric(body, METRIC, source="kernel")

    async with running_service(config, collectors={"kernel": source}) as service:
        classifier = service.pipeline.classifiers["egress"]
        assert classifier.memo_limit == MEMO_LIMIT
        source.go.set()
        await wait_for(lambda: source.sent == 1, timeout=20)
        await wait_for(lambda: service.pipeline.table.events_total.sum() >= 1000, timeout=20)
        assert await scraped() == 0.0
        source.go.set()
        await wait_for(lambda: source.sent == 2, timeout=20)
        await wait_for(lambda: classifier.memo_evictions > 0, timeout=20)
        evicted = classifier.memo_evictions
        assert evicted == 1000 + MEMO_LIMIT + 1000 - classifier.memo_size > 0

        async def exported() -> bool:  # once a snapshot taken after the batch is scraped
            return await scraped() == evicted

        await wait_for(exported, timeout=20)


def test_every_source_counter_is_exported_with_its_own_help_text() -> None:
    # A type's and a kind's counters said "Source counter <name>." in /metrics: the help
    # they declare (what the counter means to an operator) was dropped on the way.
    from alarm.kinds import KINDS
    from exporters.prometheus import render

    config = {
        "sources": [{"name": "k", "type": "kmsg"}],
        "surfaces": [{"name": "a", "match": {"dport": [443]}}],
    }
    pipe = Pipeline(config_from_dict(config))
    text = render(pipe.snapshot(20.0, 10, {}, {}), [], None)[0]
    text = text if isinstance(text, str) else text.decode()
    helps = [line for line in text.splitlines() if line.startswith("# HELP capalarm_source_")]
    assert helps and not [h for h in helps if " Source counter " in h]
    doc = KINDS["egress"].classifier_counters["memo_evictions"]
    assert f"# HELP {METRIC} {doc}" in helps
