"""A small, faithful kustomize renderer for OUR overlays, so `make test` needs no binary.

``render(path)`` builds a kustomization the way ``kubectl kustomize`` does, for the subset of
kustomize that ``k8s/`` uses, in kustomize's transformer order:

1. ``resources``: YAML files (multi-document) and directories holding a kustomization,
   rendered recursively (a base is fully rendered before the overlay transforms it);
2. ``patches`` (JSON 6902 only: a YAML list of ops, inline or in a file) with a ``target`` of
   ``kind``, ``name`` and/or an equality ``labelSelector`` (``k=v,k2=v2``);
3. ``namespace``: set on every namespaced object;
4. ``images``: ``newName``/``newTag`` on every container and init container whose image name
   matches.

What it does NOT do, and refuses loudly (ValueError naming the key) rather than render wrong:
strategic-merge patches, generators (configMapGenerator, secretGenerator: they add hash
suffixes and rewrite references), name prefixes/suffixes, ``labels``/``commonLabels``,
replacements, components, remote bases, regex targets. When ``kubectl`` is on PATH the tests
check that this renderer and ``kubectl kustomize`` produce the same objects.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "patches", "namespace", "images"}
# Kinds without a namespace that can appear in our manifests (kustomize leaves them alone).
CLUSTER_SCOPED_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                        "StorageClass", "CustomResourceDefinition", "PriorityClass"}
JSON_PATCH_OPS = {"add", "remove", "replace", "test"}


def render(kustomization_dir: str | Path) -> list[dict[str, Any]]:
    """Render the kustomization in ``kustomization_dir``; returns the objects as dicts."""
    root = Path(kustomization_dir)
    config = yaml.safe_load((root / "kustomization.yaml").read_text())
    unsupported = sorted(set(config) - SUPPORTED_KEYS)
    if unsupported:
        raise ValueError(f"{root}/kustomization.yaml uses {unsupported}; kustomize_lite only "
                         f"implements {sorted(SUPPORTED_KEYS)}. Use those, or extend the "
                         "renderer and its kubectl cross-check test.")
    objects: list[dict[str, Any]] = []
    for entry in config.get("resources", []):
        objects.extend(_load_resource(root / entry))
    for patch in config.get("patches", []):
        _apply_patch(objects, patch, root)
    if "namespace" in config:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED_KINDS:
                obj.setdefault("metadata", {})["namespace"] = config["namespace"]
    for image in config.get("images", []):
        for obj in objects:
            _set_image(obj, image)
    return objects


def _load_resource(path: Path) -> list[dict[str, Any]]:
    if path.is_dir():
        return render(path)
    if not path.is_file():
        raise ValueError(f"resource {path} does not exist; fix the resources list")
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _apply_patch(objects: list[dict], patch: dict, root: Path) -> None:
    if "patch" in patch:
        ops = yaml.safe_load(patch["patch"])
    elif "path" in patch:
        ops = yaml.safe_load((root / patch["path"]).read_text())
    else:
        raise ValueError(f"patch {patch} has neither 'patch' nor 'path'")
    if not isinstance(ops, list):
        raise ValueError(f"patch {patch} is not a JSON 6902 op list (strategic-merge patches "
                         "are not supported by kustomize_lite); write it as '- op: ...' items")
    targets = [obj for obj in objects if _matches(obj, patch.get("target", {}))]
    if not targets:
        raise ValueError(f"patch target {patch.get('target')} in {root} matches no object")
    for obj in targets:
        for op in ops:
            apply_json_patch_op(obj, op)


def _matches(obj: dict, target: dict) -> bool:
    unknown = set(target) - {"kind", "name", "labelSelector"}
    if unknown:
        raise ValueError(f"patch target keys {sorted(unknown)} are not supported")
    if "kind" in target and obj.get("kind") != target["kind"]:
        return False
    if "name" in target and obj.get("metadata", {}).get("name") != target["name"]:
        return False
    labels = obj.get("metadata", {}).get("labels", {}) or {}
    for term in filter(None, target.get("labelSelector", "").split(",")):
        key, _, value = term.replace("==", "=").partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def _split_pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def apply_json_patch_op(doc: dict, op: dict) -> None:
    """Apply one RFC 6902 op (add, remove, replace, test) to ``doc`` in place."""
    kind = op.get("op")
    if kind not in JSON_PATCH_OPS:
        raise ValueError(f"JSON patch op {kind!r} is not one of {sorted(JSON_PATCH_OPS)}")
    *parents, last = _split_pointer(op["path"])
    node: Any = doc
    for part in parents:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"JSON patch path {op['path']} does not exist at {part!r}") from error
    value = copy.deepcopy(op.get("value"))
    key: int | str = last
    if isinstance(node, list):
        key = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(key, value)
            return
        if not 0 <= key < len(node):
            raise ValueError(f"JSON patch path {op['path']}: index {key} out of range")
    elif kind != "add" and last not in node:
        raise ValueError(f"JSON patch {kind} at {op['path']}: {last!r} does not exist")
    if kind == "remove":
        del node[key]
    elif kind == "test":
        if node[key] != value:
            raise ValueError(f"JSON patch test at {op['path']} failed")
    else:  # add to an object, or replace
        node[key] = value


def _split_image(image: str) -> tuple[str, str]:
    """``registry:5000/a/b:tag`` -> (``registry:5000/a/b``, ``:tag``); digests kept whole."""
    if "@" in image:
        name, _, digest = image.partition("@")
        return name, "@" + digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def _set_image(node: Any, rule: dict) -> None:
    if isinstance(node, list):
        for item in node:
            _set_image(item, rule)
        return
    if not isinstance(node, dict):
        return
    for key in ("containers", "initContainers"):
        for container in node.get(key, []) or []:
            name, tag = _split_image(container.get("image", ""))
            if name == rule["name"]:
                new_tag = f":{rule['newTag']}" if "newTag" in rule else tag
                new_tag = f"@{rule['digest']}" if "digest" in rule else new_tag
                container["image"] = rule.get("newName", name) + new_tag
    for value in node.values():
        _set_image(value, rule)
