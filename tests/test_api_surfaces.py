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
    # /metrics uses, in the states it shows.
    states = {0: "inactive", 1: "pending", 2: "firing"}
    assert set(proxy["alerts"]) == set(view.rule_states())
    assert {"spike", "budget", "beacon", "duty"} <= set(proxy["alerts"])
    for rule in ("spike", "budget", "beacon", "duty"):
        assert proxy["alerts"][rule] == states[view.rule_states()[rule]], rule
    for rule, state in proxy["alerts"].items():
        value = metric(
            text, "capalarm_alert_state", target_type="surface", target="proxy", rule=rule
        )
        assert value is not None and states[int(value)] in (state, "firing"), rule

    budget = proxy["budget"]
    assert [h["horizon"] for h in budget["horizons"]] == ["base", "1h", "drip"]
    base, hour, drip = budget["horizons"]
    assert base["allowance_bits_per_second"] == budget["allowance_bits_per_second"] == 1e9
    assert base["tolerance_bits"] == budget["tolerance_bits"] == 1e12
    assert hour["allowance_bits_per_second"] == 1e8 and hour["tolerance_bits"] == 1e11
    assert drip["allowance_bits_per_second"] == 1.0 and drip["tolerance_bits"] == 8000.0
    # The firing horizon is the one past its tolerance, with the figure /metrics has for it.
    assert drip["excess_bits"] > drip["tolerance_bits"]
    assert base["excess_bits"] < base["tolerance_bits"]
    exported = metric(
        text, "capalarm_surface_budget_horizon_excess_bytes", surface="proxy", horizon="drip"
    )
    assert exported is not None and exported * 8 >= drip["tolerance_bits"]
