"""Real Prometheus (Debian's `prometheus`) scrapes the service; `promtool` checks the exposition
and the shipped rules."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.synthetic import fence_line
from tests.servicekit import RecordsCollector, get, running_service, wait_for

ROOT = Path(__file__).resolve().parents[1]
NEED = "needs Debian's prometheus and promtool (scripts/test.sh installs them)"
pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool"))
    and os.environ.get("CI") != "true",
    reason=NEED,
)


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records() -> tuple[list[KernelRecord], int]:
    recs, total = [], 0
    for i in range(50):
        length = 200 + i
        recs.append(
            KernelRecord(
                ts=0,
                message=fence_line(
                    "EGRESS_FENCE tprom", "10.20.0.9", 443, "TCP", length, 40000 + i
                ),
                facility=0,
                trusted=True,
            )
        )
        total += length
    return recs, total


async def test_prometheus_scrapes_exact_bytes_and_promtool_is_clean(tmp_path):
    recs, total = records()
    collector = RecordsCollector("kernel", recs, ("EGRESS_FENCE tprom",), 0.5)
    cfg = {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "prefixes": ["EGRESS_FENCE tprom"]}],
        "surfaces": [{"name": "proxy", "match": {"dst": ["10.20.0.0/16"], "dport": [443]}}],
    }
    async with running_service(cfg, collectors={"kernel": collector}) as service:
        _, _, body = await get(service, "/metrics")
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=body, capture_output=True, text=True
        )
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
        # The seasonal budget does not judge before a day of history (a label of the lean
        # scrape's one state series per surface).
        assert 'seasonal_budget_judged="0",surface="proxy"} 1.0' in body
        series = [line for line in body.splitlines() if line and not line.startswith("#")]
        surfaces = len(
            {line.split('surface="')[1].split('"')[0] for line in series if 'surface="' in line}
        )
        assert sum('surface="' in line for line in series) <= 10 * surfaces

        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{ROOT / 'dashboards/capalarm.rules.yml'}]\n"
            "scrape_configs:\n"
            f"  - job_name: capalarm\n    static_configs: [{{targets: ['127.0.0.1:{service.http_port}']}}]\n"
        )
        prom = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:

            def query(expr: str, full: bool = False):
                url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode(
                    {"query": expr}
                )
                try:
                    with urllib.request.urlopen(url, timeout=2) as resp:
                        body = json.load(resp)
                except OSError as exc:
                    if full:
                        raise AssertionError(f"query failed: {expr}: {exc}") from exc
                    return None
                return body if full else body["data"]["result"]

            async def scraped():
                result = await asyncio.to_thread(
                    query, 'capalarm_surface_written_bytes_total{surface="proxy"}'
                )
                return result and float(result[0]["value"][1]) == total

            await wait_for(scraped, timeout=45, interval=0.5)

            # A scrape may time out on a loaded machine (the timeout is the 1 s interval);
            # then every series is briefly stale, so each value is waited for, not read once.
            async def value_is(expr: str, want: str) -> bool:
                result = await asyncio.to_thread(query, expr)
                return bool(result) and result[0]["value"][1] == want

            await wait_for(lambda: value_is('up{job="capalarm"}', "1"), timeout=20, interval=0.5)
            # Prometheus asks for gzip and gets it (block by block deflated, one gzip member):
            # it reads every series of the body.

            async def counted_all() -> bool:
                _, _, plain = await get(service, "/metrics")
                want = sum(1 for ln in plain.splitlines() if ln and not ln.startswith("#"))
                got = await asyncio.to_thread(query, 'scrape_samples_scraped{job="capalarm"}')
                return bool(got) and abs(float(got[0]["value"][1]) - want) <= 5

            await wait_for(counted_all, timeout=20, interval=0.5)
            await wait_for(
                lambda: value_is('capalarm_source_provenance_verified{source="kernel"}', "1"),
                timeout=20,
                interval=0.5,
            )

            # Every dashboard query runs; the per-surface panels have data for our surface.
            variables = {
                "$__rate_interval": "1m",
                "$__range": "1h",
                "$job": "capalarm",
                "$instance": ".*",
                "$kind": ".*",
                "$surface": "proxy",
            }
            for name in ("capalarm-overview.json", "capalarm-surface.json"):
                dashboard = json.loads((ROOT / "dashboards" / name).read_text())
                for panel in panels(dashboard):
                    for target in panel.get("targets", []):
                        expr = target["expr"]
                        for var, value in variables.items():
                            expr = expr.replace(var, value)
                        body = await asyncio.to_thread(query, expr, True)
                        assert body["status"] == "success", (panel["title"], expr, body)
                        # A plain per-surface series must have our surface's data (waited for:
                        # a scrape that timed out marks every series stale until the next).
                        if expr.startswith("capalarm_surface_") and "surface=" in expr:

                            async def has_data(expr: str = expr) -> bool:
                                body = await asyncio.to_thread(query, expr, True)
                                return bool(body["data"]["result"])

                            try:
                                await wait_for(has_data, timeout=20, interval=0.5)
                            except AssertionError:
                                raise AssertionError((panel["title"], expr)) from None
        finally:
            prom.terminate()
            prom.wait(10)


def test_shipped_rules_pass_promtool():
    res = subprocess.run(
        ["promtool", "check", "rules", str(ROOT / "dashboards/capalarm.rules.yml")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
