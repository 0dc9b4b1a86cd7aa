"""The detector's fused per-row passes, native where the extension was built.

A tick at 100k surfaces is some 150 numpy passes over arrays of 100k-300k values, each
reading and writing whole arrays for one or two float operations.  ``_fused.c`` does the
longest chains in one loop per row instead: the tails' SA and incidents, the size level, the
seasonal level's prediction and learning, the budget bank's envelopes and sums, and the beacon
ring's first look.  Each loop does the same float operations in the same order and precision
as the numpy code that stays beside it, so the two agree bit for bit (on numbers: no NaN
reaches them), and that code runs where no C compiler was available at install
(``optional=True`` in setup.py, as for the kernel scanner).  The tests run both paths and
compare every state array and every alert change.
"""

from __future__ import annotations

from types import ModuleType

try:  # built by pip where a compiler is
    from alarm.detector import _fused as native_module
except ImportError:  # pragma: no cover - exercised where the extension was not built
    native_module = None


def native() -> ModuleType | None:
    """The native passes, or None: callers run their numpy code."""
    return native_module


def code_path() -> str:
    """What a benchmark says it measured."""
    if native_module is None:
        return "numpy (no native extension)"
    return "native whole tick (whole_tick.py) where its rules allow, else fused passes"
