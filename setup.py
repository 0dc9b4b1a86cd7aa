"""The optional native parts; everything else is in pyproject.toml.

``optional=True``, but for the detector's (below): where no C compiler is available the
install still succeeds, and alarm.collectors.kernel.fastscan, alarm.collectors.fs.dirscan
(the fs source's directory scans), the detector's fused passes, the backtest's reader of write
events (alarm/backtest.py), the /metrics writer (exporters/textformat.py) and the state
store's chunk hash (alarm/state.py: BLAKE2b instead) use their pure-Python paths (same results,
slower).

build_py records the checkout's ``git describe`` in the built package (alarm/_revision.txt),
so that ``capalarm --version`` of an installed wheel names the revision it was built from;
an sdist without .git records nothing, and --version says so.

build_py also copies the deployment files (SHIPPED below: the example config, the systemd
unit, the nftables fence, the Prometheus rules and the Grafana dashboards) into the built
package as alarm/deploy_files/<the same paths>, where importlib.resources and
``capalarm deploy-files DIR`` find them (alarm/deployfiles.py).  MANIFEST.in puts them in the
sdist, so a wheel built from it carries them too; a tree without them does not build."""

import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# The deployment files a built package carries: (folder, glob), relative to ROOT.
SHIPPED = (("deploy", "**/*"), ("dashboards", "*.json"), ("dashboards", "*.yml"))
# One of them, to tell a tree that has them from one that lost them (a partial copy).
SHIPPED_SENTINEL = "deploy/config.example.yaml"


def shipped_files() -> list[Path]:
    if not (ROOT / SHIPPED_SENTINEL).is_file():
        raise SystemExit(
            f"setup.py: {SHIPPED_SENTINEL} is missing: build from a checkout or an sdist "
            "(the package carries deploy/ and dashboards/)"
        )
    found = {p for folder, pattern in SHIPPED for p in (ROOT / folder).glob(pattern)}
    return sorted(p for p in found if p.is_file() and "__pycache__" not in p.parts)


class BuildPyWithRevision(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "alarm" / "deploy_files"
        for src in shipped_files():
            out = target / src.relative_to(ROOT)
            out.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(src), str(out))
        if not (ROOT / ".git").exists():
            return
        try:
            res = subprocess.run(
                ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--tags"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return  # no git: the revision stays unknown, the build goes on
        if res.returncode == 0 and res.stdout.strip():
            out = Path(self.build_lib) / "alarm" / "_revision.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(res.stdout.strip() + "\n")


setup(
    cmdclass={"build_py": BuildPyWithRevision},
    ext_modules=[
        Extension(
            "alarm.collectors.kernel._fastscan",
            ["alarm/collectors/kernel/_fastscan.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "alarm._eventscan",
            ["alarm/_eventscan.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "alarm._chunkhash",
            ["alarm/_chunkhash.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "alarm.collectors.fs._dirscan",
            ["alarm/collectors/fs/_dirscan.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "exporters._textformat",
            ["exporters/_textformat.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "alarm.detector._fused",
            ["alarm/detector/_fused.c", "alarm/detector/_whole_tick.c"],
            depends=["alarm/detector/_fused.h"],
            # No fused multiply-adds: the passes must round where numpy rounds.
            extra_compile_args=["-O3", "-fno-fast-math", "-ffp-contract=off", "-fno-trapping-math"],
            # Required: the beacon rule's one definition is native (rules/beacon.py).
            optional=False,
        ),
    ],
)
