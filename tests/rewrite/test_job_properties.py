"""Property tests of the rewrite of run-to-completion pods without init containers (a Job's)
over generated pods: argv identity, the effective request kept, idempotence, and
re-invocation after a mesh injects late, with and without native sidecars."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from tests.rewrite import test_rewrite_properties as waiter_props
from tests.rewrite.test_job import check_native_job_pod, check_waiter_job_pod
from tests.support.fixtures import pods
from waiter import protocol as p
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

PROPERTY = waiter_props.PROPERTY
MESHES = ["classic", "cni", "hold", "linkerd"]


def inject(pod: dict, mesh: str) -> dict:
    return pods.inject_linkerd(pod) if mesh == "linkerd" else pods.inject_istio(pod, mesh)


@st.composite
def job_pod(draw) -> dict:
    """A Job's pod: one to four mains, no init container, asking a mesh for a proxy."""
    names = draw(st.lists(waiter_props.NAME.filter(lambda n: not n.startswith("linkerd")), min_size=1, max_size=4,
                          unique=True))
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "generated", "namespace": "jobs", "annotations": {p.ISTIO_INJECT_ANNOTATION: "true"}},
        "spec": {
            "restartPolicy": draw(st.sampled_from(["Never", "OnFailure"])),
            "containers": [draw(waiter_props.container(n)) for n in names],
            "volumes": [{"name": v, "emptyDir": {}} for v in waiter_props.VOLUMES],
        },
    }


@PROPERTY
@given(job_pod(), st.sampled_from(MESHES), st.sampled_from(["preserve", "divide", "keep"]))
def test_waiter_argv_request_idempotence_and_reinvocation(pod, mesh, policy):
    settings = Settings(feature_gate=True, rewrite=RewriteSettings(resources_policy=policy))
    # initshift first: no proxy yet, nothing to gate: left for the re-invocation.
    first = rewrite(pod, settings)
    assert not first.changed and first.reason == "no-sidecar"
    injected = inject(first.pod, mesh)
    src = copy.deepcopy(injected)
    del src["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN]
    second = rewrite(injected, settings)
    assert injected["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN], "the input is never mutated"
    assert second.changed and second.strategy == p.MODE_WAITER, second.warnings
    # argv word for word, every main gated and quitting, the request kept, idempotent
    check_waiter_job_pod(src, second.pod)


@PROPERTY
@given(job_pod(), st.sampled_from(MESHES), st.booleans())
def test_native_request_idempotence_and_reinvocation(pod, mesh, asked_first):
    settings = Settings(feature_gate=True)
    if asked_first:  # initshift first: it asks the mesh for a native proxy; an old mesh injects a classic one
        first = rewrite(pod, settings, native_supported=True)
        assert first.changed and first.reason == "annotated" and first.strategy == p.MODE_NATIVE
        src = inject(first.pod, mesh)
    else:
        src = inject(pod, mesh)
    before = copy.deepcopy(src)
    result = rewrite(src, settings, native_supported=True)
    assert src == before
    assert result.changed and result.strategy == p.MODE_NATIVE, result.warnings
    check_native_job_pod(src, result.pod)
