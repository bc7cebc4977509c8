"""The server's view of the cluster's LimitRanges against the API double: the informer's
list and watch, the live list for a namespace it holds none for (cached for the TTL, one
per namespace at a time), and what happens when the API fails or RBAC refuses."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import pytest

from tests.support.kubedouble import KubeDouble
from webhook.kube import LimitRanges
from webhook.kube._views import LOOKUP_SECONDS


def limit_range(name: str, namespace: str, cpu_min: str = "10m") -> dict:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name, "namespace": namespace},
            "spec": {"limits": [{"type": "Container", "min": {"cpu": cpu_min, "memory": "8Mi"},
                                 "max": {"cpu": "2", "memory": "1Gi"}, "default": {"cpu": "500m"},
                                 "defaultRequest": {"cpu": "100m"}, "maxLimitRequestRatio": {"cpu": "10"}}]}}


def live_lists(kube: KubeDouble, namespace: str, resource: str = "limitranges") -> int:
    return sum(1 for r in kube.requests if r.method == "GET" and r.path == f"/api/v1/namespaces/{namespace}/{resource}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def until(condition: Any, what: str, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {seconds} s: {what}")


@pytest.fixture
async def api(kube: KubeDouble) -> AsyncIterator[Any]:
    client = kube.kube_api()
    yield client
    await client.close()


async def running(view: LimitRanges) -> tuple[asyncio.Event, asyncio.Task]:
    stop = asyncio.Event()
    task = asyncio.create_task(view.run(stop))
    await until(lambda: view.synced or view.forbidden, "the view synced or was refused")
    return stop, task


async def test_the_watch_brings_a_limit_range_created_after_start(kube, api):
    kube.put("limitranges", limit_range("old", "builds"))
    view = LimitRanges(api)
    stop, task = await running(view)
    assert [o["metadata"]["name"] for o in view.known("builds")] == ["old"]
    assert view.known("other") is None  # nothing held there and nothing looked up: only a live list can say
    kube.make_namespace("other")
    created = await api.request("POST", "/api/v1/namespaces/other/limitranges", body=limit_range("new", "other", "50m"))
    await until(lambda: view.known("other") is not None, "the watch delivered the new LimitRange")
    held = view.known("other")
    assert held == [{"metadata": {"namespace": "other", "name": "new",
                                  "resourceVersion": held[0]["metadata"]["resourceVersion"]},
                     "spec": created["spec"]}]  # cut down to what the rewrite reads
    await api.request("DELETE", "/api/v1/namespaces/builds/limitranges/old")
    await until(lambda: view.known("builds") is None, "the deletion reached the view")
    assert live_lists(kube, "builds") == live_lists(kube, "other") == 0
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_a_miss_is_listed_live_once_and_cached_for_the_ttl(kube, api):
    clock = Clock()
    view = LimitRanges(api, clock=clock)  # not running: the informer has not synced
    kube.put("limitranges", limit_range("lr", "builds"))
    assert view.known("builds") is None
    # Reviews arriving together share one list.
    answers = await asyncio.gather(*(view.lookup("builds") for _ in range(5)))
    assert [[o["metadata"]["name"] for o in a] for a in answers] == [["lr"]] * 5
    assert live_lists(kube, "builds") == 1
    assert [o["metadata"]["name"] for o in view.known("builds")] == ["lr"]  # no I/O now
    assert await view.lookup("empty") == [] and view.known("empty") == []  # "none" is an answer too
    clock.now += 29
    await view.lookup("builds")
    assert live_lists(kube, "builds") == 1
    clock.now += 2  # past the 30 s TTL
    assert view.known("builds") is None
    await view.lookup("builds")
    assert live_lists(kube, "builds") == 2


async def test_the_informers_entries_win_over_a_live_list(kube, api):
    kube.put("limitranges", limit_range("lr", "builds", "10m"))
    view = LimitRanges(api)
    assert [o["spec"]["limits"][0]["min"]["cpu"] for o in await view.lookup("builds")] == ["10m"]
    kube.put("limitranges", limit_range("lr", "builds", "20m"))  # changed since the live list
    stop, task = await running(view)
    assert [o["spec"]["limits"][0]["min"]["cpu"] for o in view.known("builds")] == ["20m"]
    assert [o["spec"]["limits"][0]["min"]["cpu"] for o in await view.lookup("builds")] == ["20m"]
    assert live_lists(kube, "builds") == 1
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_an_api_error_gives_none_and_one_warning_per_ttl(kube, api, caplog):
    clock = Clock()
    view = LimitRanges(api, clock=clock)
    kube.put("limitranges", limit_range("lr", "builds"))
    kube.fail_next("/api/v1/namespaces/builds/limitranges", 500, times=2, message="etcdserver: request timed out")
    with caplog.at_level(logging.WARNING, logger="initshift.limitranges"):
        assert await view.lookup("builds") == []
        assert await view.lookup("builds") == []  # remembered for the TTL: no second call, no second line
        clock.now += 31
        assert await view.lookup("builds") == []
        clock.now += 31
        assert [o["metadata"]["name"] for o in await view.lookup("builds")] == ["lr"]  # the API is back
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("LimitRanges of namespace builds not read" in x and "etcdserver" in x
                                   for x in lines), lines
    assert live_lists(kube, "builds") == 3


async def test_a_slow_api_gives_none_within_the_lookup_time(kube, api, caplog):
    view = LimitRanges(api)
    kube.delay("/api/v1/namespaces/builds/limitranges", LOOKUP_SECONDS + 3, times=1)
    started = asyncio.get_running_loop().time()
    with caplog.at_level(logging.WARNING, logger="initshift.limitranges"):
        assert await view.lookup("builds") == []
    assert asyncio.get_running_loop().time() - started < LOOKUP_SECONDS + 1
    assert any(f"no answer within {LOOKUP_SECONDS:g} s" in r.getMessage() for r in caplog.records)


async def test_rbac_refusing_the_list_turns_the_view_off_until_allowed(kube, api, caplog):
    kube.put("limitranges", limit_range("lr", "builds"))
    kube.fail_next("/api/v1/limitranges", 403, times=3, message='limitranges is forbidden: User '
                   '"system:serviceaccount:initshift-system:initshift" cannot list resource "limitranges"')
    view = LimitRanges(api)
    view.forbidden_retry = 0.1
    with caplog.at_level(logging.INFO, logger="initshift.limitranges"):
        stop, task = await running(view)
        assert view.forbidden and view.off
        assert view.known("builds") == [] and await view.lookup("builds") == []  # off: no I/O at all
        assert live_lists(kube, "builds") == 0
        await until(lambda: view.synced, "the view came back once listing was allowed")
        assert [o["metadata"]["name"] for o in view.known("builds")] == ["lr"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "may not list them" in warnings[0] and "forbidden" in warnings[0]
    assert any("read again" in r.getMessage() for r in caplog.records)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_without_api_access_nothing_is_read():
    view = LimitRanges(None)
    assert view.off and view.known("builds") == [] and await view.lookup("builds") == []
    await asyncio.wait_for(view.run(asyncio.Event()), 1)  # returns at once


async def test_the_double_validates_limit_ranges_as_the_apiserver_does(kube, api):
    from webhook.kube import KubeError

    kube.make_namespace("builds")
    path = "/api/v1/namespaces/builds/limitranges"
    bad = limit_range("bad", "builds")
    bad["spec"]["limits"][0]["min"]["cpu"] = "3"  # above max
    with pytest.raises(KubeError, match=r'spec.limits\[0\].min\[cpu\]: Invalid value: "3": min value 3 is greater '
                                        r"than max value 2"):
        await api.request("POST", path, body=bad)
    twice = limit_range("twice", "builds")
    twice["spec"]["limits"].append({"type": "Container", "max": {"cpu": "1"}})
    with pytest.raises(KubeError, match=r'spec.limits\[1\].type: Duplicate value: "Container"'):
        await api.request("POST", path, body=twice)
    pod = {"metadata": {"name": "pod"}, "spec": {"limits": [{"type": "Pod", "default": {"cpu": "1"}}]}}
    with pytest.raises(KubeError, match=r"spec.limits\[0\].default: Forbidden"):
        await api.request("POST", path, body=pod)
    ratio = limit_range("ratio", "builds")
    ratio["spec"]["limits"][0]["maxLimitRequestRatio"] = {"cpu": "500m"}
    with pytest.raises(KubeError, match=r'maxLimitRequestRatio\[cpu\]: Invalid value: "500m": ratio 500m is less than 1'):
        await api.request("POST", path, body=ratio)
    # defaulted before it is validated and stored (SetDefaults_LimitRangeItem), as v1.34.9 does
    only_max = {"metadata": {"name": "max"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"},
                                                                  "min": {"memory": "8Mi"}}]}}
    stored = await api.request("POST", path, body=only_max)
    assert stored["spec"]["limits"][0]["default"] == {"cpu": "2"}
    assert stored["spec"]["limits"][0]["defaultRequest"] == {"cpu": "2", "memory": "8Mi"}
    low = {"metadata": {"name": "low"}, "spec": {"limits": [{"type": "Container", "min": {"cpu": "2"},
                                                             "max": {"cpu": "1"}}]}}
    with pytest.raises(KubeError, match=r'is invalid: \[spec.limits\[0\].min\[cpu\]: Invalid value: "2": min value 2 is '
                                        r"greater than max value 1, spec.limits\[0\].defaultRequest\[cpu\]"):
        await api.request("POST", path, body=low)
    assert (await api.request("POST", path, body=limit_range("good", "builds")))["metadata"]["name"] == "good"


async def test_namespaces_are_held_by_name_with_their_mesh_markers_only(kube, api):
    """A Namespace is the one object held for itself: cut down to the labels and
    annotations that ask a mesh for a proxy; a namespace the informer has not seen yet is
    read by a list of that one name."""
    from webhook.kube import Namespaces

    kube.put("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "builds", "labels": {"istio-injection": "enabled", "team": "a"},
        "annotations": {"linkerd.io/inject": "enabled", "kubectl.kubernetes.io/last-applied-configuration": "{}"}}})
    view = Namespaces(api)
    assert [o["metadata"]["name"] for o in await view.lookup("builds")] == ["builds"]  # live, not running
    stop, task = await running(view)
    [held] = view.known("builds")
    assert held["metadata"]["labels"] == {"istio-injection": "enabled"}
    assert held["metadata"]["annotations"] == {"linkerd.io/inject": "enabled"}
    await api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": "later", "labels": {"istio.io/rev": "1-27"}}})
    await until(lambda: view.known("later"), "the watch delivered the new Namespace")
    assert view.known("later")[0]["metadata"]["labels"] == {"istio.io/rev": "1-27"}
    stop.set()
    await asyncio.wait_for(task, 5)
