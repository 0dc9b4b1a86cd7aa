"""The real registries the registry tests run against (tests/registries/servers.py), one of
each per test module that asks for it: a module's tests share its server, modules do not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.registries import servers


@pytest.fixture(scope="module")
def pypiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    with servers.pypiserver(tmp_path_factory.mktemp("pypiserver")) as server:
        yield server


@pytest.fixture(scope="module")
def devpi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    with servers.devpi(tmp_path_factory.mktemp("devpi")) as server:
        yield server


@pytest.fixture(scope="module")
def verdaccio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    with servers.verdaccio(tmp_path_factory.mktemp("verdaccio")) as server:
        yield server


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    with servers.docker_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture(scope="module")
def wiki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    with servers.mediawiki(tmp_path_factory.mktemp("wiki")) as server:
        yield server
