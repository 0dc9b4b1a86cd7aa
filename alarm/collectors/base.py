"""The one small interface every source implements, and how a source type registers.

A collector reads its source and hands :class:`~alarm.events.Batch` es to ``emit`` (on the
event loop).  ``emit`` returns once the pipeline has applied the batch: its events, counter
deltas and position together, so a saved position is always exactly the position of what has
been counted.  Blocking or CPU-heavy reading belongs in a worker thread, never on the loop.

A source type is registered by one module, ``<family>/<type>_type.py``, that exports a
:class:`SourceType`: its ``type``, the kind it feeds, its counters, and where its settings model
(a :class:`SourceSettings` with a ``type: Literal[...]`` field) and its factory are.  Its
family's ``__init__`` lists it, and the service looks the type up by name (no if-chain).  The
registration names the settings and the factory as ``"module:name"`` and imports them on first
use: the settings when a config that declares the type is read, the factory (the engine:
asyncio, the HTTP client, inotify and fanotify) when a source of the type is built.  So a
command imports only the sources it runs, and a backtest none (issue 29).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from pydantic import Field

from alarm.events import Emit, SourceHealth
from alarm.settings import NAME_PATTERN, Strict


class SourceUnavailable(RuntimeError):
    """The source cannot be read on this host (no device, no permission, no tool)."""


class SourceSettings(Strict):
    """Fields every source has; each type adds its own and a ``type`` literal."""

    name: str = Field(pattern=NAME_PATTERN)


class Collector(Protocol):
    name: str
    health: SourceHealth

    async def run(self, emit: Emit) -> None:
        """Read until cancelled.  Bad input is counted (batch counts), never raised; an
        exception means the source failed and is restarted with backoff."""
        ...


def _no_ledger() -> Iterator[tuple[str, str]]:
    return iter(())


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a factory gets besides its config."""

    tick: float  # the pipeline's tick: sources that pre-aggregate do so per tick
    position: dict[str, Any] | None = None  # the saved position, None on a first start
    # The saved ledger rows (key, JSON text) of this source, read lazily.
    ledger: Callable[[], Iterator[tuple[str, str]]] = _no_ledger
    state_dir: str = ""


def resolve(ref: str) -> Any:
    """The object a ``"package.module:name"`` reference names, its module imported."""
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{ref!r} is not 'module:name'")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True, slots=True)
class SourceType:
    type: str  # the config's ``type``
    # "module:name" of the config model (or a tagged union of models sharing this ``type``):
    # a settings module, which imports pydantic and no engine.
    settings: str
    # "module:name" of the factory, ``(settings, SourceContext) -> Collector``: the engine.
    factory: str
    kind: str  # the surface kind it feeds ("egress", "fs", "registry")
    # Counters of this type besides alarm.events.CORE_COUNTERS: name -> help text.
    counters: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Whether records of this type can be forged look-alikes (only kernel fence records).
    forgeable: bool = False
    # The tags of a union inside its settings (the registry source's ``api``), which pydantic
    # puts in error locations: not keys the user wrote.
    nested_tags: frozenset[str] = frozenset()

    @property
    def config(self) -> Any:
        """The config model, its module imported on first use."""
        return resolve(self.settings)

    def build(self, settings: Any, ctx: SourceContext) -> Collector:
        """A collector of this type: its engine is imported here, not before."""
        factory: Callable[[Any, SourceContext], Collector] = resolve(self.factory)
        return factory(settings, ctx)
