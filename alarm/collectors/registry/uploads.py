"""How the canary writes: one tiny artifact, named for this round only, through each API's
own upload, as that API's usual client sends it.

- ``pypi``: the legacy upload API that twine uses (``POST`` multipart/form-data with
  ``:action=file_upload``, ``protocol_version=1``, the core metadata fields and the file as
  ``content``; pypiserver, devpi, Nexus and Artifactory accept it).  The file is an sdist
  ``<name>-<version>.tar.gz`` holding only ``PKG-INFO``: about 230 bytes.
- ``npm``: ``PUT /<name>`` with a packument whose ``_attachments`` carry the tarball, as
  ``npm publish`` (libnpmpublish) sends it; the tarball holds ``package/package.json``.
- ``oci`` / ``docker``: the OCI distribution spec's "Pushing blobs" (``POST
  /v2/<name>/blobs/uploads/``, then ``PUT <Location>?digest=``) for a config blob that
  carries this round's serial, then "Pushing Manifests" (``PUT /v2/<name>/manifests/<tag>``)
  of an image manifest with no layers: about 520 bytes in all.  The tag is always the same
  (``canary``), pushed again with a new digest each round, because an image repository's
  poll reads every tag: the repository keeps one tag, and the old manifests are untagged
  (the registry's garbage collection removes them).
- ``mediawiki``: ``action=edit`` of one page (API:Edit) with a CSRF token from
  ``meta=tokens`` (API:Tokens): anonymous (the token ``+\\``), after ``action=login`` with a
  bot password (API:Login; ``user@bot:password`` credentials, a session cookie for the one
  round), or with an OAuth bearer token (other credentials).  The page is rewritten each
  round, so it stays about a hundred bytes; the wiki keeps each revision in its history.

What the poll will list is an :class:`Upload` — repository, artifact and digest exactly as
the adapter reports them — so that only this round's artifact is recognised.  Where it can be
known in advance (pypi, npm, oci: names and digests are made here) it is announced through
``expect`` before the request that makes it visible, so that an upload the server stored but
whose answer was lost (a timeout) is still recognised when a poll lists it; a wiki's revision
number is known only from the answer.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode, urljoin

from pydantic import SecretStr

from alarm.collectors.registry.http import PollError, RegistryClient
from alarm.collectors.registry.names import normalize, packument_url
from alarm.collectors.registry.settings import Credentials

DESCRIPTION = "capalarm canary: proof that capalarm's polls see uploads; safe to delete"
OCI_TAG = "canary"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True, slots=True)
class Upload:
    """What a later poll will report of the canary: ``Cycle.found``'s repository and
    artifact, and the digest of its receipt where the poll gives one."""

    repository: str
    artifact: str
    digest: str | None
    nbytes: int


@dataclass(frozen=True, slots=True)
class Credential:
    """How the canary authenticates: a header on every request to the upload origin, or a
    MediaWiki bot-password login (user, password)."""

    header: tuple[str, SecretStr] | None = None
    login: tuple[str, SecretStr] | None = None


@dataclass(frozen=True, slots=True)
class Target:
    url: str  # the upload endpoint (pypi), registry base (npm, oci) or api.php (mediawiki)
    repository: str  # as configured
    serial: str  # this round's unique part: a version number valid for PEP 440 and semver
    credential: Credential


Expect = Callable[[Upload], None]
Publisher = Callable[[RegistryClient, Target, Expect], Awaitable[Upload]]


def credential_for(api: str, credentials: Credentials | None) -> Credential:
    """Reads the secret now; raises ValueError naming where it comes from, never the value."""
    if credentials is None:
        return Credential()
    if api == "mediawiki" and credentials.header is None and credentials.scheme != "bearer":
        secret = credentials.read_one().get_secret_value()
        user, sep, password = secret.partition(":")
        if sep:
            return Credential(login=(user, SecretStr(password)))
    return Credential(header=credentials.authorization())


def _tar_gz(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            member.mode = 0o644
            tar.addfile(member, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def _multipart(fields: list[tuple[str, str]], file: tuple[str, str, bytes], boundary: str) -> bytes:
    out = io.BytesIO()
    for name, value in fields:
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        out.write(value.encode() + b"\r\n")
    field, filename, data = file
    out.write(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; '
        f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
    )
    out.write(data + f"\r\n--{boundary}--\r\n".encode())
    return out.getvalue()


async def publish_pypi(client: RegistryClient, t: Target, expect: Expect) -> Upload:
    name = t.repository
    dist = "".join(c if c.isalnum() else "_" for c in name.lower())  # PEP 625 sdist name
    while "__" in dist:
        dist = dist.replace("__", "_")
    filename = f"{dist}-{t.serial}.tar.gz"
    pkg_info = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {t.serial}\nSummary: {DESCRIPTION}\n"
    ).encode()
    data = _tar_gz({f"{dist}-{t.serial}/PKG-INFO": pkg_info})
    sha256 = hashlib.sha256(data).hexdigest()
    fields = [
        (":action", "file_upload"),
        ("protocol_version", "1"),
        ("metadata_version", "2.1"),
        ("name", name),
        ("version", t.serial),
        ("summary", DESCRIPTION),
        ("filetype", "sdist"),
        ("pyversion", "source"),
        ("md5_digest", hashlib.md5(data, usedforsecurity=False).hexdigest()),
        ("sha256_digest", sha256),
        ("blake2_256_digest", hashlib.blake2b(data, digest_size=32).hexdigest()),
    ]
    boundary = "capalarm" + sha256[:24]
    upload = Upload(normalize(name), filename, f"sha256:{sha256}", len(data))
    expect(upload)
    await client.send(
        "POST",
        t.url,
        data=_multipart(fields, ("content", filename, data), boundary),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    return upload


async def publish_npm(client: RegistryClient, t: Target, expect: Expect) -> Upload:
    name, version = t.repository, t.serial
    base = t.url if t.url.endswith("/") else t.url + "/"
    manifest = {"name": name, "version": version, "description": DESCRIPTION}
    tarball = _tar_gz({"package/package.json": json.dumps(manifest).encode()})
    filename = f"{name.rsplit('/', 1)[-1]}-{version}.tgz"
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    packument = {
        "_id": name,
        "name": name,
        "description": DESCRIPTION,
        "dist-tags": {"latest": version},
        "versions": {
            version: {
                **manifest,
                "_id": f"{name}@{version}",
                "dist": {
                    "integrity": integrity,
                    "shasum": hashlib.sha1(tarball, usedforsecurity=False).hexdigest(),
                    "tarball": f"{base}{name}/-/{filename}",
                },
            }
        },
        "_attachments": {
            filename: {
                "content_type": "application/octet-stream",
                "data": base64.b64encode(tarball).decode(),
                "length": len(tarball),
            }
        },
    }
    upload = Upload(name, version, integrity, len(tarball))
    expect(upload)
    await client.send(
        "PUT",
        packument_url(base, name),
        data=json.dumps(packument).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    return upload


async def _push_blob(client: RegistryClient, v2: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    started = await client.send("POST", f"{v2}{repo}/blobs/uploads/", data=b"", ok=frozenset({202}))
    location = started.headers.get("Location")
    if not location:
        raise PollError(f"{repo}: blob upload started without a Location")
    target = urljoin(started.url, location)
    target += ("&" if "?" in target else "?") + urlencode({"digest": digest})
    await client.send(
        "PUT",
        target,
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        ok=frozenset({201}),
    )
    return digest


async def publish_oci(client: RegistryClient, t: Target, expect: Expect) -> Upload:
    base = t.url if t.url.endswith("/") else t.url + "/"
    v2 = base if base.endswith("/v2/") else base + "v2/"
    repo = t.repository
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
            "config": {"Labels": {"capalarm.canary": t.serial}},
        },
        separators=(",", ":"),
    ).encode()
    config_digest = await _push_blob(client, v2, repo, config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
            "layers": [],
            "annotations": {"org.opencontainers.image.description": DESCRIPTION},
        },
        separators=(",", ":"),
    ).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    upload = Upload(repo, OCI_TAG, digest, len(manifest) + len(config))
    expect(upload)
    await client.send(
        "PUT",
        f"{v2}{repo}/manifests/{OCI_TAG}",
        data=manifest,
        headers={"Content-Type": OCI_MANIFEST},
        ok=frozenset({201}),
    )
    return upload


async def _wiki(client: RegistryClient, api: str, fields: dict[str, str]) -> dict[str, Any]:
    """One POST to api.php; an API error (HTTP 200 with ``error``) is a PollError."""
    reply = await client.send(
        "POST",
        api,
        data=urlencode({**fields, "format": "json", "formatversion": "2"}).encode(),
        headers={"Content-Type": FORM},
        ok=frozenset({200}),
    )
    doc = reply.json()
    if not isinstance(doc, dict):
        raise PollError("api.php: not an object")
    if isinstance(doc.get("error"), dict):
        code = str(doc["error"].get("code"))[:64]
        raise PollError(f"api.php {fields.get('action')}: error {code}")
    return doc


async def _wiki_token(client: RegistryClient, api: str, kind: str) -> str:
    sep = "&" if "?" in api else "?"
    query = urlencode({"action": "query", "meta": "tokens", "type": kind, "format": "json"})
    _, doc = await client.get_json(api + sep + query)
    token = (((doc or {}).get("query") or {}).get("tokens") or {}).get(f"{kind}token")
    if not isinstance(token, str) or not token:
        raise PollError(f"api.php: no {kind} token")
    return token


async def publish_mediawiki(client: RegistryClient, t: Target, expect: Expect) -> Upload:
    login = t.credential.login
    fields = {"action": "edit", "title": t.repository, "summary": DESCRIPTION}
    if login is not None:
        user, password = login
        doc = await _wiki(
            client,
            t.url,
            {
                "action": "login",
                "lgname": user,
                "lgpassword": password.get_secret_value(),
                "lgtoken": await _wiki_token(client, t.url, "login"),
            },
        )
        if (doc.get("login") or {}).get("result") != "Success":
            raise PollError(f"api.php login: {str((doc.get('login') or {}).get('result'))[:40]}")
        fields["assert"] = "user"  # never silently as an anonymous edit if the session is lost
    text = f"capalarm canary {t.serial}\n\n{DESCRIPTION}\n"
    fields.update({"text": text, "token": await _wiki_token(client, t.url, "csrf")})
    doc = await _wiki(client, t.url, fields)
    edit = doc.get("edit") if isinstance(doc.get("edit"), dict) else {}
    revid = edit.get("newrevid")
    if edit.get("result") != "Success" or not isinstance(revid, int) or isinstance(revid, bool):
        raise PollError(f"api.php edit: {str(edit.get('result'))[:40]}, no new revision")
    return Upload(str(edit.get("title") or t.repository), f"r{revid}", None, len(text.encode()))


PUBLISHERS: Mapping[str, Publisher] = MappingProxyType(
    {
        "pypi": publish_pypi,
        "npm": publish_npm,
        "oci": publish_oci,
        "docker": publish_oci,
        "mediawiki": publish_mediawiki,
    }
)
