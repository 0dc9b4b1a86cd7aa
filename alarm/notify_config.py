"""Configuration of notifications: destinations, filters, repeat, flap damping, silences, outbox.

Part of the one configuration (``alarm.config.Config.notifications``), so validation errors name
the full key path (``notifications.destinations[0].url: ...``); the exporters that deliver
notifications read it, and nothing here imports them.

Secrets (signing keys, PagerDuty routing keys, Slack webhook URLs) are never written in the
config itself: they are read from an environment variable or a file when the destinations are
built (at start and on SIGHUP), and are held as ``SecretStr`` so they never reach a log line or
a repr.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from alarm.settings import Duration, Strict

Severity = Literal["critical", "error", "warning", "info"]
SEVERITY_ORDER: tuple[str, ...] = ("info", "warning", "error", "critical")

# What each rule that is not a surface rule means for whoever is paged: a forged record is
# someone hiding traffic, a lost one a blind spot.  The surface rules' defaults are their
# own (alarm/detector/rules/: each rule's SEVERITY), passed in by the caller.
DEFAULT_SEVERITIES: dict[str, str] = {
    "records_lost": "error",
    "forged_records": "critical",
    "source_down": "error",
    # The source runs but cannot see (a canary missed, a tree gone, a poll too old).
    "surface_blind": "error",
    "outbox_write_failed": "critical",
    "state_save_failed": "critical",
}


class SecretSource(Strict):
    """Where a secret comes from: ``{env: NAME}`` or ``{file: /path}``.

    A file may hold several secrets, one per line (signing keys during a rotation)."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretSource:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        return self

    def where(self) -> str:
        return f"env {self.env}" if self.env is not None else f"file {self.file}"

    def read_all(self) -> list[SecretStr]:
        """Every non-empty line.  Raises ValueError naming where — never the value."""
        if self.env is not None:
            text = os.environ.get(self.env)
            if text is None:
                raise ValueError(f"secret from env {self.env}: the variable is not set")
        else:
            try:
                text = Path(str(self.file)).read_text()
            except OSError as exc:
                raise ValueError(f"secret from file {self.file}: {exc.strerror}") from None
        values = [line.strip() for line in text.splitlines() if line.strip()]
        if not values:
            raise ValueError(f"secret from {self.where()} is empty")
        return [SecretStr(v) for v in values]

    def read_one(self) -> SecretStr:
        return self.read_all()[0]


def _as_list(value: Any) -> Any:
    if isinstance(value, str):
        value = [value]
    return [str(v) for v in value] if isinstance(value, list) else value


Names = Annotated[list[str], BeforeValidator(_as_list)]
# The kinds of alerts that are not about a surface (a filter's ``kinds`` takes them too).
TARGET_KINDS = ("source", "service")


class Filter(Strict):
    """Which alerts a destination gets.  Every list given must match (AND); each list is any-of.

    ``targets`` are surface or source names, with shell-style wildcards (``registry-*``);
    ``kinds`` are surface kinds (alarm/kinds/: egress, fs, registry) or ``source`` /
    ``service`` (alarm/config.py checks them against the kinds registered);
    ``min_severity`` passes that severity and everything above it."""

    targets: Names = []
    kinds: Names = []
    rules: Names = []
    severities: list[Severity] = []
    min_severity: Severity | None = None


