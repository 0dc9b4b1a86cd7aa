"""The Helm chart (helm/capalarm), linted and rendered by the real Helm engine (PyPI
helm-python-sdk, Helm's Go SDK as a library) with the default values and a full example;
the manifests validated against the Kubernetes schemas (kubernetes-validate) and the
Prometheus Operator's CRDs (tests/crds/); the configs it renders passed through
`capalarm check-config`; the image recipe checked against the chart and the package."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import setuptools
import yaml
from deploykit import CHART, DASHBOARDS, ROOT, RULES, run

import alarm
from alarm.cli import build_parser
from alarm.collectors import SOURCE_TYPES
from alarm.config import config_from_dict

helm = pytest.importorskip("helm_python", reason="needs PyPI helm-python-sdk")

KUBE_VERSION = kubernetes_validate.latest_version()
NODE_TYPES = {"auto", "kmsg", "journald", "file", "fs"}
DEFAULT = CHART / "ci" / "default-values.yaml"
FULL = CHART / "ci" / "full-values.yaml"
CRDS = {
    "ServiceMonitor": ROOT / "tests" / "crds" / "servicemonitors.yaml",
    "PrometheusRule": ROOT / "tests" / "crds" / "prometheusrules.yaml",
}


def values_of(path: Path) -> dict[str, Any]:
    """Values as Helm reads a -f file (its own YAML parser: timestamps stay strings)."""
    return helm.values_from_yaml(path.read_text())


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    out = chart.render(values, name="capalarm", namespace="monitoring", is_install=True)
    docs = []
    for name, text in sorted(out.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@cache
def rendered(path: Path) -> tuple[dict[str, Any], ...]:
    return tuple(render(values_of(path)))


def kinds(docs, kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def configs(docs) -> dict[str, dict[str, Any]]:
    """Component ("node", "cluster") -> the service config its ConfigMap carries."""
    return {
        cm["metadata"]["labels"]["app.kubernetes.io/component"]: yaml.safe_load(
            cm["data"]["config.yaml"]
        )
        for cm in kinds(docs, "ConfigMap")
        if "config.yaml" in cm.get("data", {})
    }


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [c] = workload["spec"]["template"]["spec"]["containers"]
    return c


def require_source_types(*names: str) -> None:
    missing = [n for n in names if n not in SOURCE_TYPES]
    if missing:
        pytest.fail(
            f"source types {missing} are not registered in alarm.collectors.SOURCE_TYPES, "
            "so the generated values schema rejects them: land the fs/registry families and "
            "run python scripts/gen_chart_files.py"
        )


@pytest.fixture(params=[DEFAULT, FULL], ids=["default", "full"])
def example(request) -> Path:
    if request.param == FULL:
        require_source_types("fs", "registry")
    return request.param


def test_chart_files_are_generated_and_current():
    """values.schema.json is the service's own schema (plus the chart's keys) and the
    rules and dashboards in files/ are dashboards/'s: regenerating changes nothing."""
    res = run([sys.executable, "scripts/gen_chart_files.py", "--check"], cwd=ROOT)
    assert res.returncode == 0, res.stderr
    for name in ("capalarm.rules.yml", "capalarm-overview.json", "capalarm-surface.json"):
        assert (CHART / "files" / name).read_bytes() == (DASHBOARDS / name).read_bytes()


def test_lint_is_clean(example):
    report = helm.lint(CHART, values_of(example), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [], problems


def python_patterns(schema: Any) -> Any:
    """The CRD's patterns are Go regular expressions (RE2); the ones here differ from
    Python's only in where an inline flag may stand: ``^(?i)x`` is ``(?i)^x`` in Python."""
    if isinstance(schema, dict):
        out = {k: python_patterns(v) for k, v in schema.items()}
        if isinstance(out.get("pattern"), str):
            out["pattern"] = re.sub(r"^\^(\(\?[a-z]+\))", r"\1^", out["pattern"])
        return out
    if isinstance(schema, list):
        return [python_patterns(v) for v in schema]
    return schema


def crd_schema(kind: str, api_version: str) -> dict[str, Any]:
    """The openAPIV3Schema the API server validates a custom resource of ``kind`` with."""
    crd = yaml.safe_load(CRDS[kind].read_text().split("---", 1)[1])
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == api_version.split("/")[1]]
    return python_patterns(version["schema"]["openAPIV3Schema"])


