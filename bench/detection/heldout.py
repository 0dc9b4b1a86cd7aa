"""Detection on held-out fleets: settings chosen on some seeds, figures reported on others.

    python bench/detection/heldout.py --seeds 6-25 [--choose 1-5] [--workers 2] [--days 14]
        [--fleets main,sandbox] [--with-kind] [--no-capalarm] [--no-references] [--keep DIR]

Per seed two fleets (fleets.py): the *main* fleet (every benign family, attacks on held-out
surfaces) and the *sandbox* fleet (dozens of small sandboxes, a swarm on 30 of them), 14 days
each.  ``--fleets long`` runs the *long* fleet instead (longfleet.py: six weeks of weekly and
fortnightly jobs, sessions, caches filled once, surfaces appearing mid-fleet, attacks from
day 2), 42 days unless ``--days`` says otherwise; ``--days`` applies to every fleet run.
``--no-references`` runs capalarm alone (``--choose none``: no choice seeds either).

- capalarm runs through its own backtest engine, ``alarm.backtest.run_backtest(config,
  [events.jsonl], out, workers=1)``, with the config a user would write (every surface declared
  with its name and kind, default settings, tick 10 s) on write-event JSON lines without a
  ``kind`` field (capalarm takes it from the declared surface; ``--with-kind`` adds it).
  Its settings are its defaults: whatever is tuned in them is tuned on the choice seeds, whose
  figures this prints too.
- The comparison detectors (reference.py) try every setting of their grids on the choice seeds;
  each keeps the setting with at most FA_BUDGET false alarms per surface-week there that detects
  most attacks (then leaks least), and is reported on the report seeds with it.
- Scoring (score.incidents, score.score_fleet): pages are incidents, a false alarm is an
  incident starting outside every attack window on its target; per attack: detected or not,
  delay, payload bits leaked before the first alarm.

``--keep DIR`` leaves each fleet's events.jsonl, config.yaml and alerts.jsonl there, so that
``capalarm backtest --config DIR/<fleet>/config.yaml DIR/<fleet>/events.jsonl`` reproduces a run.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.detection import builders, fleets, longfleet, reference, score  # noqa: E402

FA_BUDGET = 1.0  # false alarms per surface-week: the references' operating point
CHANCE = 0.01  # a detection whose chance (score.AttackOutcome.chance) is below this is real
KEPT_FIGURES = ("budget_tolerance_bits", "budget_excess_bits", "budget_horizon")


def parse_seeds(text: str) -> list[int]:
    """'6-25', '1,3,5-7' -> sorted seeds; 'none' -> none (for --choose)."""
    if text.strip().lower() == "none":
        return []
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: seeds are N, N-M or a comma list"
            ) from None
        if b < a:
            raise argparse.ArgumentTypeError(f"{part!r}: range runs backwards")
        out.update(range(a, b + 1))
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r}: no seeds")
    return sorted(out)


def parse_fleets(text: str) -> list[str]:
    """'main,sandbox', 'long' -> builders.FLEETS keys."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in builders.FLEETS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: fleets are a comma list of {', '.join(builders.FLEETS)}"
        )
    return list(dict.fromkeys(names))


def span(seeds: Iterable[int]) -> str:
    s = sorted(seeds)
    if not s:
        return "none"
    if s and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0])
    return ",".join(map(str, s))


# -- capalarm ---------------------------------------------------------------------------------


@dataclass(slots=True)
class CapalarmRun:
    score: score.FleetScore | None = None
    error: str = ""
    seconds: float = 0.0
    ticks: int = 0
    changes: int = 0
    firings: int = 0
    incidents: int = 0
    incidents_by_rule: dict[str, int] = field(default_factory=dict)
    assumed_windows: set[str] = field(default_factory=set)  # rules with no known resolve window
    summary: dict[str, Any] = field(default_factory=dict)


