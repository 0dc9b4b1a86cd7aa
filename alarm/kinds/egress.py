"""Kind ``egress``: what a confined workload sends past the fence, as the kernel logs it
(alarm/collectors/kernel/); classified by destination, port, protocol, interface, uid and
log prefix (alarm/classify/egress.py)."""

from alarm.classify.egress import EgressClassifier, EgressMatch
from alarm.kind import Kind, horizons

KIND = Kind(
    name="egress",
    match=EgressMatch,
    classifier=EgressClassifier,
    # 1 Mbit/s over a minute with 64 Mbit of burst; 250 kbit/s over an hour, 100 kbit/s over a
    # day (config.py, "Defaults per kind"; docs/detector.md).
    budget=horizons(1e6, 64e6, (250e3, 512e6), (100e3, 2e9)),
    newsurface=(64e3, 64e6),
    workload="daemonset",
    summary="traffic through the kernel's egress fence",
    classifier_counters={
        "memo_evictions": "Flow keys dropped from the egress classifier's memo (memo_limit) "
        "to make room for this source's new flows: each is looked up in the rules again if "
        "seen; a steady rise is a spray of destinations.",
    },
)
