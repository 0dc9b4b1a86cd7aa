"""capalarm on a fleet, through its own backtest engine (`capalarm backtest`): the fleet is
written as write-event JSON lines, every surface declared with what its operator would
declare (declare.py; surfaces nobody declared keep the unclassified defaults), and each alert
change read back."""

from __future__ import annotations

import io
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alarm.backtest import run_backtest
from alarm.config import DEFAULT_BUDGETS, UNCLASSIFIED, config_from_dict
from bench.detection.declare import budget_config, envelope_budget
from bench.detection.scenarios import T0, TICK, Fleet


@dataclass(slots=True)
class Firing:
    tick: int  # index of the tick at whose end it fired
    rule: str
    horizon: str | None
    excess_bits: float
    tolerance_bits: float
    drip: bool = False  # set by the runner: fired during a drip of >= 10 bit/s
    surface: str = ""
    payload_bits: float = 0.0  # set by the runner: the drip's bits from its onset to this tick


@dataclass(slots=True)
class Result:
    firings: dict[str, list[Firing]] = field(default_factory=dict)  # by surface name
    seconds: float = 0.0
    ticks: int = 0


def fleet_config(fleet: Fleet) -> dict:
    surfaces = []
    kinds: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for t in fleet.traces:
        if t.declared:
            budget = budget_config(envelope_budget(t.nbytes, t.events, fleet.history_ticks))
        else:
            budget = dict(DEFAULT_BUDGETS[UNCLASSIFIED])  # nobody declared this traffic
        surfaces.append(
            {"name": t.name, "kind": t.kind, "match": {"log_prefix": [t.name]}, "budget": budget}
        )
        kinds.setdefault(t.kind, []).append((t.nbytes, t.events))
    # The operator declares each kind's aggregate the same way, from the summed first week.
    aggregates = {}
    for kind, parts in kinds.items():
        if len(parts) >= 4:
            nbytes = np.sum([p[0] for p in parts], axis=0)
            events = np.sum([p[1] for p in parts], axis=0)
            env = envelope_budget(nbytes, events, fleet.history_ticks)
            aggregates[kind] = {"budget": budget_config(env)}
    return {"tick": f"{TICK:g}s", "surfaces": surfaces, "aggregates": aggregates}


def write_events(fleet: Fleet, path: Path) -> None:
    with open(path, "w") as fh:
        for t in fleet.traces:
            nz = np.flatnonzero((t.nbytes > 0) | (t.events > 0))
            ts = T0 + nz * TICK + TICK / 2
            for i, when in zip(nz, ts, strict=True):
                fh.write(
                    f'{{"ts":{when:.1f},"surface":"{t.name}","kind":"{t.kind}",'
                    f'"bytes":{int(t.nbytes[i])},"events":{int(t.events[i])}}}\n'
                )
        # A zero-byte marker at the last tick, so the replay covers the whole time range.
        last = fleet.traces[0]
        end = T0 + (fleet.ticks - 1) * TICK + TICK / 2
        fh.write(
            f'{{"ts":{end:.1f},"surface":"{last.name}","kind":"{last.kind}","bytes":0,"events":0}}\n'
        )


def run(fleet: Fleet) -> Result:
    config = config_from_dict(fleet_config(fleet))
    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="capalarm-bench-") as tmp:
        path = Path(tmp) / "events.jsonl"
        write_events(fleet, path)
        summary = run_backtest(config, [str(path)], out, workers=1)
    result = Result(seconds=summary.seconds, ticks=summary.ticks)
    for line in out.getvalue().splitlines():
        change = json.loads(line)
        if change.get("state") != "firing" or "surface" not in change:
            continue
        f = change.get("figures", {})
        name = change["surface"]
        if name == "(all)":
            name = f"(all):{change['kind']}"
        result.firings.setdefault(name, []).append(
            Firing(
                tick=round((change["at"] - T0) / TICK) - 1,
                rule=change["rule"],
                horizon=f.get("budget_horizon") if change["rule"] == "budget" else None,
                excess_bits=float(f.get("budget_excess_bits", 0.0)),
                tolerance_bits=float(f.get("budget_tolerance_bits", 0.0)),
                surface=name,
            )
        )
    return result
