"""The Prometheus rules in dashboards/capalarm.rules.yml, checked by the real promtool: they
load, every alerting rule has a unit test that passes, and every metric they read is one
capalarm exports (README.md's Metrics table, and a running capalarm's /metrics); the cross-node
rules on 2, 5 and 50 nodes."""

from __future__ import annotations

import pytest
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
from test_status_page import view

from exporters.prometheus import budget_figures
from tests.servicekit import RecordsCollector, get, running_service


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


# Cross-node rules on clusters of 2, 5 and 50 nodes, built here because fifty nodes' series do
# not belong in a hand-written file.  Every surface has baseline 100 B/s and spike threshold
# 200 B/s on each node (a margin of 100 B/s), so a node at `f` of its margin writes 100 + 100 f
# and pages alone only at f >= 1; "elevated" (twice the baseline + 8) needs f > 1.08, so the
# learning-time node count stays out of these cases and the combined statistic alone decides.
BASE, THRESHOLD = 100.0, 200.0


def node_series(node: int, surface: str, kind: str, rate: float, base: float = BASE) -> list:
    labels = f'job="capalarm",instance="node-{node}",surface="{surface}",kind="{kind}"'
    # An idle node (nothing written, nothing expected) keeps the spike rule's floor threshold.
    threshold = THRESHOLD if base else 1024.0
    return [
        {
            "series": f"capalarm_surface_write_rate_bytes_per_second{{{labels}}}",
            "values": f"{rate}x20",
        },
        {
            "series": f"capalarm_surface_baseline_bytes_per_second{{{labels}}}",
            "values": f"{base}x20",
        },
        {
            "series": f"capalarm_surface_threshold_bytes_per_second{{{labels}}}",
            "values": f"{threshold}x20",
        },
        {
            "series": f"capalarm_surface_written_bytes_total{{{labels}}}",
            "values": f"0+{rate * 60:g}x20",
        },
    ]


def spread(
    nodes: int, surface: str, kind: str, fractions: dict[int, float], idle: bool = False
) -> list:
    """Every node of the cluster on one surface: the nodes in ``fractions`` at that fraction
    of their spike margin, the others at their baseline (or, with ``idle``, writing nothing
    and expecting nothing)."""
    out = []
    for node in range(1, nodes + 1):
        if node in fractions:
            out += node_series(node, surface, kind, BASE + fractions[node] * (THRESHOLD - BASE))
        elif idle:
            out += node_series(node, surface, kind, 0.0, base=0.0)
        else:
            out += node_series(node, surface, kind, BASE)
    return out


