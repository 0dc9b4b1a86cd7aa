"""The package's licence: the metadata says Apache-2.0 as an SPDX expression (PEP 639; the
``license = {text = ...}`` table is deprecated and setuptools stops building it after
2027-02-18), the LICENSE file holds the licence's full text, and a build carries both."""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
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
    copy_build_inputs(src)
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


# What the package must carry for an operator (issue 30), at its repository path.
DEPLOY_FILES = (
    "deploy/config.example.yaml",
    "deploy/systemd/capalarm.service",
    "deploy/nftables/fence.nft",
    "dashboards/capalarm.rules.yml",
    "dashboards/capalarm.rules.test.yml",
    "dashboards/capalarm-overview.json",
    "dashboards/capalarm-surface.json",
)
# What the image's build stage copies into its context: the build's inputs.
BUILD_INPUTS = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "LICENSE",
    "MANIFEST.in",
    "alarm",
    "exporters",
    "deploy",
    "dashboards",
)


def copy_build_inputs(dest: Path) -> None:
    """A copy of what a build reads (nothing built lands in the checkout), without what the
    checkout has built in place."""
    dest.mkdir(parents=True, exist_ok=True)
    junk = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "_revision.txt")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=junk)
        else:
            shutil.copy2(ROOT / name, dest / name)


def run_build(args: list[str], cwd: Path | None = None) -> None:
    res = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
def test_the_sdist_and_wheel_carry_the_deployment_files(tmp_path):
    """Issue 30: an operator who installs the wheel (or builds one from the sdist) gets the
    example config, the systemd unit, the nftables fence, the rules and the dashboards, as
    package data, and `capalarm deploy-files DIR` of that installed package writes them out
    byte for byte."""
    src = tmp_path / "src"
    copy_build_inputs(src)
    dist = tmp_path / "dist"
    run_build(["build", "--sdist", "--outdir", str(dist), str(src)])
    [sdist] = dist.glob("capalarm-*.tar.gz")
    with tarfile.open(sdist) as tf:
        [top] = {n.split("/")[0] for n in tf.getnames()}
        for rel in DEPLOY_FILES:
            member = tf.extractfile(f"{top}/{rel}")
            assert member is not None and member.read() == (ROOT / rel).read_bytes(), rel
        assert not [n for n in tf.getnames() if n.endswith((".so", ".pyc"))]
    # The wheel as pip builds it from that sdist (what `pip install capalarm-*.tar.gz` does).
    wheels = tmp_path / "wheels"
    run_build(["pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(sdist)])
    [wheel] = wheels.glob("capalarm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        for rel in DEPLOY_FILES:
            assert zf.read(f"alarm/deploy_files/{rel}") == (ROOT / rel).read_bytes(), rel
        site = tmp_path / "site"
        zf.extractall(site)
    # The wheel's package, not the checkout's: importlib.resources and the verb find them.
    probe = (
        "import alarm, importlib.resources as r; print(alarm.__file__); "
        "print(r.files('alarm').joinpath('deploy_files/deploy/nftables/fence.nft').read_text())"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    found = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    where, text = found.stdout.split("\n", 1)
    assert Path(where).is_relative_to(site)
    assert text == (ROOT / "deploy/nftables/fence.nft").read_text() + "\n"
    # The kinds registry finds its modules in the installed package too (issue 29).
    kinds = subprocess.run(
        [sys.executable, "-c", "from alarm.kinds import KINDS; print(*KINDS)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert kinds.stdout.split() == ["egress", "fs", "registry"], kinds.stderr
    out = tmp_path / "etc"
    res = subprocess.run(
        [sys.executable, "-m", "alarm.cli", "deploy-files", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    for rel in DEPLOY_FILES:
        assert (out / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
        assert f"wrote {out / rel}" in res.stdout


@pytest.mark.slow
def test_a_tree_without_the_deployment_files_does_not_build(tmp_path):
    """A partial copy (an image build that forgot deploy/) must not make a wheel that
    silently lacks them: setup.py stops, naming what is missing."""
    src = tmp_path / "src"
    copy_build_inputs(src)
    shutil.rmtree(src / "deploy")
    res = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode != 0
    assert "deploy/config.example.yaml is missing" in res.stdout + res.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_the_image_build_context_has_the_build_inputs():
    """The Dockerfile's build stage runs `pip install .`: every input of the build must pass
    .dockerignore and be copied (LICENSE was copied but ignored, so the copy failed)."""
    copied = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied.update(p.rstrip("/") for p in line.split()[1:-1])
    needed = set(BUILD_INPUTS) - {"MANIFEST.in"}  # the sdist's list; pip install . skips it
    assert needed <= copied, needed - copied
    admitted = {
        line[1:].strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert needed <= admitted, needed - admitted


def test_deploy_files_refuses_to_overwrite_an_edited_file(tmp_path, capsys):
    """An operator's edited config is not overwritten by a second run: exit 1, one line,
    nothing written; --force overwrites."""
    from alarm.cli import main

    assert main(["deploy-files", str(tmp_path)]) == 0
    config = tmp_path / "deploy" / "config.example.yaml"
    edited = config.read_text() + "# mine\n"
    config.write_text(edited)
    (tmp_path / "deploy" / "nftables" / "fence.nft").unlink()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["deploy-files", str(tmp_path)])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{config} already exists with other contents" in err
    assert config.read_text() == edited
    assert not (tmp_path / "deploy" / "nftables" / "fence.nft").exists()
    assert main(["deploy-files", "--force", str(tmp_path)]) == 0
    assert config.read_bytes() == (ROOT / "deploy" / "config.example.yaml").read_bytes()


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
