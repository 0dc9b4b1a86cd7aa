"""Configuration: YAML in, validated models out, every problem named by its key path.

Defaults live here, per surface kind, so that a config only states what differs.  The
reasoning behind the numbers is in docs/detector.md.  This module defines the model
generically, with the notification settings from alarm/notify_config.py; what depends on what
is registered comes as :class:`~alarm.settings.ConfigParts` from the composition root,
alarm/assembly.py: the source types with their settings (alarm/collectors/), the surface kinds
with their ``match:`` and default budgets (alarm/kinds/), and the fence canary's settings.
They are read the first time a model is needed (``Config``, ``DEFAULT_BUDGETS``,
``config_from_dict``, ``load_config``), so importing this module, as the detector and the
exporters do, loads no collector.  ``config_from_dict`` (and so ``load_config``) validates with
a model whose ``sources:`` union holds the settings of the source types the config declares
only, with the same tags and messages as ``Config``'s: a kernel-only config imports no fs or
registry settings (issue 29).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from alarm.kind import horizons
from alarm.notify_config import DESTINATION_TYPES, TARGET_KINDS, NotificationsConfig
from alarm.settings import (
    NAME_PATTERN,
    UNCLASSIFIED,
    ConfigError,
    ConfigParts,
    Duration,
    Strict,
    parse_duration,
    problems_of,
)
from alarm.yamltext import load_yaml

__all__ = ["UNCLASSIFIED", "ConfigError", "parse_duration"]


class SpikeRule(Strict):
    """The spike rule: a tick's writes, and the rate over five and thirty minutes, against the
    surface's own seasonal levels, each with a threshold calibrated from the surface's history
    for ``false_alarms_per_week`` (alarm/detector/rules/spike.py, docs/detector.md)."""

    enabled: bool = True
    # The false pages a week this rule may cost on ordinary traffic, on this surface.
    false_alarms_per_week: float = Field(0.1, gt=0, le=100)
    # The largest incidents of the last two weeks a statistic's tail is fitted on; it judges
    # once it has that many (and min_history).
    min_peaks: int = Field(12, ge=3, le=48)
    # A rate that is a spike whatever was learned, from the first tick (None: none).
    absolute_bytes_per_second: float | None = Field(None, gt=0)
    # How far the rate level may learn upward in one tick, in robust standard deviations of
    # the log-rate (and at least min_ratio, at most max_ratio x the level).
    z: float = Field(6.0, gt=0)
    min_ratio: float = Field(6.0, ge=1)
    # Never a spike below this rate (on the tick or over the averages); the log-rate unit of
    # the averaged statistics is a sixteenth of it.  128 B/s was chosen on the long fleet's
    # choice seeds (docs/detector.md, "The rule").
    floor_bytes_per_second: float = Field(128.0, ge=0)
    history: Duration = 3600.0
    # History before the rule judges: a tail is not known from minutes of data.
    min_history: Duration = 86400.0
    hold: Duration = 0.0  # how long the condition must hold before firing
    resolve_hold: Duration = 30.0  # how long it must stay clear before resolving
    hysteresis: float = Field(0.8, gt=0, le=1)
    max_ratio: float = Field(8.0, ge=1)
    # Daily (15-min slots) and weekly (hourly slots) profiles, used once a slot has history.
    seasonal: bool = True
    # How far either side of the current 15-min slot the daily profile looks (rounded to
    # slots): a recurring job that drifts by this much is still what is normal then.
    seasonal_window: Duration = Field(900.0, le=6 * 3600.0)
    # Once the weekly profile knows an hour, a weekday quieter at that hour than the daily
    # profile lowers the daily profile by that much, by at most this factor; 1 = off (every
    # day judged against the daily profile, which weekdays dominate).
    weekday_dip_max: float = Field(4.0, ge=1)
    # How fast the baseline may learn upward: at most this factor per day (per week for the
    # weekly profile), so a patient attacker cannot walk it up faster than that.
    max_learn_up: float = Field(4.0, gt=1)
    # Re-announce a firing spike when the rate passes this factor x the rate last announced
    # ("the leak got bigger"); 0 = never.  Off by default: one page per incident.
    escalate_ratio: float = Field(0.0, ge=0)
    # The opposite alarm, rule ``drop``: the rate stayed below baseline / drop_ratio, with at
    # least floor_bytes_per_second missing, for drop_hold.  A surface that stops writing what
    # it always writes may have been routed around (or its records lost).  0 = off.
    drop_ratio: float = Field(0.0, ge=0)
    drop_hold: Duration = 3600.0

    @model_validator(mode="after")
    def _ratios(self) -> SpikeRule:
        if 0 < self.escalate_ratio <= 1:
            raise ValueError("escalate_ratio must be 0 (off) or above 1")
        if 0 < self.drop_ratio <= 1:
            raise ValueError("drop_ratio must be 0 (off) or above 1")
        if self.max_ratio < self.min_ratio:
            raise ValueError("max_ratio must be at least min_ratio")
        return self


class BudgetHorizon(Strict):
    """One more capacity budget on a longer horizon: a lower allowance, a larger tolerance."""

    horizon: str = Field(pattern=r"^[A-Za-z0-9_.]{1,16}$")
    allowance_bits_per_second: float = Field(gt=0)
    tolerance_bits: float = Field(gt=0)


class RelativeBudget(Strict):
    """Seasonal (relative) budget: a CUSUM on each tick's log-capacity score above ``ratio`` x
    the score's mean at that hour of the day; fires after about ``tolerance`` typical writes'
    worth above it (alarm/detector/rules/budget.py, docs/detector.md).  Off by default: its
    tolerance is not calibrated for a false-alarm rate, and the derived budgets and the spike
    rule's half-hour statistic see what it was for."""

    enabled: bool = False
    # (r - 1) / ln r for an activity rate rising r-fold: 3 is the optimum for r ~ 7.
    ratio: float = Field(3.0, gt=1)
    tolerance: float = Field(8.0, gt=0)  # in the surface's typical active ticks
    # TCSEC's lower edge: below 0.1 bit/s a channel need not be audited.
    min_allowance_bits_per_second: float = Field(0.1, ge=0)
    min_history: Duration = 86400.0
    max_learn_up: float = Field(4.0, gt=1)  # per day, like the spike baseline


