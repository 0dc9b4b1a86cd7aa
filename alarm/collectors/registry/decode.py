"""Decoding registry bodies within a poll's memory budget.

``json.loads`` of a body of n bytes holds the bytes, their text (n characters; 4 bytes each
when one of them is beyond the Basic Multilingual Plane) and the decoded objects, which for
small containers are far larger than their text: ``[{},{},...]`` decodes to 25 times its
size, a PEP 691 project page to about 5 times.  :func:`decoded_estimate` is an upper
estimate of all of it, counted from the body's structural characters before decoding (C-speed
``bytes.count``), so a poll can refuse a decode its budget cannot hold instead of finding out
in the kernel's OOM killer.

A body whose bulk is one array (a PEP 691 page's ``files``, its index's ``projects``) need
not be held decoded at all: :func:`object_with_array` walks the top-level object and hands
each element of that array over one at a time, with its place in the text, so a caller keeps
what it needs of each (an identity hash, a span to decode again if the element turns out to
be new) and the array never exists as objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

# Measured with tracemalloc on Python 3.11 (bench/registry_poll.py's memory test, and
# tests/test_registry_memory.py): a dict is 184+ bytes, an entry of a large one about 100
# with its key, a list slot 8 and an int or float up to 40, a str 49 + its length.  Each
# weight is per structural character of the JSON text; the estimate is above what json.loads
# holds at its peak for every shape tried (empty dicts, empty lists, numbers, short strings,
# wide dicts, PEP 691 pages), by 1.2 to 2.5 times for real pages.
WEIGHTS = ((b"{", 120), (b"[", 72), (b":", 100), (b",", 40), (b'"', 26))
# Below this, the estimate is a flat multiple (counting would cost more than it saves).
SMALL = 16 * 1024
SMALL_FACTOR = 40

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")
scanstring = json.decoder.scanstring  # type: ignore[attr-defined]


def decoded_estimate(body: bytes | bytearray) -> int:
    """An upper estimate of the bytes ``json.loads(body)`` holds at its peak, the body
    included."""
    n = len(body)
    if n <= SMALL:
        return n * SMALL_FACTOR
    width = 1 if body.isascii() else 4
    return 4096 + n + 2 * width * n + sum(weight * body.count(ch) for ch, weight in WEIGHTS)


def text_estimate(body: bytes | bytearray) -> int:
    """The bytes the body's decoded text holds (a str is 1 or 4 bytes a character here)."""
    return len(body) * (1 if body.isascii() else 4)


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


def _value(text: str, pos: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError("JSON nested too deeply to decode") from None


def object_with_array(text: str, key: str, each: Callable[[Any, int, int], None]) -> dict[str, Any]:
    """Decode a JSON object, except that the elements of its member ``key`` (an array) are
    passed to ``each(element, start, end)`` one at a time instead of being kept; ``start:end``
    is the element's text (``raw_decode(text, start)`` decodes it again).  The other members
    are returned, ``key`` as True where it was an array.  Raises ValueError for anything that
    is not valid JSON of that shape (``key`` twice, or not an array)."""
    pos = _skip(text, 0)
    if text[pos : pos + 1] != "{":
        raise ValueError("not a JSON object")
    out: dict[str, Any] = {}
    pos = _skip(text, pos + 1)
    if text[pos : pos + 1] == "}":
        pos += 1
    else:
        while True:
            if text[pos : pos + 1] != '"':
                raise ValueError(f"expected a member name at {pos}")
            name, pos = scanstring(text, pos + 1)
            pos = _skip(text, pos)
            if text[pos : pos + 1] != ":":
                raise ValueError(f"expected ':' at {pos}")
            pos = _skip(text, pos + 1)
            if name == key:
                if name in out:
                    raise ValueError(f"{key!r} given twice")
                if text[pos : pos + 1] != "[":
                    raise ValueError(f"{key!r} is not an array")
                pos = _elements(text, pos + 1, each)
                out[name] = True
            else:
                out[name], pos = _value(text, pos)
            pos = _skip(text, pos)
            sep = text[pos : pos + 1]
            pos += 1
            if sep == "}":
                break
            if sep != ",":
                raise ValueError(f"expected ',' or '}}' at {pos - 1}")
            pos = _skip(text, pos)
    if _skip(text, pos) != len(text):
        raise ValueError(f"extra data at {pos}")
    return out


def _elements(text: str, pos: int, each: Callable[[Any, int, int], None]) -> int:
    pos = _skip(text, pos)
    if text[pos : pos + 1] == "]":
        return pos + 1
    while True:
        item, end = _value(text, pos)
        each(item, pos, end)
        pos = _skip(text, end)
        sep = text[pos : pos + 1]
        pos += 1
        if sep == "]":
            return pos
        if sep != ",":
            raise ValueError(f"expected ',' or ']' at {pos - 1}")
        pos = _skip(text, pos)


def element_at(text: str, start: int) -> Any:
    """The element whose text starts at ``start`` (from :func:`object_with_array`)."""
    return _value(text, start)[0]
