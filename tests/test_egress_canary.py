"""The egress canary (alarm/collectors/kernel/canary.py): a datagram the fence logs, sent on an
interval from inside a network namespace; the kernel source reads its record and counts it
apart, never as a write; when the record does not come within the deadline the source is
blind and ``surface_blind`` fires, and it resolves once a canary is read again.

The end-to-end test uses the real kernel: a namespace of its own with an nftables rule that
logs (tests/kernelnet.py), the service reading /dev/kmsg.  Removing the rule makes the alarm
fire; restoring it resolves it."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from alarm.collectors.kernel.canary import (
    PAYLOAD,
    CanaryClaims,
    EgressCanary,
    EgressCanarySettings,
)
from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.synthetic import fence_line
from alarm.detector.sources import SOURCE_RESOLVE_HOLD
from exporters.canary_metrics import canary_families
from tests.kernelnet import fence_netns, require_kernel
from tests.servicekit import get, metric, running_service, surface_totals, wait_for

PREFIX = "EGRESS_FENCE tcanary"
LENGTH = 20 + 8 + len(PAYLOAD)


def canary_record(sport: int, *, length: int = LENGTH, dst: str = "10.255.255.1", dport: int = 9,
                  trusted: bool = True) -> KernelRecord:  # fmt: skip
    line = fence_line(PREFIX, dst, dport, "UDP", length, sport)
    return KernelRecord(ts=time.time(), message=line, facility=0, trusted=trusted)


def settings(**kw) -> EgressCanarySettings:
    return EgressCanarySettings(address="10.255.255.1", **kw)


def reader_with(claims: CanaryClaims) -> FenceReader:
    reader = FenceReader((PREFIX,), require_trusted=True, tick=1.0)
    reader.canary = claims
    return reader


def written(read) -> int:
    return 0 if read.events is None else int(read.events.nbytes.sum())


@pytest.mark.parametrize("batch", [1, 200], ids=["per-record", "native-scanner"])
def test_only_an_outstanding_canarys_record_is_taken_and_never_counted_as_a_write(batch):
    claims = CanaryClaims("kernel", settings())
    reader = reader_with(claims)
    traffic = [canary_record(40_000 + i, length=500) for i in range(batch - 1)]
    # No canary outstanding: a record that looks like one is ordinary traffic.
    read = reader.read([canary_record(61_500), *traffic])
    assert written(read) == LENGTH + 500 * (batch - 1) and claims.seen == 0

    claims.add(61_234, time.time())
    read = reader.read([*traffic, canary_record(61_234)])
    assert claims.seen == 1 and not claims.expecting()
    assert written(read) == 500 * (batch - 1)  # the canary counted apart, the rest in full
    assert 0 <= claims.last_latency < 5


def test_look_alikes_are_writes_and_cannot_claim_a_canary():
    claims = CanaryClaims("kernel", settings())
    reader = reader_with(claims)
    claims.add(61_000, time.time())
    look_alikes = [
        canary_record(61_001),  # another source port
        canary_record(61_000, length=LENGTH + 1),  # another size
        canary_record(61_000, dport=10),  # another port
        canary_record(61_000, dst="10.255.255.2"),  # another address
    ]
    read = reader.read(look_alikes)
    assert claims.seen == 0 and claims.expecting()
    assert written(read) == sum(int(r.message.split("LEN=")[1].split()[0]) for r in look_alikes)
    # A user-space write to /dev/kmsg (not the kernel's) is forged, never a canary.
    read = reader.read([canary_record(61_000, trusted=False)])
    assert claims.seen == 0 and read.forged == 1


def test_a_canary_past_its_deadline_is_missed_and_its_late_record_is_a_write():
    claims = CanaryClaims("kernel", settings(deadline=2))
    reader = reader_with(claims)
    claims.add(61_111, time.time() - 5)
    assert [o.sport for o in claims.expire(time.time(), 2.0)] == [61_111]
    assert claims.missed == 1 and not claims.expecting()
    assert written(reader.read([canary_record(61_111)])) == LENGTH


async def test_a_canary_read_before_its_send_returns_is_still_the_canary():
    """The kernel logs the datagram as it is sent and the reader (a worker thread) may read
    the record before the sending task resumes: the canary must be outstanding by then, or
    its 44 bytes land in a surface as a write."""
    from types import SimpleNamespace

    reader = FenceReader((PREFIX,), require_trusted=True, tick=1.0)
    collector = SimpleNamespace(reader=reader, health=SimpleNamespace(up=True, blind=""))
    canary = EgressCanary(
        EgressCanarySettings(address="127.0.0.1", port=9), lambda: {"kernel": collector}
    )
    watched = canary.attach()
    reads = []
    send = canary._bind_and_send

    def send_then_read_at_once(claim):
        sport = send(claim)
        reads.append(reader.read([canary_record(sport, dst="127.0.0.1")]))
        return sport

    canary._bind_and_send = send_then_read_at_once
    await canary.send(watched)
    claims = canary.claims["kernel"]
    assert canary.sent == 1 and claims.seen == 1 and not claims.expecting()
    assert written(reads[0]) == 0


def test_the_config_names_what_is_wrong():
    from alarm.config import ConfigError, config_from_dict

    def problems(canary: dict, **extra) -> list[str]:
        with pytest.raises(ConfigError) as err:
            config_from_dict({"egress_canary": canary, **extra})
        return err.value.problems

    assert problems({"address": "fence"}) == [
        "egress_canary.address: 'fence' is not an IPv4 or IPv6 address"
    ]
    assert problems({"address": "10.255.255.1", "sources": ["nope"]}) == [
        "egress_canary.sources: 'nope' is not a declared kernel source"
    ]
    assert problems({"address": "10.255.255.1", "netns": "../etc"})[0].startswith(
        "egress_canary.netns:"
    )
    assert problems({"address": "10.255.255.1", "sizes": 3})[0].startswith("egress_canary.sizes:")


def nft(ns, script: str) -> None:
    """An nft script run inside the test's namespace."""
    res = subprocess.run(
        ns.exec_argv(["nft", "-f", "-"]), input=script + "\n", capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


def alert(service, rule: str, state: str) -> bool:
    return any(
        c.get("source") == "kernel" and c["rule"] == rule and c["state"] == state
        for c in service.recent
    )


@pytest.mark.slow
async def test_canary_seen_then_the_alarm_fires_when_the_rule_goes_and_resolves_when_it_is_back(
    tmp_path,
):
    require_kernel()
    with fence_netns(ports=(9,), proto="udp") as ns:
        cfg = {
            "tick": "0.5s",
            "state_dir": str(tmp_path / "state"),
            "sources": [{"name": "kernel", "type": "kmsg", "prefixes": [ns.prefix]}],
            # Loopback inside the test's own namespace: the datagram never leaves it.
            "egress_canary": {
                "address": "127.0.0.1",
                "port": 9,
                "interval": "1s",
                "deadline": "3s",
                "netns": ns.name,
            },
        }
        async with running_service(cfg) as service:
            kmsg = service.collectors[0][1]
            await wait_for(lambda: kmsg.health.up, timeout=10)
            claims = service.canary.claims
            await wait_for(lambda: "kernel" in claims and claims["kernel"].seen >= 2, timeout=20)
            seen = claims["kernel"]
            assert seen.missed == 0 and kmsg.health.blind == ""
            # The kernel logged each canary (its own rule counter), and none is a write.
            assert ns.counter().packets >= 2
            assert surface_totals(service, "unclassified") == (0, 0)

            # Ordinary datagrams to the same port are writes, byte for byte.
            sent = ns.udp(3, payload=100, port=9)
            await wait_for(lambda: surface_totals(service, "unclassified")[0] == sent.bytes, 10)

            _, _, body = await get(service, "/api/v1/surfaces")
            canary = json.loads(body)["egress_canary"]
            assert canary["address"] == "127.0.0.1" and canary["netns"] == ns.name
            assert canary["sources"][0]["source"] == "kernel"
            assert canary["sources"][0]["seen"] >= 2 and canary["send_errors"] == 0
            snap = await service.snapshot()
            registry = CollectorRegistry(auto_describe=False)
            registry.register(type("C", (), {"collect": lambda self: canary_families(snap)})())
            text = generate_latest(registry).decode()
            assert metric(text, "capalarm_egress_canary_seen_total", source="kernel") >= 2
            assert (
                metric(text, "capalarm_egress_canary_last_seen_timestamp_seconds", source="kernel")
                > 0
            )

            # The fence stops logging: within the deadline the source is blind and it pages.
            nft(ns, "flush chain inet fence out")
            await wait_for(lambda: alert(service, "surface_blind", "firing"), timeout=20)
            assert "egress canary to 127.0.0.1:9" in kmsg.health.blind
            assert claims["kernel"].missed >= 1
            _, _, text = await get(service, "/metrics")
            assert metric(text, "capalarm_source_blind", source="kernel") == 1
            assert surface_totals(service, "unclassified")[0] == sent.bytes

            # Back: the next canary is read, the source sees, and the alarm resolves after
            # the source rules' resolve hold.
            nft(ns, f'add rule inet fence out udp dport {{ 9 }} counter log prefix "{ns.prefix} "')
            await wait_for(lambda: kmsg.health.blind == "", timeout=15)
            await wait_for(
                lambda: alert(service, "surface_blind", "resolved"),
                timeout=SOURCE_RESOLVE_HOLD + 30,
            )
            assert surface_totals(service, "unclassified")[0] == sent.bytes


async def test_a_canary_that_cannot_be_sent_makes_the_source_blind(tmp_path):
    """A namespace that is gone: nothing proves the fence still logs, so the source is blind
    (with the reason), and the send errors are counted."""
    from tests.servicekit import RecordsCollector

    collector = RecordsCollector("kernel", [], (PREFIX,), 0.5)
    cfg = {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "prefixes": [PREFIX]}],
        "egress_canary": {
            "address": "127.0.0.1",
            "interval": "0.5s",
            "deadline": "1s",
            "netns": "capalarm-no-such-namespace",
        },
    }
    async with running_service(cfg, collectors={"kernel": collector}) as service:
        await wait_for(lambda: service.canary.send_errors >= 1, timeout=10)
        assert "cannot send the egress canary" in collector.health.blind
        await wait_for(lambda: alert(service, "surface_blind", "firing"), timeout=10)
        view = (await service.snapshot()).egress_canary
        assert view is not None and view.sent == 0 and view.send_errors >= 1