class BeaconRule(Strict):
    """Rule ``beacon``: writes of one size at a regular interval (alarm/detector/beacon.py).
    Fires at the ``repeats``-th write of the same size (within ``size_tolerance``, a fraction;
    0 = the same byte count) each about one period after the last (within ``jitter`` x the
    period), and resolves after ``resolve_hold`` without one."""

    enabled: bool = True
    repeats: int = Field(5, ge=3, le=16)
    # Smaller ticks are not looked at: TCP keepalives, NTP, DNS and ping (40-100 B) are
    # periodic and of one size on every host; a beacon worth the name carries more.
    min_bytes: int = Field(256, ge=1)
    size_tolerance: float = Field(0.0, ge=0, le=0.5)
    jitter: float = Field(0.1, ge=0, le=0.45)
    max_period: Duration = 3600.0
    resolve_hold: Duration = 7200.0

    @model_validator(mode="after")
    def _resolve_after_a_period(self) -> BeaconRule:
        if self.resolve_hold < self.max_period:
            raise ValueError(
                "resolve_hold must be at least max_period (a beacon that waits a period would flap)"
            )
        return self


class DutyRule(Strict):
    """Rule ``duty``: the surface is written in far more ticks than it ever is
    (alarm/detector/rules/duty.py).  Its count of written ticks, decayed with time constant
    ``window``, fires at ``ratio`` x the highest count of its last week's days plus ``margin``
    written ticks, and resolves after ``resolve_hold`` below half of that.  A surface that
    writes a few times an hour and then in every tick (a drip in small lumps) is seen in a
    few ticks, long before the bits add up to a budget's tolerance.  Its run of ticks written
    without a pause is judged the same way (``ratio`` x the longest run of the kept days plus
    ``margin`` ticks, once a week is kept): a cache written in most ticks is seen when it
    writes without a pause for twice as long as it ever does."""

    enabled: bool = True
    window: Duration = Field(300.0, gt=0)
    ratio: float = Field(2.0, ge=1)
    margin: float = Field(2.0, gt=0)
    resolve_hold: Duration = 3600.0


