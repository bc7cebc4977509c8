"""Pod resource arithmetic, as the scheduler and the kubelet do it.

- A container's request for a resource is `requests[r]`, else `limits[r]` (the apiserver
  defaults requests to limits), else zero.
- The pod's effective request (k8s.io/component-helpers resource.PodRequests): regular
  containers and restartable (native sidecar) init containers add up; each ordinary init
  container counts together with the restartable ones started before it; the pod takes
  the larger of the two.
- QoS class (pkg/apis/core/helper/qos): BestEffort, Guaranteed or Burstable.
- Pod-level resources (`spec.resources`, KEP-2837; beta and on by default from 1.34): where
  a pod sets them they are its request and limit for cpu, memory and hugepages (the
  scheduler's PodRequests, LimitRanger's Pod items) and its QoS class comes from them
  alone; the containers must fit in them (_podlevel.py).

`plan_steps` gives the steps' requests once they move from init (max) to regular (sum)
containers: without letting the pod's effective request grow (policy `preserve`),
proportionally (`divide`), or as they were (`keep`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Mapping, Sequence

from waiter import protocol as p

from ._quantity import ZERO, QuantityError, format_quantity, parse
from ._shape import submap

# Resources the kubelet can overcommit; every other one (extended resources, hugepages)
# must have requests equal to limits, so its request cannot be lowered to make room.
SHAREABLE = ("cpu", "memory", "ephemeral-storage")
_QOS_RESOURCES = ("cpu", "memory")

Amounts = dict[str, int]  # resource -> its integer unit (milli-CPU, bytes, units): _quantity.py


def container_amounts(c: Mapping) -> tuple[Amounts, Amounts]:
    """A container's requests (limits where a request is missing, as the apiserver defaults
    them) and its limits, each quantity parsed once."""
    res = c.get("resources")
    if not res:
        return {}, {}
    limits = {name: parse(value, name) for name, value in (res.get("limits") or {}).items()}
    requests = dict(limits)
    for name, value in (res.get("requests") or {}).items():
        requests[name] = parse(value, name)
    return requests, limits


Read = Callable[[Mapping], tuple[Amounts, Amounts]]  # a container -> its (requests, limits)


class ReadOnce:
    """A `Read` for one review: each `resources` object is parsed once, however many rules
    read it. The rewritten pod's containers are shallow copies that keep the admitted pod's
    `resources` objects (only the steps whose requests change get new ones), so its
    quantities are mostly read already. Keyed by object identity; each key's object is held,
    so no id is reused while the reader lives. Nothing returned may be changed."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, Amounts, Amounts]] = {}

    def __call__(self, c: Mapping) -> tuple[Amounts, Amounts]:
        res = c.get("resources")
        seen = self._seen.get(id(res))
        if seen is None:
            seen = self._seen[id(res)] = (res, *container_amounts(c))
        return seen[1], seen[2]


def add(a: Amounts, b: Mapping[str, int]) -> Amounts:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, ZERO) + v
    return out


def _max(a: Amounts, b: Mapping[str, int]) -> Amounts:
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, ZERO), v)
    return out


def _add_into(total: Amounts, b: Mapping[str, int]) -> None:
    """add(), in place: summing n containers copies no dict n times."""
    get = total.get
    for k, v in b.items():
        total[k] = get(k, ZERO) + v


def sum_requests(containers: Iterable[Mapping], read: Read = container_amounts) -> Amounts:
    total: Amounts = {}
    for c in containers:
        _add_into(total, read(c)[0])
    return total


def is_restartable(c: Mapping) -> bool:
    return c.get("restartPolicy") == "Always"


def restartable_sum(init_containers: Iterable[Mapping], read: Read = container_amounts) -> Amounts:
    return sum_requests((c for c in init_containers if is_restartable(c)), read)


_Parsed = list[tuple[Mapping, Amounts, Amounts]]  # (container, requests, limits)


def _parsed(containers: Iterable[Mapping], read: Read = container_amounts) -> _Parsed:
    return [(c, *read(c)) for c in containers]


def _pod_requests(inits: _Parsed, regulars: _Parsed) -> Amounts:
    # resource.PodRequests, each step touching only the resources the container names (so
    # linear in the pod, whatever the number of distinct resources): an init container's
    # phase holds it plus the native sidecars started before it; a native sidecar's adds it
    # to those. A resource the container does not name keeps the value it had when it last
    # changed, which init_max already holds.
    sidecars: Amounts = {}
    init_max: Amounts = {}
    for c, reqs, _ in inits:
        restartable = is_restartable(c)
        for k, v in reqs.items():
            phase = sidecars.get(k, ZERO) + v
            if restartable:
                sidecars[k] = phase
            if phase > init_max.get(k, ZERO):
                init_max[k] = phase
    regular: Amounts = dict(sidecars)
    for _, reqs, _ in regulars:
        _add_into(regular, reqs)
    return _max(regular, init_max)


