"""JSON from outside (input files, journal lines, registry responses) decoded so that nesting
too deep to decode is malformed input like any other.

``json.loads`` raises RecursionError, not ValueError, on a line of ten thousand ``[``: every
caller that counts ValueError as a malformed record or a garbage response would otherwise
end in a traceback on one hostile line or body.
"""

from __future__ import annotations

import json
from typing import Any


def loads_json(text: str | bytes) -> Any:
    """``json.loads``; ValueError also when the document nests deeper than it can decode."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to decode") from None
