"""The native reader of write-event lines agrees with the Python reader on every chunk: the
same lines, parse errors, subjects and columns, or it hands the chunk back.  A backtest's
figures must not depend on whether the install found a compiler."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alarm import backtest

needs_native = pytest.mark.skipif(
    backtest.native_events is None and not os.environ.get("CI"),
    reason="alarm._eventscan not built here (no C compiler at install time)",
)


def test_native_reader_is_built_in_ci() -> None:
    if os.environ.get("CI") or backtest.native_events is not None:
        assert backtest.native_events is not None, "alarm._eventscan was not built (needs gcc)"
    else:
        pytest.skip("alarm._eventscan not built here: no C compiler at install time")


def _both(data: bytes) -> tuple[backtest.Chunk, backtest.Chunk, bool]:
    assert backtest.native_events is not None
    native = backtest.native_events.scan_events(data)
    fast = backtest.parse_events(data)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backtest, "native_events", None)
        slow = backtest.parse_events(data)
    return fast, slow, native is not None


def _same(a: backtest.Chunk, b: backtest.Chunk) -> None:
    assert (a.lines, a.parse_errors, a.records, a.subjects) == (
        b.lines,
        b.parse_errors,
        b.records,
        b.subjects,
    )
    for name in ("subject", "ts", "nbytes", "events"):
        got, want = getattr(a, name), getattr(b, name)
        assert got.dtype == want.dtype, name
        assert np.array_equal(got, want), name


NAMES = st.sampled_from(["s1", "pip-cache", "a b", "", "x\\u00e9", "é", 'q\\"t', "tab\there"])
NUMBERS = st.sampled_from(
    ["1767571205", "1767571205.5", "0", "-0", "-3", "1e10", "1E11", "2.5e9", "007", "1e400"]
)
COUNTS = st.sampled_from(["0", "1", "4096", "0007", str(2**62), str(2**62 + 1), "9" * 25])


@st.composite
def lines(draw: st.DrawFn) -> str:
    sp = draw(st.sampled_from(["", " "]))
    parts = [
        f'"ts":{sp}{draw(NUMBERS)}',
        f'"surface":{sp}"{draw(NAMES)}"',
        f'"bytes":{sp}{draw(COUNTS)}',
    ]
    if draw(st.booleans()):
        parts.append(f'"events":{sp}{draw(COUNTS)}')
    if draw(st.booleans()):
        parts.append(f'"kind":{sp}"{draw(st.sampled_from(["fs", "egress", "", "registry"]))}"')
    if draw(st.booleans()):
        parts.append(f'"contributor":{sp}"{draw(NAMES)}"')
    if draw(st.integers(0, 9)) == 0:
        parts.reverse()  # another layout: json.loads reads it
    line = "{" + f",{sp}".join(parts) + "}"
    ending = draw(st.sampled_from(["\n", "\n", "\n", "\r\n", ""]))
    return line + ending


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.lists(
        st.one_of(lines(), st.sampled_from(["\n", "\r\n", "garbage\n", "{}\n", " \n", "\t\n"])),
        max_size=12,
    )
)
def test_native_and_python_readers_agree(body: list[str]) -> None:
    data = "".join(body).encode()
    fast, slow, _ = _both(data)
    _same(fast, slow)


@needs_native
def test_native_reader_reads_the_layout_capalarm_writes() -> None:
    rows = [
        '{"ts": 1767571205.5, "surface": "pip-cache", "bytes": 4096, "events": 3, "kind": "fs"}',
        '{"ts":1767571215,"surface":"proxy","bytes":12,"contributor":"10.0.0.1"}',
        "",
        '{"ts":1767571225,"surface":"proxy","bytes":99999999999999999999}',  # implausible
    ]
    fast, slow, native = _both(("\n".join(rows) + "\n").encode())
    assert native, "the native reader handed back the layout it exists for"
    _same(fast, slow)
    assert (fast.lines, fast.records, fast.parse_errors) == (4, 2, 1)
    assert fast.subjects == [("fs", "pip-cache", ""), (None, "proxy", "10.0.0.1")]
    assert fast.events.tolist() == [3, 1]


@needs_native
@pytest.mark.parametrize(
    "line",
    [
        '{"ts":1,"surface":"a\\"b","bytes":1}',  # an escape: json.loads unescapes it
        '{"ts":1,"surface":"café","bytes":1}',  # UTF-8
        '{"ts":1,"surface":"a\x0cb","bytes":1}',  # a byte str.splitlines splits at
        '{"bytes":1,"ts":1,"surface":"a"}',  # another order
        '{"ts":1,"surface":"a","bytes":1} ',  # trailing text
    ],
)
def test_native_reader_hands_back_what_it_cannot_read_with_certainty(line: str) -> None:
    fast, slow, native = _both((line + "\n").encode())
    assert not native
    _same(fast, slow)