def pod_requests(spec: Mapping) -> Amounts:
    """The pod's effective request per resource (without overhead, which is unchanged)."""
    return _pod_requests(_parsed(spec.get("initContainers") or []), _parsed(spec.get("containers") or []))


def pod_limits(spec: Mapping) -> Amounts:
    """The pod's effective limit per resource, summed as its request is (LimitRanger's
    podLimits): a container without a limit for a resource adds nothing to it."""
    def limits(containers: Iterable[Mapping]) -> _Parsed:
        return [(c, lims, lims) for c, _, lims in _parsed(containers)]
    return _pod_requests(limits(spec.get("initContainers") or []), limits(spec.get("containers") or []))


def is_pod_level(resource: str) -> bool:
    """A resource pod-level resources may set (the apiserver refuses the others)."""
    return resource in _QOS_RESOURCES or resource.startswith("hugepages-")


def _pod_level_amounts(values: object) -> Amounts:
    out: Amounts = {}
    for name, value in (values.items() if isinstance(values, Mapping) else ()):
        try:
            if is_pod_level(name):
                out[name] = parse(value, name)
        except QuantityError:
            pass  # the apiserver refuses such a pod before any webhook sees it
    return out


def pod_level(spec: Mapping) -> tuple[Amounts, Amounts]:
    """`spec.resources`' requests and limits, the requests defaulted as the apiserver does
    when it decodes the pod (defaultPodRequests), so before any webhook: with a pod-level
    limit set, a resource the containers request gets their aggregate request, and one
    only limited gets its limit."""
    res = spec.get("resources")
    if not isinstance(res, Mapping):
        return {}, {}
    requests, limits = _pod_level_amounts(res.get("requests")), _pod_level_amounts(res.get("limits"))
    if limits:
        for name, value in pod_requests(spec).items():
            if is_pod_level(name):
                requests.setdefault(name, value)
        for name, value in limits.items():
            requests.setdefault(name, value)
    return requests, limits


def pod_level_defaults_pending(spec: Mapping) -> list[str]:
    """The resources whose pod-level request the apiserver has still to default: the pod
    sets pod-level limits, and its containers now request what its pod-level requests do
    not name (requests LimitRanger gave them after the pod was decoded). The apiserver
    defaults them again after every webhook's patch, to the containers' aggregate at that
    moment, so the first patch fixes them, however small, for every later webhook."""
    res = spec.get("resources")
    if not isinstance(res, Mapping) or not _pod_level_amounts(res.get("limits")):
        return []
    named = _pod_level_amounts(res.get("requests"))
    return sorted(r for r in pod_requests(spec) if is_pod_level(r) and r not in named)


def effective(totals: Amounts, pod_level_amounts: Mapping[str, int]) -> Amounts:
    """The pod's request (or limit) per resource: the containers' `totals`, but the
    pod-level amount where it sets one (resource.PodRequests, PodLimits)."""
    return {**totals, **pod_level_amounts} if pod_level_amounts else totals


def requests_and_qos(spec: Mapping, read: Read = container_amounts) -> tuple[Amounts, str]:
    """pod_requests and qos_class of one spec, each container's quantities parsed once."""
    inits, regulars = _parsed(spec.get("initContainers") or [], read), _parsed(spec.get("containers") or [], read)
    return _pod_requests(inits, regulars), _qos(spec, [*inits, *regulars])


def qos_class(spec: Mapping) -> str:
    """BestEffort, Burstable or Guaranteed, computed the way the apiserver does."""
    return _qos(spec, _parsed([*(spec.get("initContainers") or []), *(spec.get("containers") or [])]))


def _qos(spec: Mapping, containers: _Parsed) -> str:
    if isinstance(spec.get("resources"), Mapping):  # pod-level resources decide alone (ComputePodQOS)
        requests, limits = pod_level(spec)
        return _qos_class([({}, requests, limits)], limits_needed=bool(limits))
    return _qos_class(containers)


