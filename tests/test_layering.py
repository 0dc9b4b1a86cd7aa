"""The data flow's arrows point one way: the core configuration (alarm/config.py, which the
detector, the pipeline and the exporters import) loads no collector.  The source types, the
kinds and the canary's settings reach it from the composition root (alarm/assembly.py), on
first use; each check runs in a fresh interpreter, where nothing else has loaded them."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_importing_the_configuration_loads_no_collector() -> None:
    loaded = run(
        "import sys, alarm.config\n"
        "print(sorted(m for m in sys.modules if m.startswith('alarm.collectors')))"
    )
    assert loaded.strip() == "[]"


def test_the_configuration_is_assembled_from_the_registered_parts_on_first_use() -> None:
    out = run(
        "from alarm.config import config_from_dict\n"
        "from alarm.collectors import SOURCE_TYPES\n"
        "from alarm.kinds import KINDS\n"
        "c = config_from_dict({'sources': [{'name': 'cache', 'type': 'fs', 'paths': ['/x']}],"
        " 'surfaces': [{'name': 'pip', 'kind': 'fs', 'match': {'source': ['cache']}}]})\n"
        "print(c.source_kind('cache'), c.kinds_in_use(), type(c).parts.source_types is"
        " SOURCE_TYPES, type(c).parts.kinds is KINDS)"
    )
    assert out.split() == ["fs", "['fs']", "True", "True"]
