"""The columns the native passes read: float64, C-contiguous.

Apart from fused.py, which the command imports before it has told numpy's OpenBLAS how many
threads to start (alarm/cli.py): importing numpy there started a thread per core.
"""

from __future__ import annotations

import numpy as np

F64 = np.dtype(np.float64)


def as_float64(values: np.ndarray) -> np.ndarray:
    """``values`` as C-contiguous float64 for the native passes, without numpy's call where
    they already are (the tick's columns are): on a small fleet every call a tick counts."""
    if isinstance(values, np.ndarray) and values.dtype is F64 and values.flags.c_contiguous:
        return values
    return np.ascontiguousarray(values, dtype=np.float64)


__all__ = ["as_float64"]
