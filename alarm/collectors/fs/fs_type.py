"""``type: fs``: every byte written into declared directory trees (source.py, engine.py).
The registration: imported without the engine (inotify, fanotify, the scans)."""

from __future__ import annotations

from alarm.collectors.base import SourceType

COUNTERS: dict[str, str] = {
    "queue_overflows": "Watcher queues that overflowed (IN_Q_OVERFLOW, FAN_Q_OVERFLOW): repaired by a reconcile scan.",
    "watch_limit_errors": "Directories that could not be watched (inotify ENOSPC): polled instead.",
    "poll_fallback_dirs": "Directories put in poll mode for lack of watches.",
    "mode_switches": "Trees switched from inotify to fanotify when they ran out of inotify watches.",
    "permission_errors": "Directories or entries that could not be listed, watched or measured (EACCES).",
    "watch_errors": "Other failures to watch a directory.",
    "scan_errors": "Other failures to list or measure an entry.",
    "watch_lost": "Watches that went away while their directory stayed (unmount, a reader that died): re-watched and rescanned.",
    "tree_missing": "Watched trees that were missing, replaced or not a directory.",
    "canary_missed": "Canaries the watcher did not report within the deadline.",
    "canary_unwritable": "Canary rounds in which a tree could not be written (blind there until it can).",
    "deleted_before_measured": "Entries deleted before they could be measured (counted as last known, flagged).",
    "files_created": "Files created or moved into a tree, counted.",
    "dirs_created": "Directories created or moved into a tree.",
    "growths": "Files that grew.",
    "rewrites": "Files rewritten in place (their new size counted as capacity).",
    "truncations": "Files truncated (never counted negative).",
    "hard_links": "Hard links made to a file already counted (counted once).",
    "inodes_reused": "Files found on the inode number of a file deleted unseen (born after it): counted as new files.",
    "scan_entries": "Entries looked at by scans (baseline, reconcile, poll, new directories).",
    "scans_completed": "Scans completed.",
    "unresolved_events": "fanotify events whose directory could no longer be resolved (deleted meanwhile).",
    "receipts_hashed": "Writes given a sha256 receipt.",
    "receipts_skipped": "Writes left without a sha256 receipt by the per-tick budget.",
    "ledger_rows_invalid": "Saved ledger rows that could not be read (dropped).",
    "position_invalid": "Saved positions that could not be used (the trees start from a baseline).",
    "mounts_changed": "File systems mounted or unmounted inside a tree (the path is looked at again).",
    "devices_renumbered": "Trees found on a new device number after a restart (the snapshot was carried over).",
}
SOURCE = SourceType(
    "fs",
    "alarm.collectors.fs.settings:FsSettings",
    "alarm.collectors.fs.source:build",
    kind="fs",
    counters=COUNTERS,
)