def resolve_window(config: Any, assumed: set[str]) -> Callable[[str, str], float]:
    """A rule's resolve window on a target, from capalarm's config (spike and drop: the spike
    rule's resolve_hold; budget, beacon and duty: the budget's; the registered rules
    (alarm/detector/rules/): their RESOLVE_HOLD; sources: SOURCE_RESOLVE_HOLD).
    A rule this does not know gets the spike rule's window and is named in ``assumed``."""
    from alarm.config import AggregateRule, BudgetRule
    from alarm.detector.rules import RULES
    from alarm.detector.sources import SOURCE_RESOLVE_HOLD

    by_name = {s.name: s for s in config.surfaces}
    # An aggregate without a budget of its own: the defaults' windows.
    defaults = BudgetRule(allowance_bits_per_second=1.0, tolerance_bits=1.0)

    def window(target: str, rule: str) -> float:
        if target.startswith("source:"):
            return float(SOURCE_RESOLVE_HOLD)
        name, _, kind = target.partition(":")
        if name == score.AGGREGATE:
            agg = config.aggregates.get(kind) or AggregateRule()
            spike, b = agg.spike, agg.budget or defaults
        elif name == "unclassified":
            spike, b = config.unclassified_spike, config.unclassified_budget(kind)
        else:
            s = by_name[target]
            spike, b = s.spike, s.effective_budget()
        holds = {
            "spike": spike.resolve_hold,
            "drop": spike.resolve_hold,
            "budget": b.resolve_hold,
            "beacon": b.beacon.resolve_hold,
            "duty": b.duty.resolve_hold,
        }
        # The other registered rules: their class's hold (the ones above hold as configured;
        # the registry holds spike and budget too since 7ec2aeb, and its class default was
        # taking their configured windows' place, and beacon's and duty's before that).
        holds |= {n: r.RESOLVE_HOLD for n, r in RULES.items() if n not in holds}
        if rule not in holds:
            assumed.add(rule)
        return float(holds.get(rule, spike.resolve_hold))

    return window


def read_changes(path: Path) -> Iterable[dict[str, Any]]:
    """The alert changes of a backtest's output, with only the figures the scorer reads."""
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            c = json.loads(line)
            figures = c.get("figures") or {}
            c["figures"] = {k: figures[k] for k in KEPT_FIGURES if k in figures}
            c.pop("contributors", None)
            c.pop("summary", None)
            yield c


def run_capalarm(fleet: fleets.Fleet, workdir: Path, with_kind: bool) -> CapalarmRun:
    """The fleet through ``run_backtest``; a failure is reported, not raised."""
    run = CapalarmRun()
    try:
        from alarm.backtest import run_backtest
        from alarm.config import config_from_dict

        events, _ = fleets.write_inputs(fleet, workdir, with_kind)
        config = config_from_dict(fleets.capalarm_config(fleet))
        alerts = workdir / "alerts.jsonl"
        with open(alerts, "w") as out:
            summary = run_backtest(config, [str(events)], out, workers=1)
        run.summary = summary.to_dict()
        run.seconds, run.ticks, run.changes = summary.seconds, summary.ticks, summary.changes
        changes = list(read_changes(alerts))
        run.firings = sum(c.get("state") == "firing" for c in changes)
        incs = score.incidents(changes, fleet.clock, resolve_window(config, run.assumed_windows))
        run.incidents = len(incs)
        for inc in incs:
            run.incidents_by_rule[inc.rule] = run.incidents_by_rule.get(inc.rule, 0) + 1
        figures = {(i.target, i.start): i.figures for i in incs}
        run.score = score.score_fleet(fleet, score.incident_starts(incs), figures)
    except Exception as exc:  # the backtest is being rewritten: say what broke, keep going
        run.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    return run


# -- one fleet ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Job:
    builder: str  # builders.FLEETS key
    seed: int
    days: float | None  # None: the builder's own (builders.DEFAULT_DAYS)
    capalarm: bool
    with_kind: bool
    settings: list[reference.Setting]
    keep: str | None = None


@dataclass(slots=True)
class JobResult:
    fleet: str
    seed: int
    surfaces: int
    ticks: int
    attacks: int
    capalarm: CapalarmRun | None
    references: dict[reference.Setting, score.FleetScore]
    seconds: dict[str, float]


