"""Prometheus scrapes the gateway; the Grafana dashboard queries only series that exist."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_recipes import DEPLOY, STACKS
from prometheus_client import Counter, Gauge, Histogram, Info
from prometheus_client.exposition import generate_latest

from service.metrics import GatewayMetrics

DASHBOARD = DEPLOY / "grafana" / "moss-gateway.json"
#: The vLLM engine series the dashboard shows (issue 5).
VLLM_SERIES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total"}
MOSS_NAME = re.compile(r"\b(moss_gateway_[a-zA-Z0-9_]+)")
VLLM_NAME = re.compile(r"(?<![\w:])(vllm:[a-zA-Z0-9_:]+)")


def exported_series() -> dict[str, set[str]]:
    """Series name -> label names, as the gateway's /metrics renders them (every metric touched once)."""
    metrics = GatewayMetrics()
    labels: dict[str, tuple[str, ...]] = {}
    for attribute in vars(metrics).values():
        if isinstance(attribute, (Counter, Gauge, Histogram)):
            names = tuple(attribute._labelnames)
            labels[attribute._name] = names
            child = attribute.labels(*["x"] * len(names)) if names else attribute
            child.observe(1.0) if isinstance(attribute, Histogram) else child.inc()
        elif isinstance(attribute, Info):
            attribute.info({"fingerprint": "f", "vllm": "0", "attention_backend": "x"})
    series: dict[str, set[str]] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("#") or not line:
            continue
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
        label_names = set(re.findall(r"(\w+)=\"", line.split("{", 1)[1])) if "{" in line else set()
        series.setdefault(name, set()).update(label_names)
    return series


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", []) if "expr" in t]
    for var in board["templating"]["list"]:
        query = var.get("query")
        if var["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


# -- Prometheus ----------------------------------------------------------------------------------


def test_prometheus_scrapes_the_gateway_metrics() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    job = jobs["moss-gateway"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["gateway:8000"]
    for stack in STACKS:
        compose = yaml.safe_load((DEPLOY / stack / "compose.yaml").read_text())
        assert "gateway" in compose["services"], f"{stack}: the scrape target names the gateway service"
        mounts = [v["source"] for v in compose["services"]["prometheus"]["volumes"] if v["type"] == "bind"]
        assert "../prometheus/prometheus.yml" in mounts
    for key in ("scrape_interval", "scrape_timeout"):
        assert re.fullmatch(r"\d+[smh]", config["global"][key])


def test_the_metrics_route_exists() -> None:
    from service.app import create_app

    paths = {getattr(route, "path", None) for route in create_app().routes}
    assert {"/metrics", "/ready"} <= paths


# -- Grafana -------------------------------------------------------------------------------------


def test_dashboard_structure() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board):
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, f"{panel['title']}: outside the 24-column grid"
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36


def test_dashboard_queries_are_balanced() -> None:
    for expr in queries(dashboard()):
        for open_, close in ("()", "{}", "[]"):
            assert expr.count(open_) == expr.count(close), f"unbalanced {open_}{close}: {expr}"
        assert expr.count('"') % 2 == 0, expr


def test_dashboard_queries_only_exported_gateway_series() -> None:
    exported = exported_series()
    used = {name for expr in queries(dashboard()) for name in MOSS_NAME.findall(expr)}
    assert used, "the dashboard queries no gateway series"
    unknown = used - set(exported)
    assert not unknown, f"the dashboard queries series the gateway does not export: {sorted(unknown)}"


def test_dashboard_covers_every_gateway_family() -> None:
    exported = exported_series()
    families = {re.sub(r"_(bucket|sum|count|created|total|info)$", "", name) for name in exported}
    used = {re.sub(r"_(bucket|sum|count|created|total|info)$", "", n) for e in queries(dashboard()) for n in MOSS_NAME.findall(e)}
    assert families - used == set(), f"exported but not on the dashboard: {sorted(families - used)}"
    board = json.dumps(dashboard())
    for quantile_source in ("request_duration_seconds", "time_to_first_token_seconds", "real_time_factor"):
        assert f"histogram_quantile(0.99, sum by (le, track) (rate(moss_gateway_{quantile_source}_bucket" in board


def test_dashboard_groups_by_real_labels() -> None:
    exported = exported_series()
    for expr in queries(dashboard()):
        names = MOSS_NAME.findall(expr)
        if not names:
            continue
        available = set().union(*(exported.get(n, set()) for n in names)) | {"instance", "job", "le"}
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            labels = {label.strip() for label in group.split(",")}
            assert labels <= available, f"{expr}: grouping by {labels - available}, which {names} do not carry"
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr):
            assert label in available, f"{expr}: matcher on {label}, which {names} do not carry"


def test_backend_info_table_columns_are_info_labels() -> None:
    board = dashboard()
    table = next(p for p in panels(board) if p["type"] == "table")
    assert "moss_gateway_backend_info" in table["targets"][0]["expr"]
    gate = (Path(__file__).resolve().parents[2] / "service" / "gate.py").read_text()
    flat = gate.split("flat = {", 1)[1].split("}", 1)[0]
    info_labels = set(re.findall(r'"(\w+)":', flat))
    columns = set(table["transformations"][0]["options"]["indexByName"]) - {"instance"}
    assert columns <= info_labels, f"columns that moss_gateway_backend_info does not carry: {columns - info_labels}"


def test_dashboard_vllm_series_exist_in_the_pinned_vllm() -> None:
    used = {name for expr in queries(dashboard()) for name in VLLM_NAME.findall(expr)}
    assert used == VLLM_SERIES
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here")
    loggers = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    if not loggers.is_file():
        pytest.skip(f"{loggers} not found in the installed vLLM")
    registered = set(re.findall(r'name="(vllm:[a-zA-Z0-9_:]+)"', loggers.read_text()))
    counters = {"vllm:generation_tokens"}
    for name in used:
        base = name.removesuffix("_total")
        assert base in registered, f"{name} is not registered by the installed vLLM"
        assert (name != base) == (base in counters), f"{name}: counters, and only counters, carry _total"


def test_grafana_provisioning() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((provisioning / "dashboards" / "moss-gateway.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    for stack in STACKS:
        grafana = yaml.safe_load((DEPLOY / stack / "compose.yaml").read_text())["services"]["grafana"]
        targets = {v["source"]: v["target"] for v in grafana["volumes"] if v["type"] == "bind"}
        assert targets["../grafana/moss-gateway.json"] == f"{path}/moss-gateway.json"
        assert targets["../grafana/provisioning"] == "/etc/grafana/provisioning"
