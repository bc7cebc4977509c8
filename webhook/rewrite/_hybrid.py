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
  sidecars whose readiness probe it can check on loopback; a sidecar step 0 cannot probe
  gets a startupProbe derived from its readinessProbe instead, and the kubelet holds every
  regular container until it passes (`_waiter.gate`; docs/strategies.md says why).

The kubelet's hold (`_settle_startup`). The kubelet starts the container after a native
sidecar once the sidecar has *started*: its startupProbe passed (probed at most once a
second, so ~0.5-1 s after the proxy is ready) and its postStart hook returned (KEP-753).
A recognised sidecar (a mesh proxy) whose readiness step 0 already waits for on loopback,
with nothing that could reach the network before step 0 (every regular container a step
or a main, no init container after it but `initshift-init`, which only copies the waiter),
needs no such hold: it gets no startupProbe, so step 0 starts within one gate poll of the
proxy's readiness. Its own startupProbe is removed only when it has no livenessProbe that
a slow start could fail (the startupProbe is what keeps liveness off it; Linkerd's `/live`
answers from the start, `_hold.liveness_needs_startup`); the readinessProbe is never
touched. A postStart hook that only waits for the proxy's readiness (Linkerd's
`linkerd-await`, Istio's `pilot-agent wait` of holdApplicationUntilProxyStarts) holds the
kubelet the same way, and goes under the same conditions. What is removed (or, for a
sidecar initshift makes native, not derived) is recorded in
`initshift.io/startup-probes-removed` and `initshift.io/post-start-removed`, and put back by
a re-invocation that finds the conditions gone (another webhook added an init container
after the proxy, or a regular container the waiter does not run).

Re-invocation (the mesh injected after us) moves a recognised proxy that landed in
`containers` before `initshift-init`, as the first admission would have, and recomputes
step 0's gate (`_waiter.refresh`) and the kubelet's hold.
"""

from __future__ import annotations

from typing import Collection, Mapping

from waiter import protocol as p

from . import _hold as hold, _native as native, _waiter as waiter
from ._classify import Classification, classify, native_proxies, sidecar_names
from ._entrypoint import ImageEntrypoints
from ._errors import RewriteError
from ._resources import is_restartable, recorded_budget
from ._shape import mapping_at
from ._strategy import Built
from ..settings import RewriteSettings


def _never(sidecar: Mapping) -> bool:
    return False  # placed without a derived startupProbe: _settle_startup decides


def build(pod: Mapping, cls: Classification, settings: RewriteSettings, images: Mapping[str, ImageEntrypoints],
          lookup_error: str | None = None) -> Built:
    """The hybrid strategy (the module docstring); raises RewriteError when it cannot be done."""
    warnings: list[str] = []
    placed: dict = dict(pod)
    moved: list[str] = []
    if cls.sidecars:
        placement = native.place_sidecars(pod, cls.sidecars, cls.steps, settings, _never)
        placed, moved = placement.pod, [str(c["name"]) for c in placement.natives]
        warnings.append(native.moved_note(placement, where=False))
    elif not native_proxies(cls):
        warnings += native.ask_native_injection(placed)  # the proxy comes later: ask for a native one
    out, more = waiter.wrap_pod(placed, classify(placed, settings), settings, images, lookup_error,
                                origin=pod, how=p.MODE_HYBRID)
    out, notes = _settle_startup(out, settings, moved, {}, {})  # a first admission trusts no record it came with
    return Built(out, [*warnings, *notes, *more])


def refresh(pod: Mapping, settings: RewriteSettings) -> dict:
    """Re-invocation of a hybrid pod: recognised sidecars injected into `containers` since
    become native sidecars before `initshift-init`; then the waiter's refresh and the
    kubelet's hold, from the record the first admission left."""
    names = waiter.managed_names(pod)
    assert names is not None
    work = {*names[0], *names[1]}
    spec = pod.get("spec") or {}
    known = sidecar_names((pod.get("metadata") or {}).get("annotations") or {}, settings)
    late = [c for c in spec.get("containers") or [] if c.get("name") in known and c.get("name") not in work]
    if late:  # after the last init container (before `initshift-init` in a pod an earlier initshift admitted)
        anchor = [c for c in spec.get("initContainers") or [] if c.get("name") == p.INIT_CONTAINER_NAME]
        if recorded_budget(pod) is None:
            # Injected after the rewrite, so left out of the steps' budget: taken back from it
            # (with a budget recorded, the waiter's refresh weighs every sidecar against it).
            spec = {**spec, "containers": waiter.give_back_to_sidecars(spec.get("containers") or [], names[0], late,
                                                                        settings)}
        pod = native.place_sidecars({**pod, "spec": spec}, late, anchor, settings, _never).pod
    out, _ = _settle_startup(waiter.refresh(pod, settings), settings, [str(c["name"]) for c in late],
                             hold.removed_startup_probes(pod), hold.removed_post_start(pod))
    return out