def test_manifests_validate_against_kubernetes_schemas(example):
    docs = rendered(example)
    assert docs
    for doc in docs:
        if doc["kind"] in CRDS:
            jsonschema.Draft7Validator(crd_schema(doc["kind"], doc["apiVersion"])).validate(doc)
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_rendered_configs_pass_check_config(example, tmp_path):
    for component, config in configs(rendered(example)).items():
        path = tmp_path / f"{component}.yaml"
        path.write_text(yaml.safe_dump(config))
        res = run([sys.executable, "-m", "alarm.cli", "check-config", str(path)], cwd=ROOT)
        assert res.returncode == 0, f"{component}: {res.stderr}"
        assert res.stdout.startswith(f"{path}: ok"), res.stdout


def test_config_is_split_by_where_each_source_runs():
    """One values file: node-local sources and the egress and fs surfaces to the DaemonSet,
    registry sources and surfaces to the Deployment, every other key to both."""
    require_source_types("fs", "registry")
    given = values_of(FULL)["config"]
    split = configs(rendered(FULL))
    node, cluster = split["node"], split["cluster"]
    assert [s["name"] for s in node["sources"]] == [
        s["name"] for s in given["sources"] if s.get("type", "auto") in NODE_TYPES
    ]
    assert [s["name"] for s in cluster["sources"]] == [
        s["name"] for s in given["sources"] if s["type"] == "registry"
    ]
    assert {s.get("kind", "egress") for s in node["surfaces"]} == {"egress", "fs"}
    assert {s["kind"] for s in cluster["surfaces"]} == {"registry"}
    assert len(node["surfaces"]) + len(cluster["surfaces"]) == len(given["surfaces"])
    assert set(node["unclassified"]) == {"egress"} and set(cluster["unclassified"]) == {"registry"}
    for key in ("tick", "notifications"):
        assert node[key] == cluster[key] == given[key]
    for config in (node, cluster):
        assert config["http"]["listen"] == "0.0.0.0:9733"


def test_default_values_run_only_the_daemonset():
    docs = rendered(DEFAULT)
    assert [d["metadata"]["name"] for d in kinds(docs, "DaemonSet")] == ["capalarm-node"]
    assert kinds(docs, "Deployment") == [] and kinds(docs, "PersistentVolumeClaim") == []
    assert configs(docs)["node"]["sources"] == [
        {"name": "kernel", "type": "auto", "prefixes": ["EGRESS_FENCE"]}
    ]


def security(workload) -> dict[str, Any]:
    return container(workload)["securityContext"]


