"""A namespace's LimitRanges, applied as the apiserver's LimitRanger admission plugin applies
them (plugin/pkg/admission/limitranger), to what the rewrite writes.

LimitRanger defaults a pod's containers before the mutating webhooks run (the steps arrive
with the namespace's default requests and limits) and validates the pod after them: each
container against every `Container` item (a request of at least `min`, a limit of at most
`max`, limit / request at most `maxLimitRequestRatio`, and a request or a limit present for
each resource these name), the pod's effective request and limit against every `Pod` item.
It defaults again only when a webhook is re-invoked, so what initshift writes must pass as
written: the explicit zero requests of `preserve` and of `initshift-copy`, and the fixed
amounts of its own containers, would not.

- `fit`: every request the rewrite wrote (a new container's, a lowered one) raised to the
  least that passes, the largest `min` and limit / the smallest ratio; initshift's own
  containers also get a limit for each resource a `max` or a ratio names (the namespace's
  default limit, as LimitRanger would give them) and their limits kept within `max` and
  `min`. A step's limit is its own and never changes. Under `preserve` and `divide` what
  the floors add is taken back from the steps, largest first, down to their own floors.
- `added_violations`: LimitRanger's validation of the rewritten pod, less what the pod as
  admitted already breaks: a rewritten pod with a violation of its own is admitted
  unchanged, with the apiserver's words (a `Pod` item whose `max` the steps' limits exceed
  once they run side by side, for one).

Quantities are compared in milli-units as LimitRanger compares them (here: milli-CPU, and
bytes for the others, exact but for fractions of a byte).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from waiter import protocol as p

from ._quantity import QuantityError, format_quantity, parse
from ._resources import (Amounts, container_amounts, describe, effective, growth_of, pod_level, pod_limits,
                         pod_requests, restartable_sum, sum_requests, take_back)
from ._shape import mapping_at

_CONTAINER, _POD = "Container", "Pod"
_OWN = (p.INIT_CONTAINER_NAME, p.COPY_CONTAINER_NAME)


@dataclass(frozen=True)
class _Item:
    """One `spec.limits` entry of one LimitRange, its quantities parsed."""

    limit_range: str
    type: str
    min: Amounts
    max: Amounts
    ratio: Amounts  # maxLimitRequestRatio in thousandths
    default: Amounts


def _amounts(values: object, ratio: bool = False) -> Amounts:
    if not isinstance(values, dict):
        return {}
    out: Amounts = {}
    for name, value in values.items():
        try:
            out[name] = parse(value, "cpu" if ratio else name)  # a ratio has no unit: thousandths
        except QuantityError:
            continue  # the apiserver validated it; a value it accepted and we cannot read is not enforced here
    return out


def _items(limit_ranges: Iterable[Mapping]) -> list[_Item]:
    out = []
    for lr in limit_ranges:
        name = str(mapping_at(lr, "metadata").get("name") or "")
        for entry in mapping_at(lr, "spec").get("limits") or []:
            if isinstance(entry, dict) and entry.get("type") in (_CONTAINER, _POD):
                out.append(_Item(name, entry["type"], _amounts(entry.get("min")), _amounts(entry.get("max")),
                                 _amounts(entry.get("maxLimitRequestRatio"), ratio=True),
                                 _amounts(entry.get("default"))))
    return out


@dataclass
class _Bounds:
    """The tightest `Container` constraints of a namespace, per resource."""

    min: Amounts = field(default_factory=dict)
    max: Amounts = field(default_factory=dict)
    ratio: Amounts = field(default_factory=dict)
    default: Amounts = field(default_factory=dict)

    @classmethod
    def of(cls, items: Iterable[_Item]) -> "_Bounds":
        b = cls()
        for it in (i for i in items if i.type == _CONTAINER):
            for mine, theirs, pick in ((b.min, it.min, max), (b.max, it.max, min), (b.ratio, it.ratio, min),
                                       (b.default, it.default, min)):
                for r, v in theirs.items():
                    mine[r] = pick(mine[r], v) if r in mine else v
        return b

    def request_floor(self, resource: str, limit: int | None) -> int:
        """The least request that passes `min` and the ratio, for a container with `limit`."""
        floor = self.min.get(resource, 0)
        ratio = self.ratio.get(resource)
        if ratio and limit:
            floor = max(floor, math.ceil(limit * 1000 / ratio))
        return floor


def _fit_limits(limits: dict, b: _Bounds) -> None:
    for r in sorted({*b.max, *b.ratio, *b.min}):
        have = parse(limits[r], r) if r in limits else None
        want = have if have is not None else b.default.get(r) if r in b.max or r in b.ratio else None
        if want is None:
            continue
        if r in b.max:
            want = min(want, b.max[r])
        if r in b.min:
            want = max(want, b.min[r])
        if want != have:
            limits[r] = format_quantity(want, r)


def _fit(c: Mapping, b: _Bounds, own: bool) -> Mapping:
    """`c` with its requests (and, for initshift's own, its limits) within the bounds."""
    res = c.get("resources") or {}
    requests, limits = dict(res.get("requests") or {}), dict(res.get("limits") or {})
    if own:
        _fit_limits(limits, b)
    for r in sorted({*b.min, *b.ratio}):
        limit = parse(limits[r], r) if r in limits else None
        have = parse(requests[r], r) if r in requests else limit if limit is not None else 0
        want = max(have, b.request_floor(r, limit))
        if limit is not None:
            want = min(want, limit)  # a limit under `min` is the container's own violation
        if r not in requests or want != have:
            requests[r] = format_quantity(want, r)
    if requests == (res.get("requests") or {}) and limits == (res.get("limits") or {}):
        return c
    out = dict(c)
    out["resources"] = {**res, "requests": requests, **({"limits": limits} if limits else {})}
    return out


def _written(before: Mapping, after: Mapping) -> set[str]:
    """Containers of `after` whose resources the rewrite wrote: new ones, and changed ones."""
    old = {c.get("name"): c.get("resources") for c in _containers(before)}
    return {str(c.get("name")) for c in _containers(after)
            if c.get("name") not in old or old[c.get("name")] != c.get("resources")}


def _containers(pod: Mapping) -> list[Mapping]:
    spec = mapping_at(pod, "spec")
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def fit(before: Mapping, after: dict, limit_ranges: Sequence[Mapping], *,
        steps: Sequence[str] = ()) -> tuple[dict, list[str]]:
    """`after` (the rewrite of `before`) with what it wrote within the namespace's
    `Container` constraints, and a note when that grows the pod's effective request.
    `steps`: the regular containers whose requests share a budget (`preserve`, `divide`):
    what the floors add is taken back from them, largest first, down to their own floors."""
    b = _Bounds.of(_items(limit_ranges))
    if not (b.min or b.max or b.ratio):
        return after, []
    written = _written(before, after)
    spec = after.get("spec") or {}
    changed = False
    new_spec = dict(spec)
    for key in ("initContainers", "containers"):
        fitted = [_fit(c, b, c.get("name") in _OWN) if c.get("name") in written else c for c in spec.get(key) or []]
        if any(x is not y for x, y in zip(fitted, spec.get(key) or [])):
            new_spec[key], changed = fitted, True
    if not changed:
        return after, []
    was = pod_requests(spec)
    if steps:
        _give_back(new_spec, was, set(steps), b)
    out = dict(after)
    out["spec"] = new_spec
    names = ", ".join(sorted({lr_name(lr) for lr in limit_ranges}))
    level = pod_level(mapping_at(before, "spec"))[0]  # a pod-level request stays the pod's request
    why = f"requests raised to the namespace's LimitRange ({names}): min {describe(b.min)}, " \
          f"maxLimitRequestRatio {_ratios(b.ratio)}"
    grown = growth_of(effective(was, level), effective(pod_requests(new_spec), level), why)
    return out, [grown] if grown else []


def _give_back(spec: dict, budget: Amounts, steps: set[str], b: _Bounds) -> None:
    """Lower the steps' requests (largest first, never under their floor) until the regular
    side, where the steps run, is back within `budget`, per resource. What init containers
    hold is left as it is: the steps cannot make up for it."""
    regular = sum_requests(spec.get("containers") or [])
    for r, v in restartable_sum(spec.get("initContainers") or []).items():
        regular[r] = regular.get(r, 0) + v
    excess = {r: regular.get(r, 0) - budget.get(r, 0) for r in {*b.min, *b.ratio}}
    spec["containers"] = take_back(spec.get("containers") or [], steps, {r: v for r, v in excess.items() if v > 0},
                                   lambda c, r: b.request_floor(r, container_amounts(c)[1].get(r)))


def lr_name(lr: Mapping) -> str:
    return str(mapping_at(lr, "metadata").get("name") or "")


def _ratios(ratios: Amounts) -> str:
    return ", ".join(f"{r}={v / 1000:g}" for r, v in sorted(ratios.items())) or "none"


# --- LimitRanger's validation ---------------------------------------------------------------

@dataclass(frozen=True)
class Violation:
    limit_range: str
    where: str  # a container's name, or "" for the pod
    check: str  # what failed, with its resource: the key a violation is compared by
    message: str  # as the apiserver words it

    def text(self) -> str:
        return f"LimitRange {self.limit_range}: {self.message}" + (f" (container {self.where})" if self.where else "")


def _q(value: int, resource: str) -> str:
    return format_quantity(value, resource) if value > 0 else "0"


def _check(item: _Item, where: str, requests: Amounts, limits: Amounts) -> list[Violation]:
    """LimitRanger's minConstraint, maxConstraint and limitRequestRatioConstraint."""
    per, out = item.type, []

    def bad(check: str, r: str, message: str) -> None:
        out.append(Violation(item.limit_range, where, f"{check} {r}", message))

    for r, v in sorted(item.min.items()):
        if r not in requests:
            bad("min", r, f"minimum {r} usage per {per} is {_q(v, r)}.  No request is specified")
        elif requests[r] < v:
            bad("min", r, f"minimum {r} usage per {per} is {_q(v, r)}, but request is {_q(requests[r], r)}")
        elif r in limits and limits[r] < v:
            bad("min-limit", r, f"minimum {r} usage per {per} is {_q(v, r)}, but limit is {_q(limits[r], r)}")
    for r, v in sorted(item.max.items()):
        if r not in limits:
            bad("max", r, f"maximum {r} usage per {per} is {_q(v, r)}.  No limit is specified")
        elif limits[r] > v:
            bad("max", r, f"maximum {r} usage per {per} is {_q(v, r)}, but limit is {_q(limits[r], r)}")
        elif r in requests and requests[r] > v:
            bad("max-request", r, f"maximum {r} usage per {per} is {_q(v, r)}, but request is {_q(requests[r], r)}")
    for r, v in sorted(item.ratio.items()):
        if not requests.get(r):
            bad("ratio", r, f"{r} max limit to request ratio per {per} is {v / 1000:g}, but no request is "
                            f"specified or request is 0")
        elif not limits.get(r):
            bad("ratio", r, f"{r} max limit to request ratio per {per} is {v / 1000:g}, but no limit is "
                            f"specified or limit is 0")
        elif limits[r] * 1000 > v * requests[r]:
            bad("ratio", r, f"{r} max limit to request ratio per {per} is {v / 1000:g}, but provided ratio is "
                            f"{limits[r] / requests[r]:f}")
    return out


def violations(pod: Mapping, limit_ranges: Sequence[Mapping],
               level: tuple[Amounts, Amounts] | None = None) -> list[Violation]:
    """What LimitRanger's validation refuses in `pod` (PodValidateLimitFunc). A `Pod` item
    reads the pod-level request and limit where the pod sets them; `level`: those
    (default: the pod's own, _resources.pod_level)."""
    out: list[Violation] = []
    spec = mapping_at(pod, "spec")
    for item in _items(limit_ranges):
        if item.type == _CONTAINER:
            for c in _containers(pod):
                out += _check(item, str(c.get("name")), *container_amounts(c))
        else:
            requests, limits = level if level is not None else pod_level(spec)
            out += _check(item, "", effective(pod_requests(spec), requests), effective(pod_limits(spec), limits))
    return out


def added_violations(before: Mapping, after: Mapping, limit_ranges: Sequence[Mapping]) -> list[Violation]:
    """The violations of `after` that `before` (the pod as admitted) does not have; the
    pod-level amounts are the admitted pod's (defaulted before any webhook)."""
    level = pod_level(mapping_at(before, "spec"))
    had = {(v.limit_range, v.where, v.check) for v in violations(before, limit_ranges, level)}
    return [v for v in violations(after, limit_ranges, level) if (v.limit_range, v.where, v.check) not in had]
