"""What an operator declares for a surface after looking at a week of its traffic: a capacity
budget per horizon (1m, 1h, 1d) from the envelope of that week.

k = 1.25 x the highest mean capacity (bits/s) over any window of the horizon; h = four times the
largest CUSUM excess that week would have built over that k, at least a quarter of the
horizon's allowance (k x T / 4), so a week that never exceeded k still leaves room for noise,
and at least twice the week's largest tick (one write twice as big as any seen passes).
The comparison methods get the same week (the static threshold is set from its peak).
"""

from __future__ import annotations

import numpy as np

HORIZONS = (("1m", 60.0), ("1h", 3600.0), ("1d", 86400.0))
META_BITS = 64.0  # capalarm's default metadata allowance per event
K_MARGIN = 1.25
H_MARGIN = 4.0


def capacity_bits(nbytes: np.ndarray, events: np.ndarray) -> np.ndarray:
    return 8.0 * nbytes + META_BITS * events


def envelope_budget(
    nbytes: np.ndarray, events: np.ndarray, history: int, tick: float = 60.0
) -> list[tuple[str, float, float]]:
    bits = capacity_bits(nbytes[:history], events[:history])
    csum = np.concatenate([[0.0], np.cumsum(bits)])
    out = []
    for name, seconds in HORIZONS:
        w = max(1, int(seconds / tick))
        peak = (csum[w:] - csum[:-w]).max() / (w * tick) if history >= w else bits.mean() / tick
        k = max(K_MARGIN * peak, 1.0)
        s, worst = 0.0, 0.0
        for b in bits:
            s = max(0.0, s + b - k * tick)
            worst = max(worst, s)
        h = max(H_MARGIN * worst, k * seconds / 4.0, 2.0 * bits.max())
        out.append((name, float(k), float(h)))
    return out


def budget_config(horizons: list[tuple[str, float, float]]) -> dict:
    (n0, k0, h0), *rest = horizons
    return {
        "allowance_bits_per_second": k0,
        "tolerance_bits": h0,
        "horizon": n0,
        "horizons": [
            {"horizon": n, "allowance_bits_per_second": k, "tolerance_bits": h} for n, k, h in rest
        ],
    }
