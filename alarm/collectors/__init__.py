"""Sources, one folder per family (kernel, fs, registry), one module per source type.

``SOURCE_TYPES`` is every type the service can build, looked up by the config's ``type``: each
type's registration (``<family>/<type>_type.py``), which imports its settings model and its
engine only when they are used (base.py)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from alarm.collectors import fs, kernel, registry
from alarm.collectors.base import SourceType

SOURCE_TYPES: Mapping[str, SourceType] = MappingProxyType(
    {t.type: t for t in (*kernel.SOURCES, *fs.SOURCES, *registry.SOURCES)}
)
