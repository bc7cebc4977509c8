"""Real-shaped pods with real-shaped statuses, for `initshift status` and `initshift logs`.

Pods come from the lead's fixtures (rewritten by the real rewrite); statuses are what the
kubelet writes: containerStatuses sorted by name, initContainerStatuses in spec order,
the waiter's JSON record as `state.terminated.message`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import datetime, timedelta, timezone

import yaml

from tests.support.fixtures.pods import catalogue
from tests.support.kubedouble import running, terminated, waiting
from waiter import protocol as p
from webhook.rewrite._rewrite import rewrite
from webhook.settings import Settings

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    """T0 + seconds, as the kubelet writes times (whole seconds)."""
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def at_micro(seconds: float) -> str:
    """T0 + seconds, as the waiter writes times (microseconds)."""
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod(fixture: str, name: str = "build-1", namespace: str = "builds", *, rewritten: bool = True) -> dict:
    """A fixture pod, named, rewritten by the real rewrite (waiter strategy) unless told not to."""
    source = catalogue()[fixture]
    out = rewrite(source, Settings(feature_gate=True)).pod if rewritten else copy.deepcopy(source)
    meta = out.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta.update(name=name, namespace=namespace)
    return out


def native_pod(fixture: str = "kpack-istio", name: str = "build-1", namespace: str = "builds") -> dict:
    """A fixture pod rewritten by the real native strategy: the steps stay init containers,
    the proxy becomes a restartable init container, labelled managed=native."""
    settings = Settings(feature_gate=True)
    settings = settings.replace(rewrite=dataclasses.replace(settings.rewrite, mode=p.MODE_NATIVE))
    out = rewrite(catalogue()[fixture], settings, native_supported=True).pod
    assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_NATIVE
    out["metadata"].pop("generateName", None)
    out["metadata"].update(name=name, namespace=namespace)
    return out


def hybrid_pod(fixture: str = "kpack-istio", name: str = "build-1", namespace: str = "builds") -> dict:
    """A fixture pod rewritten by the real hybrid strategy (auto on a cluster with native
    sidecars): the proxy a restartable init container, the steps waiter-run regular containers."""
    out = rewrite(catalogue()[fixture], Settings(feature_gate=True), native_supported=True).pod
    assert out["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_HYBRID
    out["metadata"].pop("generateName", None)
    out["metadata"].update(name=name, namespace=namespace)
    return out


def record(name: str, code: int = 0, reason: str = p.REASON_COMPLETED, start: float = 0, end: float = 1,
           message: str = "", failed_step: str = "") -> str:
    """The waiter's termination message."""
    rec = {p.RECORD_NAME: name, p.RECORD_EXIT_CODE: code, p.RECORD_REASON: reason,
           p.RECORD_STARTED_AT: at_micro(start), p.RECORD_FINISHED_AT: at_micro(end)}
    if message:
        rec[p.RECORD_MESSAGE] = message
    if failed_step:
        rec[p.RECORD_FAILED_STEP] = failed_step
    return json.dumps(rec)


def done(name: str, start: float, end: float, code: int = 0, reason: str = p.REASON_COMPLETED,
         message: str = "", failed_step: str = "") -> dict:
    """A waiter-run container that finished: the kubelet's status with the waiter's record."""
    kubelet_reason = "Completed" if code == 0 else "Error"
    return terminated(name, code, kubelet_reason,
                      message=record(name, code, reason, start, end, message, failed_step),
                      started_at=at(0), finished_at=at(end))


def init_done(name: str, start: float, end: float, code: int = 0, reason: str | None = None) -> dict:
    return terminated(name, code, reason, started_at=at(start), finished_at=at(end))


def run(name: str, start: float = 0, ready: bool = True) -> dict:
    return running(name, started_at=at(start), ready=ready)


def wait(name: str, reason: str = "PodInitializing") -> dict:
    return waiting(name, reason)


def with_status(pod_: dict, *, init: list[dict] | None = None, containers: list[dict] | None = None,
                phase: str = "Running", reason: str | None = None, message: str | None = None,
                annotations: dict[str, str] | None = None) -> dict:
    """The pod with a kubelet status: containerStatuses in alphabetical order, as the kubelet
    reports them; initContainerStatuses in spec order."""
    out = copy.deepcopy(pod_)
    status: dict = {"phase": phase, "startTime": at(0),
                    "conditions": [{"type": "Initialized", "status": "True" if init is None or all(
                        "terminated" in s["state"] or "running" in s["state"] for s in init) else "False"},
                                   {"type": "PodScheduled", "status": "True"}]}
    if init is not None:
        status["initContainerStatuses"] = init
    if containers is not None:
        status["containerStatuses"] = sorted(containers, key=lambda s: s["name"])
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    out["status"] = status
    if annotations:
        out["metadata"].setdefault("annotations", {}).update(annotations)
    return out


def write_kubeconfig(path, server: str, namespace: str = "builds") -> str:
    """A kubeconfig whose current context points at `server` (the API double) with a token."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": server}}],
        "users": [{"name": "dev", "user": {"token": "dev-token"}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "dev", "namespace": namespace}}],
    }))
    return str(path)
