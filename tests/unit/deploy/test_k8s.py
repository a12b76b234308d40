"""k8s/: kustomize overlays rendered offline, validated strictly, broken copies rejected."""

from __future__ import annotations

import copy
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml
from k8s_checks import by_kind, container_env, cross_reference_errors, pod_specs, schema_errors
from kustomize_lite import apply_json_patch_op, render

from mgrpo.config import Settings

ROOT = Path(__file__).resolve().parents[3]
OVERLAYS = ("cpu", "gpu")
# Not the bare overlay name: tests/conftest.py skips any test with a "gpu" keyword on CPU.
OVERLAY_IDS = ("overlay-cpu", "overlay-gpu")
SETTINGS_FIELDS = {f"MGRPO_{name.upper()}" for name in Settings.model_fields}
TRAINERS = {"trainer-planner", "trainer-searcher", "trainer-coder"}


@cache
def _rendered(overlay: str) -> tuple[dict, ...]:
    return tuple(render(ROOT / "k8s" / "overlays" / overlay))


def rendered(overlay: str) -> list[dict]:
    return copy.deepcopy(list(_rendered(overlay)))


def find(objects: list[dict], kind: str, name: str) -> dict:
    return by_kind(objects, kind)[name]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_every_rendered_object_validates_strictly(overlay):
    assert schema_errors(rendered(overlay)) == []


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_cross_references_resolve(overlay):
    assert cross_reference_errors(rendered(overlay), SETTINGS_FIELDS) == []


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_overlay_holds_the_whole_system(overlay):
    kinds = {(obj["kind"], obj["metadata"]["name"]) for obj in rendered(overlay)}
    expected = {("StatefulSet", "postgres"), ("StatefulSet", "rabbitmq"),
                ("Job", "mgrpo-migrate"), ("Deployment", "planner"),
                ("Deployment", "planner-worker"), ("Deployment", "control"),
                ("Deployment", "subagent-searcher"),
                ("Deployment", "subagent-coder"), ("Deployment", "sandbox"),
                ("NetworkPolicy", "sandbox-isolation"), ("ConfigMap", "mgrpo-config"),
                ("Secret", "mgrpo-secrets"), ("PersistentVolumeClaim", "mgrpo-checkpoints"),
                ("Service", "planner"), ("Service", "sandbox")}
    expected |= {("Deployment", name) for name in TRAINERS}
    assert expected <= kinds
    assert all(obj["metadata"].get("namespace") == "mgrpo"
               for obj in rendered(overlay) if obj["kind"] != "Namespace")


def test_gpu_overlay_gives_each_trainer_one_gpu_and_the_cuda_image():
    objects = rendered("gpu")
    for name, _, spec in pod_specs(objects):
        container = spec["containers"][0]
        gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
        if name in TRAINERS:
            assert gpus == "1", name
            assert container["image"] == "mgrpo/trainer-cuda:0.1.0"
            assert container_env(container, objects)["MGRPO_DEVICE"] == "cuda"
            # issue 13: as many torchrun ranks as GPUs
            assert container_env(container, objects)["MGRPO_TRAINER_NPROC"] == gpus, name
            assert {"key": "nvidia.com/gpu", "operator": "Exists",
                    "effect": "NoSchedule"} in spec["tolerations"]
        else:
            assert gpus is None, name


def test_cpu_overlay_needs_no_gpu_and_no_shared_storage_class():
    objects = rendered("cpu")
    for name, _, spec in pod_specs(objects):
        container = spec["containers"][0]
        assert "nvidia.com/gpu" not in str(container["resources"]), name
        assert container_env(container, objects).get("MGRPO_DEVICE", "cpu") == "cpu"
    claim = find(objects, "PersistentVolumeClaim", "mgrpo-checkpoints")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_rabbitmq_config_matches_the_compose_one():
    compose_conf = (ROOT / "docker" / "rabbitmq" / "rabbitmq.conf").read_text()
    k8s_conf = find(rendered("cpu"), "ConfigMap", "rabbitmq-config")["data"]["20-mgrpo.conf"]
    setting = "consumer_timeout = 14400000"
    assert setting in compose_conf and setting in k8s_conf


@pytest.mark.skipif(shutil.which("kubectl") is None and shutil.which("kustomize") is None,
                    reason="no kubectl/kustomize binary to cross-check the renderer against")
@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_offline_renderer_matches_real_kustomize(overlay):
    binary = ["kubectl", "kustomize"] if shutil.which("kubectl") else ["kustomize", "build"]
    out = subprocess.run([*binary, str(ROOT / "k8s" / "overlays" / overlay)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out) if o}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in rendered(overlay)}
    assert ours == theirs


# --- broken copies must be rejected ---------------------------------------------------------

