"""The pure rewrite: (pod, settings) -> RewriteResult. No I/O, never mutates its input.

One admission makes one `Plan`: the pod is checked and classified once, the strategy is
chosen once (with INITSHIFT_NATIVE_SIDECARS applied here and nowhere else), and both the
registry lookups (`Plan.lookups`) and the rewrite (`Plan.rewrite`) read that plan.

Every pod left unchanged carries a warning saying why; `reason` is a short slug for
metrics and logs. The JSONPatch sent to the apiserver is the diff (webhook/admission/_patch.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from waiter import protocol as p

from ..settings import Settings
from . import _hybrid as hybrid_strategy, _native as native_strategy, _start_order as start_order
from . import _waiter as waiter_strategy
from ._classify import (Classification, classify, has_mesh_marker, managed_as, native_proxies, native_requested,
                        pod_mode)
from ._entrypoint import ImageEntrypoints, Lookup, needs_image
from ._errors import RewriteError
from ._podcheck import pod_problems, size_problems
from ._shape import mapping_at, shape_problem


@dataclass
class RewriteResult:
    """`changed`: a strategy rewrote the pod. A pod left as it is may still differ from the
    input by one annotation, ANNOTATION_NOT_REWRITTEN (the reason); the patch is the diff."""

    pod: dict
    warnings: list[str] = field(default_factory=list)
    changed: bool = False
    strategy: str | None = None
    reason: str = "rewritten"
    denied: str | None = None


@dataclass
class _Skip:
    reason: str
    message: str


@dataclass
class _Go:
    strategy: str
    cls: Classification
    notes: list[str] = field(default_factory=list)  # warnings about the choice itself


def _prefix(message: str) -> str:
    return f"initshift: {message}"


_RUN_TO_COMPLETION = ("Never", "OnFailure")


def _runs_to_completion(pod: Mapping) -> bool:
    """restartPolicy Never or OnFailure (Jobs, CronJobs, bare pods): the mains end, and a
    classic sidecar that does not keeps the pod running."""
    spec = pod.get("spec")
    return isinstance(spec, dict) and spec.get("restartPolicy", "Always") in _RUN_TO_COMPLETION


def _strategy(pod: Mapping, mode: str, native_supported: bool | None) -> str:
    if native_strategy.is_managed(pod):
        return p.MODE_NATIVE  # decided at the first admission; re-invocations finish the job
    if mode == p.MODE_AUTO:
        if not native_supported:
            return p.MODE_WAITER
        # Hybrid runs the steps as regular containers: a run-to-completion pod's only, and
        # never a declared start order (its init containers stay in place).
        restart = (pod.get("spec") or {}).get("restartPolicy", "Always")
        return p.MODE_HYBRID if restart in _RUN_TO_COMPLETION and not start_order.requested(pod) else p.MODE_NATIVE
    return mode


def _asked(pod: Mapping, *modes: str) -> bool:
    """The pod's own `initshift.io/mode` annotation is one of `modes` (not the server's default)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(p.ANNOTATION_MODE)
    return str(value).strip() in modes


def _no_native(native_supported: bool | None) -> str:
    return ("the cluster does not run native sidecars" if native_supported is False
            else "native-sidecar support of the cluster is unknown")


_NO_SIDECAR = _Skip("no-sidecar", "no sidecar and no mesh injection requested: nothing to fix; admitted unchanged "
                                 "(re-invoked if a mesh injects later)")


def _qualify_native(pod: Mapping, settings: Settings, mode: str, cls: Classification,
                    native_supported: bool | None) -> _Skip | _Go:
    managed = native_strategy.is_managed(pod)
    notes = []
    if mode in (p.MODE_NATIVE, p.MODE_HYBRID) and not managed and native_supported is not True:
        if native_supported is False:
            return _Skip("native-unsupported", f"{p.ANNOTATION_MODE}={mode}, but {_no_native(False)} "
                                               f"(Kubernetes 1.29 or later); admitted unchanged")
        notes.append(f"{_no_native(None)}; native sidecars used as {p.ANNOTATION_MODE}={mode} asks")
    if not cls.steps and not _runs_to_completion(pod):
        return _Skip("no-init-containers", "no init container needs the sidecars; admitted unchanged")
    if cls.sidecars:
        return _Go(p.MODE_NATIVE, cls, notes)
    proxies = native_proxies(pod, cls, settings.rewrite)
    if managed and (proxies or not has_mesh_marker(pod)):
        return _Skip("unchanged", "the pod is already set up for native sidecars; nothing to do")
    if proxies:
        return _Skip("already-native", f"the proxy {proxies[0]!r} already runs as a native sidecar; "
                                       f"admitted unchanged")
    if has_mesh_marker(pod):
        return _Go(p.MODE_NATIVE, cls, notes)  # the proxy comes later: ask the mesh for a native one
    return _NO_SIDECAR


