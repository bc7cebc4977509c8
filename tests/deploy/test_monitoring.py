"""Monitoring in deploy/: the ServiceMonitor/PodMonitor, the alerts and the Grafana dashboard,
from the kustomize component and the chart (values on and off). Every object fits its
schema (Kubernetes' or the prometheus-operator CRD's), every PromQL expression parses,
and every metric and label an alert or a panel reads is one initshift exports."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from tests.support import promoperator, promql
from tests.support.deploy_render import CHART, DEPLOY, Rendered, helm, helm_notes, kustomize
from tests.deploy.test_deploy import selects, validate
from webhook.settings import Settings

COMPONENT = DEPLOY / "components" / "monitoring"
POD_MONITORING = ["components/monitoring", "components/pod-monitor"]  # in this order
DASHBOARD = COMPONENT / "initshift-dashboard.json"
ALL_ON = {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                      "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def registry():
    """The process registry with every collector the server and watcher register."""
    import webhook.admission._cluster  # noqa: F401 - native-support gauges
    import webhook.watcher._metrics  # noqa: F401
    from webhook.metrics import REGISTRY

    return {**promql.exported(REGISTRY), **promql.EXTERNAL_SERIES}


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every alert rule and every dashboard panel target."""
    out = []
    rule = next(o for o in kustomize(".", ["components/monitoring"]) if o["kind"] == "PrometheusRule")
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            out.append((f"alert {r['alert']}", r["expr"]))
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            out.append((f"panel {panel['title']!r}", target["expr"]))
    return out


def test_every_expression_parses_and_reads_only_exported_series(registry):
    exprs = expressions()
    assert len(exprs) >= 20
    read: set[str] = set()
    for where, query in exprs:
        uses = promql.uses(query)
        assert uses.metrics, f"{where} reads no metric"
        for metric, labels in uses.metrics.items():
            assert metric in registry, f"{where}: {metric} is not exported by initshift (nor Prometheus, the apiserver)"
            unknown = labels - registry[metric] - promql.TARGET_LABELS
            assert not unknown, f"{where}: {metric} has no label {unknown}"
            read.add(metric)
        known = set().union(*(registry[m] for m in uses.metrics)) | promql.TARGET_LABELS
        assert uses.grouping <= known, f"{where}: groups by {uses.grouping - known}"
    # the series this issue added are all used somewhere
    assert {"initshift_certificate_expiration_timestamp_seconds", "initshift_build_info",
            "initshift_certificate_rotations_total", "initshift_watcher_reaction_seconds_bucket",
            "initshift_watcher_pods_in_flight", "initshift_watcher_leader"} <= read


def test_the_checks_catch_mistakes(registry):
    with pytest.raises(promql.PromQLError):
        promql.uses("sum(rate(initshift_admission_requests_total[5m])")  # unbalanced
    with pytest.raises(promql.PromQLError):
        promql.uses("rate(initshift_admission_requests_total)")  # rate of an instant vector
    uses = promql.uses('sum by (nope) (rate(initshift_pods_totl{result="x"}[5m]))')
    assert "initshift_pods_totl" not in registry and uses.grouping == {"nope"}
    assert registry["initshift_pods_total"] == {"result", "reason"}
    assert "initshift_admission_requests_created" not in registry  # no _created series


def test_alerts_cover_what_the_issue_asks():
    rule = next(o for o in kustomize(".", ["components/monitoring"]) if o["kind"] == "PrometheusRule")
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    want = {"InitshiftAdmissionErrors": "initshift_admission_requests_total",
            "InitshiftAdmissionSlow": "initshift_admission_duration_seconds_bucket",
            "InitshiftCertificateExpiresSoon": "initshift_certificate_expiration_timestamp_seconds",
            "InitshiftNoWatcherLeader": "initshift_watcher_leader",
            "InitshiftPodsNotEnded": "initshift_watcher_oldest_ending_timestamp_seconds",
            "InitshiftNativeSupportUnknown": "initshift_native_sidecars_supported",
            "InitshiftServerDown": "up",
            "InitshiftWebhookFailingOpen": "apiserver_admission_webhook_fail_open_count",
            "InitshiftWebhookRejecting": "apiserver_admission_webhook_rejection_count"}
    assert set(rules) == set(want)
    for name, metric in want.items():
        assert metric in promql.uses(rules[name]["expr"]).metrics, name
        assert rules[name]["labels"]["severity"] in ("critical", "warning", "info")
        assert rules[name]["annotations"]["summary"] and rules[name]["annotations"]["description"]
    assert "7 * 86400" in rules["InitshiftCertificateExpiresSoon"]["expr"]
    timeout = Rendered(kustomize(".")).one("MutatingWebhookConfiguration")["webhooks"][0]["timeoutSeconds"]
    assert rules["InitshiftAdmissionSlow"]["expr"].endswith(f"> {0.8 * timeout:g}")


