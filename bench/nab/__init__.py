"""NAB (Numenta Anomaly Benchmark) scoring and capalarm's measurement on NAB's volume subset.

- `scorer`: NAB's scoring rules (windows, scaled sigmoid, probation, profile weights, threshold
  sweep, null/perfect normalisation), written from NAB's published rules and validated against
  the published windowedGaussian scores.
- `capalarm_nab`: replays NAB series through capalarm's backtest and turns spike alerts into
  per-row anomaly scores.
- `run`: `python bench/nab/run.py` prints the validation and the subset table.

See docs/nab.md.
"""
