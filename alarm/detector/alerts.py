"""The alert state machine: inactive -> pending -> firing -> resolved (-> inactive).

A condition must hold for ``hold`` seconds before firing (0: fire on the first tick it holds)
and a firing alert resolves only after its value has stayed below ``hysteresis`` x threshold
for ``resolve_hold`` seconds, so a value hovering at the threshold does not flap.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


class AlertState(IntEnum):
    INACTIVE = 0
    PENDING = 1
    FIRING = 2
    RESOLVED = 3  # only ever reported as a transition; the machine rests in INACTIVE


def state_name(state: AlertState) -> str:
    """A state as alert documents name it (``firing``, ``resolved``, ...)."""
    return state.name.lower()


def fingerprint(target: str, rule: str) -> str:
    return hashlib.sha256(f"{target}\x00{rule}".encode()).hexdigest()[:16]


@dataclass(slots=True)
class AlertChange:
    """One state change, as notifiers and backtest output see it."""

    fingerprint: str
    target_type: str  # "surface" or "source"
    target: str
    kind: str
    rule: str
    state: str  # "pending", "firing", "resolved"
    previous: str
    at: float
    started_at: float
    value: float
    threshold: float
    figures: dict[str, Any] = field(default_factory=dict)
    contributors: list[tuple[str, int]] = field(default_factory=list)
    summary: str = ""
    # Receipts of contributors (by name) that an operator can re-check without trusting
    # capalarm: device:inode, size, mtime, digest; package, version, file, uploader.
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The change as a JSON document: strict JSON (RFC 8259 has no Infinity or NaN,
        which Python's json would write and Go's, jq's and browsers' parsers reject), so a
        figure that is not a finite number is null."""
        return _finite_or_null(self._document())

    def _document(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            self.target_type: self.target,
            "kind": self.kind,
            "rule": self.rule,
            "state": self.state,
            "previous": self.previous,
            "at": self.at,
            "started_at": self.started_at,
            "value": self.value,
            "threshold": self.threshold,
            "figures": self.figures,
            "contributors": [
                {"contributor": c, "bytes": b}
                | ({"receipt": self.receipts[c]} if c in self.receipts else {})
                for c, b in self.contributors
            ],
            "summary": self.summary,
        }


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


class AlertMachine:
    __slots__ = (
        "_clear_since",
        "_pending_since",
        "fingerprint",
        "hold",
        "hysteresis",
        "resolve_hold",
        "rule",
        "started_at",
        "state",
        "target",
    )

    def __init__(self, target: str, rule: str, hold: float, resolve_hold: float, hysteresis: float):
        self.target = target
        self.rule = rule
        self.fingerprint = fingerprint(target, rule)
        self.hold = hold
        self.resolve_hold = resolve_hold
        self.hysteresis = hysteresis
        self.state = AlertState.INACTIVE
        self.started_at = 0.0
        self._pending_since = 0.0
        self._clear_since: float | None = None

    def step(
        self, now: float, tick: float, value: float, threshold: float
    ) -> tuple[AlertState, AlertState] | None:
        """Advance one tick ending at ``now``.  Returns (previous, new) on a change."""
        breached = value > threshold
        prev = self.state
        if prev == AlertState.INACTIVE:
            if breached:
                self._pending_since = now - tick
                self.started_at = now - tick
                self.state = AlertState.FIRING if self.hold <= 0 else AlertState.PENDING
                if self.state == AlertState.PENDING and now - self._pending_since >= self.hold:
                    self.state = AlertState.FIRING
        elif prev == AlertState.PENDING:
            if not breached:
                self.state = AlertState.INACTIVE
            elif now - self._pending_since >= self.hold:
                self.state = AlertState.FIRING
        elif prev == AlertState.FIRING:
            if not breached and value <= threshold * self.hysteresis:
                if self._clear_since is None:
                    self._clear_since = now - tick
                if now - self._clear_since >= self.resolve_hold:
                    self._clear_since = None
                    self.state = AlertState.INACTIVE
                    return prev, AlertState.RESOLVED
            else:
                self._clear_since = None
        if self.state != prev:
            if self.state == AlertState.INACTIVE:
                # pending that cleared before firing: nothing was announced as firing
                return prev, AlertState.INACTIVE
            return prev, self.state
        return None

    def to_state(self) -> dict:
        return {
            "state": int(self.state),
            "started_at": self.started_at,
            "pending_since": self._pending_since,
            "clear_since": self._clear_since,
        }

    def load_state(self, state: dict) -> None:
        self.state = AlertState(int(state.get("state", 0)))
        self.started_at = float(state.get("started_at", 0.0))
        self._pending_since = float(state.get("pending_since", 0.0))
        cs = state.get("clear_since")
        self._clear_since = None if cs is None else float(cs)


