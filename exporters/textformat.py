"""The Prometheus text format (0.0.4), written fast.

What prometheus_client's ``exposition.generate_latest`` writes for the same families, byte for
byte (tests/test_textformat.py compares the two), at a fraction of its cost.  At 10,000
surfaces a scrape is 280,000 series, at 100,000 2.8 million; generate_latest validates and
escapes every name and label of every sample (about 30 µs each), and building a Sample per
series costs as much again.  Here the big families are ``Columns`` (label tuples and values,
no Sample objects); a list of label sets is made into text once per scrape, from one template
— the same surface labels recur in every per-surface family.

A column family's series lines are written natively where the extension was built
(exporters/_textformat.c: 2.8 million lines at 100,000 surfaces), in Python elsewhere; the
native value formatting is checked against the installed prometheus_client's on a few probe
values at every render, and the Python lines are written where the two disagree.

OpenMetrics is still written by prometheus_client, from ``Columns.metric()``.

``ScrapeCache`` writes the same bytes at a cost proportional to what changed: it keeps every
column family's series lines between scrapes (one bytes object per series, grouped in blocks of
``BLOCK_ROWS``), compares each family's values with the last scrape's bit for bit, rewrites only
the lines whose value or labels changed and joins again only the blocks that hold one.  Asked
for gzip, each block is deflated on its own (a fresh compressor, ended by a sync flush: byte
aligned, no reference into another block) and kept; the body is one gzip member made of the
kept blocks (pigz's technique), so an unchanged block is never compressed twice.
"""

from __future__ import annotations

import math
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

try:  # built by pip where a compiler is
    from exporters import _textformat as native_module
except ImportError:  # pragma: no cover - exercised where the extension was not built
    native_module = None

# Samples that the text format moves into a gauge family of their own, after the family.
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"counter": "counter", "gauge": "gauge", "info": "gauge", "unknown": "untyped"}
# What the text format appends to a family's name on its samples.
_SUFFIX = {"counter": "_total", "info": "_info"}
# Values whose text floatToGoString has changed across prometheus_client's versions (Go's
# exponent form), and the special ones: the native writer is used only if it agrees on all.
_PROBES = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.1,
    5e-324,
    123456.0,
    1234567.0,
    12345678.9,
    1e15,
    1e16,
    1e21,
    1.7976931348623157e308,
    -1234567.0,
    math.inf,
    -math.inf,
    math.nan,
    100.25,
    2.0**53,
)


def native_series() -> ModuleType | None:
    """The native series writer, if built and it formats values as prometheus_client does."""
    if native_module is None:
        return None
    want = "".join(f"x {floatToGoString(v)}\n" for v in _PROBES).encode()
    if native_module.series(b"x", None, list(_PROBES)) != want:
        return None
    probes = np.array(_PROBES, dtype=np.float64)
    if native_module.block(b"x", None, probes, None, None, None)[0] != want:
        return None
    return native_module


def code_path() -> str:
    """What a benchmark says it measured."""
    if native_module is None:
        return "python series lines (exporters._textformat not built)"
    if native_series() is None:
        return "python series lines (native formatting disagrees with prometheus_client)"
    return "native series lines (exporters/_textformat.c)"


class Columns:
    """A metric family as columns: one label tuple and one value per series (the values a
    list or a float64 array: the snapshot's columns are passed as they are)."""

    __slots__ = ("documentation", "label_names", "name", "rows", "type", "values")

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        label_names: Sequence[str],
        rows: list[tuple[str, ...]],
        values: list[float] | np.ndarray,
    ):
        if len(rows) != len(values):
            raise ValueError(f"{name}: {len(rows)} label sets for {len(values)} values")
        # Without the _total of a counter or the _info of an info family, as prometheus_client's.
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.label_names = tuple(label_names)
        self.rows = rows
        self.values = values

    @property
    def sample_name(self) -> str:
        return self.name + _SUFFIX.get(self.type, "")

    def metric(self) -> Metric:
        """The same family as prometheus_client's (for its OpenMetrics writer)."""
        fam = Metric(self.name, self.documentation, self.type)
        sample = self.sample_name
        names = self.label_names
        fam.samples = [
            Sample(sample, dict(zip(names, row, strict=True)), float(v))
            for row, v in zip(self.rows, self.values, strict=True)
        ]
        return fam


def escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Writer:
    def __init__(self, native: ModuleType | None) -> None:
        self.out: list[bytes] = []
        self._native = native
        self._labels: dict[tuple, str] = {}
        self._values: dict[float, str] = {}
        # Label texts of a whole rows list, by identity: families that share one (every
        # per-surface family shares the surfaces') render their labels once.  The list is
        # kept so that its id is not reused while this writer lives.
        self._rows: dict[int, tuple[list, list[str]]] = {}

    def value(self, v: float) -> str:
        text = self._values.get(v)
        if text is None:
            text = floatToGoString(v)
            # NaN is never found again, and -0.0 would be found as 0.0: neither is kept.
            if v == v and v != 0:
                self._values[v] = text
        return text

    def labels(self, names: tuple[str, ...], row: tuple[str, ...]) -> str:
        key = (names, row)
        text = self._labels.get(key)
        if text is None:
            # Sorted by label name, as prometheus_client writes them.
            pairs = sorted(zip(names, row, strict=True))
            text = "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs) + "}"
            self._labels[key] = text
        return text

    def _row_texts(self, names: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
        kept = self._rows.get(id(rows))
        if kept is None or kept[0] is not rows:
            kept = (rows, self._texts_of(names, rows))
            self._rows[id(rows)] = kept
        return kept[1]

    def _texts_of(self, names: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
        """``labels(names, row)`` for every row, the label order and the text around the
        values worked out once for the whole list (a scrape makes 800,000 of these at
        100,000 surfaces), and escaping looked for once in the whole list: hostile names
        are rare.  Names are checked by the collectors, never escaped."""
        if len(set(names)) != len(names):  # equal names sort by value too: the slow way
            return [self.labels(names, row) for row in rows]
        order = sorted(range(len(names)), key=names.__getitem__)
        fields = (names[i].replace("%", "%%") for i in order)
        template = "{" + ",".join(f'{n}="%s"' for n in fields) + "}"
        if order != list(range(len(names))):
            rows = [tuple(row[i] for i in order) for row in rows]
        elif not all(type(row) is tuple for row in rows):  # ``%`` takes a tuple's items
            rows = [tuple(row) for row in rows]
        every = "\0".join("\0".join(row) for row in rows)
        if "\\" in every or "\n" in every or '"' in every:
            rows = [tuple(map(escape_label_value, row)) for row in rows]
        return [template % row for row in rows]

    def header(self, name: str, documentation: str, typ: str) -> None:
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        self.out.append(f"# HELP {name} {doc}\n# TYPE {name} {typ}\n".encode())

    def columns(self, fam: Columns) -> None:
        name = fam.sample_name
        self.header(name, fam.documentation, _TYPES[fam.type])
        names, value = fam.label_names, self.value
        texts = self._row_texts(names, fam.rows) if names else None
        values = fam.values.tolist() if isinstance(fam.values, np.ndarray) else list(fam.values)
        if self._native is not None:
            self.out.append(self._native.series(name.encode(), texts, values))
        elif texts is not None:
            lines = (f"{name}{t} {value(v)}\n" for t, v in zip(texts, values, strict=True))
            self.out.append("".join(lines).encode())
        else:
            self.out.append("".join(f"{name} {value(v)}\n" for v in values).encode())

    def metric(self, metric: Metric) -> None:
        name = metric.name
        if metric.type == "counter":
            name += "_total"
        elif metric.type == "info":
            name += "_info"
        self.header(name, metric.documentation, _TYPES[metric.type])
        moved: dict[str, list[str]] = {}
        for s in metric.samples:
            line = self._sample(s)
            for suffix in _OPENMETRICS_SUFFIXES:
                if s.name == metric.name + suffix:
                    moved.setdefault(suffix, []).append(line)
                    break
            else:
                self.out.append(line.encode())
        for suffix, lines in sorted(moved.items()):
            self.header(metric.name + suffix, metric.documentation, "gauge")
            self.out.append("".join(lines).encode())

    def _sample(self, s: Sample) -> str:
        labels = ""
        if s.labels:
            names = tuple(s.labels)
            labels = self.labels(names, tuple(s.labels[k] for k in names))
        stamp = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
        return f"{s.name}{labels} {self.value(s.value)}{stamp}\n"


def render_text(families: Iterable[Metric | Columns], native: bool = True) -> bytes:
    """The text format of ``families`` (counters, gauges, info and untyped; a family of
    another type is refused with ValueError, since this writer has not been checked on it).
    ``native``: the series lines natively where that is possible (``native_series``)."""
    w = _Writer(native_series() if native else None)
    for fam in families:
        if fam.type not in _TYPES:
            raise ValueError(f"{fam.name}: metric type {fam.type} is not written here")
        if isinstance(fam, Columns):
            w.columns(fam)
        else:
            w.metric(fam)
    return b"".join(w.out)


# Series lines per block of a family: the unit that is joined again, and deflated again, when
# one of its lines changed.  4096 lines of ~80 bytes: ~330 kB, a millisecond or two to deflate.
BLOCK_ROWS = 4096
# zlib level of a gzip body: 1 deflates these lines about as small as 6 does (the label text
# repeats), several times faster.
GZIP_LEVEL = 1
# A gzip member's header (RFC 1952: deflate, no name, no time, unknown OS) and the end of its
# deflate stream (a final, empty fixed-Huffman block).
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_DEFLATE_END = b"\x03\x00"
# Above this share of a family's rows with other labels, its lines are all made again.
_REBUILD_SHARE = 0.25


def deflate_block(text: bytes, level: int = GZIP_LEVEL) -> bytes:
    """``text`` as raw deflate blocks that end byte-aligned and not final: any number of
    them, in order, then ``_DEFLATE_END``, is one deflate stream of their texts."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH)


@dataclass(slots=True)
class _Block:
    text: bytes
    starts: bytes = b""  # where each line starts, n + 1 native int64 (column blocks only)
    deflated: bytes | None = None  # made when a scrape asks for gzip, kept until text changes

    def gz(self, level: int) -> bytes:
        if self.deflated is None:
            self.deflated = deflate_block(self.text, level)
        return self.deflated


@dataclass(slots=True)
class _Family:
    """One column family as the last scrape wrote it."""

    head: _Block
    name: bytes  # of its samples
    label_names: tuple[str, ...]
    rows: list[tuple[str, ...]]
    labels: list[bytes] | None  # each row's label text, shared by families of one rows list
    values: np.ndarray  # float64, compared bit for bit
    blocks: list[_Block] = field(default_factory=list)
    seen: int = 0  # the scrape that last wrote it


@dataclass(slots=True)
class ScrapeStats:
    """What the last render did (the bench and the tests read it)."""

    series: int = 0
    lines_written: int = 0  # series lines formatted again
    blocks_written: int = 0
    blocks_deflated: int = 0
    families_rebuilt: int = 0


class ScrapeCache:
    """The text format of a scrape's families, at a cost proportional to what changed since
    the last one (see the module's docstring).  One per HTTP server; thread-safe (renders are
    serialised: a second scraper waits and then finds almost nothing to do).  It holds about
    what the body holds, plus 24 bytes a series."""

    def __init__(
        self, native: bool = True, block_rows: int = BLOCK_ROWS, level: int = GZIP_LEVEL
    ) -> None:
        self._native = native_series() if native else None
        self._block_rows = block_rows
        self._level = level
        self._families: dict[str, _Family] = {}
        self._scrape = 0
        self._lock = threading.Lock()
        # Label texts made in this scrape, by the rows lists (old, new) they were made for.
        self._labels: dict[tuple[int, int], tuple[list, list[bytes], np.ndarray | None]] = {}
        self.stats = ScrapeStats()

    def render(self, families: Iterable[Metric | Columns], gzip: bool = False) -> bytes:
        """The body: what ``render_text(families)`` writes, gzip-compressed when asked."""
        with self._lock:
            self._scrape += 1
            self.stats = ScrapeStats()
            self._labels = {}
            pieces: list[_Block] = []
            for fam in families:
                if fam.type not in _TYPES:
                    raise ValueError(f"{fam.name}: metric type {fam.type} is not written here")
                if isinstance(fam, Columns):
                    pieces += self._columns(fam)
                else:  # small families (sources, notifiers, the process): written afresh
                    w = _Writer(None)
                    w.metric(fam)
                    pieces.append(_Block(b"".join(w.out)))
            self._labels = {}
            # Families not written this time (a mode changed, a family emptied) are forgotten.
            for name in [n for n, f in self._families.items() if f.seen != self._scrape]:
                del self._families[name]
            if not gzip:
                return b"".join(p.text for p in pieces)
            crc, size, out = 0, 0, [_GZIP_HEADER]
            for p in pieces:
                if p.text:
                    crc = zlib.crc32(p.text, crc)
                    size += len(p.text)
                    if p.deflated is None:
                        self.stats.blocks_deflated += 1
                    out.append(p.gz(self._level))
            out += [_DEFLATE_END, struct.pack("<II", crc, size & 0xFFFFFFFF)]
            return b"".join(out)

    def _columns(self, fam: Columns) -> list[_Block]:
        values = np.asarray(fam.values, dtype=np.float64)
        n = len(values)
        self.stats.series += n
        head = self._head(fam)
        c = self._families.get(fam.sample_name)
        if c is None or c.label_names != fam.label_names or len(c.rows) != n:
            c = self._new_family(fam, values, head)
        else:
            if c.head.text != head:
                c.head = _Block(head)
            changed = np.flatnonzero(values.view(np.int64) != c.values.view(np.int64))
            labels, relabelled = self._labels_of(fam, c)
            if relabelled is None:
                c = self._new_family(fam, values, head)
            else:
                if len(relabelled):
                    changed = np.union1d(changed, relabelled)
                c.rows, c.labels, c.values = fam.rows, labels, values
                self._write(c, changed)
        c.seen = self._scrape
        self._families[fam.sample_name] = c
        return [c.head, *c.blocks]

    @staticmethod
    def _head(fam: Columns) -> bytes:
        w = _Writer(None)
        w.header(fam.sample_name, fam.documentation, _TYPES[fam.type])
        return w.out[0]

    def _labels_of(
        self, fam: Columns, c: _Family | None
    ) -> tuple[list[bytes] | None, np.ndarray | None]:
        """``fam``'s label texts, and the rows whose labels differ from ``c``'s (None: too
        many, or no ``c``: every line is written again).  Made once per rows list a scrape."""
        if not fam.label_names:
            return None, np.zeros(0, dtype=np.int64)
        old = c.rows if c is not None else None
        key = (id(old), id(fam.rows))
        kept = self._labels.get(key)
        if kept is not None and kept[0] is fam.rows:
            return kept[1], kept[2]
        if c is not None and c.labels is not None and (old is fam.rows or old == fam.rows):
            labels, relabelled = c.labels, np.zeros(0, dtype=np.int64)
        elif c is not None and c.labels is not None and len(old) == len(fam.rows):
            moved = [i for i, (a, b) in enumerate(zip(old, fam.rows, strict=True)) if a != b]
            if len(moved) > _REBUILD_SHARE * len(old):
                labels, relabelled = self._texts(fam, fam.rows), None
            else:
                labels = list(c.labels)
                for i, t in zip(moved, self._texts(fam, [fam.rows[i] for i in moved]), strict=True):
                    labels[i] = t
                relabelled = np.array(moved, dtype=np.int64)
        else:
            labels, relabelled = self._texts(fam, fam.rows), None
        self._labels[key] = (fam.rows, labels, relabelled)
        return labels, relabelled

    @staticmethod
    def _texts(fam: Columns, rows: list[tuple[str, ...]]) -> list[bytes]:
        return [t.encode() for t in _Writer(None)._texts_of(fam.label_names, rows)]

    def _new_family(self, fam: Columns, values: np.ndarray, head: bytes) -> _Family:
        self.stats.families_rebuilt += 1
        labels, _ = self._labels_of(fam, None)
        c = _Family(
            head=_Block(head),
            name=fam.sample_name.encode(),
            label_names=fam.label_names,
            rows=fam.rows,
            labels=labels,
            values=values,
        )
        self._write(c, None)
        return c

    def _write(self, c: _Family, changed: np.ndarray | None) -> None:
        """The blocks holding a line in ``changed`` (every block when None), written again:
        only those lines formatted, the rest copied."""
        b = self._block_rows
        n = len(c.values)
        count = -(-n // b)
        if changed is None or len(c.blocks) != count:
            todo: list[tuple[int, np.ndarray | None]] = [(k, None) for k in range(count)]
            c.blocks = [_Block(b"") for _ in range(count)]
            self.stats.lines_written += n
        else:
            which = changed // b
            cuts = np.flatnonzero(np.diff(which)) + 1
            todo = [
                (int(part[0] // b), part - (part[0] // b) * b)
                for part in np.split(changed, cuts)
                if len(part)
            ]
            self.stats.lines_written += len(changed)
        name = c.name
        for k, local in todo:
            lo, hi = k * b, min(n, (k + 1) * b)
            labels = None if c.labels is None else c.labels[lo:hi]
            values = c.values[lo:hi]
            old = c.blocks[k]
            if self._native is not None:
                if local is None or not old.starts:
                    text, starts = self._native.block(name, labels, values, None, None, None)
                else:
                    text, starts = self._native.block(
                        name, labels, values, old.text, old.starts, local
                    )
                c.blocks[k] = _Block(text, starts)
            else:
                w = _Writer(None)
                lines = (
                    name
                    + (labels[i] if labels is not None else b"")
                    + b" "
                    + w.value(float(values[i])).encode()
                    + b"\n"
                    for i in range(hi - lo)
                )
                c.blocks[k] = _Block(b"".join(lines))
        self.stats.blocks_written += len(todo)


__all__ = [
    "BLOCK_ROWS",
    "Columns",
    "ScrapeCache",
    "ScrapeStats",
    "code_path",
    "deflate_block",
    "escape_label_value",
    "native_series",
    "render_text",
]
