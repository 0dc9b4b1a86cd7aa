"""The registry family: package registries, container registries, wikis and boards, polled.

One source type, ``type: registry``, with one adapter per ``api`` (pypi.py, npm.py, oci.py,
artifactory.py, nexus.py, mediawiki.py, generic.py) behind one shared poller (poller.py) and
HTTP client (http.py, with OCI token authentication in token_auth.py); what a registry held is
kept in listing.py.  Proof of sight: why a source is blind (sight.py), and the optional canary
that uploads through each API's own upload and checks the polls list it (canary.py,
uploads.py).  What leaves this folder is write events whose subjects are
``(repository, artifact)`` keys (alarm/classify/registry.py).  The source type is registered
by registry_type.py, which imports neither the poller nor the HTTP client (base.py).
"""

from alarm.collectors.registry import registry_type

SOURCES = (registry_type.SOURCE,)