def _qualify(pod: Mapping, settings: Settings, native_supported: bool | None) -> _Skip | _Go:
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        return _Skip("invalid", "the object has no spec.containers; admitted unchanged")
    if not settings.feature_gate:
        return _Skip("feature-gate-off", f"{p.FEATURE_GATE_ENV} is off; admitted unchanged")
    mode = pod_mode(pod, settings.rewrite)
    if mode not in p.MODES:
        return _Skip("invalid-mode", f"{p.ANNOTATION_MODE}={mode!r} is not one of {', '.join(p.MODES)}; "
                                     f"admitted unchanged")
    if mode == p.MODE_DISABLED:
        return _Skip("disabled", f"{p.ANNOTATION_MODE}=disabled; admitted unchanged")
    if (spec.get("os") or {}).get("name") == "windows":
        return _Skip("windows", "Windows pods are not supported; admitted unchanged")
    strategy = _strategy(pod, mode, native_supported)
    cls = classify(pod, settings.rewrite)
    if strategy == p.MODE_NATIVE:
        return _qualify_native(pod, settings, mode, cls, native_supported)
    policy = spec.get("restartPolicy", "Always")
    if policy not in _RUN_TO_COMPLETION:
        why = f"; native sidecars would, but {_no_native(native_supported)}" if mode == p.MODE_AUTO else \
            f"; {p.ANNOTATION_MODE}=native handles it" if strategy == p.MODE_HYBRID else ""
        return _Skip("restart-policy", f"restartPolicy {policy}: the {strategy} strategy runs steps only in "
                                       f"run-to-completion pods (Never or OnFailure){why}; admitted unchanged")
    if not cls.steps:
        return _qualify_mains(pod, settings, mode, strategy, cls, native_supported)
    proxies = native_proxies(pod, cls, settings.rewrite)
    # A proxy already native, or asked for natively and not injected yet (one that still
    # landed in containers says the mesh found no native support: the waiter keeps it).
    if strategy == p.MODE_WAITER and (proxies or (native_requested(pod) and not cls.sidecars)):
        if start_order.requested(pod) and proxies:
            return _Skip("already-native", f"the proxy {proxies[0]!r} already runs as a native sidecar; "
                                           f"admitted unchanged")
        strategy = p.MODE_HYBRID  # the proxy is (or will be) native: steps beside it are the hybrid's
    notes = []
    if strategy == p.MODE_HYBRID and proxies:
        notes.append(f"the proxy {proxies[0]!r} already runs as a native sidecar: the steps run beside it under "
                     f"the waiter (hybrid)")
    if strategy == p.MODE_HYBRID and mode == p.MODE_HYBRID and native_supported is not True and \
            (cls.sidecars or (has_mesh_marker(pod) and not proxies)):
        if native_supported is False:
            return _Skip("native-unsupported", f"{p.ANNOTATION_MODE}=hybrid, but {_no_native(False)} "
                                               f"(Kubernetes 1.29 or later); admitted unchanged")
        notes.append(f"{_no_native(None)}; native sidecars used as {p.ANNOTATION_MODE}=hybrid asks")
    if not cls.sidecars and not has_mesh_marker(pod) and not proxies:
        if len(cls.steps) > 1 and _asked(pod, p.MODE_WAITER, p.MODE_HYBRID):
            return _Go(strategy, cls, [f"no sidecar: the steps run under the waiter as {p.ANNOTATION_MODE} "
                                       f"asks, handed off in milliseconds instead of the kubelet's init order"])
        return _NO_SIDECAR  # native sidecars already run beside the init containers
    return _Go(strategy, cls, notes)


