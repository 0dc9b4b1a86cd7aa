"""Per-surface views over the detector's arrays: what the snapshot, the status API and the
tests read (``detector.surfaces[key].figures``, ``.spike_alert.state``), built on access so
that the arrays stay the only state."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from alarm.detector.alerts import AlertBank, AlertState
from alarm.surfaces import SurfaceKey


class Rows(Protocol):
    """What the views read of the detector (engine.Detector)."""

    keys: list[SurfaceKey]
    index: dict[SurfaceKey, int]
    spike_alerts: AlertBank
    budget_alerts: AlertBank
    drop_alerts: AlertBank
    beacon_alerts: AlertBank
    duty_alerts: AlertBank

    def figures_of(self, row: int) -> SurfaceFigures: ...

    def drop_on(self, row: int) -> bool: ...

    def beacon_on(self, row: int) -> bool: ...

    def duty_on(self, row: int) -> bool: ...


@dataclass(slots=True)
class SurfaceFigures:
    rate: float = 0.0  # bytes/s over the last tick
    events_rate: float = 0.0
    baseline: float = 0.0
    threshold: float = 0.0
    baseline_ready: bool = False
    capacity_bps: float = 0.0  # Lampson bound, bits/s over the last tick
    budget_excess: float = 0.0  # base horizon
    budget_allowance: float = 0.0
    budget_tolerance: float = 0.0
    # Every horizon: (name, allowance bit/s, tolerance bits, excess bits).
    horizons: list[tuple[str, float, float, float]] = field(default_factory=list)
    # The seasonal budget: its CUSUM over its tolerance (fires above 1; 0 when not judging).
    seasonal_ratio: float = 0.0
    seasonal_judged: bool = False


class FigureRows(Protocol):
    """What ``figure_columns`` reads of the detector (engine.Detector): the last tick's
    arrays that ``figures_of`` reads one row of."""

    _rate: np.ndarray
    _events_rate: np.ndarray
    _capacity: np.ndarray
    _base: np.ndarray
    rules: Mapping[str, Any]

    def _spike_figures(self) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(slots=True)
class FigureColumns:
    """``SurfaceFigures``' last-tick figures of every row at once, as copies (the snapshot's
    columns: the whole tick fills its buffers in place)."""

    rate: np.ndarray  # bytes/s over the last tick
    events_rate: np.ndarray
    baseline: np.ndarray
    threshold: np.ndarray  # 0 where the spike rule does not judge
    baseline_ready: np.ndarray  # bool
    capacity_bps: np.ndarray  # Lampson bound, bits/s


def figure_columns(det: FigureRows) -> FigureColumns:
    """Every row's ``figures_of(row)`` rate, baseline, threshold and capacity, as arrays: a
    pure reader, the same values (tests/test_snapshot.py)."""
    spike_threshold, spike_ready = det._spike_figures()
    judged = spike_ready & np.isfinite(spike_threshold)
    return FigureColumns(
        rate=np.array(det._rate, dtype=np.float64),
        events_rate=np.array(det._events_rate, dtype=np.float64),
        baseline=np.array(det._base, dtype=np.float64),
        threshold=np.where(judged, spike_threshold, 0.0).astype(np.float64),
        baseline_ready=np.array(spike_ready, dtype=bool),
        capacity_bps=np.array(det._capacity, dtype=np.float64),
    )


class AlertView:
    __slots__ = ("_bank", "_row")

    def __init__(self, bank: AlertBank, row: int):
        self._bank = bank
        self._row = row

    @property
    def state(self) -> AlertState:
        return AlertState(int(self._bank.state[self._row]))

    @property
    def started_at(self) -> float:
        return float(self._bank.started_at[self._row])

    @property
    def rule(self) -> str:
        return self._bank.rule

    @property
    def target(self) -> str:
        return self._bank.targets[self._row]

    @property
    def fingerprint(self) -> str:
        return self._bank.fingerprint(self._row)


class SurfaceDetector:
    """One row of the detector."""

    __slots__ = ("_det", "key", "row")

    def __init__(self, det: Rows, row: int):
        self._det = det
        self.row = row
        self.key: SurfaceKey = det.keys[row]

    @property
    def figures(self) -> SurfaceFigures:
        return self._det.figures_of(self.row)

    @property
    def spike_alert(self) -> AlertView:
        return AlertView(self._det.spike_alerts, self.row)

    @property
    def budget_alert(self) -> AlertView:
        return AlertView(self._det.budget_alerts, self.row)

    @property
    def drop_alert(self) -> AlertView | None:
        """None where the drop rule is off."""
        return AlertView(self._det.drop_alerts, self.row) if self._det.drop_on(self.row) else None

    @property
    def beacon_alert(self) -> AlertView | None:
        """None where the beacon rule is off (aggregates, or turned off)."""
        on = self._det.beacon_on(self.row)
        return AlertView(self._det.beacon_alerts, self.row) if on else None

    @property
    def duty_alert(self) -> AlertView | None:
        """None where the duty rule is off (aggregates, or turned off)."""
        on = self._det.duty_on(self.row)
        return AlertView(self._det.duty_alerts, self.row) if on else None


class SurfaceMap(Mapping[SurfaceKey, SurfaceDetector]):
    """``detector.surfaces``: every row, members and aggregates, by key."""

    def __init__(self, det: Rows):
        self._det = det

    def __getitem__(self, key: SurfaceKey) -> SurfaceDetector:
        return SurfaceDetector(self._det, self._det.index[key])

    def __iter__(self) -> Iterator[SurfaceKey]:
        return iter(self._det.keys)

    def __len__(self) -> int:
        return len(self._det.keys)

    def __contains__(self, key: object) -> bool:
        return key in self._det.index
