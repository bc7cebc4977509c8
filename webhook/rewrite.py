"""The pure rewrite: (pod, settings) -> RewriteResult. No I/O, never mutates its input.

Every pod left unchanged carries a warning saying why; `reason` is a short slug for
metrics and logs. The JSONPatch sent to the apiserver is the diff (webhook/patch.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from waiter import protocol as p

from . import waiter_strategy
from .classify import Classification, classify, has_mesh_marker
from .entrypoint import ImageEntrypoints, Lookup, needs_image
from .podcheck import pod_problems
from .quantity import QuantityError
from .settings import Settings


@dataclass
class RewriteResult:
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


def _prefix(message: str) -> str:
    return f"initshift: {message}"


def _mode(pod: Mapping, settings: Settings) -> str:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(p.ANNOTATION_MODE, settings.rewrite.mode)).strip()


def _strategy(mode: str, native_supported: bool | None) -> str:
    if mode == p.MODE_AUTO:
        return p.MODE_NATIVE if native_supported else p.MODE_WAITER
    return mode


def _qualify(pod: Mapping, settings: Settings, native_supported: bool | None) -> _Skip | _Go:
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        return _Skip("invalid", "the object has no spec.containers; admitted unchanged")
    if not settings.feature_gate:
        return _Skip("feature-gate-off", f"{p.FEATURE_GATE_ENV} is off; admitted unchanged")
    mode = _mode(pod, settings)
    if mode not in p.MODES:
        return _Skip("invalid-mode", f"{p.ANNOTATION_MODE}={mode!r} is not one of {', '.join(p.MODES)}; "
                                     f"admitted unchanged")
    if mode == p.MODE_DISABLED:
        return _Skip("disabled", f"{p.ANNOTATION_MODE}=disabled; admitted unchanged")
    if (spec.get("os") or {}).get("name") == "windows":
        return _Skip("windows", "Windows pods are not supported; admitted unchanged")
    strategy = _strategy(mode, native_supported)
    if strategy == p.MODE_NATIVE:
        return _Skip("native-not-built", "the native strategy is not built yet; admitted unchanged")
    cls = classify(pod, settings.rewrite)
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Never", "OnFailure"):
        return _Skip("restart-policy", f"restartPolicy {policy}: the waiter strategy runs steps only in "
                                       f"run-to-completion pods (Never or OnFailure); admitted unchanged")
    if not cls.steps:
        return _Skip("no-init-containers", "no init container to move; admitted unchanged")
    proxies = [c["name"] for c in cls.native_sidecars if c.get("name") in set(settings.rewrite.sidecar_names)]
    if proxies:
        return _Skip("already-native", f"the proxy {proxies[0]!r} already runs as a native sidecar; "
                                       f"admitted unchanged")
    if not cls.all_sidecars and not has_mesh_marker(pod):
        return _Skip("no-sidecar", "no sidecar and no mesh injection requested: nothing to fix; admitted unchanged "
                                   "(re-invoked if a mesh injects later)")
    return _Go(strategy, cls)


def lookups_needed(pod: Mapping, settings: Settings, *, native_supported: bool | None = None) -> list[Lookup]:
    """Images whose configuration the rewrite will need (containers without `command`)."""
    if _is_managed(pod):
        return []
    plan = _qualify(pod, settings, native_supported)
    if not isinstance(plan, _Go) or plan.strategy != p.MODE_WAITER:
        return []
    return [Lookup(str(c.get("name")), str(c.get("image"))) for c in [*plan.cls.steps, *plan.cls.mains]
            if needs_image(c)]


def _is_managed(pod: Mapping) -> bool:
    return p.LABEL_MANAGED in ((pod.get("metadata") or {}).get("labels") or {})


def rewrite(pod: dict, settings: Settings, *, images: Mapping[str, ImageEntrypoints] | None = None,
            native_supported: bool | None = None) -> RewriteResult:
    try:
        return _rewrite(pod, settings, images or {}, native_supported)
    except (QuantityError, waiter_strategy.BuildError) as e:
        deny = isinstance(e, waiter_strategy.BuildError) and e.deny
        reason = e.reason if isinstance(e, waiter_strategy.BuildError) else "invalid"
        if deny:
            return RewriteResult(pod=pod, reason=reason, denied=_prefix(str(e)))
        return RewriteResult(pod=pod, warnings=[_prefix(f"{e}; admitted unchanged")], reason=reason)


def _rewrite(pod: dict, settings: Settings, images: Mapping[str, ImageEntrypoints],
             native_supported: bool | None) -> RewriteResult:
    if settings.feature_gate and _is_managed(pod) and waiter_strategy.managed_names(pod) is not None:
        if _mode(pod, settings) == p.MODE_DISABLED:
            return RewriteResult(pod=pod, reason="disabled",
                                 warnings=[_prefix("pod is already rewritten; mode=disabled leaves it as it is")])
        out = waiter_strategy.refresh(pod, settings.rewrite)
        return _checked(pod, out, [], "refreshed")
    plan = _qualify(pod, settings, native_supported)
    if isinstance(plan, _Skip):
        return RewriteResult(pod=pod, warnings=[_prefix(plan.message)], reason=plan.reason)
    out, warnings = waiter_strategy.build(pod, plan.cls, settings.rewrite, images)
    return _checked(pod, out, [*plan.cls.warnings, *warnings], "rewritten")


def _checked(before: dict, after: dict, warnings: list[str], reason: str) -> RewriteResult:
    """A last guard: a pod the apiserver would reject is never emitted."""
    problems = pod_problems(after)
    if problems:
        return RewriteResult(pod=before, reason="invalid", warnings=[
            _prefix(f"the rewritten pod would be invalid ({'; '.join(problems)}); admitted unchanged")])
    changed = after != before
    return RewriteResult(pod=after if changed else before, warnings=[_prefix(w) for w in warnings],
                         changed=changed, strategy=p.MODE_WAITER, reason=reason if changed else "unchanged")

