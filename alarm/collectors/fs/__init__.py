"""The fs family: every byte written into declared directory trees (shared scratch volumes,
package caches, a registry proxy's storage), watched with fanotify, inotify or polling.

Everything that knows about file-system events, scans and the tracked snapshot is in this
folder; what leaves it is write events of kind ``fs`` (docs/fs-source.md).  The source type
is registered by fs_type.py, which imports no engine (base.py)."""

from alarm.collectors.fs import fs_type

SOURCES = (fs_type.SOURCE,)