def run_rule_test(tmp_path, name: str, series: list, alerts: list[dict]) -> None:
    promtool = require_tool("promtool", "prometheus")
    (tmp_path / RULES.name).write_text(RULES.read_text())
    test = {
        "rule_files": [RULES.name],
        "evaluation_interval": "1m",
        "tests": [
            {"name": name, "interval": "1m", "input_series": series, "alert_rule_test": alerts}
        ],
    }
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = run([promtool, "test", "rules", "t.yml"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def swarm_alert(surface: str, kind: str, statistic: float) -> dict:
    return {
        "exp_labels": {"severity": "page", "surface": surface, "kind": kind},
        "exp_annotations": {
            "summary": f"{kind} surface {surface} is written above its baseline on several "
            "nodes at once, together beyond what one node's spike rule allows",
            "description": "A swarm spread one workload per node stays under every node's own "
            f"threshold; this combines the nodes (statistic {statistic:.2f}, 1 = one node's "
            "threshold; 0: counted while learning). Compare "
            "surface_kind:capalarm_surface_written_bytes:rate5m with "
            "surface_kind:capalarm_surface_baseline_bytes_per_second:sum.",
        },
    }


@pytest.mark.parametrize(
    ("nodes", "each", "under"),
    [(2, 0.75, 0.7), (5, 0.5, 0.4), (50, 0.2, 0.13)],
)
def test_a_swarm_no_node_sees_alone_pages_on_any_cluster_size(tmp_path, nodes, each, under):
    """Every node at `each` of its own spike margin (none pages alone) pages together; at
    `under` it does not: n nodes must each be past 1/sqrt(n) of their margin.  And a swarm on
    just two nodes, each at 0.75, pages whatever the cluster's size where the other nodes do not
    write that surface, and stays quiet where the others' ordinary traffic could explain it."""
    everyone = dict.fromkeys(range(1, nodes + 1), each)
    series = spread(nodes, "board", "registry", everyone)
    series += spread(nodes, "wiki", "registry", dict.fromkeys(range(1, nodes + 1), under))
    series += spread(nodes, "cache", "fs", {1: 0.75, nodes: 0.75}, idle=True)
    # Over its own threshold on one node: that node pages itself; the swarm is not two nodes.
    series += spread(nodes, "proxy", "egress", {1: 4.0} | ({2: 0.3} if nodes == 2 else {}))
    firing = [
        swarm_alert("board", "registry", each * nodes / nodes**0.5),
        swarm_alert("cache", "fs", 1.5 / 2**0.5),
    ]
    if nodes == 2:  # two writers of two: the same swarm as on cache
        firing.sort(key=lambda a: a["exp_labels"]["surface"])
    run_rule_test(
        tmp_path,
        f"CapalarmSwarm on {nodes} nodes",
        series,
        [
            {"eval_time": "3m", "alertname": "CapalarmSwarm", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "CapalarmSwarm", "exp_alerts": firing},
        ],
    )


def budget_series(node: int, surface: str, kind: str, capacity: float, horizons: dict) -> list:
    """One surface on one node: its capacity (B/s) and what its budget horizons, name ->
    (allowance B/s, tolerance B), let through in an hour, as capalarm exports it (its own
    exporter works it out from the horizons)."""
    labels = f'job="capalarm",instance="node-{node}",surface="{surface}",kind="{kind}"'
    v = view(surface, kind=kind)
    v.budget_horizons = [(h, k * 8, t * 8, 0.0) for h, (k, t) in horizons.items()]
    _, hour = budget_figures(v)
    return [
        {
            "series": f"capalarm_surface_capacity_bytes_per_second{{{labels}}}",
            "values": f"{capacity:g}x70",
        },
        {
            "series": f"capalarm_surface_budget_hour_allowance_bytes_per_second{{{labels}}}",
            "values": f"{hour!r}x70",
        },
    ]


# Budgets as users write them: README's single horizon (named `base` by default), a base with
# a `1d` and a custom-named horizon, and the built-in 1m/1h/1d envelope.  An hour passes at
# most k + h / 3600 s of each horizon: "api" 1000 + 100 = 1100 B/s; "sink" the least of 5010,
# 600 and 700 = 600 B/s (its 1d horizon binds over an hour); "std" the least of 2002, 350
# and 400 = 350 B/s.  So each node's surfaces of a kind let through 2050 B/s over an hour, and
# the cluster alert allows half of that summed over nodes: 1025 B/s a node.
API = {"base": (1000.0, 360000.0)}
SINK = {"base": (5000.0, 36000.0), "1d": (400.0, 720000.0), "weekly": (300.0, 1440000.0)}
STD = {"1m": (2000.0, 8000.0), "1h": (250.0, 360000.0), "1d": (100.0, 1080000.0)}


@pytest.mark.parametrize("nodes", [2, 5, 50])
def test_cluster_budget_fires_at_the_summed_allowance_whatever_the_horizons_are_called(
    tmp_path, nodes
):
    """egress writes 1100 B/s a node, above half the allowance: it fires; fs 950 B/s, below
    it: quiet.  Summing only horizon="1h" allowances counted std's 250 B/s alone, so both
    fired, fs at under half of what its budgets allow."""
    series = []
    for node in range(1, nodes + 1):
        for kind, total in (("egress", 1100.0), ("fs", 950.0)):
            series += budget_series(node, f"{kind}-api", kind, total / 3, API)
            series += budget_series(node, f"{kind}-sink", kind, total / 3, SINK)
            series += budget_series(node, f"{kind}-std", kind, total / 3, STD)
        # Each node's own aggregate repeats its surfaces: summed too, it would count twice.
        series += budget_series(node, "(all)", "egress", 1100.0, {"base": (1025.0, 1.0)})
    carried = 1100 * 8 * nodes
    pretty = f"{carried / 1000:.4g}k" if carried < 1e6 else f"{carried / 1e6:.4g}M"
    run_rule_test(
        tmp_path,
        f"CapalarmClusterBudget on {nodes} nodes",
        series,
        [
            {"eval_time": "5m", "alertname": "CapalarmClusterBudget", "exp_alerts": []},
            {
                "eval_time": "20m",
                "alertname": "CapalarmClusterBudget",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "page", "kind": "egress"},
                        "exp_annotations": {
                            "summary": f"egress surfaces across all nodes carried {pretty}bit/s "
                            "over the last hour, above half the cluster's summed hourly allowance"
                        },
                    }
                ],
            },
        ],
    )


