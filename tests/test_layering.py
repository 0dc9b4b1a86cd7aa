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


# What a backtest of a kernel log must not load: another family's engine or settings, the HTTP
# client, the event loop (issue 29: together ~0.1 s of CPU in every run).
ENGINES = (
    "aiohttp",
    "alarm.collectors.fs.settings",
    "alarm.collectors.registry.settings",
    "asyncio",
    "ssl",
    "alarm.collectors.registry.http",
    "alarm.collectors.registry.poller",
    "alarm.collectors.fs.engine",
    "alarm.collectors.fs.inotify",
    "alarm.collectors.fs.fanotify",
    "alarm.collectors.kernel.kmsg",
    "alarm.collectors.kernel.journald",
    "alarm.collectors.kernel.tail",
    "alarm.collectors.kernel.canary",
)


def test_a_kernel_log_backtest_imports_no_source_engine(tmp_path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(
        "Nov 30 19:07:05 node-7 kernel: [  455.932272] EGRESS_FENCE: IN= OUT=eth0 "
        "SRC=10.99.0.2 DST=52.22.81.204 LEN=84 TOS=0x00 PREC=0x00 TTL=64 ID=22401 DF "
        "PROTO=ICMP TYPE=8 CODE=0 ID=1169 SEQ=93\n"
    )
    config = tmp_path / "capalarm.yaml"
    config.write_text(
        "sources: [{name: kern, type: file, paths: [/var/log/kern.log], format: syslog}]\n"
        "surfaces: [{name: dns, kind: egress, match: {dport: [53], proto: [udp]}}]\n"
    )
    loaded = run(
        "import contextlib, sys\n"
        "from alarm import cli\n"
        "with contextlib.suppress(SystemExit):\n"
        f"    cli.main(['backtest', '--config', {str(config)!r}, {str(log)!r},"
        " '--output', '/dev/null'])\n"
        f"print(sorted(m for m in sys.modules if m in {ENGINES!r} or m.split('.')[0] in"
        f" {ENGINES!r}))"
    )
    assert loaded.splitlines()[-1] == "[]"


def test_the_source_registrations_import_no_settings_and_no_engine() -> None:
    loaded = run(
        "import sys\n"
        "from alarm.collectors import SOURCE_TYPES\n"
        "print(sorted(m for m in sys.modules if m.startswith('alarm.collectors')))"
    )
    modules = eval(loaded)  # a printed list of names
    assert modules and all(
        m.endswith(("_type", ".base")) or m in ("alarm.collectors", *FAMILIES) for m in modules
    ), modules


FAMILIES = ("alarm.collectors.fs", "alarm.collectors.kernel", "alarm.collectors.registry")


def test_every_registered_source_type_names_a_settings_model_and_a_factory() -> None:
    out = run(
        "from alarm.collectors import SOURCE_TYPES\n"
        "from alarm.collectors.base import resolve\n"
        "import typing\n"
        "for name, t in SOURCE_TYPES.items():\n"
        "    assert t.type == name and callable(resolve(t.factory)), name\n"
        "    model = typing.get_args(t.config)[0] if t.nested_tags else t.config\n"
        "    models = typing.get_args(model) if t.nested_tags else (model,)\n"
        "    tags = set()\n"
        "    for m in models:\n"
        "        assert typing.get_args(m.model_fields['type'].annotation) == (name,), name\n"
        "        tags |= set(typing.get_args(m.model_fields.get('api').annotation)) if t.nested_tags"
        " else set()\n"
        "    assert tags == set(t.nested_tags), (name, tags)\n"
        "print(sorted(SOURCE_TYPES))"
    )
    assert out.split() == ["['auto',", "'file',", "'fs',", "'journald',", "'kmsg',", "'registry']"]


def test_a_config_loads_the_settings_of_the_source_types_it_declares_and_no_others() -> None:
    out = run(
        "import sys\n"
        "from alarm.config import config_from_dict\n"
        "def loaded():\n"
        "    return sorted(m.split('.')[2] for m in sys.modules if m.startswith('alarm.collectors')"
        " and m.endswith('.settings'))\n"
        "for sources in ([{'name': 'k', 'type': 'file', 'paths': ['/x']}],"
        " [{'name': 'c', 'type': 'fs', 'paths': ['/x']}],"
        " [{'name': 'r', 'type': 'registry', 'api': 'pypi', 'url': 'http://x/'}]):\n"
        "    c = config_from_dict({'sources': sources})\n"
        "    print(c.sources[0].type, loaded())\n"
    )
    assert out.splitlines() == [
        "file ['kernel']",
        "fs ['fs', 'kernel']",
        "registry ['fs', 'kernel', 'registry']",
    ]
