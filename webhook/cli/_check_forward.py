"""Where `initshift check` reaches the server from outside the cluster, where the Service's
`NAME.NAMESPACE.svc` does not resolve: one of the Service's pods, through a port-forward, as
`kubectl port-forward svc/NAME` picks it (a Ready pod, the one Ready longest; the Service's
port mapped to the pod's by `targetPort`, a number or a container port's name).

Inside the cluster (the kubelet gives every container KUBERNETES_SERVICE_HOST) the Service's
name is used as the apiserver uses it; `--service-url` always wins.
"""

from __future__ import annotations

import os
from typing import Mapping

from ..kube import KubeApi, KubeError
from ._check_deployment import ready_condition


def in_cluster(environ: Mapping[str, str] = os.environ) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))


def _ready_since(pod: dict) -> str | None:
    """When the pod turned Ready (RFC 3339, sorts as time), None when it is not a Ready,
    running pod that stays."""
    if (pod.get("status") or {}).get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    ready = ready_condition(pod)
    return None if ready is None else str(ready.get("lastTransitionTime") or "")


def _pod_port(service: dict, port: int, pod: dict) -> int | str:
    """The pod's port behind the Service's `port`, or why there is none."""
    entry = next((e for e in (service.get("spec") or {}).get("ports") or [] if e.get("port") == port), None)
    if entry is None:
        return f"the Service has no port {port}"
    target = entry.get("targetPort", port)
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for cp in container.get("ports") or []:
            if cp.get("name") == target and isinstance(cp.get("containerPort"), int):
                return cp["containerPort"]
    return f"pod {pod['metadata']['name']} has no container port named {target!r}"


async def service_pod(api: KubeApi, service: dict, port: int) -> tuple[str, int] | str:
    """(a pod's name, its port) to forward to for the Service's `port`, or why none."""
    meta, selector = service.get("metadata") or {}, (service.get("spec") or {}).get("selector") or {}
    where = f"Service {meta.get('namespace')}/{meta.get('name')}"
    if not selector:
        return f"{where} has no selector: no pod to port-forward to"
    labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    try:
        pods, _ = await api.list_pods(str(meta.get("namespace")), label_selector=labels)
    except KubeError as e:
        return f"cannot list the pods behind {where}: {e.message}"
    ready = sorted((since, pod["metadata"]["name"], pod) for pod in pods
                   if (since := _ready_since(pod)) is not None)
    if not ready:
        return f"no Ready pod behind {where} ({labels}) to port-forward to: see the Deployment's lines below"
    _, name, pod = ready[0]
    target = _pod_port(service, port, pod)
    return (name, target) if isinstance(target, int) else f"{where}: {target}"
