"""Kind ``registry``: uploads and edits that pollers see on package registries, wikis and
boards (alarm/collectors/registry/); classified by source and repository
(alarm/classify/registry.py).  Pollers run once for the cluster."""

from alarm.classify.registry import RegistryClassifier, RegistryMatch
from alarm.kind import Kind, horizons

KIND = Kind(
    name="registry",
    match=RegistryMatch,
    classifier=RegistryClassifier,
    # A tenth of egress: an upload is a deliberate, named act, and registries see few.
    budget=horizons(1e5, 8e6, (25e3, 64e6), (10e3, 256e6)),
    newsurface=(8e3, 16e6),
    workload="deployment",
    summary="uploads and edits on registries, wikis and boards",
)
