"""``type: file``: fence records from text kernel logs, followed like ``tail -F`` (file.py,
tail.py).  The registration: imported without the tailer."""

from __future__ import annotations

from alarm.collectors.base import SourceType

COUNTERS = {
    "truncations": "Followed files truncated in place (copytruncate).",
    "rotations": "Followed files rotated by rename.",
    "oversized_lines": "Lines longer than the line limit, skipped.",
    "truncation_possible_loss": "Truncations that may have hidden unread lines.",
    "files_not_followed": "Matching files left unfollowed (too many open).",
    "resume_file_missing": "Saved file positions whose file is gone.",
    "position_invalid": "Saved positions that could not be used.",
    "parser_exceptions": "Lines the parser failed on unexpectedly.",
}
SOURCE = SourceType(
    "file",
    "alarm.collectors.kernel.settings:FileSettings",
    "alarm.collectors.kernel.file:build",
    kind="egress",
    counters=COUNTERS,
)
