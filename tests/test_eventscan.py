"""The native reader of write-event lines gives the Python reader's result on every chunk:
the same lines, parse errors, subjects and columns, line for line — reading what it can with
certainty (any key order, any JSON whitespace, unknown keys, duplicate keys) and handing each
other line back to json.loads.  A backtest's figures must not depend on whether the install
found a compiler, nor on the order a writer put its keys in."""

from __future__ import annotations

import itertools
import json
import os
import random
import re

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


def _readers(data: bytes) -> tuple[backtest.Chunk, backtest.Chunk, backtest.Chunk]:
    """The native reader's chunk, the Python reader's (bulk regex where it reads the chunk),
    and the definition: json.loads on every line."""
    assert backtest.native_events is not None
    fast = backtest.parse_events(data)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(backtest, "native_events", None)
        regex = backtest.parse_events(data)
        m.setattr(backtest, "_EVENT_LINE", re.compile(r"(?!)"))
        definition = backtest.parse_events(data)
    return fast, regex, definition


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
    # -0.0 and 0.0 compare equal: the time stamps bit for bit.
    assert a.ts.tobytes() == b.ts.tobytes()


def _agree(data: bytes) -> backtest.Chunk:
    fast, regex, definition = _readers(data)
    assert fast.native
    _same(fast, definition)
    _same(regex, definition)
    return fast


NAMES = st.sampled_from(["s1", "pip-cache", "a b", "", "x\\u00e9", "é", 'q\\"t', "tab\there"])
NUMBERS = st.sampled_from(
    ["1767571205", "1767571205.5", "0", "-0", "-0.0", "-3", "1e10", "1E11", "2.5e9", "007", "1e400"]
)
COUNTS = st.sampled_from(
    ["0", "-0", "1", "4096", "0007", "1.0", str(2**62), str(2**62 + 1), "9" * 25, "-1"]
)
SPACE = st.sampled_from(["", " ", "  ", "\t", " \t "])


@st.composite
def lines(draw: st.DrawFn) -> str:
    sp = draw(SPACE)
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
    if draw(st.integers(0, 3)) == 0:
        parts.append(f'"extra":{sp}{draw(st.sampled_from(["[1, {}]", "null", "NaN", "{}"]))}')
    parts = draw(st.permutations(parts))
    line = draw(SPACE) + "{" + sp + f"{sp},{sp}".join(parts) + sp + "}" + draw(SPACE)
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
    _agree("".join(body).encode())


@needs_native
def test_native_reader_reads_the_layout_capalarm_writes() -> None:
    rows = [
        '{"ts": 1767571205.5, "surface": "pip-cache", "bytes": 4096, "events": 3, "kind": "fs"}',
        '{"ts":1767571215,"surface":"proxy","bytes":12,"contributor":"10.0.0.1"}',
        "",
        '{"ts":1767571225,"surface":"proxy","bytes":99999999999999999999}',  # implausible
    ]
    fast = _agree(("\n".join(rows) + "\n").encode())
    assert fast.handed_back == 0, "the native reader handed back the layout it exists for"
    assert (fast.lines, fast.records, fast.parse_errors) == (4, 2, 1)
    assert fast.subjects == [("fs", "pip-cache", ""), (None, "proxy", "10.0.0.1")]
    assert fast.events.tolist() == [3, 1]


FIVE = {
    "ts": "1767571205",
    "surface": '"pip-cache"',
    "bytes": "4096",
    "events": "3",
    "kind": '"fs"',
}


@needs_native
@pytest.mark.parametrize("sep,colon", [(",", ":"), (", ", ": "), (" ,\t", "\t: ")])
def test_every_key_order_is_read_natively(sep: str, colon: str) -> None:
    """All 120 orders of the five keys (issue 26: `kind` before `bytes` went to json.loads
    at a fifth of the rate): the events json.loads reads, none handed back."""
    body = []
    for i, order in enumerate(itertools.permutations(FIVE)):
        values = {**FIVE, "ts": str(1767571205 + i)}
        body.append("{" + sep.join(f'"{k}"{colon}{values[k]}' for k in order) + "}\n")
    data = "".join(body).encode()
    fast = _agree(data)
    assert fast.handed_back == 0
    assert (fast.lines, fast.records, fast.parse_errors) == (120, 120, 0)
    assert fast.subjects == [("fs", "pip-cache", "")]
    want = [json.loads(line) for line in body]
    assert fast.ts.tolist() == [float(d["ts"]) for d in want]
    assert fast.nbytes.tolist() == [d["bytes"] for d in want]
    assert fast.events.tolist() == [d["events"] for d in want]


