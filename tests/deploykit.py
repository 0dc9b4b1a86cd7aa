"""Shared by the deployment tests (test_helm, test_rules, test_dashboards, test_deploy_host):
paths, the real tools they need, and the metric names the README documents.

A tool that is missing skips the test with the reason, and fails it under CI (CI=true), where
scripts/test.sh must have installed it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "capalarm"
DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "capalarm.rules.yml"
RULE_TESTS = DASHBOARDS / "capalarm.rules.test.yml"
DEPLOY = ROOT / "deploy"

# Not in the table because every Prometheus target has them, or the info metric.
OTHER_METRICS = frozenset({"up", "capalarm_build_info"})


def require_tool(name: str, package: str) -> str:
    """The tool's path; skip without it, fail under CI."""
    path = shutil.which(name)
    if path:
        return path
    reason = f"needs {name!r} (Debian package {package!r}, installed by scripts/test.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, **kw)


def readme_metric_names() -> set[str]:
    """Every metric name in README.md's Metrics table, brace groups expanded, with the
    ``capalarm_`` prefix the table leaves out."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        for token in re.findall(r"`([^`]+)`", first_cell):
            token = re.sub(r"(?<=[a-z0-9}])\{[^}]*\}$", "", token)  # a trailing label set
            m = re.match(r"^(.*)\{([^}]*)\}(.*)$", token)
            expanded = (
                [m.group(1) + part + m.group(3) for part in m.group(2).split(",")] if m else [token]
            )
            names.update(f"capalarm_{n}" for n in expanded)
    return names


def known_metric_names() -> set[str]:
    return readme_metric_names() | OTHER_METRICS


PROMQL_KEYWORDS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
    ]
)


def metric_names_in(expr: str) -> set[str]:
    """Metric names a PromQL expression reads, recorded series (``level:metric:ops``)
    included."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        if m.group(2) is None and m.group(1) not in PROMQL_KEYWORDS:
            names.add(m.group(1))
    return names
