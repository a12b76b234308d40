"""The Grafana dashboard and its Prometheus (issue 14 item 4): a structure check of the JSON,
every metric it queries is one our services export, and compose and k8s ship the same file.

No Grafana here, so the check is ours: the fields Grafana needs to import a dashboard
(uid, title, schemaVersion, panels with unique ids, a type, a gridPos inside the 24-column
grid, targets with a refId and a PromQL expr, all on the provisioned datasource uid).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "docker" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "mgrpo.json"
PANEL_TYPES = {"timeseries", "stat", "gauge", "table", "text", "bargauge"}


def datasource_uid() -> str:
    doc = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yml")
                         .read_text())
    (source,) = doc["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    return source["uid"]


def dashboard_errors(dash: dict, uid: str) -> list[str]:
    errors = []
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list)):
        if not isinstance(dash.get(key), kind):
            errors.append(f"{key}: missing or not a {kind.__name__}")
    ids = [p.get("id") for p in dash.get("panels", [])]
    if len(ids) != len(set(ids)):
        errors.append(f"panel ids are not unique: {ids}")
    for panel in dash.get("panels", []):
        where = f"panel {panel.get('id')} ({panel.get('title')!r})"
        if panel.get("type") not in PANEL_TYPES:
            errors.append(f"{where}: type {panel.get('type')!r}")
        grid = panel.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in "xywh") or grid["x"] + grid["w"] > 24:
            errors.append(f"{where}: gridPos {grid}")
        if panel.get("datasource", {}).get("uid") != uid:
            errors.append(f"{where}: datasource {panel.get('datasource')}")
        targets = panel.get("targets") or []
        if not targets:
            errors.append(f"{where}: no targets")
        for target in targets:
            if not target.get("refId") or not target.get("expr"):
                errors.append(f"{where}: target without refId or expr: {target}")
            if target.get("datasource", {}).get("uid") != uid:
                errors.append(f"{where}: target datasource {target.get('datasource')}")
    return errors


def exported_metrics() -> set[str]:
    """Metric names our code registers (the API's Counter/Histogram in the library, the
    gauge tables of the entry points in ``services/``)."""
    names = set()
    for path in [*(ROOT / "shared" / "mgrpo").rglob("*.py"), *(ROOT / "services").rglob("*.py")]:
        names |= set(re.findall(r'"(mgrpo_[a-z_]+)"', path.read_text()))
    return names


def queried_metrics(dash: dict) -> set[str]:
    out = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\b(mgrpo_[a-z_]+)", target["expr"]):
                out.add(re.sub(r"_(total|bucket|sum|count)$", "", name))
    return out


def test_dashboard_json_is_well_formed():
    dash = json.loads(DASHBOARD.read_text())
    assert dashboard_errors(dash, datasource_uid()) == []
    assert len(dash["panels"]) >= 6


def test_dashboard_queries_only_metrics_we_export():
    dash = json.loads(DASHBOARD.read_text())
    queried = queried_metrics(dash)
    assert "mgrpo_api_requests" in queried and "mgrpo_trainer_rounds_trained" in queried
    assert queried <= exported_metrics(), queried - exported_metrics()


@pytest.mark.parametrize("breakage", ["duplicate id", "bad grid", "no expr", "other uid"])
def test_broken_copies_are_caught(breakage):
    dash = json.loads(DASHBOARD.read_text())
    panel = dash["panels"][1]
    if breakage == "duplicate id":
        panel["id"] = dash["panels"][0]["id"]
    elif breakage == "bad grid":
        panel["gridPos"]["x"] = 20
    elif breakage == "no expr":
        panel["targets"][0]["expr"] = ""
    else:
        panel["datasource"] = {"type": "prometheus", "uid": "someone-else"}
    assert dashboard_errors(dash, datasource_uid()) != []


def test_compose_provisions_prometheus_and_grafana():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    grafana, prometheus = compose["grafana"], compose["prometheus"]
    assert grafana["profiles"] == prometheus["profiles"] == ["monitoring"]
    assert ("./docker/monitoring/grafana/dashboards:/var/lib/grafana/dashboards:ro"
            in grafana["volumes"])
    provider = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/mgrpo.yml")
                              .read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    scrape = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"]
    names = {name for job in scrape for sd in job.get("dns_sd_configs", [])
             for name in sd["names"]}
    names |= {t.split(":")[0] for job in scrape for sc in job.get("static_configs", [])
              for t in sc["targets"]}
    assert names <= set(compose), names - set(compose)  # every target is a compose service
    assert {"planner", "planner-worker", "subagent-searcher", "trainer-planner-cpu"} <= names


def test_k8s_ships_the_same_dashboard():
    kustomization = yaml.safe_load((ROOT / "k8s/base/kustomization.yaml").read_text())
    assert "grafana-dashboard.yaml" in kustomization["resources"]
    config_map = yaml.safe_load((ROOT / "k8s/base/grafana-dashboard.yaml").read_text())
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["mgrpo.json"]) == json.loads(DASHBOARD.read_text())
