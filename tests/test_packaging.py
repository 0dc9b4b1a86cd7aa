"""The package's licence: the metadata says Apache-2.0 as an SPDX expression (PEP 639; the
``license = {text = ...}`` table is deprecated and setuptools stops building it after
2027-02-18), the LICENSE file holds the licence's full text, and a build carries both."""

from __future__ import annotations

import email
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_its_file():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    # An SPDX expression and a licence classifier together are an error under PEP 639.
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]


def test_the_build_backend_can_read_the_spdx_expression():
    """setuptools reads ``license = "<SPDX>"`` and ``license-files`` from 77.0 on; an older one
    rejects the string form, so the build requirement must not admit one."""
    [req] = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert req.replace(" ", "") == "setuptools>=77"


def test_license_file_is_the_full_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith(
        "Apache License\n                           Version 2.0, January 2004"
    )
    for heading in (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "1. Definitions.",
        "3. Grant of Patent License.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ):
        assert heading in text, heading
    assert len(text) > 11000


def test_the_image_build_copies_the_license():
    """The Dockerfile's build stage runs `pip install .` on what it copied: the files
    pyproject.toml names (readme, license-files) must be among them, or the build fails."""
    copied = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied.update(line.split()[1:-1])
    assert {"pyproject.toml", "setup.py", PYPROJECT["project"]["readme"]} <= copied
    assert set(PYPROJECT["project"]["license-files"]) <= copied


@pytest.mark.slow
def test_a_built_wheel_carries_the_license_expression_and_file(tmp_path):
    """`pip wheel .` as the image's `pip install .` builds it, with the setuptools the build
    requires, on a copy of what the Dockerfile copies (nothing built lands in the checkout)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("alarm", "exporters"):
        shutil.copytree(
            ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
    out = tmp_path / "dist"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    [wheel] = out.glob("capalarm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        [meta_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(zf.read(meta_name))
        [lic] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert zf.read(lic) == (ROOT / "LICENSE").read_bytes()
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["License"] is None  # the deprecated free-text field is gone


def dockerfile_exec_form(instruction: str) -> list[str]:
    """The JSON (exec) form of the runtime stage's ENTRYPOINT or CMD."""
    found = [
        json.loads(line.split(None, 1)[1])
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith(f"{instruction} ")
    ]
    assert len(found) == 1, f"one {instruction} in the Dockerfile: {found}"
    return found[0]


def test_the_image_runs_any_verb():
    """ENTRYPOINT ["capalarm", "run", "--config", ...] made `docker run IMAGE check-config`
    run `capalarm run --config ... check-config`: the program is the entrypoint, the verb the
    default command, which `docker run IMAGE <verb> ...` replaces."""
    from alarm.cli import build_parser

    entrypoint = dockerfile_exec_form("ENTRYPOINT")
    cmd = dockerfile_exec_form("CMD")
    assert entrypoint == ["capalarm"]
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts["capalarm"] == "alarm.cli:main"
    default = build_parser().parse_args(cmd)
    assert default.command == "run" and default.config == "/etc/capalarm/config.yaml"
    check = build_parser().parse_args(["check-config", "/etc/capalarm/config.yaml"])
    assert check.command == "check-config"
