"""The real registries the registry tests run against (tests/registries/servers.py), one of
each per test module that asks for it: a module's tests share its server, modules do not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.registries import servers

Start = Callable[[Path], AbstractContextManager[servers.Server]]


def _served(start: Start, name: str) -> Callable[..., Iterator[servers.Server]]:
    """A module-scoped fixture running ``start`` in a directory of its own."""

    @pytest.fixture(scope="module", name=name)
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
        with start(tmp_path_factory.mktemp(name)) as server:
            yield server

    return fixture


pypiserver = _served(servers.pypiserver, "pypiserver")
devpi = _served(servers.devpi, "devpi")
verdaccio = _served(servers.verdaccio, "verdaccio")
registry = _served(servers.docker_registry, "registry")
wiki = _served(servers.mediawiki, "wiki")
