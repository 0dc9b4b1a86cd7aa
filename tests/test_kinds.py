"""Surface kinds are registered like source types (issue 29): a kind is one module in
alarm/kinds/ that declares ``KIND``, and everything that differs by kind reads the registry.
Before, kinds were literal lists in six places: the pipeline kept a tuple whose omission made
a source of a new kind crash-loop ("handed over 'board' events"), and the chart's helper
silently dropped a new kind's surfaces from both workloads' configs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from alarm.collectors import SOURCE_TYPES
from alarm.config import DEFAULT_BUDGETS, config_from_dict
from alarm.kind import Kind
from alarm.kinds import KINDS

ROOT = Path(__file__).resolve().parents[1]

# A new kind, whole: its match model, its classifier and its declaration, in one module.
BOARD = '''\
"""Kind ``board``: posts on a message board, classified by channel."""

from collections.abc import Sequence

import numpy as np

from alarm.events import KeyedSubjects
from alarm.kind import Kind, horizons
from alarm.settings import Strict


class BoardMatch(Strict):
    channel: list[str] = []


class BoardClassifier:
    kind = "board"

    def __init__(self, names: Sequence[str], matches: Sequence[BoardMatch]):
        self.surfaces = list(names)
        self._rules = [(i, frozenset(m.channel)) for i, m in enumerate(matches)]

    def classify(self, subjects: KeyedSubjects, source: str) -> np.ndarray:
        return np.array(
            [next((i for i, ch in self._rules if key[0] in ch), -1) for key in subjects.keys],
            dtype=np.int64,
        )


KIND = Kind(
    name="board",
    match=BoardMatch,
    classifier=BoardClassifier,
    budget=horizons(1e5, 8e6, (25e3, 64e6), (10e3, 256e6)),
    newsurface=(8e3, 16e6),
    workload="deployment",
    summary="posts on a message board",
)
'''

# Run against the copy with the board module: config, pipeline and detector, end to end.
PROBE = """\
import json
from alarm.config import ConfigError, config_from_dict
from alarm.events import Batch, Event, WriteEvents
from alarm.kinds import KINDS
from alarm.pipeline import Pipeline

out = {"kinds": list(KINDS)}
config = config_from_dict({
    "tick": "10s",
    "sources": [],
    "surfaces": [{"name": "posts", "kind": "board", "match": {"channel": ["general"]}}],
    "unclassified": {"board": {"allowance_bits_per_second": 100, "tolerance_bits": 65536}},
})
out["kinds_in_use"] = config.kinds_in_use()
try:
    config_from_dict({"surfaces": [{"name": "x", "kind": "board", "match": {"path": ["/"]}}]})
except ConfigError as exc:
    out["problem"] = exc.problems
p = Pipeline(config, {"poller": ("external", "board")})
now = 1_780_000_000.0
p.start(now)
rows = [
    Event(now, ("general", "p1"), 4000, "alice"),
    Event(now, ("random", "p2"), 90000, "mallory"),
]
p.apply("poller", Batch(WriteEvents.of("board", rows), watermark=now + 10), now)
changes = [c.to_dict() for r in p.close_until(now + 20, now + 20) for c in r.changes]
out["bytes"] = {
    f"{k}/{n}": int(p.table.bytes_total[p.table.index[(k, n)]]) for k, n in p.table.keys
}
out["firing"] = sorted(
    (c["kind"], c["surface"], c["rule"]) for c in changes if c["state"] == "firing"
)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package, the chart and its generator, with one module added:
    alarm/kinds/board.py.  Nothing else in it knows of ``board``."""
    src = tmp_path_factory.mktemp("kinds") / "src"
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("alarm", "exporters", "helm", "dashboards", "scripts"):
        shutil.copytree(ROOT / name, src / name, ignore=junk)
    (src / "alarm" / "kinds" / "board.py").write_text(BOARD)
    return src


def run_in(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The copy's package, not the checkout's (the editable install): it is first on the path.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=tree, env=env, timeout=300
    )


def test_a_new_kind_module_is_configured_classified_counted_and_judged(tree: Path) -> None:
    res = run_in(tree, "-c", PROBE)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["kinds"] == ["board", "egress", "fs", "registry"]
    assert out["kinds_in_use"] == ["board"]
    # A wrong match field on the new kind is named with the kind's own fields.
    assert out["problem"] == [
        "surfaces[0].match.path: 'path' is not a match field of board surfaces "
        "(they match on channel)"
    ]
    # Its classifier put each post where it belongs; nothing was lost or crashed.
    assert out["bytes"] == {"board/posts": 4000, "board/unclassified": 90000}
    # The undeclared channel's 90 kB passed the unclassified budget the config gave the kind.
    assert ["board", "unclassified", "budget"] in out["firing"]


def chart_configs(chart: Path, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    helm = pytest.importorskip("helm_python", reason="needs PyPI helm-python-sdk")
    out = helm.Chart.load(chart).render(
        values, name="capalarm", namespace="monitoring", is_install=True
    )
    docs = [
        d
        for name, text in out.items()
        if name.endswith(".yaml")
        for d in yaml.safe_load_all(text)
        if d
    ]
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: yaml.safe_load(
            d["data"]["config.yaml"]
        )
        for d in docs
        if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})
    }


def test_the_chart_places_a_new_kinds_surfaces_with_its_workload(tree: Path) -> None:
    """The chart reads where each kind runs from files/placement.yaml, which the generator
    writes from the registry: after `python scripts/gen_chart_files.py`, board surfaces go to
    the Deployment's config (the kind says ``workload="deployment"``), not to neither."""
    assert run_in(tree, "scripts/gen_chart_files.py", "--check").returncode == 1  # stale
    res = run_in(tree, "scripts/gen_chart_files.py")
    assert res.returncode == 0, res.stderr
    placement = yaml.safe_load((tree / "helm/capalarm/files/placement.yaml").read_text())
    assert placement["deployment"]["kinds"] == ["board", "registry"]
    schema = json.loads((tree / "helm/capalarm/values.schema.json").read_text())
    assert "BoardSurface" in schema["$defs"]
    values = {
        "config": {
            "sources": [
                {"name": "kernel", "type": "kmsg"},
                {"name": "pypi", "type": "registry", "api": "pypi", "url": "http://p/simple/"},
            ],
            "surfaces": [
                {"name": "proxy", "kind": "egress", "match": {"dport": [443]}},
                {"name": "posts", "kind": "board", "match": {"channel": ["general"]}},
            ],
            "unclassified": {"board": {"allowance_bits_per_second": 100, "tolerance_bits": 9e4}},
        }
    }
    configs = chart_configs(tree / "helm" / "capalarm", values)
    assert [s["name"] for s in configs["cluster"]["surfaces"]] == ["posts"]
    assert [s["name"] for s in configs["node"]["surfaces"]] == ["proxy"]
    assert "board" in configs["cluster"]["unclassified"]
    assert "board" not in configs["node"].get("unclassified", {})


