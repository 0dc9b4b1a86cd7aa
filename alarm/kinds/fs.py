"""Kind ``fs``: writes into watched directories and caches (alarm/collectors/fs/); classified
by path (alarm/classify/fs.py)."""

from alarm.classify.fs import FsClassifier, FsMatch
from alarm.kind import Kind, horizons

KIND = Kind(
    name="fs",
    match=FsMatch,
    classifier=FsClassifier,
    budget=horizons(1e6, 64e6, (250e3, 512e6), (100e3, 2e9)),
    newsurface=(64e3, 64e6),
    workload="daemonset",
    summary="writes into watched directories",
)
