"""What every configuration model shares: strict models, durations, names, and errors that name
their key path.  A leaf module: the source, classifier and notification models import it, and
``alarm.config`` assembles them into the one configuration, from the :class:`ConfigParts` the
composition root (alarm/assembly.py) names."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

if TYPE_CHECKING:
    from alarm.kind import Kind

UNCLASSIFIED = "unclassified"
# Surface and source names: they become label values, so they are short and plain.
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$"

_KEYED = re.compile(r"^[A-Za-z_][\w.\[\]]*: ")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(value: Any) -> float:
    """'10s', '5m', '1.5h', 30 -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 10s, 5m, 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration like 10s, 5m, 1h")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Strict(BaseModel):
    """Unknown keys are errors (a typo must not silently turn a rule off); values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceTypeModel(Protocol):
    """What the configuration reads of a source type (``alarm.collectors.base.SourceType``)."""

    @property
    def config(self) -> Any:
        """Its settings model, or a tagged union of models sharing its ``type``."""

    @property
    def kind(self) -> str:
        """The kind of surface it feeds."""


@dataclass(frozen=True, slots=True)
class ConfigParts:
    """What the one configuration is assembled from besides its own models.  The composition
    root (alarm/assembly.py) names them, so ``alarm.config`` names no collector and no kind."""

    source_types: Mapping[str, SourceTypeModel]  # by the config's ``type``
    kinds: Mapping[str, Kind]  # by a surface's ``kind``
    egress_canary: type[BaseModel]  # the model of ``egress_canary:``, the fence canary's
    # Tags pydantic puts in error locations for unions nested in a source's settings (the
    # registry source's ``api``): not keys the user wrote.
    nested_tags: frozenset[str] = frozenset()


class ConfigError(Exception):
    """Every problem found, each as 'key.path: message'."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def key_path(loc: tuple[Any, ...], tags: frozenset[str] = frozenset()) -> str:
    """``('sources', 0, 'kmsg', 'prefixes')`` -> ``sources[0].prefixes``: the tag pydantic puts
    after a list item of a tagged union (and after that tag, for a union nested in it) is not
    a key the user wrote, so it is left out."""
    parts: list[str] = []
    after_item = False
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
            after_item = True
        elif after_item and item in tags:
            continue
        else:
            parts.append(("." if parts else "") + str(item))
            after_item = False
    return "".join(parts) or "(top level)"


def problems_of(exc: ValidationError, tags: frozenset[str] = frozenset()) -> list[str]:
    """One 'key.path: message' line per validation error."""
    problems = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        where = key_path(err["loc"], tags)
        if err["type"] == "union_tag_invalid":
            ctx = err.get("ctx", {})
            field = str(ctx.get("discriminator", "type")).strip("'()")
            where = f"{where}.{field}"
            msg = f"unknown {field} {ctx.get('tag')!r} (known: {ctx.get('expected_tags')})"
        elif err["type"] == "union_tag_not_found":  # the key that picks the model is missing
            field = str(err.get("ctx", {}).get("discriminator", "type")).strip("'()")
            where, msg = f"{where}.{field}", "Field required"
        if where == "(top level)" and _KEYED.match(msg):
            problems.append(msg)  # a whole-config check that names its own key
        else:
            problems.append(f"{where}: {msg}")
    return problems
