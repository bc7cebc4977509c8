"""The native strategy: the steps stay init containers; the sidecars become native sidecars.

On clusters with SidecarContainers (on by default from Kubernetes 1.29) an init container
with `restartPolicy: Always` starts in order and keeps running, and the kubelet starts
the next init container only once it has *started* (its startupProbe passed and its
postStart hook returned). So:

- every recognised sidecar in `containers` moves into `initContainers` with
  `restartPolicy: Always`, after the mesh's own init containers (istio-init,
  istio-validation, linkerd-init: they set up the traffic redirection the proxy needs)
  and before the first step, keeping its whole spec, lifecycle hooks included;
- a sidecar without a startupProbe gets one derived from its readinessProbe, since the
  kubelet gates the next init container on startup, not readiness;
- a pod asking a mesh for a proxy that is not there yet (this webhook ran before the
  injector) gets the mesh's own native-injection annotation; a sidecar that still lands
  in `containers` is moved when the apiserver re-invokes us.

Nothing else moves: kept init containers before the first step still run before the
proxy, everything after it keeps its order. The kubelet stops native sidecars once the
regular containers have exited, so Job pods complete without the watcher.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Sequence

from waiter import protocol as p

from ._errors import RewriteError
from ._classify import Classification, managed_as, mark_managed, mesh_init_names, requested_meshes
from ._entrypoint import ImageEntrypoints
from ._reasons import Reason
from ._strategy import Built
from ._resources import effective, growth_of, growth_warning, mesh_alone, pod_level, pod_requests, record_budget, recorded_budget
from ..settings import RewriteSettings
from ._shape import submap

# Fields a readiness probe and a startup probe share. successThreshold is not copied:
# it must be 1 for startup probes. terminationGracePeriodSeconds is not allowed on
# readiness probes, so there is none to copy.
_PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
_PROBE_TIMING = ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold")


def startup_probe(readiness: Mapping | None) -> dict | None:
    """A startupProbe with the readiness probe's handler and timings, or None.

    The readiness values are kept as they are (failureThreshold included): a startup
    probe that runs out restarts the sidecar (restartPolicy Always) while the next init
    container keeps waiting, so a slow proxy costs a restart, never the pod.
    """
    if not isinstance(readiness, Mapping):
        return None
    handlers = [h for h in _PROBE_HANDLERS if h in readiness]
    if len(handlers) != 1:
        return None
    probe: dict = {handlers[0]: copy.deepcopy(readiness[handlers[0]])}
    for key in _PROBE_TIMING:
        if key in readiness:
            probe[key] = readiness[key]
    if "successThreshold" in readiness:
        probe["successThreshold"] = 1
    return probe


def as_native(container: Mapping, derive: bool = True) -> tuple[dict, str | None]:
    """The sidecar as a native sidecar, and a note on how its start is detected. `derive`:
    give it a startupProbe from its readinessProbe when it has none (hybrid leaves that off
    for sidecars step 0 probes on loopback itself)."""
    out = dict(container)
    out["restartPolicy"] = "Always"
    name = out.get("name")
    if "startupProbe" in out or not derive:
        return out, None
    probe = startup_probe(out.get("readinessProbe"))
    if probe is not None:
        out["startupProbe"] = probe
        return out, f"sidecar {name!r} got a startupProbe derived from its readinessProbe"
    if "lifecycle" in out and "postStart" in (out.get("lifecycle") or {}):
        return out, f"sidecar {name!r} has no probe: the steps start once its postStart hook has returned"
    return out, (f"sidecar {name!r} has no readiness or startup probe: the steps start as soon as it has "
                 f"started, not when it is ready")


def _insert_at(inits: list[dict], anchors: Collection[int], annotations: Mapping,
               settings: RewriteSettings) -> tuple[int, list[str]]:
    """Index in initContainers where the sidecars go: before the first anchor (the first
    step; `initshift-init` in a hybrid pod), after every mesh init container (which sets up
    the redirection the proxy relies on); and the steps that still run before the mesh's."""
    first = next((i for i, c in enumerate(inits) if id(c) in anchors), len(inits))
    mesh = mesh_init_names(annotations, settings)
    after_mesh = max((i + 1 for i, c in enumerate(inits) if c.get("name") in mesh), default=0)
    early = [str(c.get("name")) for c in inits[first:after_mesh] if id(c) in anchors]
    return max(first, after_mesh), early


@dataclass(frozen=True)
class _Placement:
    """Regular sidecars moved into initContainers as native sidecars (no label, no checks)."""

    pod: dict
    natives: list[dict]
    notes: list[str]  # how each sidecar's start is detected
    before: str | None  # the init container they now precede
    early: list[str]  # anchors that still run before the mesh's init containers


