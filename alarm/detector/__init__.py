"""Per-surface detection each tick: robust baseline + threshold for spikes, Lampson capacity
budgets (CUSUM) for slow drips, and the alert state machine that turns both into alerts."""
