"""Who wrote it, against the real kernel (issue 27): a sender in a cgroup v2 group of the test's
own, and a fence rule for that group before the catch-all, as docs/kernel-sources.md says to
write one per workload:

    socket cgroupv2 level N "<path>" counter log prefix "<prefix> agent-17 " flags skuid accept

The service reads /dev/kmsg, with the test's own prefix (never EGRESS_FENCE: a capalarm on the
host would count these records), and counts exactly the bytes the kernel logged for the group's
packets on the surface that matches the workload's prefix; its alert names the prefix (and the
UID) in the contributor's receipt, while packets sent from outside the group carry the plain
prefix; neither is ever a /metrics label.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from exporters.payload import LinkSet, alert_document
from tests.kernelnet import (
    FenceNetns,
    WorkloadCgroup,
    fence_netns,
    require_cgroup2,
    workload_cgroup,
)
from tests.servicekit import get, metric, running_service, wait_for

AGENT_PORT, OTHER_PORT = 9931, 9932
UDP_COUNT, UDP_PAYLOAD, TCP_BYTES = 20, 100, 30_000

# The workload: waits until it has been moved into its cgroup (a socket belongs to the cgroup
# of the process that created it), then sends UDP datagrams and one TCP stream to AGENT_PORT.
SENDER = r"""
import socket, sys
port, count, payload, nbytes = map(int, sys.argv[1:])
sys.stdin.readline()
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
    for _ in range(count):
        u.sendto(b"a" * payload, ("127.0.0.1", port))
with socket.create_connection(("127.0.0.1", port), timeout=10) as t:
    t.sendall(b"b" * nbytes)
    t.shutdown(socket.SHUT_WR)
    while t.recv(65536):
        pass
print("sent", flush=True)
"""

TRIPWIRE = {"allowance_bits_per_second": 100, "tolerance_bits": 8000, "horizons": []}
RULES = {"budget": TRIPWIRE, "spike": {"enabled": False}}


@pytest.fixture
def workload() -> Iterator[tuple[FenceNetns, WorkloadCgroup, str]]:
    """A fence netns (catch-all rules logging with the test's prefix), a cgroup for the
    workload, and the workload's own rule inserted before the catch-all; the table, the cgroup
    and the namespace are removed on the way out, whatever happened."""
    require_cgroup2()
    with (
        fence_netns(ports=(AGENT_PORT, OTHER_PORT), proto=("udp", "tcp")) as ns,
        workload_cgroup("agent-17") as cg,
    ):
        agent = f"{ns.prefix} agent-17"
        try:
            # `accept` after the log: without it the packet goes on to the catch-all and is
            # logged (and counted) a second time, with the plain prefix.
            ns.nft(
                f'insert rule inet fence out socket cgroupv2 level {cg.level} "{cg.path}" '
                f'counter log prefix "{agent} " flags skuid accept'
            )
            yield ns, cg, agent
        finally:
            with contextlib.suppress(RuntimeError):
                ns.nft("delete table inet fence")


def receive(ns: FenceNetns, port: int) -> tuple[socket.socket, socket.socket, threading.Thread]:
    """A UDP socket that takes (and never reads) datagrams on ``port``, and a TCP listener
    whose one connection is read to its end: both created outside the workload's cgroup."""
    rx = ns.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", port))
    srv = ns.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    srv.settimeout(10)

    def sink() -> None:
        with contextlib.suppress(OSError):
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(10)
                while conn.recv(1 << 16):
                    pass

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    return rx, srv, t


def send_from(ns: FenceNetns, cg: WorkloadCgroup) -> None:
    """Run the workload inside the namespace (``ip netns exec``) and inside the cgroup."""
    argv = [sys.executable, "-c", SENDER, str(AGENT_PORT), str(UDP_COUNT), str(UDP_PAYLOAD)]
    proc = subprocess.Popen(
        ns.exec_argv([*argv, str(TCP_BYTES)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        cg.add(proc.pid)
        where = "/" + "/".join(cg.dir.split("/")[-2:])  # slice/scope
        with open(f"/proc/{proc.pid}/cgroup") as f:
            assert any(ln.startswith("0::") and ln.rstrip().endswith(where) for ln in f)
        out, err = proc.communicate("go\n", timeout=10)
        assert proc.returncode == 0 and out == "sent\n", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def config(tmp_path, prefix: str, agent: str) -> dict:
    return {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "type": "kmsg", "prefixes": [prefix]}],
        "surfaces": [
            # The workload's surface is the one its rule's prefix names; the rest by port.
            {"name": "sandbox", "match": {"log_prefix": [agent]}, **RULES},
            {"name": "board", "match": {"dport": [OTHER_PORT]}, **RULES},
        ],
    }


async def test_a_cgroups_packets_are_counted_exactly_and_its_prefix_is_the_receipt(
    tmp_path, workload
) -> None:
    ns, cg, agent = workload
    async with running_service(config(tmp_path, ns.prefix, agent)) as service:
        kmsg = service.collectors[0][1]
        await wait_for(lambda: kmsg.health.up, timeout=10)

        rx, srv, sink = receive(ns, AGENT_PORT)
        try:
            await asyncio.to_thread(send_from, ns, cg)
            await asyncio.to_thread(sink.join, 10)
        finally:
            rx.close()
            srv.close()
        other = ns.udp(7, payload=333, port=OTHER_PORT)  # from the test: outside the cgroup

        # What the kernel matched, rule by rule: the workload's rule took every packet the
        # workload sent (the stream's and the datagrams'), the catch-all only the test's own.
        mine = ns.counter(agent)
        plain = ns.counter(ns.prefix)
        assert mine.packets > UDP_COUNT
        assert mine.bytes >= UDP_COUNT * (28 + UDP_PAYLOAD) + TCP_BYTES
        assert plain == other

        async def exact() -> bool:
            _, _, text = await get(service, "/metrics")
            got = {
                s: metric(text, "capalarm_surface_written_bytes_total", surface=s)
                for s in ("sandbox", "board", "unclassified")
            }
            return got == {"sandbox": mine.bytes, "board": other.bytes, "unclassified": 0}

        await wait_for(exact, timeout=15)

        def fired(surface: str) -> dict | None:
            return next(
                (
                    c
                    for c in service.recent
                    if c.get("surface") == surface
                    and c["rule"] == "budget"
                    and c["state"] == "firing"
                ),
                None,
            )

        sandbox = await wait_for(lambda: fired("sandbox"), timeout=10)
        board = await wait_for(lambda: fired("board"), timeout=10)
        _, _, text = await get(service, "/metrics")

    # The workload's destination carries its rule's prefix (and the socket owner's UID) ...
    named = {c["contributor"]: c.get("receipt") for c in sandbox["contributors"]}
    assert named and set(named) <= {f"127.0.0.1:{AGENT_PORT}/UDP", f"127.0.0.1:{AGENT_PORT}/TCP"}
    receipt = {"uid": str(os.geteuid()), "prefix": agent}
    assert all(r == receipt for r in named.values()), named
    doc = alert_document({"change": sandbox}, "k", LinkSet("http://capalarm/", None), 5)
    assert doc["top_contributors"][0]["receipt"] == receipt
    # ... the packets from outside the cgroup the plain prefix only ...
    named = {c["contributor"]: c.get("receipt") for c in board["contributors"]}
    assert named == {f"127.0.0.1:{OTHER_PORT}/UDP": {"prefix": ns.prefix}}
    # ... and neither is a label: /metrics has one series per declared surface.
    assert "agent-17" not in text and ns.prefix.split()[-1] not in text
    assert 'uid="' not in text and 'prefix="' not in text
