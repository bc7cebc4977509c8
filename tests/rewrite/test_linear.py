"""The rewrite's cost grows linearly with the pod, for every shape (steps x mains included).

Cost is counted, not timed: the Python events (`sys.settrace`: every call, line and return)
the rewrite and its JSONPatch take for a pod of size n and for one of size 4n. A linear
rewrite takes at most ~4 times as many; a quadratic path anywhere (a list scanned for each
container) takes ~16 times as many once it matters. Container names are a `str` subclass
whose `==` is a Python call, so a scan hidden in C (`name in some_list`) is counted too.
Deterministic: the same count on an idle or a loaded machine.
"""

from __future__ import annotations

import copy
import sys
from typing import Callable

import pytest

from waiter import protocol as p
from webhook.admission._patch import make_patch
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

SMALL, FACTOR = 40, 4
LINEAR = FACTOR * 1.15  # what a linear rewrite's count may reach at FACTOR times the size


class Name(str):
    """A container or volume name whose comparisons are Python calls (and so counted)."""

    __slots__ = ()
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return str.__ne__(self, other)


def _c(name: str, **more) -> dict:
    return {"name": Name(name), "image": "registry.example.com/app:1", "command": ["sh", "-c", name], **more}


def _proxy(port: int = 15021, name: str = p.ISTIO_PROXY) -> dict:
    return {"name": Name(name), "image": "proxyv2:1.22",
            "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": port}}}


def _pod(inits: list[dict], containers: list[dict], *, restart: str = "Never", annotations: dict | None = None,
         volumes: list[dict] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "build", "namespace": "ci", "annotations": dict(annotations or {})},
            "spec": {"restartPolicy": restart, "initContainers": inits, "containers": containers,
                     **({"volumes": volumes} if volumes else {})}}


def steps_by_mains(n: int) -> dict:
    return _pod([_c(f"step{i}") for i in range(n)], [*(_c(f"main{i}") for i in range(n)), _proxy()])


def steps_by_mains_native_proxy(n: int) -> dict:
    proxy = {**_proxy(), "restartPolicy": "Always",
             "startupProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 1}}
    return _pod([proxy, *(_c(f"step{i}") for i in range(n))], [_c(f"main{i}") for i in range(n)])


def mains_of_a_job(n: int) -> dict:
    return _pod([], [*(_c(f"main{i}") for i in range(n)), _proxy()])


def sidecars(n: int) -> dict:
    """n sidecars named in initshift.io/sidecars, each probed on its own port."""
    names = [f"side{i}" for i in range(n)]
    return _pod([_c("clone"), _c("build")], [_c("main"), *(_proxy(9000 + i, name) for i, name in enumerate(names))],
                annotations={p.ANNOTATION_SIDECARS: ",".join(names)})


def kept_init_containers(n: int) -> dict:
    names = [f"keep{i}" for i in range(n)]
    return _pod([*(_c(name) for name in names), _c("clone")], [_c("main"), _proxy()],
                annotations={p.ANNOTATION_KEEP_INIT: ",".join(names)})


def native_sidecars_with_own_resources(n: int) -> dict:
    """Every native sidecar and step requests a resource no other container names."""
    def res(i: int) -> dict:
        return {"resources": {"requests": {f"example.com/r{i}": "1"}, "limits": {f"example.com/r{i}": "1"}}}

    natives = [{**_c(f"native{i}", **res(i)), "restartPolicy": "Always"} for i in range(n)]
    steps = [_c(f"step{i}", **res(n + i)) for i in range(n)]
    return _pod([*natives, *steps], [_c("main"), _proxy()])


def mounts(n: int) -> dict:
    volumes = [{"name": Name(f"vol{i}"), "emptyDir": {}} for i in range(n)]
    steps = [_c(f"step{i}", volumeMounts=[{"name": Name(f"vol{i}"), "mountPath": f"/v/{i}"}]) for i in range(n)]
    return _pod(steps, [_c("main"), _proxy()], volumes=volumes)


def start_order_chain(n: int) -> dict:
    names = [f"app{i}" for i in range(n)]
    return _pod([], [_c(name) for name in names], restart="Always",
                annotations={p.ANNOTATION_START_ORDER: ";".join(names)})


def start_order_fan_out(n: int) -> dict:
    """One group of one container, then a group of n that each wait for it."""
    names = [f"app{i}" for i in range(n)]
    return _pod([], [_c("cache", readinessProbe={"tcpSocket": {"port": 6379}}), *(_c(x) for x in names)],
                restart="Always", annotations={p.ANNOTATION_START_ORDER: "cache;" + ",".join(names)})


def reinvoked(n: int) -> dict:
    """A rewritten pod the apiserver sends again, with a sidecar another webhook added since."""
    once = rewrite(steps_by_mains(n), WAITER).pod
    return {**once, "spec": {**once["spec"], "containers": [*once["spec"]["containers"], _proxy(4191, "late")]}}


def reinvoked_hybrid(n: int) -> dict:
    """A hybrid pod the mesh injected into after initshift (its proxy in containers)."""
    asked = _pod([_c(f"step{i}") for i in range(n)], [_c(f"main{i}") for i in range(n)],
                 annotations={p.ISTIO_INJECT_ANNOTATION: "true"})
    once = rewrite(asked, HYBRID, native_supported=True).pod
    return {**once, "spec": {**once["spec"], "containers": [*once["spec"]["containers"], _proxy()]}}


def no_sidecar(n: int) -> dict:
    return _pod([_c(f"step{i}") for i in range(n)], [_c("main")])


WAITER = Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_WAITER))
HYBRID = Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_HYBRID))
NATIVE = Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_NATIVE))
AUTO = Settings(feature_gate=True)

