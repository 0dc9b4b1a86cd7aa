"""What an fs source saves: ledger rows per tracked inode and a small position.

- Ledger (``Batch.ledger``, saved with the counts in one transaction): ``f:<dev>:<ino>`` ->
  ``[size,counted,mtime_ns]`` for each counted inode (``counted``: the measure last counted,
  the size or a sparse file's data bytes), ``[size,counted,mtime_ns,names]`` for one with
  more than one name in the trees (hard links: names are not saved, so without the count a
  restart would take every extra name it finds for a new link), ``d:<dev>:<ino>`` -> ``1``
  for each directory.
- Position: ``{"v": 1, "at": <watermark>, "trees": {path: {"state": "baseline"|"ready",
  "mode": ..., "dev": ..., "ino": ...}}}``: ``at`` is where a restart's outage window starts,
  a tree's root (dev, ino) tells it is the same tree (or the same one on a renumbered device).
"""

from __future__ import annotations

import math
from typing import Any

POSITION_VERSION = 1


def ledger_value(size: int, counted: int, mtime: int, names: int = 1) -> str:
    if names > 1:
        return f"[{size},{counted},{mtime},{names}]"
    return f"[{size},{counted},{mtime}]"


def parse_ledger_value(value: str) -> tuple[int, int, int, int]:
    """``[size,counted,mtime(,names)]`` -> size, counted, mtime and names (1 when not
    saved); ValueError if it is not that."""
    parts = value.strip()[1:-1].split(",")
    if len(parts) not in (3, 4):
        raise ValueError(value[:40])
    size, counted, mtime = (int(p) for p in parts[:3])
    names = int(parts[3]) if len(parts) == 4 else 1
    return size, counted, mtime, names


def tree_position(state: str, mode: str, root: tuple[int, int] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"state": state, "mode": mode}
    if root is not None:
        entry["dev"], entry["ino"] = root
    return entry


def position(watermark: float, trees: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"v": POSITION_VERSION, "at": round(watermark, 6), "trees": trees}


def valid_position(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("v") == POSITION_VERSION
        and isinstance(value.get("at"), int | float)
        and math.isfinite(value["at"])
        and isinstance(value.get("trees"), dict)
    )
