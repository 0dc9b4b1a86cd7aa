"""How each API spells the names the poll lists and the canary writes: PEP 503 project
names, npm package URLs, OCI repository names, MediaWiki titles.  A leaf module: the
settings (which check a canary's repository), the adapters and the uploads share it."""

from __future__ import annotations

import re
from urllib.parse import quote

_PYPI_NORMALIZE = re.compile(r"[-_.]+")
PYPI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")  # PEP 508
NPM_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._-]{0,100}/)?[a-z0-9][a-z0-9._-]{0,100}$")
# OCI distribution spec, "Pulling manifests": the components of <name>.
OCI_NAME = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
# MediaWiki's $wgLegalTitleChars excludes these.
WIKI_TITLE = re.compile(r"^[^#<>\[\]|{}\x00-\x1f\x7f]{1,200}$")


def normalize(name: str) -> str:
    """A PyPI project name as PEP 503 compares it: runs of ``-_.`` to ``-``, lower case."""
    return _PYPI_NORMALIZE.sub("-", name).lower()


def packument_url(base: str, name: str) -> str:
    """An npm package's document (scoped names with the ``/`` escaped, as npm sends them)."""
    return base + quote(name, safe="@")


def wiki_title(text: str) -> str:
    """A title as the wiki lists it: ``_`` is a space, runs of spaces one, and the first
    letter upper case (MediaWiki's default ``$wgCapitalLinks``)."""
    title = " ".join(text.replace("_", " ").split())
    return title[:1].upper() + title[1:]
