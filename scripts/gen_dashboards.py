"""Write the Grafana dashboards in dashboards/, or with ``--check`` report the stale ones.

Two dashboards, in Grafana's dashboard JSON model
(https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/):

- ``capalarm-overview.json``: every surface by rate against its spike threshold and by
  capacity against its budget, alert states, source health and proof of sight, the notifier
  queue, and the cluster view (on how many nodes a surface is elevated).
- ``capalarm-surface.json``: one surface, drilled down: rate with baseline and threshold per
  node, events, capacity against the hourly allowance, the budget nearest to firing, alert states.

Both pick their Prometheus with a ``datasource`` variable, use ``$__rate_interval`` in every
rate (https://grafana.com/docs/grafana/latest/datasources/prometheus/template-variables/),
and give every panel a unit and a description.  Metric names are README.md's Metrics table.
Generated rather than hand-edited so that layout, datasource and units stay uniform;
tests/test_dashboards.py runs ``--check`` and parses every query with promtool.

    python scripts/gen_dashboards.py
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24  # Grafana's grid is 24 columns wide
SCHEMA_VERSION = 39  # Grafana 10.4 / 11


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass
class Panel:
    title: str
    type: str
    description: str
    unit: str
    queries: list[Query]
    w: int = 12
    h: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: list[tuple[float | None, str]] = field(default_factory=lambda: [(None, "green")])
    mappings: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str
    panels: list[Panel]


# Alert states as capalarm exports them (capalarm_alert_state: 0 inactive, 1 pending, 2 firing).
ALERT_STATE_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "inactive", "color": "green", "index": 0},
            "1": {"text": "pending", "color": "orange", "index": 1},
            "2": {"text": "firing", "color": "red", "index": 2},
        },
    }
]
UP_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "down", "color": "red", "index": 0},
            "1": {"text": "up", "color": "green", "index": 1},
        },
    }
]
READY_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "learning", "color": "blue", "index": 0},
            "1": {"text": "judged", "color": "green", "index": 1},
        },
    }
]
# Share of a threshold or tolerance: 1 is where capalarm fires.
SHARE = [(None, "green"), (0.5, "yellow"), (1.0, "red")]
ANY_IS_BAD = [(None, "green"), (1, "red")]


def variable_datasource() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
    }


def variable_query(
    name: str, label: str, query: str, *, multi: bool = True, include_all: bool = True
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,  # on time range change: nodes and surfaces come and go
        "sort": 1,
        "multi": multi,
        "includeAll": include_all,
        "hide": 0,
    }
    if include_all:
        out["current"] = {"text": "All", "value": "$__all"}
        out["allValue"] = ".*"
    return out


def render_panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for i, q in enumerate(panel.queries):
        t: dict[str, Any] = {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": q.expr,
            "legendFormat": q.legend or "__auto",
            "range": not q.instant,
            "instant": q.instant,
        }
        if q.table:
            t["format"] = "table"
        targets.append(t)
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "thresholds": {
            "mode": "absolute",
            "steps": [{"value": v, "color": c} for v, c in panel.thresholds],
        },
        "mappings": panel.mappings,
        "color": {
            "mode": "thresholds" if panel.type in ("stat", "bargauge") else "palette-classic"
        },
    }
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.custom:
        defaults["custom"] = panel.custom
    return {
        "id": pid,
        "type": panel.type,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.w, "h": panel.h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": panel.options,
        "targets": targets,
    }


def layout(rows: list[Row]) -> list[dict[str, Any]]:
    """Rows of panels, left to right, wrapping at the grid's width."""
    out: list[dict[str, Any]] = []
    pid = 1
    y = 0
    for row in rows:
        out.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": WIDTH, "h": 1},
                "panels": [],
            }
        )
        pid += 1
        y += 1
        x = 0
        line_h = 0
        for panel in row.panels:
            if x + panel.w > WIDTH:
                x, y, line_h = 0, y + line_h, 0
            out.append(render_panel(panel, pid, x, y))
            pid += 1
            x += panel.w
            line_h = max(line_h, panel.h)
        y += line_h
    return out


def dashboard(
    uid: str, title: str, description: str, variables: list[dict], rows: list[Row], links: list
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["capalarm"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "links": links,
        "annotations": {"list": []},
        "templating": {"list": variables},
        "panels": layout(rows),
    }


def stat(title: str, description: str, expr: str, unit: str = "none", **kw: Any) -> Panel:
    kw.setdefault("thresholds", ANY_IS_BAD)
    return Panel(
        title,
        "stat",
        description,
        unit,
        [Query(expr, instant=True)],
        w=4,
        h=4,
        options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
        **kw,
    )


def timeseries(title: str, description: str, unit: str, *queries: Query, **kw: Any) -> Panel:
    kw.setdefault(
        "options",
        {
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["max", "lastNotNull"],
            }
        },
    )
    return Panel(title, "timeseries", description, unit, list(queries), **kw)


