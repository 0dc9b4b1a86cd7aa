"""What a capalarm process costs before it does anything: numpy's OpenBLAS would start a
thread per core on import (~0.05 s of CPU in every process and backtest worker; capalarm
multiplies no matrices), so the command asks it for one, unless the operator set it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

THREADS = """
import contextlib, os
from alarm import cli
with contextlib.suppress(SystemExit):
    cli.main(["--version"])
import numpy
print(os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task")))
"""


def threads(env: dict[str, str]) -> tuple[str, int]:
    res = subprocess.run(
        [sys.executable, "-c", THREADS], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 0, res.stderr
    setting, n = res.stdout.split()[-2:]
    return setting, int(n)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_numpy_starts_no_thread_pool_in_a_capalarm_process() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS", "OMP_"))}
    assert threads(env) == ("1", 1)
    # An operator's own setting stands (and OpenBLAS then starts its threads, one a core).
    setting, n = threads({**env, "OPENBLAS_NUM_THREADS": "2"})
    assert setting == "2"
    assert n > 1 or (os.cpu_count() or 1) == 1
