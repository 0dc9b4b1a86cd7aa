"""Who wrote it (issue 27): a file written through a real fanotify mark on the test's own tmpfs
carries the writer's workload in its evidence (pid, program, cgroup, and the container id and
Kubernetes pod uid where the cgroup path carries them), read from /proc once per pid."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from alarm.collectors.fs.mounts import mount_table
from alarm.collectors.fs.workload import Workloads, workload_of
from tests.test_fs_kit import (
    CI,
    Recorder,
    collector,
    mount_tmpfs,
    quiesce,
    running,
    settings,
    write,
)

WRITER = r"""
import os, sys
sys.stdin.readline()  # moved into its cgroup by now
for i in range(int(sys.argv[2])):
    with open(os.path.join(sys.argv[1], f"from-pod-{i}"), "wb") as f:
        f.write(b"p" * (1000 + i))
print("written", flush=True)
sys.stdin.readline()  # alive until its writes were read (a pid that is gone names nothing)
"""


def cgroup2_mount() -> Path | None:
    return next((Path(m.point) for m in mount_table() if m.fstype == "cgroup2"), None)


def make_pod_cgroup(request: pytest.FixtureRequest) -> tuple[Path, str, str]:
    """A cgroup named as the kubelet's systemd driver and containerd name a container's:
    (its directory, the container id, the pod uid)."""
    base = cgroup2_mount()
    pod, container = str(uuid.uuid4()), secrets.token_hex(32)
    if base is None or not os.access(base, os.W_OK):
        why = "a writable cgroup2 file system, to run a writer in a pod-like cgroup"
        if CI:
            pytest.fail(f"CI runs as root with cgroup2: {why}")
        pytest.skip(f"needs {why}")
    top = base / f"capalarm-test-{secrets.token_hex(4)}"
    leaf = (
        top
        / "kubepods.slice"
        / f"kubepods-besteffort-pod{pod.replace('-', '_')}.slice"
        / f"cri-containerd-{container}.scope"
    )
    leaf.mkdir(parents=True)

    def remove() -> None:
        for d in [leaf, *leaf.parents]:
            if d == base:
                break
            os.rmdir(d)

    request.addfinalizer(remove)
    return leaf, container, pod


async def test_fanotify_evidence_names_the_writers_container_and_pod(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    mnt = tmp_path / "mnt"
    mount_tmpfs(mnt, request)
    tree = mnt / "tree"
    tree.mkdir()
    leaf, container, pod = make_pod_cgroup(request)
    rec = Recorder()
    c = collector(settings([str(tree)], mode="fanotify", settle=0.1), rec)
    async with running(c, rec):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tree), "3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdin is not None and writer.stdout is not None
        try:
            (leaf / "cgroup.procs").write_text(str(writer.pid))
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == "written\n"
            write(tree / "from-the-test", b"t" * 500)  # this process: no container
            await quiesce(c)
        finally:
            writer.kill()
            writer.wait()
    created = {os.path.basename(e.key): e.evidence for e in rec.changes("created")}
    assert sorted(created) == ["from-pod-0", "from-pod-1", "from-pod-2", "from-the-test"]
    for i in range(3):
        ev = created[f"from-pod-{i}"]
        assert ev["pid"] == writer.pid
        assert ev["container_id"] == container
        assert ev["pod_uid"] == pod
        assert ev["cgroup"].endswith(f"/cri-containerd-{container}.scope")
        assert ev["comm"] == Path(sys.executable).name[:15]
    mine = created["from-the-test"]
    assert mine["pid"] == os.getpid()
    assert "container_id" not in mine and "pod_uid" not in mine
    assert rec.bytes_under(str(tree)) == 1000 + 1001 + 1002 + 500


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # cgroup v2, kubelet with the systemd driver, containerd
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-" + "ab" * 32 + ".scope\n",
            {"container_id": "ab" * 32, "pod_uid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
        ),
        (  # cgroup v1, kubelet with cgroupfs, docker: the unified line names only the root
            "12:memory:/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/"
            + "cd" * 32
            + "\n1:name=systemd:/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/"
            + "cd" * 32
            + "\n0::/\n",
            {"container_id": "cd" * 32, "pod_uid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
        ),
        ("0::/system.slice/docker-" + "ef" * 32 + ".scope\n", {"container_id": "ef" * 32}),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", {}),  # no workload id
    ],
)
def test_container_and_pod_ids_are_read_from_the_runtimes_cgroup_names(
    text: str, expected: dict[str, str]
) -> None:
    got = workload_of(text)
    assert {k: v for k, v in got.items() if k != "cgroup"} == expected
    assert got["cgroup"].startswith("/")


def test_hostile_cgroup_text_is_bounded_and_escaped(tmp_path: Path) -> None:
    # A workload that may make cgroups (delegation) chooses their names.
    hostile = "0::/" + "x" * 5000 + "\x1b[2J\udcff/" + "9" * 64 + "\n"
    got = workload_of(hostile)
    assert len(got["cgroup"]) <= 256 and "\x1b" not in got["cgroup"]
    assert workload_of("garbage without colons\n\x00\x00") == {}
    # One read per pid, and a bounded memory of pids.
    proc = tmp_path / "proc"
    for pid in range(10):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_bytes(b"w\x07riter\n")
        (proc / str(pid) / "cgroup").write_text("0::/pod-a\n")
    w = Workloads(str(proc), memory=4)
    assert w.of(3) == {"comm": "w?riter", "cgroup": "/pod-a"}
    (proc / "3" / "cgroup").write_text("0::/pod-b\n")
    assert w.of(3)["cgroup"] == "/pod-a", "read once per pid"
    for pid in range(10):
        w.of(pid)
    assert len(w) <= 4
    assert w.of(99) == {}, "a pid that is gone gives nothing"
