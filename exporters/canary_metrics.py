"""/metrics families of the egress canary (alarm/collectors/kernel/canary.py): what was sent,
and per kernel source what was read in time and what was not.  Nothing when no canary is
configured.  Labels: ``source`` only (declared source names), so the series are bounded by
the config."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from alarm.snapshot import Snapshot


def canary_families(snap: Snapshot) -> Iterable[Metric]:
    c = snap.egress_canary
    if c is None:
        return
    yield CounterMetricFamily(
        "capalarm_egress_canary_sent", "Egress canary datagrams sent.", value=c.sent
    )
    yield CounterMetricFamily(
        "capalarm_egress_canary_send_errors",
        "Egress canaries that could not be sent (no route, namespace gone).",
        value=c.send_errors,
    )
    yield GaugeMetricFamily(
        "capalarm_egress_canary_last_sent_timestamp_seconds",
        "When the last egress canary was sent.",
        value=c.last_sent,
    )
    labels = ["source"]
    per_source = (
        (
            CounterMetricFamily,
            "seen",
            "Egress canary records the source read in time (counted apart, never as writes).",
            lambda s: s.seen,
        ),
        (
            CounterMetricFamily,
            "missed",
            "Egress canaries whose record the source did not read within the deadline.",
            lambda s: s.missed,
        ),
        (
            GaugeMetricFamily,
            "last_seen_timestamp_seconds",
            "When the source last read an egress canary's record (0: never).",
            lambda s: s.last_seen,
        ),
        (
            GaugeMetricFamily,
            "latency_seconds",
            "From sending to reading, of the last egress canary the source read.",
            lambda s: s.last_latency,
        ),
    )
    for fam_type, name, doc, value in per_source:
        fam = fam_type(f"capalarm_egress_canary_{name}", doc, labels=labels)
        for s in c.sources:
            fam.add_metric([s.source], value(s))
        yield fam