def _settle_startup(pod: dict, settings: RewriteSettings, moved: Collection[str],
                    record: Mapping[str, dict], hooks: Mapping[str, dict]) -> tuple[dict, list[str]]:
    """`pod` (a hybrid pod of this admission's own) with each recognised native sidecar's
    startupProbe and postStart readiness wait decided (the module docstring), the records
    written, and what to tell."""
    spec = pod["spec"]
    inits = spec.get("initContainers") or []
    names = waiter.managed_names(pod)
    assert names is not None
    steps, mains = names
    regular = {c.get("name"): c for c in spec.get("containers") or []}
    gated = waiter.gated_probes(spec.get("containers") or [], steps, mains)
    wrapped = {*steps, *mains, p.COPY_CONTAINER_NAME}  # the copier only copies the waiter
    every_wrapped = all(n in wrapped for n in regular)
    last_other = max((i for i, c in enumerate(inits) if c.get("name") != p.INIT_CONTAINER_NAME), default=-1)
    proxies = sidecar_names(mapping_at(pod, "metadata", "annotations"), settings)
    moving = set(moved)

    kept: dict[str, dict] = {}
    kept_hooks: dict[str, dict] = {}
    notes: list[str] = []
    out_inits = []
    for i, c in enumerate(inits):
        name = c.get("name")
        if not (is_restartable(c) and name in proxies):
            out_inits.append(c)
            continue
        own = c.get("startupProbe")
        url = waiter.loopback_probe(c)
        release = every_wrapped and url is not None and url in gated and i >= last_other \
            and not (own is not None and hold.liveness_needs_startup(c))
        if release:
            probe = own if own is not None else record.get(name)
            if probe is None and name in moving:
                probe = native.startup_probe(c.get("readinessProbe"))  # what native's rule would add
            if probe is not None:
                kept[name] = probe
            if own is not None:
                c = {k: v for k, v in c.items() if k != "startupProbe"}
                notes.append(f"removed the startupProbe of {name!r}: step 0 waits for its readiness on loopback "
                             f"itself, so the kubelet need not hold the steps on the probe's tick "
                             f"({p.ANNOTATION_STARTUP_PROBES_REMOVED} keeps it)")
            out_inits.append(hold.settle_hook(c, True, hooks, kept_hooks, notes))
            continue
        c = hold.settle_hook(c, False, hooks, kept_hooks, notes)
        if own is None and name in record:
            c = {**c, "startupProbe": record[name]}
            notes.append(f"put back the startupProbe of {name!r}: a container now starts after it without "
                         f"waiting for step 0")
        elif own is None and name in moving:
            c, note = native.as_native(c)
            if note:
                notes.append(note)
        out_inits.append(c)

    out = dict(pod)
    out["spec"] = {**spec, "initContainers": out_inits}
    out = hold.record(out, p.ANNOTATION_STARTUP_PROBES_REMOVED, kept)
    return hold.record(out, p.ANNOTATION_POST_START_REMOVED, kept_hooks), notes
