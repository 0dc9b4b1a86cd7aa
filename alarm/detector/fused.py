"""The detector's native extension: the whole tick and the rules written once in C.

Every rule the detector runs on each tick has one numeric definition.  The core rules (spike,
budget, the aggregates' members statistic) are the whole native tick (``_whole_tick.c``, with
the loops of ``_fused.c``), driven by whole_tick.py; the beacon and duty rules are one
function each in ``_fused.c`` (rules/beacon.py, rules/duty.py); the rules on weeks are numpy
in their own modules (rules/).  There is no numpy twin of the native code to fall back on, so
the extension is required at install (setup.py) and an install without it stops at start with
one line (``required``).  docs/detector.md ("Each rule written once") says how this was chosen.
"""

from __future__ import annotations

from types import ModuleType

try:  # built by pip where a compiler is
    from alarm.detector import _fused as built
except ImportError:  # pragma: no cover - exercised where the extension was not built
    built = None


# The extension's functions and arguments this code calls (``API`` in _fused.c, raised with
# every change of them): a module built from other sources (a checkout updated without
# reinstalling) is refused at start, not found out at the first tick.
API = 2


class NativeMissing(RuntimeError):
    """The install has no detector extension (built without a C compiler), or one built
    from other sources than this code."""


def required() -> ModuleType:
    """The extension, or NativeMissing with what to do about it."""
    if built is None:
        raise NativeMissing(
            "alarm.detector._fused is not built: reinstall capalarm where a C compiler is "
            "(pip install needs gcc and the Python headers)"
        )
    if getattr(built, "API", 0) != API:
        raise NativeMissing(
            f"alarm.detector._fused was built from other sources than this code (API "
            f"{getattr(built, 'API', 0)}, this code needs {API}): reinstall capalarm "
            "(pip install ., or pip install -e . in a checkout)"
        )
    return built


def code_path() -> str:
    """What a benchmark says it measured."""
    return "native whole tick (alarm/detector/_whole_tick.c, _fused.c)"