class DriftConfig(Strict):
    """Rule ``drift`` (alarm/detector/rules/drift.py, docs/weeks.md): the last day's bits,
    writes and written ticks against the surface's days before yesterday, and each day
    against the same weekday of the weeks kept."""

    enabled: bool = True


class DormantConfig(Strict):
    """Rule ``dormant`` (alarm/detector/rules/dormant.py): a write into a surface silent for
    at least ``silence`` (and longer than any silence it broke before)."""

    enabled: bool = True
    silence: Duration = Field(7 * 86400.0, ge=3600.0)


class NewSurfaceConfig(Strict):
    """Rule ``newsurface`` (alarm/detector/rules/newsurface.py): a surface declared without a
    budget is held, from its first write and for ``learning``, to an allowance that starts at
    ``allowance_bits_per_second`` and grows fourfold a day, with ``tolerance_bits`` above it.
    Unset: the kind's default (egress and fs 64 kbit/s and 64 Mbit, registry 8 kbit/s and
    16 Mbit).  A surface with a declared budget is not on this rule."""

    enabled: bool = True
    allowance_bits_per_second: float | None = Field(None, gt=0)
    tolerance_bits: float | None = Field(None, gt=0)
    learning: Duration = Field(2 * 86400.0, gt=0, le=30 * 86400.0)


class BudgetRule(Strict):
    """Lampson capacity budget: one-sided CUSUM on estimated bits.

    S_t = max(0, S_{t-1} + bits_t - allowance * dt); fires when S_t > tolerance."""

    enabled: bool = True
    allowance_bits_per_second: float = Field(gt=0)
    tolerance_bits: float = Field(gt=0)
    resolve_hold: Duration = 30.0
    hysteresis: float = Field(0.5, gt=0, le=1)
    # The name of the horizon above (allowance, tolerance); ``horizons`` adds more, each its
    # own CUSUM; the alert fires when any of them passes its tolerance.
    horizon: str = Field("base", pattern=r"^[A-Za-z0-9_.]{1,16}$")
    horizons: list[BudgetHorizon] = []
    # Judged against the surface's own hour-of-day history: drips under the allowance above.
    relative: RelativeBudget = RelativeBudget()
    # Timing, not volume: a regular writer of one size, however small (rule ``beacon``).
    beacon: BeaconRule = BeaconRule()
    # Timing too: written in far more ticks than ever, however few bytes (rule ``duty``).
    duty: DutyRule = DutyRule()

    @model_validator(mode="after")
    def _unique_horizons(self) -> BudgetRule:
        names = [self.horizon, *(h.horizon for h in self.horizons)]
        if len(set(names)) != len(names):
            raise ValueError(f"horizon names must be unique, got {names}")
        return self


# Defaults per kind (each kind's module in alarm/kinds/ gives its own; DEFAULT_BUDGETS, once
# assembled, holds them and UNCLASSIFIED_BUDGET).  Each kind has three
# horizons, a token-bucket envelope (docs/detector.md): over a minute a surface may burst (high
# allowance, small tolerance); over a day it must average far less (low allowance, larger
# tolerance).
#
# Unclassified is default deny: traffic nobody declared gets the tightest budget, and TCSEC's
# covert-channel bands set its scale (above 100 bit/s is "high"; 0.1-100 bit/s must be
# detected and audited).  What it must let through is the stray traffic every host sends (a
# DNS query, an NTP or ICMP packet: ~0.1-1.3 kbit each with its metadata, about one an hour);
# what it must not let through is more than a few secrets' worth.  A key is 128-256 bits, but
# one full-size packet (1500 B, 12 kbit) already carries dozens of them, so the tolerances are
# set by packets that must not page, and the allowances by the audited band:
# - 1m: 100 bit/s, 64 Kibit: TCSEC's "high" edge (the hour below, with the smaller tolerance,
#   now fires first whatever the pattern).
# - 1h: 2 bit/s, 24 Kibit: 7.2 kbit an hour (five or so stray packets) plus 3 KiB, just over
#   two full-size packets at once (24.1 kbit with metadata), so no stray packet, even a
#   full-size one, pages on its own; a leak in 1 KB lumps is caught at its 3rd-4th lump, a
#   10 bit/s drip (4.5 KB an hour) in under an hour, a 100 bit/s one in about 4 min.
# - 1d: 0.5 bit/s, 128 Kibit: 43 kbit a day of strays (~30 packets) plus 16 KiB; the day
#   horizon takes over from the hour one after about 20 h, as the envelope intends (with
#   256 Kibit it did only after 44 h): a 2 bit/s drip is caught in a day, 1 bit/s in three.
UNCLASSIFIED_BUDGET = horizons(100.0, 65536.0, (2.0, 24576.0), (0.5, 131072.0))
# The kind of a surface that states none.
DEFAULT_KIND = "egress"
# Bits of metadata an event may carry besides its payload (names, sizes, timing): an upper
# bound, so a channel of empty packets still has capacity.
DEFAULT_META_BITS_PER_EVENT = 64.0


