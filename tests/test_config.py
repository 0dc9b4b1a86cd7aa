import subprocess
import sys

import pytest

from alarm.config import ConfigError, config_from_dict, load_config, parse_duration


def test_embedded_default_is_valid_and_watches_the_kernel_log():
    config = load_config(None)
    assert config.surfaces == []
    assert config.sources[0].type == "auto"
    assert config.sources[0].prefixes == ["EGRESS_FENCE"]
    assert config.http.host_port()[0] == "127.0.0.1"


@pytest.mark.parametrize(
    ("text", "seconds"), [("10s", 10), ("5m", 300), ("1.5h", 5400), (30, 30), ("250ms", 0.25)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_every_problem_is_named_by_its_key_path():
    with pytest.raises(ConfigError) as err:
        config_from_dict(
            {
                "tick": "soon",
                "surfaces": [
                    {"name": "ok", "match": {"dst": ["10.0.0.0/33"], "dport": ["9-1", 70000]}},
                    {"name": "unclassified"},
                    {"name": "ok"},
                ],
                "sources": [{"name": "f", "type": "file"}],
                "webhooks": [{"url": "ftp://x"}],
                "typo_key": 1,
            }
        )
    text = "\n".join(err.value.problems)
    for expected in (
        "tick:",
        "surfaces[0].match.dst:",
        "surfaces[0].match.dport:",
        "surfaces[1].name:",
        "sources[0].paths:",
        "webhooks[0].url:",
        "typo_key:",
    ):
        assert expected in text, (expected, text)


def test_duplicate_surface_names_are_rejected():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"surfaces": [{"name": "a"}, {"name": "a"}]})
    assert "declared twice" in str(err.value)


def test_check_config_exit_codes(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        "tick: 5s\nsurfaces:\n  - {name: proxy, match: {dst: [10.0.0.0/8], dport: [443]}}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("tick: 5s\nsurfaces:\n  - {name: proxy, match: {dport: [99999]}}\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("tick: [unclosed\n")
    run = [sys.executable, "-m", "alarm.cli", "check-config"]
    assert subprocess.run([*run, str(good)], capture_output=True).returncode == 0
    # The flag `run` and `backtest` take works here too.
    assert subprocess.run([*run, "--config", str(good)], capture_output=True).returncode == 0
    res = subprocess.run([*run], capture_output=True, text=True)
    assert res.returncode == 2 and "give one config file" in res.stderr
    res = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert res.returncode == 2
    assert "surfaces[0].match.dport" in res.stderr
    res = subprocess.run([*run, str(broken)], capture_output=True, text=True)
    assert res.returncode == 2 and "YAML" in res.stderr
    res = subprocess.run([*run, str(tmp_path / "missing.yaml")], capture_output=True, text=True)
    assert res.returncode == 2 and "cannot read" in res.stderr


def test_run_with_an_unreadable_secret_exits_2_naming_it(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"sources: [{{name: k, type: file, paths: [{tmp_path / 'kern.log'}]}}]\n"
        "notifications:\n  destinations:\n"
        "    - {type: webhook, name: soc, url: 'http://127.0.0.1:1/hook', secrets: [{env: CAPALARM_TEST_UNSET}]}\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "alarm.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert "notifications.destinations[0]" in res.stderr and "CAPALARM_TEST_UNSET" in res.stderr
    assert "Traceback" not in res.stderr