def test_daemonset_has_least_privilege_by_default():
    ds = one(rendered(DEFAULT), "DaemonSet", "capalarm-node")
    pod = ds["spec"]["template"]["spec"]
    sc = security(ds)
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG", "SYS_NICE"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert "privileged" not in sc
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    assert pod["automountServiceAccountToken"] is False
    assert set(container(ds)["resources"]) == {"requests", "limits"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container(ds)["volumeMounts"]:
        if "hostPath" in volumes[mount["name"]] and mount["name"] != "state":
            assert mount.get("readOnly") is True, mount
    by_path = {m["mountPath"]: volumes[m["name"]] for m in container(ds)["volumeMounts"]}
    assert by_path["/dev/kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert by_path["/var/lib/capalarm"]["hostPath"]["path"] == "/var/lib/capalarm"
    assert "/var/log" in by_path and "/etc/machine-id" in by_path  # the journal fallback


def test_capabilities_follow_the_sources():
    """No kernel source: no CAP_SYSLOG and no /dev/kmsg; fs sources with fanotify:
    CAP_DAC_READ_SEARCH and CAP_SYS_ADMIN, their trees mounted read-only at their paths."""
    require_source_types("fs")
    values = {
        "config": {
            "sources": [
                {"name": "scratch", "type": "fs", "paths": ["/srv/scratch"], "mode": "fanotify"}
            ]
        },
        "daemonset": {"fanotify": True},
    }
    ds = one(render(values), "DaemonSet", "capalarm-node")
    assert security(ds)["capabilities"] == {
        "drop": ["ALL"],
        "add": ["DAC_READ_SEARCH", "SYS_ADMIN"],
    }
    mounts = {m["mountPath"]: m for m in container(ds)["volumeMounts"]}
    assert "/dev/kmsg" not in mounts and "/var/log" not in mounts
    assert mounts["/srv/scratch"]["readOnly"] is True


def test_file_source_mounts_its_directory_and_needs_no_capability():
    values = {
        "config": {
            "sources": [{"name": "kernlog", "type": "file", "paths": ["/var/log/kern.log*"]}]
        }
    }
    ds = one(render(values), "DaemonSet", "capalarm-node")
    assert security(ds)["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m for m in container(ds)["volumeMounts"]}
    assert mounts["/var/log"]["readOnly"] is True and "/dev/kmsg" not in mounts


def test_privileged_kmsg_is_opt_in():
    ds = one(render({"daemonset": {"kmsg": {"privileged": True}}}), "DaemonSet", "capalarm-node")
    assert security(ds)["privileged"] is True
    assert "allowPrivilegeEscalation" not in security(ds)  # the API rejects both together


def test_deployment_runs_as_the_images_non_root_user_with_a_claim():
    require_source_types("registry")
    docs = rendered(FULL)
    dp = one(docs, "Deployment", "capalarm-cluster")
    pod = dp["spec"]["template"]["spec"]
    uid, gid = dockerfile_user()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
    assert security(dp)["capabilities"] == {"drop": ["ALL"]}
    assert security(dp)["readOnlyRootFilesystem"] is True
    assert dp["spec"]["replicas"] == 1 and dp["spec"]["strategy"]["type"] == "Recreate"
    claim = next(v for v in pod["volumes"] if v["name"] == "state")["persistentVolumeClaim"][
        "claimName"
    ]
    pvc = one(docs, "PersistentVolumeClaim", claim)
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
    mounts = {m["name"]: m["mountPath"] for m in container(dp)["volumeMounts"]}
    assert mounts["state"] == configs(docs)["cluster"]["state_dir"]


def test_secrets_are_mounted_where_the_config_refers_to_them():
    require_source_types("fs", "registry")
    docs = rendered(FULL)
    for name, component in (("capalarm-node", "node"), ("capalarm-cluster", "cluster")):
        workload = next(
            d
            for d in docs
            if d["metadata"]["name"] == name and d["kind"] in ("DaemonSet", "Deployment")
        )
        mounts = [m["mountPath"] for m in container(workload)["volumeMounts"]]
        text = json.dumps(configs(docs)[component])
        for ref in set(re.findall(r'"file": "(/etc/capalarm/secrets/[^"]+)"', text)):
            assert any(ref.startswith(m + "/") for m in mounts), f"{name}: {ref} not mounted"
    dp = one(docs, "Deployment", "capalarm-cluster")
    ds = one(docs, "DaemonSet", "capalarm-node")
    assert "capalarm-wiki-token" in secret_names(dp) and "capalarm-wiki-token" not in secret_names(
        ds
    )


def secret_names(workload) -> set[str]:
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return {v["secret"]["secretName"] for v in volumes if "secret" in v}


def test_servicemonitor_scrapes_both_workloads_as_job_capalarm():
    require_source_types("fs", "registry")
    docs = rendered(FULL)
    [sm] = kinds(docs, "ServiceMonitor")
    services = kinds(docs, "Service")
    assert {s["metadata"]["name"] for s in services} == {"capalarm-node", "capalarm-cluster"}
    for svc in services:
        labels = svc["metadata"]["labels"]
        assert sm["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels[sm["spec"]["jobLabel"]] == "capalarm"  # the rules' job="capalarm"
        assert svc["spec"]["publishNotReadyAddresses"] is True
        assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert 'job="capalarm"' in RULES.read_text()


def test_prometheusrule_and_dashboards_are_the_repositorys_files():
    require_source_types("fs", "registry")
    docs = rendered(FULL)
    [rule] = kinds(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    dashboards = one(docs, "ConfigMap", "capalarm-dashboards")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    for name in ("capalarm-overview.json", "capalarm-surface.json"):
        assert json.loads(dashboards["data"][name]) == json.loads((DASHBOARDS / name).read_text())


def test_a_typo_in_config_is_refused_at_install():
    with pytest.raises(helm.HelmError) as err:
        render({"config": {"tikc": "10s"}})
    assert "tikc" in str(err.value)


def test_durations_and_times_written_as_strings_are_accepted():
    """What the service accepts as text (10s, 2026-12-01T02:00:00Z) its schema accepts too."""
    config = {
        "tick": "15s",
        "sources": [{"name": "kernel"}],
        "event_time": {"lateness": "1m"},
        "notifications": {
            "silences": [
                {
                    "match": {"targets": "dns"},
                    "starts": "2026-12-01T02:00:00Z",
                    "ends": "2026-12-01T04:00:00Z",
                }
            ]
        },
    }
    config_from_dict(config)  # the service's own validation
    [cm] = [d for d in render({"config": config}) if d["kind"] == "ConfigMap"]
    assert yaml.safe_load(cm["data"]["config.yaml"])["tick"] == "15s"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"http": {"listen": "127.0.0.1:1"}}}, "config.http.listen"),
        (
            {"config": {"sources": [{"name": "k", "type": "file", "paths": ["/*/kern.log"]}]}},
            "cannot mount",
        ),
    ],
    ids=["listen-owned-by-chart", "glob-at-root"],
)
def test_values_the_chart_cannot_honour_fail_with_the_key(values, message):
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert message in str(err.value)


