"""The Prometheus rules in dashboards/capalarm.rules.yml, checked by the real promtool: they
load, every alerting rule has a unit test that passes, and every metric they read is one
capalarm exports (README.md's Metrics table)."""

from __future__ import annotations

import yaml
from deploykit import (
    DASHBOARDS,
    RULE_TESTS,
    RULES,
    known_metric_names,
    metric_names_in,
    require_tool,
    run,
)


def load(path):
    return yaml.safe_load(path.read_text())


def rules() -> list[dict]:
    return [r for g in load(RULES)["groups"] for r in g["rules"]]


def test_promtool_check_rules_accepts_the_rules():
    promtool = require_tool("promtool", "prometheus")
    res = run([promtool, "check", "rules", str(RULES)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules())} rules found" in res.stdout


def test_promtool_unit_tests_pass():
    promtool = require_tool("promtool", "prometheus")
    res = run([promtool, "test", "rules", RULE_TESTS.name], cwd=DASHBOARDS)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alerting_rule_has_a_unit_test_that_fires_and_one_that_stays_quiet():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in load(RULE_TESTS)["tests"]:
        for t in case.get("alert_rule_test", []):
            (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
    assert alerts - firing == set(), "alerts without a test in which they fire"
    assert alerts - quiet == set(), "alerts without a test in which they stay quiet"
    assert (firing | quiet) - alerts == set(), "tests of alerts that do not exist"


def test_a_broken_rule_fails_its_unit_test(tmp_path):
    """The unit tests can fail: raise the swarm's node count and its test no longer passes."""
    promtool = require_tool("promtool", "prometheus")
    text = RULES.read_text()
    assert "surface_kind:capalarm_surface_elevated_instances:count >= 5" in text
    (tmp_path / RULES.name).write_text(
        text.replace("elevated_instances:count >= 5", "elevated_instances:count >= 7")
    )
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    res = run([promtool, "test", "rules", RULE_TESTS.name], cwd=tmp_path)
    assert res.returncode != 0
    assert "CapalarmSwarm" in res.stdout + res.stderr


def test_rules_read_only_metrics_capalarm_exports():
    known = known_metric_names()
    recorded = {r["record"] for r in rules() if "record" in r}
    for rule in rules():
        unknown = metric_names_in(rule["expr"]) - known - recorded
        assert not unknown, f"{rule.get('alert') or rule.get('record')} reads {sorted(unknown)}"


def test_recorded_series_follow_the_naming_convention_and_drop_the_node_aggregate():
    """level:metric:operations (https://prometheus.io/docs/practices/rules/); a cluster sum
    over surfaces must leave out each node's "(all)" surface, or it counts everything twice."""
    for rule in rules():
        if "record" not in rule:
            continue
        level, metric, ops = rule["record"].split(":")
        assert level and metric.startswith("capalarm_") and ops, rule["record"]
        if "surface" in rule["expr"] and "capalarm_surface_" in rule["expr"]:
            for name in metric_names_in(rule["expr"]):
                if name.startswith("capalarm_surface_"):
                    assert f'{name}{{surface!="(all)"}}' in rule["expr"], rule["record"]


def test_every_alert_has_a_severity_and_a_summary():
    for rule in rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("page", "warning"), rule["alert"]
            assert rule["annotations"]["summary"].strip(), rule["alert"]
