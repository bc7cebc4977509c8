"""Which container of a pod is what: kept init containers, steps, mains and sidecars.

- kept init containers: native sidecars (restartPolicy Always), the mesh's init
  containers (configured names plus those `sidecar.istio.io/status` lists), the ones named
  in `initshift.io/keep-init`, and our own `initshift-init`;
- steps: every other init container, in order;
- sidecars: regular containers recognised by the mesh's markers (configured names such as
  istio-proxy and linkerd-proxy, `sidecar.istio.io/status`, `initshift.io/sidecars`);
- mains: the remaining regular containers (e.g. kpack's `completion`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from waiter import protocol as p

from ._resources import is_restartable
from ..settings import RewriteSettings
from ._shape import mapping_at, submap


def _comma_list(value: object) -> list[str]:
    if not isinstance(value, str):
        return []
    return [x.strip() for x in value.split(",") if x.strip()]


def _istio_status(annotations: Mapping[str, str]) -> dict:
    raw = annotations.get(p.ISTIO_STATUS_ANNOTATION)
    if not raw:
        return {}
    try:
        status = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def _names(value: object) -> set[str]:
    return {x for x in value if isinstance(x, str)} if isinstance(value, list) else set()


@dataclass
class Classification:
    kept_init: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    mains: list[dict] = field(default_factory=list)
    sidecars: list[dict] = field(default_factory=list)  # regular containers
    native_sidecars: list[dict] = field(default_factory=list)  # restartable init containers
    warnings: list[str] = field(default_factory=list)
    sidecar_names: set[str] = field(default_factory=set)  # the names recognised as sidecars (sidecar_names())
    # The pod's own native sidecars declared after a step, each with the steps before it:
    # the kubelet starts such a sidecar only once those have run (they may prepare it).
    late_sidecars: list[tuple[str, list[str]]] = field(default_factory=list)
    # Init containers kept (initshift.io/keep-init) declared after a step.
    kept_after_steps: list[str] = field(default_factory=list)

    @property
    def all_sidecars(self) -> list[dict]:
        return [*self.native_sidecars, *self.sidecars]


def sidecar_names(annotations: Mapping[str, str], settings: RewriteSettings, status: Mapping | None = None) -> set[str]:
    """`status`: the pod's parsed `sidecar.istio.io/status` (_istio_status), when the caller
    has read it already (classify reads it once for both name sets)."""
    status = _istio_status(annotations) if status is None else status
    return (set(settings.sidecar_names) | _names(status.get("containers"))
            | set(_comma_list(annotations.get(p.ANNOTATION_SIDECARS))))


def mesh_init_names(annotations: Mapping[str, str], settings: RewriteSettings,
                    status: Mapping | None = None) -> set[str]:
    status = _istio_status(annotations) if status is None else status
    return set(settings.mesh_init_names) | _names(status.get("initContainers"))


def classify(pod: Mapping, settings: RewriteSettings) -> Classification:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    inits = spec.get("initContainers") or []
    regular = spec.get("containers") or []

    status = _istio_status(annotations)
    sidecars = sidecar_names(annotations, settings, status)
    mesh_inits = mesh_init_names(annotations, settings, status)
    keep = _comma_list(annotations.get(p.ANNOTATION_KEEP_INIT))
    out = Classification(sidecar_names=sidecars)

    init_names = {c.get("name") for c in inits}
    known = init_names | {c.get("name") for c in regular}
    for name in keep:
        if name not in init_names:
            out.warnings.append(f"{p.ANNOTATION_KEEP_INIT} names {name!r}, which is not an init container of this pod")
    kept = set(keep)
    for name in _comma_list(annotations.get(p.ANNOTATION_SIDECARS)):
        if name not in known:
            out.warnings.append(f"{p.ANNOTATION_SIDECARS} names {name!r}, which is not a container of this pod")

    for c in inits:
        name = c.get("name")
        if is_restartable(c):
            out.kept_init.append(c)
            out.native_sidecars.append(c)
            if out.steps and name not in sidecars:  # a mesh's proxy is meant to come first
                out.late_sidecars.append((str(name), [str(s.get("name")) for s in out.steps]))
        elif name in mesh_inits or name in kept or name == p.INIT_CONTAINER_NAME:
            if out.steps and name in kept:
                out.kept_after_steps.append(str(name))
            out.kept_init.append(c)
        else:
            out.steps.append(c)
    for c in regular:
        (out.sidecars if c.get("name") in sidecars else out.mains).append(c)
    return out



def _meshes(pod: Mapping, namespace: Mapping | None = None) -> dict[tuple[str, ...], tuple[bool, bool]]:
    """Per mesh, by its native-injection annotation keys: (the pod asks it to inject, it has
    injected already), as the pod's own labels and annotations say, and, with `namespace`
    (the pod's Namespace object), its namespace's: Istio's `istio-injection=enabled` or a
    revision label (`istio-injection` wins where both are set), Linkerd's annotation; the
    pod's own `false` / `disabled` opts out of its namespace's."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    ns_labels = mapping_at(namespace or {}, "metadata", "labels")
    ns_annotations = mapping_at(namespace or {}, "metadata", "annotations")
    istio = str(annotations.get(p.ISTIO_INJECT_ANNOTATION, labels.get(p.ISTIO_INJECT_LABEL, ""))).lower()
    by_namespace = ns_labels.get(p.ISTIO_NAMESPACE_LABEL, "enabled" if p.ISTIO_REVISION_LABEL in ns_labels else "")
    istio_asked = istio == "true" or (istio != "false" and str(by_namespace) == "enabled")
    linkerd = str(annotations.get(p.LINKERD_INJECT_ANNOTATION, ns_annotations.get(p.LINKERD_INJECT_ANNOTATION, "")))
    return {(p.ISTIO_NATIVE_ANNOTATION,): (istio_asked, p.ISTIO_STATUS_ANNOTATION in annotations),
            p.LINKERD_NATIVE_ANNOTATIONS: (linkerd.lower() in ("enabled", "ingress"),
                                           p.LINKERD_STATUS_ANNOTATION in annotations)}


def requested_meshes(pod: Mapping) -> list[tuple[str, ...]]:
    """The meshes this pod asks for (injection requested or already done), each as the
    annotation keys that ask it for a native proxy (every name its releases read)."""
    return [keys for keys, (asked, done) in _meshes(pod).items() if asked or done]


def injection_pending(pod: Mapping, namespace: Mapping | None = None) -> bool:
    """The pod, or its namespace, asks a mesh for a proxy that mesh has not injected yet
    (its webhook runs after initshift's), whatever sidecars the pod has already. Istio's and
    Linkerd's injectors skip a pod on the host's network."""
    if mapping_at(pod, "spec").get("hostNetwork") is True:
        return False
    return any(asked and not done for asked, done in _meshes(pod, namespace).values())


def native_proxies(cls: Classification) -> list[str]:
    """Recognised sidecars already running as native sidecars (the mesh injected them so)."""
    return [c["name"] for c in cls.native_sidecars if c.get("name") in cls.sidecar_names]


def native_requested(pod: Mapping) -> bool:
    """The pod asks its mesh for a native proxy (`sidecar.istio.io/nativeSidecar: "true"`, Linkerd's)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return any(str(annotations.get(key, "")).lower() == "true"
               for key in (p.ISTIO_NATIVE_ANNOTATION, *p.LINKERD_NATIVE_ANNOTATIONS))


def has_mesh_marker(pod: Mapping) -> bool:
    """The pod asks a mesh to inject a proxy (which may happen after this webhook)."""
    return bool(requested_meshes(pod))


def pod_mode(pod: Mapping, settings: RewriteSettings) -> str:
    """The pod's `initshift.io/mode`, else the server's default."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(p.ANNOTATION_MODE, settings.mode)).strip()


def managed_as(pod: Mapping) -> str | None:
    """The value of the `initshift.io/managed` label: how initshift already rewrote the pod."""
    value = mapping_at(pod, "metadata", "labels").get(p.LABEL_MANAGED)
    return None if value is None else str(value)


def mark_managed(pod: dict, how: str) -> None:
    submap(pod, "metadata", "labels")[p.LABEL_MANAGED] = how
