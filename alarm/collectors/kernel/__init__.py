"""The kernel family: egress fence records from /dev/kmsg, journald or text logs.

Everything that knows what a kernel record or a netfilter LOG line looks like is in this
folder; what leaves it is write events (fence.py).  Each source type is registered by its
``*_type.py``, which imports neither its reader nor asyncio (base.py)."""

from alarm.collectors.kernel import auto_type, file_type, journald_type, kmsg_type

SOURCES = (auto_type.SOURCE, kmsg_type.SOURCE, journald_type.SOURCE, file_type.SOURCE)
