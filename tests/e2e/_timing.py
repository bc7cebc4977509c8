"""Twenty steps of 0.2 s, one pod at a time (phase 2), per strategy: the init-container pace
without initshift, then each strategy that applies, with the proxy's readiness -> step 0
and the step span read from the kubelet's log timestamps. Every step calls through the
proxy first: a figure only counts when no step's first call failed."""

from __future__ import annotations

from waiter import protocol as p

from ._check import check_build
from ._env import Env, Record, native_only, scenario
from ._mesh import ISTIO_TRAFFIC, READY_AFTER
from ._pods import annotations, container_names, managed, ms, pod, step

STEPS = [f"step-{i:02d}" for i in range(20)]
SLEEP = 0.2


def _steps(env: Env, port: int | None) -> list[dict]:
    return [step(name, env.images.busybox, port=port, sleep=SLEEP) for name in STEPS]


def _main(env: Env) -> list[dict]:
    return [step("done", env.images.busybox, port=None)]


@scenario("init-pace", phase=2)
def init_pace(env: Env, rec: Record) -> None:
    """Twenty 0.2 s init containers without initshift (no mesh): the kubelet's own pace."""
    ns = env.namespace("pace", mesh=None, opted=False)
    rec.namespaces.append(ns)
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("steps", _steps(env, None), _main(env)))
    build = check_build(env, rec, ns, "steps", steps=STEPS, net=[], proxy=None, timeout=300)
    assert managed(build.obj) is None
    rec.figure("20 x 0.2 s span", build.span_s or 0, "s")


def _twenty(env: Env, rec: Record, short: str, *, strategy: str, pod_annotations: dict[str, str],
            native_proxy: bool | None) -> None:
    ns = env.namespace(short)
    rec.namespaces.append(ns)
    created = env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod(
        "steps", _steps(env, ISTIO_TRAFFIC), _main(env), annotations=pod_annotations))
    build = check_build(env, rec, ns, "steps", steps=STEPS, proxy="istio-proxy", strategy=strategy, timeout=300)
    inits, _ = container_names(created)
    if native_proxy is not None:
        assert ("istio-proxy" in inits) == native_proxy, f"istio-proxy native: {'istio-proxy' in inits}"
    how = ""
    if "istio-proxy" in inits:
        asked = annotations(created).get(p.ISTIO_NATIVE_ANNOTATION) == "true"
        how = "; proxy injected natively by the mesh" if asked else "; classic proxy made native by initshift"
        proxy = next(c for c in created["spec"]["initContainers"] if c["name"] == "istio-proxy")
        removed = p.ANNOTATION_STARTUP_PROBES_REMOVED in annotations(created)
        how += ("; its startupProbe removed by initshift" if removed else
                "; with a startupProbe" if "startupProbe" in proxy else "; no startupProbe")
    rec.note(f"strategy {managed(build.obj)}{how}; every step's first call through the proxy succeeded")
    rec.figure("proxy ready -> step 0", build.ready_to_step0_ms or 0)
    rec.figure("20 x 0.2 s span", build.span_s or 0, "s")
    # Where the span goes beyond 20 x 0.2 s: the waiter's hand-offs (the end of a step's
    # command to the start of the next one's) and the commands' own overrun.
    times = [build.times[s] for s in STEPS]
    gaps = sorted(ms(b[0] - a[1]) for a, b in zip(times, times[1:]))
    over = sorted(ms(end - start) - SLEEP * 1000 for start, end in times)
    rec.note(f"hand-offs median {gaps[len(gaps) // 2]:.0f} ms, max {gaps[-1]:.0f} ms; each command "
             f"{over[len(over) // 2]:.0f} ms (median) to {over[-1]:.0f} ms over its {SLEEP} s")


@scenario("twenty-waiter", phase=2)
def twenty_waiter(env: Env, rec: Record) -> None:
    """Twenty 0.2 s steps under the waiter (auto on a cluster without native sidecars, forced elsewhere)."""
    _twenty(env, rec, "waiter", strategy=p.MODE_WAITER,
            pod_annotations={} if not env.native else {p.ANNOTATION_MODE: p.MODE_WAITER}, native_proxy=False)


@scenario("twenty-native", phase=2, applies=native_only)
def twenty_native(env: Env, rec: Record) -> None:
    """Twenty 0.2 s steps under the native strategy (forced): the steps stay init containers."""
    _twenty(env, rec, "native", strategy=p.MODE_NATIVE, pod_annotations={p.ANNOTATION_MODE: p.MODE_NATIVE},
            native_proxy=True)


@scenario("hybrid-native-proxy", phase=2, applies=native_only)
def hybrid_native_proxy(env: Env, rec: Record) -> None:
    """Hybrid (auto's choice) with a proxy the mesh injected natively (a native sidecar with a startupProbe)."""
    _twenty(env, rec, "hyb-nat", strategy=p.MODE_HYBRID, pod_annotations={p.ISTIO_INJECT_ANNOTATION: "true"},
            native_proxy=True)


@scenario("hybrid-made-native", phase=2, applies=native_only)
def hybrid_made_native(env: Env, rec: Record) -> None:
    """Hybrid (forced) with a classic proxy that initshift made native on re-invocation."""
    _twenty(env, rec, "hyb-cls", strategy=p.MODE_HYBRID, pod_annotations={p.ANNOTATION_MODE: p.MODE_HYBRID},
            native_proxy=True)


@scenario("hybrid-slow-proxy", phase=2, applies=native_only)
def hybrid_slow_proxy(env: Env, rec: Record) -> None:
    """Hybrid (auto's choice), the proxy injected natively and ready 3 s after it starts (well past
    the kubelet's relist before the steps' containers exist): step 0 starts on the waiter's own gate."""
    _twenty(env, rec, "hyb-slow", strategy=p.MODE_HYBRID,
            pod_annotations={p.ISTIO_INJECT_ANNOTATION: "true", READY_AFTER: "3"}, native_proxy=True)
