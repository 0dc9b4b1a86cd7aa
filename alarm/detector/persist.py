"""Detector state as JSON: numpy arrays packed as base64, rows matched by surface key on load.

Matching by key lets a config change add, remove or reorder surfaces without losing the
history of the others.  Anything that does not have the expected shape is ignored: a state
saved by another version must never stop the alarm from starting.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

VERSION = 2
DTYPES = frozenset({"float32", "float64", "int64", "int32", "int8", "uint16", "uint32", "bool"})


def pack(arr: np.ndarray) -> dict[str, Any]:
    arr = np.ascontiguousarray(arr)
    return {
        "dtype": str(arr.dtype),
        "shape": list(arr.shape),
        "data": base64.b64encode(arr.tobytes()).decode("ascii"),
    }


def unpack(saved: Any) -> np.ndarray | None:
    """The array, or None when ``saved`` is not a packed array."""
    try:
        dtype = str(saved["dtype"])
        shape = tuple(int(s) for s in saved["shape"])
        if dtype not in DTYPES:
            return None
        raw = base64.b64decode(saved["data"], validate=True)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    except (KeyError, TypeError, ValueError):
        return None


def restore_rows(
    target: np.ndarray, saved: np.ndarray | None, pairs: tuple[np.ndarray, np.ndarray]
) -> bool:
    """Copy saved rows (the last axis) into ``target`` for matched (saved, current) rows.
    Leading axes must agree; the dtype is converted.  Returns whether anything was copied."""
    if saved is None or saved.ndim != target.ndim or saved.shape[:-1] != target.shape[:-1]:
        return False
    old, new = pairs
    if old.size and int(old.max()) >= saved.shape[-1]:
        return False
    target[..., new] = saved[..., old].astype(target.dtype, copy=False)
    return True


def match_rows(saved_keys: Any, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(saved row, current row) index arrays for keys present in both."""
    if not isinstance(saved_keys, list):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    where = {str(k): i for i, k in enumerate(saved_keys)}
    old, new = [], []
    for i, k in enumerate(keys):
        j = where.get(k)
        if j is not None:
            old.append(j)
            new.append(i)
    return np.array(old, dtype=np.int64), np.array(new, dtype=np.int64)
