"""Start real registries on loopback: pypiserver, devpi-server, verdaccio, Debian's
docker-registry and MediaWiki (Debian's 1.39 on SQLite, served by ``php -S``).

Each is a context manager over a temporary directory; a missing program skips the test with
the reason, except under ``CI=true``, where it fails (CI must run them all).  What installs
them is scripts/test.sh.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

VERDACCIO = os.environ.get(
    "CAPALARM_VERDACCIO", "/opt/capalarm-test/verdaccio/node_modules/.bin/verdaccio"
)
MEDIAWIKI = "/usr/share/mediawiki"
STARTUP_SECONDS = 60.0


def unavailable(reason: str) -> None:
    """Skip the calling test; under CI fail instead (CI must run every real registry)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason} (run scripts/test.sh)")
    pytest.skip(f"{reason} (scripts/test.sh installs it)")


def program(name: str) -> str:
    found = shutil.which(name) or (
        name if os.path.isabs(name) and os.access(name, os.X_OK) else None
    )
    if found is None:
        unavailable(f"{name} is not installed")
    assert found is not None
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str  # what a capalarm source is configured with
    proc: subprocess.Popen[bytes]
    workdir: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return self.url.split("/", 3)[0] + "//" + self.url.split("/", 3)[2]


def wait_http(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = STARTUP_SECONDS
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url}: not up after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def running(
    cmd: list[str],
    workdir: Path,
    ready_url: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """The server process, its output in ``workdir/server.log``, once it answers HTTP."""
    log = workdir / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd or workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    try:
        wait_http(ready_url, proc, log)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def request(
    method: str,
    url: str,
    body: object = None,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    if body is not None:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# pypiserver imports passlib's htpasswd support, which probes bcrypt at import and fails with
# bcrypt >= 4.1 (no ``__about__``; bcrypt 5 refuses the 73-byte probe password it hashes).
# The index here runs without authentication (``-a . -P .``), so bcrypt is hidden from it: a
# ``None`` in sys.modules makes ``import bcrypt`` raise ImportError (the import system's
# documented behaviour), and passlib then offers htpasswd without bcrypt.
PYPISERVER_MAIN = (
    "import sys; sys.modules['bcrypt'] = None; sys.argv[0] = 'pypi-server'; "
    "from pypiserver.__main__ import main; sys.exit(main())"
)


@contextlib.contextmanager
def pypiserver(workdir: Path, port: int | None = None) -> Iterator[Server]:
    """pypiserver (HTML simple index only), uploads without authentication.  Started again
    on the same ``workdir`` and ``port``, it serves what was uploaded before (a registry that
    was down and came back)."""
    if importlib.util.find_spec("pypiserver") is None:
        unavailable("pypiserver is not installed")
    port = port or free_port()
    (workdir / "packages").mkdir(exist_ok=True)
    cmd = [sys.executable, "-c", PYPISERVER_MAIN, "run", "-p", str(port), "-i", "127.0.0.1"]
    cmd += ["-a", ".", "-P", ".", "packages"]
    with running(cmd, workdir, f"http://127.0.0.1:{port}/simple/") as proc:
        yield Server(
            f"http://127.0.0.1:{port}/simple/",
            proc,
            workdir,
            {"upload": f"http://127.0.0.1:{port}/"},
        )


@contextlib.contextmanager
def devpi(workdir: Path) -> Iterator[Server]:
    """devpi-server with user ``alice`` and her index ``alice/dev`` (no PyPI mirror)."""
    exe = program("devpi-server")
    init = program("devpi-init")
    port = free_port()
    subprocess.run(
        [init, "--serverdir", str(workdir / "data"), "--no-root-pypi"],
        check=True,
        capture_output=True,
    )
    base = f"http://127.0.0.1:{port}"
    cmd = [exe, "--serverdir", str(workdir / "data"), "--host", "127.0.0.1", "--port", str(port)]
    with running(cmd, workdir, f"{base}/+api") as proc:
        status, _, body = request("PUT", f"{base}/alice", {"password": "alice-pass"})
        assert status == 201, body
        status, _, body = request(
            "PUT",
            f"{base}/alice/dev",
            {"bases": [], "volatile": True},
            basic("alice", "alice-pass"),
        )
        assert status in (200, 201), body
        yield Server(
            f"{base}/alice/dev/+simple/",
            proc,
            workdir,
            {"upload": f"{base}/alice/dev/", "user": "alice", "password": "alice-pass"},
        )


VERDACCIO_CONFIG = """\
storage: ./storage
auth:
  htpasswd:
    file: ./htpasswd
    max_users: 100
uplinks: {}
packages:
  '**':
    access: $all
    publish: $authenticated
    unpublish: $authenticated
log: {type: stdout, format: pretty, level: warn}
"""


@contextlib.contextmanager
def verdaccio(workdir: Path) -> Iterator[Server]:
    """verdaccio 6.8.0 (Node 20), with user ``alice`` and her token."""
    exe = program(VERDACCIO)
    port = free_port()
    (workdir / "config.yaml").write_text(VERDACCIO_CONFIG)
    base = f"http://127.0.0.1:{port}/"
    cmd = [exe, "--config", str(workdir / "config.yaml"), "--listen", f"127.0.0.1:{port}"]
    with running(cmd, workdir, base + "-/ping") as proc:
        status, _, body = request(
            "PUT",
            base + "-/user/org.couchdb.user:alice",
            {"name": "alice", "password": "alice-pass-1"},
        )
        assert status == 201, body
        yield Server(base, proc, workdir, {"token": json.loads(body)["token"]})


@contextlib.contextmanager
def docker_registry(workdir: Path, token_auth: dict[str, str] | None = None) -> Iterator[Server]:
    """Debian's docker-registry (distribution 2.8) with filesystem storage; with
    ``token_auth`` (``realm``, ``service``, ``issuer``, ``rootcertbundle``: distribution's
    ``auth.token`` section) it accepts only bearer tokens from that token server."""
    exe = program("docker-registry")
    port = free_port()
    auth = ""
    if token_auth is not None:
        auth = "auth: {token: " + json.dumps(token_auth) + "}\n"
    (workdir / "config.yml").write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {workdir / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n" + auth
    )
    base = f"http://127.0.0.1:{port}/"
    with running([exe, "serve", str(workdir / "config.yml")], workdir, base + "v2/") as proc:
        yield Server(base, proc, workdir)


WIKI_SETTINGS = """
$wgEnableUploads = true;
$wgUploadDirectory = __DIR__ . "/images";
$wgUploadPath = "/images";
$wgRateLimits = [];
$wgMainCacheType = CACHE_NONE;
$wgGroupPermissions['*']['edit'] = true;
$wgGroupPermissions['*']['createpage'] = true;
"""


@contextlib.contextmanager
def mediawiki(workdir: Path) -> Iterator[Server]:
    """Debian's MediaWiki 1.39, installed on SQLite into ``workdir`` and served by ``php -S``;
    anonymous edits allowed, as the July wikis did."""
    php = program("php")
    if not Path(MEDIAWIKI, "maintenance", "install.php").exists():
        unavailable("Debian's mediawiki package is not installed")
    probe = subprocess.run([php, "-m"], capture_output=True, text=True)
    if "pdo_sqlite" not in probe.stdout:
        unavailable("php-sqlite3 is not installed")
    port = free_port()
    (workdir / "data").mkdir()
    (workdir / "images").mkdir()
    subprocess.run(
        [
            php, f"{MEDIAWIKI}/maintenance/install.php",
            "--dbtype", "sqlite", "--dbpath", str(workdir / "data"), "--dbname", "wiki",
            "--confpath", str(workdir), "--server", f"http://127.0.0.1:{port}",
            "--scriptpath", "", "--pass", "capalarm-admin-pass-1", "--lang", "en",
            "TestWiki", "Admin",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    settings = workdir / "LocalSettings.php"
    settings.write_text(settings.read_text() + WIKI_SETTINGS)
    api = f"http://127.0.0.1:{port}/api.php"
    cmd = [php, "-S", f"127.0.0.1:{port}", "-t", MEDIAWIKI]
    env = {"MW_CONFIG_FILE": str(settings)}
    # php -S serves the directory it runs in; MW_CONFIG_FILE points MediaWiki at our settings.
    with running(cmd, workdir, api, env, cwd=MEDIAWIKI) as proc:
        yield Server(api, proc, workdir)


def python_tool(name: str) -> list[str]:
    """A Python console tool by module (twine), from this interpreter."""
    return [sys.executable, "-m", name]