class SurfaceSettings(Strict):
    """What every surface has; each kind adds its ``match`` (the kind's classifier fields)."""

    # The kind's default budget (set on each kind's model by assemble).
    default_budget: ClassVar[Mapping[str, Any]]

    name: str = Field(pattern=NAME_PATTERN)
    spike: SpikeRule = SpikeRule()
    budget: BudgetRule | None = None  # None: the kind's default
    meta_bits_per_event: float = Field(DEFAULT_META_BITS_PER_EVENT, ge=0)
    # The rules on weeks of history (docs/weeks.md).
    drift: DriftConfig = DriftConfig()
    dormant: DormantConfig = DormantConfig()
    newsurface: NewSurfaceConfig = NewSurfaceConfig()

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == UNCLASSIFIED:
            raise ValueError("'unclassified' is reserved: it is declared for every kind")
        return value

    def effective_budget(self) -> BudgetRule:
        return self.budget or BudgetRule(**self.default_budget)


def _tag(field_name: str, default: str) -> Callable[[Any], str]:
    def tag(value: Any) -> str:
        if isinstance(value, dict):
            return str(value.get(field_name, default))
        return str(getattr(value, field_name, default))

    # Named after the field, so an unknown tag is reported as that field's problem.
    tag.__name__ = tag.__qualname__ = field_name
    return tag


def _tagged_union(models: Mapping[str, Any], field_name: str, default: str) -> Any:
    """One of ``models``, chosen by ``field_name`` (``default`` when it is absent)."""
    return Annotated[
        Union[tuple(Annotated[m, Tag(name)] for name, m in models.items())],  # type: ignore[valid-type]  # noqa: UP007
        Discriminator(_tag(field_name, default)),
    ]


class EventTime(Strict):
    """When a tick is evaluated.  Every event counts in the tick its own timestamp falls in;
    a tick closes once every source is past it (docs/pipeline.md)."""

    # How long after a tick's end a caught-up source may still deliver events stamped in it
    # (records in flight between the kernel, the reader and the pipeline).
    grace: Duration = Field(0.25, le=60.0)
    # How long (wall clock) a source that is up but behind may hold ticks open before they
    # close without it; what it delivers later for those ticks counts as late.  Where every
    # source polls, a poller holds them one interval (at most 5 min) plus this after its last
    # successful poll started.
    lateness: Duration = Field(30.0, le=3600.0)
    # After an outage at most this much past is evaluated tick by tick; older events count as
    # late in the first tick evaluated.
    max_backlog: Duration = Field(7 * 86400.0, ge=0)


class WebhookConfig(Strict):
    url: str = Field(pattern=r"^https?://")
    name: str | None = None
    timeout: Duration = 5.0
    max_retries: int = Field(5, ge=0, le=100)
    queue_size: int = Field(10000, ge=1)
    headers: dict[str, str] = {}


class HttpConfig(Strict):
    listen: str = "127.0.0.1:9733"
    top_contributors: int = Field(10, ge=0, le=1000)
    # /metrics: "lean" (at most 9 series a surface, alert states away from rest) or "full"
    # (every budget horizon and state as its own series; exporters/prometheus.py).
    metrics: Literal["lean", "full"] = "lean"

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        _, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
            raise ValueError(f"{value!r} is not host:port")
        return value

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "0.0.0.0", int(port)


