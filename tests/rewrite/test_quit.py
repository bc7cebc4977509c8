"""What the waiter's quit needs of the sidecars it quits (webhook/rewrite/_quit.py): a
Linkerd proxy of 2.16 or later, whose /shutdown its injector turns off, gets it served
where the last main quits it, in the first admission and in a re-invocation after the
injector; a pod that keeps it off says what follows; nothing else changes."""

from __future__ import annotations

import copy

from tests.rewrite.test_rewrite import flag_values
from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from waiter import protocol as p
from webhook.rewrite._quit import open_quit
from webhook.rewrite._rewrite import rewrite
from webhook.settings import Settings

ON = Settings(feature_gate=True)
CATALOGUE = pods.catalogue()
OFF = {"name": p.LINKERD_SHUTDOWN_ENV, "value": "false"}
SERVED = {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true"}
SHUTDOWN = p.DEFAULT_QUIT_ENDPOINTS[p.LINKERD_PROXY]


def linkerd_216(pod: dict) -> dict:
    """`pod` with its Linkerd proxy as Linkerd 2.16 and later inject it: the shutdown
    endpoint off, its entry first among the proxy's variables (the chart's order)."""
    pod = copy.deepcopy(pod)
    proxy = container(pod, p.LINKERD_PROXY)
    proxy["env"] = [dict(OFF), *proxy.get("env", [])]
    return pod


def container(pod: dict, name: str) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def test_a_proxy_the_last_main_quits_serves_its_shutdown():
    src = linkerd_216(CATALOGUE["cronjob-linkerd"])
    result = rewrite(src, ON)
    assert result.changed and result.strategy == p.MODE_WAITER
    out = result.pod
    assert_valid_pod(out)
    assert flag_values(container(out, "report"), p.FLAG_QUIT) == [SHUTDOWN]
    env = container(out, p.LINKERD_PROXY)["env"]
    assert env == [SERVED, *container(src, p.LINKERD_PROXY)["env"][1:]], "Linkerd's entry replaced where it stood"
    assert rewrite(out, ON).pod == out, "a re-invocation changes nothing more"


def test_a_pod_re_invoked_after_the_injector_gets_it():
    """The usual order: initshift's webhook runs first (no proxy yet: the pod is left), then
    Linkerd's injects and the apiserver calls initshift again; or a pod rewritten around
    another proxy gets Linkerd's afterwards (a refresh)."""
    first = rewrite(CATALOGUE["kpack"], ON)
    assert not first.changed and first.reason == "no-sidecar"
    again = rewrite(linkerd_216(pods.inject_linkerd(first.pod)), ON)
    assert again.changed and again.strategy == p.MODE_WAITER
    assert SERVED in container(again.pod, p.LINKERD_PROXY)["env"] and OFF not in container(again.pod, p.LINKERD_PROXY)["env"]
    assert flag_values(container(again.pod, "completion"), p.FLAG_QUIT) == [SHUTDOWN]
    rewritten = rewrite(CATALOGUE["cronjob-istio"], ON).pod
    refreshed = rewrite(linkerd_216(pods.inject_linkerd(rewritten)), ON)
    assert refreshed.changed and refreshed.reason == "refreshed"
    assert container(refreshed.pod, p.LINKERD_PROXY)["env"].count(SERVED) == 1
    assert OFF not in container(refreshed.pod, p.LINKERD_PROXY)["env"]
    assert SHUTDOWN in flag_values(container(refreshed.pod, "report"), p.FLAG_QUIT)
    for pod in (again.pod, refreshed.pod):
        assert_valid_pod(pod)


def test_a_pod_that_keeps_it_off_is_told_what_follows():
    src = linkerd_216(CATALOGUE["cronjob-linkerd"])
    src["metadata"]["annotations"][p.LINKERD_SHUTDOWN_ANNOTATION] = "disabled"
    result = rewrite(src, ON)
    assert result.changed
    assert container(result.pod, p.LINKERD_PROXY)["env"] == container(src, p.LINKERD_PROXY)["env"]
    assert any("disabled keeps linkerd-proxy's /shutdown off" in w and "activeDeadlineSeconds" in w
               for w in result.warnings), result.warnings
    # The annotation Linkerd's users set to turn it on changes nothing of this.
    src["metadata"]["annotations"][p.LINKERD_SHUTDOWN_ANNOTATION] = "enabled"
    assert SERVED in container(rewrite(src, ON).pod, p.LINKERD_PROXY)["env"]


def test_a_proxy_the_kubelet_stops_is_left_as_it_is():
    """Native sidecars: nobody POSTs /shutdown, the endpoint stays as Linkerd set it."""
    src = linkerd_216(CATALOGUE["cronjob-linkerd"])
    result = rewrite(src, ON, native_supported=True)
    assert result.strategy == p.MODE_NATIVE
    proxy = next(c for c in result.pod["spec"]["initContainers"] if c["name"] == p.LINKERD_PROXY)
    assert OFF in proxy["env"] and SERVED not in proxy["env"]


def test_every_entry_of_the_name_is_served_and_other_sidecars_are_untouched():
    """The kubelet gives the last entry of a name the last word: none may say "false"."""
    proxy = {"name": p.LINKERD_PROXY, "image": "proxy", "env": [dict(OFF), {"name": "X", "value": "1"}, dict(OFF)]}
    assert open_quit(proxy, {})["env"] == [SERVED, {"name": "X", "value": "1"}, SERVED]
    assert open_quit({**proxy, "env": [SERVED]}, {}) == {**proxy, "env": [SERVED]}
    istio = {"name": p.ISTIO_PROXY, "image": "proxy", "env": [dict(OFF)]}
    assert open_quit(istio, {}) is istio


QUITQUITQUIT = p.DEFAULT_QUIT_ENDPOINTS[p.ISTIO_PROXY]


def test_istio_quit_goes_to_the_pods_own_status_port():
    """Istio's injector puts `status.sidecar.istio.io/port` in the proxy's configuration:
    pilot-agent's status server, which serves /quitquitquit, listens there."""
    src = copy.deepcopy(CATALOGUE["cronjob-istio"])
    assert flag_values(container(rewrite(src, ON).pod, "report"), p.FLAG_QUIT) == [QUITQUITQUIT]
    src["metadata"]["annotations"][p.ISTIO_STATUS_PORT_ANNOTATION] = "15030"
    result = rewrite(src, ON)
    assert result.changed and result.strategy == p.MODE_WAITER
    assert flag_values(container(result.pod, "report"), p.FLAG_QUIT) == ["http://127.0.0.1:15030/quitquitquit"]
    assert not any("quitquitquit" in w for w in result.warnings), result.warnings
    assert_valid_pod(result.pod)
    assert rewrite(result.pod, ON).pod == result.pod, "a re-invocation keeps it"
    build = copy.deepcopy(CATALOGUE["kpack"])
    build["metadata"].setdefault("annotations", {})[p.ISTIO_STATUS_PORT_ANNOTATION] = "15030"
    moved = rewrite(pods.inject_istio(build), ON)  # a build pod, the proxy injected before initshift's call
    assert flag_values(container(moved.pod, "completion"), p.FLAG_QUIT) == ["http://127.0.0.1:15030/quitquitquit"]


def test_istio_without_a_status_server_is_told_what_follows():
    src = copy.deepcopy(CATALOGUE["cronjob-istio"])
    src["metadata"]["annotations"][p.ISTIO_STATUS_PORT_ANNOTATION] = "0"
    result = rewrite(src, ON)
    assert result.changed
    assert any('status.sidecar.istio.io/port: "0"' in w and "activeDeadlineSeconds" in w
               for w in result.warnings), result.warnings
    for bad in ("", "x", "70000", "-1"):  # Istio's injector refuses such a pod: the mesh's port stands
        src["metadata"]["annotations"][p.ISTIO_STATUS_PORT_ANNOTATION] = bad
        assert flag_values(container(rewrite(src, ON).pod, "report"), p.FLAG_QUIT) == [QUITQUITQUIT], bad


def with_proxy_config(pod: dict, value: str) -> dict:
    """`pod` whose istio-proxy carries `PROXY_CONFIG` as Istio's injector writes it (the
    mesh's defaultConfig and ProxyConfig resources, merged; JSON)."""
    pod = copy.deepcopy(pod)
    container(pod, p.ISTIO_PROXY)["env"].append({"name": p.ISTIO_PROXY_CONFIG_ENV, "value": value})
    return pod


def test_istio_quit_follows_the_status_port_as_pilot_agent_reads_it():
    """pilot-agent's order (Istio's ConstructProxyConfig): the status port annotation, over
    the pod's `proxy.istio.io/config`, over the proxy's PROXY_CONFIG, over the default."""
    src = with_proxy_config(CATALOGUE["cronjob-istio"], '{"statusPort":15032,"discoveryAddress":"istiod:15012"}\n')
    quit_of = lambda pod: flag_values(container(rewrite(pod, ON).pod, "report"), p.FLAG_QUIT)  # noqa: E731
    assert quit_of(src) == ["http://127.0.0.1:15032/quitquitquit"], "the mesh's own statusPort"
    annotations = src["metadata"]["annotations"]
    for config in ("statusPort: 15031\nholdApplicationUntilProxyStarts: true\n", '{"statusPort": "15031"}'):
        annotations[p.ISTIO_PROXY_CONFIG_ANNOTATION] = config
        assert quit_of(src) == ["http://127.0.0.1:15031/quitquitquit"], config
    annotations[p.ISTIO_STATUS_PORT_ANNOTATION] = "15030"
    assert quit_of(src) == ["http://127.0.0.1:15030/quitquitquit"], "the annotation has the last word"
    del annotations[p.ISTIO_STATUS_PORT_ANNOTATION]
    for unread in ("holdApplicationUntilProxyStarts: true", "[unclosed", "statusPort: [1]", "- 15031"):
        annotations[p.ISTIO_PROXY_CONFIG_ANNOTATION] = unread
        assert quit_of(src) == ["http://127.0.0.1:15032/quitquitquit"], unread
    for plain in ("{}\n", "not json", '{"statusPort": true}', "[15032]"):
        del annotations[p.ISTIO_PROXY_CONFIG_ANNOTATION]
        assert quit_of(with_proxy_config(CATALOGUE["cronjob-istio"], plain)) == [QUITQUITQUIT], plain
        annotations[p.ISTIO_PROXY_CONFIG_ANNOTATION] = "{}"


def test_a_status_port_of_0_from_any_source_is_told():
    annotated = copy.deepcopy(CATALOGUE["cronjob-istio"])
    annotated["metadata"]["annotations"][p.ISTIO_PROXY_CONFIG_ANNOTATION] = "statusPort: 0"
    meshwide = with_proxy_config(CATALOGUE["cronjob-istio"], '{"statusPort":0}')
    for pod, where in ((annotated, "statusPort: 0 in proxy.istio.io/config"),
                       (meshwide, "statusPort: 0 in the mesh's proxy configuration (PROXY_CONFIG)")):
        result = rewrite(pod, ON)
        assert result.changed
        assert flag_values(container(result.pod, "report"), p.FLAG_QUIT) == [QUITQUITQUIT]
        assert any(w.startswith(f"initshift: {where} runs istio-proxy without the status server") for w in result.warnings), \
            result.warnings


def test_a_configured_istio_endpoint_keeps_its_scheme_host_and_path():
    from webhook.rewrite._quit import quit_url
    moved = {p.ISTIO_STATUS_PORT_ANNOTATION: "16000"}
    istio, linkerd = {"name": p.ISTIO_PROXY}, {"name": p.LINKERD_PROXY}
    assert quit_url(istio, "http://[::1]:15020/quitquitquit", moved) == "http://[::1]:16000/quitquitquit"
    assert quit_url(istio, "http://localhost/quit?now=1", moved) == "http://localhost:16000/quit?now=1"
    assert quit_url(linkerd, SHUTDOWN, moved) == SHUTDOWN, "Istio's annotation moves Istio's server only"


def test_linkerd_quit_goes_to_the_proxys_admin_port():
    """Linkerd's /shutdown is on the proxy's admin server, whose address its injector writes
    (`config.linkerd.io/admin-port` moves it): the quit follows it."""
    def quit_of(addr: dict | None) -> list[str]:
        pod = linkerd_216(CATALOGUE["cronjob-linkerd"])
        proxy = container(pod, p.LINKERD_PROXY)
        proxy["env"] = [e for e in proxy["env"] if e["name"] != p.LINKERD_ADMIN_ADDR_ENV] + ([addr] if addr else [])
        result = rewrite(pod, ON)
        assert result.changed and result.strategy == p.MODE_WAITER
        assert_valid_pod(result.pod)
        return flag_values(container(result.pod, "report"), p.FLAG_QUIT)

    admin = lambda value: {"name": p.LINKERD_ADMIN_ADDR_ENV, "value": value}  # noqa: E731
    assert quit_of(admin("0.0.0.0:4192")) == ["http://127.0.0.1:4192/shutdown"]
    assert quit_of(admin("[::]:4193")) == ["http://127.0.0.1:4193/shutdown"]
    for plain in (None, admin("0.0.0.0:4191"), admin("4192"), admin("0.0.0.0:admin"), admin("0.0.0.0:0"),
                  {"name": p.LINKERD_ADMIN_ADDR_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}):
        assert quit_of(plain) == [SHUTDOWN], plain
