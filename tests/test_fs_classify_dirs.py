"""The fs classifier decides a surface once per directory where the directory decides it
(alarm/classify/fs.py): every path must still land where classifying it whole puts it, for
trees and globs, a tree that is a file, ``/``, source filters and names the workload chose."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from alarm.classify.fs import BY_NAME, FsClassifier, FsMatch
from alarm.events import KeyedSubjects

SEGMENTS = ["srv", "scratch", "a", "b", "x.whl", "pip", "cache", "weird name", "\udcff", ".."]
PATTERN_PARTS = [*SEGMENTS, "*", "**", "?", "*.whl", "[ab]", "[!a]"]


def paths() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=5).map(
        lambda parts: "/" + "/".join(parts)
    )


def patterns() -> st.SearchStrategy[str]:
    return st.one_of(
        st.just("/"),
        st.lists(st.sampled_from(PATTERN_PARTS), min_size=1, max_size=4).map(
            lambda parts: "/" + "/".join(parts)
        ),
    )


def matches() -> st.SearchStrategy[FsMatch]:
    return st.builds(
        lambda path, source: FsMatch(path=path, source=source),
        st.lists(patterns(), max_size=3),
        st.lists(st.sampled_from(["w1", "w2"]), max_size=1),
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(matches(), min_size=1, max_size=4), st.lists(paths(), min_size=1, max_size=30))
def test_per_directory_classification_is_the_per_path_one(rules, keys):
    c = FsClassifier([f"s{i}" for i in range(len(rules))], rules)
    for source in ("w1", "w2"):
        got = c.classify(KeyedSubjects(keys, keys), source).tolist()
        fresh = FsClassifier(c.surfaces, rules)
        assert got == [fresh.classify_key(k, source) for k in keys]


def test_a_directory_of_a_tree_surface_is_decided_once():
    """10,000 files in one directory of a tree surface: decided by the directory."""
    c = FsClassifier(["scratch"], [FsMatch(path=["/srv/scratch"])])
    keys = [f"/srv/scratch/d/f{i}" for i in range(10_000)]
    assert c.classify(KeyedSubjects(keys, keys), "w").tolist() == [0] * len(keys)
    assert c.classify_dir("/srv/scratch/d") == 0
    # A directory holding a tree that is a file: its other files are not on that surface.
    f = FsClassifier(["one"], [FsMatch(path=["/srv/one.bin"])])
    assert f.classify_dir("/srv") == BY_NAME
    got = f.classify(KeyedSubjects(["/srv/one.bin", "/srv/two.bin"], ["a", "b"]), "w")
    assert got.tolist() == [0, -1]