# --- the image recipe against the chart and the package -----------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    out = []
    for line in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerfile_user() -> tuple[int, int]:
    [user] = [rest for word, rest in dockerfile_instructions() if word == "USER"]
    uid, gid = user.split(":")
    return int(uid), int(gid)


def test_image_entrypoint_is_the_charts_command_and_the_packages_script():
    [entrypoint] = [
        json.loads(rest) for word, rest in dockerfile_instructions() if word == "ENTRYPOINT"
    ]
    [cmd] = [json.loads(rest) for word, rest in dockerfile_instructions() if word == "CMD"]
    ds = one(rendered(DEFAULT), "DaemonSet", "capalarm-node")
    # The chart runs what `docker run IMAGE` runs: the entrypoint with the default command.
    assert container(ds)["command"] == entrypoint + cmd
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[entrypoint[0]] == "alarm.cli:main"
    args = build_parser().parse_args(cmd)
    assert args.command == "run"
    mounts = {m["name"]: m["mountPath"] for m in container(ds)["volumeMounts"]}
    assert args.config == mounts["config"]
    [expose] = [rest for word, rest in dockerfile_instructions() if word == "EXPOSE"]
    assert int(expose) == container(ds)["ports"][0]["containerPort"]


def test_image_tag_defaults_to_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version == alarm.__version__
    ds = one(rendered(DEFAULT), "DaemonSet", "capalarm-node")
    assert container(ds)["image"] == f"capalarm:{version}"


def test_the_image_build_installs_every_package():
    """The build stage runs `pip install .` (not editable): only the packages pyproject.toml
    names are installed, so every package directory under alarm/ and exporters/ must be one
    of them, or the image fails at its first import."""
    setuptools_conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = setuptools_conf["packages"]
    if isinstance(listed, dict):  # packages.find (setuptools' automatic discovery)
        find = listed["find"]
        listed = setuptools.find_packages(
            where=str(ROOT / find.get("where", ["."])[0]),
            include=find.get("include", ["*"]),
            exclude=find.get("exclude", ()),
        )
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("alarm", "exporters")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert sorted(on_disk - set(listed)) == []


def test_notes_say_what_to_check_first():
    chart = helm.Chart.load(CHART)
    notes = chart.render({}, name="capalarm", namespace="monitoring", is_install=True)[
        "capalarm/templates/NOTES.txt"
    ]
    for what in ("/readyz", "capalarm_source_up", "EGRESS_FENCE", "nf_log_all_netns"):
        assert what in notes, what
    assert "kubectl -n monitoring get pods" in notes


