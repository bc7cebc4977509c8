"""The in-process API double (tests/support/kubedouble.py) against the real apiserver: a
rule the watcher's fast tests rely on, taken from what a real apiserver did, is checked
here on every version the e2e runs, by sending the same requests to both."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from tests.support.kubedouble import KubeDouble

from ._env import Env, Record, scenario

_HOLD = "example.com/hold"
_NOWHERE = "initshift-e2e-no-such-node"  # bound, so deleted gracefully; no kubelet runs it

Mark = tuple[str | None, int | None] | str
Step = tuple[Callable[[], object], Callable[[datetime], object]]  # (to the apiserver, to the double at a time)


def _mark(obj: dict | None) -> Mark:
    """What deleting left of a pod: its mark (deletionTimestamp, grace), or "gone"."""
    if obj is None:
        return "gone"
    meta = obj["metadata"]
    return meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")


@scenario("double-deletion")
def double_deletion(env: Env, rec: Record) -> None:
    """Graceful deletion of pods bound to a node, with and without a finalizer, as the
    double models it (`KubeDouble.delete_pod`): each request goes to the apiserver and to
    the double as at the moments just before and just after it was sent; what the
    apiserver left (deletionTimestamp to the second, the grace, or the pod gone) must be
    what the double left at one of them. The watcher's tests of a deleted build rest on
    this: the kubelet's last delete of a pod a finalizer holds moves its deletionTimestamp
    to that moment."""
    ns = env.namespace("double", mesh=None, opted=False)
    rec.namespaces.append(ns)
    double = KubeDouble()
    base = f"/api/v1/namespaces/{ns}/pods"
    said: list[str] = []

    def create(name: str, finalizers: list[str]) -> None:
        body = {"metadata": {"name": name, "namespace": ns, "finalizers": finalizers},
                "spec": {"nodeName": _NOWHERE, "terminationGracePeriodSeconds": 20,
                         "containers": [{"name": "c", "image": env.images.busybox}]}}
        double.put_pod(env.kube.create(base, body))

    def same(name: str, what: str, step: Step) -> None:
        real, model = step
        before = datetime.now(timezone.utc)
        real()
        after = datetime.now(timezone.utc)
        got = _mark(env.kube.pod(ns, name))
        saved = double.pod(ns, name)
        expected: list[Mark] = []
        for at in (before, after):
            model(at)
            expected.append(_mark(double.get("pods", ns, name)))
            double.put_pod(saved)  # (as it was, for the other moment)
        assert got in expected, f"{name}, {what}: the apiserver left {got}, the double {expected[0]} or {expected[1]}"
        model(before if got == expected[0] else after)
        said.append(f"{name} {what}: {'gone' if got == 'gone' else f'grace {got[1]}'}")

    def delete(name: str, grace: int | None = None) -> Step:
        params = {} if grace is None else {"gracePeriodSeconds": grace}
        return (lambda: env.kube.delete(f"{base}/{name}", **params),
                lambda at: double.delete_pod(ns, name, grace, at=at))

    def unhold(name: str) -> Step:
        patch = {"metadata": {"finalizers": None}}
        return lambda: env.kube.patch(f"{base}/{name}", patch), lambda _: double.merge("pods", ns, name, patch)

    create("held", [_HOLD])
    same("held", "deleted", delete("held"))
    same("held", "deleted with grace 30 (longer)", delete("held", 30))
    same("held", "deleted with grace 5", delete("held", 5))
    same("held", "deleted with grace 0 (the kubelet's last)", delete("held", 0))
    same("held", "deleted with grace 0 again", delete("held", 0))
    same("held", "finalizer removed", unhold("held"))
    create("free", [])
    same("free", "deleted with grace 10", delete("free", 10))
    same("free", "deleted with grace 0", delete("free", 0))
    create("pending", [_HOLD])
    same("pending", "deleted", delete("pending"))
    same("pending", "finalizer removed in its grace", unhold("pending"))
    same("pending", "deleted with grace 0", delete("pending", 0))
    rec.note("the apiserver and the double agree: " + "; ".join(said))
