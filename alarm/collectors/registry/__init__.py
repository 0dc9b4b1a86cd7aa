"""The registry family: package registries, container registries, wikis and boards, polled.

One source type, ``type: registry``, with one adapter per ``api`` (pypi.py, npm.py, oci.py,
artifactory.py, nexus.py, mediawiki.py, generic.py) behind one shared poller (poller.py) and
HTTP client (http.py); what a registry held is kept in listing.py.  What leaves this folder is
write events whose subjects are ``(repository, artifact)`` keys (alarm/classify/registry.py).
"""

from alarm.collectors.registry import source
from alarm.collectors.registry.settings import API_TAGS

SOURCES = (source.SOURCE,)
__all__ = ["API_TAGS", "SOURCES"]
