"""A pod's own pod-level resources (`spec.resources`, KEP-2837; beta and on by default from
Kubernetes 1.34), which the rewritten pod must still fit.

The rewrite never changes them, but it changes what they are checked against: steps become
regular containers, a proxy runs beside the steps. The apiserver's validation, as checked
on a real v1.34.9 apiserver (validatePodResourceConsistency):

- the containers' aggregate request (resource.AggregateContainerRequests: native sidecars
  count in both phases) is at most each pod-level request;
- each regular container's limit is at most the pod-level limit (init containers, native
  sidecars among them, are not checked: a step's limit becomes checked once it is a
  regular container).

Pod-level requests are defaulted on decode, before any webhook (`_resources.pod_level`), so
they are read from the pod as admitted. `fit` keeps initshift's own regular container
(`initshift-copy`) within the pod-level limits, and the steps' budget (`preserve`,
`divide`) within the pod-level requests: it matters on re-invocation, when a proxy the
mesh injected after the rewrite asks for more than the budget left out. `added` is what the
rewritten pod breaks that the pod as admitted does not, in the apiserver's words: such a
pod is admitted unchanged (a step's limit is the user's, never lowered to fit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from waiter import protocol as p

from ._quantity import format_quantity
from ._resources import Amounts, container_amounts, pod_level, pod_requests, take_back
from ._shape import mapping_at

__all__ = ["Problem", "added", "fit", "has_pod_level"]


@dataclass(frozen=True)
class Problem:
    key: tuple[str, ...]  # what failed, the container by name: compared across the rewrite
    message: str  # as the apiserver words it


def has_pod_level(pod: Mapping) -> bool:
    return isinstance(mapping_at(pod, "spec").get("resources"), Mapping)


def _problems(pod: Mapping, requests: Amounts, limits: Amounts) -> list[Problem]:
    spec = mapping_at(pod, "spec")
    out = []
    aggregate = pod_requests(spec)
    for r, v in sorted(requests.items()):
        if aggregate.get(r, 0) > v:
            out.append(Problem(("requests", r), f'spec.resources.requests[{r}]: Invalid value: '
                                                f'"{format_quantity(v, r)}": must be greater than or equal to '
                                                f"aggregate container requests of {format_quantity(aggregate[r], r)}"))
    for i, c in enumerate(spec.get("containers") or []):
        for r, v in sorted(container_amounts(c)[1].items()):
            if r in limits and v > limits[r]:
                out.append(Problem(("limits", r, str(c.get("name"))),
                                   f'spec.resources.containers[{i}][{r}].limits: Invalid value: '
                                   f'"{format_quantity(v, r)}": must be less than or equal to pod limits of '
                                   f"{format_quantity(limits[r], r)}"))
    return out


def added(before: Mapping, after: Mapping) -> list[Problem]:
    """The problems of `after` (the rewrite of `before`) that `before` does not have."""
    requests, limits = pod_level(mapping_at(before, "spec"))
    had = {x.key for x in _problems(before, requests, limits)}
    return [x for x in _problems(after, requests, limits) if x.key not in had]


def fit(before: Mapping, after: dict, steps: Collection[str] = ()) -> dict:
    """`after` with initshift's own regular containers' limits (and requests) within the
    pod-level limits (they only copy the waiter, and less is enough), and what the
    containers request beyond a pod-level request taken back from `steps`, the steps whose
    requests share the pod's budget (a proxy injected after the rewrite, made native or
    asked for natively, counts in every phase)."""
    requests, limits = pod_level(mapping_at(before, "spec"))
    containers = mapping_at(after, "spec").get("containers") or []
    fitted = [_capped(c, limits) if c.get("name") == p.COPY_CONTAINER_NAME else c for c in containers]
    if steps and requests:
        aggregate = pod_requests({**after["spec"], "containers": fitted})
        excess = {r: aggregate[r] - v for r, v in requests.items() if aggregate.get(r, 0) > v}
        if excess:
            fitted = take_back(fitted, steps, excess)
    if all(x is y for x, y in zip(fitted, containers)):
        return after
    return {**after, "spec": {**after["spec"], "containers": fitted}}


def _capped(c: Mapping, pod_limits: Amounts) -> Mapping:
    requests, limits = container_amounts(c)
    over = {r: pod_limits[r] for r, v in limits.items() if r in pod_limits and v > pod_limits[r]}
    if not over:
        return c
    res = c.get("resources") or {}
    new_limits = {**(res.get("limits") or {}), **{r: format_quantity(v, r) for r, v in over.items()}}
    new_requests = {**(res.get("requests") or {}),
                    **{r: format_quantity(v, r) for r, v in over.items() if requests.get(r, 0) > v}}
    return {**c, "resources": {**res, "limits": new_limits, **({"requests": new_requests} if new_requests else {})}}
