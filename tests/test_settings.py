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
    # what no one means: a few digits too many, refused before it starts a million workers
    ({"INITSHIFT_WATCHER_CONCURRENCY": "99999999999999999999"},
     "INITSHIFT_WATCHER_CONCURRENCY: expected a whole number of at most 1,024, got '99999999999999999999'"),
    ({"INITSHIFT_WATCHER_LIST_PAGE_SIZE": "99999999999999999999"}, "INITSHIFT_WATCHER_LIST_PAGE_SIZE: .*at most 10,000"),
    ({"INITSHIFT_LEASE_SECONDS": "3000000000"}, "INITSHIFT_LEASE_SECONDS: .*at most 2,147,483,647"),  # an int32
    # the Lease's timing in client-go's order, for what was set
    ({"INITSHIFT_LEASE_SECONDS": "5", "INITSHIFT_WATCHER_RENEW_DEADLINE_SECONDS": "60"},
     r"INITSHIFT_WATCHER_RENEW_DEADLINE_SECONDS: expected less than INITSHIFT_LEASE_SECONDS \(5\), got '60'"),
    ({"INITSHIFT_WATCHER_RENEW_SECONDS": "30"},
     r"INITSHIFT_WATCHER_RENEW_SECONDS: expected less than INITSHIFT_WATCHER_RENEW_DEADLINE_SECONDS \(10, its default\)"),
    ({"INITSHIFT_IMAGE": ""}, "INITSHIFT_IMAGE: empty image reference"),
    ({"INITSHIFT_IMAGE": "Registry.example/Initshift:1"}, "INITSHIFT_IMAGE: .*invalid repository 'Initshift'"),
    ({"INITSHIFT_TLS_CERT": " "}, "INITSHIFT_TLS_CERT: expected a file's path, got an empty value"),
    ({"INITSHIFT_TLS_KEY": ""}, "INITSHIFT_TLS_KEY: expected a file's path"),
    ({"INITSHIFT_QUIT_ENDPOINTS": "istio-proxy=notaurl"},
     "INITSHIFT_QUIT_ENDPOINTS: expected an http:// or https:// URL, got 'notaurl'"),
    ({"INITSHIFT_QUIT_ENDPOINTS": "vault-agent=http://127.0.0.1/quit"}, "needs a host and a port"),  # as the waiter
    ({"INITSHIFT_QUIT_ENDPOINTS": "a=http://127.0.0.1:1/q,a=http://127.0.0.1:2/q"}, "'a' is given twice"),
])
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_an_empty_boolean_is_its_default_as_unset():
    """Helm's `--set x=` or a manifest's `value: ""` is no choice: leader election (on by
    default) stays on, the feature gate (off by default) stays off."""
    s = Settings.from_env({"INITSHIFT_LEADER_ELECTION": "", p.FEATURE_GATE_ENV: " ", "INITSHIFT_REGISTRY_LOOKUP": ""})
    assert s.watcher.leader_election is True and s.feature_gate is False and s.registry.lookup is False


def test_values_at_their_bounds_and_lease_timing_that_follows_are_kept():
    s = Settings.from_env({"INITSHIFT_WATCHER_CONCURRENCY": "1024", "INITSHIFT_WATCHER_LIST_PAGE_SIZE": "10000",
                           "INITSHIFT_LEASE_SECONDS": "5", "INITSHIFT_IMAGE": "registry.example:5000/initshift@sha256:"
                           + "a" * 64})
    assert (s.watcher.concurrency, s.watcher.list_page_size, s.watcher.lease_seconds) == (1024, 10_000, 5)
    s = Settings.from_env({"INITSHIFT_LEASE_SECONDS": "30", "INITSHIFT_WATCHER_RENEW_DEADLINE_SECONDS": "20",
                           "INITSHIFT_WATCHER_RENEW_SECONDS": "5"})
    assert (s.watcher.renew_deadline_seconds, s.watcher.renew_seconds) == (20, 5)


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
    from webhook.settings import REMOVED, settings_warnings

    assert settings_warnings({"INITSHIFT_PORT": "1"}) == []
    lines = settings_warnings({"INITSHIFT_WORKERS": "4", "INITSHIFT_MAX_HEADERS": "100"})
    assert lines[0].startswith("INITSHIFT_MAX_HEADERS is no longer used (INITSHIFT_MAX_HEADER_BYTES bounds")
    assert lines[1].startswith("INITSHIFT_WORKERS is no longer used (one server process per pod")
    assert len(lines) == 2
    assert not set(REMOVED) & {row[0] for row in settings_rows()}


def test_a_variable_no_setting_has_is_named_with_the_closest_setting():
    from webhook.settings import settings_warnings

    env = {"INITSHIFT_FAILURE_MOD": "deny", "INITSHIFT_WATCHER_CONCURENCY": "4", "INITSHIFT_COLOUR": "blue",
           "INITSHIFT_FAILURE_MODE": "deny", "SUPPORT_INJECTED_SIDECAR": "true", "PATH": "/bin"}
    assert settings_warnings(env) == [
        "INITSHIFT_COLOUR is not an initshift setting and does nothing (docs/admission-server.md lists every setting)",
        "INITSHIFT_FAILURE_MOD is not an initshift setting and does nothing; did you mean INITSHIFT_FAILURE_MODE?",
        "INITSHIFT_WATCHER_CONCURENCY is not an initshift setting and does nothing; "
        "did you mean INITSHIFT_WATCHER_CONCURRENCY?",
    ]
    assert settings_warnings({"INITSHIFT_TLS_CERT_FILE": "/tls/tls.crt"}) == [
        "INITSHIFT_TLS_CERT_FILE is not an initshift setting and does nothing; did you mean INITSHIFT_TLS_CERT?"]


def test_the_kubelets_service_link_variables_are_not_called_unknown():
    """A Service named `initshift` or `initshift-*` in the pod's namespace gives every
    container these (pkg/kubelet/envvars), unless the pod sets enableServiceLinks: false."""
    from webhook.settings import settings_warnings

    links = {"INITSHIFT_SERVICE_HOST": "10.0.0.1", "INITSHIFT_SERVICE_PORT": "443",
             "INITSHIFT_SERVICE_PORT_HTTPS": "443", "INITSHIFT_PORT_443_TCP": "tcp://10.0.0.1:443",
             "INITSHIFT_PORT_443_TCP_PROTO": "tcp", "INITSHIFT_PORT_443_TCP_PORT": "443",
             "INITSHIFT_PORT_443_TCP_ADDR": "10.0.0.1", "INITSHIFT_METRICS_SERVICE_HOST": "10.0.0.2",
             "INITSHIFT_METRICS_PORT_9090_TCP": "tcp://10.0.0.2:9090"}
    assert settings_warnings(links) == []
