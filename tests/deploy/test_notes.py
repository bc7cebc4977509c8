"""The chart's NOTES (what `helm install` prints), rendered by Helm's engine under several
value sets: every object it names is one the same values render, every alert it names is
in the rendered PrometheusRule, and its `initshift check` line is what the real parser
reads as this install from a workstation (the names), and its label command opts a
namespace in as the rendered webhook's namespaceSelector reads it."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.support.deploy_render import Rendered, helm, helm_notes
from webhook.cli import _check

NAMESPACE = "platform"
VALUE_SETS = {
    "defaults": {},
    "fullnameOverride": {"fullnameOverride": "ci-initshift"},
    "nameOverride": {"nameOverride": "hooks"},
    "both overrides, Fail, every monitor": {
        "nameOverride": "hooks", "fullnameOverride": "ci-initshift", "webhook": {"failurePolicy": "Fail"},
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                    "dashboard": {"enabled": True, "namespace": "monitoring"}}},
    "cert-manager, another configuration name, a PodMonitor": {
        "fullnameOverride": "ci-initshift", "certificates": {"mode": "cert-manager"},
        "webhook": {"configName": "aa-initshift"}, "metrics": {"podMonitor": {"enabled": True}}},
    "the alerts on": {"metrics": {"prometheusRule": {"enabled": True}}},
    "Fail without the alerts": {"webhook": {"failurePolicy": "Fail"}},
    "metrics off, the rule asked for": {"metrics": {"port": 0, "prometheusRule": {"enabled": True}}},
    "a label of its own": {"webhook": {"namespaceSelector": {"matchLabels": {
        "initshift.io/enabled": None, "builds.example.com/initshift": "on"}}}},
}

# What NOTES names, as (kind, name, namespace or None for the release's).
_NAMED = [
    (re.compile(r"rollout status deploy/(\S+)"), "Deployment"),
    (re.compile(r"port-forward svc/(\S+)"), "Service"),
    (re.compile(r"Certificate (\S+?)\)"), "Certificate"),
    (re.compile(r"ServiceMonitor (\S+?):"), "ServiceMonitor"),
    (re.compile(r"PodMonitor (\S+?):"), "PodMonitor"),
    (re.compile(r"PrometheusRule (\S+?):"), "PrometheusRule"),
    (re.compile(r"^Webhook: (\S+?),", re.M), "MutatingWebhookConfiguration"),
]


@pytest.fixture(scope="module", params=list(VALUE_SETS), ids=list(VALUE_SETS))
def install(request) -> tuple[dict, str, Rendered]:
    values = VALUE_SETS[request.param]
    return values, helm_notes(values, namespace=NAMESPACE), Rendered(helm(values, namespace=NAMESPACE))


def names(rendered: Rendered, kind: str) -> set[tuple[str, str | None]]:
    return {(o["metadata"]["name"], o["metadata"].get("namespace")) for o in rendered.of_kind(kind)}


def test_every_object_the_notes_name_is_rendered(install) -> None:
    _, notes, rendered = install
    named = [(kind, m.group(1)) for pattern, kind in _NAMED for m in pattern.finditer(notes)]
    assert ("Deployment", rendered.deployment["metadata"]["name"]) in named
    for kind, name in named:
        namespace = None if kind == "MutatingWebhookConfiguration" else NAMESPACE
        assert (name, namespace) in names(rendered, kind), (kind, name, notes)
    for name, namespace in re.findall(r"ConfigMap (\S+) in (\S+?)\.", notes):
        assert (name, namespace) in names(rendered, "ConfigMap"), notes


def test_only_alerts_that_are_rendered_are_named(install) -> None:
    _, notes, rendered = install
    alerts = {r["alert"] for rule in rendered.of_kind("PrometheusRule") for g in rule["spec"]["groups"]
              for r in g["rules"]}
    mentioned = set(re.findall(r"\bInitshift[A-Z]\w+", notes))
    assert mentioned <= alerts, (mentioned - alerts, notes)
    if rendered.of_kind("PrometheusRule"):
        assert mentioned, "the failurePolicy paragraph names the alerts that watch it"


def test_the_check_line_reaches_this_install_from_a_workstation(install) -> None:
    _, notes, rendered = install
    check, = [line.strip() for line in notes.splitlines() if line.strip().startswith("initshift check")]
    args = _check._parser().parse_args(shlex.split(check)[2:])  # the real parser reads it
    env = rendered.plain_env()
    assert args.namespace == NAMESPACE and args.service_url is None  # check port-forwards itself
    assert args.service_account == rendered.deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert args.lease == env["INITSHIFT_LEASE_NAME"]
    assert args.webhook_config == env["INITSHIFT_WEBHOOK_CONFIG"] == rendered.one("MutatingWebhookConfiguration")[
        "metadata"]["name"]


def test_the_label_command_opts_a_namespace_in(install) -> None:
    _, notes, rendered = install
    label, = [line.split() for line in notes.splitlines() if line.strip().startswith("kubectl label namespace")]
    given = dict(arg.split("=", 1) for arg in label[4:])
    selector = rendered.one("MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]
    assert given == selector["matchLabels"], (label, selector)