def bars(title: str, description: str, unit: str, expr: str, legend: str, **kw: Any) -> Panel:
    return Panel(
        title,
        "bargauge",
        description,
        unit,
        [Query(expr, legend, instant=True)],
        options={
            "displayMode": "gradient",
            "orientation": "horizontal",
            "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"]},
        },
        **kw,
    )


def state_timeline(title: str, description: str, expr: str, legend: str, mappings: list) -> Panel:
    return Panel(
        title,
        "state-timeline",
        description,
        "none",
        [Query(expr, legend)],
        mappings=mappings,
        thresholds=[(None, "green")],
        options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8},
    )


# Selectors the overview applies to every query.
SEL = 'job=~"$job", instance=~"$instance"'
SURF = f'{SEL}, kind=~"$kind", surface!="(all)"'
# A surface is elevated on a node when it runs above twice its baseline plus 8 B/s (the
# recording rules use the same definition: dashboards/capalarm.rules.yml).
ELEVATED = (
    f"avg_over_time(capalarm_surface_write_rate_bytes_per_second{{{SURF}}}[$__rate_interval])"
    f" > 2 * avg_over_time(capalarm_surface_baseline_bytes_per_second{{{SURF}}}[$__rate_interval]) + 8"
)


def overview() -> dict[str, Any]:
    glance = Row(
        "At a glance",
        [
            stat(
                "Alerts firing",
                "Surface and source alerts in state firing (capalarm_alert_state == 2) on the selected nodes.",
                f"count(capalarm_alert_state{{{SEL}}} == 2) or vector(0)",
            ),
            stat(
                "Targets down",
                "capalarm instances Prometheus cannot scrape: their nodes are not watched.",
                f"count(up{{{SEL}}} == 0) or vector(0)",
            ),
            stat(
                "Sources not reading",
                "Sources with capalarm_source_up 0: kernel log, directories or registries not being read.",
                f"count(capalarm_source_up{{{SEL}}} == 0) or vector(0)",
            ),
            stat(
                "Records lost",
                "Kernel fence records lost (ring overwritten, sequence gaps, truncation) over the dashboard's range.",
                f"sum(increase(capalarm_source_records_lost_total{{{SEL}}}[$__range])) or vector(0)",
            ),
            stat(
                "Forged records",
                "Fence look-alikes injected from user space and rejected, over the dashboard's range.",
                f"sum(increase(capalarm_source_forged_records_total{{{SEL}}}[$__range])) or vector(0)",
            ),
            stat(
                "Notifications waiting",
                "Alert notifications queued and not yet delivered, over every notifier.",
                f"sum(capalarm_notifier_queue_depth{{{SEL}}}) or vector(0)",
                thresholds=[(None, "green"), (1, "yellow"), (100, "red")],
            ),
        ],
    )
    surfaces = Row(
        "Surfaces",
        [
            bars(
                "Rate against spike threshold",
                "Each surface's last-tick write rate as a share of its spike threshold, on the node where it is highest. 100% is where the spike rule fires; surfaces still learning their baseline have no threshold yet.",
                "percentunit",
                f"topk(20, max by (surface, kind) (capalarm_surface_write_rate_bytes_per_second{{{SURF}}} / (capalarm_surface_threshold_bytes_per_second{{{SURF}}} > 0)))",
                "{{surface}} ({{kind}})",
                min=0,
                max=1,
                thresholds=SHARE,
            ),
            bars(
                "Capacity against budget",
                "Each surface's capacity-budget excess (the CUSUM of estimated bits above the allowance) as a share of its tolerance, on its worst horizon (or the seasonal budget) and node (capalarm_surface_budget_ratio). 100% is where the budget rule fires.",
                "percentunit",
                f"topk(20, max by (surface, kind) (capalarm_surface_budget_ratio{{{SURF}}}))",
                "{{surface}} ({{kind}})",
                min=0,
                max=1,
                thresholds=SHARE,
            ),
            timeseries(
                "Write rate by surface",
                "Bytes per second written through each surface, summed over the selected nodes.",
                "Bps",
                Query(
                    f"sum by (surface, kind) (rate(capalarm_surface_written_bytes_total{{{SURF}}}[$__rate_interval]))",
                    "{{surface}} ({{kind}})",
                ),
            ),
            timeseries(
                "Capacity bound by surface",
                "Lampson capacity bound (8 x bytes + metadata bits per event) in bits per second, summed over the selected nodes.",
                "bps",
                Query(
                    f"8 * sum by (surface, kind) (capalarm_surface_capacity_bytes_per_second{{{SURF}}})",
                    "{{surface}} ({{kind}})",
                ),
            ),
        ],
    )
    alerts = Row(
        "Alerts",
        [
            state_timeline(
                "Alert states over time",
                "Every surface and source rule on the selected nodes: inactive, pending or firing.",
                f"max by (target_type, target, rule) (capalarm_alert_state{{{SEL}}})",
                "{{target_type}} {{target}} {{rule}}",
                ALERT_STATE_MAPPINGS,
            ),
            Panel(
                "Alerts pending or firing now",
                "table",
                "Rules in state pending (1) or firing (2) now, per node; evidence is in each node's /api/v1/alerts.",
                "none",
                [Query(f"capalarm_alert_state{{{SEL}}} > 0", instant=True, table=True)],
                mappings=ALERT_STATE_MAPPINGS,
                options={"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]},
            ),
        ],
    )
    sight = Row(
        "Sources and proof of sight",
        [
            state_timeline(
                "Source up",
                "Whether each source is reading (capalarm_source_up), per node.",
                f"capalarm_source_up{{{SEL}}}",
                "{{instance}} {{source}}",
                UP_MAPPINGS,
            ),
            timeseries(
                "Time since last record",
                "Seconds since each source last read a record. A fence that logs nothing for hours on a busy node is more likely broken than quiet.",
                "s",
                Query(
                    f"time() - (capalarm_source_last_record_timestamp_seconds{{{SEL}}} > 0)",
                    "{{instance}} {{source}}",
                ),
            ),
            timeseries(
                "Records read, lost and forged",
                "Per-second rates of records read, lost and rejected as forged, summed per source over the selected nodes.",
                "ops",
                Query(
                    f"sum by (source) (rate(capalarm_source_records_read_total{{{SEL}}}[$__rate_interval]))",
                    "{{source}} read",
                ),
                Query(
                    f"sum by (source) (rate(capalarm_source_records_lost_total{{{SEL}}}[$__rate_interval]))",
                    "{{source}} lost",
                ),
                Query(
                    f"sum by (source) (rate(capalarm_source_forged_records_total{{{SEL}}}[$__rate_interval]))",
                    "{{source}} forged",
                ),
            ),
            timeseries(
                "Parse errors",
                "Per-second rate of records that matched a fence prefix but did not parse, per source.",
                "ops",
                Query(
                    f"sum by (source) (rate(capalarm_source_parse_errors_total{{{SEL}}}[$__rate_interval]))",
                    "{{source}}",
                ),
            ),
        ],
    )
    notify = Row(
        "Notifications",
        [
            timeseries(
                "Queue depth",
                "Notifications waiting per notifier: alerts raised but not yet delivered.",
                "short",
                Query(
                    f"sum by (notifier) (capalarm_notifier_queue_depth{{{SEL}}})", "{{notifier}}"
                ),
                w=8,
            ),
            timeseries(
                "Oldest queued notification",
                "Age of the oldest waiting notification per notifier, on the worst node.",
                "s",
                Query(
                    f"max by (notifier) (capalarm_notifier_oldest_queued_age_seconds{{{SEL}}})",
                    "{{notifier}}",
                ),
                w=8,
            ),
            timeseries(
                "Deliveries",
                "Per-second rates of notifications sent, retried, failed after the last retry and dropped, per notifier; and the dead-letter table's size.",
                "ops",
                Query(
                    f"sum by (notifier) (rate(capalarm_notifier_sent_total{{{SEL}}}[$__rate_interval]))",
                    "{{notifier}} sent",
                ),
                Query(
                    f"sum by (notifier) (rate(capalarm_notifier_retried_total{{{SEL}}}[$__rate_interval]))",
                    "{{notifier}} retried",
                ),
                Query(
                    f"sum by (notifier) (rate(capalarm_notifier_failed_total{{{SEL}}}[$__rate_interval]))",
                    "{{notifier}} failed",
                ),
                Query(
                    f"sum by (notifier) (rate(capalarm_notifier_dropped_total{{{SEL}}}[$__rate_interval]))",
                    "{{notifier}} dropped",
                ),
                w=8,
            ),
            stat(
                "Dead letters",
                "Notifications in the dead-letter tables (rejected, or undelivered past the maximum age): see /api/v1/notifications.",
                f"sum(capalarm_notifier_dead_letters{{{SEL}}}) or vector(0)",
            ),
            stat(
                "Held in memory",
                "Notifications held in memory only because the outbox could not be written (disk full).",
                f"sum(capalarm_notifier_unpersisted{{{SEL}}}) or vector(0)",
            ),
        ],
    )
    cluster = Row(
        "Across nodes",
        [
            timeseries(
                "Nodes on which a surface is elevated",
                "For each surface, the number of nodes where it runs above twice its own baseline (plus 8 B/s): a swarm spread one workload per node, each under its node's threshold, shows here.",
                "short",
                Query(f"count by (surface, kind) ({ELEVATED})", "{{surface}} ({{kind}})"),
            ),
            timeseries(
                "Capacity by kind against the cluster's allowance",
                "Capacity bound summed over every surface of each kind on the selected nodes, against half the summed hourly allowance (the CapalarmClusterBudget alert's line).",
                "bps",
                Query(
                    f"8 * sum by (kind) (capalarm_surface_capacity_bytes_per_second{{{SURF}}})",
                    "{{kind}} capacity",
                ),
                Query(
                    f"0.5 * 8 * sum by (kind) (capalarm_surface_budget_hour_allowance_bytes_per_second{{{SURF}}})",
                    "{{kind}} half of hourly allowance",
                ),
            ),
            timeseries(
                "Members writing above their own normal (swarm)",
                "Per node and kind, the aggregate's members statistic: how far its members write above their own normal size per write, combined over members and the last 20 minutes (about N(0,1) on ordinary traffic), against its calibrated threshold; above it, the aggregate's spike alert fires with statistic members.",
                "short",
                Query(
                    f'max by (instance, kind) (capalarm_aggregate_members_shift{{{SEL}, kind=~"$kind"}})',
                    "{{instance}} {{kind}}",
                ),
                Query(
                    f'max by (instance, kind) (capalarm_aggregate_members_shift_threshold{{{SEL}, kind=~"$kind"}})',
                    "{{instance}} {{kind}} threshold",
                ),
                w=24,
            ),
        ],
    )
    variables = [
        variable_datasource(),
        variable_query("job", "Job", "label_values(capalarm_build_info, job)"),
        variable_query(
            "instance", "Node", 'label_values(capalarm_build_info{job=~"$job"}, instance)'
        ),
        variable_query(
            "kind", "Kind", 'label_values(capalarm_surface_written_bytes_total{job=~"$job"}, kind)'
        ),
    ]
    links = [
        {
            "title": "Surface drill-down",
            "type": "link",
            "url": "/d/capalarm-surface/capalarm-surface?${datasource:queryparam}&${job:queryparam}&${instance:queryparam}",
            "targetBlank": False,
            "icon": "dashboard",
        }
    ]
    return dashboard(
        "capalarm-overview",
        "capalarm / Overview",
        "Every write surface capalarm watches: rates against thresholds, capacity against budgets, alerts, proof of sight, notifications.",
        variables,
        [glance, surfaces, alerts, sight, notify, cluster],
        links,
    )


def surface() -> dict[str, Any]:
    one = 'job=~"$job", instance=~"$instance", surface="$surface"'
    per_node = Row(
        "Rate",
        [
            timeseries(
                "Write rate, baseline and spike threshold",
                "Last-tick write rate of the surface per node, with the robust baseline and the threshold above which the spike rule fires.",
                "Bps",
                Query(
                    f"capalarm_surface_write_rate_bytes_per_second{{{one}}}", "{{instance}} rate"
                ),
                Query(
                    f"capalarm_surface_baseline_bytes_per_second{{{one}}}", "{{instance}} baseline"
                ),
                Query(
                    f"capalarm_surface_threshold_bytes_per_second{{{one}}}",
                    "{{instance}} threshold",
                ),
                w=24,
            ),
            timeseries(
                "Bytes written by node",
                "Bytes per second through the surface, per node (from the byte counter, so nothing between scrapes is missed).",
                "Bps",
                Query(
                    f"sum by (instance) (rate(capalarm_surface_written_bytes_total{{{one}}}[$__rate_interval]))",
                    "{{instance}}",
                ),
                custom={"stacking": {"mode": "normal"}, "fillOpacity": 30},
            ),
            timeseries(
                "Write events by node",
                "Write events per second (packets, files, uploads, edits) through the surface, per node.",
                "ops",
                Query(
                    f"sum by (instance) (rate(capalarm_surface_write_events_total{{{one}}}[$__rate_interval]))",
                    "{{instance}}",
                ),
                custom={"stacking": {"mode": "normal"}, "fillOpacity": 30},
            ),
        ],
    )
    budget = Row(
        "Capacity and budgets",
        [
            timeseries(
                "Capacity bound and allowances",
                "Lampson capacity bound in bits per second per node, against what the surface's budgets let through over an hour (the least of k + h / 3600 s over its horizons; each horizon's allowance is on the status page and in /api/v1/surfaces).",
                "bps",
                Query(
                    f"8 * capalarm_surface_capacity_bytes_per_second{{{one}}}",
                    "{{instance}} capacity",
                ),
                Query(
                    f"8 * capalarm_surface_budget_hour_allowance_bytes_per_second{{{one}}}",
                    "{{instance}} hourly allowance",
                ),
            ),
            timeseries(
                "Budget excess against tolerance",
                "The budget nearest to firing, per node: the largest CUSUM excess over tolerance of every horizon and the seasonal budget (capalarm_surface_budget_ratio); the budget rule fires at 100%. Each horizon's figures: the status page, /api/v1/surfaces, or http.metrics: full.",
                "percentunit",
                Query(f"capalarm_surface_budget_ratio{{{one}}}", "{{instance}}"),
                min=0,
                thresholds=SHARE,
                custom={"thresholdsStyle": {"mode": "line"}},
            ),
            state_timeline(
                "Learning or judged",
                "Whether the spike baseline has enough history to judge (the baseline_ready label of capalarm_surface_info); while learning, the budgets and the beacon rule still protect the surface.",
                f'max by (instance) (capalarm_surface_info{{{one}, baseline_ready="1"}}) or max by (instance) (0 * capalarm_surface_info{{{one}}})',
                "{{instance}}",
                READY_MAPPINGS,
            ),
        ],
    )
    alerts = Row(
        "Alerts",
        [
            state_timeline(
                "Alert state by rule",
                "The surface's rules (spike, budget, and drop, beacon and duty where on) per node: pending or firing (a rule at rest has no series by default: nothing shown is inactive).",
                'capalarm_alert_state{job=~"$job", instance=~"$instance", target_type="surface", target="$surface"}',
                "{{instance}} {{rule}}",
                ALERT_STATE_MAPPINGS,
            ),
            stat(
                "Nodes writing",
                "Nodes on which the surface was written to over the last rate interval.",
                f"count(rate(capalarm_surface_written_bytes_total{{{one}}}[$__rate_interval]) > 0) or vector(0)",
                thresholds=[(None, "green")],
            ),
            stat(
                "Nodes elevated",
                "Nodes on which the surface runs above twice its baseline (plus 8 B/s): the swarm rule's count.",
                "count(avg_over_time(capalarm_surface_write_rate_bytes_per_second{"
                + one
                + "}[$__rate_interval]) > 2 * avg_over_time(capalarm_surface_baseline_bytes_per_second{"
                + one
                + "}[$__rate_interval]) + 8) or vector(0)",
                thresholds=[(None, "green"), (2, "yellow"), (5, "red")],
            ),
        ],
    )
    variables = [
        variable_datasource(),
        variable_query("job", "Job", "label_values(capalarm_build_info, job)"),
        variable_query(
            "instance", "Node", 'label_values(capalarm_build_info{job=~"$job"}, instance)'
        ),
        variable_query(
            "surface",
            "Surface",
            'label_values(capalarm_surface_written_bytes_total{job=~"$job", instance=~"$instance"}, surface)',
            multi=False,
            include_all=False,
        ),
    ]
    links = [
        {
            "title": "Overview",
            "type": "link",
            "url": "/d/capalarm-overview/capalarm-overview?${datasource:queryparam}&${job:queryparam}&${instance:queryparam}",
            "targetBlank": False,
            "icon": "dashboard",
        }
    ]
    return dashboard(
        "capalarm-surface",
        "capalarm / Surface",
        "One write surface in detail: rate, baseline and threshold per node, capacity against its hourly allowance, the budget nearest to firing, alert states.",
        variables,
        [per_node, budget, alerts],
        links,
    )


def outputs() -> dict[Path, bytes]:
    return {
        OUT / f"{d['uid']}.json": (json.dumps(d, indent=2, ensure_ascii=False) + "\n").encode()
        for d in (overview(), surface())
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 naming stale files; write nothing"
    )
    args = parser.parse_args(argv)
    stale = [p for p, data in outputs().items() if not p.exists() or p.read_bytes() != data]
    if args.check:
        if stale:
            print(
                "stale (run python scripts/gen_dashboards.py):", *stale, sep="\n  ", file=sys.stderr
            )
            return 1
        return 0
    for path in stale:
        path.write_bytes(outputs()[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
