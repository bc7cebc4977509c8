"""The settings object: environment parsing and the settings table rendered from it (the
table in docs/admission-server.md is pinned by tests/admission/test_server.py)."""

from __future__ import annotations

import pytest

from waiter import protocol as p
from webhook.settings import Settings, SettingsError, settings_rows


def test_defaults():
    s = Settings.from_env({})
    assert s.feature_gate is False
    assert s.rewrite.mode == p.MODE_AUTO and s.rewrite.resources_policy == "preserve"
    assert s.rewrite.sidecar_names == p.DEFAULT_SIDECAR_NAMES
    assert s.rewrite.quit_endpoints == p.DEFAULT_QUIT_ENDPOINTS
    assert s.server.max_body_bytes == 4 * 1024 * 1024


def test_parsing_every_kind():
    s = Settings.from_env({
        p.FEATURE_GATE_ENV: "true", "INITSHIFT_MODE": "waiter", "INITSHIFT_PORT": "9443",
        "INITSHIFT_GRACE_SECONDS": "2.5", "INITSHIFT_SIDECAR_NAMES": "istio-proxy, vault-agent ,",
        "INITSHIFT_QUIT_ENDPOINTS": "vault-agent=http://127.0.0.1:8200/quit",
        "INITSHIFT_LEADER_ELECTION": "off",
    })
    assert s.feature_gate and s.rewrite.mode == "waiter" and s.server.port == 9443
    assert s.watcher.grace_seconds == 2.5 and s.watcher.leader_election is False
    assert s.rewrite.sidecar_names == ("istio-proxy", "vault-agent")
    assert s.rewrite.quit_endpoints == {"vault-agent": "http://127.0.0.1:8200/quit"}


@pytest.mark.parametrize("env, message", [
    ({p.FEATURE_GATE_ENV: "maybe"}, "expected true or false"),
    ({"INITSHIFT_PORT": "https"}, r"INITSHIFT_PORT: expected a port number \(0 to 65535\), got 'https'"),
    ({"INITSHIFT_PORT": "99999"}, "INITSHIFT_PORT: expected a port number .* got 99999"),
    ({"INITSHIFT_METRICS_PORT": "-1"}, "INITSHIFT_METRICS_PORT: expected a port number .* got -1"),
    ({"INITSHIFT_PORT": "tcp://10.96.0.208:443"},
     r"INITSHIFT_PORT: expected a port number, got 'tcp://10.96.0.208:443': the kubelet's variable for the Service 'initshift' of the pod's namespace; set `enableServiceLinks: false`"),
    ({"INITSHIFT_METRICS_PORT": "tcp://10.96.0.9:8080"}, "the kubelet's variable for the Service 'initshift-metrics'"),
    ({"INITSHIFT_MAX_BODY_BYTES": "lots"}, "INITSHIFT_MAX_BODY_BYTES: expected a whole number, got 'lots'"),
    ({"INITSHIFT_GRACE_SECONDS": "soon"}, "INITSHIFT_GRACE_SECONDS: expected a number, got 'soon'"),
    ({"INITSHIFT_GRACE_SECONDS": "nan"}, "INITSHIFT_GRACE_SECONDS: expected a number of 0 or more, got 'nan'"),
    ({"INITSHIFT_GRACE_SECONDS": "-5"}, "INITSHIFT_GRACE_SECONDS: expected a number of 0 or more, got '-5'"),
    ({"INITSHIFT_LEASE_SECONDS": "inf"}, "INITSHIFT_LEASE_SECONDS: expected a number above 0, got 'inf'"),
    ({"INITSHIFT_LEASE_SECONDS": "0"}, "INITSHIFT_LEASE_SECONDS: expected a number above 0, got '0'"),
    ({"INITSHIFT_STEP_TIMEOUT_SECONDS": "-3"}, "INITSHIFT_STEP_TIMEOUT_SECONDS: expected a whole number of 0 or more"),
    ({"INITSHIFT_MAX_CONNECTIONS": "0"}, "INITSHIFT_MAX_CONNECTIONS: expected a whole number above 0, got '0'"),
    ({"INITSHIFT_MODE": "fast"}, "expected one of disabled, waiter, native, hybrid, auto"),
    ({"INITSHIFT_QUIT_ENDPOINTS": "istio-proxy"}, "expected name=value"),
    ({"INITSHIFT_SERVICE_NAME": "Initshift"}, r"INITSHIFT_SERVICE_NAME: expected a Kubernetes name \(RFC 1035 label"),
    ({"INITSHIFT_SERVICE_NAME": "1nitshift"}, "RFC 1035 label"),  # a Service name starts with a letter
    ({"INITSHIFT_NAMESPACE": "initshift_system"}, "INITSHIFT_NAMESPACE: expected a Kubernetes name .*RFC 1123 label"),
    ({"INITSHIFT_NAMESPACE": "n" * 64}, "at most 63 characters"),
    ({"INITSHIFT_WATCH_NAMESPACES": "builds, CI"}, "INITSHIFT_WATCH_NAMESPACES: .* got 'CI'"),
    ({"INITSHIFT_LEASE_NAME": "watcher.-x"}, "INITSHIFT_LEASE_NAME: .*RFC 1123 subdomain"),
    ({"INITSHIFT_CERT_SECRET": "tls/secret"}, "INITSHIFT_CERT_SECRET"),
    ({"INITSHIFT_WEBHOOK_CONFIG": "-webhook"}, "INITSHIFT_WEBHOOK_CONFIG"),
    ({"INITSHIFT_IMAGE_PULL_SECRETS": "registry,Harbor"}, "INITSHIFT_IMAGE_PULL_SECRETS: .*RFC 1123 subdomain.* got 'Harbor'"),
])
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_kubernetes_names_that_are_valid_are_kept():
    s = Settings.from_env({"INITSHIFT_SERVICE_NAME": "my-webhook", "INITSHIFT_NAMESPACE": "0-platform",
                           "INITSHIFT_LEASE_NAME": "initshift.watcher", "INITSHIFT_WATCH_NAMESPACES": "builds,ci",
                           "INITSHIFT_IMAGE_PULL_SECRETS": "harbor.pull, mirror"})
    assert s.rewrite.image_pull_secrets == ("harbor.pull", "mirror")
    assert (s.server.service_name, s.server.namespace) == ("my-webhook", "0-platform")
    assert s.watcher.lease_name == "initshift.watcher" and s.watcher.namespaces == ("builds", "ci")


def test_every_variable_is_prefixed_and_unique():
    names = [row[0] for row in settings_rows()]
    assert len(names) == len(set(names))
    assert all(n.startswith(p.ENV_PREFIX) or n == p.FEATURE_GATE_ENV for n in names)


def test_settings_of_removed_mechanisms_are_named():
    from webhook.settings import REMOVED, removed_settings

    assert removed_settings({"INITSHIFT_PORT": "1"}) == []
    lines = removed_settings({"INITSHIFT_WORKERS": "4", "INITSHIFT_MAX_HEADERS": "100"})
    assert lines[0].startswith("INITSHIFT_WORKERS is no longer used (one server process per pod")
    assert len(lines) == 2
    assert not set(REMOVED) & {row[0] for row in settings_rows()}