class AggregateRule(Strict):
    """The kind's aggregate surface: the sum over every surface of the kind.  Its budget, when
    not given, is ``share`` x the members' allowances summed per horizon (tolerance: the
    largest member's), so a swarm of members each under budget still alarms once more than
    that share of the summed allowance is in use at once."""

    enabled: bool = True
    min_members: int = Field(4, ge=2)  # fewer members: the aggregate only repeats them
    share: float = Field(0.5, gt=0, le=1)
    # The members statistic of the aggregate's spike rule: many members each writing more per
    # write than their own normal at once (alarm/detector/swarm.py), and rule ``members``:
    # far more members writing at once than ever at that hour (rules/members.py).
    members: bool = True
    spike: SpikeRule = SpikeRule()
    budget: BudgetRule | None = None


def _default_sources() -> list[Any]:
    return [{"name": "kernel"}]


class ConfigBase(Strict):
    """The configuration, as this module defines it; ``Config`` is this model assembled from
    the registered parts (assemble).  The fields marked "assembled" have their place and
    default here and their type there: the source types, the surface kinds, the canary's
    settings."""

    parts: ClassVar[ConfigParts]

    tick: Duration = 10.0
    state_dir: str = "/var/lib/capalarm"
    http: HttpConfig = HttpConfig()
    # Assembled: one of the source types' settings, by ``type``.
    sources: list[Any] = Field(default_factory=_default_sources, validate_default=True)
    # Assembled: one of the kinds' surface models, by ``kind``.
    surfaces: list[Any] = []
    event_time: EventTime = EventTime()
    # Unclassified surfaces per kind: default deny, so they get the tightest budget.
    # Assembled: keyed by a registered kind.
    unclassified: dict[str, BudgetRule] = {}
    unclassified_spike: SpikeRule = SpikeRule()
    # The sum over all surfaces of a kind, with its own baseline and budget (swarm detection).
    # Assembled: keyed by a registered kind.
    aggregates: dict[str, AggregateRule] = {}
    # Shorthand for unsigned generic webhooks; each becomes a notifications destination.
    webhooks: list[WebhookConfig] = []
    notifications: NotificationsConfig = NotificationsConfig()
    heavy_hitters: int = Field(64, ge=1, le=10000)  # contributors remembered per surface
    # Proof of sight for the fence itself (alarm/collectors/kernel/canary.py); off when absent.
    # Assembled: the canary's settings model.
    egress_canary: Any = None

    @field_validator("tick")
    @classmethod
    def _tick(cls, value: float) -> float:
        if not 0.05 <= value <= 3600:
            raise ValueError("tick must be between 50ms and 1h")
        return value

    # The whole-config checks.  pydantic runs them only once every field is valid, so
    # config_from_dict also runs them on the raw data (_cross_problems) and reports them with
    # the field errors in one pass; both use the same functions, so the lines are the same.
    @model_validator(mode="after")
    def _unique_names(self) -> ConfigBase:
        problems = _duplicate_names("surfaces", [s.name for s in self.surfaces])
        problems += _duplicate_names("sources", [s.name for s in self.sources])
        if problems:
            raise ValueError(problems[0])
        return self

    @model_validator(mode="after")
    def _selected_sources_exist(self) -> ConfigBase:
        kinds = {s.name: self.parts.source_types[s.type].kind for s in self.sources}
        problems = _source_references(kinds, [(s.kind, _selected(s.match)) for s in self.surfaces])
        if problems:
            raise ValueError(problems[0])
        return self

    @model_validator(mode="after")
    def _filters_name_known_kinds(self) -> ConfigBase:
        filters = [d.filter.kinds for d in self.notifications.destinations]
        problems = _filter_kinds(self.parts, filters)
        if problems:
            raise ValueError(problems[0])
        return self

    @model_validator(mode="after")
    def _canary_sources_are_kernel_sources(self) -> ConfigBase:
        canary = self.egress_canary
        if canary is None:
            return self
        kinds = {s.name: self.parts.source_types[s.type].kind for s in self.sources}
        # No kernel source at all is allowed: the chart gives the same keys to the pollers'
        # Deployment, which reads no fence; there the canary sends nothing.
        problems = _canary_references(kinds, canary.sources)
        if problems:
            raise ValueError(problems[0])
        return self

    def source_kind(self, name: str) -> str:
        for s in self.sources:
            if s.name == name:
                return self.parts.source_types[s.type].kind
        raise KeyError(name)

    def kinds_in_use(self) -> list[str]:
        """Kinds with a declared surface or a source feeding them: each has an
        ``unclassified`` surface."""
        types = self.parts.source_types
        kinds = {s.kind for s in self.surfaces} | {types[s.type].kind for s in self.sources}
        return [k for k in self.parts.kinds if k in kinds]

    def unclassified_budget(self, kind: str) -> BudgetRule:
        return self.unclassified.get(kind) or BudgetRule(**UNCLASSIFIED_BUDGET)