def run_job(job: Job) -> JobResult:
    t0 = time.perf_counter()
    days = builders.DEFAULT_DAYS[job.builder] if job.days is None else job.days
    fleet = builders.FLEETS[job.builder](job.seed, days)
    seconds = {"generate": time.perf_counter() - t0}
    cap = None
    if job.capalarm:
        t1 = time.perf_counter()
        if job.keep:
            cap = run_capalarm(fleet, Path(job.keep) / fleet.name, job.with_kind)
        else:
            with tempfile.TemporaryDirectory(prefix="capalarm-heldout-") as tmp:
                cap = run_capalarm(fleet, Path(tmp), job.with_kind)
        seconds["capalarm"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    refs = reference.evaluate(fleet, job.settings) if job.settings else {}
    seconds["references"] = time.perf_counter() - t2
    return JobResult(
        fleet.name,
        job.seed,
        len(fleet.surfaces),
        fleet.ticks,
        len(fleet.attacks),
        cap,
        refs,
        seconds,
    )


def run_jobs(jobs: list[Job], workers: int) -> list[JobResult]:
    out = []
    with ProcessPoolExecutor(max(1, workers)) as pool:
        for res in pool.map(run_job, jobs):
            cap = res.capalarm
            extra = ""
            if cap is not None:
                extra = f", capalarm {cap.seconds:.0f} s" + (" FAILED" if cap.error else "")
            print(
                f"  {res.fleet}: {res.surfaces} surfaces, {res.attacks} attacks{extra}, "
                f"references {res.seconds['references']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            out.append(res)
    return out


# -- choosing settings -------------------------------------------------------------------------


def pooled(scores: Iterable[score.FleetScore]) -> score.FleetScore:
    total = score.FleetScore()
    for s in scores:
        total.add(s)
    return total


def sensitivity(s: score.FleetScore) -> tuple[int, float]:
    """More attacks detected first, then fewer bits leaked (log-summed, so every attack
    counts, not only the largest)."""
    return (
        sum(o.detected for o in s.outcomes),
        -sum(math.log1p(o.leaked_bits) for o in s.outcomes),
    )


def choose(method: str, results: list[JobResult]) -> tuple[reference.Setting, float, bool]:
    """(setting, its pooled FA rate on the choice seeds, whether it met FA_BUDGET)."""
    settings = [s for s in reference.grid(method) if not s.published]
    totals = {s: pooled(r.references[s] for r in results) for s in settings}
    ok = [s for s in settings if totals[s].rate() <= FA_BUDGET]
    if not ok:
        best = min(settings, key=lambda s: totals[s].rate())
        return best, totals[best].rate(), False
    best = max(ok, key=lambda s: (sensitivity(totals[s]), -s.threshold))
    return best, totals[best].rate(), True


# -- report ------------------------------------------------------------------------------------


def fmt_bits(b: float) -> str:
    if not math.isfinite(b):
        return "—"
    for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} bit"


def fmt_s(s: float) -> str:
    if not math.isfinite(s):
        return "—"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def ok(flag: bool) -> str:
    return "met" if flag else "**not met**"


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def code_path() -> str:
    try:
        import alarm
        from alarm import backtest

        version = getattr(alarm, "__version__", "?")
        where = Path(backtest.__file__).resolve()
        try:
            where_s = str(where.relative_to(ROOT))
        except ValueError:
            where_s = str(where)
    except Exception as exc:
        return f"capalarm not importable ({type(exc).__name__}: {exc})"
    sha = "unknown (no git)"
    try:
        sha = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        if dirty:
            sha += " + uncommitted changes"
    except (OSError, subprocess.SubprocessError):
        pass
    return (
        f"capalarm {version}, git {sha}; `{where_s}`: run_backtest on write-event JSON lines "
        f"(the events-jsonl reader; the native kernel-log scanner is not on this path); "
        f"detector: {fused_path()}"
    )


def fused_path() -> str:
    from alarm.detector import fused

    return fused.code_path()


def family_rows(columns: list[tuple[str, score.FleetScore]]) -> list[list[str]]:
    families: list[str] = []
    for _, s in columns:
        for fam in s.weeks | s.false_alarms:
            if fam not in families:
                families.append(fam)
    known = [*fleets.FAMILIES, *longfleet.FAMILY_ORDER, score.AGGREGATE_FAMILY]
    order = [f for f in known if f in families]
    order += sorted(f for f in families if f not in order)
    rows = []
    for fam in order:
        weeks = max((s.weeks.get(fam, 0.0) for _, s in columns), default=0.0)
        cells = []
        for _, s in columns:
            n = s.false_alarms.get(fam, 0)
            w = s.weeks.get(fam, 0.0)
            cells.append(f"{n / w:.2f} ({n})" if w else f"— ({n})")
        rows.append([fam, f"{weeks:.0f}", *cells])
    rows.append(
        [
            "**overall**",
            f"{max(sum(s.weeks.values()) for _, s in columns):.0f}",
            *[f"**{s.rate():.2f}** ({sum(s.false_alarms.values())})" for _, s in columns],
        ]
    )
    return rows


def attack_rows(s: score.FleetScore, tick: float) -> list[list[str]]:
    keys: list[tuple[str, str]] = []
    for o in s.outcomes:
        if (o.attack, o.host) not in keys:
            keys.append((o.attack, o.host))
    rows = []
    for attack, host in keys:
        outs = [o for o in s.outcomes if (o.attack, o.host) == (attack, host)]
        hit = [o for o in outs if o.detected]
        real = sum(o.chance < CHANCE for o in hit)
        rows.append(
            [
                attack,
                host,
                f"{len(hit)}/{len(outs)} ({real})",
                f"{median([o.delay_ticks for o in hit]):.0f}" if hit else "—",
                fmt_s(median([o.delay_s for o in hit])) if hit else "—",
                fmt_s(max(o.delay_s for o in hit)) if hit else "—",
                fmt_bits(median([o.leaked_bits for o in outs])),
                fmt_bits(median([o.total_bits for o in outs])),
            ]
        )
    return rows


def leak_by_attack(s: score.FleetScore, attack: str) -> float:
    """Median payload bits leaked before the first alarm over the attacks of one type
    (a missed attack leaked all of its bits)."""
    return median([o.leaked_bits for o in s.outcomes if o.attack == attack])


def floors(
    cap: score.FleetScore, refs: dict[str, score.FleetScore], tick: float
) -> list[list[str]]:
    """The issue's floors that this bench measures, on capalarm's report-seed figures."""
    rows = []
    fams = [f for f in cap.weeks if cap.weeks[f] > 0]
    worst = max(fams, key=cap.rate) if fams else ""
    rows.append(
        ["false alarms ≤ 0.5 per surface-week overall", f"{cap.rate():.2f}", ok(cap.rate() <= 0.5)]
    )
    rows.append(
        [
            "false alarms ≤ 1 per surface-week in the worst family",
            f"{cap.rate(worst):.2f} ({worst})" if worst else "—",
            ok(bool(worst) and cap.rate(worst) <= 1.0),
        ]
    )
    unplaced = sum(n for f, n in cap.false_alarms.items() if f not in cap.weeks)
    if unplaced:
        rows.append(
            [
                "incidents on targets the fleet does not hold (unclassified, sources)",
                str(unplaced),
                "counted above",
            ]
        )

    def outs(kind: str) -> list[score.AttackOutcome]:
        return [o for o in cap.outcomes if o.attack == kind]

    # A floor whose attacks the fleets do not hold (the long fleet has no 10 bit/s drips and
    # no +60 % swarm) is left out.
    b = outs("burst")
    n = sum(o.detected and o.delay_ticks <= 2 for o in b)
    if b:
        rows.append(
            [
                "bursts ≥ 30x for a minute: detected within 2 ticks",
                f"{n}/{len(b)}",
                ok(n == len(b)),
            ]
        )
    r = outs("ramp")
    n = sum(o.detected and o.leaked_bits <= o.total_bits / 10 for o in r)
    if r:
        rows.append(
            [
                "ramps to 20x over 2 h: before 1/10 of the ramp's bits",
                f"{n}/{len(r)}",
                ok(n == len(r)),
            ]
        )
    d = outs("drip_10bps") + outs("drip_100bps")
    n = 0
    unknown = 0
    for o in d:
        h = o.figures.get("budget_tolerance_bits")
        if o.detected and h is None:
            unknown += 1
        n += bool(o.detected and h is not None and o.leaked_bits <= float(h))
    note = f" ({unknown} alarms gave no tolerance)" if unknown else ""
    if d:
        rows.append(
            [
                "drips ≥ 10 bit/s on a quiet surface: before h bits (h: the alarm's budget "
                "tolerance)",
                f"{n}/{len(d)}{note}",
                ok(n == len(d)),
            ]
        )
    bc = outs("beacon")
    n = sum(o.detected and o.beats <= 10 for o in bc)
    if bc:
        rows.append(["beacons: within 10 beats", f"{n}/{len(bc)}", ok(n == len(bc))])
    sw = outs("swarm")
    n = sum(o.detected and o.delay_s <= 1800 for o in sw)
    via = sum(o.detected and o.by.startswith(score.AGGREGATE) for o in sw)
    if sw:
        rows.append(
            [
                "swarm of 30 surfaces each +60 % for 2 h: within 30 min",
                f"{n}/{len(sw)} ({via} through the aggregate)",
                ok(n == len(sw)),
            ]
        )
    paged, later = cap.later_paged()
    if later:
        rows.append(
            [
                "scheduled jobs page at most on their first occurrence: scheduled occurrences "
                "paged after the first",
                f"{paged} of {later}",
                ok(paged == 0),
            ]
        )
    real = sum(o.detected and o.chance < CHANCE for o in cap.outcomes)
    rows.append(
        [
            f"(context) detections beyond chance: the false-alarm rate on the host would have "
            f"paged within the same delay with probability < {CHANCE:g}",
            f"{real}/{len(cap.outcomes)}",
            "",
        ]
    )
    # Every comparison at the setting chosen on the choice seeds (<= FA_BUDGET there), whatever
    # its false-alarm rate on the report seeds turned out to be: the stricter reading.
    for attack in dict.fromkeys(o.attack for o in cap.outcomes) if refs else ():
        mine = leak_by_attack(cap, attack)
        best_m, best = "", float("inf")
        for m, s in refs.items():
            v = leak_by_attack(s, attack)
            if v < best:
                best_m, best = m, v
        if not math.isfinite(best):
            rows.append(
                [f"{attack}: leaked ≤ 1/10 of the best comparison", "no comparison ran", "—"]
            )
            continue
        ratio = mine / best if best > 0 else (0.0 if mine == 0 else float("inf"))
        rows.append(
            [
                f"{attack}: leaked ≤ 1/10 of the best comparison (median)",
                f"{fmt_bits(mine)} vs {fmt_bits(best)} ({best_m}; x{ratio:.2f})",
                ok(ratio <= 0.1),
            ]
        )
    return rows


def report(
    args: argparse.Namespace,
    chosen: dict[str, tuple[reference.Setting, float, bool]],
    choice: list[JobResult],
    held: list[JobResult],
    seconds: float,
) -> str:
    tick = fleets.TICK
    days = ", ".join(
        f"{b} {builders.DEFAULT_DAYS[b] if args.days is None else args.days:g} days"
        for b in args.fleets
    )
    out = [
        f"## Held-out detection benchmark — report seeds {span(args.seeds)}, "
        f"fleets {days}, tick {tick:g} s",
        "",
        (
            f"**Protocol:** settings chosen on seeds {span(args.choose)}, reported on seeds "
            f"{span(args.seeds)} (no seed in both). capalarm runs on its defaults (any tuning "
            f"of them belongs on the choice seeds, whose figures are shown below); each "
            f"comparison detector keeps the setting of its grid with ≤ {FA_BUDGET:g} false "
            f"alarm per surface-week on the choice seeds that detects most attacks there."
            if args.choose
            else f"**Protocol:** capalarm alone, on its defaults, on seeds {span(args.seeds)}; "
            f"no choice seeds and no comparison detectors (--choose none --no-references)."
        ),
        "",
        f"**Code path:** {code_path()}; events {'with' if args.with_kind else 'without'} a "
        f"`kind` field; config: every surface declared with name and kind, nothing else.",
        "",
        f"Fleets: {len(held)} held out ({sum(r.surfaces for r in held)} surfaces, "
        f"{sum(r.attacks for r in held)} attacks), {len(choice)} for choosing; "
        f"{seconds / 60:.0f} min with {args.workers} workers.",
    ]
    cap_held = [r.capalarm for r in held if r.capalarm is not None]
    cap_choice = [r.capalarm for r in choice if r.capalarm is not None]
    failed = [r for r in held + choice if r.capalarm is not None and r.capalarm.error]
    for r in failed:
        out.append(f"\n**capalarm failed on {r.fleet}:**\n\n```\n{r.capalarm.error.strip()}\n```")
    cap_ok = bool(cap_held) and not any(c.error for c in cap_held)
    columns: list[tuple[str, score.FleetScore]] = []
    cap_score = score.FleetScore()
    if cap_ok:
        cap_score = pooled(c.score for c in cap_held if c.score)
        columns.append(("capalarm (defaults)", cap_score))
        if cap_choice and not any(c.error for c in cap_choice):
            columns.append(
                (
                    f"capalarm, choice seeds {span(args.choose)}",
                    pooled(c.score for c in cap_choice if c.score),
                )
            )
    refs: dict[str, score.FleetScore] = {}
    for method, (setting, _, _) in chosen.items():
        refs[f"{method} ({setting.label})"] = pooled(r.references[setting] for r in held)
    for method in reference.PUBLISHED if chosen else ():
        pub = next(s for s in reference.grid(method) if s.published)
        refs[f"{method} (published {pub.threshold:g})"] = pooled(r.references[pub] for r in held)
    columns += list(refs.items())
    out.append(
        table(
            f"False alarms per surface-week (incidents), report seeds {span(args.seeds)}",
            ["family", "surface-weeks", *[name for name, _ in columns]],
            family_rows(columns),
        )
    )
    sched = [(name, s) for name, s in columns if s.scheduled]
    if sched:
        fams = list(dict.fromkeys(f for _, s in sched for f in s.scheduled))
        rows = []
        for fam in [*fams, None]:
            cells = []
            for _, s in sched:
                c = [0, 0, 0, 0]
                for f, counts in s.scheduled.items():
                    if fam in (None, f):
                        c = [x + y for x, y in zip(c, counts, strict=True)]
                cells.append(f"{c[1]}/{c[0]}, **{c[3]}/{c[2]}**")
            rows.append(["**all**" if fam is None else fam, *cells])
        out.append(
            table(
                "Scheduled occurrences paged (an incident on the job's surface from the run's "
                "start to an hour after its end; first occurrences, then **after the first**)",
                ["family", *[name for name, _ in sched]],
                rows,
            )
        )
    if chosen:
        out.append(
            table(
                "Comparison settings chosen on the choice seeds",
                [
                    "method",
                    "setting",
                    f"FA / surface-week on seeds {span(args.choose)}",
                    f"≤ {FA_BUDGET:g}",
                ],
                [
                    [m, s.label, f"{fa:.2f}", "yes" if met else "**no**"]
                    for m, (s, fa, met) in chosen.items()
                ],
            )
        )
    if cap_ok:
        inc = {}
        for c in cap_held:
            for rule, n in c.incidents_by_rule.items():
                inc[rule] = inc.get(rule, 0) + n
        firings = sum(c.firings for c in cap_held)
        incidents = sum(c.incidents for c in cap_held)
        assumed = set().union(*(c.assumed_windows for c in cap_held))
        out.append(
            f"\ncapalarm on the report seeds: {firings} firings in {incidents} incidents "
            f"(by rule: {', '.join(f'{k} {v}' for k, v in sorted(inc.items()))}); "
            f"backtest {sum(c.seconds for c in cap_held):.0f} s for "
            f"{sum(c.ticks for c in cap_held)} ticks"
            + (f"; rules without a known resolve window: {sorted(assumed)}" if assumed else "")
            + "."
        )
        out.append(
            table(
                "capalarm per attack (report seeds; delay from the onset to the end of the "
                "alarming tick; leaked: median payload bits before the first alarm, a miss "
                "counts whole)",
                [
                    "attack",
                    "host",
                    "detected",
                    "delay (ticks, median)",
                    "delay",
                    "worst delay",
                    "leaked",
                    "attack bits",
                ],
                attack_rows(cap_score, tick),
            )
        )
    kinds = list(dict.fromkeys(o.attack for _, s in columns for o in s.outcomes))
    out.append(
        table(
            "Detected (beyond chance, p < 0.01) and leaked per attack type (median payload bits "
            "before the first alarm)",
            ["attack", *[name for name, _ in columns]],
            [
                [
                    k,
                    *[
                        f"{sum(o.detected for o in s.outcomes if o.attack == k)}/"
                        f"{sum(o.attack == k for o in s.outcomes)} "
                        f"({sum(o.detected and o.chance < CHANCE for o in s.outcomes if o.attack == k)}), "
                        f"{fmt_bits(leak_by_attack(s, k))}"
                        for _, s in columns
                    ],
                ]
                for k in kinds
            ],
        )
    )
    if cap_ok:
        chosen_refs = {m: refs[f"{m} ({s.label})"] for m, (s, _, _) in chosen.items()}
        out.append(
            table(
                f"Floors of issue 11 (capalarm, report seeds {span(args.seeds)})",
                ["floor", "measured", ""],
                floors(cap_score, chosen_refs, tick),
            )
        )
        out.append(
            "\nNot measured here: NAB and the tick cost at 100k surfaces (their own benches)."
        )
    else:
        out.append("\ncapalarm did not run on every report fleet: no floors judged.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("6-25"))
    ap.add_argument("--choose", type=parse_seeds, default=parse_seeds("1-5"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--days",
        type=float,
        default=None,
        help="days of every fleet (default: each fleet's own, 14; the long fleet 42)",
    )
    ap.add_argument(
        "--fleets",
        type=parse_fleets,
        default=list(builders.DEFAULT_FLEETS),
        help=f"comma list of {', '.join(builders.FLEETS)} (default: "
        f"{','.join(builders.DEFAULT_FLEETS)})",
    )
    ap.add_argument("--with-kind", action="store_true", help="write `kind` into each event")
    ap.add_argument("--no-capalarm", action="store_true", help="only the comparison detectors")
    ap.add_argument(
        "--no-references", action="store_true", help="only capalarm, no comparison detectors"
    )
    ap.add_argument("--keep", help="keep each fleet's events, config and alerts under this dir")
    args = ap.parse_args(argv)
    overlap = set(args.seeds) & set(args.choose)
    if overlap:
        ap.error(f"seeds {span(overlap)} are both chosen on and reported: the protocol forbids it")
    if not args.seeds:
        ap.error("--seeds: no report seeds")
    if args.no_capalarm and args.no_references:
        ap.error("--no-capalarm and --no-references: nothing to run")
    if not args.choose and not args.no_references:
        ap.error("--choose none: the comparison detectors choose their settings there")
    if args.days is not None and args.days < 10:
        ap.error("--days: attacks start after a week of history and drips run 3 days: >= 10")
    if args.days is not None and "long" in args.fleets and args.days < longfleet.MIN_DAYS:
        ap.error(f"--days: the long fleet needs {longfleet.MIN_DAYS:g} days or more")
    t0 = time.perf_counter()
    grids = [] if args.no_references else [s for m in reference.METHODS for s in reference.grid(m)]

    def jobs(seeds: list[int], settings: list[reference.Setting]) -> list[Job]:
        return [
            Job(b, seed, args.days, not args.no_capalarm, args.with_kind, settings, args.keep)
            for seed in seeds
            for b in args.fleets
        ]

    print(f"choice seeds {span(args.choose)}:", file=sys.stderr)
    choice = run_jobs(jobs(args.choose, grids), args.workers) if args.choose else []
    chosen = {} if args.no_references else {m: choose(m, choice) for m in reference.METHODS}
    keep = [s for s, _, _ in chosen.values()]
    if chosen:
        keep += [s for m in reference.PUBLISHED for s in reference.grid(m) if s.published]
    print(f"report seeds {span(args.seeds)}:", file=sys.stderr)
    held = run_jobs(jobs(args.seeds, keep), args.workers)
    print(report(args, chosen, choice, held, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