class _Destination(Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")
    filter: Filter = Filter()
    timeout: Duration = 10.0
    # Re-notify an alert that stays firing this often (0: once per state change only).
    repeat_interval: Duration = 0.0
    # Parallel requests; order is still kept per alert (one in flight per alert at a time).
    concurrency: int = Field(8, ge=1, le=256)
    # Give up (dead-letter) after this many attempts; None: retry until the outbox max_age.
    max_attempts: int | None = Field(None, ge=1)


class WebhookDestination(_Destination):
    """Generic JSON webhook, signed per the Standard Webhooks spec when secrets are given."""

    type: Literal["webhook"] = "webhook"
    url: str = Field(pattern=r"^https?://")
    # Several secrets sign every message (one signature each), so a receiver can rotate.
    secrets: list[SecretSource] = []
    headers: dict[str, str] = {}
    # "standard": {type, timestamp, data: the alert document}.  "change": the detector's
    # change record as-is — the v1 body that the ``webhooks:`` shorthand has always sent.
    body: Literal["standard", "change"] = "standard"


class AlertmanagerDestination(_Destination):
    """Alertmanager's API v2.  Every URL (each peer of an HA cluster) gets every alert."""

    type: Literal["alertmanager"] = "alertmanager"
    urls: list[Annotated[str, Field(pattern=r"^https?://")]] = Field(min_length=1)
    repeat_interval: Duration = 60.0  # firing alerts are re-sent so that they never expire
    extra_labels: dict[str, str] = {}

    @field_validator("repeat_interval")
    @classmethod
    def _must_resend(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(
                "Alertmanager expires alerts that are not re-sent: give a positive interval"
            )
        return value


class PagerDutyDestination(_Destination):
    """PagerDuty Events API v2 (trigger/resolve with a stable dedup_key per alert)."""

    type: Literal["pagerduty"] = "pagerduty"
    url: str = Field("https://events.pagerduty.com/v2/enqueue", pattern=r"^https?://")
    routing_key: SecretSource
    source: str = "capalarm"  # payload.source: the system having the problem


class SlackDestination(_Destination):
    """Slack incoming webhook.  Its URL carries the token, so it is a secret too."""

    type: Literal["slack"] = "slack"
    url: SecretSource
    concurrency: int = Field(1, ge=1, le=16)  # Slack allows about one message per second


Destination = Annotated[
    WebhookDestination | AlertmanagerDestination | PagerDutyDestination | SlackDestination,
    Field(discriminator="type"),
]
# The tags pydantic puts in the error locations of a destination (not keys a user wrote).
DESTINATION_TYPES = frozenset(
    d.model_fields["type"].default
    for d in (WebhookDestination, AlertmanagerDestination, PagerDutyDestination, SlackDestination)
)


def _timestamp(value: Any) -> float:
    """ISO 8601 (a 'Z' or offset; naive means UTC) or unix seconds -> unix seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a time like 2026-07-01T00:00:00Z")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is not a time like 2026-07-01T00:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


Timestamp = Annotated[float, BeforeValidator(_timestamp)]


class Silence(Strict):
    """Mute matching alerts between ``starts`` and ``ends``.  A page that was already opened is
    still closed: resolves of alerts whose firing was delivered are never silenced."""

    match: Filter
    starts: Timestamp = 0.0
    ends: Timestamp
    comment: str = ""

    @model_validator(mode="after")
    def _window(self) -> Silence:
        if self.ends <= self.starts:
            raise ValueError("'ends' must be after 'starts'")
        return self


class FlapDamping(Strict):
    """An alert that changes state more than ``max_changes`` times within ``window`` is
    flapping: further changes are held back until it has been stable for ``settle``, then its
    state at that moment is sent (if it differs from what was last sent).

    ``reopen_window`` (0: off): a resolve is sent only once the alert has stayed resolved this
    long; if it fires again within it, that is the same incident — the page stays open, no
    second page — and its start stays the first firing's.  Prometheus' ``keep_firing_for``
    (alerting rules, since 2.42) does the same on the rule side.  Independent of ``enabled``.
    On by default (10 minutes, longer than every spike and budget resolve hold): the count of
    pages is the count of incidents, at the price of resolves that arrive that much later."""

    enabled: bool = True
    window: Duration = 600.0
    max_changes: int = Field(4, ge=2)
    settle: Duration = 300.0
    reopen_window: Duration = 600.0


class OutboxConfig(Strict):
    """Retries: exponential backoff with jitter, from ``base_backoff`` up to ``max_backoff``,
    until a notification is ``max_age`` old; then it goes to the dead-letter table."""

    base_backoff: Duration = 1.0
    max_backoff: Duration = 300.0
    max_age: Duration = 86400.0
    # Delivered rows are deleted; dead letters are kept this long, for the API and metrics.
    dead_letter_retention: Duration = 30 * 86400.0

    @model_validator(mode="after")
    def _order(self) -> OutboxConfig:
        if not 0 < self.base_backoff <= self.max_backoff:
            raise ValueError("need 0 < base_backoff <= max_backoff")
        if self.max_age <= 0:
            raise ValueError("max_age must be positive")
        return self


class Links(Strict):
    """Links in every notification.  ``external_url``: where people reach this service's status
    page (default: the http listen address).  ``runbook`` may use {rule}, {target}, {kind}."""

    external_url: str | None = Field(None, pattern=r"^https?://")
    runbook: str | None = None

    @field_validator("runbook")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                value.format(rule="r", target="t", kind="k")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"only {{rule}}, {{target}}, {{kind}} may be used: {exc}"
                ) from None
        return value


class NotificationsConfig(Strict):
    destinations: list[Destination] = []
    severities: dict[str, Severity] = {}  # per rule; merged over DEFAULT_SEVERITIES
    flap: FlapDamping = FlapDamping()
    silences: list[Silence] = []
    outbox: OutboxConfig = OutboxConfig()
    links: Links = Links()
    top_contributors: int = Field(5, ge=0, le=50)

    @model_validator(mode="after")
    def _unique(self) -> NotificationsConfig:
        seen: set[str] = set()
        for d in self.destinations:
            if d.name in seen:
                raise ValueError(f"destinations: name {d.name!r} is declared twice")
            seen.add(d.name)
        return self

    def severity(self, rule: str, rule_default: str | None = None) -> str:
        """``rule``'s severity: as configured, else the rule's own default (a surface
        rule's SEVERITY), else DEFAULT_SEVERITIES', else warning."""
        return self.severities.get(rule) or rule_default or DEFAULT_SEVERITIES.get(rule, "warning")