@dataclass(frozen=True, slots=True)
class ConfigModels:
    """The configuration's models, assembled from one set of parts."""

    parts: ConfigParts
    config: type[ConfigBase]  # ``Config``
    default_budgets: Mapping[str, Mapping[str, Any]]  # kind (and unclassified) -> budget
    # Tags pydantic puts in error locations, which are not keys the user wrote.
    union_tags: frozenset[str]


class UndeclaredSource(Strict):
    """The member of ``sources:`` for a type the config being read declares nowhere: its tag
    stays, so every message is the one of the whole union, and its settings model is not
    imported (the registry's alone cost ~0.03 s of CPU; issue 29).  Validating never reaches
    it: each item is validated as the member of its own ``type``, which is declared."""


def assemble(parts: ConfigParts, types: frozenset[str] | None = None) -> ConfigModels:
    """``Config`` for ``parts``: ``sources`` a union of the source types' settings by
    ``type``, ``surfaces`` a union of one model per kind by ``kind`` (``{Kind}Surface``:
    SurfaceSettings with ``kind: <name>`` and the kind's ``match``), the per-kind keys keyed
    by the kinds, ``egress_canary`` the canary's settings.  With ``types``, only those source
    types' settings are in the union (the others :class:`UndeclaredSource`): the model of a
    config that declares no other."""
    surfaces: dict[str, type[SurfaceSettings]] = {}
    for name, kind in parts.kinds.items():
        tag = Literal[name]  # type: ignore[valid-type]
        model = create_model(  # type: ignore[call-overload]
            kind.model_name,
            __base__=SurfaceSettings,
            __module__=__name__,
            __doc__=f"A surface of kind {name}: {kind.summary}.",
            kind=(tag, name) if name == DEFAULT_KIND else (tag, ...),
            match=(kind.match, kind.match()),
        )
        model.default_budget = kind.budget
        surfaces[name] = model
    kind_key = Literal[tuple(parts.kinds)]  # type: ignore[valid-type]
    source_models = {
        name: t.config if types is None or name in types else UndeclaredSource
        for name, t in parts.source_types.items()
    }
    config = create_model(  # type: ignore[call-overload]
        "Config",
        __base__=ConfigBase,
        __module__=__name__,
        __doc__=None,
        sources=(
            list[_tagged_union(source_models, "type", "auto")],  # type: ignore[misc]
            Field(default_factory=_default_sources, validate_default=True),
        ),
        surfaces=(list[_tagged_union(surfaces, "kind", DEFAULT_KIND)], []),  # type: ignore[misc]
        unclassified=(dict[kind_key, BudgetRule], {}),  # type: ignore[valid-type]
        aggregates=(dict[kind_key, AggregateRule], {}),  # type: ignore[valid-type]
        egress_canary=(parts.egress_canary | None, None),
    )
    config.parts = parts
    return ConfigModels(
        parts=parts,
        config=config,
        default_budgets={
            **{name: kind.budget for name, kind in parts.kinds.items()},
            UNCLASSIFIED: UNCLASSIFIED_BUDGET,
        },
        union_tags=frozenset(
            {*parts.kinds, *parts.source_types, *parts.nested_tags, *DESTINATION_TYPES}
        ),
    )


# The models assembled so far: ``Config`` (key None, every source type) and one for each set
# of source types a config read declared.  One class per key per process, whichever thread
# asks first.  Reentrant: a part that asked for the models while being imported gets an
# ImportError naming it, not a hang.
_models: dict[frozenset[str] | None, ConfigModels] = {}
_assembling = threading.RLock()


