"""The Kubernetes manifests (deploy/k8s/) are valid objects and agree with the gateway.

Offline: ``kubernetes-validate`` carries the Kubernetes JSON schemas in its wheel, and the network is cut
for the whole module (a socket that connects fails the test), so CI proves it needs none. Each manifest is
validated strictly (an unknown field is an error) against the oldest and the newest Kubernetes this
supports. Then the manifests are checked against the gateway: every ``VOXGATE_*`` variable is a setting,
the probes' paths are routes, the grace period covers the preStop, the drain and its closes, and the
autoscaler's metric is one ``/metrics`` exports.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from starlette.routing import Route
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.metrics import Metrics
from voxgate.gateway.server.serve import DRAIN_GRACE_S
from voxgate.gateway.settings import Settings, options

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
#: The oldest Kubernetes still supported upstream when these were written, and the newest bundled.
VERSIONS = ("1.32.0", "1.37.0")
#: The standard AWS variables the S3 voice store reads (docs/deploy.md, "Fleet").
AWS_VARIABLES = frozenset({"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"})
#: Seconds between the end of the drain's closes and the process's exit, at most, on a busy node.
EXIT_MARGIN_S = 5.0


def _manifests() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the manifests' checks must not reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    """Every object of the manifests, by kind (one object of each kind)."""
    found: dict[str, dict[str, Any]] = {}
    for path in _manifests():
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert isinstance(doc, dict), path
            assert doc["kind"] not in found, f"a second {doc['kind']} in {path.name}"
            found[doc["kind"]] = doc
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", _manifests(), ids=lambda p: p.name)
def test_each_manifest_is_a_valid_kubernetes_object(path: Path, version: str) -> None:
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        kubernetes_validate.validate(doc, version, strict=True)


def test_an_invalid_manifest_is_refused() -> None:
    """The validator does check: a misspelt field and a wrong type are errors."""
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
    bad = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "x"}}
    bad["spec"] = {"maxUnavailable": {"one": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def test_the_kustomization_applies_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    assert sorted(kustomization["resources"]) == [p.name for p in _manifests()]


def test_the_objects_are_there(objects: dict[str, dict[str, Any]]) -> None:
    kinds = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "Secret"}
    assert kinds <= set(objects)


def _container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _env(objects: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _container(objects)["env"]}


def test_every_voxgate_variable_is_a_setting_and_the_settings_load(
    objects: dict[str, dict[str, Any]],
) -> None:
    env = _env(objects)
    settings = {opt.env for opt in options()}
    for name in env:
        assert name.startswith("VOXGATE_") or name in AWS_VARIABLES | {"XDG_CACHE_HOME"}, name
        if name.startswith("VOXGATE_"):
            assert name in settings, f"{name} is not a setting of gateway/settings.py"
    plain = {n: e["value"] for n, e in env.items() if "value" in e and n.startswith("VOXGATE_")}
    Settings.from_env(plain)  # the values parse
    # The fleet's two variables are set: limits in Redis, voices in S3.
    assert {"VOXGATE_REDIS_URL", "VOXGATE_VOICE_STORE"} <= set(env)


def test_secret_references_name_keys_the_secret_has(objects: dict[str, dict[str, Any]]) -> None:
    secret = objects["Secret"]
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for entry in _env(objects).values():
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys, ref
    for volume in objects["Deployment"]["spec"]["template"]["spec"]["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["secretName"] == secret["metadata"]["name"]
            assert {item["key"] for item in volume["secret"]["items"]} <= keys


def test_the_api_keys_file_is_the_mounted_secret(objects: dict[str, dict[str, Any]]) -> None:
    path = Path(_env(objects)["VOXGATE_API_KEYS_FILE"]["value"])
    mounts = {m["name"]: m["mountPath"] for m in _container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in objects["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    found = [
        name
        for name, mount in mounts.items()
        if "secret" in volumes[name]
        and str(path.parent) == mount
        and path.name in {i["path"] for i in volumes[name]["secret"]["items"]}
    ]
    assert found, f"{path} is not a file of a mounted Secret"


def test_the_probes_hit_routes_the_gateway_serves(objects: dict[str, dict[str, Any]]) -> None:
    container = _container(objects)
    paths = {
        r.path for r in create_app(Settings.from_env({}), engine=FakeEngine()).routes if isinstance(r, Route)
    }
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] in paths - {"/readyz"}  # not the upstream's health
    port = container["ports"][0]
    assert container["readinessProbe"]["httpGet"]["port"] == port["name"]
    assert str(port["containerPort"]) == _env(objects)["VOXGATE_PORT"]["value"]


def test_the_grace_period_covers_the_prestop_the_drain_and_its_closes(
    objects: dict[str, dict[str, Any]],
) -> None:
    spec = objects["Deployment"]["spec"]["template"]["spec"]
    command = _container(objects)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    env = _env(objects)
    drain_s = float(env["VOXGATE_DRAIN_TIMEOUT_S"]["value"]) if "VOXGATE_DRAIN_TIMEOUT_S" in env else 20.0
    needed = pre_stop_s + drain_s + DRAIN_GRACE_S + EXIT_MARGIN_S
    assert spec["terminationGracePeriodSeconds"] >= needed


def test_selectors_match_the_pods(objects: dict[str, dict[str, Any]]) -> None:
    labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    selected = [
        objects["Deployment"]["spec"]["selector"]["matchLabels"],
        objects["Service"]["spec"]["selector"],
        objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    ]
    for selector in selected:
        assert selector.items() <= labels.items(), selector
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] == _container(objects)["ports"][0]["name"]


def test_the_autoscaler_scales_the_deployment_on_a_metric_the_gateway_exports(
    objects: dict[str, dict[str, Any]],
) -> None:
    hpa = objects["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["kind"] == "Deployment"
    assert hpa["scaleTargetRef"]["name"] == objects["Deployment"]["metadata"]["name"]
    [metric] = hpa["metrics"]
    name = metric["pods"]["metric"]["name"]
    exported = {m.name for m in Metrics().registry.collect()}
    assert name in exported, f"{name} is not among {sorted(exported)}"
    env = _env(objects)
    max_sessions = int(env["VOXGATE_MAX_SESSIONS"]["value"]) if "VOXGATE_MAX_SESSIONS" in env else 512
    assert 0 < float(metric["pods"]["target"]["averageValue"]) < max_sessions
    assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] < hpa["minReplicas"]