def _mutate(overlay: str, kind: str, name: str, op: dict) -> list[dict]:
    objects = rendered(overlay)
    apply_json_patch_op(find(objects, kind, name), op)
    return objects


CONTAINER = "/spec/template/spec/containers/0"


@pytest.mark.parametrize(("kind", "name", "op", "expected"), [
    ("Deployment", "planner", {"op": "replace", "path": "/spec/replicas", "value": "two"},
     "spec.replicas"),
    ("Deployment", "planner", {"op": "add", "path": f"{CONTAINER}/livenessprobe", "value": {}},
     "livenessprobe"),
    ("Deployment", "trainer-coder",
     {"op": "remove", "path": f"{CONTAINER}/livenessProbe/httpGet/port"}, "'port' is a required"),
    ("Service", "planner", {"op": "replace", "path": "/spec/ports/0/port", "value": "http"},
     "spec.ports.0.port"),
    ("NetworkPolicy", "sandbox-isolation",
     {"op": "replace", "path": "/spec/ingress/0/ports/0/port", "value": [8080]},
     "spec.ingress.0.ports.0.port"),
])
def test_strict_schema_rejects_a_broken_copy(kind, name, op, expected):
    errors = schema_errors(_mutate("gpu", kind, name, op), versions=("1.37",))
    assert any(expected in error for error in errors), errors


def test_a_kind_without_a_schema_is_an_error():
    errors = schema_errors([{"apiVersion": "v1", "kind": "Deploymnet", "metadata": {"name": "x"}}])
    assert errors and "Deploymnet" in errors[0]


@pytest.mark.parametrize(("kind", "name", "op", "expected"), [
    ("Deployment", "trainer-coder",
     {"op": "replace", "path": f"{CONTAINER}/livenessProbe/httpGet/port", "value": "helth"},
     "livenessProbe uses port 'helth'"),
    ("Deployment", "planner-worker", {"op": "remove", "path": f"{CONTAINER}/readinessProbe"},
     "needs readinessProbe"),
    ("Deployment", "subagent-searcher",
     {"op": "replace", "path": f"{CONTAINER}/readinessProbe/httpGet/path", "value": "/healthz"},
     "use /readyz"),
    ("Service", "sandbox", {"op": "replace", "path": "/spec/selector",
                            "value": {"app.kubernetes.io/name": "sandbx"}}, "selects no pods"),
    ("Service", "planner", {"op": "replace", "path": "/spec/ports/0/targetPort", "value": "web"},
     "targetPort 'web'"),
    ("NetworkPolicy", "sandbox-isolation", {"op": "replace", "path": "/spec/egress",
                                            "value": [{}]}, "allow no egress"),
    ("NetworkPolicy", "sandbox-isolation",
     {"op": "replace", "path": "/spec/ingress/0/from/0/podSelector/matchLabels",
      "value": {"app.kubernetes.io/part-of": "mgrpo"}}, "must be exactly the sub-agents"),
    ("ConfigMap", "mgrpo-config",
     {"op": "add", "path": "/data/MGRPO_CHECKPOINTS_URI", "value": "/x"},
     "MGRPO_CHECKPOINTS_URI is not a field"),
    ("Secret", "mgrpo-secrets", {"op": "remove", "path": "/stringData/MGRPO_BROKER_URL"},
     "needs MGRPO_BROKER_URL"),
    ("StatefulSet", "postgres", {"op": "replace", "path":
                                 "/spec/template/spec/volumes/0/secret/secretName",
                                 "value": "postgres-creds"}, "Secret 'postgres-creds'"),
    ("ConfigMap", "mgrpo-config", {"op": "remove", "path": "/data/MGRPO_SECRETS_DIR"},
     "needs MGRPO_DATABASE_URL"),
    ("Deployment", "trainer-planner", {"op": "replace", "path": "/spec/template/spec/volumes/0/"
                                       "persistentVolumeClaim/claimName", "value": "ckpt"},
     "PVC 'ckpt'"),
    ("Deployment", "subagent-coder", {"op": "remove", "path": f"{CONTAINER}/resources/requests"},
     "no resource requests"),
])
def test_cross_reference_check_rejects_a_broken_copy(kind, name, op, expected):
    errors = cross_reference_errors(_mutate("gpu", kind, name, op), SETTINGS_FIELDS)
    assert any(expected in error for error in errors), errors


# --- the renderer itself ---------------------------------------------------------------------