def _assembled(types: frozenset[str] | None = None) -> ConfigModels:
    """The models of the parts the composition root names (with the settings of ``types``
    only, or of every source type), assembled on first use."""
    with _assembling:
        from alarm.assembly import PARTS  # the composition root; it imports no alarm.config

        if types is not None:
            types = types.intersection(PARTS.source_types)  # an unknown type is in no union
        models = _models.get(types)
        if models is None:
            models = _models[types] = assemble(PARTS, types)
        return models


def _declared_types(data: dict[str, Any]) -> frozenset[str] | None:
    """The source types ``data`` declares, read as the ``sources:`` union picks each item's
    member (None, every type, where ``sources`` is not a list)."""
    if "sources" not in data:
        return frozenset(str(item.get("type", "auto")) for item in _default_sources())
    sources = data["sources"]
    if not isinstance(sources, list):
        return None
    tag = _tag("type", "auto")
    return frozenset(tag(item) for item in sources)


# The names that exist once assembled: ``from alarm.config import Config`` assembles.
_ASSEMBLED_NAMES = {"Config": "config", "DEFAULT_BUDGETS": "default_budgets"}


def __getattr__(name: str) -> Any:
    field_name = _ASSEMBLED_NAMES.get(name)
    if field_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_assembled(), field_name)


if TYPE_CHECKING:
    Config = ConfigBase
    DEFAULT_BUDGETS: Mapping[str, Mapping[str, Any]]


def _selected(match: Any) -> list[Any]:
    """The sources a surface's ``match.source`` selects (a kind whose match has no ``source``
    selects none by name)."""
    return list(getattr(match, "source", []))


def _duplicate_names(label: str, names: list[Any]) -> list[str]:
    seen: set[Any] = set()
    problems: list[str] = []
    for n in names:
        line = f"{label}: name {n!r} is declared twice"
        if n in seen and line not in problems:
            problems.append(line)
        seen.add(n)
    return problems


def _source_references(kinds: dict[str, str], surfaces: list[tuple[str, list[Any]]]) -> list[str]:
    """``match.source`` of each surface, given as (kind, source names), against the sources
    declared (name -> the kind of surface each feeds)."""
    problems = []
    for i, (kind, names) in enumerate(surfaces):
        for name in names:
            if name not in kinds:
                problems.append(f"surfaces[{i}].match.source: no source named {name!r} is declared")
            elif kinds[name] != kind:
                problems.append(
                    f"surfaces[{i}].match.source: source {name!r} feeds {kinds[name]} "
                    f"surfaces, not {kind}"
                )
    return problems


def _filter_kinds(parts: ConfigParts, filters: list[list[Any]]) -> list[str]:
    """A destination filter's ``kinds`` are registered kinds or source/service: a misspelt
    one would match no alert, and the destination would silently get nothing."""
    known = (*parts.kinds, *TARGET_KINDS)
    return [
        f"notifications.destinations[{i}].filter.kinds: {kind!r} is not a kind ({', '.join(known)})"
        for i, kinds in enumerate(filters)
        for kind in kinds
        if isinstance(kind, str) and kind not in known
    ]


def _canary_references(kinds: dict[str, str], names: list[Any]) -> list[str]:
    return [
        f"egress_canary.sources: {name!r} is not a declared kernel source"
        for name in names
        if kinds.get(name) != "egress"
    ]


