"""Native-sidecar detection: version parsing, the `auto` decision table, NativeSupport's
refresh and setting overrides, the in-process API double, and the server's /readyz,
the metrics and /mutate with detection wired in."""

from __future__ import annotations

import asyncio
import logging
import httpx
import pytest

from tests.support import https_helpers as h
from tests.support.kubedouble import KubeDouble
from waiter import protocol as p
from webhook.admission import _review as admission, _cluster as cluster
from webhook import metrics
from webhook.admission._cluster import NativeSupport, decide
from webhook.kube import ClusterVersions as Observation, KubeError, read_versions
from tests.support.patching import apply_patch, decode_patch
from webhook.admission._app import create_app
from webhook.settings import RewriteSettings, Settings


def settings(**rewrite) -> Settings:
    return Settings(feature_gate=True, rewrite=RewriteSettings(**rewrite))


class Cluster:
    """A KubeApi stand-in: what GET /version and the node list answer; an exception instance
    is raised."""

    def __init__(self, version: object, kubelets: object = ()) -> None:
        self.answer_version, self.kubelets = version, kubelets
        self.calls = 0

    async def request(self, method: str, path: str, *, query: dict | None = None, accept: str = "") -> object:
        answer = self.answer_version if path == "/version" else self.kubelets
        self.calls += path == "/version"
        if isinstance(answer, Exception):
            raise answer
        if path == "/version":
            return answer
        assert "as=Table" in accept, "nodes are read as the Table kubectl prints"
        return {"kind": "Table", "columnDefinitions": [{"name": "Name"}, {"name": "Status"}, {"name": "Version"}],
                "rows": [{"cells": [f"n{i}", "Ready", v]} for i, v in enumerate(answer)],  # type: ignore[arg-type]
                "metadata": {}}


def git(version: str) -> dict:
    return {"major": "1", "minor": version.split(".")[1], "gitVersion": version}


DENIED = KubeError(403, 'nodes is forbidden: User "system:serviceaccount:initshift-system:initshift" cannot list')

# (apiserver /version, kubelet versions or an error, expected support)
TABLE = [
    (git("v1.30.2"), ["v1.30.2", "v1.30.1"], True),
    (git("v1.29.0"), ["v1.29.3-eks-abc"], True),
    (git("v1.33.1"), [], True),  # no nodes yet: the apiserver decides
    (git("v1.28.9"), ["v1.28.9"], False),  # alpha gate only: treated as unsupported
    (git("v1.27.3"), DENIED, False),
    (git("v1.30.2"), ["v1.30.2", "v1.28.7", "v1.29.1"], False),  # mixed: the lowest kubelet decides
    (git("v1.31.0"), ["v1.31.0", "v1.29.0"], True),  # mixed, every kubelet new enough
    (git("v1.30.2"), DENIED, True),  # nodes forbidden: the apiserver alone
    (git("v1.30.2"), KubeError(0, "connection refused"), True),
    (git("v1.30.2"), ["v1.30.2", "garbage"], None),  # a kubelet we cannot read: unknown
    ({"major": "1", "minor": "29+"}, ["v1.29.2-gke.1"], True),
    ({"major": "1", "minor": "28+"}, ["v1.30.0"], False),
    ({"gitVersion": "nonsense"}, ["v1.30.0"], None),
    (KubeError(0, "connection refused"), ["v1.30.0"], None),  # unknown: auto falls back to waiter
    (KubeError(401, "Unauthorized"), DENIED, None),
]


@pytest.mark.parametrize("version, kubelets, expected", TABLE)
async def test_auto_decision_table(version, kubelets, expected):
    decision = decide(await read_versions(Cluster(version, kubelets)))  # type: ignore[arg-type]
    assert decision.supported is expected, decision.why
    support = NativeSupport(settings(), Cluster(version, kubelets))
    await support.refresh()
    assert support.current() is expected
    want = {True: p.MODE_HYBRID, False: p.MODE_WAITER, None: p.MODE_WAITER}[expected]
    assert support.strategy() == want


def test_decision_explains_itself():
    assert "lowest kubelet v1.28 of 3 node(s)" in decide(Observation((1, 30), ((1, 30), (1, 28), (1, 29)))).why
    assert "apiserver alone" in decide(Observation((1, 30), None, nodes_error="listing nodes is forbidden")).why
    assert "older than v1.29" in decide(Observation((1, 28), ())).why
    assert "unknown" in decide(Observation(None, error="GET /version: refused")).why


@pytest.mark.parametrize("setting, expected", [("true", True), ("false", False)])
async def test_setting_overrides_detection_without_api_calls(setting, expected):
    api = Cluster(git("v1.27.0") if expected else git("v1.31.0"), ["v1.31.0"])
    support = NativeSupport(settings(native_sidecars=setting), api)
    await support.refresh()
    assert support.current() is expected and api.calls == 0
    assert (await cluster.detect_native_support(settings(native_sidecars=setting))).current() is expected


async def test_failed_refresh_keeps_the_last_answer_and_upgrades_are_seen():
    api = Cluster(git("v1.28.3"), ["v1.28.3"])
    support = NativeSupport(settings(), api)
    assert support.current() is None and support.strategy() == p.MODE_WAITER, "unknown before detection"
    await support.refresh()
    assert support.current() is False
    api.answer_version = KubeError(0, "connection refused")
    await support.refresh()
    assert support.current() is False, "a transient failure does not flip the strategy"
    api.answer_version, api.kubelets = git("v1.29.1"), ["v1.29.1", "v1.29.0"]
    await support.refresh()
    assert support.current() is True and support.strategy() == p.MODE_HYBRID


