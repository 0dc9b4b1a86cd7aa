"""YAML as the config files are read: safe types only, a key given twice in one mapping is an
error naming the key and both lines, and so is nesting too deep to read.

PyYAML keeps the last of two equal keys without a word, so ``tick: 10s`` above a forgotten
``tick: 1h`` silently runs hourly.  Prometheus and the exporter-toolkit read their files
with Go's strict YAML, which refuses such a file ("already set in map"); these files are
written next to theirs, so they are read the same way.
"""

from __future__ import annotations

from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:  # '<<: *defaults' may be overridden key by key
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                mark = first.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if mark is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice (first on line {mark.line + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def load_yaml(text: str, name: str = "the YAML text") -> Any:
    """``text``'s YAML document; yaml.YAMLError when it is not YAML, repeats a key or nests
    deeper than the parser's recursion can follow (PyYAML raises RecursionError there).
    Positions in the error name ``name`` (the file), not PyYAML's "<unicode string>"."""
    loader = _StrictLoader(text)
    loader.name = name  # the reader stamps every mark (line, column) with this
    try:
        return loader.get_single_data()
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to read") from None
    finally:
        loader.dispose()
