"""The status page at ``/``: one HTML document with its CSS inline and its charts as inline SVG
(no external assets, no script but a 15-second reload), readable at 1280 px and at 390 px.

What it shows, most urgent first: each surface's state (firing, pending, judged, learning),
its figures and a chart of its last hour (rate against threshold above, budget excess against
tolerance below, with a bytes/s scale and a time axis), then source health (up, caught up, blind, last record, errors, lost and
forged records, the egress canary), then the recent alert changes with their evidence (a
resolved one says so and gives its figures at resolution, not the firing wording).

A surface whose spike rule does not judge yet shows "learning" where its threshold would be,
never a threshold of 0: budgets and the beacon rule protect it meanwhile.  Everything a
workload controls (contributor names, receipts, summaries, error texts) is sanitised and
escaped.  Layout: cards in a grid whose columns are never wider than the screen
(``minmax(min(100%, 320px), 1fr)``), figures in three shrinkable columns, long names wrapped
(``overflow-wrap: anywhere``), so nothing scrolls sideways on a phone.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from alarm.detector.alerts import AlertState
from alarm.detector.rules import rules_that
from alarm.sanitize import sanitize
from alarm.snapshot import CanaryView, HistoryWindow, Snapshot, SourceView, SurfaceView

# The rules every surface shows in its own figures (Rule.EVERYWHERE); the others where on.
EVERYWHERE = rules_that("EVERYWHERE")

STATE_NAMES = {int(s): s.name.lower() for s in AlertState}
# "0 judged" on a new install reads like a fault: it is the spike rule still learning.
STATES_EXPLAINED = (
    "<b>judged</b>: quiet, and the spike rule has learned the surface's usual rate and judges "
    "it against a threshold of its own; <b>learning</b>: quiet, its spike threshold not known "
    "yet (a new surface's first days), while its budgets and the beacon rule already alarm. "
    "Firing and pending count surfaces with any rule firing or about to."
)
# Surfaces the page shows with their charts (those that need a look first): the rest are in
# /api/v1/surfaces, so the page stays small at any number of surfaces.
PAGE_SURFACES = 100
# Pages of PAGE_SURFACES the page goes to (``/?page=N``); past them, the API.
PAGE_MAX = 10
RECENT_SHOWN = 50
CONTRIBUTORS_SHOWN = 5
# Chart geometry (SVG user units): the rate panel above, the budget panel below.
CHART_W, RATE_TOP, RATE_BOTTOM, BUDGET_TOP, BUDGET_BOTTOM = 360, 3.0, 62.0, 70.0, 98.0

CSS = """
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;padding:12px;
color:#1d2330;background:#f3f4f6;overflow-wrap:anywhere}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:20px 0 8px}
h3{font-size:15px;margin:0;min-width:0}
a{color:#1a56b0}
.meta{color:#4b5260;margin:0 0 4px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,320px),1fr));gap:10px}
.card{background:#fff;border:1px solid #d5d9e0;border-left:5px solid #9aa3b1;border-radius:6px;
padding:8px 10px;min-width:0}
.card.firing{border-left-color:#c62828}.card.pending{border-left-color:#e0a800}
.card.judged,.card.up{border-left-color:#2e7d32}.card.learning{border-left-color:#5b7bb5}
.card.down,.card.blind{border-left-color:#c62828}
.head{display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 8px}
.kind{color:#5b6270;font-size:12px}
.badge{display:inline-block;border-radius:3px;padding:0 6px;font-size:12px;font-weight:600;
color:#fff;background:#6b7280}
.badge.firing,.badge.down,.badge.blind{background:#c62828}.badge.pending{background:#b58100}
.badge.judged,.badge.up{background:#2e7d32}.badge.learning{background:#3f63a6}
dl.figs{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:4px 10px;margin:8px 0}
dl.figs>div{min-width:0}
dt{font-size:11px;color:#5b6270}
dd{margin:0;font-variant-numeric:tabular-nums}
dd.st-firing{color:#c62828;font-weight:600}dd.st-pending{color:#9a6d00;font-weight:600}
svg.chart{display:block;width:100%;height:96px;background:#fafbfc;border:1px solid #e5e7eb}
.plot .area{position:relative}
.plot .y{position:absolute;left:2px;transform:translateY(-50%);font-size:10px;line-height:1;
color:#4b5260;background:rgba(250,251,252,.85);padding:0 2px;pointer-events:none}
.plot .y.top{transform:none}
.plot .x{position:relative;height:13px;font-size:10px;color:#4b5260}
.plot .x span{position:absolute;top:1px;transform:translateX(-50%);white-space:nowrap}
.plot .x span:first-child{transform:none}.plot .x span:last-child{transform:translateX(-100%)}
dd .badge{margin-left:4px;font-weight:600}
.legend{font-size:11px;color:#5b6270;margin:2px 0 0}
.legend i{display:inline-block;width:14px;height:0;border-top:2px solid;vertical-align:middle;
margin-right:3px}
details{margin-top:6px}summary{cursor:pointer;color:#1a56b0}
ul.contrib{margin:4px 0 0;padding-left:18px}
.receipt{color:#5b6270;font-size:12px}
.alert{background:#fff;border:1px solid #d5d9e0;border-radius:6px;padding:6px 10px;margin:0 0 6px}
.alert .when{color:#4b5260;font-variant-numeric:tabular-nums}
.empty{color:#5b6270}
"""

# Reload every 15 s, unless the reader has opened a panel or the tab is hidden.
SCRIPT = (
    "setInterval(function(){if(!document.hidden&&!document.querySelector('details[open]'))"
    "location.reload()},15000);"
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _w(text: str) -> str:
    """Workload-controlled text: sanitised, then escaped."""
    return _e(sanitize(text))


def human(value: float, unit: str) -> str:
    """1234.5, "B/s" -> "1.23 kB/s" (SI prefixes)."""
    if not math.isfinite(value):
        return "-"
    v = abs(value)
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}" if v >= 1 or v == 0 else f"{value:.2g} {unit}"


def utc(ts: float) -> str:
    if ts <= 0:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def ago(ts: float, now: float) -> str:
    if ts <= 0:
        return "never"
    d = max(0.0, now - ts)
    if d < 90:
        return f"{d:.0f} s ago"
    if d < 5400:
        return f"{d / 60:.0f} min ago"
    if d < 2 * 86400:
        return f"{d / 3600:.1f} h ago"
    return f"{d / 86400:.1f} d ago"


def surface_state(s: SurfaceView) -> str:
    """firing / pending (any rule), else judged or learning (the spike rule)."""
    worst = max(s.rule_states().values())
    if worst == AlertState.FIRING:
        return "firing"
    if worst == AlertState.PENDING:
        return "pending"
    return "judged" if s.baseline_ready else "learning"


def _budget_ratio(s: SurfaceView) -> tuple[float, float, str]:
    """(excess, tolerance, horizon) of the horizon closest to its tolerance, named (the
    surface's own figures, without a name, only where it lists no horizons)."""
    best: tuple[float, float, str] | None = None
    for name, _, tolerance, excess in s.budget_horizons:
        if (tolerance > 0 and math.isfinite(tolerance)) and (
            best is None or excess / tolerance > best[0] / best[1]
        ):
            best = (excess, tolerance, name)
    return best if best is not None else (s.budget_excess, s.budget_tolerance, "")


def fired_horizons(recent: Sequence[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(kind, surface) -> the budget horizon its latest budget alert fired on (from the
    change's own figures: the horizon that fired may not be the one closest to its tolerance
    now, as the budget fires a tick ahead and resolves only under its hysteresis)."""
    out: dict[tuple[str, str], str] = {}
    for change in recent:  # oldest first: a later change wins
        if change.get("rule") != "budget" or "surface" not in change:
            continue
        horizon = (change.get("figures") or {}).get("budget_horizon")
        if change.get("state") in ("firing", "pending") and horizon:
            out[(str(change.get("kind", "")), str(change["surface"]))] = str(horizon)
    return out


# -- charts -------------------------------------------------------------------------------
def _segments(xs: np.ndarray, ys: np.ndarray) -> list[str]:
    """SVG polyline point lists, broken where ``ys`` is NaN."""
    out: list[str] = []
    run: list[str] = []
    for x, y in zip(xs.tolist(), ys.tolist(), strict=True):
        if math.isnan(y):
            if run:
                out.append(" ".join(run))
                run = []
            continue
        run.append(f"{x:.0f},{y:.1f}")
    if run:
        out.append(" ".join(run))
    # A lone point is drawn as a short flat line, so a single slot is still visible.
    return [seg if " " in seg else f"{seg} {_nudge(seg)}" for seg in out]


def _nudge(point: str) -> str:
    x, y = point.split(",")
    return f"{float(x) + 1:.0f},{y}"


def _lines(points: list[str], cls: str) -> str:
    return "".join(
        f'<polyline class="{cls}" points="{p}" fill="none" vector-effect="non-scaling-stroke"/>'
        for p in points
    )


def nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (at least 1): a
    scale a reader can take in at a glance."""
    value = max(value, 1.0)
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10.0 * power


def _minutes_ago(seconds: float) -> str:
    return "now" if seconds < 30 else f"-{seconds / 60:.0f} min"


def time_axis(window: HistoryWindow, now: float, marks: int = 4) -> list[tuple[float, str]]:
    """(fraction of the chart's width, label) of ``marks`` + 1 evenly spaced times, from the
    window's first slot to its last slot's end, in minutes before the page was taken."""
    if not len(window.starts):
        return []
    first = float(window.starts[0])
    end = float(window.starts[-1]) + window.slot_seconds
    return [
        (i / marks, _minutes_ago(max(0.0, now - (first + (end - first) * i / marks))))
        for i in range(marks + 1)
    ]


def _y_label(y: float, text: str, axis: str) -> str:
    """A scale label at user-unit height ``y`` (the SVG stretches: its 100 units are the
    chart's height, so a percentage of it places HTML text where the SVG draws)."""
    cls = "y top" if y <= RATE_TOP else "y"  # the top label hangs below the panel's edge
    return f'<span class="{cls}" data-axis="{axis}" style="top:{y:.1f}%">{_e(text)}</span>'


def chart(window: HistoryWindow, j: int, label: str, now: float | None = None) -> str:
    """The last hour of surface ``j`` of ``window``: rate (blue) against threshold (red,
    dashed) above; budget excess / tolerance (orange) against 1 (its alarm line) below.  Its
    scales: bytes/s at the top and middle of the rate panel (a 1-2-5 top, so the figures are
    round), 100 % at the alarm line of the budget panel, and the time below, in minutes
    before ``now`` (the page's time).  The labels are HTML over the SVG, which is stretched to
    the card's width and would distort text of its own."""
    rate = window.rate[j].astype(np.float64)
    threshold = window.threshold[j].astype(np.float64)
    ratio = window.budget_ratio[j].astype(np.float64)
    n = len(rate)
    xs = (np.arange(n) + 0.5) * (CHART_W / max(n, 1))
    finite = np.concatenate([rate[np.isfinite(rate)], threshold[np.isfinite(threshold)]])
    top = nice_top((float(finite.max()) if len(finite) else 0.0) * 1.1)
    span = RATE_BOTTOM - RATE_TOP
    rate_y = RATE_BOTTOM - np.clip(rate, 0, None) / top * span
    thr_y = RATE_BOTTOM - np.clip(threshold, 0, None) / top * span
    rfin = ratio[np.isfinite(ratio)]
    rtop = max(1.25, float(rfin.max()) * 1.05 if len(rfin) else 0.0)
    bspan = BUDGET_BOTTOM - BUDGET_TOP
    ratio_y = BUDGET_BOTTOM - np.clip(ratio, 0, None) / rtop * bspan
    one_y = BUDGET_BOTTOM - bspan / rtop
    points = int(np.isfinite(rate).sum())
    mid_y = RATE_BOTTOM - span / 2
    ticks = time_axis(window, now if now is not None else float(window.starts[-1]))
    grid = "".join(
        f'<line x1="{CHART_W * f:.1f}" y1="{RATE_TOP}" x2="{CHART_W * f:.1f}" '
        f'y2="{BUDGET_BOTTOM}" stroke="#eceef2" vector-effect="non-scaling-stroke"/>'
        for f, _ in ticks[1:-1]
    )
    scale = (
        _y_label(RATE_TOP, human(top, "B/s"), "rate-top")
        + _y_label(mid_y, human(top / 2, "B/s"), "rate-mid")
        + _y_label(one_y, "100 %", "budget-alarm")
    )
    times = "".join(
        f'<span data-axis="time" style="left:{f * 100:.0f}%">{_e(text)}</span>' for f, text in ticks
    )
    svg = (
        f'<svg class="chart" viewBox="0 0 {CHART_W} 100" preserveAspectRatio="none" '
        f'role="img" data-points="{points}" data-top="{top:g}" aria-label="{_e(label)}">'
        f"<title>{_e(label)}</title>{grid}"
        f'<line x1="0" y1="{mid_y:.1f}" x2="{CHART_W}" y2="{mid_y:.1f}" stroke="#eceef2" '
        'vector-effect="non-scaling-stroke"/>'
        f'<line x1="0" y1="{RATE_BOTTOM}" x2="{CHART_W}" y2="{RATE_BOTTOM}" stroke="#d1d5db" '
        'vector-effect="non-scaling-stroke"/>'
        f'<line x1="0" y1="{one_y:.1f}" x2="{CHART_W}" y2="{one_y:.1f}" stroke="#e39b2d" '
        'stroke-dasharray="3 3" vector-effect="non-scaling-stroke"/>'
        f'<line x1="0" y1="{BUDGET_BOTTOM}" x2="{CHART_W}" y2="{BUDGET_BOTTOM}" stroke="#d1d5db" '
        'vector-effect="non-scaling-stroke"/>'
        + _lines(_segments(xs, thr_y), "thr")
        + _lines(_segments(xs, rate_y), "rate")
        + _lines(_segments(xs, ratio_y), "budget")
        + "<style>.rate{stroke:#1f5fbf;stroke-width:1.6}"
        ".thr{stroke:#c62828;stroke-width:1.2;stroke-dasharray:4 3}"
        ".budget{stroke:#d9770b;stroke-width:1.4}</style></svg>"
    )
    return (
        f'<div class="plot"><div class="area">{svg}{scale}</div><div class="x">{times}</div></div>'
    )


# -- sections ------------------------------------------------------------------------------
def _fig(name: str, value: str, cls: str = "", title: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    t = f' title="{_e(title)}"' if title else ""
    return f'<div data-fig="{name}"><dt>{name}</dt><dd{c}{t}>{value}</dd></div>'


def surface_card(
    s: SurfaceView,
    window: HistoryWindow | None,
    j: int | None,
    now: float,
    fired: dict[tuple[str, str], str] | None = None,
) -> str:
    """``fired``: the horizon each surface's budget alert fired on (``fired_horizons``)."""
    state = surface_state(s)
    if s.baseline_ready:
        threshold = _e(human(s.threshold, "B/s")) if s.threshold > 0 else "off"
    else:
        threshold = "learning"
    excess, tolerance, horizon = _budget_ratio(s)
    if tolerance > 0 and math.isfinite(tolerance):
        budget = f"{excess / tolerance:.0%} of {human(tolerance, 'bit')}"
        if horizon:
            budget += f" ({horizon})"
    else:
        budget = "off"
    budget_html = _e(budget)
    budget_title = f"budget rule: {STATE_NAMES[s.budget_state]}"
    if s.budget_state in (AlertState.FIRING, AlertState.PENDING):
        # The figure is the horizon closest to its tolerance now; the alert names the one
        # it fired on (a tick ahead of passing it, and held until under its hysteresis), so
        # "80 % of 16 kbit" beside a firing badge says which budget is meant.
        on = (fired or {}).get((s.kind, s.name)) or horizon
        st = STATE_NAMES[s.budget_state]
        if on:
            budget_html += (
                f' <span class="badge {st}" data-fired="{_e(on)}">{st} on {_e(on)}</span>'
            )
        budget_title += (
            f" on the {on} horizon" if on else ""
        ) + "; it fires a tick before the tolerance would be passed and resolves only well below it"
    figs = [
        _fig("rate", _e(human(s.rate, "B/s"))),
        _fig(
            "threshold",
            threshold,
            title=""
            if s.baseline_ready
            else "the spike rule is still learning this surface; budgets and the beacon rule "
            "protect it meanwhile",
        ),
        _fig("baseline", _e(human(s.baseline, "B/s"))),
        _fig("capacity", _e(human(s.capacity_bps, "bit/s"))),
        _fig("spike", STATE_NAMES[s.spike_state], f"st-{STATE_NAMES[s.spike_state]}", "spike rule"),
        _fig("budget", budget_html, f"st-{STATE_NAMES[s.budget_state]}", budget_title),
    ]
    for rule, st in s.rule_states().items():
        if rule not in EVERYWHERE:  # the other rules, shown where the surface has them
            figs.append(_fig(rule, STATE_NAMES[st], f"st-{STATE_NAMES[st]}"))
    figs.append(_fig("written", _e(human(float(s.bytes_total), "B"))))
    if window is not None and j is not None:
        body = chart(window, j, f"{s.name}: last hour of rate against threshold and budget", now)
        rates = window.rate[j]
        peak = float(np.nanmax(rates)) if np.isfinite(rates).any() else math.nan
        body += (
            '<p class="legend"><i style="color:#1f5fbf"></i>rate '
            '<i style="color:#c62828;border-top-style:dashed"></i>threshold '
            '<i style="color:#d9770b"></i>budget / tolerance '
            '<i style="color:#e39b2d;border-top-style:dashed"></i>alarm line · '
            f"last hour, peak {_e(human(peak, 'B/s'))}</p>"
        )
    else:
        body = '<p class="empty">no history on this page (see /api/v1/surfaces?history=1)</p>'
    contrib = ""
    if s.contributors:
        items = "".join(
            f"<li>{_w(c)}: {_e(human(float(b), 'B'))}</li>"
            for c, b in s.contributors[:CONTRIBUTORS_SHOWN]
        )
        contrib = (
            f"<details><summary>top contributors</summary><ul class=contrib>{items}</ul></details>"
        )
    return (
        f'<article class="card surface {state}" data-surface="{_e(s.name)}" '
        f'data-kind="{_e(s.kind)}" data-state="{state}">'
        f'<div class="head"><h3>{_e(s.name)}</h3><span class="kind">{_e(s.kind)}</span>'
        f'<span class="badge {state}">{state}</span></div>'
        f'<dl class="figs">{"".join(figs)}</dl>{body}{contrib}</article>'
    )


def source_card(v: SourceView, now: float) -> str:
    h = v.health
    state = "blind" if h.blind else ("up" if h.up else "down")
    c = v.counters
    figs = [
        _fig("caught up", "yes" if h.caught_up else "no"),
        _fig("last record", _e(ago(h.last_record_ts, now)), title=utc(h.last_record_ts)),
        _fig("read", f"{c.get('records_read', 0):,}"),
        _fig("lost", f"{c.get('records_lost', 0):,}", "st-firing" if c.get("records_lost") else ""),
        _fig(
            "forged",
            f"{c.get('forged_records', 0):,}",
            "st-firing" if c.get("forged_records") else "",
        ),
        _fig("parse errors", f"{c.get('parse_errors', 0):,}"),
        _fig("errors", f"{h.errors:,}"),
        _fig("mode", _e(h.mode or v.type)),
        _fig("provenance", "kernel-verified" if h.provenance_verified else "unverified"),
    ]
    notes = ""
    if h.blind:
        notes += f'<p class="st-firing">blind: {_w(h.blind)}</p>'
    if h.last_error:
        notes += (
            f'<p class="receipt">last error {_e(ago(h.last_error_at, now))}: {_w(h.last_error)}</p>'
        )
    return (
        f'<article class="card source {state}" data-source="{_e(v.name)}" data-state="{state}">'
        f'<div class="head"><h3>{_e(v.name)}</h3><span class="kind">{_e(v.type)} · '
        f'{_e(v.kind)}</span><span class="badge {state}">{state}</span></div>'
        f'<dl class="figs">{"".join(figs)}</dl>{notes}</article>'
    )


def canary_card(c: CanaryView, now: float) -> str:
    where = f"{c.address}:{c.port}" + (f" from netns {c.netns}" if c.netns else "")
    blind = any(s.blind for s in c.sources)
    state = "blind" if blind else "up"
    figs = [
        _fig("every", _e(f"{c.interval:g} s")),
        _fig("deadline", _e(f"{c.deadline:g} s")),
        _fig("sent", f"{c.sent:,}"),
        _fig("last sent", _e(ago(c.last_sent, now)), title=utc(c.last_sent)),
        _fig("send errors", f"{c.send_errors:,}", "st-firing" if c.send_errors else ""),
    ]
    for s in c.sources:
        figs.append(
            _fig(
                f"{s.source}",
                _e(f"seen {s.seen:,}, missed {s.missed:,}, last {ago(s.last_seen, now)}"),
                "st-firing" if s.blind else "",
                s.blind or f"last latency {s.last_latency:.3f} s",
            )
        )
    notes = f'<p class="receipt">last error: {_w(c.last_error)}</p>' if c.last_error else ""
    return (
        f'<article class="card canary {state}" data-canary="{_e(where)}" data-state="{state}">'
        f'<div class="head"><h3>egress canary</h3><span class="kind">{_e(where)}</span>'
        f'<span class="badge {state}">{"blind" if blind else "seen"}</span></div>'
        f'<dl class="figs">{"".join(figs)}</dl>{notes}</article>'
    )


def _n(value: Any) -> str:
    return f"{float(value):,.0f}" if isinstance(value, int | float) else "?"


def resolved_text(change: dict[str, Any]) -> str:
    """What a resolved change says on the page.  Its summary is the firing one's text with
    "— resolved" added, which for a budget reads "on course to pass it next tick —
    resolved": here it says that it resolved, and what the figures were when it did."""
    summary = str(change.get("summary", ""))
    figures = change.get("figures") or {}
    horizon = figures.get("budget_horizon")
    if change.get("rule") == "budget" and horizon and horizon != "seasonal":
        target = f"{change.get('kind', '')} surface {change.get('surface', '')}"
        return (
            f"{target}: budget resolved. When it resolved it carried "
            f"{_n(figures.get('budget_excess_bits'))} bits above its {horizon} allowance of "
            f"{_n(figures.get('budget_allowance_bits_per_second'))} bit/s, under its "
            f"tolerance of {_n(figures.get('budget_tolerance_bits'))} bits"
        )
    text = summary.removesuffix(" — resolved").replace("; on course to pass it next tick", "")
    if text == summary and not figures:
        return summary  # a source's own resolved wording ("kernel sees again")
    return f"Resolved. When it resolved: {text}"


def alert_item(change: dict[str, Any], now: float) -> str:
    target_type = "surface" if "surface" in change else "source"
    target = str(change.get(target_type, ""))
    state = str(change.get("state", ""))
    badge = {"firing": "firing", "pending": "pending", "resolved": "up"}.get(state, "")
    at = float(change.get("at") or 0.0)
    items = []
    for c in list(change.get("contributors") or [])[:CONTRIBUTORS_SHOWN]:
        receipt = c.get("receipt")
        rtext = (
            f' <span class="receipt">{_w(json.dumps(receipt, sort_keys=True, default=str))}</span>'
            if receipt
            else ""
        )
        items.append(
            f"<li>{_w(str(c.get('contributor', '')))}: "
            f"{_e(human(float(c.get('bytes', 0)), 'B'))}{rtext}</li>"
        )
    evidence = f"<ul class=contrib>{''.join(items)}</ul>" if items else ""
    started = float(change.get("started_at") or 0.0)
    since = f" · since {utc(started)}" if started > 0 and state == "firing" else ""
    if state == "resolved" and 0 < started <= at:
        since = f" · after {ago(started, at).removesuffix(' ago')}"
    summary = resolved_text(change) if state == "resolved" else str(change.get("summary", ""))
    return (
        f'<div class="alert" data-alert="{_e(change.get("fingerprint", ""))}">'
        f'<span class="when" title="{_e(ago(at, now))}">{_e(utc(at))}</span> '
        f'<span class="badge {badge}">{_e(state)}</span> '
        f"<b>{_e(target_type)} {_w(target)}</b> · {_e(change.get('rule', ''))}{_e(since)}"
        f"<div>{_w(summary)}</div>{evidence}</div>"
    )


def render_page(
    snap: Snapshot, recent: Sequence[dict[str, Any]], total_surfaces: int, page: int = 1
) -> str:
    """The whole page.  CPU work for large snapshots: call it off the event loop.
    ``snap.history`` picks and orders the surfaces shown (attention order); ``page`` (from 1)
    shows its surfaces ``PAGE_SURFACES * (page - 1)`` on, so the snapshot's history must hold
    ``PAGE_SURFACES * page`` of them."""
    now = snap.taken_at
    window = snap.history
    first = PAGE_SURFACES * (page - 1)
    if window is not None:
        order = window.rows
    else:
        order = list(range(min(PAGE_SURFACES * page, total_surfaces)))
    shown = list(enumerate(order))[first : first + PAGE_SURFACES]
    counts = snap.columns.states()  # every surface's, on the columns: no view each
    fired = fired_horizons(recent)
    cards = "".join(
        surface_card(snap.surfaces[i], window, j if window is not None else None, now, fired)
        for j, i in shown
    )
    more = ""
    if len(shown) < total_surfaces:
        links = []
        if page > 1:
            links.append(f'<a href="/?page={page - 1}" rel=prev>previous {PAGE_SURFACES}</a>')
        if first + len(shown) < total_surfaces and page < PAGE_MAX:
            links.append(f'<a href="/?page={page + 1}" rel=next>next {PAGE_SURFACES}</a>')
        links.append(
            '<a href="/api/v1/surfaces?order=attention">all of them, in this order: '
            "/api/v1/surfaces?order=attention</a>"
        )
        span = f"{first + 1:,}&ndash;{first + len(shown):,}" if shown else "none"
        more = (
            f'<p class="meta" id=pages>Showing {span} of {total_surfaces:,} surfaces, those '
            f"that need a look first · {' · '.join(links)}</p>"
        )
    sources = "".join(source_card(v, now) for v in snap.sources)
    if snap.egress_canary is not None:
        sources += canary_card(snap.egress_canary, now)
    n_up = sum(1 for v in snap.sources if v.health.up and not v.health.blind)
    n_blind = sum(1 for v in snap.sources if v.health.blind)
    n_down = sum(1 for v in snap.sources if not v.health.up)
    alerts = "".join(alert_item(c, now) for c in list(reversed(recent))[:RECENT_SHOWN])
    if not alerts:
        alerts = '<p class="empty">No alert changes since the service started.</p>'
    return f"""<!doctype html><html lang=en><head><meta charset=utf-8>
<meta name=viewport content="width=device-width, initial-scale=1">
<title>capalarm: {counts["firing"]} firing</title><style>{CSS}</style></head><body>
<header><h1>capalarm</h1>
<p class=meta id=summary>{total_surfaces:,} surfaces: <b>{counts["firing"]} firing</b>,
{counts["pending"]} pending, {counts["judged"]} judged, {counts["learning"]} learning ·
sources: {n_up} up, {n_down} down, {n_blind} blind</p>
<p class=meta id=states>{STATES_EXPLAINED}</p>
<p class=meta>Last tick ended {_e(utc(snap.last_tick_end))} ({_e(ago(snap.last_tick_end, now))});
{snap.ticks:,} ticks of {snap.tick:g} s · page taken {_e(utc(now))}</p>
<p class=meta><a href=/metrics>/metrics</a> · <a href=/api/v1/surfaces>/api/v1/surfaces</a> ·
<a href=/api/v1/alerts>/api/v1/alerts</a> · <a href=/api/v1/notifications>/api/v1/notifications</a>
</p></header>
<main><h2>Surfaces</h2>{more}<section class=grid id=surfaces>{cards}</section>
<h2>Sources</h2><section class=grid id=sources>{sources}</section>
<h2>Recent alerts</h2><section id=alerts>{alerts}</section></main>
<script>{SCRIPT}</script></body></html>"""