def test_json_patch_ops_follow_rfc_6902():
    doc = {"a": {"b": [1, 2]}, "c~/d": 0}
    apply_json_patch_op(doc, {"op": "add", "path": "/a/b/-", "value": 3})
    apply_json_patch_op(doc, {"op": "add", "path": "/a/b/0", "value": 0})
    apply_json_patch_op(doc, {"op": "replace", "path": "/c~0~1d", "value": 9})
    apply_json_patch_op(doc, {"op": "remove", "path": "/a/b/1"})
    assert doc == {"a": {"b": [0, 2, 3]}, "c~/d": 9}
    with pytest.raises(ValueError, match="does not exist"):
        apply_json_patch_op(doc, {"op": "replace", "path": "/a/x", "value": 1})
    with pytest.raises(ValueError, match="test at /c~0~1d failed"):
        apply_json_patch_op(doc, {"op": "test", "path": "/c~0~1d", "value": 8})


def test_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        "resources: []\nconfigMapGenerator: [{name: x, literals: [a=b]}]\n")
    with pytest.raises(ValueError, match="configMapGenerator"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{ROOT / 'k8s' / 'base'}]\n"
        "patches: [{target: {kind: Deployment, name: nope}, patch: '[]'}]\n")
    with pytest.raises(ValueError, match="matches no object"):
        render(tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_workers_run_replicas_and_trainers_one_recreated(overlay):
    """Issue 13: two replicas of each worker share its queue; a trainer is one replica
    replaced with Recreate (the store lease guards against a second one anyway)."""
    deployments = by_kind(rendered(overlay), "Deployment")
    for name in ("planner-worker", "subagent-searcher", "subagent-coder"):
        assert deployments[name]["spec"]["replicas"] == 2, name
    for name in TRAINERS:
        assert deployments[name]["spec"]["replicas"] == 1, name
        assert deployments[name]["spec"]["strategy"]["type"] == "Recreate", name


BENCH_READERS = {"planner", "planner-worker", "control", "subagent-searcher",
                 "subagent-coder"} | TRAINERS


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_every_pod_that_reads_the_benchmark_mounts_it(overlay):
    """bench/ of the models volume at /work/runs/bench (the default bench_dir under the
    working folder): without it the searcher crash-loops ('runs/bench' is not a benchmark
    folder). The sandbox gets neither models nor benchmark."""
    seen = set()
    for name, _, spec in pod_specs(rendered(overlay)):
        mounts = spec["containers"][0].get("volumeMounts", [])
        bench = [m for m in mounts if m["mountPath"] == "/work/runs/bench"]
        if name in BENCH_READERS:
            assert bench == [{"name": "models", "mountPath": "/work/runs/bench",
                              "subPath": "bench", "readOnly": True}], name
            assert spec["containers"][0].get("workingDir", "/work") == "/work"
            seen.add(name)
        else:
            assert bench == [], name
    assert seen == BENCH_READERS


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_only_the_sandbox_runs_the_user_namespace_seccomp_profile(overlay):
    """The sandbox pod: the Localhost profile shipped as docker/sandbox-seccomp.json (bwrap
    needs user namespaces), every other hardening kept; all other pods RuntimeDefault."""
    for name, _, spec in pod_specs(rendered(overlay)):
        container = spec["containers"][0]
        profile = spec["securityContext"]["seccompProfile"]
        assert "seccompProfile" not in container.get("securityContext", {}), name
        if name == "sandbox":
            assert profile == {"type": "Localhost",
                               "localhostProfile": "mgrpo/sandbox-seccomp.json"}
            assert spec["securityContext"]["runAsNonRoot"] is True
            hardening = container["securityContext"]
            assert hardening["allowPrivilegeEscalation"] is False
            assert hardening["capabilities"] == {"drop": ["ALL"]}
            assert hardening["readOnlyRootFilesystem"] is True
            assert hardening["procMount"] == "Unmasked" and spec["hostUsers"] is False
        else:
            assert profile == {"type": "RuntimeDefault"}, name
            assert "procMount" not in container.get("securityContext", {}), name
    assert (ROOT / "docker" / "sandbox-seccomp.json").is_file()


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_each_celery_queue_of_the_control_plane_has_a_worker(overlay):
    """mgrpo.control: the `control` Deployment (`mgrpo serve control`); mgrpo.evaluations:
    the planner API's own worker (MGRPO_EVALUATION_QUEUE), in the planner Deployment only."""
    objects = rendered(overlay)
    commands = {name: spec["containers"][0].get("command", [])[:3]
                for name, _, spec in pod_specs(objects)}
    assert [n for n, c in commands.items() if c == ["mgrpo", "serve", "control"]] == ["control"]
    assert [n for n, c in commands.items() if c == ["mgrpo", "serve", "planner"]] == ["planner"]
    for name, _, spec in pod_specs(objects):
        env = container_env(spec["containers"][0], objects, spec.get("volumes"))
        queued = env.get("MGRPO_EVALUATION_QUEUE")
        if name == "planner":
            assert Settings(evaluation_queue=queued).evaluation_queue is True
        else:
            assert queued is None, name
