"""The kernel-log helpers the tests share (tests/kernelnet.py) never write a record that a
capalarm running on the same host with its default configuration would read: such a service
counted the suite's nft records as writes and its injected look-alikes as forgeries, and paged."""

from __future__ import annotations

from pathlib import Path

import pytest

from alarm.collectors.kernel.netfilter import parse_fence
from alarm.collectors.kernel.settings import KernelSettings
from tests import kernelnet
from tests.kernelnet import fence_netns, forged_fence, inject_kmsg, require_kernel, unique_prefix

DEFAULT = tuple(KernelSettings(name="kernel").prefixes)


def test_the_guard_knows_the_default_prefix():
    assert (kernelnet.DEFAULT_FENCE_PREFIX,) == DEFAULT


def test_a_test_prefix_is_unique_and_not_read_by_the_default_configuration():
    a, b = unique_prefix(), unique_prefix("d")
    assert a != b and a.startswith("CAPALARM_TEST t") and b.startswith("CAPALARM_TEST d")
    forged = forged_fence(a, 100)
    assert parse_fence(forged, (a,)) is not None  # the test's own service reads it ...
    assert parse_fence(forged, DEFAULT) is None  # ... the host's does not


@pytest.fixture
def fake_kmsg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "kmsg"
    path.touch()
    monkeypatch.setattr(kernelnet, "KMSG", str(path))
    return path


@pytest.mark.parametrize(
    "text",
    [
        forged_fence("EGRESS_FENCE", 999),
        forged_fence("EGRESS_FENCE tpid42", 999),
        "EGRESS_FENCE: IN= OUT=lo",
        "EGRESS_FENCE_V6 x MARK start",
        " EGRESS_FENCE t1 MARK end",
    ],
)
def test_inject_refuses_what_the_hosts_capalarm_would_read(fake_kmsg: Path, text: str):
    with pytest.raises(ValueError, match="prefix of their own"):
        inject_kmsg(text)
    assert fake_kmsg.read_text() == ""


def test_inject_writes_a_test_prefixed_record(fake_kmsg: Path):
    prefix = unique_prefix()
    inject_kmsg(forged_fence(prefix, 999), level=0)
    assert fake_kmsg.read_text() == "<0>" + forged_fence(prefix, 999) + "\n"


def test_fence_netns_refuses_the_default_prefix_before_touching_the_host():
    with pytest.raises(ValueError, match="default fence prefix"), fence_netns("EGRESS_FENCE t1"):
        pass


@pytest.mark.kernel
def test_a_namespace_logs_with_a_prefix_of_its_own():
    require_kernel()
    with fence_netns(proto="udp") as ns:
        assert ns.prefix.startswith("CAPALARM_TEST t")
        assert parse_fence(forged_fence(ns.prefix, 100), DEFAULT) is None
