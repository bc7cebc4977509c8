"""The hybrid strategy: native sidecars (the native strategy's placement) and the steps run
in order by the waiter (the waiter strategy's chain), for run-to-completion pods.

- every recognised regular sidecar moves into initContainers with `restartPolicy: Always`,
  after the mesh's init containers, exactly where the native strategy puts it; a proxy the
  mesh already injected as a native sidecar stays where it is; a pod that only asks a mesh
  for a proxy also asks for a native one (the mesh's own annotation);
- the steps and mains are then wrapped by the waiter strategy, with the effective request
  and QoS class of the pod as admitted as the budget, and labelled `hybrid`;
- the kubelet starts the regular containers once the native sidecars have started and
  stops the sidecars once every regular container has exited: no quit endpoint (only
  regular sidecars are quit) and no deadline;
- step 0's gate is the waiter's (loopback probes, the ready file as their fallback) over the
  sidecars whose readiness probe it can check on loopback; those get no startupProbe, so
  the kubelet starts the regular containers beside the proxy. A sidecar step 0 cannot probe
  gets a startupProbe derived from its readinessProbe instead, and the kubelet holds every
  regular container until it passes (`_waiter.gate`; docs/strategies.md says why).

Re-invocation (the mesh injected after us) moves a recognised proxy that landed in
`containers` before `initshift-init`, as the first admission would have, and recomputes
step 0's gate (`_waiter.refresh`).
"""

from __future__ import annotations

from typing import Mapping

from waiter import protocol as p

from . import _native as native, _waiter as waiter
from ._classify import Classification, classify, native_proxies, sidecar_names
from ._entrypoint import ImageEntrypoints
from ._errors import RewriteError
from ._strategy import Built
from ..settings import RewriteSettings


def _unprobed(sidecar: Mapping) -> bool:
    """The kubelet, not step 0, waits for this sidecar: its readiness probe is not a loopback one."""
    return waiter.loopback_probe(sidecar) is None


def build(pod: Mapping, cls: Classification, settings: RewriteSettings, images: Mapping[str, ImageEntrypoints],
          lookup_error: str | None = None) -> Built:
    """The hybrid strategy (the module docstring); raises RewriteError when it cannot be done."""
    warnings: list[str] = []
    placed: dict = dict(pod)
    if cls.sidecars:
        placement = native.place_sidecars(pod, cls.sidecars, cls.steps, settings, _unprobed)
        placed = placement.pod
        warnings += [native.moved_note(placement, where=False), *placement.notes]
    elif not native_proxies(pod, cls, settings):
        warnings += native.ask_native_injection(placed)  # the proxy comes later: ask for a native one
    out, more = waiter.wrap_pod(placed, classify(placed, settings), settings, images, lookup_error,
                                origin=pod, how=p.MODE_HYBRID)
    return Built(out, [*warnings, *more])


def refresh(pod: Mapping, settings: RewriteSettings) -> dict:
    """Re-invocation of a hybrid pod: recognised sidecars injected into `containers` since
    become native sidecars before `initshift-init`; then the waiter's refresh."""
    names = waiter.managed_names(pod)
    assert names is not None
    work = {*names[0], *names[1]}
    spec = pod.get("spec") or {}
    known = sidecar_names((pod.get("metadata") or {}).get("annotations") or {}, settings)
    late = [c for c in spec.get("containers") or [] if c.get("name") in known and c.get("name") not in work]
    if late:
        anchor = [c for c in spec.get("initContainers") or [] if c.get("name") == p.INIT_CONTAINER_NAME]
        if not anchor:
            raise RewriteError(f"pod is labelled {p.LABEL_MANAGED}={p.MODE_HYBRID} but has no "
                               f"{p.INIT_CONTAINER_NAME!r} init container")
        pod = native.place_sidecars(pod, late, anchor, settings, _unprobed).pod
    return waiter.refresh(pod, settings)
