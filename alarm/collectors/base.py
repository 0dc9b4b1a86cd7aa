"""The one small interface every source implements, and how a source type registers.

A collector reads its source and hands :class:`~alarm.events.Batch` es to ``emit`` (on the
event loop).  ``emit`` returns once the pipeline has applied the batch: its events, counter
deltas and position together, so a saved position is always exactly the position of what has
been counted.  Blocking or CPU-heavy reading belongs in a worker thread, never on the loop.

A source type is one module that defines its config model (a :class:`SourceSettings` with a
``type: Literal[...]`` field) and a factory, and exports them as a :class:`SourceType`; its
family's ``__init__`` lists it, and the service looks the type up by name (no if-chain).
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class SourceType:
    type: str  # the config's ``type``
    config: Any  # the config model (or a tagged union of models sharing this ``type``)
    build: Callable[[Any, SourceContext], Collector]
    kind: str  # the surface kind it feeds ("egress", "fs", "registry")
    # Counters of this type besides alarm.events.CORE_COUNTERS: name -> help text.
    counters: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Whether records of this type can be forged look-alikes (only kernel fence records).
    forgeable: bool = False
