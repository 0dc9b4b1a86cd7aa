"""The service against the real kernel: nftables in a namespace of the test's own logs fence
records; the service reads /dev/kmsg and /metrics shows exactly the bytes (sum of first LEN)
per surface that the test sent.  A forged record written to /dev/kmsg is not counted, and is
reported and alarmed."""

from __future__ import annotations

from exporters.payload import LinkSet, alert_document
from tests.kernelnet import fence_netns, forged_fence, inject_kmsg, require_kernel
from tests.servicekit import get, metric, running_service, wait_for


def config(tmp_path, prefix: str) -> dict:
    return {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "type": "kmsg", "prefixes": [prefix]}],
        "surfaces": [
            {"name": "board", "match": {"dport": [9911], "proto": ["udp", "tcp"]}},
            {"name": "icmp", "match": {"proto": ["icmp"]}},
        ],
    }


async def test_metrics_show_exactly_the_bytes_the_kernel_logged_and_forgeries_are_rejected(
    tmp_path,
):
    require_kernel()
    with fence_netns(ports=(9911, 9912)) as ns:
        async with running_service(config(tmp_path, ns.prefix)) as service:
            kmsg = service.collectors[0][1]
            await wait_for(lambda: kmsg.health.up, timeout=10)

            board = ns.udp(25, payload=100, port=9911)
            ns.tcp(50_000, port=9911)
            other = ns.udp(7, payload=333, port=9912)
            icmp = ns.icmp_echo(3, payload=56)
            matched = ns.counter()  # what the kernel's own rule counters saw
            udp_tcp_board = matched.bytes - other.bytes - icmp.bytes
            assert udp_tcp_board > board.bytes + 50_000

            async def exact():
                _, _, text = await get(service, "/metrics")
                got = {
                    s: metric(text, "capalarm_surface_written_bytes_total", surface=s)
                    for s in ("board", "icmp", "unclassified")
                }
                return got == {
                    "board": udp_tcp_board,
                    "icmp": icmp.bytes,
                    "unclassified": other.bytes,
                }

            await wait_for(exact, timeout=20)

            inject_kmsg(forged_fence(ns.prefix, 9999, dport=9911), level=0)

            async def forged_reported():
                _, _, text = await get(service, "/metrics")
                return (
                    metric(text, "capalarm_source_forged_records_total", source="kernel") == 1
                    and metric(text, "capalarm_alert_state", target="kernel", rule="forged_records")
                    == 2
                    and metric(text, "capalarm_surface_written_bytes_total", surface="board")
                    == udp_tcp_board
                )

            await wait_for(forged_reported, timeout=10)
            _, _, text = await get(service, "/metrics")
            assert metric(text, "capalarm_source_provenance_verified", source="kernel") == 1
            assert metric(text, "capalarm_source_records_lost_total", source="kernel") == 0
            fired = [
                c
                for c in service.recent
                if c["rule"] == "forged_records" and c["state"] == "firing"
            ]
            assert fired and fired[0]["source"] == "kernel"
            # The page shows what was forged: the line as written to /dev/kmsg.
            sample = forged_fence(ns.prefix, 9999, dport=9911).rstrip()
            assert fired[0]["figures"]["forged_sample"].rstrip() == sample
            doc = alert_document({"change": fired[0]}, "k", LinkSet("http://capalarm/", None), 5)
            assert doc["forged_sample"].rstrip() == sample
