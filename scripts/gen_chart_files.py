"""Write the Helm chart's derived files, or with ``--check`` report the ones that are stale.

- ``helm/capalarm/values.schema.json``: the chart's own keys, plus ``config``: the service's
  configuration schema exactly as the service validates it, generated from
  ``alarm.config.Config`` (pydantic's JSON Schema, draft 2020-12,
  https://docs.pydantic.dev/latest/concepts/json_schema/).  Helm validates values against it on
  install, upgrade, lint and template (https://helm.sh/docs/topics/charts/#schema-files).
- ``helm/capalarm/files/``: byte-identical copies of the rules and dashboards in
  ``dashboards/``; ``.Files.Get`` reads only files inside the chart
  (https://helm.sh/docs/chart_template_guide/accessing_files/).
- ``helm/capalarm/files/placement.yaml``: which workload runs each source type and carries
  each kind's surfaces, from the kind registry (alarm/kinds/, ``Kind.workload``) and the source
  types (alarm/collectors/, each feeds one kind); templates/_helpers.tpl reads it.

tests/test_helm.py runs ``--check``, so the committed files cannot drift from the code.
Run after changing alarm/config.py (or any source, kind, classifier or notification model), the
chart's keys below, or dashboards/:

    python scripts/gen_chart_files.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from alarm.collectors import SOURCE_TYPES  # noqa: E402  (after the path set-up above)
from alarm.config import Config  # noqa: E402
from alarm.kinds import KINDS  # noqa: E402

CHART = ROOT / "helm" / "capalarm"
DASHBOARDS = ROOT / "dashboards"
COPIED = ("capalarm.rules.yml", "capalarm-overview.json", "capalarm-surface.json")


class ConfigInputSchema(GenerateJsonSchema):
    """What a user may *write*, for validation before the service sees it.

    A before-validator (``BeforeValidator``) turns what was written into the field's type:
    durations such as ``10s`` into seconds, a single name into a list, an ISO 8601 time into a
    timestamp.  pydantic describes such a field by the type it ends as, unless the validator
    declares ``json_schema_input_type``; a value file holding ``tick: 10s`` would then be
    rejected by Helm although the service accepts it.  Where the input type is not declared,
    this widens the field to "that type, or a string": every before-validator in the service's
    models parses strings (the service itself still validates the rendered config, and
    tests/test_helm.py checks the examples against both)."""

    def function_before_schema(
        self, schema: core_schema.BeforeValidatorFunctionSchema
    ) -> JsonSchemaValue:
        declared = schema.get("json_schema_input_schema")
        inner = self.generate_inner(declared or schema["schema"])
        if declared or inner.get("type") == "string":
            return inner
        return {"anyOf": [inner, {"type": "string"}]}


def config_schema() -> dict[str, Any]:
    return Config.model_json_schema(mode="validation", schema_generator=ConfigInputSchema)


def _obj(description: str, properties: dict[str, Any] | None = None, **extra: Any) -> dict:
    out: dict[str, Any] = {"type": "object", "description": description}
    if properties is not None:
        out["properties"] = properties
        out["additionalProperties"] = False
    out.update(extra)
    return out


def _str(description: str, **extra: Any) -> dict:
    return {"type": "string", "description": description, **extra}


def _bool(description: str) -> dict:
    return {"type": "boolean", "description": description}


def _arr(description: str, items: dict | None = None) -> dict:
    return {"type": "array", "description": description, "items": items or {}}


K8S = "a Kubernetes object, passed through as given"


def _pod_keys(what: str) -> dict[str, Any]:
    """Scheduling and pod-level keys both workloads share."""
    return {
        "resources": _obj(f"requests and limits of the {what} container ({K8S})"),
        "nodeSelector": _obj(
            "node labels the pods must match", additionalProperties={"type": "string"}
        ),
        "tolerations": _arr(f"tolerations ({K8S})", {"type": "object"}),
        "affinity": _obj(f"affinity ({K8S})"),
        "priorityClassName": _str("priority class of the pods"),
        "podAnnotations": _obj("extra pod annotations", additionalProperties={"type": "string"}),
        "podLabels": _obj("extra pod labels", additionalProperties={"type": "string"}),
        "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
        "extraArgs": _arr("extra arguments after `run --config ...`", {"type": "string"}),
        "extraVolumes": _arr(f"extra pod volumes ({K8S})", {"type": "object"}),
        "extraVolumeMounts": _arr(f"extra container volume mounts ({K8S})", {"type": "object"}),
        "env": _arr(f"extra container environment variables ({K8S})", {"type": "object"}),
    }


def chart_keys() -> dict[str, Any]:
    """The chart's own keys (everything except ``config``), following the layout of the
    prometheus-community charts (charts/prometheus-node-exporter/values.yaml)."""
    image = _obj(
        "the capalarm image (built from the repository's Dockerfile)",
        {
            "registry": _str("registry host; empty: none (a local or default registry)"),
            "repository": _str("image repository", minLength=1),
            "tag": _str("image tag; empty: the chart's appVersion"),
            "digest": _str(
                "sha256:... digest; pins the image when set", pattern=r"^(sha256:[0-9a-f]{64})?$"
            ),
            "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        },
    )
    secret_mount = _obj(
        "a Secret mounted as files under /etc/capalarm/secrets/<name>/, for {file: ...} in config",
        {
            "name": _str(
                "directory name under /etc/capalarm/secrets/",
                pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
            ),
            "existingSecret": _str("name of a Secret in the release namespace", minLength=1),
            "workloads": _arr(
                "which workloads mount it",
                {"enum": ["daemonset", "deployment"]},
            ),
        },
        required=["name", "existingSecret"],
    )
    monitor = _obj(
        "the ServiceMonitor (Prometheus Operator, monitoring.coreos.com/v1)",
        {
            "enabled": _bool("render a ServiceMonitor for both workloads"),
            "apiVersion": _str("API version; empty: monitoring.coreos.com/v1"),
            "namespace": _str("namespace of the ServiceMonitor; empty: the release's"),
            "additionalLabels": _obj(
                "labels the Prometheus' serviceMonitorSelector matches",
                additionalProperties={"type": "string"},
            ),
            "jobLabel": _str(
                'Service label whose value becomes `job`; the rules expect job="capalarm"'
            ),
            "interval": _str("scrape interval; empty: Prometheus' default"),
            "scrapeTimeout": _str("scrape timeout; empty: Prometheus' default"),
            "scheme": {"enum": ["http", "https"]},
            "tlsConfig": _obj(f"endpoint tlsConfig ({K8S})"),
            "basicAuth": _obj(f"endpoint basicAuth ({K8S})"),
            "relabelings": _arr("relabelings applied before the scrape", {"type": "object"}),
            "metricRelabelings": _arr("relabelings applied to scraped samples", {"type": "object"}),
            "sampleLimit": {"type": "integer", "minimum": 0},
        },
    )
    rules = _obj(
        "the PrometheusRule with dashboards/capalarm.rules.yml",
        {
            "enabled": _bool("render a PrometheusRule"),
            "apiVersion": _str("API version; empty: monitoring.coreos.com/v1"),
            "namespace": _str("namespace of the PrometheusRule; empty: the release's"),
            "additionalLabels": _obj(
                "labels the Prometheus' ruleSelector matches",
                additionalProperties={"type": "string"},
            ),
        },
    )
    daemonset = _obj(
        "the DaemonSet: node-local sources (auto, kmsg, journald, file, fs)",
        {
            "enabled": _bool("render it when the config has node-local sources"),
            "kmsg": _obj(
                "/dev/kmsg access (sources of type auto and kmsg)",
                {
                    "privileged": _bool(
                        "run privileged: the only way past the container runtime's device cgroup to "
                        "/dev/kmsg; otherwise `auto` sources read the host journal"
                    ),
                    "realtime": _bool("grant CAP_SYS_NICE so the kmsg drain may use SCHED_FIFO"),
                },
            ),
            "hostJournal": _bool(
                "mount the host's /var/log, /run/log and /etc/machine-id read-only (journald, file sources)"
            ),
            "fsReadAll": _bool(
                "grant CAP_DAC_READ_SEARCH when fs sources exist: watch trees whatever their modes"
            ),
            "fanotify": _bool(
                "grant CAP_SYS_ADMIN for fs sources with mode fanotify (or auto using it)"
            ),
            "extraCapabilities": _arr(
                "capabilities added besides those the sources need",
                {"type": "string", "pattern": "^[A-Z_]+$"},
            ),
            "stateHostPath": _str(
                "host directory for the state database (positions, outbox)", pattern="^/"
            ),
            "runAsUser": {
                "type": "integer",
                "minimum": 0,
                "description": "uid; 0 reads root-owned logs without any capability",
            },
            "updateStrategy": _obj(f"DaemonSet updateStrategy ({K8S})"),
            **_pod_keys("DaemonSet"),
        },
    )
    deployment = _obj(
        "the Deployment: cluster-wide sources (registry and board pollers)",
        {
            "enabled": _bool("render it when the config has registry sources"),
            "persistence": _obj(
                "the PersistentVolumeClaim for the state database",
                {
                    "enabled": _bool("claim a volume; false: emptyDir (state lost on restart)"),
                    "existingClaim": _str("use this claim instead of creating one"),
                    "storageClassName": _str("storage class; empty: the cluster default"),
                    "accessModes": _arr("access modes", {"type": "string"}),
                    "size": _str("requested size", minLength=1),
                },
            ),
            "securityContext": _obj(f"pod securityContext ({K8S})"),
            **_pod_keys("Deployment"),
        },
    )
    return {
        "global": _obj(
            "values shared with parent charts",
            {
                "imageRegistry": _str("overrides image.registry"),
                "imagePullSecrets": _arr("pull secrets (names or {name: ...})"),
            },
        ),
        "nameOverride": _str("replaces the chart name in resource names"),
        "fullnameOverride": _str("replaces the release-chart name in resource names"),
        "namespaceOverride": _str("namespace of every resource; empty: the release's"),
        "commonLabels": _obj(
            "labels added to every resource", additionalProperties={"type": "string"}
        ),
        "image": image,
        "imagePullSecrets": _arr("pull secrets (names or {name: ...})"),
        "serviceAccount": _obj(
            "the pods' ServiceAccount (capalarm calls no Kubernetes API)",
            {
                "create": _bool("create one"),
                "name": _str("its name; empty: the full name"),
                "annotations": _obj("annotations", additionalProperties={"type": "string"}),
                "automountServiceAccountToken": _bool("mount an API token (not needed)"),
            },
        ),
        "secretMounts": _arr("Secrets with webhook and registry credentials", secret_mount),
        "service": _obj(
            "the Services (one per workload) in front of /metrics and the API",
            {
                "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "portName": _str(
                    "port name the ServiceMonitor scrapes",
                    pattern=r"^[a-z]([-a-z0-9]{0,13}[a-z0-9])?$",
                ),
                "scrapeAnnotations": _bool(
                    "prometheus.io/scrape, /port, /path and /scheme annotations on the Services"
                ),
                "annotations": _obj("annotations", additionalProperties={"type": "string"}),
                "labels": _obj("labels", additionalProperties={"type": "string"}),
            },
        ),
        "webConfig": _obj(
            "TLS and basic auth (--web.config.file, the exporter-toolkit format) from a Secret",
            {
                "existingSecret": _str(
                    "Secret holding the web config and the files it names, mounted at "
                    "/etc/capalarm/web/; empty: plain HTTP without auth"
                ),
                "key": _str("the web config's key in the Secret", minLength=1),
                "tls": _bool("the web config serves TLS: probes and annotations say https"),
            },
        ),
        "prometheus": _obj("Prometheus Operator resources", {"monitor": monitor, "rules": rules}),
        "dashboards": _obj(
            "Grafana dashboards as ConfigMaps for the Grafana sidecar (kube-prometheus-stack)",
            {
                "enabled": _bool("render the dashboard ConfigMap"),
                "namespace": _str("namespace; empty: the release's"),
                "labels": _obj(
                    "labels the sidecar selects", additionalProperties={"type": "string"}
                ),
                "annotations": _obj(
                    "annotations (e.g. grafana_folder)", additionalProperties={"type": "string"}
                ),
            },
        ),
        "networkPolicy": _obj(
            "a NetworkPolicy for both workloads",
            {
                "enabled": _bool("render it"),
                "ingress": _arr(
                    "ingress rules; empty: the metrics port from anywhere", {"type": "object"}
                ),
                "egress": _arr("egress rules; empty: egress not restricted", {"type": "object"}),
            },
        ),
        "podDisruptionBudget": _obj(
            "a PodDisruptionBudget per workload",
            {"enabled": _bool("render them"), "maxUnavailable": {"type": ["integer", "string"]}},
        ),
        "containerSecurityContext": _obj(f"merged into both containers' securityContext ({K8S})"),
        "livenessProbe": _obj(f"liveness probe ({K8S})"),
        "readinessProbe": _obj(f"readiness probe ({K8S})"),
        "daemonset": daemonset,
        "deployment": deployment,
    }


def values_schema() -> dict[str, Any]:
    config = config_schema()
    defs = config.pop("$defs", {})
    config["description"] = (
        "the capalarm configuration (alarm/config.py; `capalarm check-config`): the chart "
        "gives node-local sources to the DaemonSet and registry sources to the Deployment"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "capalarm chart values",
        "type": "object",
        "additionalProperties": False,
        "properties": {**chart_keys(), "config": config},
        "$defs": defs,
    }


PLACEMENT_HEADER = """\
# Generated by scripts/gen_chart_files.py from the kind registry (alarm/kinds/) and the source
# types (alarm/collectors/): the workload that runs each source type (that of the kind it
# feeds) and whose config carries each kind's surfaces.  Do not edit: add a kind module, then
# run python scripts/gen_chart_files.py.
"""


def placement() -> str:
    workloads: dict[str, dict[str, list[str]]] = {
        w: {"kinds": [], "sourceTypes": []} for w in ("daemonset", "deployment")
    }
    for name, kind in KINDS.items():
        workloads[kind.workload]["kinds"].append(name)
    for name, source in sorted(SOURCE_TYPES.items()):
        workloads[KINDS[source.kind].workload]["sourceTypes"].append(name)
    lines = [PLACEMENT_HEADER.rstrip("\n")]
    for workload, keys in workloads.items():
        lines.append(f"{workload}:")
        lines += [f"  {key}: [{', '.join(names)}]" for key, names in keys.items()]
    return "\n".join(lines) + "\n"


def outputs() -> dict[Path, bytes]:
    out = {CHART / "values.schema.json": (json.dumps(values_schema(), indent=2) + "\n").encode()}
    out[CHART / "files" / "placement.yaml"] = placement().encode()
    for name in COPIED:
        out[CHART / "files" / name] = (DASHBOARDS / name).read_bytes()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 naming stale files; write nothing"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, data in outputs().items():
        if path.exists() and path.read_bytes() == data:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if args.check and stale:
        print("stale (run python scripts/gen_chart_files.py):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