# Lines the native reader reads itself (True) or must hand back (False); either way the result
# is json.loads'.
HOSTILE = [
    # duplicate keys: the last wins, as in json.loads' dict
    ('{"ts":1,"surface":"a","bytes":1,"bytes":7}', True),
    ('{"ts":1,"surface":"a","bytes":"x","bytes":7}', True),
    ('{"ts":1,"surface":"a","bytes":7,"bytes":"x"}', False),
    ('{"surface":"a","ts":1,"surface":"b","bytes":2,"kind":"fs","kind":null}', True),
    ('{"ts":1,"surface":"a","bytes":1,"ts":-5}', True),  # implausible after all
    # unknown keys, nested, with escapes, literals, numbers of every form
    ('{"ts":1,"x":{"y":[1,-2.5e-3,{"z":"\\"}\\u00e9\\n"}],"w":[]},"surface":"a","bytes":1}', True),
    (
        '{"ts":1,"surface":"a","bytes":1,"n":NaN,"i":Infinity,"j":-Infinity,"t":[true,false,null]}',
        True,
    ),
    ('{"ts":1,"surface":"a","bytes":1,"é\\u00e9":"日本"}', False),  # an escape in a key
    ('{"ts":1,"surface":"a","bytes":1,"日本":"日本"}', True),
    ('{"t\\u0073":1,"surface":"a","bytes":1}', False),  # "ts", escaped
    ('{"ts":1,"surface":"a","bytes":1,"deep":' + "[" * 60 + "]" * 60 + "}", True),
    ('{"ts":1,"surface":"a","bytes":1,"deep":' + "[" * 100 + "]" * 100 + "}", False),
    ('{"ts":1,"surface":"a","bytes":1,"deep":' + "[" * 5000 + "]" * 5000 + "}", False),
    ('{"ts":1,"surface":"a","bytes":1,"kind":' + "[" * 5000 + "]" * 5000 + "}", False),
    # escapes and characters in names
    ('{"ts":1,"surface":"caf\\u00e9","bytes":1}', False),
    ('{"ts":1,"surface":"café","kind":"fs","contributor":"ü","bytes":1}', True),
    ('{"ts":1,"surface":"\\ud800","bytes":1}', False),  # a lone surrogate
    ('{"ts":1,"surface":"\\ud83d\\ude00","bytes":1}', False),  # a pair
    ('{"ts":1,"surface":"\\udc00\\ud800x","bytes":1}', False),
    ('{"ts":1,"surface":"a\\x","bytes":1}', False),  # an invalid escape
    ('{"ts":1,"surface":"a\\u12","bytes":1}', False),
    ('{"ts":1,"surface":"a\\","bytes":1}', False),
    ('{"ts":1,"surface":"a\tb","bytes":1}', False),  # a raw control character
    ('{"ts":1,"surface":"a\x0cb","bytes":1}', False),  # str.splitlines splits there
    ('{"ts":1,"surface":"a\x85b","bytes":1}', False),
    ('{"ts":1,"surface":"a\u2028b","bytes":1}', False),
    ('{"ts":1,"surface":"a\x7fb","bytes":1}', True),
    ("\ufeff" + '{"ts":1,"surface":"a","bytes":1}', False),  # a byte-order mark
    ('{"ts":1,"surface":"a","bytes":1}\xa0', False),  # not JSON whitespace
    ('\t {"ts":1,"surface":"a","bytes":1}\t ', True),
    ("\t \xa0", False),  # blank for str.strip
    (" \t", True),  # blank
    ("\r", True),
    # numbers
    ('{"ts":1e400,"surface":"a","bytes":1}', True),
    ('{"ts":' + "9" * 70 + ',"surface":"a","bytes":1}', False),
    ('{"ts":' + "9" * 5000 + ',"surface":"a","bytes":1}', False),
    ('{"ts":1,"surface":"a","bytes":' + "9" * 5000 + "}", True),
    ('{"ts":1,"surface":"a","bytes":-0,"events":-0}', True),
    ('{"ts":-0,"surface":"a","bytes":1}', True),
    ('{"ts":-0.0,"surface":"a","bytes":1}', True),
    ('{"ts":-0e5,"surface":"a","bytes":1}', True),
    ('{"ts":0.1e1,"surface":"a","bytes":1}', True),
    ('{"ts":1,"surface":"a","bytes":-3}', True),
    ('{"ts":1,"surface":"a","bytes":1.9}', False),  # int(1.9)
    ('{"ts":1,"surface":"a","bytes":1e3}', False),
    ('{"ts":1,"surface":"a","bytes":true}', False),  # int(True)
    ('{"ts":007,"surface":"a","bytes":1}', False),
    ('{"ts":1.,"surface":"a","bytes":1}', False),
    ('{"ts":1e,"surface":"a","bytes":1}', False),
    ('{"ts":.5,"surface":"a","bytes":1}', False),
    ('{"ts":+1,"surface":"a","bytes":1}', False),
    ('{"ts":NaN,"surface":"a","bytes":1}', False),
    ('{"ts":Infinity,"surface":"a","bytes":1}', False),
    ('{"ts":-Infinity,"surface":"a","bytes":1}', False),
    ('{"ts":"1767571205","surface":"a","bytes":"12"}', False),  # float("..."), int("...")
    ('{"ts":"١٢","surface":"a","bytes":1}', False),
    ('{"ts":1,"surface":"a","bytes":1,"events":NaN}', False),
    # other types and missing keys
    ('{"ts":1,"surface":null,"bytes":1}', False),  # str(None)
    ('{"ts":1,"surface":5,"bytes":1}', False),
    ('{"ts":1,"surface":"a","bytes":1,"kind":null,"contributor":null}', True),
    ('{"ts":1,"surface":"a","bytes":1,"kind":5,"contributor":[1]}', False),
    ('{"ts":1,"surface":"a","bytes":1,"kind":""}', True),
    ('{"ts":1,"surface":"a"}', True),  # bytes 0
    ('{"ts":1,"bytes":1}', False),
    ('{"surface":"a","bytes":1}', False),
    ("{}", False),
    ("{ }", False),
    ("[]", False),
    ('"x"', False),
    ("5", False),
    ("null", False),
    # truncated and malformed lines
    ('{"ts":1,"surface":"a","bytes":1', False),
    ('{"ts":1,"surface":"a","bytes":', False),
    ('{"ts":1,"surface":"a', False),
    ("{", False),
    ('{"ts":1,"surface":"a","bytes":1,}', False),
    ('{"ts":1,,"surface":"a","bytes":1}', False),
    ('{"ts" 1,"surface":"a","bytes":1}', False),
    ('{"ts":1 "surface":"a","bytes":1}', False),
    ('{ts:1,"surface":"a","bytes":1}', False),
    ('{"ts":1,"surface":"a","bytes":1}}', False),
    ('{"ts":1,"surface":"a","bytes":1} x', False),
    ('{"ts":1,"surface":"a","bytes":1,"x":[1,]}', False),
    ('{"ts":1,"surface":"a","bytes":1,"x":tru}', False),
    ('{"ts":1,"surface":"a","bytes":1,"x":nan}', False),
    ('{"ts":1,"surface":"a","bytes":1}\r', True),
    ('{"ts":1,"surface":"a","bytes":1}\rx', False),
]


