"""Checks on rendered Kubernetes manifests that need no cluster.

- :func:`schema_errors`: each object against the Kubernetes OpenAPI schemas that ship inside
  ``kubernetes-validate`` (offline), **strict** (unknown fields are errors), for every
  Kubernetes version in :data:`K8S_VERSIONS`. A kind without a schema is an error too.
- :func:`cross_reference_errors`: what a schema cannot see. Probe and Service ports name a
  container port; Service and Deployment selectors select pods; every ConfigMap, Secret (and
  key) and PVC a pod uses exists; long-running mgrpo containers have readiness and liveness
  probes and resource requests; every ``MGRPO_*`` variable is a Settings field and each
  command gets the settings it needs; the sandbox NetworkPolicy denies all egress and admits
  only sub-agent pods.

What it does NOT do: admission webhooks, quota, scheduling (whether the cluster has GPUs, a
ReadWriteMany storage class, or a CNI that enforces NetworkPolicy).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from compose_checks import REQUIRED_SETTINGS
from kubernetes_validate.utils import SchemaNotFoundError

# Oldest Kubernetes still supported upstream when written, and the newest the validator knows.
K8S_VERSIONS = ("1.31", "1.37")
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job"}


def schema_errors(objects: list[dict], versions: tuple[str, ...] = K8S_VERSIONS) -> list[str]:
    """Messages of every strict schema violation; empty when all objects validate."""
    errors = []
    for obj in objects:
        label = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(part) for part in error.path)
                errors.append(f"{label} (k8s {version}): {path}: {error.message}")
            except SchemaNotFoundError as error:
                errors.append(f"{label}: {error.message}")
    return errors


def pod_specs(objects: list[dict]) -> list[tuple[str, dict, dict]]:
    """``(name, pod template metadata, pod spec)`` of every workload object."""
    found = []
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            template = obj["spec"]["template"]
            found.append((obj["metadata"]["name"], template.get("metadata", {}),
                          template["spec"]))
    return found


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def _secret_keys(secret: dict) -> dict[str, str]:
    return secret.get("stringData", {}) | secret.get("data", {})


def container_env(container: dict, objects: list[dict],
                  volumes: list[dict] | None = None) -> dict[str, str]:
    """Settings a container gets: ``envFrom`` (ConfigMaps, Secrets), ``env``, and the files of
    a Secret volume mounted at its ``MGRPO_SECRETS_DIR`` (``volumes``: the pod's volumes)."""
    env: dict[str, str] = {}
    maps, secrets = by_kind(objects, "ConfigMap"), by_kind(objects, "Secret")
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(maps.get(source["configMapRef"]["name"], {}).get("data", {}))
        if "secretRef" in source:
            env.update(_secret_keys(secrets.get(source["secretRef"]["name"], {})))
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", "<from valueFrom>")
    by_name = {volume["name"]: volume for volume in volumes or []}
    for mount in container.get("volumeMounts", []):
        secret_name = by_name.get(mount["name"], {}).get("secret", {}).get("secretName")
        if secret_name and mount["mountPath"] == env.get("MGRPO_SECRETS_DIR"):
            files = _secret_keys(secrets.get(secret_name, {}))
            env.update({key: value for key, value in files.items() if key not in env})
    return env


def cross_reference_errors(objects: list[dict], settings_fields: set[str]) -> list[str]:
    """Every dangling reference, missing probe or missing setting, as readable messages."""
    errors: list[str] = []
    for name, _metadata, spec in pod_specs(objects):
        errors += _reference_errors(name, spec, objects)
        for container in spec["containers"]:
            errors += _container_errors(name, container, objects, settings_fields,
                                        spec.get("volumes", []))
    errors += _selector_errors(objects)
    errors += _sandbox_policy_errors(objects)
    return errors


def _reference_errors(name: str, spec: dict, objects: list[dict]) -> list[str]:
    errors = []
    maps, secrets = by_kind(objects, "ConfigMap"), by_kind(objects, "Secret")
    claims = by_kind(objects, "PersistentVolumeClaim")
    for volume in spec.get("volumes", []):
        if "configMap" in volume and volume["configMap"]["name"] not in maps:
            errors.append(f"{name}: volume uses ConfigMap {volume['configMap']['name']!r}, "
                          "which is not in the manifests")
        if "secret" in volume and volume["secret"]["secretName"] not in secrets:
            errors.append(f"{name}: volume uses Secret {volume['secret']['secretName']!r}, "
                          "which is not in the manifests")
        claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        if claim and claim not in claims:
            errors.append(f"{name}: volume uses PVC {claim!r}, which is not in the manifests")
    for container in spec["containers"] + spec.get("initContainers", []):
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef") or source.get("secretRef")
            pool = maps if "configMapRef" in source else secrets
            if ref["name"] not in pool:
                errors.append(f"{name}: envFrom {ref['name']!r} is not in the manifests")
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                secret = secrets.get(ref["name"], {})
                keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
                if ref["key"] not in keys:
                    errors.append(f"{name}: env {item['name']} reads secret "
                                  f"{ref['name']}/{ref['key']}, which does not exist")
    return errors


def _probe_port_errors(name: str, container: dict) -> list[str]:
    ports = container.get("ports", [])
    names = {port.get("name") for port in ports}
    numbers = {port["containerPort"] for port in ports}
    errors = []
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = container.get(kind, {}).get("httpGet", {}).get("port")
        if port is not None and port not in names | numbers:
            errors.append(f"{name}: {kind} uses port {port!r}, but the container declares "
                          f"ports {sorted(map(str, names | numbers))}")
    return errors


def _container_errors(name: str, container: dict, objects: list[dict],
                      settings_fields: set[str], volumes: list[dict]) -> list[str]:
    errors = _probe_port_errors(name, container)
    command = container.get("command", [])
    if not command or command[0] != "mgrpo":
        return errors
    target = " ".join(command[1:3])
    long_running = target.startswith("serve")
    if long_running and not {"readinessProbe", "livenessProbe"} <= set(container):
        errors.append(f"{name}: a long-running service needs readinessProbe and livenessProbe")
    ready_path = container.get("readinessProbe", {}).get("httpGet", {}).get("path")
    if long_running and ready_path not in (None, "/readyz"):
        # For workers, /healthz stays 200 through a broker outage's grace period while
        # /readyz is 503 at once: stop sending them work. The sandbox's /readyz runs code.
        errors.append(f"{name}: readinessProbe path is {ready_path!r}; use /readyz")
    if not container.get("resources", {}).get("requests"):
        errors.append(f"{name}: container {container['name']} has no resource requests")
    env = container_env(container, objects, volumes)
    errors += [f"{name}: {key} is not a field of mgrpo.config.Settings (typo?)"
               for key in env if key.startswith("MGRPO_") and key not in settings_fields]
    if env.get("MGRPO_MODE") != "distributed":
        errors.append(f"{name}: MGRPO_MODE is {env.get('MGRPO_MODE')!r}; must be distributed")
    missing = REQUIRED_SETTINGS.get(target, set()) - set(env)
    errors += [f"{name}: `mgrpo {target}` needs {key}, which no ConfigMap, Secret or env "
               "gives it" for key in sorted(missing)]
    return errors


def _pods_selected(selector: dict[str, str], objects: list[dict]) -> list[tuple[str, dict]]:
    return [(name, spec) for name, metadata, spec in pod_specs(objects)
            if selector.items() <= metadata.get("labels", {}).items()]


def _selector_errors(objects: list[dict]) -> list[str]:
    errors = []
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] in ("Deployment", "StatefulSet"):
            selector = obj["spec"]["selector"].get("matchLabels", {})
            labels = obj["spec"]["template"]["metadata"].get("labels", {})
            if not selector.items() <= labels.items():
                errors.append(f"{obj['kind']}/{name}: selector {selector} does not match its "
                              f"pod labels {labels}")
        if obj["kind"] != "Service":
            continue
        selected = _pods_selected(obj["spec"].get("selector", {}), objects)
        if not selected:
            errors.append(f"Service/{name}: selector {obj['spec'].get('selector')} selects "
                          "no pods")
        for port in obj["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            for pod, spec in selected:
                declared = {p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
                declared |= {p["containerPort"] for c in spec["containers"]
                             for p in c.get("ports", [])}
                if target not in declared:
                    errors.append(f"Service/{name}: targetPort {target!r} is not a port of "
                                  f"pod {pod}")
    return errors


def _sandbox_policy_errors(objects: list[dict]) -> list[str]:
    policies = [obj for obj in objects if obj["kind"] == "NetworkPolicy" and
                obj["spec"]["podSelector"].get("matchLabels", {}).get(
                    "app.kubernetes.io/name") == "sandbox"]
    if len(policies) != 1:
        return [f"expected exactly one NetworkPolicy selecting the sandbox, found "
                f"{len(policies)}"]
    spec: dict[str, Any] = policies[0]["spec"]
    errors = []
    if "Egress" not in spec.get("policyTypes", []) or spec.get("egress"):
        errors.append("sandbox NetworkPolicy must list Egress in policyTypes and allow no "
                      f"egress; it has policyTypes={spec.get('policyTypes')}, "
                      f"egress={spec.get('egress')}")
    sources = [peer for rule in spec.get("ingress", []) for peer in rule.get("from", [])]
    allowed = set()
    for peer in sources:
        if set(peer) != {"podSelector"}:
            errors.append(f"sandbox ingress peer {peer} is not a plain podSelector")
            continue
        allowed |= {name for name, _ in
                    _pods_selected(peer["podSelector"].get("matchLabels", {}), objects)}
    subagents = {name for name, _, spec in pod_specs(objects)
                 if any(c.get("command", [None, None, None])[1:3] == ["serve", "subagent"]
                        for c in spec["containers"])}
    if allowed != subagents:
        errors.append(f"sandbox ingress admits pods {sorted(allowed)}; must be exactly the "
                      f"sub-agents {sorted(subagents)}")
    return errors