class AlertBank:
    """The same state machine as AlertMachine for many rows at once (numpy), one rule each.

    ``step`` takes masks rather than values so that rules whose "clear" is not simply
    value <= hysteresis x threshold (the multi-horizon budget) use it too.  Only rows that are
    breached or not at rest are touched, so a quiet tick costs a couple of vector passes.
    """

    STATE = ("state", "started_at", "pending_since", "clear_since", "peak")

    def __init__(self, targets: list[str], rule: str, hold: np.ndarray, resolve_hold: np.ndarray):
        n = len(targets)
        self.rule = rule
        self.targets = targets
        self.hold = np.asarray(hold, dtype=np.float64)
        self.resolve_hold = np.asarray(resolve_hold, dtype=np.float64)
        self.state = np.zeros(n, dtype=np.int8)
        self.started_at = np.zeros(n)
        self.pending_since = np.zeros(n)
        self.clear_since = np.full(n, np.nan)  # NaN: not clearing
        self.peak = np.zeros(n)  # the value last announced as firing (see escalations)

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.STATE)

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        names = ("state", "started_at", "pending_since", "clear_since", "hold", "resolve_hold")
        return {f"{self.rule}_alerts.{a}": getattr(self, a) for a in names}

    def fingerprint(self, row: int) -> str:
        return fingerprint(self.targets[row], self.rule)

    def step(
        self, now: float, tick: float, breached: np.ndarray, clear: np.ndarray
    ) -> list[tuple[int, AlertState, AlertState]]:
        """Advance every row one tick ending at ``now``; returns (row, previous, new) for each
        row that changed (new is RESOLVED when a firing alert resolved)."""
        if not self.state.any() and not breached.any():
            return []  # every row at rest and none breached: the usual tick
        rows = np.flatnonzero(breached | (self.state != AlertState.INACTIVE))
        st = self.state[rows]
        br = breached[rows]
        cl = clear[rows] & ~br
        new = st.copy()
        report = st.copy()

        start = (st == AlertState.INACTIVE) & br
        self.pending_since[rows[start]] = now - tick
        self.started_at[rows[start]] = now - tick
        held = now - self.pending_since[rows] >= self.hold[rows]
        new[start] = np.where(held[start], AlertState.FIRING, AlertState.PENDING)

        pending = st == AlertState.PENDING
        new[pending & ~br] = AlertState.INACTIVE
        new[pending & br & held] = AlertState.FIRING

        firing = st == AlertState.FIRING
        cs = self.clear_since[rows]
        cs = np.where(firing & cl & np.isnan(cs), now - tick, cs)
        cs = np.where(firing & ~cl, np.nan, cs)
        resolved = firing & cl & (now - cs >= self.resolve_hold[rows])
        cs[resolved] = np.nan
        new[resolved] = AlertState.INACTIVE
        self.clear_since[rows] = cs

        report[:] = new
        report[resolved] = AlertState.RESOLVED
        self.state[rows] = new
        changed = (new != st) | resolved
        return [
            (int(r), AlertState(int(p)), AlertState(int(q)))
            for r, p, q in zip(rows[changed], st[changed], report[changed], strict=True)
        ]

    def escalations(
        self,
        values: np.ndarray,
        ratio: np.ndarray,
        changes: list[tuple[int, AlertState, AlertState]],
    ) -> list[int]:
        """Rows to re-announce: firing, not announced this tick, and ``values`` above ``ratio``
        x the value last announced (``ratio`` inf: never).  Remembers what is announced."""
        fired = [r for r, _, new in changes if new == AlertState.FIRING]
        if fired:
            self.peak[fired] = values[fired]
        if not self.state.any():
            return []  # nothing firing
        firing = self.state == AlertState.FIRING
        firing[fired] = False
        rows = np.flatnonzero(firing)  # a few rows: the rest is read at those only
        rows = rows[values[rows] / ratio[rows] > self.peak[rows]]  # inf ratio: 0, never
        self.peak[rows] = values[rows]
        return rows.tolist()

    def row_state(self, row: int) -> dict:
        cs = float(self.clear_since[row])
        return {
            "state": int(self.state[row]),
            "started_at": float(self.started_at[row]),
            "pending_since": float(self.pending_since[row]),
            "clear_since": None if math.isnan(cs) else cs,
        }

    def load_row(self, row: int, saved: dict) -> None:
        """Restore one row from an AlertMachine-shaped dict (v1 state)."""
        state = int(saved.get("state", 0))
        self.state[row] = state if state in (0, 1, 2) else 0
        self.started_at[row] = float(saved.get("started_at", 0.0))
        self.pending_since[row] = float(saved.get("pending_since", 0.0))
        cs = saved.get("clear_since")
        self.clear_since[row] = np.nan if cs is None else float(cs)
