import json
import subprocess
import sys


def test_demo_fires_and_resolves_both_alarms_within_a_minute():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "alarm.cli",
            "--log-level",
            "WARNING",
            "demo",
            "--duration",
            "45",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "http://127.0.0.1:" in res.stdout and "/metrics" in res.stdout
    result = json.loads(res.stdout.strip().splitlines()[-1])
    expected = [["paste-board", "budget"], ["registry-proxy", "spike"]]
    assert result["fired"] == expected
    assert result["resolved"] == expected
