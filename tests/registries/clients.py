"""Write to the real registries as a confined workload would: twine uploads, npm publish,
image pushes over the registry's v2 API, anonymous wiki edits through the action API."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from urllib.parse import urlencode, urljoin

from tests.registries.servers import Server, request


def make_wheel(directory: Path, name: str, version: str, payload: int) -> Path:
    """A valid pure-Python wheel (PEP 427) carrying ``payload`` random bytes, made without any
    build backend: METADATA, WHEEL and RECORD written by hand."""
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/data.bin": os.urandom(payload),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: capalarm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w") as zf:
        for arc, data in files.items():
            zf.writestr(zipfile.ZipInfo(arc, (2020, 1, 1, 0, 0, 0)), data)
    return path


def twine_upload(server: Server, wheel: Path) -> None:
    user = server.extra.get("user", "x")
    password = server.extra.get("password", "x")
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar",
         "--repository-url", server.extra["upload"], "-u", user, "-p", password, str(wheel)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def npm_publish(server: Server, workdir: Path, name: str, version: str, payload: int) -> Path:
    """``npm publish`` of a package carrying ``payload`` random bytes; returns the tarball
    that ``npm pack`` makes of the same directory (what was uploaded)."""
    pkg = workdir / f"{name.replace('/', '_')}-{version}"
    pkg.mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": name, "version": version}))
    (pkg / "data.txt").write_text(base64.b64encode(os.urandom(payload)).decode())
    host = server.url.split("//", 1)[1]
    (pkg / ".npmrc").write_text(
        f"registry={server.url}\n//{host}:_authToken={server.extra['token']}\n"
    )
    env = {
        **os.environ,
        "npm_config_cache": str(workdir / "npm-cache"),
        "npm_config_update_notifier": "false",
    }
    proc = subprocess.run(
        ["npm", "pack", "--silent", "--pack-destination", str(pkg)],
        cwd=pkg, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tarball = pkg / proc.stdout.strip().splitlines()[-1]
    proc = subprocess.run(
        ["npm", "publish", str(tarball), "--userconfig", str(pkg / ".npmrc")],
        cwd=pkg, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tarball


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push_blob(base: str, repo: str, data: bytes, auth: dict[str, str] | None = None) -> str:
    """The monolithic upload of the OCI distribution spec: POST, then PUT ?digest=."""
    status, headers, body = request(
        "POST", f"{base}v2/{repo}/blobs/uploads/", data=b"", headers=auth
    )
    assert status == 202, body
    location = urljoin(base, headers["Location"])
    digest = _digest(data)
    sep = "&" if "?" in location else "?"
    status, _, body = request(
        "PUT",
        f"{location}{sep}{urlencode({'digest': digest})}",
        data=data,
        headers={"Content-Type": "application/octet-stream", **(auth or {})},
    )
    assert status == 201, body
    return digest


def push_image(
    base: str, repo: str, tag: str, layer_bytes: int, auth: dict[str, str] | None = None
) -> int:
    """Push a one-layer image (Docker image manifest v2, schema 2); returns manifest length +
    config size + layer size, the bytes the collector is expected to count.  ``auth``: the
    headers a token-authenticated registry needs (``Authorization: Bearer ...``)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        content = os.urandom(layer_bytes)
        member = tarfile.TarInfo("payload.bin")
        member.size = len(content)
        tar.addfile(member, io.BytesIO(content))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [_digest(raw.getvalue())]},
        }
    ).encode()
    layer_digest = push_blob(base, repo, layer, auth)
    config_digest = push_blob(base, repo, config, auth)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": config_digest,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer),
                    "digest": layer_digest,
                }
            ],
        }
    ).encode()
    status, _, body = request(
        "PUT",
        f"{base}v2/{repo}/manifests/{tag}",
        data=manifest,
        headers={
            "Content-Type": "application/vnd.docker.distribution.manifest.v2+json",
            **(auth or {}),
        },
    )
    assert status == 201, body
    return len(manifest) + len(config) + len(layer)


def wiki_edit(api: str, title: str, text: str) -> dict[str, object]:
    """An anonymous edit (or page creation) through action=edit with the anonymous CSRF token
    (``+\\``, API:Tokens)."""
    status, _, body = request(
        "POST",
        api,
        data=urlencode(
            {"action": "edit", "title": title, "text": text, "token": "+\\", "format": "json"}
        ).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    doc = json.loads(body)
    assert status == 200 and doc.get("edit", {}).get("result") == "Success", doc
    return doc["edit"]