@needs_native
@pytest.mark.parametrize("line,native", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_lines_read_as_json_loads_reads_them(line: str, native: bool) -> None:
    good = '{"kind":"fs","bytes":12,"ts":1767571205,"surface":"x","events":2}\n'
    data = (good + line + "\n" + good).encode("utf-8", "surrogatepass")
    fast = _agree(data)
    assert fast.handed_back == (0 if native else 1), "handed back" if native else "read"
    # Without its neighbours, and without a final newline.
    _agree(line.encode("utf-8", "surrogatepass"))


@needs_native
@pytest.mark.parametrize(
    "data",
    [
        b'{"ts":1,"surface":"a\xff","bytes":1}\n',  # not UTF-8
        b'{"ts":1,"surface":"a\xe2\x80","bytes":1}\n',
        b'{"ts":1,"surface":"a\xed\xa0\x80","bytes":1}\n',  # a surrogate in UTF-8
        b'{"ts":1,"surface":"a\xc0\xaf","bytes":1}\n',  # overlong
        b'{"ts":1,"surface":"a\xf4\x90\x80\x80","bytes":1}\n',  # past U+10FFFF
        b'{"ts":1,"surface":"a\xe2\x80\n',  # cut inside a character, then a newline
        b'{"ts":1,"surface":"a\x00","bytes":1}\n',
        b"\x1c\n\x1d\x1e\n",
    ],
)
def test_bytes_python_decodes_otherwise_are_handed_back(data: bytes) -> None:
    assert _agree(data).handed_back > 0


def _fuzz_value(rng: random.Random) -> str:
    """A JSON value of any type, now and then nested."""
    pick = rng.randrange(9)
    if pick == 0:
        return rng.choice(["true", "false", "null", "NaN", "Infinity", "-Infinity"])
    if pick == 1:
        return f"[{', '.join(_fuzz_value(rng) for _ in range(rng.randrange(3)))}]"
    if pick == 2:
        items = (f'"k{rng.randrange(3)}": {_fuzz_value(rng)}' for _ in range(rng.randrange(3)))
        return "{" + ",".join(items) + "}"
    if pick in (3, 4):
        return json.dumps(rng.choice(["", "a", "é", "x\\y", 'q"', "\ud800", "日本", "\t"]))
    return rng.choice(
        [str(rng.randrange(-5, 2**63)), f"{rng.uniform(0, 2e9):.3f}", "1e400", "-0", "0.5e1"]
    )


def _fuzz_line(rng: random.Random) -> tuple[str, bool]:
    """A random line, and whether the native reader must read it itself (no escape in a
    name, no other type for a known key, no damage)."""
    clean = True
    name = rng.choice(["s1", "s2", "é", "", "a b", "x\\y"])
    ascii_only = rng.random() < 0.2
    clean = not ascii_only or name.isascii()
    fields = {
        "ts": rng.choice([str(rng.randrange(0, 2 * 10**11)), f"{rng.uniform(0, 2e9):.6f}"]),
        "surface": json.dumps(name, ensure_ascii=ascii_only),
        "bytes": str(rng.choice([0, 1, rng.randrange(2**63), 2**62, 2**62 + 1])),
    }
    clean = clean and "\\" not in name
    for key in ("events", "kind", "contributor"):
        if rng.random() < 0.5:
            fields[key] = (
                str(rng.randrange(0, 5)) if key == "events" else json.dumps(rng.choice(["fs", ""]))
            )
    for key in list(fields):
        if rng.random() < 0.05:
            fields[key] = _fuzz_value(rng)  # another type
            clean = False
    for _ in range(rng.choice([0, 0, 1, 2])):
        fields[f"x{rng.randrange(3)}"] = _fuzz_value(rng)
    items = list(fields.items())
    if rng.random() < 0.1:
        items.append(rng.choice(items[:3]))  # a duplicate key
    rng.shuffle(items)
    ws = [rng.choice(["", " ", "\t", "  "]) for _ in range(4)]
    body = f"{ws[0]},{ws[1]}".join(f'"{k}"{ws[2]}:{ws[3]}{v}' for k, v in items)
    line = rng.choice(["", " "]) + "{" + ws[1] + body + ws[0] + "}" + rng.choice(["", "\t"])
    if rng.random() < 0.1:  # damaged: cut, a byte changed, a byte inserted
        i = rng.randrange(len(line) + 1)
        line = rng.choice([line[:i], line[:i] + rng.choice(',:{}[]"\\x0\x00\x0c') + line[i + 1 :]])
        clean = False
    return line + rng.choice(["\n", "\n", "\r\n"]), clean


@needs_native
def test_differential_fuzz_against_json_loads() -> None:
    """A few thousand random lines (any key order, whitespace, value types, duplicates,
    damage), in chunks: the native reader's result is json.loads', and it reads the lines
    that are plain write events itself."""
    rng = random.Random(26)
    body, clean = zip(*(_fuzz_line(rng) for _ in range(4000)), strict=True)
    data = "".join(body).encode("utf-8", "surrogatepass")
    whole = _agree(data)
    for start in range(0, len(body), 250):
        _agree("".join(body[start : start + 250]).encode("utf-8", "surrogatepass"))
    assert whole.records > 1000 and whole.parse_errors > 1000
    plain = [line for line, ok in zip(body, clean, strict=True) if ok]
    assert len(plain) > 2000
    read = _agree("".join(plain).encode())
    assert read.handed_back == 0 and read.records > 1000