def test_a_surface_of_a_kind_the_chart_does_not_place_fails_the_render(tmp_path: Path) -> None:
    """Where the registry and the chart disagree (placement.yaml not regenerated), the render
    stops naming the surface, instead of leaving it out of both workloads' configs.  (The
    values schema would reject the kind first: it is left out here to reach the template.)"""
    helm = pytest.importorskip("helm_python", reason="needs PyPI helm-python-sdk")
    chart = tmp_path / "capalarm"
    shutil.copytree(ROOT / "helm" / "capalarm", chart)
    (chart / "values.schema.json").unlink()
    values = {"config": {"surfaces": [{"name": "posts", "kind": "board"}]}}
    with pytest.raises(Exception) as exc:
        helm.Chart.load(chart).render(
            values, name="capalarm", namespace="monitoring", is_install=True
        )
    assert (
        'config.surfaces: the chart does not know where surface "posts" of kind "board" goes '
        "(kinds: egress, fs, registry)"
    ) in str(exc.value)


def test_the_registry_is_what_every_kind_list_reads() -> None:
    """The config's kinds, default budgets and source references, and the chart's placement,
    all come from KINDS; every source type feeds a registered kind."""
    assert list(KINDS) == ["egress", "fs", "registry"]
    assert all(isinstance(k, Kind) for k in KINDS.values())
    for name, kind in KINDS.items():
        assert DEFAULT_BUDGETS[name] is kind.budget
        surface = config_from_dict({"surfaces": [{"name": "s", "kind": name}]}).surfaces[0]
        assert type(surface).__name__ == kind.model_name
        assert isinstance(surface.match, kind.match)
    assert {t.kind for t in SOURCE_TYPES.values()} <= set(KINDS)
    placement = yaml.safe_load((ROOT / "helm/capalarm/files/placement.yaml").read_text())
    for name, kind in KINDS.items():
        assert name in placement[kind.workload]["kinds"]


@pytest.mark.parametrize(
    ("module", "problem"),
    [
        ("x = 1\n", "declares no KIND"),
        (BOARD.replace('name="board"', 'name="posts"'), "declares kind 'posts', not 'board'"),
        (BOARD.replace('name="board"', 'name="source"'), "is not one of"),
    ],
)
def test_a_half_declared_kind_module_stops_the_import(
    tmp_path: Path, module: str, problem: str
) -> None:
    """A module in alarm/kinds/ that does not declare its kind is an error at import, not a
    kind silently missing from the config, the pipeline and the chart."""
    pkg = tmp_path / "kindsx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "board.py").write_text(module)
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from alarm.kinds import discover
        discover("kindsx", [{str(pkg)!r}])
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert problem in res.stderr


def test_a_destination_filter_names_registered_kinds_only() -> None:
    """`filter: {kinds: [egres]}` matched no alert, so the destination silently got nothing:
    it is a config error now, in the same pass as the others, at the key the user wrote (the
    destination's `type` tag is not part of the path)."""
    from alarm.config import ConfigError

    def destination(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "type": "webhook", "url": "http://127.0.0.1:9/", **extra}

    ok = {"destinations": [destination("a", filter={"kinds": [*KINDS, "source", "service"]})]}
    assert config_from_dict({"notifications": ok}).notifications.destinations[0].filter.kinds
    bad = {
        "tick": "1ms",
        "notifications": {
            "destinations": [
                destination("a", filter={"kinds": "egres"}),
                destination("b", timeout="x"),
            ]
        },
    }
    with pytest.raises(ConfigError) as exc:
        config_from_dict(bad)
    assert exc.value.problems == [
        "tick: tick must be between 50ms and 1h",
        "notifications.destinations[1].timeout: 'x' is not a duration like 10s, 5m, 1h",
        "notifications.destinations[0].filter.kinds: 'egres' is not a kind "
        "(egress, fs, registry, source, service)",
    ]
