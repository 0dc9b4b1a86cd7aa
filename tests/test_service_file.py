"""The whole service on a followed kern.log: exact per-surface bytes in /metrics, restart
without double counting, the JSON status API, and bounded series under hostile churn."""

from __future__ import annotations

import json
import time

from alarm.collectors.kernel.synthetic import fence_line
from tests.servicekit import get, metric, running_service, source_count, surface_totals, wait_for

PREFIX = "EGRESS_FENCE tfile"


def syslog(line: str, second: int = 0) -> str:
    """A kern.log line stamped in the last half minute (RFC 3164, local time as rsyslog
    writes it), so the service evaluates a short backlog."""
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(time.time() - 30 + second % 20))
    return f"{stamp} host kernel: [ 100.{second:06d}] {line}\n"


def config(tmp_path, log):
    return {
        "tick": "0.2s",
        "state_dir": str(tmp_path / "state"),
        "sources": [
            {
                "name": "kern",
                "type": "file",
                "paths": [str(log)],
                "prefixes": [PREFIX],
                "format": "syslog",
            }
        ],
        "surfaces": [
            {"name": "proxy", "match": {"dst": ["10.20.0.0/16"], "dport": [443], "proto": ["tcp"]}},
            {"name": "dns", "match": {"dport": [53], "proto": ["udp"]}},
        ],
    }


def write_traffic(log, n: int, start: int = 0) -> dict[str, int]:
    sent = {"proxy": 0, "dns": 0, "unclassified": 0}
    with open(log, "a") as fh:
        for i in range(start, start + n):
            if i % 3 == 0:
                fh.write(
                    syslog(
                        fence_line(PREFIX, "10.20.1.5", 443, "TCP", 100 + i % 50, 40000 + i % 1000),
                        i,
                    )
                )
                sent["proxy"] += 100 + i % 50
            elif i % 3 == 1:
                fh.write(syslog(fence_line(PREFIX, "9.9.9.9", 53, "UDP", 60 + i % 7, 40000), i))
                sent["dns"] += 60 + i % 7
            else:
                fh.write(
                    syslog(fence_line(PREFIX, f"198.51.100.{i % 200}", 8080, "TCP", 1000, 40000), i)
                )
                sent["unclassified"] += 1000
            if i % 10 == 0:
                fh.write(syslog("some other kernel message", i))
    return sent


async def scrape_bytes(service) -> dict[str, float | None]:
    _, _, text = await get(service, "/metrics")
    return {
        s: metric(text, "capalarm_surface_written_bytes_total", surface=s)
        for s in ("proxy", "dns", "unclassified")
    }


async def test_exact_bytes_per_surface_and_restart_without_double_counting(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    sent = write_traffic(log, 300)
    async with running_service(config(tmp_path, log)) as service:

        async def counted():
            return await scrape_bytes(service) == {k: float(v) for k, v in sent.items()}

        await wait_for(counted)
        await wait_for(lambda: service.pipeline.ticks > 1)

    more = write_traffic(log, 200, start=300)
    total = {k: sent[k] + more[k] for k in sent}
    async with running_service(config(tmp_path, log)) as service:

        async def counted_once():
            return await scrape_bytes(service) == {k: float(v) for k, v in total.items()}

        await wait_for(counted_once)
        status, ctype, body = await get(service, "/api/v1/surfaces")
        assert status == 200 and ctype.startswith("application/json")
        data = json.loads(body)
        proxy = next(s for s in data["surfaces"] if s["surface"] == "proxy")
        assert proxy["bytes_total"] == total["proxy"]
        assert proxy["top_contributors"][0]["contributor"] == "10.20.1.5:443/TCP"
        src = data["sources"][0]
        assert src["source"] == "kern" and src["provenance_verified"] is False


async def test_openmetrics_by_accept_header_and_probes(tmp_path):
    log = tmp_path / "kern.log"
    write_traffic(log, 10)
    async with running_service(config(tmp_path, log)) as service:
        status, ctype, body = await get(
            service, "/metrics", Accept="application/openmetrics-text; version=1.0.0"
        )
        assert status == 200 and ctype.startswith("application/openmetrics-text")
        assert body.rstrip().endswith("# EOF")
        status, ctype, body = await get(service, "/metrics")
        assert ctype.startswith("text/plain") and "# EOF" not in body
        assert (await get(service, "/healthz"))[0] == 200
        await wait_for(lambda: service.collectors[0][1].health.up)
        assert (await get(service, "/readyz"))[0] == 200


async def test_hostile_destinations_never_become_series(tmp_path):
    log = tmp_path / "kern.log"
    with open(log, "w") as fh:
        for i in range(20000):
            dst = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
            fh.write(syslog(fence_line(PREFIX, dst, 1024 + i % 60000, "UDP", 40, 40000), i % 3600))
    async with running_service(config(tmp_path, log)) as service:
        await wait_for(lambda: source_count(service, "kern", "records_read") >= 20000, timeout=30)
        await wait_for(lambda: surface_totals(service, "unclassified")[1] == 20000)
        _, _, text = await get(service, "/metrics")
        series = [
            line
            for line in text.splitlines()
            if line.startswith("capalarm_surface_written_bytes_total")
        ]
        assert len(series) == 3
        assert "10.0.1.1" not in text