def _qos_class(containers: _Parsed, limits_needed: bool = True) -> str:
    """`limits_needed`: each entry must limit cpu and memory to be Guaranteed (containers
    must; pod-level resources need only when they set any limit)."""
    requests: Amounts = defaultdict(int)
    limits: Amounts = defaultdict(int)
    guaranteed = True
    for _, reqs, lims in containers:
        # The apiserver defaults requests from limits before QoS is computed (`reqs` holds them).
        for name in _QOS_RESOURCES:
            q = reqs.get(name, 0)
            if q > 0:
                requests[name] += q
        found = 0
        for name in _QOS_RESOURCES:
            q = lims.get(name, 0)
            if q > 0:
                found += 1
                limits[name] += q
        if found < len(_QOS_RESOURCES) and limits_needed:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(limits.get(k) == v for k, v in requests.items()) and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def describe(amounts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={format_quantity(v, k)}" for k, v in sorted(amounts.items()) if v) or "none"


def growth_warning(before: Mapping, after: Mapping, why: str) -> str | None:
    """A warning when the pod's effective request grows from `before` to `after` (specs;
    a pod-level request does not)."""
    level = pod_level(before)[0]
    return growth_of(effective(pod_requests(before), level), effective(pod_requests(after), level), why)


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # json.dumps(..., separators=...) would build one per call


def record_budget(pod: dict, budget: Mapping[str, int]) -> None:
    """Record in `pod` (a copy the caller owns) `budget`, the effective request of the pod as
    admitted (ANNOTATION_BUDGET): what a re-invoked review weighs sidecars injected since
    against (`mesh_alone`)."""
    submap(pod, "metadata", "annotations")[p.ANNOTATION_BUDGET] = _COMPACT.encode(
        {r: format_quantity(v, r) for r, v in sorted(budget.items())})


def recorded_budget(pod: Mapping) -> Amounts | None:
    """The budget a rewrite recorded (record_budget); None where there is none (a pod an
    initshift that recorded none rewrote) or it does not read."""
    meta = pod.get("metadata")
    text = (meta.get("annotations") or {}).get(p.ANNOTATION_BUDGET) if isinstance(meta, Mapping) else None
    try:
        recorded = json.loads(text) if isinstance(text, str) else None
        return {str(r): parse(v, str(r)) for r, v in recorded.items()} if isinstance(recorded, dict) else None
    except (ValueError, QuantityError):
        return None


def mesh_alone(spec: Mapping, steps: frozenset[str] | set[str], budget: Amounts, own: Collection[str] = ()) -> Amounts:
    """The effective request the mesh alone would give the pod of `spec`, per resource:
    max(budget, what its containers other than `steps` and initshift's `own` ask side by
    side, native sidecars among them). `budget` is the pod's effective request as admitted,
    the larger of its init phase (where the steps were) and its regular one; a sidecar the
    mesh injected since runs beside the regular containers, so it adds to that phase."""
    others = add(sum_requests(c for c in spec.get("containers") or [] if c.get("name") not in steps
                              and c.get("name") not in own),
                 restartable_sum(spec.get("initContainers") or []))
    return {r: max(budget.get(r, 0), others.get(r, 0)) for r in {*budget, *others}}


def growth_of(old_total: Amounts, new_total: Mapping[str, int], why: str) -> str | None:
    """growth_warning from the two pod_requests."""
    grown = {r: v for r, v in new_total.items() if v > old_total.get(r, ZERO)}
    if not grown:
        return None
    return f"the pod's effective request grows to {describe(grown)} (was {describe(old_total)}): {why}"


def take_back(containers: Sequence[Mapping], steps: Collection[str], amounts: Mapping[str, int],
              floor: Callable[[Mapping, str], int] = lambda c, r: ZERO) -> list[Mapping]:
    """`containers` with up to `amounts` (per resource) taken from the requests of the
    `steps` among them, largest request first, each down to its `floor`: what the steps'
    share of the pod's budget gives back. A request may be a limit's (the apiserver's
    default): it is then written."""
    out = list(containers)
    for r, amount in sorted(amounts.items()):
        held = sorted(((req, i) for i, c in enumerate(out) if c.get("name") in steps
                       for req in (container_amounts(c)[0].get(r),) if req), key=lambda t: (-t[0], t[1]))
        for request, i in held:
            if amount <= 0:
                break
            take = min(amount, request - floor(out[i], r))
            if take > 0:
                c = out[i] = dict(out[i])
                res = c["resources"]
                requests = {**(res.get("requests") or {}), r: format_quantity(request - take, r)}
                c["resources"] = {**res, "requests": requests}
                amount -= take
    return out


@dataclass
class _StepPlan:
    """New requests for the steps (index -> resource -> quantity string) and what to say."""

    step_requests: list[dict[str, str]] = field(default_factory=list)
    problem: str | None = None  # the pod cannot be rewritten without growing it
    warnings: list[str] = field(default_factory=list)


def plan_steps(
    steps: list[Mapping], fixed_regular: Amounts, budget_total: Amounts, policy: str, read: Read = container_amounts
) -> _StepPlan:
    """Choose each step's requests once the steps run as regular containers.

    `fixed_regular` is what the new pod's regular side already holds without the steps
    (mains, sidecars, restartable init containers); `budget_total` is the old effective
    request, which the new regular sum must not exceed under `preserve` and `divide`.
    """
    reqs = [read(s)[0] for s in steps]
    plan = _StepPlan(step_requests=[{} for _ in steps])
    by_resource: dict[str, list[int]] = defaultdict(list)  # resource -> the steps requesting it, in order
    for i, req in enumerate(reqs):
        for r, q in req.items():
            if q > ZERO:
                by_resource[r].append(i)
    starved: list[str] = []  # shareable resources the steps asked for and get none of
    for r in sorted(by_resource):
        holders = by_resource[r]
        budget = max(ZERO, budget_total.get(r, ZERO) - fixed_regular.get(r, ZERO))
        if r not in SHAREABLE:
            if len(holders) > 1 and policy != "keep":
                plan.problem = (
                    f"steps {', '.join(repr(steps[i]['name']) for i in holders)} each request {r}, "
                    f"which cannot be shared once they run side by side as regular containers"
                )
                return plan
            if reqs[holders[0]][r] > budget and policy != "keep":
                plan.problem = (
                    f"step {steps[holders[0]]['name']!r} requests {r}, which containers running beside it once it "
                    f"is a regular container request too and cannot share with it"
                )
                return plan
            continue  # a single holder keeps its (request == limit) as it is
        if policy == "keep":
            continue
        if budget == ZERO:
            starved.append(r)
        if policy == "preserve":
            top = max(holders, key=lambda i: (reqs[i][r], -i))  # largest request, first on ties
            for i in holders:
                if i == top:
                    if budget < reqs[i][r]:
                        plan.step_requests[i][r] = format_quantity(budget, r)
                else:
                    plan.step_requests[i][r] = "0"
        else:  # divide: the budget in proportion to the original requests, never more than asked
            total = sum((reqs[i][r] for i in holders), ZERO)
            if budget >= total:
                continue
            for i in holders:
                plan.step_requests[i][r] = format_quantity(budget * reqs[i][r] // total, r)
    if starved:
        # kpack's shape: every container, the waiting `completion` too, requests the same.
        memory = ("; without a memory request a step is the kernel's first choice when the node runs out of memory"
                  if "memory" in starved else "")
        plan.warnings.append(f"the steps get no {' or '.join(starved)} request (INITSHIFT_RESOURCES_POLICY={policy}): "
                             f"the regular containers beside them already hold all the pod reserved{memory}; "
                             f"`keep` keeps the steps' own requests and grows the pod's")
    return plan


def apply_requests(container: dict, new: Mapping[str, str]) -> dict:
    """A copy of the container with `new` requests set; limits are kept as they are."""
    if not new:
        return container
    out = dict(container)
    submap(out, "resources", "requests").update(new)
    return out


_REQUEST_FIELD = "requests."


def _own_request_ref(container: Mapping, var: object) -> Mapping | None:
    """The `resourceFieldRef` of an env var that reads this container's own request. (Parsed
    JSON holds plain dicts: `dict` is tested, as it is fast, where `typing.Mapping` goes
    through typing's and abc's checks for every env var of every container of a review.)"""
    value_from = var.get("valueFrom") if isinstance(var, dict) else None
    ref = value_from.get("resourceFieldRef") if isinstance(value_from, dict) else None
    if not isinstance(ref, dict) or not str(ref.get("resource") or "").startswith(_REQUEST_FIELD):
        return None
    return ref if ref.get("containerName") in (None, "", container.get("name")) else None


def _kubelet_request_value(requests: Amounts, ref: Mapping) -> str:
    """What the kubelet gives an env var that reads a request: the request (0 where unset)
    over the divisor, rounded up (ExtractContainerResourceValue: milli-units for cpu, units
    for the rest, as float64)."""
    resource = str(ref["resource"])[len(_REQUEST_FIELD):]
    divisor = parse(ref.get("divisor") or "1", resource)
    return str(math.ceil(float(requests.get(resource, ZERO)) / float(divisor or 1)))


def pin_request_refs(container: Mapping) -> Mapping:
    """The step with each env var that reads its own request (`valueFrom.resourceFieldRef`,
    `requests.*`) set to the value the kubelet gives it from the request as admitted.

    A step's request is the pod's budget once the steps run side by side (`preserve` gives
    most of them 0, `divide` a share, a mesh's proxy arriving later takes some back), so the
    kubelet would hand such a variable the budget, not the step's own request: a build that
    sizes its workers from `requests.cpu` or its heap from `requests.memory` (seen on
    v1.34.9: 300m read as 0) would run otherwise than without initshift. Limits are kept,
    so a variable that reads one is left to the kubelet. Applied once, where a step is first
    wrapped: a rewritten step holds no such reference any more."""
    env = container.get("env")
    if not isinstance(env, list) or not any(_own_request_ref(container, var) for var in env):
        return container
    requests = container_amounts(container)[0]
    out = dict(container)
    out["env"] = [{"name": var["name"], "value": _kubelet_request_value(requests, ref)}
                  if (ref := _own_request_ref(container, var)) is not None else var for var in env]
    return out