# Two surfaces a node: 2n cells, each past 1/sqrt(2n) of its margin to page together.
@pytest.mark.parametrize(
    ("nodes", "each", "under"),
    [(2, 0.6, 0.45), (5, 0.4, 0.28), (50, 0.15, 0.09)],
)
def test_a_swarm_over_a_kinds_surfaces_pages_on_any_cluster_size(tmp_path, nodes, each, under):
    """CapalarmSwarmSpread combines every surface of a kind on every node the same way: two fs
    surfaces on each node at `each` of their margins page (the count it had needed 10 nodes);
    egress surfaces at `under` do not."""
    series = []
    for surface in ("scratch", "pip-cache"):
        series += spread(nodes, surface, "fs", dict.fromkeys(range(1, nodes + 1), each))
        series += spread(
            nodes, f"{surface}-out", "egress", dict.fromkeys(range(1, nodes + 1), under)
        )
    statistic = 2 * nodes * each / (2 * nodes) ** 0.5
    run_rule_test(
        tmp_path,
        f"CapalarmSwarmSpread on {nodes} nodes",
        series,
        [
            {"eval_time": "5m", "alertname": "CapalarmSwarmSpread", "exp_alerts": []},
            {
                "eval_time": "16m",
                "alertname": "CapalarmSwarmSpread",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "page", "kind": "fs"},
                        "exp_annotations": {
                            "summary": "fs surfaces are written above their baselines across "
                            "nodes at once, together beyond what one surface's spike rule allows",
                            "description": "A coordinated swarm across surfaces and nodes "
                            f"(statistic {statistic:.2f}, 1 = one surface's threshold on one node; "
                            "0: at least a quarter of the nodes, and 10, with some fs surface at "
                            "more than twice its baseline while learning).",
                        },
                    }
                ],
            },
        ],
    )


async def test_every_metric_the_rules_read_is_in_the_exporters_output(tmp_path):
    """Not only documented: /metrics of a running capalarm (a kernel source, a surface with
    the README's one-horizon budget, a destination) has every raw series the rules read."""
    cfg = {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "prefixes": ["EGRESS_FENCE t"]}],
        "surfaces": [
            {
                "name": "proxy",
                "match": {"dst": ["10.20.0.0/16"]},
                "budget": {"allowance_bits_per_second": 1e6, "tolerance_bits": 64e6},
            }
        ],
        "notifications": {
            "destinations": [{"type": "webhook", "name": "soc", "url": "http://127.0.0.1:9/hook"}]
        },
    }
    collector = RecordsCollector("kernel", [], ("EGRESS_FENCE t",), 0.5)
    async with running_service(cfg, collectors={"kernel": collector}) as service:
        _, _, body = await get(service, "/metrics")
    exported = {
        line.split("{")[0].split(" ")[0] for line in body.splitlines() if line[:1] not in ("#", "")
    }
    # A family written with no series at the moment: capalarm_alert_state while every rule is
    # at rest (by default a surface's state is written only while pending or firing).
    exported |= {line.split(" ")[2] for line in body.splitlines() if line.startswith("# TYPE ")}
    recorded = {r["record"] for r in rules() if "record" in r}
    for rule in rules():
        missing = metric_names_in(rule["expr"]) - recorded - exported - {"up"}
        assert not missing, f"{rule.get('alert') or rule.get('record')} reads {sorted(missing)}"
