"""Surface kinds, one module per kind: ``alarm/kinds/<kind>.py`` defines ``KIND``, a
``alarm.kind.Kind`` named as the module is.  ``KINDS`` is every module found here, by name, in
name order; nothing else lists kinds, so a new kind is one new module (then
``python scripts/gen_chart_files.py``, which regenerates the chart's schema and placement).

A module here without a ``KIND``, or whose ``KIND`` is named otherwise, stops the import: a
kind half-declared must not be silently left out."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from alarm.kind import Kind


def discover(package: str, paths: list[str]) -> Mapping[str, Kind]:
    """The ``KIND`` of every module of ``package`` (found on ``paths``), by name."""
    found: dict[str, Kind] = {}
    for info in pkgutil.iter_modules(paths):
        module = importlib.import_module(f"{package}.{info.name}")
        kind = getattr(module, "KIND", None)
        if not isinstance(kind, Kind):
            raise TypeError(f"{module.__name__} declares no KIND (an alarm.kind.Kind)")
        if kind.name != info.name:
            raise ValueError(f"{module.__name__} declares kind {kind.name!r}, not {info.name!r}")
        found[kind.name] = kind
    return MappingProxyType(dict(sorted(found.items())))


KINDS: Mapping[str, Kind] = discover(__name__, list(__path__))
KIND_NAMES: tuple[str, ...] = tuple(KINDS)
