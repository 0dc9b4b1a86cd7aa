"""The Prometheus text format (0.0.4), written fast.

What prometheus_client's ``exposition.generate_latest`` writes for the same families, byte for
byte (tests/test_textformat.py compares the two), at a fraction of its cost.  At 10,000
surfaces a scrape is 270,000 series, at 100,000 2.7 million; generate_latest validates and
escapes every name and label of every sample (about 30 µs each), and building a Sample per
series costs as much again.  Here the big families are ``Columns`` (label tuples and values,
no Sample objects); a label set's text is made once per scrape — the same surface labels recur
in every per-surface family — and a value's text once per distinct value.

OpenMetrics is still written by prometheus_client, from ``Columns.metric()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# Samples that the text format moves into a gauge family of their own, after the family.
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"counter": "counter", "gauge": "gauge", "info": "gauge", "unknown": "untyped"}


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
    def __init__(self) -> None:
        self.out: list[str] = []
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
            kept = (rows, [self.labels(names, row) for row in rows])
            self._rows[id(rows)] = kept
        return kept[1]

    def header(self, name: str, documentation: str, typ: str) -> None:
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        self.out.append(f"# HELP {name} {doc}\n# TYPE {name} {typ}\n")

    def columns(self, fam: Columns) -> None:
        name = fam.name + ("_total" if fam.type == "counter" else "")
        self.header(name, fam.documentation, _TYPES[fam.type])
        names, value = fam.label_names, self.value
        if names:
            texts = self._row_texts(names, fam.rows)
            self.out.extend(
                f"{name}{text} {value(v)}\n" for text, v in zip(texts, fam.values, strict=True)
            )
        else:
            self.out.extend(f"{name} {value(v)}\n" for v in fam.values)

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
                self.out.append(line)
        for suffix, lines in sorted(moved.items()):
            self.header(metric.name + suffix, metric.documentation, "gauge")
            self.out.extend(lines)

    def _sample(self, s: Sample) -> str:
        labels = ""
        if s.labels:
            names = tuple(s.labels)
            labels = self.labels(names, tuple(s.labels[k] for k in names))
        stamp = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
        return f"{s.name}{labels} {self.value(s.value)}{stamp}\n"


def render_text(families: Iterable[Metric | Columns]) -> bytes:
    """The text format of ``families`` (counters, gauges, info and untyped; a family of
    another type is refused with ValueError, since this writer has not been checked on it)."""
    w = _Writer()
    for fam in families:
        if fam.type not in _TYPES:
            raise ValueError(f"{fam.name}: metric type {fam.type} is not written here")
        if isinstance(fam, Columns):
            w.columns(fam)
        else:
            w.metric(fam)
    return "".join(w.out).encode("utf-8")


__all__ = ["Columns", "escape_label_value", "render_text"]
