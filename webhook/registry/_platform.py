"""Which of an image's platforms a pod can run on, as the scheduler reads the pod.

The scheduler places a pod only on a node whose labels its `nodeSelector` matches and, with
a required node affinity, one of whose `nodeSelectorTerms` (ORed) matches, every
`matchExpressions` of that term holding (ANDed). Of a node's labels only
`kubernetes.io/os` and `kubernetes.io/arch` say the platform, so only expressions on them
narrow it; the rest (zones, pools) may hold or not on a node of any platform. `matchFields`
(a node's name, as a DaemonSet's pods carry) name a node, not a platform: such a term is
taken to allow every platform. A pod bound by `spec.nodeName` is not narrowed (the node is
not read).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..rewrite import ImageEntrypoints

__all__ = ["narrow", "platform_filter"]

_OS_LABEL = "kubernetes.io/os"
_ARCH_LABEL = "kubernetes.io/arch"
_PLATFORM_LABELS = (_OS_LABEL, _ARCH_LABEL)

Fits = Callable[[str, str], bool]  # (os, arch) -> whether a node of that platform can take the pod


def _expression(expr: Any) -> Fits | None:
    """One matchExpressions entry as a test of (os, arch); None when it is not about them."""
    if not isinstance(expr, Mapping) or expr.get("key") not in _PLATFORM_LABELS:
        return None
    index = _PLATFORM_LABELS.index(expr["key"])
    values = {v for v in expr.get("values") or [] if isinstance(v, str)}
    operator = expr.get("operator")
    if operator == "In":
        return lambda *platform: platform[index] in values
    if operator == "NotIn":
        return lambda *platform: platform[index] not in values
    if operator == "DoesNotExist":  # every node carries both labels
        return lambda *platform: False
    return None  # Exists: every node; Gt/Lt: not numbers here


def _term(term: Any) -> Fits:
    """One nodeSelectorTerm: every expression on the platform holds. A term that is empty (the
    API: it matches no node) allows none."""
    if not isinstance(term, Mapping) or not (term.get("matchExpressions") or term.get("matchFields")):
        return lambda os_, arch: False
    tests = [t for t in map(_expression, term.get("matchExpressions") or []) if t is not None]
    return lambda os_, arch: all(t(os_, arch) for t in tests)


def platform_filter(pod: Mapping) -> Fits | None:
    """Whether a node of platform (os, arch) can take the pod; None where nothing narrows it."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    pinned = [(i, selector[label]) for i, label in enumerate(_PLATFORM_LABELS) if isinstance(selector.get(label), str)]
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = [_term(t) for t in affinity.get("nodeSelectorTerms") or []] if isinstance(affinity, Mapping) else []
    if not pinned and not terms:
        return None
    return lambda os_, arch: all((os_, arch)[i] == value for i, value in pinned) and \
        (not terms or any(t(os_, arch) for t in terms))


def narrow(entry: ImageEntrypoints, fits: Fits | None) -> ImageEntrypoints:
    """Keep the platforms the pod can be scheduled on; all of them when nothing narrows (or
    none would be left: the pull, not the webhook, says the image lacks the platform)."""
    if fits is None:
        return entry
    kept = {k: v for k, v in entry.by_platform.items() if fits(*(k.split("/") + [""])[:2])}
    return ImageEntrypoints(kept, entry.digest) if kept else entry
