"""The Kubernetes manifests of conf/kubernetes/: valid against the Kubernetes schemas (kubernetes-validate,
strict: no field Kubernetes does not know), and consistent with the broker they run: every configuration in
a ConfigMap loads as the broker loads it, each hub member's node id is its pod's name, the probes ask /health
on the admin port the configuration serves, and every file a configuration names lies in a Secret or
ConfigMap mounted at that place. The schemas ship inside the package: the check reaches no network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from broker_edge.config.loader import load_dataclass
from broker_edge.settings.broker import BrokerConfig

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "conf" / "kubernetes"
VERSION = "1.30.0"


def resources() -> list[dict[str, Any]]:
    return [
        document
        for path in sorted(MANIFESTS.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in resources() if r["kind"] == kind}


@pytest.mark.parametrize("resource", resources(), ids=lambda r: f"{r['kind']}/{r['metadata']['name']}")
def test_each_resource_is_valid_against_the_kubernetes_schemas(resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, VERSION, strict=True)


def test_the_validator_refuses_what_kubernetes_would() -> None:
    broken = of_kind("StatefulSet")["broker"]
    broken = {**broken, "spec": {**broken["spec"], "replicas": "one", "volumeClaimTemplate": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def test_kustomize_lists_every_manifest() -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def pod_configs() -> list[tuple[str, dict[str, Any], BrokerConfig]]:
    """(pod name, its StatefulSet, its configuration loaded as the broker loads it) of every broker pod."""
    maps = of_kind("ConfigMap")
    found = []
    for name, stateful in of_kind("StatefulSet").items():
        if name == "etcd":
            continue
        pod = stateful["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        config_map = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
        for replica in range(stateful["spec"]["replicas"]):
            pod_name = f"{name}-{replica}"
            path = container["args"][-1].replace("$(POD_NAME)", pod_name)
            text = maps[config_map]["data"][Path(path).name]
            found.append((pod_name, stateful, load_dataclass(BrokerConfig, yaml.safe_load(text))))
    return found


def test_every_pods_configuration_loads_and_names_its_pod() -> None:
    loaded = pod_configs()
    assert sorted(pod for pod, _, _ in loaded) == ["broker-0", "hub-0", "hub-1", "hub-2"]
    for pod, stateful, config in loaded:
        if config.cluster is not None:
            assert config.cluster.node_id == pod
            assert config.cluster.tls is not None and config.cluster.etcd_auth is not None
            assert all(url.startswith("https://etcd-") for url in config.cluster.etcd)
            assert stateful["spec"]["serviceName"] in (config.cluster.advertise.peer or "")


def test_probes_ask_health_on_the_admin_port_and_data_lives_on_the_volume() -> None:
    for _, stateful, config in pod_configs():
        (container,) = stateful["spec"]["template"]["spec"]["containers"]
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            check = container[probe]["httpGet"]
            assert check["path"] == "/health" and ports[check["port"]] == config.admin_http.port
        assert config.admin_http.host == "0.0.0.0"  # the kubelet probes the pod's address
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        claims = [t["metadata"]["name"] for t in stateful["spec"]["volumeClaimTemplates"]]
        assert mounts[config.storage.directory] in claims


def test_every_file_a_configuration_names_is_mounted_from_a_secret_or_config_map() -> None:
    for pod, stateful, config in pod_configs():
        spec = stateful["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        sources = {v["name"]: v.get("secret", v.get("configMap")) for v in spec["volumes"]}
        mounts = {
            m["mountPath"]: sources[m["name"]] for m in container["volumeMounts"] if m["name"] in sources
        }
        files = [path for _, path in config.named_files() if path]
        files += [
            getattr(tls, n) for _, tls in config.server_tls() for n in ("certfile", "keyfile", "cafile")
        ]
        for path in filter(None, files):
            assert str(Path(path).parent) in mounts, f"{pod}: {path} is in no mounted Secret or ConfigMap"
