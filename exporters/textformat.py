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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from types import ModuleType

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
    return native_module


def code_path() -> str:
    """What a benchmark says it measured."""
    if native_module is None:
        return "python series lines (exporters._textformat not built)"
    if native_series() is None:
        return "python series lines (native formatting disagrees with prometheus_client)"
    return "native series lines (exporters/_textformat.c)"


class Columns:
    """A metric family as columns: one label tuple and one value per series."""

    __slots__ = ("documentation", "label_names", "name", "rows", "type", "values")

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        label_names: Sequence[str],
        rows: list[tuple[str, ...]],
        values: list[float],
    ):
        if len(rows) != len(values):
            raise ValueError(f"{name}: {len(rows)} label sets for {len(values)} values")
        self.name = name  # without the _total of a counter, as prometheus_client's families
        self.documentation = documentation
        self.type = typ
        self.label_names = tuple(label_names)
        self.rows = rows
        self.values = values

    def metric(self) -> Metric:
        """The same family as prometheus_client's (for its OpenMetrics writer)."""
        fam = Metric(self.name, self.documentation, self.type)
        sample = self.name + ("_total" if self.type == "counter" else "")
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
        name = fam.name + ("_total" if fam.type == "counter" else "")
        self.header(name, fam.documentation, _TYPES[fam.type])
        names, value = fam.label_names, self.value
        texts = self._row_texts(names, fam.rows) if names else None
        values = fam.values if isinstance(fam.values, list) else list(fam.values)
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


__all__ = ["Columns", "code_path", "escape_label_value", "native_series", "render_text"]
