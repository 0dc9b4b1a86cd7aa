"""Path-like patterns: the fs and registry classifiers match with them, and the registry
poller filters the packages it follows with the same syntax.

A pattern names trees: it matches what it names and everything under it (``/srv/scratch``
matches ``/srv/scratch/a/b``; ``/home/*/.cache`` every file in each user's cache).  In a glob
``*`` and ``?`` stay within one ``/``-separated segment, ``**`` spans any number of segments
(``**/`` also none), ``[...]`` is a character class.  ``/var/cache/pip/**/*.whl`` matches
every wheel in the cache, at any depth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GLOB_CHARS = frozenset("*?[")


def has_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


def _class(pattern: str, i: int) -> tuple[str, int]:
    """The regex of the character class starting at ``pattern[i] == '['``, and where it ends;
    an unclosed '[' is a literal."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    if j >= len(pattern):
        return re.escape("["), i + 1
    body = pattern[i + 1 : j]
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    body = body.replace("\\", "\\\\")
    # A negated class never matches the separator either: it stays within one segment.
    return (f"[^/{body}]" if negate else f"[{body}]"), j + 1


def glob_regex(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if pattern.startswith("/", i):
                    out.append("(?:[^/]*/)*")  # zero or more whole segments
                    i += 1
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            regex, i = _class(pattern, i)
            out.append(regex)
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(slots=True, frozen=True)
class Pattern:
    text: str
    tree: str | None  # a plain path: matches it and everything under it
    regex: re.Pattern[str] | None

    @classmethod
    def compile(cls, text: str) -> Pattern:
        if has_glob(text):
            body = glob_regex(text.rstrip("/") or "/")
            return cls(text, None, re.compile(f"(?:{body})(?:/.*)?", re.DOTALL))
        tree = text.rstrip("/") or "/"
        return cls(text, tree, None)

    def matches(self, name: str) -> bool:
        if self.regex is not None:
            return self.regex.fullmatch(name) is not None
        tree = self.tree
        assert tree is not None
        if tree == "/":
            return name.startswith("/")
        return name == tree or name.startswith(tree + "/")
