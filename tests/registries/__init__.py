"""Real registries on loopback for the registry source tests (servers.py starts them,
clients.py writes to them as a confined workload would, harness.py drives the collector)."""