# --- the alerts evaluated by Prometheus' own rule engine (promtool test rules) ----------------

def _alert_cases(job: str) -> list[promql.AlertCase]:
    """Each alert firing and not firing, on hand-built series (one sample a minute)."""
    C = promql.AlertCase  # noqa: N806
    up, hook = f'up{{job="{job}",pod="a"}}', 'name="pods.initshift.io",type="admit"'
    buckets = "initshift_admission_duration_seconds_bucket"
    return [
        C("InitshiftAdmissionErrors", {'initshift_admission_requests_total{outcome="error"}': "0+2x40"}, "20m", [{}]),
        C("InitshiftAdmissionErrors", {'initshift_admission_requests_total{outcome="error"}': "7x40",
                                       'initshift_admission_requests_total{outcome="admitted"}': "0+9x40"}, "20m", []),
        C("InitshiftAdmissionSlow", {f'{buckets}{{le="1"}}': "0x40", f'{buckets}{{le="5"}}': "0+10x40",
                                     f'{buckets}{{le="+Inf"}}': "0+10x40"}, "20m", [{}]),
        C("InitshiftAdmissionSlow", {f'{buckets}{{le="1"}}': "0+10x40", f'{buckets}{{le="5"}}': "0+10x40",
                                     f'{buckets}{{le="+Inf"}}': "0+10x40"}, "20m", []),
        C("InitshiftCertificateExpiresSoon", {'initshift_certificate_expiration_timestamp_seconds'
                                              '{certificate="serving"}': "86400x150"}, "2h", [{"certificate": "serving"}]),
        C("InitshiftCertificateExpiresSoon", {'initshift_certificate_expiration_timestamp_seconds'
                                              '{certificate="serving"}': "1e9x150"}, "2h", []),
        C("InitshiftNoWatcherLeader", {'initshift_watcher_leader{pod="a"}': "0x20", 'initshift_watcher_leader{pod="b"}':
                                       "0x20"}, "10m", [{}]),
        C("InitshiftNoWatcherLeader", {up: "1x20"}, "10m", [{}]),  # no watcher series at all
        C("InitshiftNoWatcherLeader", {'initshift_watcher_leader{pod="a"}': "0x20", 'initshift_watcher_leader{pod="b"}':
                                       "1x20"}, "10m", []),
        C("InitshiftPodsNotEnded", {"initshift_watcher_oldest_ending_timestamp_seconds": "60x40"}, "30m", [{}]),
        C("InitshiftPodsNotEnded", {"initshift_watcher_oldest_ending_timestamp_seconds": "0x40"}, "30m", []),
        C("InitshiftNativeSupportUnknown", {"initshift_native_sidecars_supported": "-1x60"}, "45m", [{}]),
        C("InitshiftNativeSupportUnknown", {"initshift_native_sidecars_supported": "1x60"}, "45m", []),
        C("InitshiftServerDown", {up: "0x20"}, "10m", [{}]),
        C("InitshiftServerDown", {'initshift_build_info{version="x"}': "1x20"}, "10m", [{}]),  # not scraped at all
        C("InitshiftServerDown", {up: "0x20", f'up{{job="{job}",pod="b"}}': "1x20"}, "10m", []),
        C("InitshiftServerDown", {'up{job="other"}': "1x20", up: "1x20"}, "10m", []),
        C("InitshiftWebhookFailingOpen", {f"apiserver_admission_webhook_fail_open_count{{{hook}}}": "0+1x20"}, "10m",
          [{}]),
        C("InitshiftWebhookFailingOpen", {f"apiserver_admission_webhook_fail_open_count{{{hook}}}": "3x20",
                                          'apiserver_admission_webhook_fail_open_count{name="other.example.com",'
                                          'type="admit"}': "0+1x20"}, "10m", []),
        C("InitshiftWebhookRejecting", {f"apiserver_admission_webhook_rejection_count{{{hook},operation=\"CREATE\","
                                        f"error_type=\"calling_webhook_error\",rejection_code=\"500\"}}": "0+1x20"},
          "10m", [{}]),
        C("InitshiftWebhookRejecting", {f"apiserver_admission_webhook_rejection_count{{{hook},operation=\"CREATE\","
                                        f"error_type=\"no_error\",rejection_code=\"400\"}}": "0+1x20"},
          "10m", []),  # initshift's own deny (e.g. an unresolved entrypoint) is not an outage
    ]