def test_default_strategy_follows_mode_and_feature_gate():
    assert cluster.default_strategy(Settings(), True) == "disabled"
    assert cluster.default_strategy(settings(mode="waiter"), True) == p.MODE_WAITER
    assert cluster.default_strategy(settings(mode="native"), None) == p.MODE_NATIVE
    assert cluster.default_strategy(settings(mode="disabled"), True) == "disabled"
    assert cluster.default_strategy(settings(), True) == p.MODE_HYBRID
    assert cluster.default_strategy(settings(mode="hybrid"), None) == p.MODE_HYBRID


def test_the_start_up_line_says_why_no_pod_is_rewritten(caplog):
    with caplog.at_level(logging.INFO, logger="initshift.cluster"):
        NativeSupport(Settings(rewrite=RewriteSettings(native_sidecars="false")))
        NativeSupport(settings(mode="disabled", native_sidecars="false"))
        NativeSupport(settings(native_sidecars="false"))
    said = [r.getMessage() for r in caplog.records]
    assert said[0].endswith("default strategy disabled (SUPPORT_INJECTED_SIDECARS is not true: every pod is "
                            "admitted unchanged)"), said
    assert said[1].endswith("default strategy disabled (INITSHIFT_MODE=disabled: only a pod's own "
                            "initshift.io/mode has it rewritten)"), said
    assert said[2].endswith("default strategy waiter"), said


async def test_metrics_follow_the_decision():
    def value(name: str, **labels: str) -> float | None:
        return metrics.REGISTRY.get_sample_value(name, labels)

    api = Cluster(git("v1.30.0"), ["v1.30.0"])
    support = NativeSupport(settings(), api)
    assert value("initshift_native_sidecars_supported") == -1
    await support.refresh()
    assert value("initshift_native_sidecars_supported") == 1
    assert value("initshift_active_strategy", strategy="hybrid") == 1
    assert value("initshift_active_strategy", strategy="native") == 0
    assert value("initshift_active_strategy", strategy="waiter") == 0
    NativeSupport(settings(native_sidecars="false"))
    assert value("initshift_native_sidecars_supported") == 0
    assert value("initshift_active_strategy", strategy="waiter") == 1


async def test_run_retries_until_known_then_stops_on_request():
    api = Cluster(KubeError(0, "apiserver not up yet"), ["v1.30.0"])
    support = NativeSupport(settings(native_refresh_seconds=1.0), api)
    stop = asyncio.Event()
    task = asyncio.create_task(support.run(stop))
    await support.refresh()
    assert support.current() is None
    api.answer_version = git("v1.30.0")
    for _ in range(200):  # the loop's own retry picks up the answer
        if support.current() is not None:
            break
        await asyncio.sleep(0.05)
    assert support.current() is True
    stop.set()
    await asyncio.wait_for(task, 5)


# --- against the in-process API double ---------------------------------------------------------

async def test_against_the_api_double(caplog):
    async with KubeDouble(version="v1.30.2") as kube:
        kube.put_node("a", "v1.30.2")
        kube.put_node("b", "v1.29.4-eks-1234")
        api = kube.kube_api()
        try:
            support = await cluster.detect_native_support(settings(), api)
            assert support.current() is True and "lowest kubelet v1.29 of 2 node(s)" in support.detected.why
            kube.put_node("c", "v1.28.11")  # an old node pool joins
            await support.refresh()
            assert support.current() is False and support.strategy() == p.MODE_WAITER
            kube.fail_next("/api/v1/nodes", 403, times=5, message="nodes is forbidden")
            with caplog.at_level(logging.WARNING, logger="initshift.cluster"):
                denied = await cluster.detect_native_support(settings(), api)
            assert denied.current() is True and "apiserver alone" in denied.detected.why
            assert any("forbidden" in r.getMessage() for r in caplog.records)
            assert any(r.path == "/version" for r in kube.requests)
        finally:
            await api.close()


async def test_without_api_access_auto_falls_back_to_waiter(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    support = await cluster.detect_native_support(settings())
    assert support.current() is None and support.strategy() == p.MODE_WAITER
    assert "no API access" in support.detected.why
    await support.close()


# --- through the server's app -------------------------------------------------------------------

async def test_server_reports_and_uses_the_detected_strategy(tmp_path):
    s = h.settings_for(tmp_path)
    support = NativeSupport(s, Cluster(git("v1.31.0"), ["v1.31.0"]))
    app = create_app(s, native_supported=support.current, strategy=support.strategy)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        ready = (await c.get("/readyz")).json()
        assert ready["strategy"] == p.MODE_WAITER and ready["native_supported"] is None
        await support.refresh()
        ready = (await c.get("/readyz")).json()
        assert ready["strategy"] == p.MODE_HYBRID and ready["native_supported"] is True
        assert (await c.get("/metrics")).status_code == 404  # metrics have their own port
        text = metrics.exposition()[0].decode()
        assert 'initshift_active_strategy{strategy="hybrid"} 1.0' in text
        assert "initshift_native_sidecars_supported 1.0" in text
        pod = h.kpack_istio()
        answer = (await c.post("/mutate", json=h.review(pod, namespace="builds"))).json()
    patched = apply_patch(pod, decode_patch(answer))
    assert patched["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_HYBRID
    assert [x["name"] for x in patched["spec"]["initContainers"]] == ["istio-init", "istio-proxy"]
    assert patched["spec"]["containers"][0]["name"] == p.COPY_CONTAINER_NAME
