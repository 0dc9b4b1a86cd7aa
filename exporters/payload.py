"""What a notification says: one document per alert change, shared by every destination.

The summary is written for the person who is paged: which surface, what rose, by how much,
against which baseline and budget, since when.  The Lampson figures (the bound in bit/s and
the bits carried over budget) and the top contributors follow; contributors are
workload-controlled text, so they are sanitised (no control characters, bounded length).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from alarm.detector.rules import rules_that
from alarm.sanitize import sanitize
from alarm.surfaces import MAX_CONTRIBUTOR_CHARS, bounded_receipt
from exporters.routing import target_of

# The rules whose pages lead with the surface's rate against its threshold (Rule.RATE_PAGE).
RATE_PAGES = rules_that("RATE_PAGE")

# A forged record's sample line as shown: about one fence line (prefix, interfaces, MACs,
# addresses, ports), never a page of workload text.
MAX_SAMPLE_CHARS = 300


@dataclass(slots=True)
class LinkSet:
    status_page: str  # the service's status page (external URL)
    runbook: str | None  # template with {rule}, {target}, {kind}

    def for_change(self, change: dict[str, Any]) -> dict[str, str | None]:
        base = self.status_page.rstrip("/")
        runbook = None
        if self.runbook:
            runbook = self.runbook.format(
                rule=change.get("rule", ""), target=target_of(change), kind=change.get("kind", "")
            )
        return {
            "status_page": base + "/",
            "alerts": base + "/api/v1/alerts",
            "surfaces": base + "/api/v1/surfaces",
            "runbook": runbook,
        }


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} GB"


# The fields of a receipt an operator re-checks without trusting capalarm: the file's
# device:inode and the sha256 of its first bytes (fs), the artifact's digest (registries),
# the socket owner's UID the egress fence logged (``log flags skuid``) and the log prefix of a
# workload's own fence rule (``socket cgroupv2``).
HANDLE_FIELDS = ("dev_ino", "size", "sha256", "sha256_bytes", "digest", "uid", "prefix")


def handles(receipt: Any) -> dict[str, Any]:
    """A receipt's re-checkable handles, bounded and sanitised like the receipt kept
    (alarm/surfaces.py); {} for a receipt without any."""
    if not isinstance(receipt, dict):
        return {}
    kept = bounded_receipt(receipt)
    return {k: kept[k] for k in HANDLE_FIELDS if kept.get(k) is not None}


def handle_text(h: dict[str, Any]) -> str:
    """One line of handles for destinations that take text: 'dev:ino 2049:1234, sha256 ab..
    of the first 4096 B, digest sha256:..'."""
    parts = []
    if "dev_ino" in h:
        parts.append(f"dev:ino {h['dev_ino']}")
    if "sha256" in h:
        first = f" of the first {h['sha256_bytes']} B" if "sha256_bytes" in h else ""
        parts.append(f"sha256 {h['sha256']}{first}")
    if "digest" in h:
        parts.append(f"digest {h['digest']}")
    if "uid" in h:
        parts.append(f"uid {h['uid']}")
    if "prefix" in h:
        parts.append(f"fence rule {h['prefix']}")
    return ", ".join(parts)