def _qualify_mains(pod: Mapping, settings: Settings, mode: str, strategy: str, cls: Classification,
                   native_supported: bool | None) -> _Skip | _Go:
    """A run-to-completion pod without steps (a Job's): only its mains' start and end need
    the sidecars. With native sidecars the proxy becomes one (the native strategy, no waiter);
    else every main runs under the waiter, gated like step 0, the last one quitting the sidecars."""
    if strategy == p.MODE_HYBRID:  # no step for the waiter: the native half is the whole rewrite
        return _qualify_native(pod, settings, mode, cls, native_supported)
    if start_order.requested(pod):  # the declared order wraps these mains itself
        return _Skip("no-init-containers", "no init container to move; admitted unchanged")
    if cls.sidecars:
        if not cls.mains:
            return _Skip("no-mains", "every regular container is a sidecar: no main to gate; admitted unchanged")
        return _Go(strategy, cls)
    proxies = native_proxies(pod, cls, settings.rewrite)
    if proxies:
        return _Skip("already-native", f"the proxy {proxies[0]!r} already runs as a native sidecar: the kubelet "
                                       f"starts the mains after it and stops it after them; admitted unchanged")
    if has_mesh_marker(pod):
        return _Skip("no-sidecar", "the mesh has not injected its proxy yet: the mains are rewritten when initshift "
                                   "is re-invoked after it; admitted unchanged")
    return _NO_SIDECAR


# What a plan does with the pod.
_SKIP, _FAIL, _REFRESH, _ORDERED = "skip", "fail", "refresh", "ordered"


@dataclass(frozen=True)
class Plan:
    """What one admission does with one pod, decided once (see the module docstring).
    `action` is `skip`, `fail`, `refresh`, `ordered`, or the strategy (`waiter`, `native`, `hybrid`)."""

    pod: dict
    settings: Settings
    native_supported: bool | None  # the cluster's support with INITSHIFT_NATIVE_SIDECARS applied
    action: str
    skip: _Skip | None = None
    error: RewriteError | None = None
    go: _Go | None = None
    base: dict | None = None  # start order: the pod it orders (the native strategy's, when it applies)
    notes: tuple[str, ...] = ()
    order: start_order.Ordering | None = None
    forged: tuple[str, ...] = ()  # watcher-owned annotations the pod came with, removed from `pod`

    def lookups(self) -> list[Lookup]:
        """Images whose configuration the rewrite will need (containers without `command`)."""
        if self.action == _ORDERED:
            assert self.base is not None and self.order is not None
            return start_order.lookups(self.base, self.order)
        if self.action not in (p.MODE_WAITER, p.MODE_HYBRID) or self.go is None:
            return []
        return [Lookup(str(c.get("name")), str(c.get("image"))) for c in [*self.go.cls.steps, *self.go.cls.mains]
                if needs_image(c)]

    def rewrite(self, *, images: Mapping[str, ImageEntrypoints] | None = None,
                lookup_error: str | None = None) -> RewriteResult:
        """`lookup_error`: why the registry lookup failed, the message given for containers
        without `command` whose image is missing from `images`."""
        try:
            result = self._rewrite(images or {}, lookup_error)
        except RewriteError as e:
            result = _failed(self.pod, e)
        if not result.denied:
            before = result.pod
            result = _decision_on_pod(self.pod, result)
            if result.pod is not before and size_problems(result.pod):
                result.pod = before  # the note would not fit etcd's limit: the warning still says why
        if self.forged and result.denied is None:
            result.changed = True  # `pod` is already without them: whatever else happens, they go
            result.warnings.insert(0, _prefix(
                f"removed {', '.join(self.forged)}: only the initshift watcher writes "
                f"{'them' if len(self.forged) > 1 else 'it'}, never the pod's creator"))
        return result

    def _rewrite(self, images: Mapping[str, ImageEntrypoints], lookup_error: str | None) -> RewriteResult:
        pod, settings = self.pod, self.settings
        if self.error is not None:
            raise self.error
        if self.skip is not None:
            return RewriteResult(pod=pod, warnings=[_prefix(self.skip.message)], reason=self.skip.reason)
        if self.action == _REFRESH:
            if managed_as(pod) == p.MODE_HYBRID:
                return _checked(pod, hybrid_strategy.refresh(pod, settings.rewrite), [], "refreshed", p.MODE_HYBRID)
            return _checked(pod, waiter_strategy.refresh(pod, settings.rewrite), [], "refreshed")
        if self.action == _ORDERED:
            assert self.base is not None and self.order is not None
            out, warnings = start_order.build(self.base, settings, images, self.order)
            return _checked(pod, out, [*self.notes, *warnings], "rewritten", p.MANAGED_START_ORDER)
        assert self.go is not None
        if self.action == p.MODE_NATIVE:
            out, warnings, reason = _native_parts(pod, self.go, settings)
            return _checked(pod, out, warnings, reason, p.MODE_NATIVE)
        if self.action == p.MODE_HYBRID:
            out, warnings = hybrid_strategy.build(pod, self.go.cls, settings.rewrite, images, lookup_error)
            return _checked(pod, out, [*self.go.notes, *self.go.cls.warnings, *warnings], "rewritten", p.MODE_HYBRID)
        out, warnings = waiter_strategy.build(pod, self.go.cls, settings.rewrite, images, lookup_error)
        return _checked(pod, out, [*self.go.notes, *self.go.cls.warnings, *warnings], "rewritten")