@pytest.mark.parametrize("render,job", [
    (lambda: kustomize(".", ["components/monitoring"]), "initshift"),
    (lambda: helm(ALL_ON), "initshift"),
    (lambda: helm({**ALL_ON, "fullnameOverride": "builds-initshift"}), "builds-initshift"),
], ids=["kustomize", "helm", "helm-fullnameOverride"])
def test_alerts_fire_exactly_when_they_should(render, job, tmp_path):
    rule = _spec(render(), "PrometheusRule")
    cases = _alert_cases(job)
    assert {c.alert for c in cases} == {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert all(any(c.fires for c in cases if c.alert == a) and any(not c.fires for c in cases if c.alert == a)
               for a in {c.alert for c in cases}), "each alert both firing and not firing"
    promql.promtool_test(rule["spec"]["groups"], cases, tmp_path)


def test_promtool_catches_a_wrong_expectation(tmp_path):
    rule = _spec(kustomize(".", ["components/monitoring"]), "PrometheusRule")
    with pytest.raises(AssertionError, match="InitshiftServerDown"):
        promql.promtool_test(rule["spec"]["groups"], [promql.AlertCase(
            "InitshiftServerDown", {'up{job="initshift"}': "1x20"}, "10m", [{}])], tmp_path)


def test_alerts_name_what_the_install_renders():
    """The fail-open alerts read the webhook's name, the server alert the monitors' job."""
    for objects, job in ((kustomize(".", ["components/monitoring"]), "initshift"),
                         (kustomize(".", POD_MONITORING), "initshift"),
                         (helm({**ALL_ON, "fullnameOverride": "ci-initshift"}), "ci-initshift")):
        r = Rendered(objects)
        rules = {x["alert"]: x["expr"] for g in r.one("PrometheusRule")["spec"]["groups"] for x in g["rules"]}
        (hook,) = r.one("MutatingWebhookConfiguration")["webhooks"] if r.of_kind("MutatingWebhookConfiguration") \
            else Rendered(kustomize(".")).one("MutatingWebhookConfiguration")["webhooks"]
        for name in ("InitshiftWebhookFailingOpen", "InitshiftWebhookRejecting"):
            assert f'name="{hook["name"]}"' in rules[name]
        assert f'up{{job="{job}"}}' in rules["InitshiftServerDown"]
        for monitor in r.of_kind("ServiceMonitor") + r.of_kind("PodMonitor"):
            endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
            assert all({"targetLabel": "job", "replacement": job} in e["relabelings"] for e in endpoints)


# --- the same objects from kustomize and from the chart --------------------------------------

def _spec(objects: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def test_pod_monitor_component_takes_the_service_monitors_place():
    """After components/monitoring: its PodMonitor instead of the ServiceMonitor, the rules and
    the dashboard kept; alone: the PodMonitor only."""
    kinds = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}
    assert sorted(o["kind"] for o in kustomize(".", POD_MONITORING) if o["kind"] in kinds) == \
        ["ConfigMap", "PodMonitor", "PrometheusRule"]
    assert [o["kind"] for o in kustomize(".", ["components/pod-monitor"]) if o["kind"] in kinds] == ["PodMonitor"]
    with_cert_manager = kustomize("overlays/cert-manager", POD_MONITORING)
    assert _spec(with_cert_manager, "PodMonitor") == _spec(kustomize(".", POD_MONITORING), "PodMonitor")


def test_chart_and_component_render_the_same_monitoring():
    k = kustomize(".", ["components/monitoring"])
    h = helm({"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                          "dashboard": {"enabled": True}}})
    assert _spec(h, "PrometheusRule")["spec"] == _spec(k, "PrometheusRule")["spec"]
    hm, km = _spec(h, "ServiceMonitor")["spec"], _spec(k, "ServiceMonitor")["spec"]
    assert hm["endpoints"] == km["endpoints"] and hm["namespaceSelector"] == km["namespaceSelector"]
    (hd,) = [o for o in h if o["kind"] == "ConfigMap"]
    (kd,) = [o for o in k if o["kind"] == "ConfigMap"]
    assert hd["data"] == kd["data"] and json.loads(kd["data"]["initshift.json"]) == json.loads(DASHBOARD.read_text())
    assert (CHART / "dashboards" / "initshift.json").read_bytes() == DASHBOARD.read_bytes(), \
        "the chart's dashboard copy differs: cp deploy/components/monitoring/initshift-dashboard.json " \
        "deploy/helm/initshift/dashboards/initshift.json"
    for d in (hd, kd):
        assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
    hp = _spec(helm({"metrics": {"podMonitor": {"enabled": True}}}), "PodMonitor")
    assert hp["spec"] == _spec(kustomize(".", POD_MONITORING), "PodMonitor")["spec"]


def test_latency_alert_follows_the_webhook_timeout():
    rule = _spec(helm({"webhook": {"timeoutSeconds": 8}, "metrics": {"prometheusRule": {"enabled": True}}}),
                 "PrometheusRule")
    (slow,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "InitshiftAdmissionSlow"]
    assert slow["expr"].endswith("> 6.4")
    promql.parse(slow["expr"])


@pytest.mark.parametrize("values,kinds", [
    ({}, set()),
    (ALL_ON, MONITORING_KINDS | {"ConfigMap"}),
    ({"metrics": {**ALL_ON["metrics"], "port": 0}}, {"ConfigMap"}),  # no port: nothing to scrape
])
def test_chart_toggles(values, kinds):
    r = Rendered(helm(values))
    assert {o["kind"] for o in r.objects} & (MONITORING_KINDS | {"ConfigMap"}) == kinds
    ports = {p["name"] for p in r.one("Service")["spec"]["ports"]}
    settings = Settings.from_env(r.plain_env())
    assert ("metrics" in ports) == bool(settings.server.metrics_port)
    assert ({p["name"] for p in r.container["ports"]} >= {"metrics"}) == bool(settings.server.metrics_port)


@pytest.mark.parametrize("render", [
    lambda: kustomize(".", ["components/monitoring"]),
    lambda: kustomize("overlays/cert-manager", ["components/monitoring"]),
    lambda: kustomize(".", POD_MONITORING),
    lambda: helm(ALL_ON),
    lambda: helm({"metrics": {**ALL_ON["metrics"], "serviceMonitor": {"enabled": True, "interval": "1m",
                                                                     "labels": {"release": "kps"}},
                              "dashboard": {"enabled": True, "namespace": "monitoring"}}}),
], ids=["kustomize", "kustomize-cert-manager", "kustomize-pod-monitor", "helm-all-on", "helm-custom"])
def test_monitoring_objects_validate(render):
    objects = render()
    assert {o["kind"] for o in objects} >= {"PrometheusRule", "ConfigMap"}
    assert {o["kind"] for o in objects} & {"ServiceMonitor", "PodMonitor"}
    for obj in objects:
        validate(obj)  # Kubernetes schemas, cert-manager's and prometheus-operator's


def test_crd_schemas_catch_mistakes():
    sm = _spec(helm(ALL_ON), "ServiceMonitor")
    bad = yaml.safe_load(yaml.safe_dump(sm))
    bad["spec"]["endpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(jsonschema.ValidationError):
        promoperator.validate(bad)
    bad = yaml.safe_load(yaml.safe_dump(sm))
    bad["spec"]["endpoint"] = bad["spec"].pop("endpoints")
    with pytest.raises(jsonschema.ValidationError):
        promoperator.validate(bad)
    rule = _spec(helm(ALL_ON), "PrometheusRule")
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    with pytest.raises(jsonschema.ValidationError):
        promoperator.validate(rule)


def test_monitors_select_what_serves_metrics():
    for objects in (kustomize(".", ["components/monitoring"]), kustomize(".", POD_MONITORING), helm(ALL_ON)):
        r = Rendered(objects)
        service, pod_labels = r.one("Service"), r.deployment["spec"]["template"]["metadata"]["labels"]
        for sm in r.of_kind("ServiceMonitor"):
            assert selects(sm["spec"]["selector"], service["metadata"]["labels"])
            assert sm["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
            assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
        assert r.of_kind("ServiceMonitor") or r.of_kind("PodMonitor")
        for pm in r.of_kind("PodMonitor"):
            assert selects(pm["spec"]["selector"], pod_labels)
            assert pm["spec"]["namespaceSelector"]["matchNames"] == [r.deployment["metadata"]["namespace"]]
            assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= {p["name"] for p in r.container["ports"]}
        (metrics_port,) = [p for p in r.container["ports"] if p["name"] == "metrics"]
        settings = Settings.from_env(r.plain_env())
        assert metrics_port["containerPort"] == settings.server.metrics_port != settings.server.port


def test_dashboard_is_grafana_json():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "initshift" and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert all(t["refId"] and t["expr"] for t in panel["targets"])
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]


def notes(values: dict) -> str:
    return helm_notes(values, namespace="platform")


def test_notes_say_where_metrics_are():
    text = notes({"metrics": {"serviceMonitor": {"enabled": True}, "port": 9402}})
    assert "port-forward svc/initshift 9402:9402" in text and "http://127.0.0.1:9402/metrics" in text
    assert "ServiceMonitor initshift" in text and "Nothing publishes it" in text
    assert "Metrics are off" in notes({"metrics": {"port": 0}})
    assert "nodes cannot be drained" in notes({"replicas": 1})
    assert "feature gate is OFF" in notes({"featureGate": False})
