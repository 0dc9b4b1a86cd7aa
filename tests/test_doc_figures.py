"""What the docs and comments state, checked against the code: scripts they name exist, the
series count docs/scaling.md plans with, and the one Retry-After parser every client uses."""

from __future__ import annotations

import re
import time
from pathlib import Path

from alarm.collectors.registry.http import MAX_RETRY_AFTER as REGISTRY_MAX
from alarm.collectors.registry.http import retry_after_seconds
from alarm.config import config_from_dict
from alarm.pipeline import Pipeline
from exporters.delivery import MAX_RETRY_AFTER as DELIVERY_MAX
from exporters.delivery import retry_after as delivery_retry_after
from exporters.prometheus import render

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    *ROOT.glob("*.md"),
    *(ROOT / "docs").glob("*.md"),
    *(ROOT / "dashboards").glob("*.yml"),
    *(ROOT / "deploy").rglob("*"),
    *(ROOT / "helm" / "capalarm").rglob("*.yaml"),
    *(ROOT / "helm" / "capalarm" / "files").glob("*.yml"),
]


def test_every_script_the_docs_name_exists():
    """The rules file named scripts/gen_deploy_files.py, which never existed."""
    missing = []
    for path in TEXTS:
        if not path.is_file():
            continue
        for name in set(re.findall(r"\b(?:scripts|bench)/[\w/]+\.(?:py|sh)\b", path.read_text())):
            if not (ROOT / name).exists():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


def series_and_bytes(surfaces: int) -> tuple[int, int]:
    config = config_from_dict(
        {
            "tick": "10s",
            "surfaces": [
                {"name": f"s{i}", "match": {"dport": [1000 + i]}} for i in range(surfaces)
            ],
        }
    )
    pipeline = Pipeline(config, {"kernel": ("external", "egress")})
    now = time.time()
    pipeline.start(now)
    body, _ = render(pipeline.snapshot(now, 5, {}, {}, None), [], None)
    series = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    return len(series), len(body)


def test_the_series_per_surface_row_are_what_docs_scaling_says():
    """docs/scaling.md planned a 10,000-node fleet with 27 series a surface row while /metrics
    wrote 31."""
    text = (ROOT / "docs" / "scaling.md").read_text()
    [stated] = re.findall(r"Each surface row exports (\d+) series", text)
    few, many = series_and_bytes(10), series_and_bytes(110)
    per_row = (many[0] - few[0]) / 100
    assert per_row == int(stated), (per_row, stated)
    assert f"{int(stated)} series per surface" in text
    assert f"{int(stated)} x (S + 2)" in text


def test_retry_after_is_read_once_and_bounded_for_every_client():
    """The registry's copy was unbounded: Retry-After: 99999999999 put the next poll off for
    three thousand years, saved with the source's position."""
    now = 1_790_000_000.0
    for parse, limit in ((retry_after_seconds, REGISTRY_MAX), (delivery_retry_after, DELIVERY_MAX)):
        assert parse("120", now) == 120.0
        assert parse(" 7 ", now) == 7.0
        assert parse("99999999999", now) == limit
        date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now + 30))
        assert parse(date, now) == 30.0
        assert parse("Fri, 31 Dec 9999 23:59:59 GMT", now) == limit
        assert parse(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now - 60)), now) == 0
        # Not one of the two forms (a Unicode digit passed str.isdigit and crashed float()).
        for junk in ("²", "soon", "-5", "1.5", "", None, "Mon, 99 Foo 2020"):
            assert parse(junk, now) is None, junk
    assert REGISTRY_MAX == 86400.0  # the longest poll interval a registry source may have
