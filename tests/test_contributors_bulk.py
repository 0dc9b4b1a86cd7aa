"""Contributors in bulk (issue 29): what each contributor wrote is summed in numpy and only the
names a bounded heavy-hitter summary can keep are made.  The summaries must hold what adding
every (name, bytes) pair one by one gives: the same counts and error, ties at the k-th place
aside, and the same evidence in alerts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from alarm.collectors.kernel.fastscan import FlowScan
from alarm.collectors.kernel.fence import FlowContributors, FlowSubjects, flow_events
from alarm.config import Config
from alarm.events import Batch, KeyedSubjects
from alarm.pipeline import Pipeline
from alarm.surfaces import HeavyHitters, NamedContributors, contributor_table

TICK = 10.0


def scan_of(rows: list[tuple]) -> FlowScan:
    scan = FlowScan()
    scan.add_rows(rows, TICK)
    return scan


def row(ts: float, dst: str, proto: str, dpt: int | None, length: int = 100, **kw: object) -> tuple:
    out_if = str(kw.get("out_if", "eth0"))
    uid = kw.get("uid", 1000)
    return (ts, "EGRESS_FENCE", out_if, dst, length, proto, dpt, uid, True)


AWKWARD = [
    row(1.0, "10.0.0.5", "TCP", 443),
    row(1.0, "10.0.0.5", "TCP", 443, out_if="eth1"),  # another flow, the same name
    row(1.0, "10.0.0.5", "ICMP", None),
    row(2.0, "2001:db8::5", "TCP", 1),
    row(2.0, "2001:db8::6:1", "TCP", None),  # a fragment: no port
    row(2.0, "::", "UDP", 53),
    row(3.0, "10.0.0.6", "we/ird", 7),  # a forged line's protocol, with a "/"
    row(3.0, "10.0.0.7", "x\udcff", 8),  # a lone surrogate: shown as U+FFFD
    row(3.0, "10.0.0.8", "TCP", 99999),
]


def test_flow_contributors_name_and_find_as_contributor_does() -> None:
    subjects = FlowSubjects(scan_of(AWKWARD))
    table = subjects.contributor_table()
    assert table is not None
    names = table.names(range(table.count))
    # Each subject's contributor index names it as contributor(i) does.
    assert [names[c] for c in table.of_subject.tolist()] == [
        subjects.contributor(i) for i in range(len(subjects))
    ]
    assert len(set(names)) == table.count == len(AWKWARD) - 1  # eth0/eth1 share a name
    assert table.find(names).tolist() == list(range(table.count))
    assert table.find(["10.9.9.9:443/TCP", "10.0.0.5:444/TCP", "nonsense", ""]).tolist() == [-1] * 4


def test_flow_contributors_find_what_they_named_as_a_fresh_table_reads_it() -> None:
    """Names are kept once made and read back (a batch spans many ticks, each asking for
    its flows again); a name two flows share still reads back as the port-less flow, in
    whichever order the flows were named, as a table that named nothing reads it."""
    rows = [
        row(1.0, "2001:db8::5", "TCP", 1),
        row(1.0, "2001:db8::5:1", "TCP", None),  # the same name, "2001:db8::5:1/TCP"
        row(1.0, "10.0.0.5", "TCP", 443),
        row(1.0, "10.0.0.9", "UDP", 80),
        row(1.0, "10.0.0.9:80", "UDP", None),  # forged text: the same name again
        row(1.0, "a/b", "TCP", 1),  # forged text: a "/" in the address
        row(1.0, "10.0.0.7", "x\udcff", 8),  # two protocols shown alike (U+FFFD)
        row(1.0, "10.0.0.7", "x\ufffd", 8),
    ]
    fresh = FlowSubjects(scan_of(rows)).contributor_table()
    assert fresh is not None
    n = fresh.count
    asked = FlowSubjects(scan_of(rows)).contributor_table().names(range(n))  # type: ignore[union-attr]
    asked += ["10.0.0.5:444/TCP", "nonsense"]
    expected = fresh.find(asked).tolist()
    assert expected[-2:] == [-1, -1] and expected[2] >= 0
    for order in (range(n), reversed(range(n))):
        table = FlowSubjects(scan_of(rows)).contributor_table()
        assert table is not None
        for i in order:  # one index a call, as the ticks of a batch ask
            table.names([i])
        assert table.find(asked).tolist() == expected
        assert table.find(asked).tolist() == expected  # read back from what is kept


def test_named_contributors_from_keyed_subjects() -> None:
    long = "p/" + "x" * 300
    subjects = KeyedSubjects(
        keys=["a", "b", "c", "d", "e"],
        contributors=["alice", "bob", "alice", "", long],
        receipts=[{"v": 1}, None, {"v": 3}, None, None],
    )
    table = contributor_table(subjects)
    assert isinstance(table, NamedContributors)
    assert table.of_subject.tolist() == [0, 1, 0, -1, 2]
    assert table.names([0, 1]) == ["alice", "bob"]
    assert table.names([2])[0].endswith("…") and len(table.names([2])[0]) == 201
    assert table.evidence == {0: {"v": 3}}  # the latest subject's receipt
    assert contributor_table(KeyedSubjects(keys=["a"], contributors=[""])) is None


class Listed:
    """A ContributorTable over a fixed list of names."""

    def __init__(self, names: list[str]):
        self._names = names
        self.count = len(names)
        self.of_subject = np.arange(len(names))
        self.evidence = None
        self.lookup = {n: i for i, n in enumerate(names)}

    def names(self, ids: object) -> list[str]:
        return [self._names[i] for i in np.asarray(ids).tolist()]

    def find(self, names: list[str]) -> np.ndarray:
        return np.array([self.lookup.get(n, -1) for n in names], dtype=np.int64)


@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("universe", [10, 200, 5000])
def test_add_batch_is_add_many(k: int, universe: int) -> None:
    """Batch after batch, add_batch keeps what add_many of every pair keeps: with distinct
    amounts (no ties) the same counts and the same error."""
    rng = random.Random(universe * 31 + k)
    names = [f"c{i}" for i in range(universe)]
    table = Listed(names)
    bulk, each = HeavyHitters(k), HeavyHitters(k)
    used: set[int] = set()
    for _ in range(30):
        ids = sorted(rng.sample(range(universe), rng.randint(1, min(universe, 400))))
        # Distinct amounts, never met before: no tie anywhere.
        amounts = []
        for _ in ids:
            a = rng.randint(1, 10**9)
            while a in used:
                a = rng.randint(1, 10**9)
            used.add(a)
            amounts.append(a)
        bulk.add_batch(np.array(ids), np.array(amounts, dtype=np.int64), table)
        each.add_many([names[i] for i in ids], amounts)
        assert dict(bulk.top(2 * k + 1)) == dict(each.top(2 * k + 1))
        assert bulk.error == each.error


def test_add_batch_names_only_what_can_stay() -> None:
    k = 4
    names = [f"c{i}" for i in range(10_000)]

    class Counting(Listed):
        named = 0

        def names(self, ids: object) -> list[str]:
            out = super().names(ids)
            Counting.named += len(out)
            return out

    table = Counting(names)
    hitters = HeavyHitters(k)
    amounts = np.arange(1, 10_001, dtype=np.int64)
    hitters.add_batch(np.arange(10_000), amounts, table)
    assert Counting.named == k + 1
    assert hitters.top(k) == [(f"c{i}", i + 1) for i in range(9_999, 9_999 - k, -1)]
    assert hitters.error == 10_000 - k


def flows_config() -> Config:
    return Config.model_validate(
        {
            "tick": "10s",
            "heavy_hitters": 4,
            "sources": [],
            "surfaces": [
                {"name": "web", "kind": "egress", "match": {"dport": [443], "proto": ["tcp"]}},
            ],
        }
    )


def reference_staged(rows: list[tuple], k: int) -> dict[tuple[int, str], HeavyHitters]:
    """Per (tick, surface), a HeavyHitters fed each flow's bytes one add at a time."""
    out: dict[tuple[int, str], HeavyHitters] = {}
    sums: dict[tuple[int, str, str], int] = {}
    for ts, _, _, dst, length, proto, dpt, _, _ in rows:
        surface = "web" if (dpt == 443 and proto == "TCP") else "unclassified"
        name = f"{dst}:{dpt}/{proto}" if dpt is not None else f"{dst}/{proto}"
        key = (int(ts // TICK), surface, name)
        sums[key] = sums.get(key, 0) + length
    for (tick, surface, name), total in sums.items():
        out.setdefault((tick, surface), HeavyHitters(k)).add(name, total)
    return out


def test_pipeline_stages_the_top_of_each_tick() -> None:
    """Many flows over several ticks in one batch: each tick's staged top contributors and
    the surfaces' totals are those of summing every flow by name."""
    rng = random.Random(7)
    rows = []
    for i in range(3000):
        dst = f"10.{rng.randint(0, 3)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        dpt = rng.choice([443, 443, 53, None])
        proto = "ICMP" if dpt is None else ("UDP" if dpt == 53 else "TCP")
        rows.append(
            (i * 0.01, "EGRESS_FENCE", "eth0", dst, rng.randint(40, 1500), proto, dpt, 0, True)
        )
    config = flows_config()
    pipeline = Pipeline(config, extra_sources={"kern": ("file", "egress")}, keep_history=False)
    scan = scan_of(rows)
    pipeline.apply("kern", Batch(flow_events(scan, TICK), {}), None)
    expect = reference_staged(rows, config.heavy_hitters)
    table = pipeline.table
    for index in sorted(pipeline.clock.open):
        credits = pipeline.clock.staged(index).credits
        for surface in ("web", "unclassified"):
            got = credits.named(table.index[("egress", surface)])
            want = expect[(index, surface)]
            # Ties at the k-th place may keep another of the tied names: compare counts.
            assert sorted(c for _, c in got.top(4)) == sorted(c for _, c in want.top(4))
            assert got.error == want.error
    totals: dict[str, dict[str, int]] = {}
    for _ts, _, _, dst, length, proto, dpt, _, _ in rows:
        surface = "web" if (dpt == 443 and proto == "TCP") else "unclassified"
        name = f"{dst}:{dpt}/{proto}" if dpt is not None else f"{dst}/{proto}"
        totals.setdefault(surface, {})
        totals[surface][name] = totals[surface].get(name, 0) + length
    for surface, by_name in totals.items():
        top = table.hitters[table.index[("egress", surface)]].top(4)
        true_top = sorted(by_name.values(), reverse=True)[:4]
        assert [c for _, c in top] == true_top  # one batch: exact
        assert all(by_name[name] == count for name, count in top)


def test_flow_contributors_say_whether_each_index_names_itself_alone() -> None:
    plain = [row(1.0, f"10.0.0.{i}", "TCP", 443) for i in range(5)]
    plain.append(row(1.0, "2001:db8::5", "UDP", 53))
    table = FlowSubjects(scan_of(plain)).contributor_table()
    assert table is not None and table.names_distinct
    awkward = FlowSubjects(scan_of(AWKWARD)).contributor_table()  # names of their own
    assert awkward is not None and awkward.names_distinct
    # a lone surrogate is shown escaped: two protocols, one name
    shown = [row(1.0, "10.0.0.7", "x\udcff", 8), row(1.0, "10.0.0.7", "x\\xff", 8)]
    alike = FlowSubjects(scan_of(shown)).contributor_table()
    assert alike is not None and not alike.names_distinct
    # "2001:db8::5" port 1 and port-less "2001:db8::5:1" are one name
    spelled = [row(1.0, "2001:db8::5", "TCP", 1), row(1.0, "2001:db8::5:1", "TCP", None)]
    both = FlowSubjects(scan_of(spelled)).contributor_table()
    assert both is not None and not both.names_distinct
    long = FlowSubjects(scan_of([row(1.0, "a" * 200, "TCP", 1)])).contributor_table()
    assert long is not None and not long.names_distinct  # its name is cut where kept


def replay_batches(seed: int) -> list[list[tuple]]:
    """Four batches of flows over ~5 ticks each, flows recurring from batch to batch, a tick
    split between two batches, ties, silent ticks, and owners that change."""
    rng = random.Random(seed)
    pool = [f"10.{rng.randint(0, 1)}.0.{rng.randint(1, 40)}" for _ in range(60)]
    batches, ts = [], 0.0
    for b in range(4):
        rows = []
        for _ in range(400):
            ts += rng.choice([0.05, 0.1, 0.1, 0.2])
            if 22.0 < ts % 60.0 < 35.0:  # ticks where the surfaces write nothing
                continue
            dpt = rng.choice([443, 443, 53])
            proto = "UDP" if dpt == 53 else "TCP"
            length = rng.choice([100, 100, 200, 1500])  # ties at the k-th place
            uid = rng.choice([1000, 1001, 1000 + b])
            rows.append(
                (ts, "EGRESS_FENCE", "eth0", rng.choice(pool), length, proto, dpt, uid, True)
            )
        batches.append(rows)
    return batches


def evidence_tick_by_tick(batches: list[list[tuple]]) -> tuple[list[object], Pipeline, int]:
    """Every surface's evidence after each tick, the pipeline, and how many times a
    surface's recent contributors passed unnamed from one batch's indexes to the next's."""
    config = flows_config()
    pipeline = Pipeline(config, extra_sources={"kern": ("file", "egress")}, keep_history=False)
    table = pipeline.table
    seen: list[object] = []
    keyed = [None] * len(table)
    passed = 0
    for rows in batches:
        pipeline.apply("kern", Batch(flow_events(scan_of(rows), TICK), {}), None)
        end = (rows[-1][0] // TICK) * TICK  # the last tick may go on in the next batch
        while pipeline.close_until(end, limit=1):
            seen.append([(table.evidence(r, 8), table.recent[r].error) for r in range(len(table))])
            for r, now in enumerate(table.recent_table):
                # (through names where a tick split between two batches is credited)
                passed += keyed[r] is not None and now is not None and now is not keyed[r]
                keyed[r] = (now or keyed[r]) if table.has_recent[r] else None
    return seen, pipeline, passed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_unnamed_tick_contributors_give_the_evidence_names_do(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick's contributors credited unnamed (TickTop, keyed by a batch's indexes, passed
    by name from batch to batch) give, after every tick, the recent contributors, counts,
    errors and receipts that crediting them by name gives."""
    batches = replay_batches(seed)
    lazy, pipeline, passed = evidence_tick_by_tick(batches)
    assert passed > 0
    table = pipeline.table
    before = [table.evidence(r, 8) for r in range(len(table))]
    table.name_recent(np.arange(len(table)))
    assert all(t is None for t in table.recent_table)
    assert [table.evidence(r, 8) for r in range(len(table))] == before
    with monkeypatch.context() as m:
        m.setattr(FlowContributors, "names_distinct", False)  # every tick named, as before
        named, _, passed = evidence_tick_by_tick(batches)
    assert passed == 0
    assert len(lazy) == len(named) > 10
    assert lazy == named
    assert any(r for tick in lazy for listed, _ in tick for _, _, r in listed)  # receipts


def test_tick_contributors_are_named_only_when_read() -> None:
    """A batch's ticks credited to the surfaces name no contributor; reading a surface's
    evidence names what it lists."""
    rows = [
        (
            i * 0.01,
            "EGRESS_FENCE",
            "eth0",
            f"10.0.{i // 250}.{i % 250}",
            100 + i,
            "TCP",
            443,
            0,
            True,
        )
        for i in range(5000)
    ]
    named: list[int] = []
    names = FlowContributors.names

    def counted(self: FlowContributors, ids: object) -> list[str]:
        out = names(self, ids)  # type: ignore[arg-type]
        named.append(len(out))
        return out

    pipeline = Pipeline(
        flows_config(), extra_sources={"kern": ("file", "egress")}, keep_history=False
    )
    with pytest.MonkeyPatch.context() as m:
        m.setattr(FlowContributors, "names", counted)
        pipeline.apply("kern", Batch(flow_events(scan_of(rows), TICK), {}), None)
        totals = sum(named)  # the surfaces' totals name theirs once a batch
        results = pipeline.close_until(50.0)
        # The ticks named nothing (k + 1 of each before): only what alerts list is named.
        shown = sum(len(c.contributors) for r in results for c in r.changes)
        assert pipeline.ticks == 5 and sum(named) == totals + shown < totals + 5 * 5
        named.clear()
        web = pipeline.table.index[("egress", "web")]
        listed = pipeline.table.evidence(web, 3)
    assert named == [3]
    assert listed == [
        ("10.0.19.249:443/TCP", 5099, {"uid": "0"}),
        ("10.0.19.248:443/TCP", 5098, {"uid": "0"}),
        ("10.0.19.247:443/TCP", 5097, {"uid": "0"}),
    ]
