"""The Grafana dashboards in dashboards/: generated (scripts/gen_dashboards.py) and current,
structurally what Grafana needs (a datasource variable, a unit and a description on every
panel, $__rate_interval in every rate), and every query parsed by the real promtool and
reading only metrics capalarm exports."""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml
from deploykit import DASHBOARDS, ROOT, known_metric_names, metric_names_in, require_tool, run

FILES = sorted(DASHBOARDS.glob("*.json"))
# Grafana's variables, replaced by what they stand for when a query runs.
SUBSTITUTES = {
    "$__rate_interval": "1m",
    "$__range": "6h",
    "$__interval": "15s",
}


def load(path):
    return json.loads(path.read_text())


def panels(dashboard):
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def exprs(dashboard):
    for p in panels(dashboard):
        for t in p["targets"]:
            yield p["title"], t["expr"]


def concrete(expr: str, variables: list[str]) -> str:
    for k, v in SUBSTITUTES.items():
        expr = expr.replace(k, v)
    for name in variables:
        expr = expr.replace(f"${{{name}}}", ".*").replace(f"${name}", ".*")
    return expr


def label_values_selector(query: str) -> str:
    """``label_values(SELECTOR, label)`` (Grafana's variable query) as the PromQL it runs."""
    m = re.fullmatch(r"label_values\((.+),\s*([A-Za-z_]\w*)\)", query)
    assert m, query
    return f"group by ({m.group(2)}) ({m.group(1)})"


def test_dashboards_are_generated_and_current():
    res = run([sys.executable, "scripts/gen_dashboards.py", "--check"], cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert [p.name for p in FILES] == ["capalarm-overview.json", "capalarm-surface.json"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_panel_has_a_datasource_variable_unit_description_and_query(path):
    dashboard = load(path)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}", v["name"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(dashboard):
        assert p["description"].strip(), p["title"]
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_rates_use_the_rate_interval(path):
    """$__rate_interval keeps at least four scrapes in every rate window, whatever the
    dashboard's zoom (Grafana's Prometheus data source docs); totals over the shown range
    use $__range."""
    for title, expr in exprs(load(path)):
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "$__range"), f"{title}: [{window}]"
        if re.search(r"\b(rate|increase|avg_over_time)\(", expr):
            assert "[$__" in expr, title


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_query_parses_with_promtool(path, tmp_path):
    """promtool parses each query as the expression of a recording rule: a PromQL syntax
    error or an unknown function fails `promtool check rules`."""
    promtool = require_tool("promtool", "prometheus")
    dashboard = load(path)
    names = [v["name"] for v in dashboard["templating"]["list"]]
    queries = [concrete(e, names) for _, e in exprs(dashboard)]
    queries += [
        concrete(label_values_selector(v["query"]["query"]), names)
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}:test", "expr": q}
                    for i, q in enumerate(queries)
                ],
            }
        ]
    }
    file = tmp_path / "queries.yml"
    file.write_text(yaml.safe_dump(rules))
    res = run([promtool, "check", "rules", str(file)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(queries)} rules found" in res.stdout


def test_a_broken_query_fails_the_promtool_check(tmp_path):
    promtool = require_tool("promtool", "prometheus")
    file = tmp_path / "queries.yml"
    rules = {
        "groups": [
            {"name": "d", "rules": [{"record": "d:q:t", "expr": "sum by (surface (rate(x[1m]))"}]}
        ]
    }
    file.write_text(yaml.safe_dump(rules))
    assert run([promtool, "check", "rules", str(file)]).returncode != 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_queries_read_only_metrics_capalarm_exports(path):
    known = known_metric_names()
    for title, expr in exprs(load(path)):
        unknown = metric_names_in(expr) - known
        assert not unknown, f"{title}: {sorted(unknown)}"


def test_overview_shows_what_issue_14_asks_for():
    """Surfaces against threshold and budget, alert states, source health and proof of sight,
    the notifier queue: each read from the metric that carries it."""
    text = json.dumps(load(DASHBOARDS / "capalarm-overview.json"))
    for metric in (
        "capalarm_surface_threshold_bytes_per_second",
        "capalarm_surface_budget_ratio",  # excess over tolerance, the horizon nearest to firing
        "capalarm_alert_state",
        "capalarm_source_up",
        "capalarm_source_last_record_timestamp_seconds",
        "capalarm_notifier_queue_depth",
        "capalarm_notifier_oldest_queued_age_seconds",
    ):
        assert metric in text, metric


def test_surface_drill_down_selects_one_surface():
    dashboard = load(DASHBOARDS / "capalarm-surface.json")
    surface = next(v for v in dashboard["templating"]["list"] if v["name"] == "surface")
    assert surface["multi"] is False and surface["includeAll"] is False
    for title, expr in exprs(dashboard):
        assert 'surface="$surface"' in expr or 'target="$surface"' in expr, title
