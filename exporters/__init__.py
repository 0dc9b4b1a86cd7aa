"""Everything that leaves the process: metrics exposition, status API, notifications."""