def test_the_validators_refuse_broken_manifests():
    """Both validators can fail: a misspelt container field, a scrape interval that is not a
    duration."""
    ds = json.loads(json.dumps(one(rendered(DEFAULT), "DaemonSet", "capalarm-node")))
    container(ds)["securityContex"] = container(ds).pop("securityContext")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBE_VERSION, strict=True)
    [sm] = kinds(
        render({"prometheus": {"monitor": {"enabled": True, "interval": "15s"}}}), "ServiceMonitor"
    )
    jsonschema.Draft7Validator(crd_schema("ServiceMonitor", sm["apiVersion"])).validate(sm)
    sm["spec"]["endpoints"][0]["interval"] = "every minute"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(crd_schema("ServiceMonitor", sm["apiVersion"])).validate(sm)


# -- scraping, TLS and basic auth --------------------------------------------------------
def test_the_service_is_scraped_by_annotation_on_a_port_named_metrics():
    """Annotation-based discovery found nothing to scrape, and the port was named http where
    scrapers and prometheus-node-exporter's chart use metrics."""
    docs = rendered(DEFAULT)
    for svc in kinds(docs, "Service"):
        [port] = svc["spec"]["ports"]
        assert port["name"] == "metrics" and port["targetPort"] == "metrics"
        assert svc["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9733",
            "prometheus.io/path": "/metrics",
            "prometheus.io/scheme": "http",
        }
    ds = one(docs, "DaemonSet", "capalarm-node")
    c = container(ds)
    assert [p["name"] for p in c["ports"]] == ["metrics"]
    assert c["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert c["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert "args" not in c  # no web config: plain HTTP, as before


def test_annotations_can_be_turned_off_and_added_to():
    values = values_of(DEFAULT)
    values["service"] = {"scrapeAnnotations": False, "annotations": {"team": "sec"}}
    for svc in kinds(render(values), "Service"):
        assert svc["metadata"]["annotations"] == {"team": "sec"}


def test_tls_and_basic_auth_come_from_a_secret_and_the_probes_still_pass():
    values = values_of(DEFAULT)
    values["webConfig"] = {"existingSecret": "capalarm-web", "tls": True}
    docs = render(values)
    for svc in kinds(docs, "Service"):
        assert svc["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    for kind, name in (("DaemonSet", "capalarm-node"), ("Deployment", "capalarm-cluster")):
        workload = one(docs, kind, name) if kinds(docs, kind) else None
        if workload is None:
            continue
        c = container(workload)
        assert c["args"] == ["--web.config.file=/etc/capalarm/web/web-config.yml"]
        args = build_parser().parse_args(c["command"][1:] + c["args"])
        assert args.web_config_file == "/etc/capalarm/web/web-config.yml"
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["web-config"]["mountPath"] == "/etc/capalarm/web"
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["web-config"]["secret"]["secretName"] == "capalarm-web"
        for probe in ("livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    kubernetes_validate.validate(one(docs, "DaemonSet", "capalarm-node"), KUBE_VERSION, strict=True)


async def test_the_charts_probes_get_no_401_from_a_service_behind_basic_auth(tmp_path):
    """With basic auth on, the chart's httpGet probes (which send no credentials) got 401 and
    the kubelet restarted the pod for ever.  The probes' paths, as the chart renders them,
    against a real service with a basic-auth web config."""
    import aiohttp
    import bcrypt

    from exporters.webconfig import load_web_config
    from tests.servicekit import running_service

    c = container(one(rendered(DEFAULT), "DaemonSet", "capalarm-node"))
    paths = [c[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")]
    assert paths == ["/healthz", "/readyz"]
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed}}))
    kern = tmp_path / "kern.log"
    kern.write_text("")
    config = {
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "k", "type": "file", "paths": [str(kern)]}],
    }
    async with (
        running_service(config, web_config=load_web_config(str(web))) as service,
        aiohttp.ClientSession() as session,
    ):
        base = f"http://127.0.0.1:{service.http_port}"
        for path in paths:
            async with session.get(base + path) as resp:
                assert resp.status != 401, path
        async with session.get(base + "/metrics") as resp:
            assert resp.status == 401  # everything else still needs the credentials
