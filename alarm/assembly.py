"""The composition root of the configuration: what the one configuration is assembled from.

alarm/config.py defines the model generically and names no collector and no kind; this module
names them: the source types the collectors register (``alarm.collectors.SOURCE_TYPES``: each
``type:`` with its settings model and the kind it feeds), the surface kinds
(``alarm.kinds.KINDS``: each ``kind:`` with its ``match:`` and default budget), the settings a
collector owns at the top level (the fence canary's ``egress_canary:``), and the tags of the
unions inside a source's settings (the registry source's ``api``).

alarm/config.py reads ``PARTS`` the first time a model is needed (``Config``,
``config_from_dict``, ``load_config``), so importing it, as the detector and the exporters do,
loads no collector (tests/test_layering.py)."""

from __future__ import annotations

from alarm.collectors import SOURCE_TYPES
from alarm.collectors.kernel.settings import EgressCanarySettings
from alarm.kinds import KINDS
from alarm.settings import ConfigParts

PARTS = ConfigParts(
    source_types=SOURCE_TYPES,
    kinds=KINDS,
    egress_canary=EgressCanarySettings,
    nested_tags=frozenset(tag for t in SOURCE_TYPES.values() for tag in t.nested_tags),
)
