"""Deployment without Kubernetes: the systemd unit, checked by the real systemd-analyze, and
the nftables fence example, loaded by the real nft in a throwaway network namespace where it
must log a packet the way capalarm parses it."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploykit import DEPLOY, ROOT, require_tool, run
from kernelnet import require_kernel, run_in_netns, sweep_stale_netns, unique_prefix

from alarm.cli import build_parser
from alarm.collectors.kernel.netfilter import parse_fence

UNIT = DEPLOY / "systemd" / "capalarm.service"
FENCE = DEPLOY / "nftables" / "fence.nft"
# TEST-NET-1 (RFC 5737), routed out of one end of a veth pair whose both ends are inside the
# throwaway namespace: the packet is logged on its way out and dies at the other end (which
# has no address), never leaving the namespace.
PEER_NET = "192.0.2.1/24"
PEER = "192.0.2.2"


def installed_unit(tmp_path: Path) -> Path:
    """The unit as installed where the capalarm command exists (verify checks ExecStart)."""
    capalarm = shutil.which("capalarm")
    if capalarm is None:
        pytest.fail("the capalarm console script is not installed (pip install -e .)")
    path = tmp_path / UNIT.name
    path.write_text(UNIT.read_text().replace("/opt/capalarm/bin/capalarm", capalarm))
    return path


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    analyze = require_tool("systemd-analyze", "systemd")
    res = run([analyze, "verify", str(installed_unit(tmp_path))])
    assert res.returncode == 0, res.stderr
    # Unknown or misspelt settings are only warnings ("Unknown key ..., ignoring"): none.
    assert res.stderr.strip() == "", res.stderr


def test_systemd_analyze_verify_refuses_a_misspelt_setting(tmp_path):
    analyze = require_tool("systemd-analyze", "systemd")
    unit = installed_unit(tmp_path)
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"))
    res = run([analyze, "verify", str(unit)])
    assert "Unknown key" in res.stderr and "ProtectSytem" in res.stderr


def test_unit_exposure_is_ok(tmp_path):
    """systemd's own exposure score (0 best, 10 worst; below 4.5 is "OK")."""
    analyze = require_tool("systemd-analyze", "systemd")
    res = run(
        [analyze, "security", "--offline=yes", "--threshold=40", str(installed_unit(tmp_path))]
    )
    match = re.search(r"Overall exposure level for capalarm.service: ([0-9.]+) (\w+)", res.stdout)
    assert match, res.stdout[-500:] + res.stderr
    assert float(match.group(1)) < 4.0 and match.group(2) == "OK", match.group(0)
    assert res.returncode == 0


def test_unit_keeps_what_the_kernel_sources_need_and_drops_the_rest():
    s = unit_settings()
    assert s["CapabilityBoundingSet"] == ["CAP_SYSLOG CAP_SYS_NICE"]
    assert s["AmbientCapabilities"] == ["CAP_SYSLOG CAP_SYS_NICE"]
    assert s["ProtectSystem"] == ["strict"] and s["NoNewPrivileges"] == ["yes"]
    assert s["StateDirectory"] == ["capalarm"] and s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["DeviceAllow"] == ["/dev/kmsg r"]
    # Each of these would close /dev/kmsg or forbid the drain's SCHED_FIFO.
    for closing in ("PrivateDevices", "ProtectKernelLogs", "RestrictRealtime"):
        assert closing not in s, closing
    # An invalid config exits 2 (alarm/cli.py): not restarted in a loop.
    assert s["RestartPreventExitStatus"] == ["2"]


def test_unit_runs_the_command_the_package_installs():
    s = unit_settings()
    [start] = s["ExecStart"]
    argv = start.split()
    assert Path(argv[0]).name == "capalarm"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.config == "/etc/capalarm/config.yaml"


def test_example_host_config_is_valid():
    res = run(
        [sys.executable, "-m", "alarm.cli", "check-config", str(DEPLOY / "config.example.yaml")],
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr


@contextlib.contextmanager
def netns() -> Iterator[str]:
    """A fresh namespace (``capalarm-<pid>-<hex>``, the pattern kernelnet sweeps when a killed
    test leaves one behind) with lo and a veth pair up, fence0 addressed."""
    name = f"capalarm-{os.getpid()}-{secrets.token_hex(3)}"
    sweep_stale_netns()
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for argv in (
            ["link", "set", "lo", "up"],
            ["link", "add", "fence0", "type", "veth", "peer", "name", "fence1"],
            ["addr", "add", PEER_NET, "dev", "fence0"],
            ["link", "set", "fence0", "up"],
            ["link", "set", "fence1", "up"],
            ["neigh", "add", PEER, "lladdr", "02:00:00:00:00:02", "dev", "fence0"],
        ):
            subprocess.run(["ip", "-n", name, *argv], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def nft(ns: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def test_fence_example_passes_nft_check_mode():
    require_kernel()
    with netns() as ns:
        res = nft(ns, "-c", "-f", str(FENCE))
        assert res.returncode == 0, res.stderr


def test_fence_example_logs_what_capalarm_parses_and_reloads_cleanly():
    """Loaded for real (with a prefix unique to this run, so no other test or service counts
    its record), the example logs a datagram leaving through a device with the sender's UID
    and its size, and not one sent over loopback; loading it twice leaves one set of rules."""
    require_kernel()
    prefix = unique_prefix("d")  # not EGRESS_FENCE: the host's kernel log
    text = FENCE.read_text()
    assert text.count('log prefix "EGRESS_FENCE "') == 2
    script = text.replace('log prefix "EGRESS_FENCE "', f'log prefix "{prefix} "')
    with open("/proc/sys/net/netfilter/nf_log_all_netns", "w") as f:
        f.write("1\n")  # left set: concurrent kernel tests need it too
    with netns() as ns:
        for _ in range(2):
            res = nft(ns, "-f", "-", stdin=script)
            assert res.returncode == 0, res.stderr
        ruleset = nft(ns, "list", "ruleset").stdout
        assert ruleset.count(f'log prefix "{prefix} "') == 2
        kmsg = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(kmsg, 0, os.SEEK_END)

            def send() -> None:
                for addr in ((PEER, 9911), ("127.0.0.1", 9912)):
                    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                        s.sendto(b"x" * 100, addr)

            run_in_netns(ns, send)
            lines = []
            with contextlib.suppress(BlockingIOError):
                while True:
                    lines.append(os.read(kmsg, 8192).decode(errors="replace"))
        finally:
            os.close(kmsg)
    records = []
    for line in lines:
        _, _, message = line.partition(";")
        record = parse_fence(message.split("\n", 1)[0], (prefix,))
        # Only this test's datagrams: the kernel's own traffic on a device that just came up
        # (IPv6 multicast listener reports, router solicitations) is logged by the fence too.
        if record is not None and record.dpt in (9911, 9912):
            records.append(record)
    assert len(records) == 1, lines
    [rec] = records
    assert (rec.dst, rec.dpt, rec.proto, rec.out_if) == (PEER, 9911, "UDP", "fence0")
    assert rec.length == 128  # 20 IPv4 + 8 UDP + 100 payload
    assert rec.uid == os.geteuid()