def plan(pod: dict, settings: Settings, *, native_supported: bool | None = None) -> Plan:
    """The plan for one pod; never raises (a pod it cannot handle is a `skip` or a `fail`)."""
    native = native_strategy.resolve_support(settings.rewrite.native_sidecars, native_supported)
    problem = shape_problem(pod)
    if problem:
        return Plan(pod, settings, native, _SKIP, skip=_Skip("invalid", f"{problem}; admitted unchanged"))
    cleaned, forged = _without_watcher_state(pod) if settings.feature_gate else (pod, ())
    try:
        return dataclasses.replace(_plan(cleaned, settings, native), forged=forged)
    except RewriteError as e:
        return Plan(cleaned, settings, native, _FAIL, error=e, forged=forged)


def _is_watcher_state(key: str) -> bool:
    return key in (p.ANNOTATION_READY, p.ANNOTATION_OUTCOME) or key.startswith(p.ANNOTATION_READY_PREFIX)


def _without_watcher_state(pod: dict) -> tuple[dict, tuple[str, ...]]:
    """The pod without the annotations the watcher owns (a pod created with the ready gate
    already open, or a made-up outcome, would skip or misreport its steps), and their keys."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    forged = tuple(sorted(k for k in annotations if _is_watcher_state(k)))
    if not forged:
        return pod, ()
    kept = {k: v for k, v in annotations.items() if k not in forged}
    return {**pod, "metadata": {**pod["metadata"], "annotations": kept}}, forged


# Skips where initshift was told to leave pods alone: those pods are not touched at all.
_SWITCHED_OFF = ("feature-gate-off", "disabled")


def _decision_on_pod(pod: dict, result: RewriteResult) -> RewriteResult:
    """A pod with init containers, or a run-to-completion one, that is not rewritten says why
    on itself (the one change made to it); a rewritten pod drops the reason an earlier
    admission left."""
    meta, notes = mapping_at(pod, "metadata"), mapping_at(pod, "metadata", "annotations")
    inits = mapping_at(pod, "spec").get("initContainers")
    if result.changed and p.ANNOTATION_NOT_REWRITTEN in (result.pod["metadata"].get("annotations") or {}):
        annotations = dict(result.pod["metadata"]["annotations"])
        del annotations[p.ANNOTATION_NOT_REWRITTEN]
        result.pod = {**result.pod, "metadata": {**result.pod["metadata"], "annotations": annotations}}
    elif not result.changed and result.strategy is None and result.reason not in _SWITCHED_OFF \
            and ((isinstance(inits, list) and inits) or _runs_to_completion(pod)) \
            and isinstance(pod.get("metadata"), (dict, type(None))) \
            and p.LABEL_MANAGED not in mapping_at(pod, "metadata", "labels") \
            and notes.get(p.ANNOTATION_NOT_REWRITTEN) != result.reason:
        result.pod = {**pod, "metadata": {**meta, "annotations": {**notes, p.ANNOTATION_NOT_REWRITTEN: result.reason}}}
    return result


def _plan(pod: dict, settings: Settings, native: bool | None) -> Plan:
    if settings.feature_gate and waiter_strategy.managed_names(pod) is not None:
        if pod_mode(pod, settings.rewrite) == p.MODE_DISABLED:
            return Plan(pod, settings, native, _SKIP, skip=_Skip(
                "disabled", "pod is already rewritten; mode=disabled leaves it as it is"))
        return Plan(pod, settings, native, _REFRESH)
    choice = _qualify(pod, settings, native)
    if start_order.requested(pod) and not _final(choice):
        return _ordered(pod, choice, settings, native)
    if isinstance(choice, _Skip):
        return Plan(pod, settings, native, _SKIP, skip=choice)
    return Plan(pod, settings, native, choice.strategy, go=choice)


def _ordered(pod: dict, choice: _Skip | _Go, settings: Settings, native: bool | None) -> Plan:
    """Declared start order (webhook/rewrite/_start_order.py), composed after the native strategy."""
    if isinstance(choice, _Go) and choice.strategy in (p.MODE_WAITER, p.MODE_HYBRID):
        raise RewriteError(
            f"{p.ANNOTATION_START_ORDER} cannot be combined with the {choice.strategy} strategy (this pod's init "
            f"containers would become steps); use {p.ANNOTATION_MODE}=native on a cluster with native sidecars, or "
            f"remove the annotation", deny=True, reason=start_order.REASON)
    base, notes = pod, []
    if isinstance(choice, _Go):
        try:
            base, notes, _ = _native_parts(pod, choice, settings)
        except RewriteError as e:
            notes = [f"{e}; admitted unchanged"]
    return Plan(pod, settings, native, _ORDERED, base=base, notes=tuple(notes),
                order=start_order.ordering(base, settings, native))


def rewrite(pod: dict, settings: Settings, *, images: Mapping[str, ImageEntrypoints] | None = None,
            native_supported: bool | None = None, lookup_error: str | None = None) -> RewriteResult:
    """`plan(...).rewrite(...)` in one call, for callers that make no registry lookup."""
    return plan(pod, settings, native_supported=native_supported).rewrite(images=images, lookup_error=lookup_error)


def _failed(pod: dict, e: RewriteError) -> RewriteResult:
    if e.deny:
        return RewriteResult(pod=pod, reason=e.reason, denied=_prefix(str(e)))
    return RewriteResult(pod=pod, warnings=[_prefix(f"{e}; admitted unchanged")], reason=e.reason)


def _native_parts(pod: dict, go: _Go, settings: Settings) -> tuple[dict, list[str], str]:
    """The native strategy's pod, warnings and reason; raises RewriteError."""
    if go.cls.sidecars:
        out, warnings = native_strategy.move_sidecars(pod, go.cls, settings.rewrite)
        reason = "rewritten"
    else:
        out, warnings = native_strategy.request_native_injection(pod)
        reason = "annotated"
    return out, [*go.notes, *go.cls.warnings, *warnings], reason


def _final(choice: _Skip | _Go) -> bool:
    """Skips that hold whatever the pod asks for (start order included)."""
    return isinstance(choice, _Skip) and choice.reason in ("invalid", "feature-gate-off", "invalid-mode", "disabled",
                                                           "windows")


def _checked(before: dict, after: dict, warnings: list[str], reason: str,
             strategy: str = p.MODE_WAITER) -> RewriteResult:
    """A last guard: a pod the apiserver would reject, or etcd could not store, is never emitted."""
    problems = pod_problems(after)
    if problems:
        return RewriteResult(pod=before, reason="invalid", warnings=[
            _prefix(f"the rewritten pod would be invalid ({'; '.join(problems)}); admitted unchanged")])
    problems = size_problems(after)
    if problems:
        return RewriteResult(pod=before, reason="too-large", warnings=[
            _prefix(f"the rewritten pod would not fit ({'; '.join(problems)}); admitted unchanged")])
    changed = after != before
    return RewriteResult(pod=after if changed else before, warnings=[_prefix(w) for w in warnings],
                         changed=changed, strategy=strategy, reason=reason if changed else "unchanged")
