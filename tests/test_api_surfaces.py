"""/api/v1/surfaces reports what the page and /metrics report: every rule's state on every
surface, and every budget horizon's figures (issue 27: it had spike and budget only, and the
first horizon only, while the horizon that fired was another)."""

from __future__ import annotations

import json

from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.synthetic import fence_line
from tests.servicekit import RecordsCollector, get, metric, running_service, wait_for

PREFIX = "EGRESS_FENCE tapi"


def records(n: int) -> list[KernelRecord]:
    line = fence_line(PREFIX, "10.20.0.9", 443, "TCP", 1200, 40000)
    return [KernelRecord(ts=0, message=line, facility=0, trusted=True) for _ in range(n)]


def config(tmp_path) -> dict:
    # Three horizons: the README's single one (named "base" by default) that nothing here
    # reaches, an hour one, and a custom-named drip horizon that the records overflow: the
    # budget fires on the third horizon, which the API's first-horizon figures never showed.
    budget = {
        "allowance_bits_per_second": 1e9,
        "tolerance_bits": 1e12,
        "horizons": [
            {"horizon": "1h", "allowance_bits_per_second": 1e8, "tolerance_bits": 1e11},
            {"horizon": "drip", "allowance_bits_per_second": 1.0, "tolerance_bits": 8000.0},
        ],
    }
    return {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "prefixes": [PREFIX]}],
        "surfaces": [{"name": "proxy", "match": {"dst": ["10.20.0.0/16"]}, "budget": budget}],
    }


async def test_api_reports_every_rule_and_every_budget_horizon(tmp_path):
    collector = RecordsCollector("kernel", records(20), (PREFIX,), 0.5)
    async with running_service(config(tmp_path), collectors={"kernel": collector}) as service:

        async def surface() -> dict | None:
            _, _, body = await get(service, "/api/v1/surfaces")
            proxy = next(s for s in json.loads(body)["surfaces"] if s["surface"] == "proxy")
            return proxy if proxy["alerts"]["budget"] == "firing" else None

        await wait_for(surface, timeout=20)
        proxy = await surface()
        assert proxy is not None
        snap = await service.snapshot()
        view = next(s for s in snap.surfaces if s.name == "proxy")
        _, _, text = await get(service, "/metrics")

    # Every rule the surface has, beacon and duty (on by default) among them, by the names
    # /metrics uses, in the states it shows (/metrics, read after, may be further on; by
    # default it has a surface's rule only while it is away from rest).
    states = {0: "inactive", 1: "pending", 2: "firing"}
    rank = list(states.values())
    assert set(proxy["alerts"]) == set(view.rule_states())
    assert {"spike", "budget", "beacon", "duty"} <= set(proxy["alerts"])
    for rule in ("spike", "budget", "beacon", "duty"):
        assert proxy["alerts"][rule] == states[view.rule_states()[rule]], rule
    for rule, state in proxy["alerts"].items():
        value = metric(
            text, "capalarm_alert_state", target_type="surface", target="proxy", rule=rule
        )
        shown = "inactive" if value is None else states[int(value)]
        assert value != 0, f"{rule}: an inactive state written in the lean exposition"
        assert rank.index(shown) >= rank.index(state), rule

    budget = proxy["budget"]
    assert [h["horizon"] for h in budget["horizons"]] == ["base", "1h", "drip"]
    base, hour, drip = budget["horizons"]
    assert base["allowance_bits_per_second"] == budget["allowance_bits_per_second"] == 1e9
    assert base["tolerance_bits"] == budget["tolerance_bits"] == 1e12
    assert hour["allowance_bits_per_second"] == 1e8 and hour["tolerance_bits"] == 1e11
    assert drip["allowance_bits_per_second"] == 1.0 and drip["tolerance_bits"] == 8000.0
    # The firing horizon is the one past its tolerance; /metrics' budget ratio is the
    # horizon nearest to firing: past 1.
    assert drip["excess_bits"] > drip["tolerance_bits"]
    assert base["excess_bits"] < base["tolerance_bits"]
    ratio = metric(text, "capalarm_surface_budget_ratio", surface="proxy")
    assert ratio is not None and ratio >= 1
    # And what the three budgets let through in an hour: the least of k + h / 3600 s.
    allowed = metric(
        text, "capalarm_surface_budget_hour_allowance_bytes_per_second", surface="proxy"
    )
    assert allowed == min(1e9 + 1e12 / 3600, 1e8 + 1e11 / 3600, 1.0 + 8000.0 / 3600) / 8


def many(tmp_path, n: int) -> dict:
    return {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "prefixes": [PREFIX]}],
        "surfaces": [
            {"name": f"s{i:02d}", "match": {"dst": [f"10.30.{i}.0/24"]}} for i in range(n)
        ],
    }


async def test_the_api_pages_through_every_surface_and_says_where_the_next_page_is(tmp_path):
    """?limit= and the answer's "next" link walk every surface once, in the declared order;
    without ?limit= a small fleet gets every surface in one answer, as before pages."""
    collector = RecordsCollector("kernel", [], (PREFIX,), 0.5)
    async with running_service(many(tmp_path, 25), collectors={"kernel": collector}) as service:
        _, _, body = await get(service, "/api/v1/surfaces")
        whole = json.loads(body)
        seen, path, pages = [], "/api/v1/surfaces?limit=10", 0
        while path:
            status, _, body = await get(service, path)
            assert status == 200, body
            page = json.loads(body)
            assert len(page["surfaces"]) <= 10 and page["total_surfaces"] == whole["total_surfaces"]
            assert [v["source"] for v in page["sources"]] == ["kernel"]  # on every page
            seen += [(s["kind"], s["surface"]) for s in page["surfaces"]]
            path, pages = page["next"], pages + 1
        top, _, top_body = await get(service, "/api/v1/surfaces?order=attention&limit=3")
        refused = [
            (await get(service, q))[0]
            for q in (
                "/api/v1/surfaces?limit=0",
                "/api/v1/surfaces?limit=x",
                "/api/v1/surfaces?limit=1000000",
                "/api/v1/surfaces?after=egress/nosuch",
                "/api/v1/surfaces?order=sideways",
                "/api/v1/surfaces?order=attention&after=egress/s01",
            )
        ]
    every = [(s["kind"], s["surface"]) for s in whole["surfaces"]]
    assert whole["next"] is None and len(every) == whole["total_surfaces"] >= 26
    assert seen == every and pages == -(-len(every) // 10)
    assert top == 200 and len(json.loads(top_body)["surfaces"]) == 3
    assert json.loads(top_body)["next"] is None
    assert refused == [400] * 6