def _cross_problems(parts: ConfigParts, data: dict[str, Any]) -> list[str]:
    """The whole-config checks, on the raw data as far as it can be read: what they find is
    reported together with the field errors, not only once those are fixed."""

    def items(key: str, default: list[Any]) -> list[dict[str, Any]]:
        value = data.get(key, default)  # an item that is not a mapping keeps its index
        return [x if isinstance(x, dict) else {} for x in value] if isinstance(value, list) else []

    def names(values: Any) -> list[Any]:
        if not isinstance(values, list):
            return []
        return [v for v in values if isinstance(v, str)]

    def text(item: dict[str, Any], key: str, default: str) -> str:
        value = item.get(key, default)
        return value if isinstance(value, str) else ""  # "": not a known type or kind

    sources = items("sources", [{"name": "kernel"}])
    surfaces = items("surfaces", [])
    notifications = data.get("notifications")
    destinations = notifications.get("destinations") if isinstance(notifications, dict) else []
    filters = [
        (d.get("filter") or {}) if isinstance(d, dict) else {}
        for d in (destinations if isinstance(destinations, list) else [])
    ]
    filter_kinds = [f.get("kinds", []) if isinstance(f, dict) else [] for f in filters]
    problems = _duplicate_names("surfaces", names([s.get("name") for s in surfaces]))
    problems += _duplicate_names("sources", names([s.get("name") for s in sources]))
    problems += _filter_kinds(
        parts, [[k] if isinstance(k, str) else names(k) for k in filter_kinds]
    )
    types, known_kinds = parts.source_types, parts.kinds
    kinds = {
        s["name"]: types[text(s, "type", "auto")].kind
        for s in sources
        if isinstance(s.get("name"), str) and text(s, "type", "auto") in types
    }
    if all(text(s, "type", "auto") in types for s in sources):
        # every source's kind is known, so a reference to one can be judged
        refs = []
        for s in surfaces:
            match = s.get("match")
            kind = text(s, "kind", DEFAULT_KIND)
            ok = isinstance(match, dict) and kind in known_kinds
            ok = ok and "source" in known_kinds[kind].match.model_fields
            refs.append((kind, names(match.get("source")) if ok else []))  # type: ignore[union-attr]
        problems += _source_references(kinds, refs)
        canary = data.get("egress_canary")
        if isinstance(canary, dict):
            problems += _canary_references(kinds, names(canary.get("sources")))
    return problems


def config_from_dict(data: Any) -> ConfigBase:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["(top level): expected a mapping of keys to values"])
    models = _assembled(_declared_types(data))
    try:
        return models.config.model_validate(data)
    except ValidationError as exc:
        tags = models.union_tags
        problems = [_match_hint(models.parts, p, data) for p in problems_of(exc, tags)]
    problems += [p for p in _cross_problems(models.parts, data) if p not in problems]
    raise ConfigError(problems)


def _types_feeding(parts: ConfigParts, kind: str) -> str:
    types = sorted(name for name, t in parts.source_types.items() if t.kind == kind)
    if not types:  # a kind fed only by collectors given to the service, not by config
        return "no source type of the config feeds it"
    return f"declare a source of type {' or '.join(types)}"


def config_warnings(config: ConfigBase) -> list[str]:
    """What is valid but almost certainly not meant: a config that watches nothing, or a
    surface no source feeds.  ``check-config`` says these and still exits 0."""
    if not config.sources:
        return ["sources: none declared, so this config watches nothing (no writes are counted)"]
    fed = {config.parts.source_types[s.type].kind for s in config.sources}
    return [
        f"surfaces[{i}] ({s.name!r}): no source feeds {s.kind} surfaces, so it watches nothing "
        f"({_types_feeding(config.parts, s.kind)})"
        for i, s in enumerate(config.surfaces)
        if s.kind not in fed
    ]


def _match_hint(parts: ConfigParts, problem: str, data: dict[str, Any]) -> str:
    """'surfaces[2].match.dst: Extra inputs are not permitted' on an fs surface says which
    fields fs surfaces match on instead."""
    where, _, msg = problem.partition(": ")
    head, sep, key = where.rpartition(".match.")
    if not sep or msg != "Extra inputs are not permitted" or not head.startswith("surfaces["):
        return problem
    try:
        kind = data["surfaces"][int(head[len("surfaces[") : -1])].get("kind", DEFAULT_KIND)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
        return problem
    if not isinstance(kind, str) or kind not in parts.kinds:
        return problem
    fields = ", ".join(parts.kinds[kind].match.model_fields)
    return f"{where}: {key!r} is not a match field of {kind} surfaces (they match on {fields})"


def load_config(path: str | Path | None) -> ConfigBase:
    """Load FILE, or the embedded default when path is None."""
    if path is None:
        text = resources.files("alarm").joinpath("default.yaml").read_text()
        source = "embedded default"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError([f"(file): cannot read {path}: {exc.strerror}"]) from None
        except UnicodeDecodeError:
            raise ConfigError([f"(file): {path} is not UTF-8 text"]) from None
        source = str(path)
    try:
        data = load_yaml(text, source)
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())
        raise ConfigError([f"(yaml): {source} is not valid YAML: {first}"]) from None
    return config_from_dict(data)
