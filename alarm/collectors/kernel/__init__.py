"""The kernel family: egress fence records from /dev/kmsg, journald or text logs.

Everything that knows what a kernel record or a netfilter LOG line looks like is in this
folder; what leaves it is write events (fence.py)."""

from alarm.collectors.kernel import auto, file, journald, kmsg

SOURCES = (auto.SOURCE, kmsg.SOURCE, journald.SOURCE, file.SOURCE)
