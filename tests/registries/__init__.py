"""Real registries on loopback for the registry source tests (servers.py starts them,
clients.py writes to them as a confined workload would, harness.py drives the collector;
token_server.py is a Docker token server for docker-registry's ``auth: token``, stale_proxy.py
a cache in front of a registry that can stop refreshing or refuse uploads)."""