def contributors(change: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """The top contributors with their receipts' handles.  Names are cut where the surface
    table cuts them (MAX_CONTRIBUTOR_CHARS, marked with an ellipsis), not shorter: a path cut
    at another length than the API's cannot be matched to it, or found on disk."""
    out = []
    for item in change.get("contributors", [])[:limit]:
        entry: dict[str, Any] = {
            "contributor": sanitize(str(item["contributor"]), MAX_CONTRIBUTOR_CHARS + 1),
            "bytes": int(item["bytes"]),
        }
        h = handles(item.get("receipt"))
        if h:
            entry["receipt"] = h
        out.append(entry)
    return out


def forged_sample(change: dict[str, Any]) -> str | None:
    """A forged-records alert's sample line (alarm/pipeline.py), sanitised again: it is
    text a workload wrote."""
    sample = (change.get("figures") or {}).get("forged_sample")
    return sanitize(str(sample), MAX_SAMPLE_CHARS) if sample else None


def figure(figures: dict[str, Any], key: str) -> float | None:
    """A figure as a number; None where the change has none (alert documents write a
    figure that is not a finite number as null)."""
    value = figures.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def shown_threshold(change: dict[str, Any]) -> float:
    """The threshold (B/s) to show beside a write rate: a spike's own, the one its rate passed
    (the absolute floor while the surface learns); otherwise the spike rule's, since a budget
    alert's threshold is in bits."""
    f = change.get("figures") or {}
    own = figure(change, "threshold") if change.get("rule") == "spike" else None
    return own or figure(f, "threshold_bytes_per_second") or 0.0


def lampson(change: dict[str, Any]) -> dict[str, float | None] | None:
    f = change.get("figures") or {}
    if "capacity_bits_per_second" not in f:
        return None
    return {
        "capacity_bits_per_second": figure(f, "capacity_bits_per_second") or 0.0,
        "bits_over_budget": figure(f, "budget_excess_bits") or 0.0,
        "allowance_bits_per_second": figure(f, "budget_allowance_bits_per_second"),
        "tolerance_bits": figure(f, "budget_tolerance_bits"),
    }


def headline(change: dict[str, Any]) -> str:
    """'FIRING spike: egress surface registry-proxy' — short, for titles."""
    state = str(change.get("state", "")).upper()
    kind = change.get("kind", "")
    where = f"{kind} surface" if "surface" in change else str(kind)
    return f"{state} {change.get('rule')}: {where} {sanitize(target_of(change), 64)}"


def summary(change: dict[str, Any], now: float | None = None) -> str:
    """The sentence a person can act on."""
    now = time.time() if now is None else now
    f = change.get("figures") or {}
    target = sanitize(target_of(change), 64)
    rule = change.get("rule")
    state = change.get("state")
    started = float(change.get("started_at") or change.get("at") or now)
    since = f"since {_clock(started)}"
    if "surface" in change and "rate_bytes_per_second" in f and rule in RATE_PAGES:
        rate = figure(f, "rate_bytes_per_second") or 0.0
        base = figure(f, "baseline_bytes_per_second") or 0.0
        thr = shown_threshold(change)
        cap = figure(f, "capacity_bits_per_second") or 0.0
        excess = figure(f, "budget_excess_bits") or 0.0
        allow = figure(f, "budget_allowance_bits_per_second") or 0.0
        tol = figure(f, "budget_tolerance_bits") or 0.0
        ratio = f"x{rate / base:,.1f}" if base > 0 else "from a zero baseline"
        who = f"{change.get('kind')} surface {target}"
        if rule == "spike":
            what = (
                f"write rate rose to {rate:,.0f} B/s, {ratio} its baseline of {base:,.0f} B/s "
                f"(threshold {thr:,.0f} B/s); capacity bound {cap:,.0f} bit/s against a budget "
                f"of {allow:,.0f} bit/s, {excess:,.0f} bits over budget"
            )
        else:
            what = (
                f"carried {excess:,.0f} bits over its capacity budget of {allow:,.0f} bit/s "
                f"(tolerance {tol:,.0f} bits); capacity bound now {cap:,.0f} bit/s, write rate "
                f"{rate:,.0f} B/s against a baseline of {base:,.0f} B/s"
            )
        text = f"{who}: {what}; {since}"
    else:
        # Every other rule (beacon, duty, drop, drift, dormant, newsurface, members, and the
        # source rules) in the detector's own words for what it saw, as the backtest and the
        # log say it: a beacon is not "0 bits over its capacity budget".
        text = f"{sanitize(str(change.get('summary', '')), 400)}; {since}"
    if state == "resolved":
        at = float(change.get("at") or now)
        text = f"RESOLVED after {duration(at - started)} — {text}"
    return text


def alert_document(
    note: dict[str, Any], idem_key: str, links: LinkSet, top: int, now: float | None = None
) -> dict[str, Any]:
    """The generic JSON document (the webhook's ``data``; details elsewhere)."""
    change = note["change"]
    state = change.get("state")
    at = float(change.get("at", 0.0))
    return {
        "id": idem_key,
        "fingerprint": change.get("fingerprint"),
        "status": state,
        "repeat": note.get("event") == "repeat",
        "escalated": note.get("event") == "escalated",
        "severity": note.get("severity"),
        "target_type": next((k for k in ("surface", "source", "service") if k in change), ""),
        "target": sanitize(target_of(change), 64),
        "kind": change.get("kind"),
        "rule": change.get("rule"),
        "title": headline(change),
        "summary": summary(change, now),
        "started_at": iso(float(change.get("started_at") or at)),
        "changed_at": iso(at),
        "resolved_at": iso(at) if state == "resolved" else None,
        "value": change.get("value"),
        "threshold": change.get("threshold"),
        "lampson": lampson(change),
        "figures": change.get("figures") or {},
        "top_contributors": contributors(change, top),
        "forged_sample": forged_sample(change),
        "detector_summary": sanitize(str(change.get("summary", "")), 1000),
        "links": links.for_change(change),
    }
