"""The detector's fused per-row passes, native where the extension was built.

A tick at 100k surfaces is some 150 numpy passes over arrays of 100k-300k values, each
reading and writing whole arrays for one or two float operations.  ``_fused.c`` does the
longest chains in one loop per row instead: the tails' SA and incidents, the size level, the
seasonal level's prediction and learning, and the budget bank's envelopes and sums.  Each loop does the same float operations in the same order and precision
as the numpy code that stays beside it, so the two agree bit for bit (on numbers: no NaN
reaches them), and that code runs where no C compiler was available at install
(``optional=True`` in setup.py, as for the kernel scanner).  The tests run both paths and
compare every state array and every alert change.
"""

from __future__ import annotations

from types import ModuleType

try:  # built by pip where a compiler is
    from alarm.detector import _fused as built
except ImportError:  # pragma: no cover - exercised where the extension was not built
    built = None
# What the passes that have a numpy twin use (tests and bench/detection/tick_paths.py set it
# to None to run the numpy code); the rules whose one definition is native use ``required``.
native_module = built


def native() -> ModuleType | None:
    """The native passes, or None: callers run their numpy code."""
    return native_module


class NativeMissing(RuntimeError):
    """The install has no detector extension (built without a C compiler)."""


def required() -> ModuleType:
    """The extension, for the rules whose one definition is native (rules/beacon.py)."""
    if built is None:
        raise NativeMissing(
            "alarm.detector._fused is not built: reinstall capalarm where a C compiler is "
            "(pip install needs gcc and the Python headers)"
        )
    return built


def code_path() -> str:
    """What a benchmark says it measured."""
    if native_module is None:
        return "numpy (no native extension)"
    return "native whole tick (whole_tick.py) where its rules allow, else fused passes"