# name: (pod of size n, settings, native sidecars supported, the result's reason)
SHAPES: dict[str, tuple[Callable[[int], dict], Settings, bool | None, str]] = {
    "steps x mains, waiter": (steps_by_mains, WAITER, None, "rewritten"),
    "steps x mains, hybrid": (steps_by_mains, HYBRID, True, "rewritten"),
    "steps x mains, native": (steps_by_mains, NATIVE, True, "rewritten"),
    "steps x mains, a native proxy": (steps_by_mains_native_proxy, AUTO, True, "rewritten"),
    "a Job's mains, waiter": (mains_of_a_job, WAITER, None, "rewritten"),
    "a Job's mains, native": (mains_of_a_job, AUTO, True, "rewritten"),
    "sidecars, waiter": (sidecars, WAITER, None, "rewritten"),
    "sidecars, hybrid": (sidecars, HYBRID, True, "rewritten"),
    "kept init containers": (kept_init_containers, WAITER, None, "rewritten"),
    "native sidecars and steps, own resources": (native_sidecars_with_own_resources, WAITER, None, "rewritten"),
    "a volume per step": (mounts, WAITER, None, "rewritten"),
    "start order, a chain": (start_order_chain, AUTO, None, "rewritten"),
    "start order, fan-out": (start_order_fan_out, AUTO, None, "rewritten"),
    "re-invocation, waiter": (reinvoked, WAITER, None, "refreshed"),
    "re-invocation, hybrid": (reinvoked_hybrid, HYBRID, True, "refreshed"),
    "no sidecar": (no_sidecar, AUTO, None, "no-sidecar"),
}


def _events(fn: Callable[[], object]) -> int:
    count = 0

    def tracer(frame, event, arg):  # noqa: ARG001 - the settrace signature
        nonlocal count
        count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


def _admission(pod: dict, settings: Settings, native: bool | None) -> Callable[[], object]:
    """What the admission path runs for this pod: the rewrite, then the patch."""
    def run() -> object:
        result = rewrite(pod, settings, native_supported=native)
        return make_patch(pod, result.pod)
    return run


def cost(shape: str, n: int) -> int:
    make, settings, native, reason = SHAPES[shape]
    pod = make(n)
    result = rewrite(copy.deepcopy(pod), settings, native_supported=native)
    assert result.reason == reason, result.warnings
    return _events(_admission(pod, settings, native))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_cost_grows_linearly_with_the_pod(shape):
    small, large = cost(shape, SMALL), cost(shape, FACTOR * SMALL)
    assert large <= LINEAR * small, f"{shape}: {small} events for {SMALL}, {large} for {FACTOR * SMALL} " \
                                    f"({large / small:.1f}x for {FACTOR}x the size)"


def test_a_quadratic_path_is_seen():
    """The measure itself: a list scanned once per container is counted as such."""
    pod = steps_by_mains(SMALL)

    def scans(n: int) -> int:
        names = [Name(f"c{i}") for i in range(n)]
        return _events(lambda: [x for x in names if x in names[::-1]])

    assert scans(FACTOR * SMALL) > 3 * FACTOR * scans(SMALL), "a list scanned per item is quadratic"
    assert _events(_admission(pod, WAITER, None)) > 1000


def test_steps_times_sidecars_that_cannot_fit_is_refused_before_it_is_built():
    """A Job's mains each carry every sidecar's probe: a product too large for etcd is refused
    from the counts alone."""
    pod = _pod([], [*(_c(f"main{i}") for i in range(4000)),
                    *(_proxy(9000 + i, f"side{i}") for i in range(4000))],
               annotations={p.ANNOTATION_SIDECARS: ",".join(f"side{i}" for i in range(4000))})
    result = rewrite(pod, WAITER)
    assert result.reason == "too-large" and not result.changed and "object limit of etcd" in result.warnings[0]