def place_sidecars(pod: Mapping, sidecars: Sequence[Mapping], anchors: Sequence[Mapping], settings: RewriteSettings,
                   derive: Callable[[Mapping], bool] = lambda c: True) -> _Placement:
    """`sidecars` (regular containers of `pod`) moved to initContainers with restartPolicy
    Always, before the first of `anchors`; `derive(sidecar)`: whether it gets a startupProbe."""
    spec = pod.get("spec") or {}
    moving = {id(c) for c in sidecars}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    inits = list(spec.get("initContainers") or [])
    at, early = _insert_at(inits, {id(c) for c in anchors}, annotations, settings)
    natives, notes = [], []
    for c in sidecars:
        native, note = as_native(c, derive(c))
        natives.append(native)
        if note:
            notes.append(note)
    out = dict(pod)
    out["spec"] = {**spec, "initContainers": [*inits[:at], *natives, *inits[at:]],
                   "containers": [c for c in spec.get("containers") or [] if id(c) not in moving]}
    return _Placement(out, natives, notes, inits[at]["name"] if at < len(inits) else None, early)


def moved_note(placement: _Placement, where: bool = True) -> str:
    natives = placement.natives
    plural = "s" if len(natives) > 1 else ""
    before = f" before {placement.before!r}" if where and placement.before else ""
    return (f"moved sidecar{plural} {', '.join(repr(c['name']) for c in natives)} into initContainers as native "
            f"sidecar{plural} (restartPolicy Always){before}")


def move_sidecars(pod: Mapping, cls: Classification, settings: RewriteSettings) -> tuple[dict, list[str]]:
    """The pod with every regular sidecar moved into initContainers as a native sidecar."""
    spec = pod.get("spec") or {}
    moving = {id(c) for c in cls.sidecars}
    if not [c for c in spec.get("containers") or [] if id(c) not in moving]:
        raise RewriteError("every regular container is a sidecar; moving them would leave the pod with no "
                          "container to run", reason=Reason.NO_MAINS)
    placed = place_sidecars(pod, cls.sidecars, cls.steps, settings)
    warnings = [moved_note(placed)]
    if placed.early:
        warnings.append(f"init containers {', '.join(map(repr, placed.early))} run before the mesh's own init "
                        f"containers, so they still run without the sidecars")
    warnings += placed.notes
    out = placed.pod
    mark_managed(out, p.MODE_NATIVE)
    grown = growth_warning(spec, out["spec"], "the sidecars now run beside the init containers")
    if grown:
        warnings.append(grown)
    return out, warnings


def ask_native_injection(pod: dict) -> list[str]:
    """Annotate `pod` (a copy the caller owns) so the mesh injects its proxy as a native
    sidecar itself; what to tell the user."""
    annotations = submap(pod, "metadata", "annotations")
    warnings = []
    for keys in requested_meshes(pod):
        other = next(((k, annotations[k]) for k in keys if k in annotations and str(annotations[k]).lower() != "true"),
                     None)
        if other is not None:  # the pod's own choice, under any of the names
            warnings.append(f"the pod sets {other[0]}={other[1]!r}; left as it is, and a proxy injected into "
                            f"containers is moved when initshift is re-invoked")
            continue
        missing = [k for k in keys if k not in annotations]
        for key in missing:  # every name, so whichever the mesh's release reads says it
            annotations[key] = "true"
        if missing:
            also = f" (and {len(missing) - 1} older name{'s' if len(missing) > 2 else ''} of it)" \
                if len(missing) > 1 else ""
            warnings.append(f"no sidecar yet: set {missing[0]}=true{also} so the mesh injects its proxy as a "
                            f"native sidecar (one injected into containers is moved when initshift is re-invoked)")
    return warnings


def request_native_injection(pod: Mapping) -> tuple[dict, list[str]]:
    """The pod annotated so the mesh injects its proxy as a native sidecar itself, with its
    budget recorded (re-invoked, `injected_growth` says what that proxy adds)."""
    out = dict(pod)
    warnings = ask_native_injection(out)
    mark_managed(out, p.MODE_NATIVE)
    spec = pod.get("spec") or {}
    record_budget(out, effective(pod_requests(spec), pod_level(spec)[0]))
    return out, warnings


def injected_growth(pod: Mapping) -> str | None:
    """Re-invoked, the pod whose mesh injected the native proxy initshift asked for: a warning
    where that proxy, beside every init container, grows the pod's effective request beyond
    the one the mesh alone (a classic proxy) would give it."""
    budget = recorded_budget(pod)
    spec = pod.get("spec") or {}
    if budget is None or pod_level(spec)[0]:  # (a pod-level request stays the pod's request)
        return None
    alone = mesh_alone(spec, set(), budget)
    return growth_of(alone, pod_requests(spec),
                     "the proxy the mesh injected as a native sidecar, as initshift asked, runs beside every init "
                     "container (a classic one would not)")


def build(pod: Mapping, cls: Classification, settings: RewriteSettings, images: Mapping[str, ImageEntrypoints],
          lookup_error: str | None = None) -> Built:
    """The native strategy (the module docstring): the regular sidecars moved, or, with none
    in the pod yet, the mesh asked for native ones. No image is needed: nothing is wrapped."""
    if cls.sidecars:
        return Built(*move_sidecars(pod, cls, settings))
    return Built(*request_native_injection(pod), reason=Reason.ANNOTATED)


def resolve_support(setting: str, detected: bool | None) -> bool | None:
    """INITSHIFT_NATIVE_SIDECARS applied to a detection result: true/false override it."""
    return {"true": True, "false": False}.get(setting, detected)


def is_managed(pod: Mapping) -> bool:
    return managed_as(pod) == p.MODE_NATIVE
