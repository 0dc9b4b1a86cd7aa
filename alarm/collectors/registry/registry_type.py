"""``type: registry``: package registries, container registries, wikis and boards, polled
(source.py builds the poller and the ``api``'s adapter).  The registration: imported without
the poller, the HTTP client (aiohttp, ssl) or the settings' models."""

from __future__ import annotations

from types import MappingProxyType

from alarm.collectors.base import SourceType

# The tags pydantic puts in error locations after ``registry``: the ``api`` of each settings
# model of the union in settings.py (not keys the user wrote).
API_TAGS: tuple[str, ...] = (
    "pypi",
    "npm",
    "oci",
    "docker",
    "artifactory",
    "nexus",
    "mediawiki",
    "json",
)

# Counters kept by the HTTP client (http.py).
HTTP_COUNTERS: dict[str, str] = {
    "http_errors": "Requests that failed: connection errors and error statuses (each attempt).",
    "timeouts": "Request attempts cut off by the per-request timeout (slow or hung servers).",
    "rate_limited": "429 Too Many Requests answers.",
    "retries": "Request attempts retried after a failure.",
    "oversized_responses": "Bodies over max_response_bytes, abandoned unread.",
    "garbage_responses": "Bodies that were not what the API documents (bad JSON, wrong shape).",
    "credentials_withheld": "Redirects to another origin, followed without the credentials.",
    "redirects_refused": "Redirects to an origin allow_redirect_hosts does not allow (failed polls).",
    "tokens_fetched": "Bearer tokens fetched from an OCI registry's token realm (token auth).",
    "poll_bytes_exceeded": "Polls that would have held more of response bodies than max_poll_bytes (failed polls).",
    "not_modified": "304 Not Modified answers to conditional requests: nothing new, nothing read.",
    "urls_too_long": "URLs over max_url_bytes (paging links, tokens, redirects) not requested (failed polls).",
}

# Counters kept by the poller (poller.py).
POLL_COUNTERS: dict[str, str] = {
    "polls": "Complete polls.",
    "poll_errors": "Polls that failed (the registry down, hung, lying or over a limit).",
    "baseline_artifacts": "Artifacts present at the first poll: the starting state, not counted.",
    "duplicate_items": "Items listed more than once in one poll, counted once.",
    "listing_shrinks": "Listings that suddenly lost most of what they had: kept, not forgotten.",
    "listing_truncated": "Listings longer than max_items: the poll failed rather than trust them.",
    "cursor_regressions": "Change feeds whose cursor went backwards: re-learned, not counted.",
    "stale_items": "Feed items at or before the saved cursor, skipped (repeats).",
    "sizes_unknown": "Artifacts whose size the API did not give and HEAD could not learn.",
    "groups_forgotten": "Packages, images or pages no longer listed, dropped from the index.",
    "ledger_rows_invalid": "Saved listing rows that could not be read: re-learned.",
    "pages_unchanged": "Pages read again byte for byte as last time (no validator from the server): not parsed again.",
    "pages_over_limit": "Paged listings with more than max_pages pages in one poll (failed polls).",
    "items_reappeared": "Artifacts back in a listing unchanged after dropping out of it (a lagging replica, a flapping cache): counted once, not again.",
}

# Counters kept by the canary (canary.py).
CANARY_COUNTERS: dict[str, str] = {
    "canary_uploaded": "Canary artifacts uploaded (proof of sight; never counted as writes).",
    "canary_seen": "Canaries of this process listed by a poll: set apart, not counted as writes.",
    "canary_missed": "Canaries no poll listed within canary.deadline: the source was blind.",
    "canary_upload_errors": "Canary uploads that failed (refused, unreachable, timed out).",
}

# Counters kept by the json adapter (generic.py).
JSON_COUNTERS: dict[str, str] = {
    "items_edited": "Listed items whose revision or update time changed: each counted as a write of its new size.",
    "items_deleted_unseen": "Items made and gone between two polls (gaps in the sequence, or the created count ahead of what was listed): counted as writes of unknown size.",
    "items_gone": "Items a poll no longer listed (deleted, hidden, or off a listing of the newest): counted, not metered.",
    "sequence_unreadable": "Items whose sequence number was missing or not a whole number in range: listed and counted, their number ignored.",
    "sequence_jumps": "Sequences or created counts that leapt by more than max_items in one poll: metered as max_items.",
}

SOURCE = SourceType(
    "registry",
    "alarm.collectors.registry.settings:RegistrySettings",
    "alarm.collectors.registry.source:build",
    kind="registry",
    counters=MappingProxyType(
        {**HTTP_COUNTERS, **POLL_COUNTERS, **CANARY_COUNTERS, **JSON_COUNTERS}
    ),
    nested_tags=frozenset(API_TAGS),
)
